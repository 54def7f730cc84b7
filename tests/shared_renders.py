"""Renders that several tests only read, each made once per session and shared by pytest-xdist's
workers (its "Making session-scoped fixtures execute only once": a file lock in the folder all
workers of the run share).

The first test that asks for a render makes it, in a folder of its own with a HOME of its own
(so a fresh template cache, as `scaffold samples` renders); the others wait for the lock and
read the same files. A render that fails is not kept: each test that asks fails with the error.
A test must not change a shared render: it reads it, or works on a copy (`copy_project`).
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import copier
import pytest
from conftest import isolate_home
from filelock import FileLock

from scaffold.answers import build_answers, merge_sources
from scaffold.planner import plan
from scaffold.samples import render_variant
from scaffold.template_cache import ensure_template_repo
from scaffold.variants import VARIANTS

HOME = "_home"  # beside the project in a render's folder; no project name starts with "_"
CACHE = Path(".cache") / "scaffold"  # the template cache under a HOME

_made: dict[str, Path] = {}  # this process's renders, by key


def shared_folder(factory: pytest.TempPathFactory) -> Path:
    """A folder of this run that all its pytest-xdist workers see, or this process's own
    without xdist."""
    basetemp = factory.getbasetemp()
    shared = basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp
    folder = shared / "shared-renders"
    folder.mkdir(exist_ok=True)
    return folder


def shared_render(
    factory: pytest.TempPathFactory, key: str, name: str, make: Callable[[Path], None]
) -> Path:
    """`make(dest)` run once this session for `key`, with `dest` a new folder named `name`
    (the project name) and HOME a new folder beside it; returns `dest`."""
    if key in _made:
        return _made[key]
    root = shared_folder(factory)
    done = root / key
    with FileLock(root / f"{key}.lock"):
        if not done.is_dir():
            partial = root / f"{key}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            (partial / HOME).mkdir(parents=True)
            with pytest.MonkeyPatch.context() as monkeypatch:
                isolate_home(partial / HOME, monkeypatch)
                make(partial / name)
            partial.rename(done)
    _made[key] = done / name
    return done / name


def raw_render(
    factory: pytest.TempPathFactory, variant: str, answers: Mapping | None = None
) -> Path:
    """copier's output alone (no ruff format, no git), as `scaffold update` renders each side
    of its merge: variant `variant` (or `answers`, named `variant`), in a folder of that name."""

    def make(dest: Path) -> None:
        chosen = merge_sources(answers or VARIANTS[variant], {"project_name": dest.name})
        copy_with_copier(plan(build_answers(chosen)).copier_data(), dest)

    return shared_render(factory, f"raw-{variant}", variant, make)


def copy_with_copier(data: Mapping[str, Any], dest: Path) -> None:
    src, tag = ensure_template_repo()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        copier.run_copy(src, dest, data=dict(data), vcs_ref=tag, defaults=True, quiet=True)


def committed_project(factory: pytest.TempPathFactory, variant: str, name: str) -> Path:
    """`scaffold new`'s render of `variant` named `name`, with its first commit (the template
    cache it was rendered from is in the HOME beside it)."""
    return shared_render(
        factory,
        f"git-{variant}-{name}",
        name,
        lambda dest: render_variant(variant, dest, init_git=True),
    )


def copy_project(
    rendered: Path, dest: Path, home: Path | None = None, with_git: bool = True
) -> Path:
    """A copy of the shared render `rendered` at `dest` (its .git too unless not `with_git`);
    with `home`, the template cache it was rendered from goes there too (unless `home` has
    one), as though `home` were the HOME it was rendered in."""
    ignore = None if with_git else shutil.ignore_patterns(".git")
    shutil.copytree(rendered, dest, symlinks=True, ignore=ignore)
    cache = rendered.parent / HOME / CACHE
    if home is not None and cache.is_dir() and not (home / CACHE).exists():
        shutil.copytree(cache, home / CACHE, symlinks=True)
    return dest
