"""`scaffold new` from the outside: defaults, prompts, and every kind of bad input."""

from __future__ import annotations

import os
import subprocess
import sys

import pexpect
import pytest
from conftest import REPO_ROOT, run_scaffold, snapshot

DEFAULT_FILES = {
    ".copier-answers.yml",
    ".github/workflows/tests.yml",
    ".gitignore",
    "README.md",
    "docs/loss_curve.png",
    "pyproject.toml",
    "configs/train.toml",
    "tests/conftest.py",
    "tests/test_checkpoint.py",
    "tests/test_data_headroom.py",
    "tests/test_example.py",
    "tests/test_loader.py",
    "tests/test_loop.py",
    "tests/test_model.py",
    "tests/test_optim.py",
    "tests/test_reports.py",
    "tests/test_train.py",
} | {
    f"src/demo/{name}.py"
    for name in (
        "__init__",
        "checkpoint",
        "config",
        "data",
        "data_headroom",
        "engine",
        "loader",
        "model",
        "optim",
        "plot",
        "profiling",
        "progress",
        "report",
        "resume",
        "runtime",
        "state_io",
        "task",
        "trackers",
        "train",
    )
}


def test_new_with_defaults_renders_commits_and_records_answers(tmp_path):
    result = run_scaffold("new", "demo", "--defaults", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    project = tmp_path / "demo"
    assert set(snapshot(project)) == DEFAULT_FILES
    answers = (project / ".copier-answers.yml").read_text()
    assert "_src_path: ~/.cache/scaffold/template-repo" in answers
    assert "_commit: v0.1.0" in answers
    assert "precision: fp32" in answers and "strategy: single" in answers
    log = subprocess.run(
        ["git", "log", "--oneline"], cwd=project, capture_output=True, text=True, check=True
    )
    assert len(log.stdout.splitlines()) == 1
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=project, capture_output=True, text=True, check=True
    )
    assert status.stdout == "", "the first commit holds every rendered file"
    assert "python -m demo.train" in result.stdout


def test_data_answers_reach_the_render(tmp_path):
    result = run_scaffold(
        "new", "proj", "--defaults", "--data", "project_name=my-net", "--data", "precision=bf16",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "proj" / "src" / "my_net" / "train.py").is_file()
    assert "bfloat16" in (tmp_path / "proj" / "src" / "my_net" / "engine.py").read_text()


BAD_INPUTS = {
    "name-starts-with-digit": (["1net", "--defaults"], "Python identifier"),
    "name-with-dots": (["x", "--defaults", "--data", "project_name=a..b"], "'..'"),
    "name-with-separator": (["x", "--defaults", "--data", "project_name=a/b"], "path separator"),
    "name-keyword": (["class", "--defaults"], "keyword"),
    "name-ends-with-dash": (["net-", "--defaults"], "ending with a letter"),
    "name-too-long": (["x" * 300, "--defaults"], "too long"),
    "name-shadows-torch": (["torch", "--defaults"], "shadows"),
    "unknown-key": (["x", "--defaults", "--data", "optimiser=sgd"], "unknown answer key"),
    "not-key-value": (["x", "--defaults", "--data", "precision"], "KEY=VALUE"),
    "unknown-value": (["x", "--defaults", "--data", "precision=fp8"], "is not known"),
    "bad-int": (["x", "--defaults", "--data", "num_nodes=two"], "is not a whole number"),
    "bad-model-size": (
        ["x", "--defaults", "--data", "model_size=big"],
        "whole number of parameters",
    ),
    "huge-model": (["x", "--defaults", "--data", "model_size=7B"], "too large"),
    "fsdp2-fp16": (
        [
            "x",
            "--defaults",
            "--data",
            "hardware=cuda",
            "--data",
            "gpu_arch=volta-turing",
            "--data",
            "strategy=fsdp2",
        ],
        "precision=bf16 or fp32",
    ),  # fmt: skip
    "fabric-zero3": (
        ["x", "--defaults", "--data", "framework=fabric", "--data", "strategy=zero3"],
        "framework=fabric with strategy=zero3 is not available yet",
    ),
    "zero3-fp16": (
        [
            "x",
            "--defaults",
            "--data",
            "hardware=cuda",
            "--data",
            "gpu_arch=volta-turing",
            "--data",
            "strategy=zero3",
        ],
        "precision=bf16 or fp32",
    ),  # fmt: skip
    "mps-later": (["x", "--defaults", "--data", "hardware=mps"], "not available yet"),
    "fp16-on-cpu": (["x", "--defaults", "--data", "precision=fp16"], "answer bf16 or fp32"),
    "cuda-without-arch": (["x", "--defaults", "--data", "hardware=cuda"], "gpu_arch"),
    "bf16-on-turing": (
        [
            "x",
            "--defaults",
            "--data",
            "hardware=cuda",
            "--data",
            "gpu_arch=volta-turing",
            "--data",
            "precision=bf16",
        ],
        "answer fp16 or fp32",
    ),  # fmt: skip
    "single-on-8-gpus": (
        [
            "x",
            "--defaults",
            "--data",
            "hardware=cuda",
            "--data",
            "gpu_arch=ampere",
            "--data",
            "gpus_per_node=8",
            "--data",
            "strategy=single",
        ],
        "strategy=ddp",
    ),  # fmt: skip
    "no-terminal": (["x"], "--defaults"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, isolated_home, case):
    args, message = BAD_INPUTS[case]
    result = run_scaffold("new", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("scaffold: error:"), result.stderr
    assert message in lines[0]
    assert list(tmp_path.iterdir()) == [], "nothing written"


def test_non_empty_destination_is_refused_and_left_alone(tmp_path):
    dest = tmp_path / "taken"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    result = run_scaffold("new", "taken", "--defaults", cwd=tmp_path)
    assert result.returncode == 2
    assert "--force" in result.stderr and "Traceback" not in result.stderr
    assert [p.name for p in dest.iterdir()] == ["notes.txt"]
    forced = run_scaffold("new", "taken", "--defaults", "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert (dest / "notes.txt").read_text() == "mine"
    assert (dest / "src" / "taken" / "train.py").is_file()
    assert not (dest / ".git").exists(), "the user's files are never committed for them"


def test_variants_lists_names_first(tmp_path):
    result = run_scaffold("variants", cwd=tmp_path)
    assert result.returncode == 0
    names = [line.split()[0] for line in result.stdout.splitlines()]
    assert "cpu-single-fp32" in names and len(names) == len(set(names))


def test_interactive_prompts_with_a_pseudo_terminal(tmp_path):
    """Drive questionary through a real pty: accept defaults, but pick bf16 for precision."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TERM": "xterm"}
    child = pexpect.spawn(
        sys.executable, ["-m", "scaffold", "new", "netproj"], cwd=str(tmp_path), env=env,
        encoding="utf-8", timeout=60, dimensions=(40, 120),
    )  # fmt: skip
    prompts = ["Project name", "Example task", "Hardware", "Model size", "Training framework"]
    prompts += ["Parallelism strategy"]
    for prompt in prompts:
        child.expect(prompt)
        child.send("\r")
    child.expect("Precision")
    child.send("\x1b[B\x1b[B")  # down twice: auto -> fp32 -> bf16
    child.send("\r")
    child.expect("torch.compile")
    child.send("\r")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    engine = (tmp_path / "netproj" / "src" / "netproj" / "engine.py").read_text()
    assert "COMPUTE_DTYPE = torch.bfloat16" in engine
