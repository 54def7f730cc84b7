"""The task: image classification. The loss and validation metrics of a batch of logits, the
weights of an optimizer step's micro-batches, the throughput line of the run summary, and what
a classifier's user looks at after a run: accuracy per class and the confusion matrix
(report/confusion.py draws it)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .config import Config
from .data import NUM_CLASSES, input_spec
from .runtime import Runtime

EXPECTED_INITIAL_LOSS = math.log(NUM_CLASSES)  # a uniform prediction's cross-entropy
# The validation metrics `validation_metrics` returns, and the direction in which each improves: the
# names `monitor` may take, and those the log, the plot and the summary show. With more than
# TOP_K classes it also returns val_top5_accuracy; always the per-class accuracies and the
# confusion matrix (lists, in the log, not monitored).
METRICS = {"val_loss": "min", "val_accuracy": "max"}
# What `eval_sums` adds up over validation batches and ranks, in its order; the confusion
# matrix's classes x classes counts follow them (the `extra` sums).
SUMS = ("loss_sum", "correct", "top5_correct", "count")
TOP_K = 5
# The log keeps the confusion matrix up to this many classes (a validation's record would hold
# classes^2 counts: 1M for ImageNet's 1,000, unreadable as a figure anyway).
CONFUSION_MAX_CLASSES = 100


def expected_initial_loss(config: Config) -> float:
    """A uniform prediction's cross-entropy over the data's classes (`data.input_spec`): the
    prepared images' where `data_dir` is set, EXPECTED_INITIAL_LOSS for the digits."""
    return math.log(input_spec(config)[0])


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
    """Per-batch SUMS `[loss_sum, correct, top5_correct, count]` then the confusion matrix's
    C x C counts (row: the true class, column: the predicted one; C = logits' classes),
    float64, to be summed over batches and ranks.

    Sums, not means, so that batches (and ranks) of different sizes weigh by their sample count.
    """
    classes = logits.shape[-1]
    loss_sum = F.cross_entropy(logits.float(), targets, reduction="sum")
    predicted = logits.argmax(dim=-1)
    correct = (predicted == targets).sum()
    top = logits.topk(min(TOP_K, classes), dim=-1).indices
    top_correct = (top == targets[:, None]).any(dim=-1).sum()
    count = torch.tensor(float(len(targets)), device=logits.device)
    cells = targets * classes + predicted  # row: the true class, column: the predicted one
    confusion = torch.zeros(classes * classes, dtype=torch.float64, device=logits.device)
    confusion.index_add_(0, cells, torch.ones_like(cells, dtype=torch.float64))
    head = torch.stack([loss_sum.double(), correct.double(), top_correct.double(), count.double()])
    return torch.cat([head, confusion])


def validation_metrics(totals: dict[str, Any]) -> dict[str, Any]:
    """The METRICS of a validation from the totals of its SUMS over every batch and rank, with
    val_top5_accuracy where there are more than TOP_K classes, and from the `extra` totals
    (the confusion matrix) `val_class_accuracy` (per class, in class-id order; NaN for a class
    without validation samples) and, up to CONFUSION_MAX_CLASSES, `val_confusion` (rows of
    counts)."""
    count = totals["count"]
    metrics = {"val_loss": totals["loss_sum"] / count, "val_accuracy": totals["correct"] / count}
    classes = math.isqrt(len(totals["extra"]))
    if classes > TOP_K:
        metrics["val_top5_accuracy"] = totals["top5_correct"] / count
    rows = [
        [round(value) for value in totals["extra"][row * classes : (row + 1) * classes]]
        for row in range(classes)
    ]
    metrics["val_class_accuracy"] = [
        row[number] / sum(row) if sum(row) else math.nan for number, row in enumerate(rows)
    ]
    if classes <= CONFUSION_MAX_CLASSES:
        metrics["val_confusion"] = rows
    return metrics


def throughput(summary: dict[str, Any]) -> dict[str, float]:
    """The summary's rates: images per second of training time (validation excluded)."""
    return {"samples_per_second": summary["samples"] / max(summary["train_seconds"], 1e-9)}


def describe_throughput(summary: dict[str, Any]) -> str:
    """The rates of `throughput` as the summary's Throughput line shows them."""
    return f"{summary['samples_per_second']:,.0f} images/s"


def task_report(run_dir: Path, tensorboard: bool) -> tuple[dict[str, str], list[str]]:
    """At a run's end (main process): the confusion matrix of its last validation drawn to
    `confusion.png` (and into TensorBoard), and the summary's line of each class's accuracy by
    name. Returns ({"confusion": path}, [line]), or nothing before a validation."""
    from .report.confusion import last_validation, write_confusion

    validation, classes = last_validation(run_dir)
    if validation is None:
        return {}, []
    files = {}
    if "val_confusion" in validation:
        files["confusion"] = str(write_confusion(run_dir, validation, classes, tensorboard))
    accuracies = ", ".join(
        f"{name} {accuracy:.3f}"
        for name, accuracy in zip(classes, validation["val_class_accuracy"], strict=True)
    )
    top5 = validation.get("val_top5_accuracy")
    extra = f"; top-5 accuracy {top5:.4f}" if top5 is not None else ""
    line = f"**Per class** (accuracy at step {validation['step']}): {accuracies}{extra}"
    return files, [line]
