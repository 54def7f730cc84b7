"""The run summary of the output contract, written when a run ends: summary.json and
summary.md in the run folder (and printed), with the loss-curve plot and the paths of every
file the run wrote."""

from __future__ import annotations

import json
import math
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from .. import task
from ..checkpoint.store import CheckpointManager
from ..config import Config
from ..engine.strategy import FRAMEWORK, PRECISION, STRATEGY
from ..plot import PLOT_FILE, write_plot
from ..runtime import Runtime
from ..task import EXPECTED_INITIAL_LOSS, METRICS, describe_throughput, throughput
from ..training.state import TrainState
from .profiling import ProfileWindow
from .run_log import RunLog


def finish_run(
    log: RunLog,
    profiler: ProfileWindow,
    checkpoints: CheckpointManager,
    state: TrainState,
    resumed_from: str | None,
) -> dict[str, Any]:
    """End a run: export the best and the last weights (`CheckpointManager.export_weights`),
    close the profiler and `log`, draw the plot, and build the run summary from the log's
    counters and the paths of every file the run wrote; the main process prints it and writes
    summary.json / .md. Returns the summary.

    A resumed run with nothing left to train keeps the summary its last training wrote.
    """
    files = checkpoints.export_weights(state) | {"profile_trace": profiler.close()}
    log.close()
    config, runtime = log.config, log.runtime
    written = Path(config.run_dir) / "summary.json"
    if log.stats["samples"] == 0 and written.is_file():
        runtime.notice(f"nothing left to train at step {state.step}; see {written}")
        return json.loads(written.read_text(encoding="utf-8"))
    task_files, task_lines = task_report(config, runtime)
    summary = build_summary(
        config=config,
        state=state,
        stats=log.stats,
        runtime=runtime,
        parameters=log.parameters,
        trained_parameters=log.trained_parameters,
        checkpoint_dir=checkpoints.directory,
        early_stopped=state.early_stopped(config.early_stop_patience),
        resumed_from=resumed_from,
        checkpoint_stalls=checkpoints.stall_seconds,
        files=files | plot_and_name_files(config, runtime) | task_files,
    )
    summary["task_lines"] = task_lines
    if runtime.is_main:
        print(write_summary(Path(config.run_dir), summary), end="")
    return summary


def plot_and_name_files(config: Config, runtime: Runtime) -> dict[str, str | None]:
    """Draw the loss-curve plot (main process, `plot` on); the paths of the plot, the
    TensorBoard folder and the W&B folder (None: switched off)."""
    run_dir = Path(config.run_dir)
    plot = run_dir / PLOT_FILE if config.plot else None
    if plot is not None and runtime.is_main:
        write_plot([run_dir], plot)
    tensorboard = run_dir / "tensorboard" if config.tensorboard else None
    wandb = run_dir / "wandb" if config.logger == "wandb" else None
    return {
        key: str(path) if path else None
        for key, path in {"plot": plot, "tensorboard": tensorboard, "wandb": wandb}.items()
    }


def expected_initial_loss(config: Config) -> float:
    """The initial loss of random weights: the task's `expected_initial_loss(config)` hook where
    its data decide it (the classes a prepare found, say), else EXPECTED_INITIAL_LOSS."""
    hook = getattr(task, "expected_initial_loss", None)
    return EXPECTED_INITIAL_LOSS if hook is None else hook(config)


def task_report(config: Config, runtime: Runtime) -> tuple[dict[str, str], list[str]]:
    """The task's own figures and summary lines at a run's end (main process, `plot` on), where
    task.py has a `task_report(run_dir, tensorboard)` hook; else none."""
    hook = getattr(task, "task_report", None)
    if hook is None or not config.plot or not runtime.is_main:
        return {}, []
    return hook(Path(config.run_dir), config.tensorboard)


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
    trained_parameters: int,
    checkpoint_dir: Path,
    early_stopped: bool,
    resumed_from: str | None,
    checkpoint_stalls: list[float],
    files: dict[str, str | None],
) -> dict[str, Any]:
    """The run summary as plain values, for summary.json: run, global batch, LR schedule,
    steps and epochs, the initial-loss sanity check, results, throughput, and the `files` the
    run wrote besides its checkpoints (the best checkpoint's and the last step's weights, plot,
    TensorBoard folder...; None: off, or no best before the first validation).

    `stats` holds `samples` (all processes), `train_seconds` (training only, no validation) and
    `data_seconds` (waiting on the loader); rates are per second of training time.
    `parameters` is the model's parameter count, taken before any wrapper partitioned it;
    `trained_parameters` those that train (a LoRA run's adapters; else all of them).
    `epochs` counts passes of the training loader over its `samples_per_epoch` samples
    (micro-batches of every process: its last partial micro-batch, and the tail that does not
    divide by the world size, are dropped), the current epoch's share included.
    `checkpoint_stalls` holds the seconds training waited in each of this launch's saves
    (`CheckpointManager.stall_seconds`: the whole save, or with `async_checkpoint` the copy to
    host memory and any wait for the save before it).
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
        "global_batch_size": config.global_batch_size(runtime.world_size),
        "parameters": parameters,
        "trained_parameters": trained_parameters,
        "seed": config.seed,
        "steps": state.step,
        "epochs": state.epochs_done(),
        "samples_per_epoch": state.data.batches * config.micro_batch_size * runtime.world_size,
        "early_stopped": early_stopped,
        "initial_loss": state.initial_loss,
        "expected_initial_loss": expected_initial_loss(config),
        "resumed_from": resumed_from,
        "world_size_changes": state.world_size_changes,
        "data_changes": state.data_changes,
        **{name: last[name] for name in METRICS},
        "best": {"value": state.best_value, "step": state.best_step, "epoch": state.best_epoch},
        "checkpoint": str(best or checkpoint_dir),
        "samples": stats["samples"],
        "data_time_share": stats["data_seconds"] / max(stats["train_seconds"], 1e-9),
        "train_seconds": stats["train_seconds"],
        "checkpoint_saves": len(checkpoint_stalls),
        "checkpoint_stall_seconds": sum(checkpoint_stalls),
        "checkpoint_stall_max_seconds": max(checkpoint_stalls, default=0.0),
        "peak_memory_bytes": peak_memory_bytes(runtime.device),
        "evaluation": stats.get("evaluation"),
        "files": files,
        "config": config.to_dict(),
    }
    return summary | throughput(summary)


def known_values(value: Any) -> Any:
    """`value` (dicts and lists of plain values) with every NaN or infinite float as None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: known_values(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [known_values(item) for item in value]
    return value


def _resumes_that_changed(summary: dict[str, Any]) -> str:
    """One "; world size 2 -> 1 at step 40" per resume on another number of processes, and
    one "; data changed at step 90 (...)" per resume on other data."""
    worlds = "".join(
        f"; world size {change['saved_world_size']} -> {change['world_size']} at step "
        f"{change['step']}"
        for change in summary.get("world_size_changes", [])
    )
    data = "".join(
        f"; data changed at step {change['step']} ({change['change']})"
        for change in summary.get("data_changes", [])
    )
    return worlds + data


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
        f"{config['lr']:g} | **Steps:** {summary['steps']} in {summary['epochs']:.3g} "
        f"epoch(s){_early_stop(summary)}",
        f"**Sanity:** initial loss {summary['initial_loss']:.4f} (from random weights: "
        f"{summary['expected_initial_loss']:.4f}); resumed from: {summary['resumed_from'] or 'no'}"
        f"{_resumes_that_changed(summary)}",
        _results(summary),
        *_evaluation(summary),
        *summary.get("task_lines", []),
        f"**Throughput:** {describe_throughput(summary)} | data-loader time share "
        f"{summary['data_time_share']:.1%} | peak memory "
        f"{summary['peak_memory_bytes'] / 2**20:,.0f} MiB | "
        f"train time {summary['train_seconds']:.1f} s | checkpoints: "
        f"{summary.get('checkpoint_stall_seconds', 0.0):.2f} s waited over "
        f"{summary.get('checkpoint_saves', 0)} save(s)",
        _files(summary),
    ]
    return "\n".join(lines) + "\n"


def _early_stop(summary: dict[str, Any]) -> str:
    """The Steps line's note of an early stop, e.g. " (early stop: 3 validations after the
    warmup without a better val_loss)"; "" for a run that did not stop early."""
    if not summary["early_stopped"]:
        return ""
    config = summary["config"]
    return (
        f" (early stop: {config['early_stop_patience']} validations after the warmup without "
        f"a better {config['monitor']})"
    )


def _evaluation(summary: dict[str, Any]) -> list[str]:
    """The task's last evaluation of this launch (its `task_evaluation`), e.g.
    "**Held-out:** eval_loss 1.2345 at step 40", in a list of one line; none where it made
    none."""
    figures = dict(summary.get("evaluation") or {})
    if not figures:
        return []
    step = figures.pop("step")
    shown = ", ".join(
        f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value:,}"
        for name, value in figures.items()
    )
    return [f"**Held-out:** {shown} at step {step}"]


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
        f"{best['step']} (epoch {best['epoch']:.3g}); checkpoint {summary['checkpoint']}"
    )


def write_summary(run_dir: Path, summary: dict[str, Any]) -> str:
    """Write `summary.json` and `summary.md` into `run_dir`; return the Markdown. JSON has no
    NaN: a value not known (no validation yet...) is written as null."""
    markdown = format_summary(summary)
    text = json.dumps(known_values(summary), indent=2, allow_nan=False)
    (run_dir / "summary.json").write_text(text + "\n", encoding="utf-8")
    (run_dir / "summary.md").write_text(markdown, encoding="utf-8")
    return markdown
