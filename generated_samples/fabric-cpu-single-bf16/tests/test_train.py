"""Rungs 4 and 5: a short run learns; its weights export cleanly and a resume is bitwise."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from fabric_cpu_single_bf16.checkpoint import find_latest
from fabric_cpu_single_bf16.config import load_config
from fabric_cpu_single_bf16.model import build_model
from fabric_cpu_single_bf16.runtime import init_runtime
from fabric_cpu_single_bf16.task import EXPECTED_INITIAL_LOSS
from fabric_cpu_single_bf16.train import Trainer

from conftest import PROJECT_ROOT, TEST_OVERRIDES, run_training

SUMMARY_KEYS = {
    "val_accuracy",
    "val_loss",
    "steps",
    "samples_per_second",
    "peak_memory_bytes",
    "checkpoint",
    "config",
    "torch_version",
    "framework",
    "seed",
}


def test_short_run_moves_the_validation_metric_and_writes_the_summary(config):
    config = dataclasses.replace(config, epochs=2)
    summary = Trainer(config, init_runtime("cpu")).fit()
    assert summary["val_loss"] < 0.95 * EXPECTED_INITIAL_LOSS, summary["val_loss"]
    written = json.loads((Path(config.run_dir) / "summary.json").read_text())
    assert written.keys() >= SUMMARY_KEYS
    assert written["val_accuracy"] == summary["val_accuracy"]
    rates = {key: value for key, value in written.items() if key.endswith("_per_second")}
    assert rates and all(value > 0 for value in rates.values()), rates


def latest_checkpoint(run_dir: Path) -> dict:
    """The `trainer.pt` state of the run's latest complete checkpoint."""
    saved = find_latest(run_dir / "checkpoints")
    assert saved is not None, f"no checkpoint in {run_dir}"
    return saved.state


def test_exported_weights_load_into_a_plain_model(config):
    config = dataclasses.replace(config, epochs=1)
    Trainer(config, init_runtime("cpu")).fit()
    weights = torch.load(Path(config.run_dir) / "model.pt", weights_only=True)
    assert not any(key.startswith(("module.", "_orig_mod.")) for key in weights)
    build_model(config).load_state_dict(weights, strict=True)
    assert latest_checkpoint(Path(config.run_dir))["components"]["progress"]["epoch"] == 1


def test_a_resume_with_nothing_left_keeps_the_runs_summary(config):
    config = dataclasses.replace(config, epochs=1)
    summary = Trainer(config, init_runtime("cpu")).fit()
    written = (Path(config.run_dir) / "summary.json").read_text()
    assert Trainer(config, init_runtime("cpu"), resume=True).fit() == summary
    assert (Path(config.run_dir) / "summary.json").read_text() == written


def test_starting_over_in_a_used_run_folder_is_refused(config):
    config = dataclasses.replace(config, epochs=1)
    Trainer(config, init_runtime("cpu")).fit()
    with pytest.raises(ValueError, match="--resume"):
        Trainer(config, init_runtime("cpu"))
    changed = dataclasses.replace(config, micro_batch_size=config.micro_batch_size // 2)
    with pytest.raises(ValueError, match="micro_batch_size"):
        Trainer(changed, init_runtime("cpu"), resume=True)


def train_here(*settings: str) -> None:
    """Train in this process with TEST_SETTINGS and `settings` (key=value, as on the command
    line), the way `python -m <package>.train` would."""
    config = load_config(PROJECT_ROOT / "configs" / "train.toml", [*TEST_OVERRIDES, *settings])
    Trainer(config, init_runtime("cpu")).fit()


def train_losses(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_mid_epoch_reproduces_the_straight_run_bitwise(tmp_path, num_workers):
    """2k steps straight == k steps, checkpoint mid-epoch, fresh process, k more steps. The
    first two runs train in this process; the resume starts from the files alone."""
    common = ["grad_accum_steps=2", "log_every=1", f"num_workers={num_workers}", "epochs=4"]
    common += ["device=cpu"]
    k = 15  # steps 15 and 30 fall mid-epoch (checked below for 15)
    runs = straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train_here(*common, f"run_dir={straight.as_posix()!r}", f"stop_after_steps={2 * k}")
    train_here(*common, f"run_dir={resumed.as_posix()!r}", f"stop_after_steps={k}")
    assert latest_checkpoint(resumed)["components"]["progress"]["batch_in_epoch"] > 0
    run_training(
        *common, f"run_dir={resumed.as_posix()!r}", f"stop_after_steps={2 * k}", "--resume"
    )
    # Equal weights after k steps from the checkpoint need its optimizer moments too.
    expected, actual = (torch.load(run / "model.pt", weights_only=True) for run in runs)
    for key, tensor in expected.items():
        assert torch.equal(tensor, actual[key]), key
    expected, actual = (latest_checkpoint(run)["components"] for run in runs)
    assert expected["progress"]["step"] == actual["progress"]["step"] == 2 * k
    assert expected["scheduler"] == actual["scheduler"]
    assert expected["progress"]["history"] == actual["progress"]["history"]
    assert train_losses(straight) == train_losses(resumed)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_resume_on_cuda(config):
    """A checkpoint written on the GPU resumes there: RNG and loader-generator states come back
    as CPU tensors. The CPU twin of this path is the bitwise resume test above."""
    config = dataclasses.replace(config, device="cuda", epochs=2, checkpoint_every=5)
    stopped = Trainer(dataclasses.replace(config, stop_after_steps=7), init_runtime("cuda"))
    stopped.fit()
    summary = Trainer(config, init_runtime("cuda"), resume=True).fit()
    assert summary["resumed_from"] and summary["steps"] > 7
    assert math.isfinite(summary["val_loss"])
