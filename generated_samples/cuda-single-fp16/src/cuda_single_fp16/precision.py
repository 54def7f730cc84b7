"""Precision policy: fp16 autocast with dynamic loss scaling (torch.amp.GradScaler).

fp16's narrow exponent range lets small gradients underflow to zero; the scaler multiplies the
loss before backward and divides the gradients again before they are used. Clipping must see the
true gradients, so the order is `unscale_` -> clip -> `step` -> `update`
(pytorch.org/docs/stable/notes/amp_examples.html#gradient-clipping).
Every variant's `precision.py` exports the same `PrecisionPolicy`, so `train.py` reads the same.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


class PrecisionPolicy:
    """Forward and loss under fp16 autocast; scaled backward; unscale before clipping."""

    name = "fp16"

    def __init__(self, device: torch.device):
        self.device = device
        self.scaler = torch.amp.GradScaler(device.type)

    def autocast(self) -> torch.autocast:
        """Context for forward + loss only (never backward)."""
        return torch.autocast(device_type=self.device.type, dtype=torch.float16)

    def backward(self, loss: Tensor, model: nn.Module) -> None:
        """Backward pass of the scaled 0-dim loss (already divided for gradient accumulation)."""
        self.scaler.scale(loss).backward()

    def clip_and_step(
        self, optimizer: torch.optim.Optimizer, model: nn.Module, max_norm: float
    ) -> Tensor:
        """Unscale, clip the global L2 norm to `max_norm`, step (skipped on inf/NaN), update.

        Returns the unscaled, pre-clip gradient norm (inf or NaN when this step was skipped).
        """
        self.scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        self.scaler.step(optimizer)
        self.scaler.update()
        return grad_norm

    def state_dict(self) -> dict[str, Any]:
        """The loss scale and its growth tracker: a resume must not restart the scale search."""
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the loss scale saved by `state_dict`."""
        self.scaler.load_state_dict(state)
