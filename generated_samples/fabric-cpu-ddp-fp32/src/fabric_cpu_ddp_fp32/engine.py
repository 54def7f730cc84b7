"""The training engine: Lightning Fabric, DDP, one process per device.

Every project's `engine.py` has one `Engine` with the same verbs, so `train.py` never names a
strategy or a precision: `micro_step(last)`, `autocast()`, `backward(loss)`,
`clip_and_step(max_norm)`, `save(folder)` / `load(folder)` and `full_state_dict()`.

Fabric does the work of each verb: `setup` wraps the model (DistributedDataParallel) and the
optimizer, `autocast` and `backward` apply its precision plugin, `no_backward_sync` skips the
gradient all-reduce on all but the last micro-step, `clip_gradients` unscales before
it clips, and the wrapped optimizer's `step` steps and updates the loss scale
(lightning.ai/docs/fabric/stable/api/fabric_methods.html). The process group is the one
`runtime.py` joined from torchrun's environment; Fabric
uses it rather than starting its own.

Precision is data: `COMPUTE_DTYPE` picks Fabric's precision setting, "32-true": no autocast
and no loss scaling.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from pathlib import Path

import lightning
import torch
from lightning.fabric import Fabric
from lightning.fabric.plugins import MixedPrecision, Precision
from torch import Tensor, nn

from .build import materialize
from .config import Config
from .runtime import Runtime
from .state_io import atomic_save, load_trusted

STRATEGY = "ddp"
PRECISION = "fp32"
FRAMEWORK = f"Lightning Fabric {lightning.__version__}"  # as the run summary names it
COMPUTE_DTYPE = torch.float32
FABRIC_STRATEGY = "ddp"
# Fabric's precision setting for fp32 and for COMPUTE_DTYPE (tests may switch to fp32)
# (lightning.ai/docs/fabric/stable/fundamentals/precision.html).
FABRIC_PRECISION = {torch.float32: "32-true"}
ENGINE_FILE = "engine.pt"  # the model, optimizer and loss-scaler states in a checkpoint folder

# A conv over one input channel has a size-1 dimension whose gradient stride can differ from
# the bucket's; size-1 strides address no memory, so the layouts agree.
warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")


def precision_plugin(device: torch.device) -> tuple[Precision, torch.amp.GradScaler]:
    """Fabric's plugin for `COMPUTE_DTYPE` on `device`, and the loss scaler it steps with
    (enabled only with loss scaling; a disabled scaler passes every call through)."""
    setting = FABRIC_PRECISION[COMPUTE_DTYPE]
    scaler = torch.amp.GradScaler(device.type, enabled=setting == "16-mixed")
    if setting == "32-true":
        return Precision(), scaler
    return MixedPrecision(setting, device.type, scaler if scaler.is_enabled() else None), scaler


class Engine:
    """The model being trained, its optimizer and loss scaler, and the verbs of one step.

    `model` is the bare module (checkpoints and exports name its keys) and `optimizer` steps its
    parameters. `module` is what forward runs through:
    Fabric's wrapper of the DDP module, compiled if `compile` is on.

    Raises:
        ValueError: Fabric picked another device or process count than `runtime` holds.
    """

    def __init__(
        self,
        model: nn.Module,
        make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
        runtime: Runtime,
        config: Config,
    ):
        self.runtime = runtime
        plugin, self.scaler = precision_plugin(runtime.device)
        self.fabric = Fabric(
            accelerator=runtime.device.type,
            devices=runtime.local_world_size,
            num_nodes=runtime.world_size // runtime.local_world_size,
            strategy=FABRIC_STRATEGY,
            plugins=[plugin],
        )
        self.fabric.launch()  # under torchrun: no new processes, the group already exists
        if (self.fabric.world_size, self.fabric.device) != (runtime.world_size, runtime.device):
            raise ValueError(
                f"Fabric runs on {self.fabric.device} with {self.fabric.world_size} processes, "
                f"the project on {runtime.device} with {runtime.world_size}; "
                "launch with torchrun"
            )
        self.model = materialize(model, runtime.device, config.seed)
        optimizer = make_optimizer(self.model)
        # Handed a compiled module, Fabric wraps the original and compiles the wrapper again.
        compiled = torch.compile(self.model) if config.compile else self.model
        self.module, self.optimizer = self.fabric.setup(compiled, optimizer)

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
        on the `last` micro-step of an accumulation step (`no_backward_sync` on the others)."""
        return self.fabric.no_backward_sync(self.module, enabled=not last)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context for forward + loss only (never backward): the precision plugin's autocast.
        Fabric's wrapper returns float32 outputs whatever dtype the layers computed in."""
        return self.fabric.autocast()

    def backward(self, loss: Tensor) -> None:
        """Backward of a 0-dim loss already divided for gradient accumulation (scaled first
        when loss scaling is on)."""
        self.fabric.backward(loss)

    def clip_and_step(self, max_norm: float) -> Tensor:
        """Unscale, clip the global gradient L2 norm to `max_norm`, step, update the scale.

        Returns the unscaled pre-clip norm (0-dim float32). With loss scaling on, a step whose
        gradients hold inf or NaN is skipped and the scale lowered; the norm then reads inf
        (by default Fabric would raise on a non-finite norm: `error_if_nonfinite=False`).
        """
        grad_norm = self.fabric.clip_gradients(
            self.module, self.optimizer, max_norm=max_norm, error_if_nonfinite=False
        )
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
