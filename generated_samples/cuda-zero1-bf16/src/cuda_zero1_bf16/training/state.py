"""Where a run is: the loop position a checkpoint records, the training data's position in
its epoch, and early stopping on validation."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..config import Config
from ..task import METRICS


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
    (0-based); an epoch whose data is used up ends at once (`advance`). `validated_step` is
    the step of the latest validation (-1: none yet); `history` holds each validation's
    metrics with its step and `epoch`, the epochs trained by then (fractional, from 0), as
    does `best_epoch`. Early stopping counts validations (`validations_without_improvement`).
    Not saved: `data`, the training data's position (`data_position.DataPosition`: its own
    checkpoint component, one per rank); `step_budget`, the steps the run may take besides its
    epochs (`Config.step_budget`; 0: none); `run_steps`, the run's length in steps
    (`Config.run_steps`), which its LR schedule spans, and `steps_per_epoch` (of the start's
    world size), which a group's frozen epochs are counted in. `world_size_changes` records
    each resume on another number of processes (`checkpoint.world_size.WorldSizeChange` as a dict),
    `data_changes` each one on changed data (`checkpoint.resume.continue_on_new_data`).
    """

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    validated_step: int = -1
    best_value: float = math.nan
    best_step: int = -1
    best_epoch: float = -1.0
    validations_without_improvement: int = 0
    initial_loss: float = math.nan  # loss of step 1, for the sanity line of the summary
    history: list[dict[str, float]] = field(default_factory=list)
    world_size_changes: list[dict[str, int]] = field(default_factory=list)
    data_changes: list[dict[str, Any]] = field(default_factory=list)
    data: Any = field(default=None, repr=False, compare=False)
    step_budget: int = field(default=0, repr=False, compare=False)
    run_steps: int = field(default=0, repr=False, compare=False)
    steps_per_epoch: int = field(default=0, repr=False, compare=False)

    def state_dict(self) -> dict[str, Any]:
        """Plain types only, so `torch.load(weights_only=True)` reads it back (not `data`)."""
        return copy.deepcopy({name: getattr(self, name) for name in self._saved_fields()})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take every field from a `state_dict` result. A checkpoint of an earlier version
        (validation at epoch ends only, early stopping in epochs) is read in today's terms."""
        history = state.get("history", [])
        earlier = {
            "world_size_changes": [],
            "data_changes": [],
            "validated_step": history[-1]["step"] if history else -1,
            "validations_without_improvement": state.get("epochs_without_improvement", 0),
        }
        state = earlier | state
        for name in self._saved_fields():
            setattr(self, name, state[name])

    def _saved_fields(self) -> list[str]:
        unsaved = ("data", "step_budget", "run_steps", "steps_per_epoch")
        return [field.name for field in dataclasses.fields(self) if field.name not in unsaved]

    def epoch_batches(self) -> Iterator:
        """The current epoch's micro-batches not yet trained on: the data position's iterator,
        started (a resume's replay included) on first use in the epoch."""
        return self.data.batches_from(self.epoch, self.batch_in_epoch)

    def batches_left(self) -> int:
        """Micro-batches of the current epoch not yet trained on."""
        return self.data.batches - self.batch_in_epoch

    def epochs_done(self) -> float:
        """Epochs trained so far, the current one's share included (2.25: a quarter into the
        third)."""
        return self.epoch + self.batch_in_epoch / max(1, self.data.batches)

    def early_stopped(self, patience: int) -> bool:
        """True once `patience` (> 0) validations in a row have not improved on the best."""
        return 0 < patience <= self.validations_without_improvement

    def reached_stop_after(self, config: Config) -> bool:
        """True once `stop_after_steps` (> 0) optimizer steps are taken."""
        return 0 < config.stop_after_steps <= self.step

    def length_reached(self, config: Config) -> bool:
        """True once the run has trained its length: `epochs`, or its `step_budget`."""
        return self.epoch >= config.epochs or 0 < self.step_budget <= self.step

    def validation_due(self, config: Config) -> bool:
        """True when the current step is to be validated and is not yet: every `val_every`
        steps (0: at each epoch's end) and at the end of the run."""
        if self.step == 0 or self.validated_step == self.step:
            return False
        every = config.val_every
        periodic = self.step % every == 0 if every else self.batch_in_epoch == 0
        return periodic or self.length_reached(config)

    def finished(self, config: Config) -> bool:
        """True once the run is over: its length trained and validated, stopped early, or
        `stop_after_steps` (> 0) optimizer steps taken."""
        trained = self.length_reached(config) and self.validated_step == self.step
        return (
            trained
            or self.early_stopped(config.early_stop_patience)
            or (self.reached_stop_after(config))
        )

    def note_loss(self, logged: float | None) -> None:
        """Keep step 1's loss (`logged`: the run log's value of this step, None where it logged
        none) for the summary's sanity line."""
        if logged is not None and self.step == 1:
            self.initial_loss = logged

    def advance(self, micro_batches: int) -> None:
        """Count one optimizer step that consumed `micro_batches` micro-batches; an epoch whose
        data is used up ends here."""
        self.step += 1
        self.batch_in_epoch += micro_batches
        if self.batch_in_epoch >= self.data.batches:
            self.end_epoch()

    def end_used_up_epoch(self) -> None:
        """Move on from an epoch whose data is used up to the next one's start (the data
        position read through to it): where a checkpoint written before its epoch ended (by an
        earlier version, or a resume on another world size at an epoch's last step) leaves
        a resumed run. A validation it owes stays due."""
        if self.batch_in_epoch >= self.data.batches:
            self.epoch_batches()  # replayed: the loader's generator reaches the next epoch's
            self.end_epoch()

    def end_epoch(self) -> None:
        """Move to the next epoch's first batch (and the data with it)."""
        self.epoch += 1
        self.batch_in_epoch = 0
        self.data.end_epoch()

    def record_validation(self, metrics: dict[str, float], config: Config) -> bool:
        """Append `metrics` to the history; return True when `config.monitor` improved on the
        best. One that did not counts towards early stopping once the warmup is over: while
        the learning rate still rises, a validation may well be worse."""
        epoch = round(self.epochs_done(), 4)
        self.history.append({"epoch": epoch, "step": self.step, **metrics})
        self.validated_step = self.step
        value = metrics[config.monitor]
        lower = METRICS[config.monitor] == "min"
        better = value < self.best_value if lower else value > self.best_value
        if math.isnan(self.best_value) or better:
            self.best_value, self.best_step, self.best_epoch = value, self.step, epoch
            self.validations_without_improvement = 0
            return True
        if self.step > config.warmup_steps:
            self.validations_without_improvement += 1
        return False
