"""Parallelism: DistributedDataParallel, one process per device, launched by torchrun.

Every strategy's `parallel.py` exports these same names, so `train.py` never names DDP.
Each process holds the whole model; gradients are all-reduced (averaged) in backward, except
inside `gradient_sync(enabled=False)` (DDP's `no_sync`), used on all micro-batches of an
accumulation step but the last (pytorch.org/docs/stable/notes/ddp.html).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from .config import Config
from .distributed import (
    Runtime,
    all_reduce_sum,
    barrier,
    eval_sampler,
    gather_objects,
    init_runtime,
    set_sampler_epoch,
    shutdown_runtime,
    train_sampler,
)
from .precision import PrecisionPolicy

__all__ = [
    "STRATEGY",
    "Runtime",
    "all_reduce_sum",
    "barrier",
    "eval_sampler",
    "full_model_state",
    "gather_objects",
    "gradient_sync",
    "init_runtime",
    "set_sampler_epoch",
    "shutdown_runtime",
    "train_sampler",
    "wrap_model",
]

STRATEGY = "ddp"

# A conv over one input channel has a size-1 dimension whose stride autocast may report
# differently from the bucket's; size-1 strides address no memory, so the layouts agree.
warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")


def wrap_model(
    model: nn.Module,
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
    runtime: Runtime,
    precision: PrecisionPolicy,
    config: Config,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Wrap `model` in DDP (parameters are broadcast from rank 0 on construction); the optimizer
    steps the bare model's parameters.

    Gradients are views into DDP's communication buckets: no second copy of them, and their
    layout always matches the buckets'. Precision is autocast's job (`precision`) here.
    """
    device_ids = [runtime.local_rank] if runtime.device.type == "cuda" else None
    wrapped = DistributedDataParallel(model, device_ids=device_ids, gradient_as_bucket_view=True)
    return wrapped, make_optimizer(model)


def full_model_state(model: nn.Module) -> dict[str, Tensor]:
    """The bare model's whole state dict (every rank holds all of it under DDP)."""
    return model.state_dict()


def gradient_sync(model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
    """Context for one micro-step's forward + backward; all-reduce gradients only if `enabled`."""
    return contextlib.nullcontext() if enabled else model.no_sync()
