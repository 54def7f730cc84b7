"""Non-finite optimizer steps: found without a host sync of their own, and never saved.

A step whose loss or gradient norm is inf or NaN ends one of two ways, by engine
(`Engine.step_skipped` says which):

- the engine skipped its update: it checks the gradients for inf/NaN itself (a loss scaler
  does). The weights are untouched, the LR schedule does not advance (the loop skips
  `scheduler.step()`), the step is counted and logged, and after `max_nonfinite_steps` such
  steps in a row the run stops: nothing will train from there;
- the engine applied it (no check of its own): the weights are now inf/NaN, and undoing that
  would need a host sync per step to decide before the update. The step is marked on the
  device instead (no sync), and the mark is read when the loop syncs anyway: at each log line
  and before each checkpoint, which is therefore never written from such weights. The run
  stops there; its last checkpoint is from before the bad step.
"""

from __future__ import annotations

import torch
from torch import Tensor


class NonFiniteSteps:
    """Counts the non-finite optimizer steps of a run (see the module docstring).

    `skipped` counts the updates the engine skipped, `in_a_row` the latest run of them.
    """

    def __init__(self, max_in_a_row: int, device: torch.device):
        self.max_in_a_row = max_in_a_row
        self.skipped = 0
        self.in_a_row = 0
        self.applied = torch.zeros((), dtype=torch.int32, device=device)  # unsynced marks
        self.first_applied_step = torch.zeros((), dtype=torch.int64, device=device)

    def record(self, step: int, loss: Tensor, grad_norm: Tensor, skipped: bool) -> None:
        """Count optimizer step `step` (its 0-dim mean loss and pre-clip gradient norm);
        `skipped` is the engine's `step_skipped()`.

        Raises:
            FloatingPointError: `max_in_a_row` skipped steps in a row.
        """
        if skipped:
            self.skipped += 1
            self.in_a_row += 1
            if self.in_a_row >= self.max_in_a_row:
                raise FloatingPointError(
                    f"{self.in_a_row} optimizer steps in a row had inf/NaN gradients and were "
                    f"skipped (up to step {step}); lower lr, check the inputs, or raise "
                    "max_nonfinite_steps"
                )
            return
        self.in_a_row = 0
        finite = torch.isfinite(loss.detach()) & torch.isfinite(grad_norm.detach().float())
        bad = (~finite).to(torch.int32)
        first = (self.applied == 0) & (bad == 1)  # remember the first bad step, on the device
        self.first_applied_step = torch.where(first, step, self.first_applied_step)
        self.applied += bad

    def check(self) -> None:
        """Stop if an applied step was non-finite (one host sync: call it where the loop syncs).

        Raises:
            FloatingPointError: a step with an inf/NaN loss or gradient norm changed the weights.
        """
        if self.applied.item():
            step = self.first_applied_step.item()
            raise FloatingPointError(
                f"step {step} had an inf/NaN loss or gradient norm and the weights are no longer "
                "finite; the last checkpoint is from before it: lower lr or check the inputs, "
                "then --resume"
            )
