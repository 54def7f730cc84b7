"""One-file checkpoints: atomic writes, fallback past a torn file, refusal when none loads."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from multinode_ddp_bf16.checkpoint import CheckpointManager
from multinode_ddp_bf16.parallel import init_runtime
from multinode_ddp_bf16.state_io import atomic_save
from multinode_ddp_bf16.train import Trainer


def test_resume_falls_back_to_the_newest_valid_checkpoint(config):
    config = dataclasses.replace(config, epochs=2, checkpoint_every=0)
    Trainer(config, init_runtime("cpu")).fit()
    manager = CheckpointManager(Path(config.run_dir) / "checkpoints", config.keep_last)
    first, second = manager.step_files()
    second.write_bytes(second.read_bytes()[:100])  # a torn write (last.pt shares the inode)
    latest = manager.load_latest()
    assert latest is not None and latest["path"] == str(first) and latest["fallback"]


def test_resume_refuses_a_folder_of_damaged_checkpoints(config):
    config = dataclasses.replace(config, epochs=1)
    Trainer(config, init_runtime("cpu")).fit()
    for path in (Path(config.run_dir) / "checkpoints").glob("*.pt"):
        path.write_bytes(b"torn")
    with pytest.raises(ValueError, match="loads"):
        Trainer(config, init_runtime("cpu")).resume()


def test_checkpoint_holds_the_bare_models_keys(config):
    config = dataclasses.replace(config, epochs=1)
    Trainer(config, init_runtime("cpu")).fit()
    last = Path(config.run_dir) / "checkpoints" / "last.pt"
    state = torch.load(last, weights_only=True)
    assert not any(key.startswith(("module.", "_orig_mod.")) for key in state["model"])


def test_atomic_save_keeps_the_previous_file_when_a_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    atomic_save({"step": 1}, path)

    def crash(obj, file):
        file.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError):
        atomic_save({"step": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]
