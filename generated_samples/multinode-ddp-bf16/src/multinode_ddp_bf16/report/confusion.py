"""The confusion matrix of a run's last validation, drawn to `confusion.png` beside the loss
curve and into TensorBoard: rows are the true classes, columns the predicted ones, each row
normalised to its class's samples (the diagonal is each class's accuracy), with the counts
written in the cells where there are few classes."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from ..state_io import atomic_write
from ..task_config import RUN_MANIFEST

CONFUSION_FILE = "confusion.png"
LABELLED_CLASSES = 30  # class names on the axes up to this many; counts in cells up to 12


def last_validation(run_dir: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """The last validation record of the run's metrics.jsonl (None before one), and the class
    names: the prepared images' (the run's copy of their manifest), or the digits 0-9."""
    record = None
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text(encoding="utf-8").splitlines():
            values = json.loads(line)
            if values.get("kind") == "val" and "val_class_accuracy" in values:
                record = values
    manifest = run_dir / RUN_MANIFEST
    if manifest.is_file():
        classes = json.loads(manifest.read_text(encoding="utf-8"))["classes"]
    else:
        classes = (
            [str(number) for number in range(len(record["val_class_accuracy"]))] if record else []
        )
    return record, classes


def draw_confusion(rows: list[list[int]], classes: list[str], step: int) -> Any:
    """A matplotlib figure of the row-normalised confusion matrix."""
    import numpy as np
    from matplotlib.figure import Figure

    counts = np.array(rows, dtype=np.float64)
    shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    size = min(4 + 0.3 * len(classes), 20)
    figure = Figure(figsize=(size, size), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    image = axes.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    figure.colorbar(image, ax=axes, shrink=0.8, label="share of the true class")
    axes.set(xlabel="predicted class", ylabel="true class", title=f"validation at step {step}")
    if len(classes) <= LABELLED_CLASSES:
        ticks = range(len(classes))
        axes.set_xticks(ticks, classes, rotation=90)
        axes.set_yticks(ticks, classes)
    if len(classes) <= 12:
        for (row, column), count in np.ndenumerate(counts):
            color = "white" if shares[row, column] > 0.5 else "black"
            axes.text(column, row, f"{count:.0f}", ha="center", va="center", color=color)
    return figure


def write_confusion(
    run_dir: Path, validation: dict[str, Any], classes: list[str], tensorboard: bool
) -> Path:
    """Draw `validation`'s confusion matrix to run_dir/CONFUSION_FILE (atomically) and, with
    `tensorboard`, as the image `val/confusion` at its step (in tensorboard/confusion/, which
    TensorBoard lists as a run of its own); return the PNG's path."""
    figure = draw_confusion(validation["val_confusion"], classes, validation["step"])
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    out = run_dir / CONFUSION_FILE
    atomic_write(out, lambda tmp: tmp.write_bytes(buffer.getvalue()))
    if tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        # A writer of its own, in a folder of its own: the run's event file is closed by now.
        with SummaryWriter(str(run_dir / "tensorboard" / "confusion")) as writer:
            writer.add_figure("val/confusion", figure, validation["step"])
    return out
