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
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

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
    "load_sharded",
    "save_sharded",
    "set_sampler_epoch",
    "shutdown_runtime",
    "train_sampler",
    "wrap_model",
]

STRATEGY = "fsdp2"


def wrap_model(
    model: nn.Module,
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
    runtime: Runtime,
    precision: PrecisionPolicy,
    config: Config,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Shard `model` in place, bottom-up: each of `model.shard_units()`, then the root; then
    build the optimizer, whose parameters must be the DTensor shards.

    The returned module is `model` itself (now also an `FSDPModule`).
    """
    mesh = init_device_mesh(runtime.device.type, (runtime.world_size,))
    policy = precision.mixed_precision()
    for unit in model.shard_units():
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model, make_optimizer(model)


def full_model_state(model: nn.Module) -> dict[str, Tensor]:
    """The whole, unsharded state dict on every rank (a collective; prefix-free names).

    Every rank holds all of it at once: for a model larger than one device, convert a
    checkpoint offline with `torch.distributed.checkpoint.format_utils.dcp_to_torch_save`.
    """
    options = StateDictOptions(full_state_dict=True)
    return {
        name: value.cpu() for name, value in get_model_state_dict(model, options=options).items()
    }


def save_sharded(
    folder: Path, trained: nn.Module, model: nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Every rank writes its shards of the model and optimizer into `folder` (a collective
    that returns once all shards and DCP's `.metadata` are on disk)."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)


def load_sharded(
    folder: Path, trained: nn.Module, model: nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Load what `save_sharded` wrote into the sharded `model` and its `optimizer`."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=folder)  # fills `state` in place
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )


def gradient_sync(model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
    """Context for one micro-step's forward + backward: gradients are reduce-scattered on every
    micro-step, `enabled` or not.

    Skipping the reduce-scatter (`set_requires_gradient_sync(False)`) would keep a full,
    unsharded gradient per parameter between micro-steps, accumulated in the bf16 compute
    dtype: more memory and lossy sums. Reduced every micro-step, the gradients accumulate in
    fp32 on the shards (as torchtitan does).
    """
    return contextlib.nullcontext()
