"""The training engine: HF Accelerate, one process on one device.

Every project's `engine.py` has one `Engine` with the same verbs, so `train.py` never names a
strategy or a precision: `micro_step(last)`, `autocast()`, `backward(loss)`,
`clip_and_step(max_norm)`, `save(folder)` / `load(folder)` and `full_state_dict()`.

Accelerate does the work of each verb: `prepare` wraps the model and
the optimizer, `autocast` and `backward` apply its mixed precision, `clip_grad_norm_` unscales
before it clips, and the prepared optimizer's `step` steps and updates the loss scale
(huggingface.co/docs/accelerate/package_reference/accelerator).

The scheduler is not prepared: `train.py` steps it once per optimizer step. Prepared, it
would step once per process per optimizer step unless told otherwise (accelerate#1382).

Precision is data: `COMPUTE_DTYPE` picks Accelerate's `mixed_precision`, "no": no autocast and
no loss scaling.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import accelerate
import torch
from accelerate import Accelerator
from torch import Tensor, nn

from .build import materialize
from .config import Config
from .runtime import Runtime
from .state_io import atomic_save, load_trusted

STRATEGY = "single"
PRECISION = "fp32"
FRAMEWORK = f"HF Accelerate {accelerate.__version__}"  # as the run summary names it
COMPUTE_DTYPE = torch.float32
# Accelerate's `mixed_precision` for fp32 and for COMPUTE_DTYPE (tests may switch to fp32).
MIXED_PRECISION = {torch.float32: "no"}
ENGINE_FILE = "engine.pt"  # the model, optimizer and loss-scaler states in a checkpoint folder


class Engine:
    """The model being trained, its optimizer and loss scaler, and the verbs of one step.

    `model` is the bare module (checkpoints and exports name its keys) and `optimizer` steps its
    parameters. `module` is what forward runs through:
    the prepared module, compiled if `compile` is on.

    Raises:
        ValueError: Accelerate picked another device or process count than `runtime` holds.
    """

    def __init__(
        self,
        model: nn.Module,
        make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
        runtime: Runtime,
        config: Config,
    ):
        self.runtime = runtime
        self.accelerator = Accelerator(
            cpu=runtime.device.type == "cpu",
            mixed_precision=MIXED_PRECISION[COMPUTE_DTYPE],
            dynamo_backend="inductor" if config.compile else "no",
        )
        accelerator = self.accelerator
        if (accelerator.num_processes, accelerator.device.type) != (
            runtime.world_size,
            runtime.device.type,
        ):
            raise ValueError(
                f"Accelerate runs on {accelerator.device} with {accelerator.num_processes} "
                f"processes, the project on {runtime.device} with {runtime.world_size}; "
                "start one process, without a launcher"
            )
        self.model = materialize(model, runtime.device, config.seed)
        self.module, self.optimizer = accelerator.prepare(self.model, make_optimizer(self.model))
        # Without loss scaling, a disabled scaler saves and loads an empty state.
        self.scaler = accelerator.scaler or torch.amp.GradScaler(enabled=False)

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
        """Context for one micro-batch's forward + backward: one process exchanges no gradients,
        so the last micro-step (`last`) is like the others."""
        return contextlib.nullcontext()

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context for forward + loss only (never backward): Accelerate's autocast."""
        return self.accelerator.autocast()

    def backward(self, loss: Tensor) -> None:
        """Backward of a 0-dim loss already divided for gradient accumulation (scaled first
        when loss scaling is on)."""
        self.accelerator.backward(loss)

    def clip_and_step(self, max_norm: float) -> Tensor:
        """Unscale, clip the global gradient L2 norm to `max_norm`, step, update the scale.

        Returns the unscaled pre-clip norm (0-dim float32). With loss scaling on, a step whose
        gradients hold inf or NaN is skipped and the scale lowered; the norm then reads inf.
        """
        grad_norm = self.accelerator.clip_grad_norm_(self.module.parameters(), max_norm)
        self.optimizer.step()
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
