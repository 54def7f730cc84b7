"""Where a run is: the loop position a checkpoint records, the training data's position in
its epoch, and early stopping on validation."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .config import Config
from .task import METRICS


def is_log_step(step: int, log_every: int) -> bool:
    """True for optimizer step 1 and every `log_every`-th: where the log syncs the loss to the
    host, and the non-finite check reads its marks at no sync of its own."""
    return step == 1 or step % log_every == 0


def check_monitor(monitor: str) -> None:
    """Refuse a `monitor` that is not one of the task's validation METRICS (task.py).

    Raises:
        ValueError: naming the metrics it may take.
    """
    if monitor not in METRICS:
        raise ValueError(f"monitor must be one of {sorted(METRICS)}, got {monitor!r}")


@dataclass
class TrainState:
    """The loop's position and history; everything a resume needs besides model and optimizer.

    `step` counts optimizer steps, `batch_in_epoch` micro-batches already consumed in `epoch`
    (0-based); epochs in `history` and `best_epoch` count from 1, as the logs and bar do.
    `data` is the training data's position (`resume.DataPosition`: its own checkpoint
    component, one per rank); the epoch methods below need it. `world_size_changes` records
    each resume on another number of processes (`resume.WorldSizeChange` as a dict).
    """

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_value: float = math.nan
    best_step: int = -1
    best_epoch: int = -1
    epochs_without_improvement: int = 0
    initial_loss: float = math.nan  # loss of step 1, for the sanity line of the summary
    history: list[dict[str, float]] = field(default_factory=list)
    world_size_changes: list[dict[str, int]] = field(default_factory=list)
    data: Any = field(default=None, repr=False, compare=False)

    def state_dict(self) -> dict[str, Any]:
        """Plain types only, so `torch.load(weights_only=True)` reads it back (not `data`)."""
        return copy.deepcopy({name: getattr(self, name) for name in self._saved_fields()})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take every field from a `state_dict` result (checkpoints written before
        `world_size_changes` existed had none)."""
        state = {"world_size_changes": [], **state}
        for name in self._saved_fields():
            setattr(self, name, state[name])

    def _saved_fields(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self) if f.name != "data"]

    def begin_epoch(self) -> Iterator:
        """The batches of the current epoch from `batch_in_epoch` on (a resume's replay)."""
        return self.data.begin_epoch(self.epoch, self.batch_in_epoch)

    def mid_epoch(self) -> bool:
        """True while the current epoch has micro-batches left."""
        return self.batch_in_epoch < self.data.batches

    def batches_left(self) -> int:
        """Micro-batches of the current epoch not yet trained on."""
        return self.data.batches - self.batch_in_epoch

    def early_stopped(self, patience: int) -> bool:
        """True once `patience` (> 0) validations in a row have not improved on the best."""
        return 0 < patience <= self.epochs_without_improvement

    def reached_stop_after(self, config: Config) -> bool:
        """True once `stop_after_steps` (> 0) optimizer steps are taken."""
        return 0 < config.stop_after_steps <= self.step

    def finished(self, config: Config) -> bool:
        """True once the run is over: all `epochs` done, stopped early, or `stop_after_steps`
        (> 0) optimizer steps taken."""
        return (
            self.epoch >= config.epochs
            or self.early_stopped(config.early_stop_patience)
            or self.reached_stop_after(config)
        )

    def advance(self, micro_batches: int) -> None:
        """Count one optimizer step that consumed `micro_batches` micro-batches."""
        self.step += 1
        self.batch_in_epoch += micro_batches

    def end_epoch(self) -> None:
        """Move to the next epoch's first batch (and the data with it)."""
        self.epoch += 1
        self.batch_in_epoch = 0
        if self.data is not None:
            self.data.end_epoch()

    def record_validation(self, metrics: dict[str, float], monitor: str) -> bool:
        """Append `metrics` to the history; return True when `monitor` improved on the best."""
        self.history.append({"epoch": self.epoch + 1, "step": self.step, **metrics})
        value = metrics[monitor]
        better = value < self.best_value if METRICS[monitor] == "min" else value > self.best_value
        if math.isnan(self.best_value) or better:
            self.best_value, self.best_step, self.best_epoch = value, self.step, self.epoch + 1
            self.epochs_without_improvement = 0
            return True
        self.epochs_without_improvement += 1
        return False
