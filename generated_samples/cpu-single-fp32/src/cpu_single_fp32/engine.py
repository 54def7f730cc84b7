"""The training engine: one process trains the whole model on one device.

Every project's `engine.py` has one `Engine` with the same verbs, so `train.py` never names a
strategy or a precision: `micro_step(last)`, `autocast()`, `backward(loss)`,
`clip_and_step(max_norm)`, `save(folder)` / `load(folder)` and `full_state_dict()`.

Precision is data: forward and loss compute in `COMPUTE_DTYPE` under autocast (`torch.float32`:
no autocast), and `GRAD_SCALER` switches loss scaling. Parameters, gradients and the optimizer
state stay fp32. Clipping sees unscaled gradients: `unscale_` -> clip -> `step` -> `update`
(pytorch.org/docs/stable/notes/amp_examples.html#gradient-clipping).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from .build import materialize
from .config import Config
from .runtime import Runtime
from .state_io import atomic_save, load_trusted

STRATEGY = "single"
PRECISION = "fp32"
FRAMEWORK = "plain PyTorch"  # what runs the step, as the run summary names it
COMPUTE_DTYPE = torch.float32
GRAD_SCALER = False
ENGINE_FILE = "engine.pt"  # the model, optimizer and loss-scaler states in a checkpoint folder


class Engine:
    """The model being trained, its optimizer and loss scaler, and the verbs of one step.

    `model` is the bare module (checkpoints and exports name its keys) and `optimizer` steps its
    parameters. `module` is what forward runs through:
    `model`, or its `torch.compile` wrapper.
    """

    def __init__(
        self,
        model: nn.Module,
        make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
        runtime: Runtime,
        config: Config,
    ):
        self.runtime = runtime
        self.model = materialize(model, runtime.device, config.seed)
        self.module = torch.compile(self.model) if config.compile else self.model
        self.optimizer = make_optimizer(self.model)
        self.scaler = torch.amp.GradScaler(runtime.device.type, enabled=GRAD_SCALER)
        self._autocast = (
            torch.autocast(runtime.device.type, dtype=COMPUTE_DTYPE)
            if COMPUTE_DTYPE is not torch.float32
            else contextlib.nullcontext()
        )

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

    def micro_step(self, last: bool) -> contextlib.AbstractContextManager:
        """Context for one micro-batch's forward + backward. With one process no gradients
        are exchanged, so the last micro-step (`last`) is like the others."""
        return contextlib.nullcontext()

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context for forward + loss only (never backward)."""
        return self._autocast

    def backward(self, loss: Tensor) -> None:
        """Backward of a 0-dim loss already divided for gradient accumulation (scaled first
        when `GRAD_SCALER` is on)."""
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

    def save(self, folder: Path) -> None:
        """Write the model, optimizer and scaler states into `folder` (main process only:
        every process holds the same copy)."""
        if self.runtime.is_main:
            state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
            atomic_save(state | {"scaler": self.scaler.state_dict()}, folder / ENGINE_FILE)

    def load(self, folder: Path) -> None:
        """Load what `save` wrote: the model first, then the optimizer and the loss scale.

        Raises:
            ValueError: the engine file in `folder` is missing or damaged.
        """
        state = load_trusted(folder / ENGINE_FILE, ("model", "optimizer", "scaler"))
        if state is None:
            raise ValueError(f"{folder / ENGINE_FILE} does not load; move {folder} away")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])

    def full_state_dict(self) -> dict[str, Tensor]:
        """The bare model's whole state dict on the CPU, keys without wrapper prefixes."""
        return {name: value.cpu() for name, value in self.model.state_dict().items()}
