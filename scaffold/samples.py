"""`generated_samples/<variant>/`: one committed render per named variant, kept in sync by a test.

Samples render with a fresh, temporary template cache and no git repository, so the output
depends on nothing but the template and the variant's answers.
"""

from __future__ import annotations

import filecmp
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from scaffold.answers import build_answers, merge_sources
from scaffold.planner import plan
from scaffold.render import render_project
from scaffold.template_cache import CACHE_ENV
from scaffold.tools import environment
from scaffold.variants import VARIANTS


@contextmanager
def fresh_template_cache() -> Iterator[None]:
    """Point the template cache (the default `~/.cache/scaffold`) at an empty temporary HOME."""
    with tempfile.TemporaryDirectory() as home, environment({"HOME": home, CACHE_ENV: None}):
        yield


def render_variant(name: str, dest: Path, init_git: bool = False) -> None:
    """Render variant `name` into `dest` (whose folder name becomes the project name)."""
    answers = build_answers(merge_sources(VARIANTS[name], {"project_name": dest.name}))
    render_project(plan(answers).copier_data(), dest, init_git=init_git)


def write_samples(root: Path) -> list[str]:
    """Re-render every variant into `root/<name>`, replacing what was there, and remove the
    samples of variants that no longer exist; return the names."""
    for stale in root.iterdir() if root.is_dir() else ():
        if stale.is_dir() and stale.name not in VARIANTS:
            shutil.rmtree(stale)
    with fresh_template_cache(), tempfile.TemporaryDirectory() as scratch:
        for name in VARIANTS:
            render_variant(name, Path(scratch) / name)
            shutil.rmtree(root / name, ignore_errors=True)
            root.mkdir(parents=True, exist_ok=True)
            shutil.copytree(Path(scratch) / name, root / name)
    return list(VARIANTS)


def stale_sample_files(root: Path) -> list[str]:
    """Paths (relative to `root`) that differ between a fresh render and the committed samples."""
    differences: list[str] = []
    with fresh_template_cache(), tempfile.TemporaryDirectory() as scratch:
        for name in VARIANTS:
            fresh = Path(scratch) / name
            render_variant(name, fresh)
            differences += [f"{name}/{path}" for path in _differing_files(fresh, root / name)]
    return differences


def _differing_files(left: Path, right: Path) -> list[str]:
    def files(folder: Path) -> set[str]:
        return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}

    left_files, right_files = files(left), files(right) if right.is_dir() else set()
    differing = sorted(left_files ^ right_files)
    for path in sorted(left_files & right_files):
        if not filecmp.cmp(left / path, right / path, shallow=False):
            differing.append(path)
    return differing
