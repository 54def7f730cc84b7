"""Precision policy: full fp32 (no autocast, no loss scaling).

Every variant's `precision.py` exports the same `PrecisionPolicy`, so the loop in `train.py`
reads the same whether it runs in fp32, bf16 or fp16.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor, nn


class PrecisionPolicy:
    """fp32 everywhere: forward, loss, gradients and optimizer state."""

    name = "fp32"

    def __init__(self, device: torch.device):
        self.device = device

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context for forward + loss only (never backward); here it changes nothing."""
        return contextlib.nullcontext()

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
        """Nothing to save in fp32."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore in fp32."""
