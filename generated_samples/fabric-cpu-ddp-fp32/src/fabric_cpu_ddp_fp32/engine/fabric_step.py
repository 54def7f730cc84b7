"""Lightning Fabric's step for an engine that keeps the whole model in each process
(replicated.py).

Fabric does the work of each verb: `setup` wraps the model and the optimizer, `autocast` and
`backward` apply its precision plugin, `no_backward_sync` skips the gradient all-reduce on all
but the last micro-step, `clip_gradients` unscales before it clips, and the wrapped
optimizer's `step` steps and updates the loss scale
(lightning.ai/docs/fabric/stable/api/fabric_methods.html).
"""

from __future__ import annotations

import contextlib

import torch
from lightning.fabric import Fabric
from lightning.fabric.plugins import MixedPrecision, Precision
from torch import Tensor

from ..runtime import Runtime
from .replicated import ReplicatedEngine


def precision_plugin(
    device: torch.device, compute_dtype: torch.dtype, setting: str
) -> tuple[Precision, torch.amp.GradScaler]:
    """Fabric's plugin for `compute_dtype` on `device`, and the loss scaler it steps with.

    `setting` is Fabric's name for `compute_dtype` (lightning.ai/docs/fabric/stable/
    fundamentals/precision.html); float32 is always "32-true". The scaler is enabled only for
    "16-mixed", where Fabric must be handed it: without one it swaps "16-mixed" for another
    precision on a CPU without a word. A disabled scaler passes every call through.
    """
    setting = "32-true" if compute_dtype is torch.float32 else setting
    scaler = torch.amp.GradScaler(device.type, enabled=setting == "16-mixed")
    if setting == "32-true":
        return Precision(), scaler
    return MixedPrecision(setting, device.type, scaler if scaler.is_enabled() else None), scaler


def launch(fabric: Fabric, runtime: Runtime, fix: str) -> None:
    """`fabric.launch()`, which starts no processes where the process group exists already.

    Raises:
        ValueError: Fabric picked another device or process count than `runtime` holds; the
            message ends with `fix`.
    """
    fabric.launch()
    if (fabric.world_size, fabric.device) != (runtime.world_size, runtime.device):
        raise ValueError(
            f"Fabric runs on {fabric.device} with {fabric.world_size} processes, "
            f"the project on {runtime.device} with {runtime.world_size}; {fix}"
        )


class FabricEngine(ReplicatedEngine):
    """`ReplicatedEngine` whose micro-step, autocast, backward and clipped step are Fabric's.

    Set by the subclass besides `ReplicatedEngine`'s attributes: `fabric`; `module` and
    `optimizer` are the ones `fabric.setup` returned.
    """

    fabric: Fabric

    def micro_step(self, last: bool) -> contextlib.AbstractContextManager:
        """Context for one micro-batch's forward + backward: gradients are all-reduced only
        on the `last` micro-step of an accumulation step (`no_backward_sync` on the others;
        with one process no gradients are exchanged at all)."""
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
