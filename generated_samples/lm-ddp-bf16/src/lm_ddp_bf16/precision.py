"""Precision policy: bf16 autocast, no loss scaling.

bf16 has fp32's exponent range, so gradients cannot underflow and a GradScaler has nothing to do
(pytorch.org/docs/stable/amp.html). Parameters, gradients and optimizer state stay fp32.
Every variant's `precision.py` exports the same `PrecisionPolicy`, so `train.py` reads the same.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


class PrecisionPolicy:
    """Forward and loss under `torch.autocast(dtype=torch.bfloat16)`; backward and step in fp32."""

    name = "bf16"

    def __init__(self, device: torch.device):
        self.device = device

    def autocast(self) -> torch.autocast:
        """Context for forward + loss only (never backward)."""
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def backward(self, loss: Tensor, model: nn.Module) -> None:
        """Backward pass of a 0-dim loss (already divided for gradient accumulation)."""
        loss.backward()

    def clip_and_step(
        self, optimizer: torch.optim.Optimizer, model: nn.Module, max_norm: float
    ) -> Tensor:
        """Clip the global gradient L2 norm to `max_norm`, then step; returns the pre-clip norm."""
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        return grad_norm

    def state_dict(self) -> dict[str, Any]:
        """Nothing to save: bf16 needs no loss scale."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore: bf16 needs no loss scale."""
