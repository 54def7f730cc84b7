"""What an FSDP2 engine builds on: how the model is sharded, how each rank initialises its
own shards, and the verbs that are the same whatever runs the step.

Each of `model.shard_units()` is sharded first, then the root takes what is left, so one
unit's full parameters are all-gathered at a time in forward and backward, and its gradients
are reduce-scattered as soon as its backward ends (pytorch.org/docs/stable/distributed.fsdp.
fully_shard.html). FSDP's `MixedPrecisionPolicy` all-gathers the fp32 parameter shards cast to
the compute dtype, so every op computes in it without autocast; gradients are reduce-scattered
in fp32 onto the fp32 shards the optimizer steps.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from ..runtime import Runtime


def shard(model: nn.Module, mesh: DeviceMesh, compute_dtype: torch.dtype) -> None:
    """`fully_shard` each of `model.shard_units()`, then the root, over the 1-D `mesh`, with
    parameters all-gathered in `compute_dtype` and gradients reduced in fp32. In place."""
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for unit in model.shard_units():  # bottom-up: the units, then the root
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def copy_shard(target: Tensor, full: Tensor) -> None:
    """`build.init_weights`'s `store` under FSDP2: a sharded parameter keeps its rank's piece
    of the full tensor, cut as `fully_shard` cut it (dim 0, in world-size chunks); anything
    not sharded, all of it."""
    if isinstance(target, DTensor):
        piece = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None)
        target.to_local().copy_(piece.to_local())
    else:
        target.copy_(full)


class ShardedEngine:
    """The verbs both FSDP2 engines have alike.

    Attributes set by the subclass: `runtime`; `model`, the bare module, sharded in place
    (it is also an `FSDPModule`); `optimizer`, stepping the DTensor shards.
    """

    runtime: Runtime
    model: nn.Module
    optimizer: torch.optim.Optimizer

    def zero_grad(self) -> None:
        """Drop the last step's gradients (`set_to_none`: freed, not filled with zeros)."""
        self.optimizer.zero_grad(set_to_none=True)

    def loss_scale(self) -> float | None:
        """None: no loss scaling in this precision."""
        return None

    def step_skipped(self) -> bool:
        """False: nothing here skips an update (non-finite steps: see training/nonfinite.py)."""
        return False

    def inference(self) -> contextlib.AbstractContextManager:
        """Context for validation's forward passes: `torch.no_grad()`, not inference mode. FSDP2
        allocates its all-gather buffers at the first forward; made in inference mode (a
        validation right after a resume) they are inference tensors, and the next all-gather
        into them fails ("Inference tensors do not track version counter")."""
        return torch.no_grad()

    def micro_step(self, last: bool) -> contextlib.AbstractContextManager:
        """Context for one micro-batch's forward + backward: gradients are reduce-scattered on
        every micro-step, the `last` one or not.

        Skipping the reduce-scatter would keep a full, unsharded gradient per parameter between
        micro-steps, accumulated in the compute dtype: more memory and lossy sums. Reduced every
        micro-step, the gradients accumulate in fp32 on the shards (as torchtitan does).
        """
        return contextlib.nullcontext()

    def autocast(self) -> contextlib.AbstractContextManager:
        """No autocast: the parameters FSDP all-gathers are already in the compute dtype."""
        return contextlib.nullcontext()

    def full_state_dict(self) -> dict[str, Tensor]:
        """The whole, unsharded state dict on the CPU of every rank (a collective; keys without
        wrapper prefixes).

        Every rank holds all of it at once: for a model larger than one host's memory, convert
        a checkpoint offline with `torch.distributed.checkpoint.format_utils.dcp_to_torch_save`.
        """
        options = StateDictOptions(full_state_dict=True)
        full_state = get_model_state_dict(self.model, options=options)
        return {name: value.cpu() for name, value in full_state.items()}
