"""What a run writes for its user besides checkpoints: TensorBoard events that show each step
once after a resume, a W&B run kept offline, the loss-curve plot, the profiler window's setting.
The short runs of test_train.py read the same files back from real training."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from lm_zero3_bf16.config import load_config
from lm_zero3_bf16.engine.mfu import model_flops_utilization
from lm_zero3_bf16.plot import main as plot_main
from lm_zero3_bf16.plot import write_plot
from lm_zero3_bf16.report import TensorBoardTracker, keep_records_up_to, open_trackers
from lm_zero3_bf16.train import Trainer

from conftest import PROJECT_ROOT, assert_loss_curve_png, tensorboard_scalars


def test_tensorboard_shows_each_step_once_after_a_resume_from_an_earlier_step(config, tmp_path):
    """The first launch logged steps 1-5, its last checkpoint was at step 3: the resume
    writes from step 4 on, and TensorBoard's reader drops the first launch's 4 and 5. The
    reader takes event files in name order (the second, host and pid, as text): the first
    launch's file is named as if opened this second by a pid that sorts after any, and the
    resume's must still be read after it."""
    first = TensorBoardTracker(tmp_path / "tensorboard", config, purge_step=1)
    for step in range(1, 6):
        first.log_scalars({"train/loss": float(step)}, step)
    first.close()
    (events,) = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
    name = events.name.split(".")
    name[3], name[-2] = str(int(time.time())), "9" * 12
    events.rename(events.with_name(".".join(name)))
    resumed = TensorBoardTracker(tmp_path / "tensorboard", config, purge_step=4)
    for step in range(4, 7):
        resumed.log_scalars({"train/loss": 10.0 * step}, step)
    resumed.close()
    expected = [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0), (6, 60.0)]
    assert tensorboard_scalars(tmp_path)["train/loss"] == expected


def test_metrics_after_the_resumed_step_and_a_torn_last_line_are_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    logged = [{"kind": "start", "step": 0}]
    logged += [{"kind": "train", "step": step, "loss": 1.0 / step} for step in range(1, 8)]
    logged.insert(6, {"kind": "val", "step": 5, "val_loss": 0.5})
    path.write_text("".join(json.dumps(record) + "\n" for record in logged))
    keep_records_up_to(path, 5)
    kept = [json.loads(line) for line in path.read_text().splitlines()]
    assert kept == [record for record in logged if record["step"] <= 5]
    assert kept[-1]["kind"] == "val"
    with open(path, "a") as file:  # a process killed while it appended
        file.write('{"kind": "train", "st')
    keep_records_up_to(path, 5)
    assert [json.loads(line) for line in path.read_text().splitlines()] == kept


def test_wandb_runs_offline_and_records_the_config_and_the_scalars(config, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # nothing reaches the network
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = dataclasses.replace(config, logger="wandb", tensorboard=False)
    (tracker,) = open_trackers(config, first_step=1)
    tracker.log_scalars({"train/loss": 0.25, "train/lr": 1e-3}, 1)
    tracker.close()
    (run_file,) = (Path(config.run_dir) / "wandb").glob("offline-run-*/run-*.wandb")
    recorded = run_file.read_bytes()  # W&B's protobuf records hold keys as plain strings
    assert b"train/loss" in recorded and b"train/lr" in recorded
    assert b"micro_batch_size" in recorded


def test_wandb_without_the_extra_installed_is_refused_before_work_starts(
    config, runtime, monkeypatch
):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what find_spec sees when it is absent
    config = dataclasses.replace(config, logger="wandb")
    with pytest.raises(ValueError, match=r'pip install -e "\.\[wandb\]"'):
        Trainer(config, runtime)
    assert not Path(config.run_dir).exists()


def write_run(run_dir: Path, resumed_at: int | None) -> None:
    """A run folder as training leaves it: config.json, metrics.jsonl, the `best` pointer."""
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps({"monitor": "val_loss"}))
    records = [{"kind": "start", "step": 0, "resumed_from": None}]
    for step in range(1, 21):
        if step == resumed_at:
            records.append({"kind": "start", "step": step - 1, "resumed_from": "step"})
        records.append({"kind": "train", "step": step, "loss": 2.0 / step, "lr": 1e-3})
        if step % 5 == 0:
            records.append(
                {"kind": "val", "step": step, "val_loss": 1.0 / step, "val_accuracy": step / 20}
            )
    lines = "".join(json.dumps(record) + "\n" for record in records)
    (run_dir / "metrics.jsonl").write_text(lines)
    (run_dir / "checkpoints" / "best").write_text("step-00000020\n")


def test_the_plot_overlays_runs_and_writes_one_run_into_its_folder(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    write_run(first, resumed_at=None)
    write_run(second, resumed_at=12)
    overlay = plot_main([str(first), str(second), "--out", str(tmp_path / "both.png")])
    assert overlay == tmp_path / "both.png"
    assert_loss_curve_png(overlay)
    assert plot_main([str(second)]) == second / "loss_curve.png"
    assert_loss_curve_png(second / "loss_curve.png")
    with pytest.raises(SystemExit, match="metrics.jsonl not found"):
        plot_main([str(tmp_path / "missing")])


@pytest.mark.parametrize("resumed", [False, True])
def test_a_run_stopped_before_its_first_validation_plots_without_a_warning(tmp_path, resumed):
    """No validation yet: the metrics panel holds at most a resume's dotted line, which has no
    label, and a legend there warned "No artists with labels found to put in legend"."""
    records = [{"kind": "start", "step": 0, "resumed_from": None}]
    records += [{"kind": "train", "step": step, "loss": 2.0 / step} for step in (1, 2)]
    if resumed:
        records += [{"kind": "start", "step": 2, "resumed_from": "step-00000002"}]
        records += [{"kind": "train", "step": 3, "loss": 0.6}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        # but a dependency's notice about its own dependencies (matplotlib 3.8 on pyparsing 3.3)
        warnings.simplefilter("ignore", DeprecationWarning)
        assert_loss_curve_png(write_plot([tmp_path], tmp_path / "loss_curve.png"))


@pytest.mark.parametrize("bad", ["5:3", "0:2", "10", "a:b", "3:3"])
def test_a_profile_window_that_is_not_start_before_stop_is_refused(bad):
    with pytest.raises(ValueError, match="profile_steps must be START:STOP"):
        load_config(PROJECT_ROOT / "configs" / "train.toml", [f"profile_steps={bad}"])


def test_the_profile_window_reads_like_a_slice_and_is_off_when_empty():
    config = load_config(PROJECT_ROOT / "configs" / "train.toml", ["profile_steps=10:15"])
    assert config.profile_window() == (10, 15)
    assert load_config(PROJECT_ROOT / "configs" / "train.toml").profile_window() is None


def test_an_unknown_logger_is_refused():
    with pytest.raises(ValueError, match="logger must be one of none, wandb"):
        load_config(PROJECT_ROOT / "configs" / "train.toml", ["logger=mlflow"])


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),  # the SXM module
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
    ],
)
def test_mfu_divides_by_the_detected_boards_own_peak(monkeypatch, name, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert model_flops_utilization(peak / 2, "cuda:0") == pytest.approx(0.5)
    assert model_flops_utilization(peak / 2, "cpu") is None
