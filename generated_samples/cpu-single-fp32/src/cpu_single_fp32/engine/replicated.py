"""What every engine that keeps the whole model in each process shares: the model placed on
its device, the loss scaler's bookkeeping, validation's context and the checkpoint state.

`strategy.py`'s `Engine` subclasses `ReplicatedEngine`; it sets the attributes below in its
`__init__` and adds how forward, backward and the optimizer step run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from ..runtime import Runtime
from ..state_io import atomic_save, host_copy, load_trusted
from .build import check_loaded, materialize, trainable_state

ENGINE_FILE = "engine.pt"  # the model, optimizer and loss-scaler states in a checkpoint folder


def place_model(model: nn.Module, device: torch.device, seed: int) -> nn.Module:
    """`model` on `device`, initialised from `seed` if it was built on the meta device
    (build.py). Returns the model."""
    return materialize(model, device, seed)


class ReplicatedEngine:
    """The verbs every replicated engine has alike.

    Attributes set by the subclass: `runtime`; `model`, the bare module (checkpoints and
    exports name its keys); `module`, what forward runs through; `optimizer`, stepping the
    bare module's parameters; `scaler`, a `torch.amp.GradScaler` (disabled without loss
    scaling: it then passes every call through and saves an empty state).
    """

    runtime: Runtime
    model: nn.Module
    module: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler

    def zero_grad(self) -> None:
        """Drop the last step's gradients (`set_to_none`: freed, not filled with zeros); note
        the loss scale this step starts from."""
        self.optimizer.zero_grad(set_to_none=True)
        self.scale_before = self.loss_scale()

    def loss_scale(self) -> float | None:
        """The loss scaler's current scale (a host sync), or None without loss scaling."""
        return self.scaler.get_scale() if self.scaler.is_enabled() else None

    def step_skipped(self) -> bool:
        """True when the last `clip_and_step` skipped its update: the loss scaler found inf or
        NaN gradients and lowered the scale (never without loss scaling)."""
        return self.scale_before is not None and self.loss_scale() < self.scale_before

    def inference(self) -> contextlib.AbstractContextManager:
        """Context for validation's forward passes: `torch.inference_mode()`."""
        return torch.inference_mode()

    def save(self, folder: Path) -> None:
        """Write the model (its trainable weights: `trainable_state`), optimizer and scaler
        states into `folder` (main process only: every process holds the same copy)."""
        if self.runtime.is_main:
            state = {"model": trainable_state(self.model), "optimizer": self.optimizer.state_dict()}
            atomic_save(state | {"scaler": self.scaler.state_dict()}, folder / ENGINE_FILE)

    def start_save(self, folder: Path) -> Callable[[], None]:
        """What `save` writes, copied to host memory now (main process); returns the write,
        for a background thread to run while training goes on."""
        if not self.runtime.is_main:
            return lambda: None
        state = {"model": trainable_state(self.model), "optimizer": self.optimizer.state_dict()}
        staged = host_copy(state | {"scaler": self.scaler.state_dict()})
        return lambda: atomic_save(staged, folder / ENGINE_FILE)

    def load(self, folder: Path) -> None:
        """Load what `save` wrote: the model first, then the optimizer and the loss scale.

        Raises:
            ValueError: the engine file in `folder` is missing or damaged, or holds other
                weights than the model's trainable ones.
        """
        state = load_trusted(folder / ENGINE_FILE, ("model", "optimizer", "scaler"))
        if state is None:
            raise ValueError(f"{folder / ENGINE_FILE} does not load; move {folder} away")
        loaded = self.model.load_state_dict(state["model"], strict=False)
        check_loaded(loaded.missing_keys, loaded.unexpected_keys, self.model, folder / ENGINE_FILE)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])

    def full_state_dict(self) -> dict[str, Tensor]:
        """The bare model's whole state dict on the CPU, keys without wrapper prefixes."""
        return {name: value.cpu() for name, value in self.model.state_dict().items()}
