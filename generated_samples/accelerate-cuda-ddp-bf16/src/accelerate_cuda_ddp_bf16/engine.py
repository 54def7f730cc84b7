"""The training engine: HF Accelerate, DDP, one process per device.

Every project's `engine.py` has one `Engine` with the same verbs, so `train.py` never names a
strategy or a precision: `micro_step(last)`, `autocast()`, `backward(loss)`,
`clip_and_step(max_norm)`, `save(folder)` / `load(folder)` and `full_state_dict()`.

Accelerate does the work of each verb: `prepare` wraps the model (DistributedDataParallel) and
the optimizer, `autocast` and `backward` apply its mixed precision, `no_sync` skips the
gradient all-reduce on all but the last micro-step, `clip_grad_norm_` unscales
before it clips, and the prepared optimizer's `step` steps and updates the loss scale
(huggingface.co/docs/accelerate/package_reference/accelerator). The process group is the
one `runtime.py` joined from torchrun's environment (`accelerate launch` sets the same
variables); Accelerate uses it rather than starting its own.

The scheduler is not prepared: `train.py` steps it once per optimizer step. Prepared, it
would step once per process per optimizer step unless told otherwise (accelerate#1382).

Precision is data: `COMPUTE_DTYPE` picks Accelerate's `mixed_precision`, "bf16": autocast, no
loss scaling. Parameters, gradients and the optimizer state stay fp32.
"""

from __future__ import annotations

import contextlib
import warnings
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

STRATEGY = "ddp"
PRECISION = "bf16"
FRAMEWORK = f"HF Accelerate {accelerate.__version__}"  # as the run summary names it
COMPUTE_DTYPE = torch.bfloat16
# Accelerate's `mixed_precision` for fp32 and for COMPUTE_DTYPE (tests may switch to fp32).
MIXED_PRECISION = {torch.float32: "no", COMPUTE_DTYPE: "bf16"}
ENGINE_FILE = "engine.pt"  # the model, optimizer and loss-scaler states in a checkpoint folder

# A conv over one input channel has a size-1 dimension whose gradient stride can differ from
# the bucket's; size-1 strides address no memory, so the layouts agree.
warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")


class Engine:
    """The model being trained, its optimizer and loss scaler, and the verbs of one step.

    `model` is the bare module (checkpoints and exports name its keys) and `optimizer` steps its
    parameters. `module` is what forward runs through:
    the prepared module (DDP), compiled if `compile` is on.

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
                "launch with torchrun"
            )
        # channels_last on a GPU: the NHWC layout cuDNN's tensor-core convolutions run on
        # (PyTorch tutorial "Channels Last Memory Format"); weights in it make the convolutions
        # compute and return it, whatever the input's layout. A CPU keeps the default layout.
        on_gpu = runtime.device.type == "cuda"
        memory_format = torch.channels_last if on_gpu else torch.preserve_format
        self.model = materialize(model, runtime.device, config.seed).to(memory_format=memory_format)
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
        """Context for one micro-batch's forward + backward: gradients are all-reduced only
        on the `last` micro-step of an accumulation step (`no_sync` on the others)."""
        return contextlib.nullcontext() if last else self.accelerator.no_sync(self.module)

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
