"""HF Accelerate's step for an engine that keeps the whole model in each process
(replicated.py).

Accelerate does the work of each verb: `prepare` wraps the model and the optimizer, `autocast`
and `backward` apply its mixed precision, `clip_grad_norm_` unscales before it clips, and the
prepared optimizer's `step` steps and updates the loss scale
(huggingface.co/docs/accelerate/package_reference/accelerator).

The scheduler is not prepared: `train.py` steps it once per optimizer step. Prepared, it
would step once per process per optimizer step unless told otherwise (accelerate#1382).
"""

from __future__ import annotations

import contextlib

import torch
from accelerate import Accelerator
from torch import Tensor

from ..runtime import Runtime
from .replicated import ReplicatedEngine


def start_accelerator(
    runtime: Runtime, compute_dtype: torch.dtype, setting: str, compile: bool, fix: str
) -> Accelerator:
    """An `Accelerator` on `runtime`'s device type whose `mixed_precision` is `setting`,
    Accelerate's name for `compute_dtype` (float32 is always "no"), compiling with inductor
    if `compile`.

    Raises:
        ValueError: Accelerate picked another device type or process count than `runtime`
            holds; the message ends with `fix`.
    """
    accelerator = Accelerator(
        cpu=runtime.device.type == "cpu",
        mixed_precision="no" if compute_dtype is torch.float32 else setting,
        dynamo_backend="inductor" if compile else "no",
    )
    if (accelerator.num_processes, accelerator.device.type) != (
        runtime.world_size,
        runtime.device.type,
    ):
        raise ValueError(
            f"Accelerate runs on {accelerator.device} with {accelerator.num_processes} "
            f"processes, the project on {runtime.device} with {runtime.world_size}; {fix}"
        )
    return accelerator


class AccelerateEngine(ReplicatedEngine):
    """`ReplicatedEngine` whose autocast, backward and clipped step are Accelerate's.

    Set by the subclass besides `ReplicatedEngine`'s attributes: `accelerator`; `module` and
    `optimizer` are the ones `accelerator.prepare` returned.
    """

    accelerator: Accelerator

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
