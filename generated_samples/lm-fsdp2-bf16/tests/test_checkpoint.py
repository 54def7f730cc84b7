"""Checkpoints: the complete-marker, fallback past a damaged folder, refusal when none loads,
an exact reload, pruning, atomic writes, background saves, and the batch split and random
streams of a resume on another number of processes."""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from lm_fsdp2_bf16.checkpoint import (
    COMPLETE_MARKER,
    TRAINER_FILE,
    CheckpointManager,
    find_latest,
    split_global_batch,
    step_folders,
)
from lm_fsdp2_bf16.checkpoint import store as checkpoint_module
from lm_fsdp2_bf16.config import Config
from lm_fsdp2_bf16.runtime import init_runtime
from lm_fsdp2_bf16.state_io import atomic_save, full_disk_exits
from lm_fsdp2_bf16.train import Trainer
from lm_fsdp2_bf16.training import TrainState, derived_seed

from conftest import config_for_tests, exported_weights


@pytest.fixture(scope="module")
def two_epochs(tmp_path_factory) -> Config:
    """One run of two epochs with a checkpoint at each end only, trained once for this module."""
    config = config_for_tests(tmp_path_factory.mktemp("two-epochs") / "run")
    config = dataclasses.replace(config, epochs=2, checkpoint_every=0)
    Trainer(config, init_runtime("cpu")).fit()
    return config


@pytest.fixture
def trained(two_epochs, tmp_path) -> tuple[Config, Path, list[Path]]:
    """A copy of that run for one test to damage: its config, checkpoint folder and steps."""
    config = dataclasses.replace(two_epochs, run_dir=str(tmp_path / "run"))
    shutil.copytree(two_epochs.run_dir, config.run_dir)
    directory = Path(config.run_dir) / "checkpoints"
    return config, directory, step_folders(directory)


def test_a_folder_without_the_complete_marker_is_never_loaded(trained):
    _, directory, (first, second) = trained
    (second / COMPLETE_MARKER).unlink()  # killed after the engine's files, before the marker
    latest = find_latest(directory)
    assert latest is not None and latest.folder == first and latest.fallback


def test_a_torn_trainer_state_falls_back_and_all_torn_is_refused(trained):
    config, directory, (first, second) = trained
    (second / TRAINER_FILE).write_bytes(b"torn")
    assert find_latest(directory).folder == first
    (first / TRAINER_FILE).write_bytes(b"torn")
    assert find_latest(directory) is None
    with pytest.raises(ValueError, match="loads"):
        Trainer(config, init_runtime("cpu"), resume=True)


def test_a_resume_loads_the_weights_back_exactly(trained):
    config, _, (_, second) = trained
    trainer = Trainer(config, init_runtime("cpu"), resume=True)
    exported = exported_weights(Path(config.run_dir))
    for name, value in trainer.engine.full_state_dict().items():
        assert torch.equal(value, exported[name]), name
    assert trainer.state.step == int(second.name.split("-")[1])
    assert trainer.resumed_from == str(second)


class StandInEngine:
    """Writes one small file per checkpoint: enough to test the folder handling alone."""

    def save(self, folder: Path) -> None:
        (folder / "weights").write_bytes(b"weights")

    def start_save(self, folder: Path):
        return lambda: self.save(folder)

    def load(self, folder: Path) -> None:
        assert (folder / "weights").read_bytes() == b"weights"

    def full_state_dict(self) -> dict:
        return {}


def test_pruning_keeps_the_newest_folders_and_the_best(config):
    config = dataclasses.replace(config, keep_last=2)
    progress = TrainState()
    manager = CheckpointManager(
        config, init_runtime("cpu"), StandInEngine(), {"progress": progress}, {}
    )
    for step in range(1, 6):
        progress.step = step
        manager.save(step, is_best=step == 2)
    manager.wait()  # the last save may still be written in the background (async_checkpoint)
    names = [folder.name for folder in step_folders(manager.directory)]
    assert names == ["step-00000002", "step-00000004", "step-00000005"]
    assert not list(manager.directory.glob(".*partial")), "partial folders are renamed once whole"
    shutil.rmtree(manager.directory / "step-00000005")  # a lost folder is skipped, not fatal
    latest = manager.candidates()[0]
    assert latest.folder.name == "step-00000004" and latest.fallback
    manager.restore(latest)
    assert progress.step == 4


def test_atomic_save_keeps_the_previous_file_when_a_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "weights.pt"
    atomic_save({"step": 1}, path)

    def crash(obj, file: Path):
        file.write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError):
        atomic_save({"step": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["weights.pt"]


@pytest.mark.parametrize(
    ("global_batch", "world_size", "max_micro_batch", "split"),
    [(128, 1, 64, (64, 2)), (128, 2, 32, (32, 2)), (128, 8, 64, (16, 1)), (120, 8, 4, (3, 5))],
)
def test_a_global_batch_splits_as_the_planner_splits_it(
    global_batch, world_size, max_micro_batch, split
):
    """The largest micro-batch at most the config's that divides the samples per process."""
    assert split_global_batch(global_batch, world_size, max_micro_batch) == split


def test_a_global_batch_that_does_not_divide_among_the_processes_is_refused():
    with pytest.raises(ValueError, match="launch a number of processes that divides 96"):
        split_global_batch(96, 5, 8)


def test_derived_seeds_differ_per_rank_and_step_and_fit_numpy():
    seeds = {derived_seed(1337, step, rank) for step in (0, 40) for rank in range(4)}
    assert len(seeds) == 8 and all(0 <= seed < 2**32 for seed in seeds)
    assert derived_seed(1337, 40, 1) == derived_seed(1337, 40, 1)


def test_background_saves_end_bitwise_where_synchronous_saves_end(tmp_path):
    """The same checkpoints, each complete, and the same final weights; the seconds training
    waited in the saves are in the summary (printed, not asserted: the machine's load sets
    them)."""
    summaries, runs = {}, {}
    for background in (False, True):
        config = config_for_tests(tmp_path / f"async-{background}")
        config = dataclasses.replace(
            config, epochs=1, checkpoint_every=2, keep_last=100, async_checkpoint=background
        )
        summaries[background] = Trainer(config, init_runtime("cpu")).fit()
        runs[background] = Path(config.run_dir)
    folders = {key: step_folders(run / "checkpoints") for key, run in runs.items()}
    assert [f.name for f in folders[True]] == [f.name for f in folders[False]]
    assert all((folder / COMPLETE_MARKER).is_file() for folder in folders[True])
    expected, actual = (exported_weights(run) for run in (runs[False], runs[True]))
    assert all(torch.equal(actual[name], value) for name, value in expected.items())
    last = (runs[True] / "checkpoints" / "last").read_text().strip()
    assert last == folders[True][-1].name
    saves = {key: summary["checkpoint_saves"] for key, summary in summaries.items()}
    assert saves[True] == saves[False] == len(folders[True])
    for key, summary in summaries.items():
        print(f"async_checkpoint={key}: {summary['checkpoint_stall_seconds']:.4f} s stalled")


def test_a_background_save_waits_for_the_one_before_and_its_failure_stops_the_run(config):
    """A save stages the state only once the write before it is on disk; a write that fails
    ends the run with its error, the checkpoint before it loading, and the next start removes
    what the failed write left."""
    config = dataclasses.replace(
        config, async_checkpoint=True, checkpoint_every=1, stop_after_steps=4
    )
    trainer, events = Trainer(config, init_runtime("cpu")), []
    start_save = trainer.engine.start_save

    def slow_start_save(folder: Path):
        events.append(("staged", folder.name))
        write = start_save(folder)

        def slow_write() -> None:
            time.sleep(0.1)
            if folder.name == ".step-00000003.partial":
                raise OSError("no space left on device")
            write()
            events.append(("written", folder.name))

        return slow_write

    trainer.engine.start_save = slow_start_save
    with pytest.raises(OSError, match="no space left"):
        trainer.fit()
    names = [f".step-0000000{step}.partial" for step in (1, 2, 3)]
    assert events == [
        ("staged", names[0]),
        ("written", names[0]),
        ("staged", names[1]),
        ("written", names[1]),
        ("staged", names[2]),
    ]
    assert find_latest(Path(config.run_dir) / "checkpoints").folder.name == "step-00000002"
    resumed = Trainer(config, init_runtime("cpu"), resume=True)
    assert resumed.state.step == 2
    assert not list((Path(config.run_dir) / "checkpoints").glob(".*"))


def test_a_full_disk_at_a_save_ends_the_run_in_one_line_and_keeps_the_checkpoint_before(
    config, monkeypatch
):
    """The disk fills while step 4's checkpoint is written: its partial folder goes, step 2
    stays the latest, and the error says where, how much a checkpoint takes and what to free;
    the entry point prints it as one line (a background save's error surfaces at the wait)."""
    checkpoints = Trainer(config, init_runtime("cpu")).checkpoints
    checkpoints.save(2, is_best=False)
    checkpoints.wait()  # on disk, where it was written in the background

    def fills_up(state, path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint_module, "atomic_save", fills_up)
    message = r"no space left on device writing checkpoint step-00000004 in .* MiB free, and a "
    message += r"checkpoint of this run takes .*keep_last .*step-00000002 is still the latest"
    with pytest.raises(OSError, match=message) as full:
        checkpoints.save(4, is_best=False)
        checkpoints.wait()
    assert find_latest(checkpoints.directory).folder.name == "step-00000002"
    assert not list(checkpoints.directory.glob(".*")), "no partial folder left"
    one_line = r"^error: no space left on device writing[^\n]*$"
    with pytest.raises(SystemExit, match=one_line), full_disk_exits():
        raise full.value
    with pytest.raises(PermissionError), full_disk_exits():
        raise PermissionError(errno.EACCES, "another error: a traceback, as any")
