"""Metrics log (JSON lines) and the run summary of the output contract (Markdown + JSON)."""

from __future__ import annotations

import json
import math
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from .config import Config
from .progress import TrainState


class MetricsLog:
    """Appends one JSON object per line to `metrics.jsonl` (train steps and validations)."""

    def __init__(self, path: Path, enabled: bool):
        self.path = path
        self.enabled = enabled

    def write(self, kind: str, **values: Any) -> None:
        """Append `{"kind": kind, **values}`; does nothing on non-main processes."""
        if self.enabled:
            with open(self.path, "a", encoding="utf-8") as file:
                file.write(json.dumps({"kind": kind, **values}) + "\n")


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this process in bytes: CUDA allocator peak on GPU, else peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max_rss if sys.platform == "darwin" else max_rss * 1024  # Linux reports KiB


# Dense bf16/fp16 tensor-core peaks (FLOP/s) from the vendors' data sheets, by device name.
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12}
PEAK_FLOPS |= {"A10G": 70e12, "A10": 125e12, "V100": 125e12, "T4": 65e12, "RTX 4090": 165e12}


def model_flops_utilization(flops_per_second: float | None, device: torch.device) -> float | None:
    """Achieved model FLOP/s over the GPU's peak (PaLM, Chowdhery et al. 2022, appendix B).

    None on CPU or on a GPU missing from `PEAK_FLOPS`.
    """
    if flops_per_second is None or device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    peak = next((value for key, value in PEAK_FLOPS.items() if key in name), None)
    return None if peak is None else flops_per_second / peak


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
    device: torch.device,
    world_size: int,
    strategy: str,
    precision: str,
    checkpoint_dir: Path,
    early_stopped: bool,
    expected_initial_loss: float,
    resumed_from: str | None,
) -> dict[str, Any]:
    """The run summary (seeds' output contract) as plain values, for summary.json.

    `stats` holds `samples` (all processes), `train_seconds` (training only, no validation) and
    `data_seconds` (waiting on the loader); rates are per second of training time.
    """
    last = state.history[-1] if state.history else {"val_loss": math.nan, "val_accuracy": math.nan}
    best_path = checkpoint_dir / "best.pt"
    train_seconds = max(stats["train_seconds"], 1e-9)
    return {
        "run_dir": config.run_dir,
        "git_commit": git_commit(),
        "torch_version": torch.__version__,
        "device": str(device),
        "strategy": strategy,
        "precision": precision,
        "world_size": world_size,
        "global_batch_size": config.global_batch_size * world_size,
        "seed": config.seed,
        "steps": state.step,
        "epochs_completed": state.epoch,
        "early_stopped": early_stopped,
        "initial_loss": state.initial_loss,
        "expected_initial_loss": expected_initial_loss,
        "resumed_from": resumed_from,
        "val_loss": last["val_loss"],
        "val_accuracy": last["val_accuracy"],
        "best": {"value": state.best_value, "step": state.best_step, "epoch": state.best_epoch},
        "checkpoint": str(best_path if best_path.exists() else checkpoint_dir),
        "samples_per_second": stats["samples"] / train_seconds,
        "data_time_share": stats["data_seconds"] / train_seconds,
        "train_seconds": stats["train_seconds"],
        "peak_memory_bytes": peak_memory_bytes(device),
        "config": config.to_dict(),
    }


def format_summary(summary: dict[str, Any]) -> str:
    """The run summary as Markdown, one bold-labelled line per field of the output contract."""
    config = summary["config"]
    best = summary["best"]
    lines = [
        f"**Run:** {summary['run_dir']} | commit {summary['git_commit']} | seed {config['seed']} "
        f"| torch {summary['torch_version']} | {summary['device']} {summary['strategy']} "
        f"{summary['precision']}",
        f"**Global batch:** {summary['global_batch_size']} ({config['micro_batch_size']} x "
        f"{summary['world_size']} process(es) x {config['grad_accum_steps']} accumulation) | "
        f"**LR:** warmup {config['warmup_steps']} steps, cosine to {config['min_lr_ratio']} x "
        f"{config['lr']:g} | **Steps:** {summary['steps']} in {summary['epochs_completed']} "
        f"epoch(s){' (early stop)' if summary['early_stopped'] else ''}",
        f"**Sanity:** initial loss {summary['initial_loss']:.4f} (expected "
        f"{summary['expected_initial_loss']:.4f}); resumed from: {summary['resumed_from'] or 'no'}",
        f"**Results:** val accuracy {summary['val_accuracy']:.4f}, val loss "
        f"{summary['val_loss']:.4f}; best {config['monitor']} {best['value']:.4f} at step "
        f"{best['step']} (epoch {best['epoch']}); checkpoint {summary['checkpoint']}",
        f"**Throughput:** {summary['samples_per_second']:,.0f} samples/s{_token_rates(summary)} | "
        "data-loader time share "
        f"{summary['data_time_share']:.1%} | peak memory "
        f"{summary['peak_memory_bytes'] / 2**20:,.0f} MiB | "
        f"train time {summary['train_seconds']:.1f} s",
    ]
    return "\n".join(lines) + "\n"


def _token_rates(summary: dict[str, Any]) -> str:
    if "tokens_per_second" not in summary:
        return ""
    mfu = summary.get("mfu")
    mfu_text = "n/a (no GPU peak known)" if mfu is None else f"{mfu:.1%}"
    return f", {summary['tokens_per_second']:,.0f} tokens/s, MFU {mfu_text}"


def write_summary(run_dir: Path, summary: dict[str, Any]) -> str:
    """Write `summary.json` and `summary.md` into `run_dir`; return the Markdown."""
    markdown = format_summary(summary)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (run_dir / "summary.md").write_text(markdown, encoding="utf-8")
    return markdown
