"""The task: image classification. The loss and validation metrics of a batch of logits, the
weights of an optimizer step's micro-batches, and the throughput line of the run summary."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .data import NUM_CLASSES
from .runtime import Runtime

EXPECTED_INITIAL_LOSS = math.log(NUM_CLASSES)  # a uniform prediction's cross-entropy
# The validation metrics `validation_metrics` returns, and the direction in which each improves: the
# names `monitor` may take, and those the log, the plot and the summary show.
METRICS = {"val_loss": "min", "val_accuracy": "max"}
# What `eval_sums` adds up over validation batches and ranks, in its order.
SUMS = ("loss_sum", "correct", "count")


def loss_fn(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy of raw logits `[B, C]` against int64 class ids `[B]` (a 0-dim tensor,
    computed in fp32 whatever the logits' dtype)."""
    return F.cross_entropy(logits.float(), targets)


def micro_batch_weights(targets: list[Tensor], runtime: Runtime) -> list[float]:
    """The factor of each micro-batch's mean loss in one optimizer step: 1.0 each. Every
    micro-batch holds `micro_batch_size` samples, each counted (the loader drops a last
    partial batch), so the mean of their means is the step's mean over samples."""
    return [1.0] * len(targets)


def eval_sums(logits: Tensor, targets: Tensor) -> Tensor:
    """Per-batch SUMS `[loss_sum, correct, count]` (float64), to be summed over batches and ranks.

    Sums, not means, so that batches (and ranks) of different sizes weigh by their sample count.
    """
    loss_sum = F.cross_entropy(logits.float(), targets, reduction="sum")
    correct = (logits.argmax(dim=-1) == targets).sum()
    count = torch.tensor(float(len(targets)), device=logits.device)
    return torch.stack([loss_sum.double(), correct.double(), count.double()])


def validation_metrics(totals: dict[str, float]) -> dict[str, float]:
    """The METRICS of a validation from the totals of its SUMS over every batch and rank."""
    count = totals["count"]
    return {"val_loss": totals["loss_sum"] / count, "val_accuracy": totals["correct"] / count}


def throughput(summary: dict[str, Any]) -> dict[str, float]:
    """The summary's rates: images per second of training time (validation excluded)."""
    return {"samples_per_second": summary["samples"] / max(summary["train_seconds"], 1e-9)}


def describe_throughput(summary: dict[str, Any]) -> str:
    """The rates of `throughput` as the summary's Throughput line shows them."""
    return f"{summary['samples_per_second']:,.0f} images/s"
