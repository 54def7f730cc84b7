"""Precision policy under DeepSpeed: the engine runs backward, clipping and the step.

Everything runs in fp32 (no `bf16`, `fp16` or `torch_autocast` section in ds_config.json).
Every variant's `precision.py` exports the same `PrecisionPolicy`, so `train.py` reads the same.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor, nn


class PrecisionPolicy:
    """Forwards backward and step to the DeepSpeed engine, which the loop trains."""

    name = "fp32"

    def __init__(self, device: torch.device):
        self.device = device

    def autocast(self) -> contextlib.AbstractContextManager:
        """No autocast: fp32 throughout."""
        return contextlib.nullcontext()

    def backward(self, loss: Tensor, model: nn.Module) -> None:
        """The engine's backward of a 0-dim loss, already divided for gradient accumulation
        (`scale_wrt_gas=False`: the engine must not divide it again)."""
        model.backward(loss, scale_wrt_gas=False)

    def clip_and_step(
        self, optimizer: torch.optim.Optimizer, model: nn.Module, max_norm: float
    ) -> Tensor:
        """The engine clips to ds_config's `gradient_clipping` (train.toml's `max_grad_norm`)
        and steps; returns the pre-clip global gradient norm (0-dim float32)."""
        model.step()
        grad_norm = model.get_global_grad_norm()
        return torch.as_tensor(float("nan") if grad_norm is None else grad_norm).float()

    def state_dict(self) -> dict[str, Any]:
        """Nothing to save: no loss scale."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore: no loss scale."""
