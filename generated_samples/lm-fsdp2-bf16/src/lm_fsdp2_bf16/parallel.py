"""Parallelism: FSDP2 (`fully_shard`), one process per device, launched by torchrun.

Every strategy's `parallel.py` exports these same names, so `train.py` never names FSDP.
Each rank stores 1/world_size of every parameter, gradient and optimizer state (DTensor shards).
Each block of `model.shard_units()` is sharded first, then the root takes what is left, so one
block's full parameters are all-gathered at a time in forward and backward, and its gradients
are reduce-scattered as soon as its backward ends (pytorch.org/docs/stable/distributed.fsdp.
fully_shard.html). Mixed precision is FSDP's `MixedPrecisionPolicy` from `precision.py`.
"""

from __future__ import annotations

import contextlib

from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

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
    "gather_objects",
    "gradient_sync",
    "init_runtime",
    "set_sampler_epoch",
    "shutdown_runtime",
    "train_sampler",
    "wrap_model",
]

STRATEGY = "fsdp2"


def wrap_model(model: nn.Module, runtime: Runtime, precision: PrecisionPolicy) -> nn.Module:
    """Shard `model` in place, bottom-up: each of `model.shard_units()`, then the root.

    Build the optimizer after this call: its parameters must be the DTensor shards. The
    returned module is `model` itself (now also an `FSDPModule`).
    """
    mesh = init_device_mesh(runtime.device.type, (runtime.world_size,))
    policy = precision.mixed_precision()
    for unit in model.shard_units():
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def gradient_sync(model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
    """Context for one micro-step's forward + backward: gradients are reduce-scattered on every
    micro-step, `enabled` or not.

    Skipping the reduce-scatter (`set_requires_gradient_sync(False)`) would keep a full,
    unsharded gradient per parameter between micro-steps, accumulated in the bf16 compute
    dtype: more memory and lossy sums. Reduced every micro-step, the gradients accumulate in
    fp32 on the shards (as torchtitan does).
    """
    return contextlib.nullcontext()
