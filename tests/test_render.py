"""Rendering: the template cache, raw copier output already ruff-clean, no Jinja left behind."""

from __future__ import annotations

import ast
import errno
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import copier
import pytest
import yaml
from conftest import REPO_ROOT, ruff
from shared_renders import raw_render

import scaffold.destination
from scaffold import __version__
from scaffold.answers import build_answers
from scaffold.errors import DestinationError, RenderError
from scaffold.planner import plan
from scaffold.render import render_project
from scaffold.renderable import FRAMEWORK_RENDERS
from scaffold.template_cache import ensure_template_repo, template_repo_source
from scaffold.variants import VARIANTS

TEMPLATE = Path(__file__).resolve().parents[1] / "templates"


# Framework renders the matrix does not run: Fabric's fp16 and the other precisions of each
# strategy (the planner refuses fp16 with FSDP2 and with Accelerate).
UNRUN_RENDERS = {
    f"{framework}-{strategy}-{precision}": {
        **VARIANTS["cuda-single-fp16" if precision == "fp16" else "cuda-ddp-bf16"],
        "framework": framework,
        "strategy": strategy,
        "precision": precision,
        "gpus_per_node": 1 if strategy == "single" else 4,
    }
    for framework, renders in FRAMEWORK_RENDERS.items()
    for strategy in renders["strategy"]
    for precision in renders.get("precision", ("fp32", "bf16", "fp16"))
    if (strategy, precision) != ("fsdp2", "fp16")
}


def assert_clean(project: Path) -> None:
    assert ruff(project, "check").returncode == 0, ruff(project, "check").stdout
    formatted = ruff(project, "format", "--check")
    assert formatted.returncode == 0, f"format would change files: {formatted.stdout}"
    for path in project.rglob("*"):
        if path.is_file() and path.suffix != ".png":  # the README's plot of the default run
            text = path.read_text()
            assert "{{" not in text and "{%" not in text, path


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_raw_render_is_lint_and_format_clean_with_no_jinja_left(tmp_path_factory, variant):
    """copier alone (no ruff format, no git), what `scaffold update` re-renders and merges, of
    each variant (named after it: names that sort before and after `conftest`)."""
    assert_clean(raw_render(tmp_path_factory, variant))


def framework_render(factory: pytest.TempPathFactory, name: str) -> Path:
    """copier's render of UNRUN_RENDERS[name], under a name that sorts before `conftest`."""
    return raw_render(factory, f"aa-{name}", UNRUN_RENDERS[name])


@pytest.mark.parametrize("name", list(UNRUN_RENDERS))
def test_every_framework_strategy_and_precision_renders_clean(tmp_path_factory, name):
    """Also under a name that sorts before `conftest`: the tests' imports stay sorted."""
    project = framework_render(tmp_path_factory, name)
    assert_clean(project)
    package = project / "src" / project.name.replace("-", "_")
    framework, precision = (UNRUN_RENDERS[name][key] for key in ("framework", "precision"))
    engine = (package / "engine" / "strategy.py").read_text()
    shared_step = (
        package / "engine" / f"{framework}_step.py"
    )  # the replicated engines' shared verbs
    verbs = shared_step.read_text() if shared_step.exists() else engine
    assert ("Fabric(" if framework == "fabric" else "Accelerator(") in engine + verbs
    step = verbs[verbs.index("def clip_and_step") :]
    clip = step.index("clip_gradients(" if framework == "fabric" else "clip_grad_norm_(")
    assert clip < step.index("self.optimizer.step()")  # the frameworks unscale inside clipping
    launch_config = project / "launch" / "accelerate_config.yaml"
    if launch_config.exists():  # YAML reads a bare `no` as False, which accelerate launch rejects
        settings = yaml.safe_load(launch_config.read_text())
        assert settings["mixed_precision"] == {"fp32": "no", "bf16": "bf16"}[precision]


def test_fabric_fp16_hands_fabric_its_own_loss_scaler(tmp_path_factory):
    """Fabric turns "16-mixed" on a CPU into another precision unless handed a scaler."""
    project = framework_render(tmp_path_factory, "fabric-single-fp16")
    engine = (project / "src" / "aa_fabric_single_fp16" / "engine" / "strategy.py").read_text()
    step = (project / "src" / "aa_fabric_single_fp16" / "engine" / "fabric_step.py").read_text()
    assert 'FABRIC_PRECISION = "16-mixed"' in engine and "GradScaler(device.type, enabled=" in step
    assert "plugins=[plugin]" in engine and "precision=" not in engine.split("Fabric(")[1][:300]


def test_precision_is_data_in_one_engine_text(tmp_path_factory):
    """bf16 and fp16 render the same engine but for three constants; the step (amp.py) unscales
    before it clips."""
    engines = {}
    for variant in ("cuda-single-bf16", "cuda-single-fp16"):
        package = variant.replace("-", "_")
        project = raw_render(tmp_path_factory, variant)
        engines[variant] = (project / "src" / package / "engine" / "strategy.py").read_text()
    bf16, fp16 = engines["cuda-single-bf16"], engines["cuda-single-fp16"]
    assert "COMPUTE_DTYPE = torch.bfloat16" in bf16 and "GRAD_SCALER = False" in bf16
    assert "COMPUTE_DTYPE = torch.float16" in fp16 and "GRAD_SCALER = True" in fp16
    constants = re.compile(r"^(STRATEGY|PRECISION|COMPUTE_DTYPE|GRAD_SCALER) = .*$", re.M)
    assert constants.sub("", bf16) == constants.sub("", fp16)
    amp = (project / "src" / "cuda_single_fp16" / "engine" / "amp.py").read_text()
    step = amp[amp.index("def clip_and_step") :]
    unscale, clip = step.index("unscale_(self.optimizer)"), step.index("clip_grad_norm_")
    assert unscale < clip < step.index("scaler.step(self.optimizer)")


def tags(repo: Path) -> list[str]:
    return subprocess.run(["git", "tag"], cwd=repo, capture_output=True, text=True).stdout.split()


def test_the_template_names_the_release_it_is():
    """A rendered project writes its scaffold release into each checkpoint (a refusal of another
    checkpoint format names the release that can finish the run): it is this scaffold's."""
    store = TEMPLATE / "project" / "src" / "{{package_name}}" / "checkpoint" / "store.py"
    assert f'SCAFFOLD_RELEASE = "{__version__}"' in store.read_text()


def test_template_cache_tags_once_and_never_moves_a_tag(tmp_path, monkeypatch):
    repo, source = template_repo_source()
    assert source == "~/.cache/scaffold/template-repo"
    assert ensure_template_repo() == (source, f"v{__version__}")
    assert ensure_template_repo() == (source, f"v{__version__}")
    assert tags(repo) == [f"v{__version__}"]
    first_commit = subprocess.run(
        ["git", "rev-parse", f"v{__version__}"], cwd=repo, capture_output=True, text=True
    ).stdout
    changed = tmp_path / "templates"
    shutil.copytree(TEMPLATE, changed)
    (changed / "project" / "configs" / "train.toml.jinja").write_text("seed = 1\n")
    monkeypatch.setattr("scaffold.template_cache.bundled_template", lambda: changed)
    with pytest.warns(UserWarning, match="without a version bump"):
        _, dev_tag = ensure_template_repo()
    assert dev_tag.startswith(f"v{__version__}+dev.")
    assert (
        subprocess.run(
            ["git", "rev-parse", f"v{__version__}"], cwd=repo, capture_output=True, text=True
        ).stdout
        == first_commit
    )


@pytest.mark.parametrize("dest_exists", [False, True])
def test_a_failed_render_leaves_nothing_behind(tmp_path, monkeypatch, dest_exists):
    from scaffold.errors import RenderError
    from scaffold.samples import render_variant

    dest = tmp_path / "proj"
    if dest_exists:
        dest.mkdir()

    def broken_ruff(project):
        raise RenderError("ruff format failed")

    monkeypatch.setattr("scaffold.render.format_with_ruff", broken_ruff)
    with pytest.raises(RenderError):
        render_variant("cpu-single-fp32", dest)
    assert dest.exists() == dest_exists
    assert not dest_exists or list(dest.iterdir()) == []


# A non-empty folder for `--force`: files the render replaces, one it does not render (left
# unformatted, as its owner wrote it), and one inside a folder the render also fills.
USER_FILES = {
    "README.md": b"# My own notes\n",
    "pyproject.toml": b'[project]\nname = "mine"\n',
    "notes.py": b"x = (1,\n     2)\n",
    "src/mine.py": b"print('mine')\n",
}


def user_folder(dest: Path) -> Path:
    for relative, data in USER_FILES.items():
        (dest / relative).parent.mkdir(parents=True, exist_ok=True)
        (dest / relative).write_bytes(data)
    return dest


def tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder`, hidden ones included: a file's bytes, None for a folder."""
    return {
        str(path.relative_to(folder)): path.read_bytes() if path.is_file() else None
        for path in sorted(folder.rglob("*"))
    }


def force_render(dest: Path) -> None:
    answers = build_answers({**VARIANTS["cpu-single-fp32"], "project_name": dest.name})
    render_project(plan(answers).copier_data(), dest, force=True)


def break_copier(monkeypatch) -> None:
    from copier.errors import CopierError

    real = copier.run_copy

    def renders_then_fails(*args, **kwargs):
        real(*args, **kwargs)
        raise CopierError("a task failed")

    monkeypatch.setattr(copier, "run_copy", renders_then_fails)


def break_ruff(monkeypatch) -> None:
    def fails(project):
        raise RenderError("ruff format failed")

    monkeypatch.setattr("scaffold.render.format_with_ruff", fails)


def break_the_move(monkeypatch) -> None:
    """The rename of the first entry into src/ fails, after README.md and pyproject.toml were
    replaced (sorted order), so undoing must put the owner's files back."""
    real = scaffold.destination._rename

    def rename(source, goal, moves):
        if goal.parent.name == "src":
            assert len(moves) >= 4, "the user's files were set aside first"
            raise OSError(28, "No space left on device", str(goal))
        real(source, goal, moves)

    monkeypatch.setattr(scaffold.destination, "_rename", rename)


@pytest.mark.parametrize("breaks", [break_copier, break_ruff, break_the_move])
def test_force_into_a_non_empty_folder_that_fails_leaves_it_byte_for_byte(
    tmp_path, monkeypatch, breaks
):
    dest = user_folder(tmp_path / "mine")
    before = tree(dest)
    breaks(monkeypatch)
    with pytest.raises((RenderError, OSError)):
        force_render(dest)
    assert tree(dest) == before, "same files, same bytes, nothing added"
    assert list(tmp_path.iterdir()) == [dest]


def test_force_replaces_rendered_files_and_leaves_the_others_unformatted(tmp_path):
    dest = user_folder(tmp_path / "mine")
    force_render(dest)
    after = tree(dest)
    assert after["notes.py"] == USER_FILES["notes.py"], "ruff formats only what it rendered"
    assert after["src/mine.py"] == USER_FILES["src/mine.py"]
    assert after["README.md"] != USER_FILES["README.md"] and "src/mine/train.py" in after
    assert not [path for path in after if path.startswith((".git/", ".scaffold-new-"))]
    assert list(tmp_path.iterdir()) == [dest]


def test_a_move_that_cannot_be_undone_keeps_the_owners_files_and_says_where(tmp_path, monkeypatch):
    dest = user_folder(tmp_path / "mine")
    break_the_move(monkeypatch)
    real_rename = os.rename

    def rename(source, goal):
        if "replaced" in Path(source).parts:  # putting README.md back fails too
            raise OSError(5, "Input/output error", str(source))
        real_rename(source, goal)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(RenderError, match=r"could not be undone.*kept in (\S+)") as error:
        force_render(dest)
    kept = Path(re.search(r"kept in (\S+)$", str(error.value)).group(1))
    assert (kept / "README.md").read_bytes() == USER_FILES["README.md"]
    assert (kept / "pyproject.toml").read_bytes() == USER_FILES["pyproject.toml"]


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (OSError(errno.EROFS, "Read-only file system"), "is on a read-only file system"),
        (PermissionError(errno.EACCES, "Permission denied"), "is not writable by you"),
    ],
)
def test_a_staging_folder_that_cannot_be_made_is_one_line_exit_2(
    tmp_path, monkeypatch, capsys, error, message
):
    """The file system refuses the staging folder (what a read-only mount or a folder without
    write permission does, whoever runs the test): one line, exit 2, nothing written."""
    from scaffold.cli import main

    real = tempfile.mkdtemp

    def mkdtemp(suffix=None, prefix=None, dir=None):
        if prefix == ".scaffold-new-":
            raise error
        return real(suffix, prefix, dir)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    monkeypatch.chdir(tmp_path)
    assert main(["new", "proj", "--defaults"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("scaffold: error: cannot write"), lines
    assert message in lines[0] and "choose a folder" in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("mine", "message"),
    [("README.md/notes.txt", "is a folder where the project has a file"),
     ("src", "is a file where the project has a folder")],
)  # fmt: skip
def test_force_refuses_to_put_a_file_over_a_folder_or_a_folder_over_a_file(tmp_path, mine, message):
    dest = tmp_path / "mine"
    (dest / mine).parent.mkdir(parents=True)
    (dest / mine).write_text("mine")
    before = tree(dest)
    with pytest.raises(DestinationError, match=message):
        force_render(dest)
    assert tree(dest) == before


def test_one_module_of_scaffold_imports_copier():
    """copier's API is used in one place (copier_runs.py); the others call it."""
    importers = []
    for path in sorted((REPO_ROOT / "scaffold").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(name.split(".")[0] == "copier" for name in names):
                importers.append(path.name)
    assert set(importers) == {"copier_runs.py"}, importers
