"""`scaffold new` from the outside: defaults, prompts, and every kind of bad input."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pexpect
import pytest
import yaml
from conftest import REPO_ROOT, run_scaffold, snapshot

from scaffold import __version__

DEFAULT_FILES = {
    ".copier-answers.yml",
    ".dockerignore",
    "Dockerfile",
    ".github/workflows/tests.yml",
    ".gitignore",
    "README.md",
    "docs/loss_curve.png",
    "pyproject.toml",
    "configs/train.toml",
    "tests/conftest.py",
    "tests/launcher.py",
    "tests/test_build.py",
    "tests/test_checkpoint.py",
    "tests/test_data_headroom.py",
    "tests/test_example.py",
    "tests/test_host_memory.py",
    "tests/test_images.py",
    "tests/test_loader.py",
    "tests/test_loop.py",
    "tests/test_model.py",
    "tests/test_optim.py",
    "tests/test_preflight.py",
    "tests/test_reliability.py",
    "tests/test_reports.py",
    "tests/test_train.py",
} | {
    f"src/demo/{name}.py"
    for name in (
        # the user's files, what they import, and the commands
        "__init__",
        "backbone",
        "config",
        "data",
        "data_headroom",
        "model",
        "planned",
        "plot",
        "predict",
        "prepare",
        "runtime",
        "state_io",
        "task",
        "task_config",
        "train",
        # the machinery, by package
        "checkpoint/__init__",
        "checkpoint/resume",
        "checkpoint/schedule",
        "checkpoint/store",
        "checkpoint/world_size",
        "inference/__init__",
        "inference/trained",
        "images/__init__",
        "images/augment",
        "images/decode",
        "images/pipeline",
        "images/recipe",
        "images/sources",
        "images/store",
        "engine/__init__",
        "engine/amp",
        "engine/build",
        "engine/host_memory",
        "engine/replicated",
        "engine/strategy",
        "loader/__init__",
        "loader/dataloaders",
        "loader/samplers",
        "report/confusion",
        "preflight/__init__",
        "preflight/__main__",
        "preflight/checks",
        "preflight/command",
        "preflight/facts",
        "preflight/step",
        "report/__init__",
        "report/profiling",
        "report/run_log",
        "report/summary",
        "report/trackers",
        "training/__init__",
        "training/data_position",
        "training/nonfinite",
        "training/optim",
        "training/preemption",
        "training/run_folder",
        "training/safeguards",
        "training/seeding",
        "training/state",
        "training/validation",
    )
}


def test_new_with_defaults_renders_commits_and_records_answers(tmp_path):
    result = run_scaffold("new", "demo", "--defaults", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    project = tmp_path / "demo"
    answers = (project / ".copier-answers.yml").read_text()
    # The probe answers mps on an Apple GPU, which no container reaches.
    containers = {".dockerignore", "Dockerfile"} if "hardware: mps" in answers else set()
    assert set(snapshot(project)) == DEFAULT_FILES - containers
    assert "_src_path: ~/.cache/scaffold/template-repo" in answers
    assert f"_commit: v{__version__}" in answers
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
    assert (
        "bfloat16" in (tmp_path / "proj" / "src" / "my_net" / "engine" / "strategy.py").read_text()
    )


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
    "trillions": (
        ["x", "--defaults", "--data", "task=language-model", "--data", "model_size=10T"],
        "model_size=10T is more than the largest decoder the example renders",
    ),
    "absurd-gpu-memory": (
        ["x", "--defaults", "--data", "hardware=cuda", "--data", "gpu_memory_gb=1e9"],
        "gpu_memory_gb=1e9 is more than any GPU has (the largest, NVIDIA's B300 and AMD's MI355X: "
        "268 GiB); answer more than 0 and at most 1,024",
    ),
    "absurd-host-memory": (
        ["x", "--defaults", "--data", "host_memory_gb=1e7"],
        "answer 0 to 65,536",
    ),
    "absurd-gpus-per-node": (
        ["x", "--defaults", "--data", "hardware=cuda", "--data", "gpus_per_node=512"],
        "answer 1 to 64",
    ),
    "absurd-nodes": (["x", "--defaults", "--data", "num_nodes=1000000"], "answer 1 to 100,000"),
    "nan-memory": (["x", "--defaults", "--data", "host_memory_gb=nan"], "not a finite number"),
    "bad-gpu-memory": (
        ["x", "--defaults", "--data", "gpu_memory_gb=lots"],
        "is not a number; answer e.g. gpu_memory_gb=79.6",
    ),
    "fsdp2-fp16": (
        [
            "x",
            "--defaults",
            "--data",
            "gpu_memory_gb=16",
            "--data",
            "precision=fp16",
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
            "gpu_memory_gb=16",
            "--data",
            "precision=fp16",
            "--data",
            "hardware=cuda",
            "--data",
            "gpu_arch=volta-turing",
            "--data",
            "strategy=zero3",
        ],
        "precision=bf16 or fp32",
    ),  # fmt: skip
    "mps-ddp": (["x", "--defaults", "--data", "hardware=mps", "--data", "strategy=ddp"], "MPS"),
    "mps-fabric": (
        ["x", "--defaults", "--data", "hardware=mps", "--data", "framework=fabric"],
        "framework=fabric with hardware=mps is not available yet",
    ),
    "7b-on-16-gb": (
        [
            "x",
            "--defaults",
            "--data",
            "task=language-model",
            "--data",
            "model_size=7B",
            "--data",
            "host_memory_gb=16",
        ],
        "more than the usable",
    ),  # fmt: skip
    "fp16-on-cpu": (["x", "--defaults", "--data", "precision=fp16"], "answer bf16 or fp32"),
    "cuda-without-arch": (["x", "--defaults", "--data", "hardware=cuda"], "gpu_arch"),
    "cuda-without-memory": (
        ["x", "--defaults", "--data", "hardware=cuda", "--data", "gpu_arch=ampere"],
        "answer gpu_memory_gb in GiB",
    ),
    "bf16-on-turing": (
        [
            "x",
            "--defaults",
            "--data",
            "gpu_memory_gb=16",
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
            "gpu_memory_gb=16",
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


DOWN, UP, BACKSPACE = "\x1b[B", "\x1b[A", "\x7f"


def test_interactive_prompts_with_a_pseudo_terminal(tmp_path):
    """Drive questionary through a real pty as a user would: an unknown timm backbone (refused
    under the prompt), back from the hardware question to the task and on, CUDA on 2 GPUs
    (back from the node count to change them), absurd GPU memory and a model too large for the
    digits example first (each refused under the prompt), bf16, and `auto` for the strategy,
    which shows what it picks; choices that cannot work are shown as not available, with the
    reason. The plan is printed once."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TERM": "xterm"}
    # prompt_toolkit asks the terminal where the cursor is (CPR) to know the rows below it;
    # pexpect's terminal never answers, and each prompt waited a second for the answer.
    env["PROMPT_TOOLKIT_NO_CPR"] = "1"
    child = pexpect.spawn(
        sys.executable, ["-m", "scaffold", "new", "netproj"], cwd=str(tmp_path), env=env,
        encoding="utf-8", timeout=60, dimensions=(50, 200),
    )  # fmt: skip
    child.logfile_read = transcript = io.StringIO()

    def answer(prompt: str, keys: str = "") -> None:
        child.expect(prompt)
        child.send(keys + "\r")

    child.expect("Project name")
    answer("'← back' in a list or < typed goes back")  # told at the first question
    answer("Example task")
    answer("Image model: a timm backbone", "resnet_nope")
    child.expect("is not a timm")  # refused where it was typed
    child.send(BACKSPACE * 11 + "\r")  # empty: the example's CNN
    answer("Hardware", UP)  # cpu -> (wraps around to) ← back
    answer("Image model: a timm backbone", "<")  # asked again; back once more
    answer("Example task")  # asked again
    answer("Image model: a timm backbone")
    answer("Hardware", DOWN)  # cpu -> cuda
    child.expect("GPU architecture")
    # `none` is listed, as information, not selectable.
    child.expect(r"- none \(not available: hardware=cuda needs the GPU architecture\)")
    child.send("\r")  # the first choice that can work: hopper
    answer("GPUs per node", BACKSPACE + "3")
    answer("Number of nodes", BACKSPACE + "<")  # back: GPUs per node offers 3 again
    answer("GPUs per node", BACKSPACE + "2")
    answer("Number of nodes")
    answer("Memory per GPU", BACKSPACE * 8 + "1e9")
    child.expect("more than any GPU has")  # refused where it was typed
    child.send(BACKSPACE * 3 + "40\r")
    answer("Host memory per node", BACKSPACE * 8 + "64")
    answer("Model size", BACKSPACE * 8 + "7B")
    child.expect("too large for the 8x8-digits example model")
    child.send(BACKSPACE * 2 + "100K\r")
    answer("Training framework")
    answer("Precision", DOWN * 2)  # auto -> fp32 -> bf16
    child.expect("Parallelism strategy")
    child.expect(r"per device: micro-batch, GiB needed of 34.0 usable")
    child.expect(r"auto +ddp: micro-batch \d+, ~[\d.]+ GiB")  # what auto picks, at which batch
    child.expect(r"- single \(not available: strategy=single uses one device but 2 GPUs")
    child.send("\r")
    answer("torch.compile")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    output = transcript.getvalue()
    assert output.count("Estimated memory per device") == 1, "the plan, printed once"
    assert "cannot be chosen" not in output
    engine = (tmp_path / "netproj" / "src" / "netproj" / "engine" / "strategy.py").read_text()
    assert "COMPUTE_DTYPE = torch.bfloat16" in engine
    recorded = yaml.safe_load((tmp_path / "netproj" / ".copier-answers.yml").read_text())
    assert (recorded["strategy"], recorded["gpus_per_node"]) == ("ddp", 2)
    assert (recorded["gpu_memory_gb"], recorded["host_memory_gb"]) == (40.0, 64.0)


NVIDIA_SMI = """#!/bin/sh
# A stand-in for nvidia-smi on a machine with 8 H100s: what the probe's query prints.
for gpu in 0 1 2 3 4 5 6 7; do echo "NVIDIA H100 80GB HBM3, 81559, 9.0"; done
"""


def stand_in_nvidia_smi(folder, script: str = NVIDIA_SMI) -> dict[str, str]:
    """An `nvidia-smi` executable in `folder`, first on PATH in the returned environment."""
    folder.mkdir()
    executable = folder / "nvidia-smi"
    executable.write_text(script)
    executable.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def test_defaults_on_a_machine_with_gpus_render_a_cuda_project_for_them(tmp_path):
    env = stand_in_nvidia_smi(tmp_path / "bin")
    result = run_scaffold("new", "gpus", "--defaults", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    recorded = yaml.safe_load((tmp_path / "gpus" / ".copier-answers.yml").read_text())
    assert (recorded["hardware"], recorded["gpu_arch"]) == ("cuda", "hopper")
    assert (recorded["gpus_per_node"], recorded["gpu_memory_gb"]) == (8, 79.6)  # 81,559 MiB
    assert (recorded["strategy"], recorded["precision"]) == ("ddp", "bf16")
    assert "strategy=ddp: the model fits on one GPU" in result.stdout


def test_a_broken_nvidia_smi_means_cpu(tmp_path):
    env = stand_in_nvidia_smi(tmp_path / "bin", "#!/bin/sh\necho 'NVIDIA-SMI has failed'; exit 9\n")
    result = run_scaffold("plan", "--defaults", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert "strategy=single" in result.stdout and "fp32" in result.stdout


def test_plan_prints_each_decision_and_the_memory_table_and_writes_nothing(tmp_path):
    env = stand_in_nvidia_smi(tmp_path / "bin")
    data = ["--data", "task=language-model", "--data", "model_size=7B"]
    result = run_scaffold("plan", "--defaults", *data, "--data", "host_memory_gb=1024",
                          cwd=tmp_path, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Plan for language-model, model_size=7B: 6,864,642,048 parameters")
    decisions = ["precision=bf16:", "strategy=fsdp2:", "block_size=2048:", "lr=1.2e-4:"]
    decisions += ['tokenizer="bpe":', "vocab_size=50304:"]
    decisions += ["micro_batch_size=", "grad_accum_steps=", "activation_checkpointing="]
    for decision in decisions:
        assert any(line.strip().startswith(decision) for line in lines), decision
    step = next(line for line in lines if line.startswith("  one optimizer step: "))
    sequences = int(re.search(r"([\d,]+) sequences x 2,048 tokens", step).group(1).replace(",", ""))
    assert f"= {sequences * 2048:,} tokens" in step and sequences >= 256, step
    table = lines[lines.index(next(line for line in lines if line.startswith("Estimated"))) :]
    for component in ("weights", "gradients", "optimizer", "activations", "buffers", "peak"):
        assert any(line.split()[0] == component for line in table[1:]), component
    assert list(tmp_path.iterdir()) == [tmp_path / "bin"], "nothing written"
    forced = run_scaffold("plan", "--defaults", *data, "--data", "host_memory_gb=1024",
                          "--data", "strategy=ddp", cwd=tmp_path, env=env)  # fmt: skip
    assert forced.returncode == 0 and "strategy=ddp does not fit" in forced.stderr


@pytest.mark.parametrize("where", ["new-folder-inside", "existing-folder-with-force"])
def test_a_destination_without_write_permission_is_one_line_exit_2(tmp_path, where):
    """A DEST inside a folder this user cannot write (chmod 0o555), or an existing DEST that
    cannot be written: one line that says what to do, exit 2, nothing written.

    Root writes through permission bits, so under root the refusal does not happen and the test
    is skipped; test_render's staging-folder test makes the file system refuse for every user."""
    if os.geteuid() == 0:
        pytest.skip("root writes through permission bits: the refusal cannot happen")
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "notes.txt").write_text("mine")
    args = ["locked", "--force"] if where.startswith("existing") else ["locked/proj"]
    locked.chmod(0o555)
    try:
        result = run_scaffold("new", *args, "--defaults", cwd=tmp_path)
        entries = sorted(path.name for path in locked.iterdir())
    finally:
        locked.chmod(0o755)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("scaffold: error: cannot write"), lines
    assert "is not writable by you; choose a folder you can write to" in lines[0]
    assert entries == ["notes.txt"] and (locked / "notes.txt").read_text() == "mine"


def test_the_next_steps_launch_a_multi_node_plan_with_its_launchers(tmp_path):
    """2 nodes x 4 GPUs: `Next:` gives the multi-node launchers the project has (sbatch, or
    multinode.sh on each node), not a single-process command."""
    data = ["hardware=cuda", "gpu_arch=hopper", "gpus_per_node=4", "num_nodes=2"]
    data += ["gpu_memory_gb=80"]
    flags = [flag for pair in data for flag in ("--data", pair)]
    result = run_scaffold("new", "mn", "--defaults", *flags, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    steps = result.stdout.split("Next:")[1]
    assert "python -m mn.train" not in steps and "torchrun.sh" not in steps, steps
    assert "sbatch launch/slurm.sbatch" in steps and "SLURM: 2 nodes x 4 GPUs" in steps
    assert "HEAD_NODE=<first node> bash launch/multinode.sh" in steps
    assert "on each of the 2 nodes" in steps
    for script in ("launch/slurm.sbatch", "launch/multinode.sh"):
        assert (tmp_path / "mn" / script).is_file(), script


LAUNCHES = {
    "cpu-single-fp32": "python -m cpu_single_fp32.train",
    "cuda-ddp-bf16": "bash launch/torchrun.sh",
    "cpu-ddp-fp32": "bash launch/torchrun.sh",
    "lm-zero3-bf16": "bash launch/torchrun.sh",
    "multinode-ddp-bf16": "sbatch launch/slurm.sbatch",
    "accelerate-cuda-ddp-bf16": "bash launch/accelerate.sh",
}


@pytest.mark.parametrize("variant", list(LAUNCHES))
def test_the_next_steps_launch_each_plan_with_a_launcher_its_project_has(variant):
    from scaffold.answers import build_answers, merge_sources
    from scaffold.cli import launch_commands, preflight_command
    from scaffold.planner import plan
    from scaffold.variants import VARIANTS

    answers = plan(build_answers(merge_sources(VARIANTS[variant], {"project_name": variant})))
    commands = [command for command, _ in launch_commands(answers.answers)]
    assert commands[0] == LAUNCHES[variant]
    commands.append(preflight_command(answers.answers)[0])
    sample = REPO_ROOT / "generated_samples" / variant
    for script in re.findall(r"launch/\S+", " ".join(commands)):
        assert (sample / script).is_file(), script


@pytest.mark.parametrize("variant", ["cpu-single-fp32", "mps-single-fp32", "cuda-single-bf16"])
def test_the_next_steps_install_as_the_readme_does(variant):
    """A CPU project's printed steps installed PyPI's torch, the multi-GB CUDA build, while its
    README took the CPU index: each printed install command is the README's."""
    from scaffold.answers import build_answers, merge_sources
    from scaffold.cli import install_commands
    from scaffold.variants import VARIANTS

    answers = build_answers(merge_sources(VARIANTS[variant], {"project_name": variant}))
    commands = install_commands(answers)
    readme = (REPO_ROOT / "generated_samples" / variant / "README.md").read_text()
    lines = [line.split("  #")[0].strip() for line in readme.splitlines()]
    assert all(command in lines for command in commands), commands
    assert any("whl/cpu" in command for command in commands) == (variant.startswith("cpu"))


def test_new_help_lists_every_answer_key_with_the_values_it_takes(tmp_path):
    from scaffold.answers import QUESTIONS

    usage = run_scaffold("new", "--help", cwd=tmp_path).stdout
    keys = usage[usage.index("answer keys (--data KEY=VALUE") :]
    for question in QUESTIONS:
        entry = re.search(rf"^  {question.key} +(.*)\n +(.*)$", keys, re.MULTILINE)
        assert entry, question.key
        assert question.prompt in entry.group(1), question.key
        for value in question.choices:
            assert value in entry.group(2).split(" | "), (question.key, value)
    assert re.search(r"^  gpu_memory_gb .*\n +more than 0 and at most 1,024$", keys, re.MULTILINE)
    assert re.search(r"^  strategy .*\(default auto\)", keys, re.MULTILINE)
