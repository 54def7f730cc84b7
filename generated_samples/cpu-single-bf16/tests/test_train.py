"""Rungs 4 and 5: a short run learns; its weights export cleanly and a resume is bitwise."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from cpu_single_bf16.checkpoint import (
    LAST_WEIGHTS_FILE,
    WEIGHTS_FILE,
    find_latest,
    step_folders,
)
from cpu_single_bf16.config import load_config
from cpu_single_bf16.model import build_model
from cpu_single_bf16.report.summary import expected_initial_loss
from cpu_single_bf16.runtime import init_runtime
from cpu_single_bf16.task import METRICS
from cpu_single_bf16.train import Trainer

from conftest import (
    PROJECT_ROOT,
    TEST_OVERRIDES,
    TEST_SETTINGS,
    assert_loss_curve_png,
    exported_weights,
    logged_records,
    run_training,
    tensorboard_scalars,
)

SUMMARY_KEYS = {
    *METRICS,
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
    assert summary["val_loss"] < 0.95 * expected_initial_loss(config), summary["val_loss"]
    written = json.loads((Path(config.run_dir) / "summary.json").read_text())
    assert written.keys() >= SUMMARY_KEYS
    assert all(written[name] == summary[name] for name in METRICS)
    rates = {key: value for key, value in written.items() if key.endswith("_per_second")}
    assert rates and all(value > 0 for value in rates.values()), rates


def latest_checkpoint(run_dir: Path) -> dict:
    """The `trainer.pt` state of the run's latest complete checkpoint."""
    saved = find_latest(run_dir / "checkpoints")
    assert saved is not None, f"no checkpoint in {run_dir}"
    return saved.state


def test_a_run_writes_its_weights_tensorboard_events_a_plot_and_a_trace(config):
    """The files a user looks at after a run, written by default (the profiler window on
    request): each read back by the library that a user would open it with. The run has a
    step budget (`max_steps`) that ends it inside its first epoch, validated every `val_every`
    steps and at its end, each validation checkpointed; its LR schedule spans the budget."""
    settings = {"epochs": 50, "max_steps": 11, "val_every": 4, "warmup_steps": 2}
    settings |= {"log_every": 1, "checkpoint_every": 0, "profile_steps": "2:4"}
    config = dataclasses.replace(config, **settings)
    trainer = Trainer(config, init_runtime("cpu"))
    summary = trainer.fit()
    run_dir = Path(config.run_dir)
    assert trainer.state.run_steps == summary["steps"] == 11 and summary["epochs"] < 1
    assert {f"step-{step:08d}" for step in (4, 8, 11)} <= {
        folder.name for folder in step_folders(run_dir / "checkpoints")
    }
    progress = (10 - 2) / (11 - 2)  # step 11 runs at the factor of 0-based step 10
    end = config.min_lr_ratio + (1 - config.min_lr_ratio) * (1 + math.cos(math.pi * progress)) / 2
    assert logged_records(run_dir, "train")[-1]["lr"] == pytest.approx(config.lr * end)
    weights = exported_weights(run_dir)
    assert not any(key.startswith(("module.", "_orig_mod.")) for key in weights)
    build_model(config).load_state_dict(weights, strict=True)
    for key, tensor in trainer.engine.full_state_dict().items():
        assert torch.equal(weights[key], tensor.cpu()), key
    with safe_open(run_dir / WEIGHTS_FILE, "pt") as file:
        assert json.loads(file.metadata()["config"]) == config.to_dict()
    logged = [record for record in logged_records(run_dir) if record["kind"] in ("train", "val")]
    scalars = tensorboard_scalars(run_dir)
    assert [step for step, _ in scalars["train/loss"]] == [
        r["step"] for r in logged if r["kind"] == "train"
    ]
    assert [step for step, _ in scalars["val/loss"]] == [4, 8, 11]
    assert scalars.keys() >= {"train/lr", "train/grad_norm", "train/samples_per_second"}
    for name in METRICS:
        assert scalars[f"val/{name.removeprefix('val_')}"][-1][1] == pytest.approx(summary[name])
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert_loss_curve_png(run_dir / "loss_curve.png")
    trace = json.loads((run_dir / "profile" / "rank0.pt.trace.json").read_text())
    spans = {event["name"] for event in trace["traceEvents"] if event.get("ph") == "X"}
    assert {"ProfilerStep#1", "ProfilerStep#2"} <= spans and "ProfilerStep#3" not in spans
    assert summary["files"]["profile_trace"] == str(run_dir / "profile" / "rank0.pt.trace.json")
    assert latest_checkpoint(run_dir)["components"]["progress"]["validated_step"] == 11


def test_reports_switched_off_leave_no_file_behind(config):
    config = dataclasses.replace(config, tensorboard=False, plot=False, stop_after_steps=2)
    summary = Trainer(config, init_runtime("cpu")).fit()
    written = {path.name for path in Path(config.run_dir).iterdir()}
    basics = {"checkpoints", "config.json", "metrics.jsonl", "summary.json", "summary.md"}
    basics.add(".lock")  # training/run_folder.py: one run at a time in a folder
    basics |= set(getattr(config, "task_run_files", dict)())  # what the task's weights need
    assert written == basics | {LAST_WEIGHTS_FILE}  # no validation: no best weights
    # Nothing is known of the metrics before a validation: JSON has no NaN, so null.
    text = (Path(config.run_dir) / "summary.json").read_text()
    saved = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in summary.json"))
    assert saved["best"]["value"] is None and all(saved[name] is None for name in METRICS)
    assert summary["files"] == {
        "best_weights": None,
        "last_weights": str(Path(config.run_dir) / LAST_WEIGHTS_FILE),
        "profile_trace": None,
        "plot": None,
        "tensorboard": None,
        "wandb": None,
    }


def test_model_safetensors_holds_the_best_validated_weights_and_model_last_the_last(
    config, monkeypatch
):
    """Shipped weights are the best checkpoint's, not whatever the run ended on; the final
    step's are beside them, and the summary names which is which. The validations, every 2
    steps, are stand-ins whose results worsen: early stopping, counted in validations after
    the warmup, ends the run at the fourth."""
    settings = {"epochs": 50, "val_every": 2, "early_stop_patience": 2, "monitor": "val_loss"}
    settings["warmup_steps"] = 4  # step 4's validation, in the warmup, counts for nothing
    config, validated = dataclasses.replace(config, **settings), []

    def evaluate(engine, loader, max_batches, between_batches):  # the first one is the best
        validated.append({key: value.clone() for key, value in engine.full_state_dict().items()})
        return dict.fromkeys(METRICS, 0.5) | {"val_loss": float(len(validated))}

    monkeypatch.setattr("cpu_single_bf16.train.evaluate", evaluate)
    summary = Trainer(config, init_runtime("cpu")).fit()
    run_dir = Path(config.run_dir)
    best, last = (load_file(run_dir / name) for name in (WEIGHTS_FILE, LAST_WEIGHTS_FILE))
    assert best.keys() == last.keys() == validated[0].keys()
    assert all(torch.equal(best[key], value) for key, value in validated[0].items())
    assert all(torch.equal(last[key], value) for key, value in validated[-1].items())
    assert not all(torch.equal(best[key], last[key]) for key in best), "two different steps"
    best_step = summary["best"]["step"]
    assert (best_step, summary["steps"], len(validated)) == (2, 8, 4) and summary["early_stopped"]
    with safe_open(run_dir / WEIGHTS_FILE, "pt") as file:
        metadata = file.metadata()
    assert metadata["weights"] == "best" and metadata["monitor"] == "val_loss"
    assert (int(metadata["step"]), float(metadata["value"])) == (best_step, 1.0)
    with safe_open(run_dir / LAST_WEIGHTS_FILE, "pt") as file:
        assert file.metadata()["weights"] == "last"
        assert int(file.metadata()["step"]) == summary["steps"]
    files = summary["files"]
    assert files["best_weights"] == str(run_dir / WEIGHTS_FILE)
    assert files["last_weights"] == str(run_dir / LAST_WEIGHTS_FILE)
    markdown = (run_dir / "summary.md").read_text()
    assert f"best weights {run_dir / WEIGHTS_FILE} (step {best_step})" in markdown
    assert f"last weights {run_dir / LAST_WEIGHTS_FILE} (step {summary['steps']})" in markdown


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


def train_losses(run_dir: Path) -> list[tuple[int, float]]:
    """(step, loss) of every train record, in file order: a step logged twice shows."""
    return [(r["step"], r["loss"]) for r in logged_records(run_dir) if r["kind"] == "train"]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_mid_epoch_reproduces_the_straight_run_bitwise(tmp_path, num_workers):
    """2k steps straight == k steps, checkpoints lost after step 10 (a run killed some steps
    past its last checkpoint), fresh process, the rest. The first two runs train in this
    process; the resume starts from the files alone, and every step is logged once."""
    # Half the tests' micro-batch: the property needs steps, not samples, and an epoch boundary
    # between the checkpoint and the end (checked below).
    micro_batch_size = TEST_SETTINGS["micro_batch_size"] // 2
    common = ["grad_accum_steps=2", "log_every=1", f"num_workers={num_workers}", "epochs=4"]
    common += ["device=cpu", f"micro_batch_size={micro_batch_size}", "val_every=6"]
    common += ["val_batches=2"]  # each validation also saves a checkpoint: the cost is there
    k, kept = 15, 10  # step 10 falls mid-epoch (checked below), between validations 6 and 12
    runs = straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train_here(*common, f"run_dir={straight.as_posix()!r}", f"stop_after_steps={2 * k}")
    stopped = [f"run_dir={resumed.as_posix()!r}", f"stop_after_steps={k}", "checkpoint_every=5"]
    train_here(*common, *stopped)
    for folder in step_folders(resumed / "checkpoints"):
        if int(folder.name.removeprefix("step-")) > kept:
            shutil.rmtree(folder)
    resumed_from = latest_checkpoint(resumed)["components"]["progress"]
    assert resumed_from["batch_in_epoch"] > 0
    run_training(
        *common, f"run_dir={resumed.as_posix()!r}", f"stop_after_steps={2 * k}", "--resume"
    )
    # Equal weights after the checkpoint's step need its optimizer moments too.
    expected, actual = (exported_weights(run) for run in runs)
    for key, tensor in expected.items():
        assert torch.equal(tensor, actual[key]), key
    expected, actual = (latest_checkpoint(run)["components"] for run in runs)
    assert expected["progress"]["step"] == actual["progress"]["step"] == 2 * k
    assert actual["progress"]["epoch"] > resumed_from["epoch"], "no new epoch after the resume"
    assert expected["scheduler"] == actual["scheduler"]
    assert expected["progress"]["history"] == actual["progress"]["history"]
    assert train_losses(straight) == train_losses(resumed)
    assert [r["step"] for r in logged_records(resumed) if r["kind"] == "start"] == [0, kept]
    expected, actual = (tensorboard_scalars(run) for run in runs)
    assert actual["train/loss"] == expected["train/loss"]  # steps 11-15 once, after the purge
    assert_loss_curve_png(resumed / "loss_curve.png")


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
