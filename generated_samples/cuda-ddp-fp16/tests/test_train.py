"""Rungs 4 and 5: a short run learns; checkpoints are atomic, loadable and resume bitwise."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from conftest import run_training
from cuda_ddp_fp16.checkpoint import CheckpointManager, atomic_save
from cuda_ddp_fp16.data import NUM_CLASSES
from cuda_ddp_fp16.model import build_model
from cuda_ddp_fp16.parallel import init_runtime
from cuda_ddp_fp16.train import Trainer

SUMMARY_KEYS = {
    "val_accuracy",
    "val_loss",
    "steps",
    "samples_per_second",
    "peak_memory_bytes",
    "checkpoint",
    "config",
    "torch_version",
    "seed",
}


def test_short_run_moves_the_validation_metric_and_writes_the_summary(config):
    config = dataclasses.replace(config, epochs=2)
    summary = Trainer(config, init_runtime("cpu")).fit()
    chance = math.log(NUM_CLASSES)  # the loss of a uniform prediction
    assert summary["val_loss"] < 0.7 * chance, summary["val_loss"]
    written = json.loads((Path(config.run_dir) / "summary.json").read_text())
    assert written.keys() >= SUMMARY_KEYS
    assert written["val_accuracy"] == summary["val_accuracy"]


def test_checkpoint_loads_weights_only_into_a_plain_model(config):
    config = dataclasses.replace(config, epochs=1)
    Trainer(config, init_runtime("cpu")).fit()
    state = torch.load(Path(config.run_dir) / "checkpoints" / "last.pt", weights_only=True)
    assert not any(key.startswith(("module.", "_orig_mod.")) for key in state["model"])
    build_model(config).load_state_dict(state["model"], strict=True)
    assert state["progress"]["epoch"] == 1


def test_starting_over_in_a_used_run_folder_is_refused(config):
    config = dataclasses.replace(config, epochs=1)
    Trainer(config, init_runtime("cpu")).fit()
    with pytest.raises(ValueError, match="--resume"):
        Trainer(config, init_runtime("cpu")).check_fresh_start()
    changed = dataclasses.replace(config, micro_batch_size=config.micro_batch_size // 2)
    with pytest.raises(ValueError, match="micro_batch_size"):
        Trainer(changed, init_runtime("cpu")).resume()


def test_resume_refuses_a_folder_of_damaged_checkpoints(config):
    config = dataclasses.replace(config, epochs=1)
    Trainer(config, init_runtime("cpu")).fit()
    for path in (Path(config.run_dir) / "checkpoints").glob("*.pt"):
        path.write_bytes(b"torn")
    with pytest.raises(ValueError, match="loads"):
        Trainer(config, init_runtime("cpu")).resume()


def final_state(run_dir: Path, step: int) -> dict:
    return torch.load(run_dir / "checkpoints" / f"step-{step:08d}.pt", weights_only=True)


def train_losses(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_mid_epoch_reproduces_the_straight_run_bitwise(tmp_path, num_workers):
    """2k steps straight == k steps, checkpoint mid-epoch, fresh process, k more steps."""
    common = ["grad_accum_steps=2", "log_every=1", f"num_workers={num_workers}", "epochs=4"]
    k = 15  # steps 15 and 30 fall mid-epoch (checked below for 15)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_training(*common, f"run_dir={straight.as_posix()!r}", f"stop_after_steps={2 * k}")
    run_training(*common, f"run_dir={resumed.as_posix()!r}", f"stop_after_steps={k}")
    assert final_state(resumed, k)["progress"]["batch_in_epoch"] > 0, "not mid-epoch"
    run_training(
        *common, f"run_dir={resumed.as_posix()!r}", f"stop_after_steps={2 * k}", "--resume"
    )
    expected, actual = final_state(straight, 2 * k), final_state(resumed, 2 * k)
    for key, tensor in expected["model"].items():
        assert torch.equal(tensor, actual["model"][key]), key
    for key, value in expected["optimizer"]["state"].items():
        for name, tensor in value.items():
            assert torch.equal(tensor, actual["optimizer"]["state"][key][name]), (key, name)
    assert expected["scheduler"] == actual["scheduler"]
    assert expected["progress"]["history"] == actual["progress"]["history"]
    assert train_losses(straight) == train_losses(resumed)


def test_resume_falls_back_to_the_newest_valid_checkpoint(config):
    config = dataclasses.replace(config, epochs=2, checkpoint_every=0)
    Trainer(config, init_runtime("cpu")).fit()
    manager = CheckpointManager(Path(config.run_dir) / "checkpoints", config.keep_last)
    first, second = manager.step_files()
    second.write_bytes(second.read_bytes()[:100])  # a torn write (last.pt shares the inode)
    latest = manager.load_latest()
    assert latest is not None and latest["path"] == str(first)


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
