"""`scaffold update` with real git and real copier: a newer template is built in each test by
copying templates/ and changing a line of the loop, a line of the config, and the file set."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from conftest import REPO_ROOT, run_in_project, run_project_tests, run_scaffold, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shared_renders import committed_project, copy_project

from scaffold import __version__
from scaffold.answers import build_answers, merge_sources
from scaffold.backbones import backbone_info
from scaffold.errors import ProjectError
from scaffold.planner import plan
from scaffold.samples import render_variant
from scaffold.update import updated_plan
from scaffold.variants import VARIANTS

NEW_VERSION = "0.9.0"  # newer than the installed scaffold
LOOP_LINE = "    engine.zero_grad()"
LOOP_FIX = "    engine.zero_grad()  # set_to_none: the first backward writes the gradients"
ENGINE_LINE = "        self.optimizer.zero_grad(set_to_none=True)"
ENGINE_FIX = "        self.optimizer.zero_grad(set_to_none=True)  # frees the gradients' memory"
LOADER_LINE = "        batch_size=None,  # the sampler yields whole batches"
LOADER_FIX = "        batch_size=None,  # the sampler yields whole batches of indices"
CONFIG_LINE = "min_lr_ratio = 0.05 "
CONFIG_FIX = "min_lr_ratio = 0.02 "


def git(project: Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=project, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


def commit_all(project: Path, message: str) -> None:
    git(project, "add", "--all")
    git(project, "commit", "--quiet", "-m", message)


@pytest.fixture
def new_template(tmp_path_factory) -> Path:
    """templates/ with fixes to the machinery (loop, engine, loader), a config change, one file
    dropped and one file added."""
    template = tmp_path_factory.mktemp("template-v2") / "templates"
    shutil.copytree(REPO_ROOT / "templates", template)
    package = template / "project" / "src" / "{{package_name}}"
    engine = package / "engine" / "replicated.py.jinja"  # the replicated engines' shared verbs
    for path, line, fix in [
        (package / "train.py.jinja", LOOP_LINE, LOOP_FIX),
        (engine, ENGINE_LINE, ENGINE_FIX),
        (package / "loader" / "dataloaders.py", LOADER_LINE, LOADER_FIX),
    ]:
        text = path.read_text()
        assert line in text, path
        path.write_text(text.replace(line, fix))
    config = template / "_variants" / "task" / "image-classification" / "train.toml.jinja"
    text = config.read_text()
    assert CONFIG_LINE in text
    config.write_text(text.replace(CONFIG_LINE, CONFIG_FIX))
    (template / "project" / "tests" / "test_optim.py.jinja").unlink()
    (template / "project" / "docs").mkdir(exist_ok=True)
    (template / "project" / "docs" / "CHANGES.md").write_text(f"# Changes\n\n- v{NEW_VERSION}\n")
    with open(template / "copier.yml", "a") as copier_yml:
        copier_yml.write("\nlog_backend:\n  type: str\n  default: jsonl\n")
    return template


def default_project(factory: pytest.TempPathFactory, dest: Path, home: Path) -> Path:
    """At `dest`, the default project as the installed scaffold renders and commits it
    in the HOME `home`: a copy of the session's one render, with the template cache it made."""
    return copy_project(committed_project(factory, "cpu-single-fp32", "demo"), dest, home)


@pytest.fixture
def project(tmp_path_factory, tmp_path, isolated_home) -> Path:
    """The default project rendered by the installed scaffold and committed."""
    return default_project(tmp_path_factory, tmp_path / "demo", isolated_home)


def update(project: Path, template: Path, *args: str):
    args = (*args, "--template", str(template), "--template-version", NEW_VERSION)
    return run_scaffold("update", str(project), *args, cwd=project.parent)


def test_clean_update_keeps_the_owners_edit_and_brings_the_fix(project, new_template):
    """Run in a subfolder of the project, without naming it: the update finds the project."""
    model = project / "src" / "demo" / "model.py"
    edited = model.read_text().replace("dropout: float = 0.1", "dropout: float = 0.3")
    edited += '\n\ndef describe() -> str:\n    return "my CNN"\n'
    model.write_text(edited)
    commit_all(project, "my edits")
    args = ["--template", str(new_template), "--template-version", NEW_VERSION]
    result = run_scaffold("update", *args, cwd=project / "src" / "demo")
    assert result.returncode == 0, result.stderr
    assert model.read_text() == edited
    assert LOOP_FIX in (project / "src" / "demo" / "train.py").read_text()
    assert CONFIG_FIX in (project / "configs" / "train.toml").read_text()
    answers = (project / ".copier-answers.yml").read_text()
    assert f"_commit: v{NEW_VERSION}" in answers
    # A file the update created is intended for the commit: `git commit -a` takes it.
    assert " A docs/CHANGES.md" in git(project, "status", "--porcelain")
    assert "log_backend: jsonl" in answers, "a new question takes its default"
    refs = git(project, "for-each-ref", "--format=%(refname)", "refs/scaffold")
    assert f"refs/scaffold/templates/v{NEW_VERSION}" in refs


def test_same_line_edited_on_both_sides_fails_loudly_and_commits_nothing(project, new_template):
    """The owner also deleted a file the template changes: the conflicts win the exit code, and
    the deleted file is still listed."""
    train = project / "src" / "demo" / "train.py"
    train.write_text(train.read_text().replace(LOOP_LINE, "    engine.zero_grad()  # my own note"))
    git(project, "rm", "--quiet", "src/demo/loader/dataloaders.py")
    commit_all(project, "my note, no loader")
    head = git(project, "rev-parse", "HEAD")
    result = update(project, new_template)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "conflicts in 1 file(s)" in result.stderr and "  src/demo/train.py" in result.stderr
    assert "deleted; the update did not apply" in result.stderr
    assert "  src/demo/loader/dataloaders.py" in result.stderr
    text = train.read_text()
    assert "<<<<<<<" in text and ">>>>>>>" in text and LOOP_FIX in text and "my own note" in text
    assert git(project, "rev-parse", "HEAD") == head, "nothing committed"
    assert "UU src/demo/train.py" in git(project, "status", "--porcelain")


def make_dirty(project: Path) -> None:
    (project / "scratch.txt").write_text("untracked")


def make_not_a_project(project: Path) -> None:
    (project / ".copier-answers.yml").unlink()
    commit_all(project, "no answers")


def make_downgrade(project: Path) -> None:
    answers = project / ".copier-answers.yml"
    answers.write_text(answers.read_text().replace(f"_commit: v{__version__}", "_commit: v9.0.0"))
    commit_all(project, "from the future")


def make_no_git(project: Path) -> None:
    shutil.rmtree(project / ".git")


REFUSALS = {
    "dirty": (make_dirty, "uncommitted"),
    "not-a-project": (make_not_a_project, "not in a scaffold project"),
    "downgrade": (make_downgrade, "newer than the installed"),
    "no-git": (make_no_git, "no git repository"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals_exit_2_and_change_nothing(project, new_template, case):
    prepare, message = REFUSALS[case]
    prepare(project)
    before = snapshot(project)
    head = git(project, "rev-parse", "HEAD") if (project / ".git").exists() else None
    result = update(project, new_template)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert snapshot(project) == before
    if head:
        assert git(project, "rev-parse", "HEAD") == head


def test_update_on_a_fresh_machine_restores_the_old_template_from_the_project(
    project, new_template, tmp_path, monkeypatch
):
    fresh_home = tmp_path / "fresh-home"
    fresh_home.mkdir()
    monkeypatch.setenv("HOME", str(fresh_home))
    result = update(project, new_template)
    assert result.returncode == 0, result.stderr
    assert LOOP_FIX in (project / "src" / "demo" / "train.py").read_text()


def test_without_the_old_template_anywhere_recopy_is_the_way_out(
    project, new_template, tmp_path, monkeypatch
):
    git(project, "update-ref", "-d", f"refs/scaffold/templates/v{__version__}")
    monkeypatch.setenv("HOME", str(tmp_path))
    refused = update(project, new_template)
    assert refused.returncode == 2 and "--recopy" in refused.stderr
    recopied = update(project, new_template, "--recopy")
    assert recopied.returncode == 0, recopied.stderr
    assert LOOP_FIX in (project / "src" / "demo" / "train.py").read_text()


def test_dry_run_shows_the_change_and_touches_nothing(project, new_template):
    before = snapshot(project)
    result = update(project, new_template, "--diff")
    assert result.returncode == 0, result.stderr
    assert "+" + LOOP_FIX in result.stdout and "docs/CHANGES.md" in result.stdout
    assert snapshot(project) == before
    assert git(project, "status", "--porcelain") == ""


def test_changing_an_answer_re_renders_and_the_tests_still_pass(tmp_path_factory, project):
    """`--data precision=bf16` turns the default project into, file for file, what `scaffold
    new` renders for the new answers: the variant cpu-single-bf16 (named demo), whose own test
    suite the matrix runs (test_matrix.py)."""
    assert VARIANTS["cpu-single-bf16"] == {**VARIANTS["cpu-single-fp32"], "precision": "bf16"}
    result = run_scaffold("update", str(project), "--data", "precision=bf16", cwd=project.parent)
    assert result.returncode == 0, result.stderr
    assert (
        "COMPUTE_DTYPE = torch.bfloat16"
        in (project / "src" / "demo" / "engine" / "strategy.py").read_text()
    )
    assert "precision: bf16" in (project / ".copier-answers.yml").read_text()
    updated = snapshot(project)
    fresh = snapshot(committed_project(tmp_path_factory, "cpu-single-bf16", "demo"))
    differing = sorted(
        path for path in updated.keys() | fresh.keys() if updated.get(path) != fresh.get(path)
    )
    assert differing == [], "the update and a fresh render differ"


UNTOUCHED_BY_V2 = [
    "src/demo/model.py",
    "src/demo/data.py",
    "README.md",
    "src/demo/training/optim.py",
]


MY_DATA = '''"""My data: a noisy linear function of 8 features, the targets standardised."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from .config import Config

FEATURES = 8


class Points(Dataset):
    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor):
        self.inputs, self.targets = inputs, targets

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(indices, dtype=torch.long)
        return self.inputs[index], self.targets[index]


def build_datasets(config: Config) -> tuple[Points, Points]:
    generator = torch.Generator().manual_seed(config.seed)
    inputs = torch.randn(1600, FEATURES, generator=generator)
    weights = torch.randn(FEATURES, generator=generator)
    targets = inputs @ weights + 0.1 * torch.randn(1600, generator=generator)
    targets = (targets - targets.mean()) / targets.std()
    cut = int(len(targets) * (1 - config.val_fraction))
    return Points(inputs[:cut], targets[:cut]), Points(inputs[cut:], targets[cut:])
'''
MY_MODEL = '''"""My model: an MLP with one output."""

from __future__ import annotations

from torch import Tensor, nn

from .config import Config
from .data import FEATURES


class MLP(nn.Module):
    def __init__(self, dropout: float):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 128), nn.GELU(), nn.Dropout(dropout))
        self.head = nn.Linear(128, 1)
        nn.init.normal_(self.head.weight, std=1e-3)
        nn.init.zeros_(self.head.bias)

    def forward(self, inputs: Tensor) -> Tensor:
        return self.head(self.body(inputs)).squeeze(-1)

    def shard_units(self) -> list[nn.Module]:
        return [self.body]


def build_model(config: Config) -> MLP:
    return MLP(config.dropout)
'''
MY_TASK = '''"""My task: regression. Mean squared error; validation MSE and R^2."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .runtime import Runtime

EXPECTED_INITIAL_LOSS = 1.0  # standardised targets, predictions near 0
METRICS = {"val_loss": "min", "val_r2": "max"}
SUMS = ("squared_error", "target", "target_squared", "count")


def loss_fn(predictions: Tensor, targets: Tensor) -> Tensor:
    return F.mse_loss(predictions.float(), targets)


def micro_batch_weights(targets: list[Tensor], runtime: Runtime) -> list[float]:
    return [1.0] * len(targets)


def eval_sums(predictions: Tensor, targets: Tensor) -> Tensor:
    error, target = predictions.double() - targets.double(), targets.double()
    count = torch.tensor(float(len(targets)), dtype=torch.float64, device=targets.device)
    return torch.stack([(error**2).sum(), target.sum(), (target**2).sum(), count])


def validation_metrics(totals: dict[str, float]) -> dict[str, float]:
    count = totals["count"]
    spread = totals["target_squared"] - totals["target"] ** 2 / count
    return {
        "val_loss": totals["squared_error"] / count,
        "val_r2": 1 - totals["squared_error"] / spread,
    }


def throughput(summary: dict[str, Any]) -> dict[str, float]:
    return {"samples_per_second": summary["samples"] / max(summary["train_seconds"], 1e-9)}


def describe_throughput(summary: dict[str, Any]) -> str:
    return f"{summary['samples_per_second']:,.0f} points/s"
'''
MY_TASK_CONFIG = '''"""My task's settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class TaskConfig:
    run_dir: str = "runs/points"
    val_fraction: float = 0.2
    dropout: float = 0.0
    epochs: int = 10
    micro_batch_size: int = 64
    min_lr_ratio: float = 0.05
    warmup_steps: int = 20
    weight_decay: float = 0.01
    early_stop_patience: int = 3
    task_resume_keys: ClassVar[tuple[str, ...]] = ("val_fraction",)

    def task_problems(self) -> list[str]:
        return [] if 0 < self.val_fraction < 1 else ["val_fraction must be in (0, 1)"]
'''
MY_TESTS = '''"""Tests of my data."""

from demo.data import FEATURES, build_datasets


def test_points_have_their_features(config):
    train, _ = build_datasets(config)
    assert train.inputs.shape[1] == FEATURES and abs(train.targets.std() - 1) < 0.1
'''
# Rungs 4 and 5 of the ladder: a short run moves validation, a resume is bitwise.
LADDER_RUNS = [
    "short_run_moves_the_validation_metric_and_writes_the_summary",
    "resume_mid_epoch_reproduces_the_straight_run_bitwise",
]


# The example's own settings (its TaskConfig's): the digits' augmentation, the prepared
# images' and the timm backbone's. A task of one's own drops them with the example.
EXAMPLE_KEYS = ("augment", "augment_policy", "data_dir", "image_size", "model_family")
EXAMPLE_KEYS += ("backbone", "init_from", "backbone_lr_ratio", "freeze_backbone_epochs")


def my_train_toml(text: str) -> str:
    """configs/train.toml without the example's own settings, with my task's monitor."""
    lines = [line for line in text.splitlines() if line.split(" =")[0] not in EXAMPLE_KEYS]
    text = "\n".join(lines) + "\n"
    text = re.sub(r'^run_dir = "[^"]*"', 'run_dir = "runs/points"', text, flags=re.M)
    return re.sub(r'^monitor = "val_loss"', 'monitor = "val_r2"', text, flags=re.M)


def swap_in_a_regression_task_and_update(project: Path, new_template: Path) -> dict[str, str]:
    """The user swaps the classification example for a regression (MSE loss, an R^2 metric,
    `monitor = "val_r2"`, higher is better) in the files the README says they own: model,
    data, task, task settings, their values and the example's tests; then an update that fixes
    the loop, the engine, the loader and the config. Returns their files' texts by path."""
    config = project / "configs" / "train.toml"
    mine = {"src/demo/model.py": MY_MODEL, "src/demo/data.py": MY_DATA}
    mine |= {"src/demo/task.py": MY_TASK, "src/demo/task_config.py": MY_TASK_CONFIG}
    mine |= {"tests/test_example.py": MY_TESTS}
    for relative, text in mine.items():
        (project / relative).write_text(text)
    config.write_text(my_train_toml(config.read_text()))
    commit_all(project, "my regression task")
    result = update(project, new_template)
    assert result.returncode == 0, result.stderr
    return mine


def test_a_users_own_regression_task_keeps_their_files_and_merges_machinery_fixes(
    project, new_template
):
    """After the swap and the update (`swap_in_a_regression_task_and_update`), their files are
    as they left them, and the loop, engine, loader and config fixes are in, with no conflict."""
    mine = swap_in_a_regression_task_and_update(project, new_template)
    for relative, text in mine.items():
        assert (project / relative).read_text() == text, relative
    config = (project / "configs" / "train.toml").read_text()
    assert 'monitor = "val_r2"' in config and CONFIG_FIX in config
    package = project / "src" / "demo"
    assert LOOP_FIX in (package / "train.py").read_text()
    assert ENGINE_FIX in (package / "engine" / "replicated.py").read_text()
    assert LOADER_FIX in (package / "loader" / "dataloaders.py").read_text()
    assert "<<<<<<<" not in git(project, "diff") and not list(project.rglob("*.rej"))


@pytest.mark.slow
def test_a_users_own_regression_task_passes_the_ladder_after_an_update(project, new_template):
    """The sanity ladder passes on their task once updated, and a run's summary reports their
    metrics, none of the example's (a run of the rendered project: with the matrix, in CI)."""
    swap_in_a_regression_task_and_update(project, new_template)
    ladder = ["tests/test_model.py", "tests/test_loop.py", "tests/test_example.py"]
    ladder += ["tests/test_build.py"]  # their MLP has no init_tensor: it is built whole
    ladder += [f"tests/test_train.py::test_{name}" for name in LADDER_RUNS]
    tests = run_project_tests(project, *ladder)
    assert tests.returncode == 0, tests.stdout[-3000:]
    run = run_in_project(project, "-m", "demo.train", "epochs=3", "tensorboard=false")
    assert run.returncode == 0, run.stderr[-3000:]
    written = json.loads((project / "runs" / "points" / "summary.json").read_text())
    assert written["val_r2"] > 0.5 and "val_accuracy" not in written, written
    assert "best val_r2" in (project / "runs" / "points" / "summary.md").read_text()


EDIT_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=40
).filter(lambda text: "<<<" not in text and ">>>" not in text and "===" not in text)


# Each example is an update (~4 s): a few examples, each with up to 8 edits; in CI, not in
# the quick tier (the single-edit tests above cover the same merge there).
@pytest.mark.slow
@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    edits=st.lists(
        st.tuples(st.sampled_from(UNTOUCHED_BY_V2), st.integers(0, 200), EDIT_TEXT),
        min_size=1,
        max_size=8,
    )
)
def test_edits_outside_template_changes_always_survive(
    tmp_path_factory, isolated_home, new_template, edits
):
    project = default_project(
        tmp_path_factory, tmp_path_factory.mktemp("prop") / "demo", isolated_home
    )
    for relative, line, text in edits:
        path = project / relative
        lines = path.read_text().splitlines(keepends=True)
        lines.insert(min(line, len(lines)), text + "\n")
        path.write_text("".join(lines))
    expected = {relative: (project / relative).read_text() for relative, _, _ in edits}
    commit_all(project, "random edits")
    result = update(project, new_template)
    assert result.returncode == 0, result.stderr
    for relative, text in expected.items():
        assert (project / relative).read_text() == text, relative


def move_in_template(template: Path, old: str, new: str) -> None:
    """Move the file that renders project path `old` (with `{{package_name}}`, and `.jinja`
    where the template file has it) to render `new` instead."""
    project = template / "project"
    suffix = "" if (project / old).is_file() else ".jinja"
    (project / new).parent.mkdir(parents=True, exist_ok=True)
    (project / (old + suffix)).rename(project / (new + suffix))


def edit_line(path: Path, line: str, replacement: str) -> str:
    text = path.read_text()
    assert line in text, path
    path.write_text(text.replace(line, replacement, 1))
    return path.read_text()


def test_edits_of_a_moved_file_follow_it_and_an_edited_file_the_template_dropped_is_kept(
    project, new_template
):
    """v2 moves data_headroom.py into a folder without changing its text (found without a
    table entry) and drops tests/test_optim.py. Both carry an edit of the owner's: the first
    is at its new path, the second kept where it was, each named, after a --diff that says so
    and changes nothing. Before this, copier deleted both without a word."""
    package = "src/{{package_name}}"
    move_in_template(
        new_template, f"{package}/data_headroom.py", f"{package}/tools/data_headroom.py"
    )
    headroom, optim = project / "src/demo/data_headroom.py", project / "tests/test_optim.py"
    mine = edit_line(headroom, "def ", "def my_helper() -> int:\n    return 1\n\n\ndef ")
    my_test = optim.read_text() + "\n\ndef test_mine():\n    assert True\n"
    optim.write_text(my_test)
    commit_all(project, "my edits")
    before = snapshot(project)
    preview = update(project, new_template, "--diff")
    assert preview.returncode == 0, preview.stderr
    assert "would carry your edits of 1 file(s)" in preview.stderr
    assert "src/demo/data_headroom.py -> src/demo/tools/data_headroom.py" in preview.stderr
    assert "would keep 1 file(s)" in preview.stderr and "  tests/test_optim.py" in preview.stderr
    assert snapshot(project) == before
    result = update(project, new_template)
    assert result.returncode == 0, result.stderr
    assert "carried your edits of 1 file(s)" in result.stderr
    assert "kept 1 file(s) that you edited" in result.stderr and "git rm" in result.stderr
    assert (project / "src/demo/tools/data_headroom.py").read_text() == mine
    assert not headroom.exists(), "the old path goes"
    assert optim.read_text() == my_test
    assert LOOP_FIX in (project / "src/demo/train.py").read_text(), "the rest applied"


def test_a_moved_file_the_template_also_changed_merges_the_owners_edits_at_its_new_path(
    project, new_template, monkeypatch
):
    """The table of moves (scaffold.migrations.MOVES) names two files v2 moved and changed:
    an owner's edit of another line merges cleanly with the template's fix at the new path;
    an edit of the fixed line is a conflict there, marked and listed."""
    from scaffold import migrations
    from scaffold.update import update_project

    moves = {"src/demo/engine/replicated.py": "src/demo/shared/replicated.py"}
    moves["src/demo/loader/dataloaders.py"] = "src/demo/loading/loader.py"
    for old, new in moves.items():
        move_in_template(new_template, *(p.replace("demo", "{{package_name}}") for p in (old, new)))
    table = {
        o.replace("demo", "{package}"): n.replace("demo", "{package}") for o, n in moves.items()
    }
    monkeypatch.setitem(migrations.MOVES, NEW_VERSION, table)
    engine = project / "src/demo/engine/replicated.py"
    loader = project / "src/demo/loader/dataloaders.py"
    edit_line(engine, '"""', '"""My notes on the engine.\n\n')
    edit_line(loader, LOADER_LINE, "        batch_size=None,  # my own words")
    commit_all(project, "my edits")
    result = update_project(project, template=new_template, version=NEW_VERSION)
    assert result.carried == moves
    assert result.conflicts == ["src/demo/loading/loader.py"]
    assert "UU src/demo/loading/loader.py" in git(project, "status", "--porcelain")
    merged = (project / "src/demo/shared/replicated.py").read_text()
    assert "My notes on the engine." in merged and ENGINE_FIX in merged
    conflicted = (project / "src/demo/loading/loader.py").read_text()
    assert "<<<<<<< before updating" in conflicted and LOADER_FIX in conflicted
    assert "my own words" in conflicted
    assert not engine.exists() and not loader.exists()


def test_moves_chain_across_versions():
    from packaging.version import Version

    from scaffold.migrations import moves_between

    table = {"0.2.0": {"src/{package}/a.py": "src/{package}/x/a.py"}}
    table["0.3.0"] = {"src/{package}/x/a.py": "src/{package}/y/a.py", "b.py": "c.py"}
    assert moves_between(Version("0.1.0"), Version("0.3.0"), "demo", table) == {
        "src/demo/a.py": "src/demo/y/a.py",
        "b.py": "c.py",
    }
    assert moves_between(Version("0.2.0"), Version("0.3.0"), "demo", table) == {
        "src/demo/x/a.py": "src/demo/y/a.py",
        "b.py": "c.py",
    }
    assert moves_between(Version("0.1.0"), Version("0.2.0"), "demo", table) == {
        "src/demo/a.py": "src/demo/x/a.py"
    }


def test_migration_notes_between_versions():
    from packaging.version import Version

    from scaffold.migrations import notes_between

    notes = {"0.2.0": "rename lr_min to min_lr_ratio", "0.3.0": "checkpoints gain a manifest"}
    assert notes_between(Version("0.1.0"), Version("0.2.0"), notes) == [
        "v0.2.0: rename lr_min to min_lr_ratio"
    ]
    assert len(notes_between(Version("0.1.0"), Version("0.3.0"), notes)) == 2
    assert notes_between(Version("0.3.0"), Version("0.3.0"), notes) == []


def test_the_wheel_ships_the_template_with_its_dotfiles(tmp_path):
    import sys
    import zipfile

    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path)],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "scaffold/templates/copier.yml" in names
    assert "scaffold/templates/project/.gitignore" in names
    assert "scaffold/templates/project/.github/workflows/tests.yml.jinja" in names
    assert not any("__pycache__" in name for name in names)


def break_answers(project: Path) -> None:
    with open(project / ".copier-answers.yml", "a") as answers:
        answers.write(": [\n")
    commit_all(project, "broken answers")


def test_broken_answers_file_and_renaming_are_refused(project, new_template):
    before = snapshot(project)
    renamed = update(project, new_template, "--data", "project_name=other")
    assert renamed.returncode == 2 and "rename" in renamed.stderr
    assert snapshot(project) == before
    break_answers(project)
    broken = update(project, new_template)
    assert broken.returncode == 2 and "not valid YAML" in broken.stderr
    assert len(broken.stderr.strip().splitlines()) == 1


def test_a_new_model_size_is_re_planned_and_a_recorded_strategy_that_no_longer_fits_warns(
    tmp_path,
):
    """The answers file records the strategy `auto` chose (DDP for a 1M model on 8 GPUs); at 7B
    the update re-plans train.toml (GPT-3 6.7B's recipe) and warns that DDP will not fit."""
    project = tmp_path / "lm"
    render_variant("lm-ddp-bf16", project, init_git=True)
    result = run_scaffold("update", str(project), "--data", "model_size=7B", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "strategy=ddp does not fit" in result.stderr
    assert "strategy=auto would choose fsdp2" in result.stderr
    toml = (project / "configs" / "train.toml").read_text()
    assert "block_size = 2048" in toml and "lr = 1.2e-4" in toml
    answers = (project / ".copier-answers.yml").read_text()
    assert "model_size: 7B" in answers and "strategy: ddp" in answers


def test_a_dev_tag_of_the_installed_release_is_not_a_newer_scaffold(project):
    """A template changed without a version bump is rendered as v<version>+dev.<tree>; the same
    installed release must still update it (PEP 440 orders the local tag above the release)."""
    from scaffold.update import check_updatable

    assert str(check_updatable(project, {"_commit": "v0.1.0+dev.39dd24abb57b"}, "0.1.0")) == (
        "0.1.0+dev.39dd24abb57b"
    )
    with pytest.raises(ProjectError, match="newer than the installed 0.1.0"):
        check_updatable(project, {"_commit": "v0.2.0"}, "0.1.0")


def test_a_template_change_to_a_file_the_owner_deleted_is_listed_with_its_way_back(
    project, new_template
):
    """copier leaves out, without a word, a change to a file the owner deleted (copier#1735):
    the update lists it, exits 3, and the command it prints brings the file back, fixed. A
    deleted file the template did not change is not listed and stays deleted; the file the
    template dropped goes, the one it added comes."""
    loader = project / "src" / "demo" / "loader" / "dataloaders.py"
    before = loader.read_text()
    removed = ("src/demo/loader/dataloaders.py", "tests/test_loop.py")  # v2 changed the loader only
    git(project, "rm", "--quiet", *removed)
    git(project, "commit", "--quiet", "-m", "I load my own way and test my own loop")
    preview = update(project, new_template, "--diff")
    assert preview.returncode == 0, preview.stderr
    assert (
        "src/demo/loader/dataloaders.py" in preview.stderr and "test_loop.py" not in preview.stderr
    )
    result = update(project, new_template)
    assert result.returncode == 3, result.stdout + result.stderr
    listed = [line.strip() for line in result.stderr.splitlines() if line.startswith("  ")]
    assert listed == ["src/demo/loader/dataloaders.py"], result.stderr
    assert not loader.exists(), "the owner's deletion stays"
    assert not (project / "tests" / "test_loop.py").exists(), "the owner's deletion stays"
    assert not (project / "tests" / "test_optim.py").exists(), "the template dropped it"
    assert (project / "docs" / "CHANGES.md").read_text().startswith("# Changes")
    assert LOOP_FIX in (project / "src" / "demo" / "train.py").read_text(), "the rest applied"
    how = re.search(r"run in (\S+): (git checkout \S+ -- )PATH", result.stderr)
    assert how and Path(how.group(1)) == project, result.stderr
    restore = how.group(2).split() + ["src/demo/loader/dataloaders.py"]
    subprocess.run(restore, cwd=project, check=True, capture_output=True)
    assert loader.read_text() == before.replace(LOADER_LINE, LOADER_FIX)
    assert "A  src/demo/loader/dataloaders.py" in git(project, "status", "--porcelain")
    usage = run_scaffold("update", "--help", cwd=project).stdout
    assert "3  updated, but the template changed files this project deleted" in usage


def test_a_deleted_file_comes_back_fixed_in_a_project_inside_a_larger_repository(
    tmp_path_factory, tmp_path, isolated_home, new_template
):
    repo = tmp_path / "monorepo"
    project = repo / "services" / "demo"
    rendered = committed_project(tmp_path_factory, "cpu-single-fp32", "demo")
    copy_project(rendered, project, isolated_home, with_git=False)  # `new`'s render, no git
    git(repo, "init", "--quiet")
    commit_all(repo, "a project among others")
    git(project, "rm", "--quiet", "src/demo/loader/dataloaders.py")
    git(project, "commit", "--quiet", "-m", "no loader")
    result = update(project, new_template)
    assert result.returncode == 3 and "  src/demo/loader/dataloaders.py" in result.stderr, (
        result.stderr
    )
    how = re.search(r"(git checkout \S+ -- )PATH", result.stderr)
    subprocess.run(
        [*how.group(1).split(), "src/demo/loader/dataloaders.py"], cwd=project, check=True
    )
    assert LOADER_FIX in (project / "src" / "demo" / "loader" / "dataloaders.py").read_text()


def test_a_new_model_size_merges_the_plan_into_train_toml_and_keeps_the_owners_values(tmp_path):
    """The owner names their tokenizer (a planned key whose value the new plan keeps) and
    renames run_dir; `--data model_size=30M` re-plans: every other `# plan:` line takes the new
    plan's value, their values stay, no conflict; `--diff` says so in one line first, and the
    plan is shown."""
    project = tmp_path / "lm"
    render_variant("lm-cpu-single-fp32", project, init_git=True)
    config = project / "configs" / "train.toml"
    mine = config.read_text().replace('tokenizer = "bytes"', 'tokenizer = "my/tokenizer.json"')
    mine = mine.replace('run_dir = "runs/stdlib-lm"', 'run_dir = "runs/mine"')
    config.write_text(mine)
    commit_all(project, "my corpus")
    args = ["update", str(project), "--data", "model_size=30M"]
    preview = run_scaffold(*args, "--diff", cwd=tmp_path)
    assert preview.returncode == 0, preview.stderr
    assert "<<<<<<<" not in preview.stdout
    summary = [line for line in preview.stderr.splitlines() if "--diff:" in line]
    assert len(summary) == 1 and "no conflicts; nothing was written" in summary[0], preview.stderr
    assert git(project, "status", "--porcelain") == ""
    result = run_scaffold(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Plan for language-model, model_size=30M" in result.stdout
    text = config.read_text()
    assert "<<<<<<<" not in text and not list(project.rglob("*.rej"))
    values = tomllib.loads(text)
    assert (values["tokenizer"], values["run_dir"]) == ("my/tokenizer.json", "runs/mine")
    answers = {**VARIANTS["lm-cpu-single-fp32"], "model_size": "30M", "project_name": "lm"}
    planned = plan(build_answers(merge_sources(answers)))
    for key, setting in planned.settings.items():
        if key not in ("tokenizer", "vocab_size"):  # the owner's; data.py's PLANNED_VOCABULARY
            assert f"# plan: {setting.source}\n{key} = {setting.as_toml()}" in text, key
    assert values["model_size"] == "30M"


def test_diff_says_in_one_line_that_the_update_would_conflict_and_exits_1(project, new_template):
    train = project / "src" / "demo" / "train.py"
    train.write_text(train.read_text().replace(LOOP_LINE, "    engine.zero_grad()  # my own note"))
    commit_all(project, "my note")
    before = snapshot(project)
    result = update(project, new_template, "--diff")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "<<<<<<<" in result.stdout
    summary = result.stderr.strip().splitlines()[-1]
    expected = (
        f"would change from v{__version__} to v{NEW_VERSION}, 1 with conflicts: src/demo/train.py"
    )
    assert expected in summary
    assert snapshot(project) == before and git(project, "status", "--porcelain") == ""


def test_update_keeps_the_template_cache_where_scaffold_cache_dir_says(
    project, new_template, tmp_path
):
    """A project rendered with the default cache (its answers record ~/.cache/...), updated on
    a machine whose SCAFFOLD_CACHE_DIR puts the cache elsewhere: nothing goes to ~/.cache."""
    home, cache = tmp_path / "other-home", tmp_path / "my-cache"
    home.mkdir()
    env = {"HOME": str(home), "SCAFFOLD_CACHE_DIR": str(cache)}
    args = ["--template", str(new_template), "--template-version", NEW_VERSION]
    result = run_scaffold("update", str(project), *args, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert LOOP_FIX in (project / "src" / "demo" / "train.py").read_text()
    assert not (home / ".cache").exists(), "the default cache was written"
    tags = git(cache / "template-repo", "tag").split()
    assert {f"v{__version__}", f"v{NEW_VERSION}"} <= set(tags), tags
    assert (
        "_src_path: ~/.cache/scaffold/template-repo"
        in (project / ".copier-answers.yml").read_text()
    ), "the project's answers stay the same on every machine"


def test_an_image_project_of_an_earlier_release_updates_to_a_backbone_and_back():
    """Releases before 0.7.0 recorded the language model's gpt2 as an image project's family,
    and no backbone: the update plans the CNN it renders. `--data backbone=...` re-plans it for
    a timm backbone (its size the backbone's), and an empty backbone back to the CNN (not at
    the backbone's size)."""
    recorded = {**VARIANTS["cpu-single-fp32"], "project_name": "x", "model_family": "gpt2"}
    recorded = {
        key: value for key, value in recorded.items() if key not in ("backbone", "image_size")
    }
    assert updated_plan(recorded, {}).answers.model_family == "cnn"
    planned = updated_plan(recorded, {"backbone": "resnet18"}).answers
    assert (planned.model_family, planned.model_size) == (
        "timm",
        str(backbone_info("resnet18").params),
    )
    timm = {
        **recorded,
        **{"model_family": "timm", "backbone": "resnet18"},
        "model_size": planned.model_size,
    }
    planned = updated_plan(timm, {"backbone": ""}).answers
    assert (planned.model_family, planned.model_size) == ("cnn", "100K")
