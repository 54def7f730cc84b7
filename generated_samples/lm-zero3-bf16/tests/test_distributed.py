"""Two processes with gloo on CPU: the run matches one process at the same global batch,
resumes exactly, resumes on one process what two saved and on two what one saved, keeps the
parameters identical on every rank, and runs on two nodes."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lm_zero3_bf16 import train as train_module
from lm_zero3_bf16.checkpoint import find_latest, step_folder_name, step_folders
from lm_zero3_bf16.config import load_config
from lm_zero3_bf16.data import PLANNED_VOCABULARY, build_datasets
from lm_zero3_bf16.engine import COMPUTE_DTYPE
from lm_zero3_bf16.hub import Architecture, hub_config
from lm_zero3_bf16.model import build_model
from lm_zero3_bf16.models import Llama, LlamaShape
from lm_zero3_bf16.preflight import main as preflight_main
from lm_zero3_bf16.preflight.checks import CHECK_FAILED, FAIL, PASS, RANKS_MISSING, SKIP
from lm_zero3_bf16.preflight.facts import run_folder_conflict
from lm_zero3_bf16.runtime import init_runtime
from lm_zero3_bf16.train import Trainer
from lm_zero3_bf16.train import main as train_main

import launcher
import rank_probe
from conftest import (
    RANDOMNESS_OFF,
    TASK_EVALUATION,
    TEST_OVERRIDES,
    assert_loss_curve_png,
    config_for_tests,
    exported_weights,
    logged_records,
    preflight_rows,
    tensorboard_scalars,
    wait_for_train_step,
)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
COMPARABLE = [*RANDOMNESS_OFF, *TASK_EVALUATION, "log_every=1", "grad_accum_steps=2", "epochs=1"]
# The runs compared with one another keep a mid-epoch checkpoint to resume on another world size.
RESUMED_AT = 4
COMPARABLE += [f"checkpoint_every={RESUMED_AT}", "keep_last=100"]
# The one-process run's micro-batch: the two-process run's global batch (32 x 2 x 2) on one.
ONE_PROCESS = ["micro_batch_size=64"]


def short_tmpdir() -> Path:
    """A short TMPDIR for the ranks and torchrun. torchrun leaves torchelastic_* folders
    there, and DataLoader workers pass tensors over Unix sockets bound under it: a socket path
    over 108 bytes fails inside the worker's queue thread and the loader waits forever (seen
    with pytest's deep tmp_path)."""
    return Path(tempfile.mkdtemp(prefix="tr-"))


@pytest.fixture
def scratch() -> Iterator[Path]:
    """`short_tmpdir`, removed after the test."""
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def launcher_env(scratch: Path) -> dict[str, str]:
    env = {"PYTHONPATH": str(PROJECT_ROOT / "src"), "OMP_NUM_THREADS": "1", "TMPDIR": str(scratch)}
    # The launch scripts call `torchrun`: take the one beside this interpreter.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {**os.environ, **env, "PATH": path}


def rank_env(rank: int, nproc: int, port: int, scratch: Path) -> dict[str, str]:
    """The variables torchrun gives process `rank` of `nproc` on one node (torch.distributed.run's
    docs, "Environment Variables"), on top of `launcher_env`."""
    ranks = {"RANK": rank, "LOCAL_RANK": rank, "ROLE_RANK": rank, "GROUP_RANK": 0}
    sizes = {"WORLD_SIZE": nproc, "LOCAL_WORLD_SIZE": nproc, "ROLE_WORLD_SIZE": nproc}
    where = {"GROUP_WORLD_SIZE": 1, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    variables = ranks | sizes | where
    return launcher_env(scratch) | {key: str(value) for key, value in variables.items()}


def start_ranks(
    entry: Callable[[], object], nproc: int, *argv: str, scratch: Path
) -> list[launcher.Launched]:
    """`entry` (e.g. `<package>.train.main`) with `argv` in `nproc` processes of one group, as
    `torchrun --standalone --nproc-per-node=NPROC` starts them, each forked from the launcher's
    server: ~0.1 s a process instead of torchrun's agent and a new interpreter per rank."""
    port = free_port()
    env = [rank_env(rank, nproc, port, scratch) for rank in range(nproc)]
    return [launcher.start(entry, *argv, cwd=PROJECT_ROOT, env=env[rank]) for rank in range(nproc)]


def wait_for_ranks(ranks: list[launcher.Launched], timeout: float, check: bool = True) -> str:
    """Wait until every rank has exited and return their stderr, rank by rank. Fails the test
    if one still runs after `timeout` s (all are killed: one waits in a collective), and with
    `check` unless all exit with 0: a rank that fails ends the others at once, as torchrun does,
    since they would wait for it in a collective."""
    deadline = time.monotonic() + timeout
    while any(rank.poll() is None for rank in ranks) and time.monotonic() < deadline:
        if check and any(rank.poll() not in (None, 0) for rank in ranks):
            break
        time.sleep(0.05)
    hung = time.monotonic() >= deadline and any(rank.poll() is None for rank in ranks)
    stderr = "".join(f"[rank {index}]\n{rank.printed()[1]}" for index, rank in enumerate(ranks))
    for rank in ranks:
        rank.close()
    assert not hung, f"a rank still ran after {timeout} s; stderr so far:\n{stderr[-4000:]}"
    statuses = [rank.returncode for rank in ranks]
    assert not check or statuses == [0] * len(ranks), f"exit statuses {statuses}:\n{stderr[-4000:]}"
    return stderr


def run_ranks(scratch: Path, nproc: int, *args: str, timeout: float = 600) -> str:
    """The training entry point with TEST_SETTINGS and ARGS on `nproc` processes (`start_ranks`)
    until they end; their stderr. Fails the test unless every rank exits with 0."""
    argv = ["device=cpu", *TEST_OVERRIDES, *args]
    return wait_for_ranks(start_ranks(train_main, nproc, *argv, scratch=scratch), timeout)


def latest_checkpoint(run_dir: Path) -> dict:
    """The `trainer.pt` state of the run's latest complete checkpoint."""
    saved = find_latest(run_dir / "checkpoints")
    assert saved is not None, f"no checkpoint in {run_dir}"
    return saved.state


def tolerance() -> dict[str, float]:
    """fp32 differs only by reduction order; lower compute precisions add rounding of their own."""
    exact = COMPUTE_DTYPE is torch.float32
    return {"rel": 1e-4, "abs": 1e-6} if exact else {"rel": 3e-2, "abs": 3e-3}


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 2-process run of tests/rank_probe.py, which trains like `train` does and records
    what ran on each rank; several tests read its run folder. Randomness off, as it is compared
    with one process at the same global batch."""
    run_dir, scratch = tmp_path_factory.mktemp("two"), short_tmpdir()
    config = PROJECT_ROOT / "configs" / "train.toml"
    argv = [str(config), str(run_dir), *TEST_OVERRIDES, *COMPARABLE]
    argv += ["micro_batch_size=32", "profile_steps=2:3"]
    try:
        ranks = start_ranks(rank_probe.run_from_command_line, 2, *argv, scratch=scratch)
        wait_for_ranks(ranks, 600)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return run_dir


def train_in_process(run_dir: Path, *settings: str, resume: bool = False) -> tuple[Trainer, list]:
    """Train in this process (a one-process group, as torchrun with one process would make)
    with TEST_SETTINGS and `settings`, recording the training samples read; returns the
    Trainer, once built (the checks on a restore come before it trains), and the list of
    batches read, filled as it trains."""
    overrides = [*TEST_OVERRIDES, *settings, "device=cpu", f"run_dir='{run_dir.as_posix()}'"]
    config = load_config(PROJECT_ROOT / "configs" / "train.toml", overrides)
    recorders: list[rank_probe.RecordedReads] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train_module, "build_datasets", rank_probe.record_reads(recorders))
        trainer = Trainer(config, init_runtime("cpu"), resume=resume)
    return trainer, recorders[0].reads


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    """The two-process run's settings on one process at the same global batch; its run
    folder and the batches it read."""
    run_dir = tmp_path_factory.mktemp("one")
    trainer, reads = train_in_process(run_dir, *COMPARABLE, *ONE_PROCESS)
    trainer.fit()
    return run_dir, reads


def test_two_processes_match_one_at_the_same_global_batch(two_process_run, one_process_run):
    """The one-process run is this module's own; the two-process run is the probe's launch."""
    (one, _), two = one_process_run, two_process_run
    single, double = logged_records(one, "train"), logged_records(two, "train")
    assert [r["step"] for r in single] == [r["step"] for r in double]
    for a, b in zip(single, double, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], **tolerance()), a["step"]
    for a, b in zip(logged_records(one, "val"), logged_records(two, "val"), strict=True):
        assert b["val_loss"] == pytest.approx(a["val_loss"], **tolerance())
    evaluations = logged_records(one, "eval"), logged_records(two, "eval")  # split over ranks
    assert bool(evaluations[0]) == bool(TASK_EVALUATION), "the task's evaluation ran"
    for a, b in zip(*evaluations, strict=True):
        assert b.keys() == a.keys() and b["step"] == a["step"]
        for key in a.keys() - {"kind", "step"}:
            assert b[key] == pytest.approx(a[key], **tolerance()), key
    summary = json.loads((two / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_batch_size"] == 128
    weights = exported_weights(two)  # one full state dict, whatever the strategy sharded
    build_model(config_for_tests(two)).load_state_dict(weights, strict=True)
    # The main process alone writes the TensorBoard events and the plot.
    assert len(list((two / "tensorboard").glob("events.out.tfevents.*"))) == 1
    logged_steps = [step for step, _ in tensorboard_scalars(two)["train/loss"]]
    assert logged_steps == [r["step"] for r in double]
    assert_loss_curve_png(two / "loss_curve.png")
    for rank in (0, 1):  # a profiler trace of its own from each process
        assert (two / "profile" / f"rank{rank}.pt.trace.json").is_file(), rank


def copy_at_step(run_dir: Path, destination: Path, step: int) -> Path:
    """A copy of `run_dir` whose latest checkpoint is `step`'s (later ones removed): a run
    interrupted there. Returns `destination`."""
    shutil.copytree(run_dir, destination)
    checkpoints = destination / "checkpoints"
    for folder in step_folders(checkpoints):
        if folder.name > step_folder_name(step):
            shutil.rmtree(folder)
    (checkpoints / "last").write_text(step_folder_name(step) + "\n")
    (checkpoints / "best").unlink(missing_ok=True)  # named a later step
    return destination


def samples_of(batches: list[list[int]]) -> list[int]:
    return [index for batch in batches for index in batch]


def reads_of_rank(run_dir: Path, rank: int) -> list[list[int]]:
    """The training batches the probe's rank `rank` read, in order."""
    return json.loads((run_dir / f"ran-rank{rank}.json").read_text())["reads"]


def assert_each_sample_once_as_straight(resumed: list[int], straight: list[int]) -> None:
    assert len(set(straight)) == len(straight), "the straight run repeats a sample in its epoch"
    assert sorted(resumed) == sorted(straight)


def assert_ends_as_straight(resumed: Path, straight: Path) -> None:
    """The last logged training loss and the validation loss of both runs agree, at the same
    step, within `tolerance`: the same global batches in another reduction order."""
    for kind, key in (("train", "loss"), ("val", "val_loss")):
        expected, actual = logged_records(straight, kind)[-1], logged_records(resumed, kind)[-1]
        assert actual["step"] == expected["step"], kind
        assert actual[key] == pytest.approx(expected[key], **tolerance()), kind


def assert_restored_moments(moments: dict[str, list]) -> None:
    """Every parameter's AdamW state came back: the checkpoint's step and a second moment."""
    assert moments["steps"], "no parameter in the optimizer"
    assert moments["steps"] == [RESUMED_AT] * len(moments["steps"]), moments["steps"]
    assert all(moments["filled"]), moments["filled"]


def assert_world_size_change_recorded(run_dir: Path, change: dict[str, int]) -> None:
    assert json.loads((run_dir / "summary.json").read_text())["world_size_changes"] == [change]
    starts = [record["world_size_change"] for record in logged_records(run_dir, "start")]
    assert starts == [None, change]


def test_a_world_size_change_is_refused_without_the_flag(tmp_path, two_process_run):
    """Refused before anything is built or written, with the way out in the message."""
    run_dir = copy_at_step(two_process_run, tmp_path / "resumed", RESUMED_AT)
    before = sorted((p, p.stat().st_mtime_ns) for p in run_dir.rglob("*"))
    with pytest.raises(ValueError, match="launch 2, or add --allow-world-size-change"):
        train_in_process(run_dir, *COMPARABLE, *ONE_PROCESS, resume=True)
    assert sorted((p, p.stat().st_mtime_ns) for p in run_dir.rglob("*")) == before


def test_the_preflight_judges_the_run_folder_as_a_resumed_run_would(tmp_path, two_process_run):
    """The run folder line refuses what the launch would: a resume on another process count
    or with changed settings, a run going on in the folder, no --resume where a run is, and
    --resume where none started; the launch the checkpoint allows passes."""
    run_dir = copy_at_step(two_process_run, tmp_path / "resumed", RESUMED_AT)
    overrides = [*TEST_OVERRIDES, *COMPARABLE, "micro_batch_size=32", f"run_dir='{run_dir}'"]
    config = load_config(PROJECT_ROOT / "configs" / "train.toml", overrides)
    assert run_folder_conflict(config, True, 2) == ""
    assert "written by 2 process(es) and this run has 1" in run_folder_conflict(config, True, 1)
    changed = dataclasses.replace(config, lr=config.lr * 2)
    assert "cannot resume with changed lr" in run_folder_conflict(changed, True, 2)
    assert "already holds a run" in run_folder_conflict(config, False, 2)
    fresh = dataclasses.replace(config, run_dir=str(tmp_path / "fresh"))
    assert "no run has started" in run_folder_conflict(fresh, True, 2)
    with open(run_dir / ".lock", "w") as lock:  # a run going on: it holds the folder's lock
        lock.write("pid 1 on node0\n")
        lock.flush()
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert "in use by pid 1 on node0" in run_folder_conflict(config, True, 2)
    assert run_folder_conflict(config, True, 2) == ""


def test_a_two_process_checkpoint_resumes_on_one_process(tmp_path, two_process_run):
    """The one process takes the global batch as 64 x 2 (micro-batches of at most 64), trains
    on exactly the samples the two processes had not reached, with every optimizer moment
    restored, and ends where the straight two-process run ended. (64 samples per micro-batch
    over all ranks, as the two processes had: the epoch drops the same tail.)"""
    run_dir = copy_at_step(two_process_run, tmp_path / "resumed", RESUMED_AT)
    settings = [*COMPARABLE, *ONE_PROCESS, "allow_world_size_change=true"]
    trainer, reads = train_in_process(run_dir, *settings, resume=True)
    assert (trainer.config.micro_batch_size, trainer.config.grad_accum_steps) == (64, 2)
    assert_restored_moments(rank_probe.adam_moments(rank_probe.stepping_optimizer(trainer.engine)))
    trainer.fit()
    ranks = [reads_of_rank(two_process_run, rank) for rank in (0, 1)]
    before = [index for batches in ranks for index in samples_of(batches[: RESUMED_AT * 2])]
    straight = [index for batches in ranks for index in samples_of(batches)]
    assert_each_sample_once_as_straight(before + samples_of(reads), straight)
    assert_ends_as_straight(run_dir, two_process_run)
    change = {"step": RESUMED_AT, "saved_world_size": 2, "world_size": 1}
    change |= {"micro_batch_size": 64, "grad_accum_steps": 2}
    assert_world_size_change_recorded(run_dir, change)
    # Relaunched on one process with the config as it was: the split the change chose stands.
    settings = [*COMPARABLE, "micro_batch_size=32", "allow_world_size_change=true"]
    again, _ = train_in_process(run_dir, *settings, resume=True)
    assert (again.config.micro_batch_size, again.config.grad_accum_steps) == (64, 2)


def test_a_one_process_checkpoint_resumes_on_two_processes(tmp_path, scratch, one_process_run):
    """The two processes split the global batch as 32 x 2 each (micro-batches of at most
    32), and the same holds as above, the optimizer state resharded onto them where the
    strategy shards it."""
    one, one_reads = one_process_run
    run_dir = copy_at_step(one, tmp_path / "resumed", RESUMED_AT)
    config = PROJECT_ROOT / "configs" / "train.toml"
    argv = [str(config), str(run_dir), *TEST_OVERRIDES, *COMPARABLE, "micro_batch_size=32"]
    argv += ["allow_world_size_change=true", "--resume"]
    wait_for_ranks(start_ranks(rank_probe.run_from_command_line, 2, *argv, scratch=scratch), 600)
    resumed = samples_of(one_reads[: RESUMED_AT * 2])
    for rank in (0, 1):
        facts = json.loads((run_dir / f"ran-rank{rank}.json").read_text())
        assert_restored_moments(facts["restored_moments"])
        resumed += samples_of(facts["reads"])
    assert_each_sample_once_as_straight(resumed, samples_of(one_reads))
    assert_ends_as_straight(run_dir, one)
    change = {"step": RESUMED_AT, "saved_world_size": 1, "world_size": 2}
    change |= {"micro_batch_size": 32, "grad_accum_steps": 2}
    assert_world_size_change_recorded(run_dir, change)


def run_until_signalled(scratch: Path, run_dir: Path, step: int, *args: str) -> str:
    """Start 2 processes and send SIGUSR1 to the second alone once `step` is logged; return
    their stderr. The run must stop with its checkpoint, every rank at the same step."""
    argv = ["device=cpu", *TEST_OVERRIDES, *args]
    ranks = start_ranks(train_main, 2, *argv, scratch=scratch)
    try:
        wait_for_train_step(ranks[0], run_dir, step, seconds=300)
        ranks[1].send_signal(signal.SIGUSR1)
    finally:
        stderr = wait_for_ranks(ranks, timeout=300, check=False)
    return stderr


def test_a_signal_to_one_rank_stops_both_at_one_step_and_the_resume_is_bitwise(tmp_path, scratch):
    """Two epochs with loader workers: the resumed run starts where the signal stopped the
    first epoch and goes on into the second."""
    common = ["log_every=1", "grad_accum_steps=2", "epochs=2", "num_workers=2"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_ranks(scratch, 2, *common, f"run_dir='{straight.as_posix()}'")
    stopping = [*common, f"run_dir='{resumed.as_posix()}'"]
    stderr = run_until_signalled(scratch, resumed, 3, *stopping)
    assert "stopped by another process's stop signal" in stderr or "by SIGUSR1" in stderr, stderr
    stopped, ended = (latest_checkpoint(r)["components"]["progress"] for r in (resumed, straight))
    assert 3 <= stopped["step"] < ended["step"] and stopped["epoch"] < ended["epoch"]
    assert max(record["step"] for record in logged_records(resumed, "train")) == stopped["step"]
    run_ranks(scratch, 2, *stopping, "--resume")
    expected, actual = exported_weights(straight), exported_weights(resumed)
    for key, tensor in expected.items():
        assert torch.equal(tensor, actual[key]), key
    assert len(latest_checkpoint(resumed)["ranks"]) == 2, "RNG and loader states for each rank"
    # Everything a step logs but its throughput, which depends on the machine's load.
    deterministic = ("step", "loss", "lr", "grad_norm")
    expected, actual = (
        [[r[key] for key in deterministic] for r in logged_records(run, "train")]
        for run in (straight, resumed)
    )
    assert actual == expected


def odd_validation_split() -> list[str]:
    """Settings whose validation split has an odd count N = 2B + 1, with micro-batch B: rank 0
    holds B + 1 samples (two batches), rank 1 holds B (one)."""
    for val_fraction in (0.2, 0.21, 0.22, 0.23, 0.11, 0.12, 0.13):
        config = dataclasses.replace(config_for_tests(Path("unused")), val_fraction=val_fraction)
        count = len(build_datasets(config)[1])
        if count % 2:
            return [f"val_fraction={val_fraction}", f"micro_batch_size={count // 2}"]
    raise AssertionError("no odd validation split among the fractions tried")


def test_unequal_validation_shards_finish_on_every_rank(tmp_path, scratch):
    """A sharded model gathers its parameters in forward: before every rank ran the same
    number of validation passes, such a run waited in validation until killed."""
    run_dir = tmp_path / "run"
    settings = [*odd_validation_split(), "epochs=1", "checkpoint_every=0"]
    run_ranks(scratch, 2, *settings, f"run_dir='{run_dir.as_posix()}'", timeout=240)
    (validation,) = logged_records(run_dir, "val")
    assert math.isfinite(validation["val_loss"])


def test_every_rank_ran_what_was_rendered_and_ends_with_identical_parameters(two_process_run):
    """Checked from inside the run: frameworks fall back without a word (a rank that trains
    alone, a sharding plugin that only replicates, a precision that becomes another), so the
    world size, the wrapper, the stored share and the compute dtype are asserted."""
    tmp_path = two_process_run
    for rank in (0, 1):
        ran = json.loads((tmp_path / f"ran-rank{rank}.json").read_text())
        assert ran["world_size"] == ran["runtime_world_size"] == 2, ran
        assert ran["compute_dtypes"] == [str(COMPUTE_DTYPE)], ran
        assert ran["stored_fraction"] == pytest.approx(0.5, abs=0.05), ran  # each rank half
        assert "DeepSpeedEngine" in ran["wrappers"], ran
        # n * M * W / N: rank 0 counts 1 and 8 targets, rank 1 2 and 8, N = 19 on both ranks
        expected = [n * 2 * 2 / 19 for n in (rank + 1, 8)]
        assert ran["unequal_step_weights"] == pytest.approx(expected, rel=1e-6), ran
    rank0, rank1 = (torch.load(tmp_path / f"params-rank{r}.pt") for r in (0, 1))
    assert torch.equal(rank0, rank1)


def llama_folder(folder: Path, shape: LlamaShape) -> Path:
    """A model folder (config.json, model.safetensors) of a random Llama of `shape`."""
    folder.mkdir()
    save_file(Llama(shape).state_dict(), folder / "model.safetensors")
    config_json = hub_config(Architecture("llama", "llama", shape))
    (folder / "config.json").write_text(json.dumps(config_json))
    return folder


def test_a_lora_run_on_two_processes_resumes_bitwise(tmp_path, scratch):
    """LoRA under this sharding strategy: frozen and trainable parameters in one shard unit,
    checkpoints that hold the adapters (the base is init_from's), and a resume from the middle
    of the run that ends bitwise where the straight run ends."""
    folder = llama_folder(tmp_path / "model", LlamaShape(PLANNED_VOCABULARY, 64, 2, 4, 2, 96, 64))
    lora = [f"init_from={folder}", "model_family=llama", "finetune=lora", "lora_rank=4"]
    lora += ["max_steps=4", "val_every=2", "checkpoint_every=2", "lr=0.01", "warmup_steps=1"]
    straight = tmp_path / "straight"
    run_ranks(scratch, 2, *lora, f"run_dir='{straight.as_posix()}'")
    resumed = copy_at_step(straight, tmp_path / "resumed", 2)
    run_ranks(scratch, 2, *lora, f"run_dir='{resumed.as_posix()}'", "--resume")
    expected, actual = exported_weights(straight), exported_weights(resumed)
    assert expected.keys() == actual.keys()
    for key, tensor in expected.items():
        assert torch.equal(tensor, actual[key]), key
    started = load_file(folder / "model.safetensors")
    for key, tensor in expected.items():  # the frozen weights are the folder's
        if ".lora_" not in key:
            assert torch.equal(tensor, started[key.replace(".base_layer.", ".")]), key


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="reads Linux's /proc")
def test_each_rank_imports_only_its_shards_of_a_model_folder(tmp_path, scratch):
    """`init_from` under a sharding strategy: each rank reads the folder's tensors one at a
    time and keeps its shard of each, so the gathered weights are the folder's and its peak
    resident memory grows by its half of the model plus about one full tensor being read."""
    depth = 2  # DeepSpeed's set-up is slower: a smaller model shows the same reads
    shape = LlamaShape(PLANNED_VOCABULARY, 1024, depth, 16, 4, 2816, max_positions=64)
    folder = llama_folder(tmp_path / "model", shape)
    config = PROJECT_ROOT / "configs" / "train.toml"
    argv = ["--setup-only", str(config), str(tmp_path), *TEST_OVERRIDES]
    argv += [f"init_from={folder}", "model_family=llama"]
    wait_for_ranks(start_ranks(rank_probe.run_from_command_line, 2, *argv, scratch=scratch), 600)
    for rank in (0, 1):
        facts = json.loads((tmp_path / f"setup-rank{rank}.json").read_text())
        assert facts["mismatched"] == [], facts["mismatched"]
        assert facts["stored_fraction"] == pytest.approx(0.5, abs=0.01), facts


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_nodes_of_one_process_each_on_this_machine(tmp_path, scratch):
    """Ranks 0 and 1 on nodes 0 and 1, each the only process of its node (LOCAL_RANK 0 on
    both), as torchrun starts them on two nodes: what the engine and the main-process-only
    writes read from the node layout."""
    run_dir = tmp_path / "multinode"
    argv = ["device=cpu", *TEST_OVERRIDES, "stop_after_steps=2", f"run_dir='{run_dir}'"]
    port, ranks = free_port(), []
    for node in (0, 1):
        env = rank_env(node, 2, port, scratch) | {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
        env |= {"GROUP_RANK": str(node), "GROUP_WORLD_SIZE": "2", "ROLE_WORLD_SIZE": "2"}
        ranks.append(launcher.start(train_main, *argv, cwd=PROJECT_ROOT, env=env))
    wait_for_ranks(ranks, 600)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 2


def preflight_outputs(ranks: list[launcher.Launched], timeout: float) -> list[tuple[int, str]]:
    """Each preflight rank's (exit status, stdout), once all have ended."""
    outputs = []
    for rank in ranks:
        with rank:
            stdout, stderr = rank.communicate(timeout)
            outputs.append((rank.returncode, stdout + stderr[-3000:]))
    return outputs


def test_the_preflight_script_passes_on_two_processes_and_leaves_nothing_behind(tmp_path, scratch):
    """`bash launch/preflight.sh` on two CPU processes, started as the run is: every check
    passes (the plan's process count only warns), the all-reduce is timed, the step and the
    checkpoint round trip run on the real model, only rank 0 prints, and neither the probes,
    the rehearsal's folder nor the run folder remain."""
    run_dir = tmp_path / "runs" / "a"
    env = launcher_env(scratch) | {"NPROC_PER_NODE": "2", "ACCELERATE_ARGS": "--num_processes 2"}
    command = ["bash", "launch/preflight.sh", "device=cpu", *TEST_OVERRIDES, f"run_dir='{run_dir}'"]
    result = subprocess.run(command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    assert result.stdout.count("check ") == 1, "only rank 0 prints the table"
    rows = preflight_rows(result.stdout)
    for check in ("ranks", "launcher", "code", "config", "data", "run folder", "disk", "step"):
        assert rows[check][0] == PASS, rows
    assert rows["ranks"][1].startswith("2 of 2 joined")
    assert rows["collective"][0] == PASS and "GB/s bus bandwidth (gloo)" in rows["collective"][1]
    assert "the saved loss back after the load" in rows["step"][1]
    assert list(tmp_path.iterdir()) == [], "the preflight left files behind"


def test_the_preflight_names_a_rank_with_other_code_and_slurm_tasks_off_the_launch(
    tmp_path, scratch
):
    """Rank 1's package source is a copy with one line changed, and the SLURM step has 4 tasks
    where torchrun runs one agent: both ranks exit 3, the code line names rank 1, the launcher line
    the task count, and nothing communicates or trains."""
    copy = tmp_path / "copy"
    package = PROJECT_ROOT / "src" / "lm_zero3_bf16"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "train.py", "a") as file:
        file.write("# edited on one node only\n")
    port, slurm = free_port(), {"SLURM_JOB_ID": "7", "SLURM_STEP_NUM_TASKS": "4"}
    slurm["TORCHELASTIC_RUN_ID"] = "7"  # torchrun's mark: one task per agent expected
    env = [rank_env(rank, 2, port, scratch) | slurm for rank in range(2)]
    argv = ["device=cpu", *TEST_OVERRIDES, f"run_dir='{tmp_path / 'run'}'"]
    rank0 = launcher.start(preflight_main, *argv, cwd=PROJECT_ROOT, env=env[0])
    rank1 = launcher.start(
        rank_probe.preflight_of_a_copy, str(copy), *argv, cwd=PROJECT_ROOT, env=env[1]
    )
    (status, stdout), (status1, _) = preflight_outputs([rank0, rank1], 300)
    assert status == status1 == CHECK_FAILED, stdout
    rows = preflight_rows(stdout)
    assert rows["code"][0] == FAIL and rows["code"][1].startswith("rank 1 "), rows
    assert rows["launcher"][0] == FAIL and "SLURM_STEP_NUM_TASKS=4" in rows["launcher"][1], rows
    assert rows["config"][0] == rows["data"][0] == PASS, rows
    assert rows["collective"][0] == rows["step"][0] == SKIP, rows


def test_the_preflight_names_a_rank_that_never_joins_and_does_not_hang(tmp_path, scratch):
    """Rank 0 of 2 alone: after --timeout seconds it reports rank 1 missing and exits 4."""
    env = rank_env(0, 2, free_port(), scratch)
    argv = ["device=cpu", *TEST_OVERRIDES, f"run_dir='{tmp_path / 'run'}'", "--timeout", "2"]
    started = time.monotonic()
    result = launcher.run(preflight_main, *argv, cwd=PROJECT_ROOT, env=env, timeout=120)
    assert result.returncode == RANKS_MISSING, result.stdout + result.stderr[-3000:]
    assert time.monotonic() - started < 60
    verdict, detail = preflight_rows(result.stdout)["ranks"]
    assert verdict == FAIL and detail.startswith("rank 1 of 2 did not answer within 2 s"), detail


def run_sbatch_script(tmp_path: Path, env: dict[str, str]) -> tuple[int, list[list[str]]]:
    """`bash launch/slurm.sbatch run_dir=runs/a lr=1e-3` in a SLURM job of one node, with SLURM's
    commands and torchrun as stand-ins that record each torchrun launch's arguments (a
    preflight exits with PREFLIGHT_STATUS); its exit status and the launches."""
    stubs, launched = tmp_path / "bin", tmp_path / "launched"
    stubs.mkdir()
    preflight = 'case "$*" in *.preflight*) exit "${PREFLIGHT_STATUS:-0}";; esac'
    for name, body in {
        "scontrol": "echo node0",  # `show hostnames`: the head node
        "srun": 'exec "$@"',
        "scancel": "true",
        "torchrun": f'printf "%s\\n" "$@" --- >> "{launched}"\n{preflight}',
    }.items():
        (stubs / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (stubs / name).chmod(0o755)
    env = {key: value for key, value in os.environ.items() if key != "SLURM_RESTART_COUNT"} | env
    env |= {"PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node0"}
    env |= {"SLURM_NNODES": "1", "SLURM_JOB_ID": "7"}
    script = ["bash", "launch/slurm.sbatch", "run_dir=runs/a", "lr=1e-3"]
    status = subprocess.run(script, cwd=PROJECT_ROOT, env=env, timeout=60).returncode
    launches = launched.read_text().split("---\n")[:-1]
    return status, [launch.splitlines() for launch in launches]


@pytest.mark.parametrize(("restarts", "resumes"), [(None, False), ("0", False), ("2", True)])
def test_the_sbatch_script_checks_first_and_resumes_a_requeued_job_only(
    tmp_path, restarts, resumes
):
    """The job runs the preflight, then the training, with the same arguments; a first launch
    starts its run (`--resume` refuses a folder where no run started), a requeued job continues
    it."""
    restart = {} if restarts is None else {"SLURM_RESTART_COUNT": restarts}
    status, launches = run_sbatch_script(tmp_path, restart)
    assert status == 0 and len(launches) == 2, launches
    modules = [launch[launch.index("-m") + 1] for launch in launches]
    package = "lm_zero3_bf16"
    assert modules == [f"{package}.preflight", f"{package}.train"], launches
    for arguments in launches:
        assert arguments[-2:] == ["run_dir=runs/a", "lr=1e-3"], arguments
        assert ("--resume" in arguments) == resumes, arguments
    assert "--starts-run" in launches[0] and "--starts-run" not in launches[1], launches
    assert "--nproc-per-node=8" in launches[0], launches


def test_the_sbatch_script_trains_nothing_when_the_preflight_fails(tmp_path):
    """A failed preflight (exit 3) ends the job with its status before the training starts;
    PREFLIGHT=0 skips the check."""
    status, launches = run_sbatch_script(tmp_path, {"PREFLIGHT_STATUS": str(CHECK_FAILED)})
    assert status == CHECK_FAILED and len(launches) == 1, launches
    shutil.rmtree(tmp_path / "bin")
    (tmp_path / "launched").unlink()
    status, launches = run_sbatch_script(tmp_path, {"PREFLIGHT": "0", "PREFLIGHT_STATUS": "3"})
    modules = [launch[launch.index("-m") + 1] for launch in launches]
    assert status == 0 and modules == ["lm_zero3_bf16.train"], launches
