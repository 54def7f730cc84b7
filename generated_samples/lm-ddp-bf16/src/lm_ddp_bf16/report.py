"""What a run reports: the metrics log (JSON lines) and its trackers (TensorBoard, W&B), the
progress bar, the profiler window, the loss-curve plot, and the run summary of the output
contract (Markdown + JSON)."""

from __future__ import annotations

import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from .config import Config
from .engine import FRAMEWORK, PRECISION, STRATEGY
from .plot import PLOT_FILE, read_records, write_plot
from .profiling import ProfileWindow
from .progress import TrainState, check_monitor
from .runtime import Runtime, all_reduce_sum
from .state_io import atomic_write_text
from .task import EXPECTED_INITIAL_LOSS, METRICS, describe_throughput, throughput
from .trackers import Tracker, check_trackers, open_trackers, scalar_tags


class RunLog:
    """What a run reports: `metrics.jsonl` (where each launch starts, train steps and
    validations, one JSON object per line) and the same values to the trackers, the progress
    bar, the throughput counters, the profiler window, the plot and the run summary. Only the
    main process writes and prints; every process counts and reduces alike, and writes its own
    profiler trace. Used as a context, it closes on the way out.

    Raises:
        ValueError: a tracker the config asks for is not installed (`check_trackers`), or
            `monitor` is not one of the task's metrics (`check_monitor`).
    """

    def __init__(self, config: Config, runtime: Runtime, parameters: int):
        self.config, self.runtime, self.parameters = config, runtime, parameters
        self.path = Path(config.run_dir) / "metrics.jsonl"
        self.stats = {"samples": 0, "train_seconds": 0.0, "data_seconds": 0.0}
        self.bar: tqdm | None = None
        self.epoch_start = 0.0
        self.since_log = (0.0, 0)  # clock and sample count at the last train log line
        check_trackers(config)
        check_monitor(config.monitor)
        self.trackers: list[Tracker] = []
        self.profile = ProfileWindow(config, runtime)

    def start_run(self, state: TrainState, resumed_from: str | None) -> None:
        """Create the run folder and save the resolved config as config.json in it; drop what
        an earlier launch logged after `state.step` (a killed run logs steps that its resume
        trains again); record where this launch starts; open the trackers; open the profiler
        window if it starts here. A run with nothing left to train records nothing."""
        if state.finished(self.config):
            return
        if self.runtime.is_main:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            config_json = json.dumps(self.config.to_dict(), indent=2)
            (self.path.parent / "config.json").write_text(config_json, encoding="utf-8")
            keep_records_up_to(self.path, state.step)
            self.write("start", step=state.step, resumed_from=resumed_from)
            self.trackers = open_trackers(self.config, first_step=state.step + 1)
        self.profile.at_step(state.step)

    def write(self, kind: str, **values: Any) -> None:
        """Append `{"kind": kind, **values}` to metrics.jsonl and its numbers to the trackers,
        at `values["step"]` (main process only)."""
        if self.runtime.is_main:
            with open(self.path, "a", encoding="utf-8") as file:
                file.write(json.dumps({"kind": kind, **values}) + "\n")
            scalars = scalar_tags(kind, values)
            for tracker in self.trackers if scalars else ():
                tracker.log_scalars(scalars, values["step"])

    def start_epoch(self, state: TrainState, steps_per_epoch: int) -> None:
        """Open the epoch's progress bar at the step the epoch (re)starts from; start its clock."""
        self.epoch_start = time.perf_counter()
        self.since_log = (self.epoch_start, self.stats["samples"])
        done = math.ceil(state.batch_in_epoch / self.config.grad_accum_steps)
        self.bar = tqdm(
            total=steps_per_epoch,
            initial=done,
            desc=f"epoch {state.epoch + 1}/{self.config.epochs}",
            disable=not self.runtime.is_main,
            leave=False,
        )

    def step(
        self,
        state: TrainState,
        micro_batches: int,
        loss: Tensor,
        grad_norm: Tensor,
        lr: float,
        extra: dict[str, float],
    ) -> bool:
        """Count one optimizer step of `micro_batches` micro-batches; every `log_every` steps
        (and at step 1) sync its loss to the host, the loop's only `.item()`s, and log it with
        `lr` (the rate the step used), the pre-clip gradient norm, `extra` (the skipped-update
        count...) and the throughput since the previous log line (wall clock, validation
        excluded). Moves the profiler window on. Returns True when it logged (and synced).

        An inf or NaN loss is logged as it is: nonfinite.py decides what it means.
        """
        samples_per_micro_batch = self.config.micro_batch_size * self.runtime.world_size
        self.stats["samples"] += micro_batches * samples_per_micro_batch
        self.bar.update()
        self.profile.at_step(state.step)
        if state.step != 1 and state.step % self.config.log_every:
            return False
        world = self.runtime.world_size  # every rank logs the same steps: a safe collective
        loss_value = all_reduce_sum(loss.detach().clone(), self.runtime).item() / world
        if state.step == 1:
            state.initial_loss = loss_value
        values = {"loss": loss_value, "lr": lr, "grad_norm": grad_norm.item(), **extra}
        self.write("train", step=state.step, **values, **self._recent_throughput())
        self.bar.set_postfix(loss=f"{loss_value:.4f}", lr=f"{lr:.2e}")
        return True

    def _recent_throughput(self) -> dict[str, float]:
        """The task's rates (`task.throughput`: samples/s and the task's own) since the last
        train log line, or since the epoch began."""
        (clock, samples), now = self.since_log, time.perf_counter()
        self.since_log = (now, self.stats["samples"])
        window = {
            "samples": self.stats["samples"] - samples,
            "train_seconds": now - clock,
            "config": self.config.to_dict(),
            "parameters": self.parameters,
            "device": str(self.runtime.device),
        }
        return {key: rate for key, rate in throughput(window).items() if rate is not None}

    def end_epoch(self, data_seconds: float) -> None:
        """Close the bar; add the epoch's training time and `data_seconds` waited on the loader."""
        self.bar.close()
        self.stats["train_seconds"] += time.perf_counter() - self.epoch_start
        self.stats["data_seconds"] += data_seconds

    def summary(
        self,
        state: TrainState,
        checkpoint_dir: Path,
        resumed_from: str | None,
        weights: dict[str, str | None],
    ) -> dict[str, Any]:
        """Close the profiler window and the trackers, draw the plot, build the run summary
        (with the exported `weights`, `CheckpointManager.export_weights`'s entries, and the
        paths of what this run wrote); the main process prints it and writes summary.json / .md.

        A resumed run with nothing left to train keeps the summary its last training wrote.
        """
        trace = self.profile.close()
        self.close()
        written = Path(self.config.run_dir) / "summary.json"
        if self.stats["samples"] == 0 and written.is_file():
            self.runtime.notice(f"nothing left to train at step {state.step}; see {written}")
            return json.loads(written.read_text(encoding="utf-8"))
        files = {**weights, "profile_trace": str(trace) if trace else None}
        files |= self._write_plot_and_name_files()
        summary = build_summary(
            config=self.config,
            state=state,
            stats=self.stats,
            runtime=self.runtime,
            parameters=self.parameters,
            checkpoint_dir=checkpoint_dir,
            early_stopped=state.early_stopped(self.config.early_stop_patience),
            resumed_from=resumed_from,
            files=files,
        )
        if self.runtime.is_main:
            print(write_summary(Path(self.config.run_dir), summary), end="")
        return summary

    def _write_plot_and_name_files(self) -> dict[str, str | None]:
        run_dir = Path(self.config.run_dir)
        plot = run_dir / PLOT_FILE if self.config.plot else None
        if plot is not None and self.runtime.is_main:
            write_plot([run_dir], plot)
        tensorboard = run_dir / "tensorboard" if self.config.tensorboard else None
        wandb = run_dir / "wandb" if self.config.logger == "wandb" else None
        return {
            key: str(path) if path else None
            for key, path in {"plot": plot, "tensorboard": tensorboard, "wandb": wandb}.items()
        }

    def close(self) -> None:
        """Flush and close the trackers and the progress bar (idempotent; also on a stopped or
        failed run's way out, which leaves the epoch's bar open)."""
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exception: object) -> None:
        self.close()


def keep_records_up_to(path: Path, step: int) -> None:
    """Rewrite metrics.jsonl at `path` without the records logged after optimizer step `step`
    and without a torn last line (atomically; untouched when there is nothing to drop).
    TensorBoard's `purge_step` does the same for its event files."""
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [record for record in read_records(path) if record["step"] <= step]
    if len(kept) != len(lines):
        atomic_write_text("".join(json.dumps(record) + "\n" for record in kept), path)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this process in bytes: CUDA allocator peak on GPU, else peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max_rss if sys.platform == "darwin" else max_rss * 1024  # Linux reports KiB


def git_commit() -> str:
    """Short commit hash of the working directory's repository, or 'unknown'."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return result.stdout.strip()


def build_summary(
    *,
    config: Config,
    state: TrainState,
    stats: dict[str, float],
    runtime: Runtime,
    parameters: int,
    checkpoint_dir: Path,
    early_stopped: bool,
    resumed_from: str | None,
    files: dict[str, str | None],
) -> dict[str, Any]:
    """The run summary as plain values, for summary.json: run, global batch, LR schedule,
    steps and epochs, the initial-loss sanity check, results, throughput, and the `files` the
    run wrote besides its checkpoints (the best checkpoint's and the last step's weights, plot,
    TensorBoard folder...; None: off, or no best before the first validation).

    `stats` holds `samples` (all processes), `train_seconds` (training only, no validation) and
    `data_seconds` (waiting on the loader); rates are per second of training time.
    `parameters` is the model's parameter count, taken before any wrapper partitioned it.
    """
    last = state.history[-1] if state.history else dict.fromkeys(METRICS, math.nan)
    best_pointer = checkpoint_dir / "best"  # names the best step folder
    best = checkpoint_dir / best_pointer.read_text().strip() if best_pointer.is_file() else None
    summary = {
        "run_dir": config.run_dir,
        "git_commit": git_commit(),
        "torch_version": torch.__version__,
        "device": str(runtime.device),
        "strategy": STRATEGY,
        "precision": PRECISION,
        "framework": FRAMEWORK,
        "world_size": runtime.world_size,
        "global_batch_size": config.micro_batch_size * runtime.world_size * config.grad_accum_steps,
        "parameters": parameters,
        "seed": config.seed,
        "steps": state.step,
        "epochs_completed": state.epoch,
        "early_stopped": early_stopped,
        "initial_loss": state.initial_loss,
        "expected_initial_loss": EXPECTED_INITIAL_LOSS,
        "resumed_from": resumed_from,
        **{name: last[name] for name in METRICS},
        "best": {"value": state.best_value, "step": state.best_step, "epoch": state.best_epoch},
        "checkpoint": str(best or checkpoint_dir),
        "samples": stats["samples"],
        "data_time_share": stats["data_seconds"] / max(stats["train_seconds"], 1e-9),
        "train_seconds": stats["train_seconds"],
        "peak_memory_bytes": peak_memory_bytes(runtime.device),
        "files": files,
        "config": config.to_dict(),
    }
    return summary | throughput(summary)


def format_summary(summary: dict[str, Any]) -> str:
    """The run summary as Markdown, one bold-labelled line per field of the output contract."""
    config = summary["config"]
    lines = [
        f"**Run:** {summary['run_dir']} | commit {summary['git_commit']} | seed {config['seed']} "
        f"| torch {summary['torch_version']} | {summary['device']} {summary['strategy']} "
        f"{summary['precision']} on {summary['framework']}",
        f"**Global batch:** {summary['global_batch_size']} ({config['micro_batch_size']} x "
        f"{summary['world_size']} process(es) x {config['grad_accum_steps']} accumulation) | "
        f"**LR:** warmup {config['warmup_steps']} steps, cosine to {config['min_lr_ratio']} x "
        f"{config['lr']:g} | **Steps:** {summary['steps']} in {summary['epochs_completed']} "
        f"epoch(s){' (early stop)' if summary['early_stopped'] else ''}",
        f"**Sanity:** initial loss {summary['initial_loss']:.4f} (expected "
        f"{summary['expected_initial_loss']:.4f}); resumed from: {summary['resumed_from'] or 'no'}",
        _results(summary),
        f"**Throughput:** {describe_throughput(summary)} | data-loader time share "
        f"{summary['data_time_share']:.1%} | peak memory "
        f"{summary['peak_memory_bytes'] / 2**20:,.0f} MiB | "
        f"train time {summary['train_seconds']:.1f} s",
        _files(summary),
    ]
    return "\n".join(lines) + "\n"


def _files(summary: dict[str, Any]) -> str:
    steps = {"best_weights": summary["best"]["step"], "last_weights": summary["steps"]}
    named = ", ".join(
        f"{kind.replace('_', ' ')} {path}" + (f" (step {steps[kind]})" if kind in steps else "")
        for kind, path in summary["files"].items()
        if path
    )
    return f"**Files:** {named}"


def _results(summary: dict[str, Any]) -> str:
    best, monitor = summary["best"], summary["config"]["monitor"]
    if best["step"] < 0:
        return (
            "**Results:** no validation yet, so no best weights (the last step's only); "
            f"checkpoint {summary['checkpoint']}"
        )
    return (
        f"**Results:** {', '.join(f'{name} {summary[name]:.4f}' for name in METRICS)}; "
        f"best {monitor} {best['value']:.4f} at step "
        f"{best['step']} (epoch {best['epoch']}); checkpoint {summary['checkpoint']}"
    )


def write_summary(run_dir: Path, summary: dict[str, Any]) -> str:
    """Write `summary.json` and `summary.md` into `run_dir`; return the Markdown."""
    markdown = format_summary(summary)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (run_dir / "summary.md").write_text(markdown, encoding="utf-8")
    return markdown
