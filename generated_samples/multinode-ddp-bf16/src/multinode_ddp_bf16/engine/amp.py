"""Plain PyTorch's mixed-precision step for an engine that keeps the whole model in each
process (replicated.py).

Forward and loss compute in the engine's compute dtype under autocast (`torch.float32`: no
autocast); loss scaling is on or off. Parameters, gradients and the optimizer state stay fp32.
Clipping sees unscaled gradients: `unscale_` -> clip -> `step` -> `update`
(pytorch.org/docs/stable/notes/amp_examples.html#gradient-clipping).
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from .replicated import ReplicatedEngine


class AmpEngine(ReplicatedEngine):
    """`ReplicatedEngine` with autocast, a loss scaler, backward and the clipped step."""

    def start_amp(self, compute_dtype: torch.dtype, loss_scaling: bool) -> None:
        """Set the loss scaler (enabled only with `loss_scaling`) and the autocast context
        for `compute_dtype` on the runtime's device; call once `optimizer` is set."""
        device_type = self.runtime.device.type
        self.scaler = torch.amp.GradScaler(device_type, enabled=loss_scaling)
        self._autocast = (
            torch.autocast(device_type, dtype=compute_dtype)
            if compute_dtype is not torch.float32
            else contextlib.nullcontext()
        )

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context for forward + loss only (never backward)."""
        return self._autocast

    def backward(self, loss: Tensor) -> None:
        """Backward of a 0-dim loss already divided for gradient accumulation (scaled first
        when loss scaling is on)."""
        self.scaler.scale(loss).backward()

    def clip_and_step(self, max_norm: float) -> Tensor:
        """Unscale, clip the global gradient L2 norm to `max_norm`, step, update the scale.

        Returns the unscaled pre-clip norm (0-dim float32). With loss scaling on, a step whose
        gradients hold inf or NaN is skipped and the scale lowered; the norm then reads inf.
        """
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return grad_norm
