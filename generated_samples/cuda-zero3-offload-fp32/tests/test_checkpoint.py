"""Sharded checkpoints: the complete-marker, fallback, pruning and refusal when none loads."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

from cuda_zero3_offload_fp32 import checkpoint
from cuda_zero3_offload_fp32.checkpoint import (
    COMPLETE_MARKER,
    REQUIRED_KEYS,
    TRAINER_FILE,
    CheckpointManager,
)
from cuda_zero3_offload_fp32.parallel import full_model_state, init_runtime
from cuda_zero3_offload_fp32.train import Trainer


def trained_twice(config) -> tuple[CheckpointManager, list[Path]]:
    config = dataclasses.replace(config, epochs=2, checkpoint_every=0)
    Trainer(config, init_runtime("cpu")).fit()
    manager = CheckpointManager(Path(config.run_dir) / "checkpoints", config.keep_last)
    return manager, manager.step_folders()


def test_a_folder_without_the_complete_marker_is_never_loaded(config):
    manager, (first, second) = trained_twice(config)
    (second / COMPLETE_MARKER).unlink()  # killed after the shards, before the marker
    latest = manager.load_latest()
    assert latest is not None and latest["path"] == str(first) and latest["fallback"]


def test_a_torn_trainer_state_falls_back_and_all_torn_is_refused(config):
    manager, folders = trained_twice(config)
    for folder in folders:
        (folder / TRAINER_FILE).write_bytes(b"torn")
    assert manager.load_latest() is None
    with pytest.raises(ValueError, match="loads"):
        Trainer(dataclasses.replace(config, epochs=2), init_runtime("cpu")).resume()


def test_a_resume_loads_the_shards_back_exactly(config):
    manager, (_, second) = trained_twice(config)
    config = dataclasses.replace(config, epochs=2)
    trainer = Trainer(config, init_runtime("cpu"))
    trainer.resume()
    exported = torch.load(Path(config.run_dir) / "model.pt", weights_only=True)
    for name, value in full_model_state(trainer.model).items():
        assert torch.equal(value, exported[name]), name
    assert trainer.state.step == int(second.name.split("-")[1])


def write_stand_in_shards(folder: Path, *training_objects) -> None:
    folder.mkdir(parents=True)
    (folder / "shard").write_bytes(b"shard")


def test_pruning_keeps_the_newest_folders_and_the_best(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "save_sharded", write_stand_in_shards)  # pruning only
    manager = CheckpointManager(tmp_path, keep_last=2)
    extra = {key: {} for key in REQUIRED_KEYS}
    for step in range(1, 6):
        manager.save(None, None, None, extra, step, is_best=step == 2)
    names = [folder.name for folder in manager.step_folders()]
    assert names == ["step-00000002", "step-00000004", "step-00000005"]
    assert not list(tmp_path.glob(".*partial")), "partial folders are renamed once whole"
    shutil.rmtree(tmp_path / "step-00000005")  # a lost folder is skipped, not fatal
    assert manager.load_latest()["path"] == str(tmp_path / "step-00000004")
