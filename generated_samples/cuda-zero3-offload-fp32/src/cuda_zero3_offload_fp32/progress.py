"""Where a run is: the loop position a checkpoint records, and early stopping on validation."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from .config import MONITOR_MODES


@dataclass
class TrainState:
    """The loop's position and history; everything a resume needs besides model and optimizer.

    `step` counts optimizer steps, `batch_in_epoch` micro-batches already consumed in `epoch`
    (0-based); epochs in `history` and `best_epoch` count from 1, as the logs and bar do.
    `epoch_generator_state` is the loader generator's state at the start of `epoch` (taken
    before `iter()`): replaying from it reproduces the epoch's order and worker seeds.
    """

    epoch_generator_state: Tensor
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_value: float = math.nan
    best_step: int = -1
    best_epoch: int = -1
    epochs_without_improvement: int = 0
    initial_loss: float = math.nan  # loss of step 1, for the sanity line of the summary
    history: list[dict[str, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain types and tensors only, so `torch.load(weights_only=True)` reads it back."""
        return dataclasses.asdict(self)

    def record_validation(self, metrics: dict[str, float], monitor: str) -> bool:
        """Append `metrics` to the history; return True when `monitor` improved on the best."""
        self.history.append({"epoch": self.epoch + 1, "step": self.step, **metrics})
        value = metrics[monitor]
        better = (
            value < self.best_value if MONITOR_MODES[monitor] == "min" else value > self.best_value
        )
        if math.isnan(self.best_value) or better:
            self.best_value, self.best_step, self.best_epoch = value, self.step, self.epoch + 1
            self.epochs_without_improvement = 0
            return True
        self.epochs_without_improvement += 1
        return False
