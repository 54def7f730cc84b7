"""`scaffold update` from the previous release to this one, on projects the previous release
rendered (its template, taken from this repository's history): the owner's edits of machinery
files follow them into the package tree, and a checkpoint written before the update resumes
after it, ending bitwise where the same run ends that never updated."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT, run_in_project, run_scaffold
from packaging.version import Version
from safetensors.torch import load_file

from scaffold import __version__
from scaffold.answers import build_answers, merge_sources
from scaffold.migrations import moves_between
from scaffold.planner import plan
from scaffold.render import render_project
from scaffold.template_cache import ensure_template_repo
from scaffold.variants import VARIANTS

PREVIOUS_RELEASE = "0.1.0"  # the flat package, before the tree (scaffold.migrations.MOVES)
VERSION_FILE = "scaffold/__init__.py"

# One single-process, one DDP and one FSDP2 project (the digits CNN, the quickest to train).
PROJECTS = {
    "single": VARIANTS["cpu-single-fp32"],
    "ddp": VARIANTS["cpu-ddp-fp32"],
    "fsdp2": {**VARIANTS["cpu-ddp-fp32"], "strategy": "fsdp2"},
}

# An edit of the owner's in one machinery file of three packages the release moved them into:
# (the previous release's path, a line of it, the line as the owner rewrote it).
OWNER_EDITS = [
    ("checkpoint.py", "class CheckpointManager", "# Mine: the store.\nclass CheckpointManager"),
    ("loader.py", "def seed_worker(", "# Mine: the workers.\ndef seed_worker("),
    ("safeguards.py", "class Safeguards", "# Mine: the safeguards.\nclass Safeguards"),
]  # fmt: skip

RUN = ["model_size=25K", "epochs=1", "checkpoint_every=4", "device=cpu", "run_dir=runs/a"]
# The digits' random shifts are drawn per sample from 0.5.0 on (scaffold.migrations.NOTES): an
# updated run draws other shifts than the release before would have, by design. Off here, so
# that what is compared is the machinery the update carries across.
RUN.append("augment=false")
STOP_AT = 6  # optimizer steps before the update; an epoch here is 18


def release_commit(version: str) -> str:
    """The last commit of this repository at which scaffold's version was `version`."""

    def version_at(revision: str) -> str:
        shown = subprocess.run(
            ["git", "show", f"{revision}:{VERSION_FILE}"],
            cwd=REPO_ROOT, capture_output=True, text=True,
        )  # fmt: skip
        return shown.stdout if shown.returncode == 0 else ""

    marker = f'__version__ = "{version}"'
    if marker in version_at("HEAD"):
        return "HEAD"
    log = subprocess.run(
        ["git", "log", "--format=%H", "--", VERSION_FILE],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for commit in log:  # newest first: the bump away from `version` follows its last commit
        if marker in version_at(f"{commit}^") and marker not in version_at(commit):
            return f"{commit}^"
    raise AssertionError(
        f"no commit of scaffold {version} in {REPO_ROOT}'s history (a shallow clone?)"
    )


def templates_of(version: str, folder: Path) -> Path:
    """templates/ of release `version`, as its last commit holds them, extracted in `folder`."""
    archive = subprocess.run(
        ["git", "archive", release_commit(version), "templates"],
        cwd=REPO_ROOT, capture_output=True, check=True,
    ).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder / "templates"


@pytest.fixture(scope="module")
def previous_templates(tmp_path_factory) -> Path:
    """templates/ of the previous release."""
    return templates_of(PREVIOUS_RELEASE, tmp_path_factory.mktemp("previous-release"))


def render_previous(
    answers: dict, dest: Path, templates: Path, monkeypatch, version: str = PREVIOUS_RELEASE
) -> Path:
    """`scaffold new` of release `version` (the previous one): its template, tagged with its
    version in the template cache as that release tagged it, rendered and committed at
    `dest`."""
    monkeypatch.setattr(
        "scaffold.render.ensure_template_repo",
        lambda: ensure_template_repo(version, templates),
    )
    values = build_answers(merge_sources(answers, {"project_name": dest.name}))
    render_project(plan(values).copier_data(), dest, init_git=True)
    return dest


def train(project: Path, processes: int, *overrides: str) -> subprocess.CompletedProcess:
    """`python -m demo.train OVERRIDES` in `project`, under torchrun with `processes` > 1."""
    torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    launch = torchrun if processes > 1 else []
    return run_in_project(project, *launch, "-m", "demo.train", *overrides)


def git(project: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=project, capture_output=True, text=True, check=True
    ).stdout


@pytest.mark.slow
@pytest.mark.parametrize("strategy", PROJECTS)
def test_an_update_into_the_package_tree_keeps_the_owners_edits_and_resumes_bitwise(
    strategy, previous_templates, tmp_path, isolated_home, monkeypatch
):
    project = render_previous(
        PROJECTS[strategy], tmp_path / "demo", previous_templates, monkeypatch
    )
    assert f"_commit: v{PREVIOUS_RELEASE}" in (project / ".copier-answers.yml").read_text()
    package = project / "src" / "demo"
    moves = moves_between(Version(PREVIOUS_RELEASE), Version(__version__), "demo")
    for name, line, mine in OWNER_EDITS:
        text = (package / name).read_text()
        assert line in text, name
        (package / name).write_text(text.replace(line, mine, 1))
    git(project, "commit", "--quiet", "--all", "-m", "my notes")
    processes = 1 if strategy == "single" else 2

    stopped = train(project, processes, *RUN, f"stop_after_steps={STOP_AT}")
    assert stopped.returncode in (0, 75), stopped.stderr[-3000:]
    never_updated = tmp_path / "never-updated"
    shutil.copytree(project, never_updated, symlinks=True)

    updated = run_scaffold("update", str(project), cwd=tmp_path)
    assert updated.returncode == 0, updated.stderr
    assert "carried your edits of 3 file(s)" in updated.stderr, updated.stderr
    for name, _, mine in OWNER_EDITS:
        new = project / moves[f"src/demo/{name}"]
        assert mine in new.read_text(), new
        assert "<<<<<<<" not in new.read_text()
        assert not (package / name).exists(), f"{name} left behind"
    assert f"_commit: v{__version__}" in (project / ".copier-answers.yml").read_text()
    assert "??" not in git(project, "status", "--porcelain"), "the new paths go with commit -a"

    for folder in (project, never_updated):
        finished = train(folder, processes, *RUN, "--resume")
        assert finished.returncode == 0, f"{folder.name}: {finished.stderr[-3000:]}"
    summary = json.loads((project / "runs" / "a" / "summary.json").read_text())
    assert summary["resumed_from"] and summary["steps"] > STOP_AT, summary
    expected = load_file(never_updated / "runs" / "a" / "model-last.safetensors")
    resumed = load_file(project / "runs" / "a" / "model-last.safetensors")
    assert expected.keys() == resumed.keys()
    assert all(torch.equal(resumed[name], value) for name, value in expected.items())


# The language model's families and a finished run's loader, moved into models/ and inference/
# by 0.6.0: an edit of the owner's in each of three of them.
FAMILY_EDITS = [
    ("llama.py", "class LlamaMLP", "# Mine: the MLP.\nclass LlamaMLP"),
    ("lora.py", "def adapter_state(", "# Mine: the adapters.\ndef adapter_state("),
    ("trained.py", "def run_weights(", "# Mine: the weights.\ndef run_weights("),
]  # fmt: skip


@pytest.mark.slow
def test_an_update_into_models_keeps_the_owners_edits_of_the_model_families(
    tmp_path_factory, tmp_path, isolated_home, monkeypatch
):
    """From 0.5.1, the last release before 0.6.0's moves, on a language-model project: each
    edit is merged into the file's new path, and the updated package imports."""
    templates = templates_of("0.5.1", tmp_path_factory.mktemp("release-0.5.1"))
    answers = VARIANTS["lm-cpu-single-fp32"]
    project = render_previous(answers, tmp_path / "demo", templates, monkeypatch, "0.5.1")
    package = project / "src" / "demo"
    for name, line, mine in FAMILY_EDITS:
        text = (package / name).read_text()
        assert line in text, name
        (package / name).write_text(text.replace(line, mine, 1))
    git(project, "commit", "--quiet", "--all", "-m", "my notes")
    updated = run_scaffold("update", str(project), cwd=tmp_path)
    assert updated.returncode == 0, updated.stderr
    assert "carried your edits of 3 file(s)" in updated.stderr, updated.stderr
    moves = moves_between(Version("0.5.1"), Version(__version__), "demo")
    for name, _, mine in FAMILY_EDITS:
        new = project / moves[f"src/demo/{name}"]
        assert mine in new.read_text() and "<<<<<<<" not in new.read_text(), new
        assert not (package / name).exists(), f"{name} left behind"
    commands = "import demo.chat, demo.evaluate.__main__, demo.export"
    imported = run_in_project(project, "-c", commands)
    assert imported.returncode == 0, imported.stderr[-3000:]
