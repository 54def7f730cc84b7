"""Metrics log (JSON lines) and the run summary of the output contract (Markdown + JSON)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch


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


def git_commit() -> str:
    """Short commit hash of the working directory's repository, or 'unknown'."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return result.stdout.strip()


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
        f"**Throughput:** {summary['samples_per_second']:,.0f} samples/s | data-loader time share "
        f"{summary['data_time_share']:.1%} | peak memory "
        f"{summary['peak_memory_bytes'] / 2**20:,.0f} MiB | "
        f"train time {summary['train_seconds']:.1f} s",
    ]
    return "\n".join(lines) + "\n"


def write_summary(run_dir: Path, summary: dict[str, Any]) -> str:
    """Write `summary.json` and `summary.md` into `run_dir`; return the Markdown."""
    markdown = format_summary(summary)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (run_dir / "summary.md").write_text(markdown, encoding="utf-8")
    return markdown
