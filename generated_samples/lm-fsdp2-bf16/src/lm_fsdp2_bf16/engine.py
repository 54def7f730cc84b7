"""The training engine: FSDP2 (`fully_shard`), one process per device.

Every project's `engine.py` has one `Engine` with the same verbs, so `train.py` never names a
strategy or a precision: `micro_step(last)`, `autocast()`, `backward(loss)`,
`clip_and_step(max_norm)`, `save(folder)` / `load(folder)` and `full_state_dict()`.

Each rank stores 1/world_size of every parameter, gradient and optimizer state (DTensor shards).
Each of `model.shard_units()` is sharded first, then the root takes what is left, so one unit's
full parameters are all-gathered at a time in forward and backward, and its gradients are
reduce-scattered as soon as its backward ends (pytorch.org/docs/stable/distributed.fsdp.
fully_shard.html). The model arrives on the meta device and is sharded there: each rank then
allocates and initialises its shards alone (build.py), never the whole model.

Precision is data: FSDP's `MixedPrecisionPolicy` all-gathers the fp32 parameter shards cast to
`COMPUTE_DTYPE`, so every op computes in it without autocast; gradients are reduce-scattered in
fp32 onto the fp32 shards the optimizer steps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from .build import materialize
from .config import Config
from .runtime import Runtime

STRATEGY = "fsdp2"
PRECISION = "bf16"
FRAMEWORK = "plain PyTorch"  # what runs the step, as the run summary names it
COMPUTE_DTYPE = torch.bfloat16


def copy_shard(target: Tensor, full: Tensor) -> None:
    """`build.init_weights`'s `store` under FSDP2: a sharded parameter keeps its rank's piece
    of the full tensor, cut as `fully_shard` cut it (dim 0, in world-size chunks); anything
    not sharded, all of it."""
    if isinstance(target, DTensor):
        piece = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None)
        target.to_local().copy_(piece.to_local())
    else:
        target.copy_(full)


class Engine:
    """The sharded model, its optimizer, and the verbs of one step.

    `model` is the bare module, sharded in place (it is also an `FSDPModule` now); `module` is
    what forward runs through (`model`, or its `torch.compile` wrapper); `optimizer` steps the
    DTensor shards.
    """

    def __init__(
        self,
        model: nn.Module,
        make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
        runtime: Runtime,
        config: Config,
    ):
        self.runtime = runtime
        mesh = init_device_mesh(runtime.device.type, (runtime.world_size,))
        policy = MixedPrecisionPolicy(param_dtype=COMPUTE_DTYPE, reduce_dtype=torch.float32)
        for unit in model.shard_units():  # bottom-up: the units, then the root
            fully_shard(unit, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        self.model = materialize(model, runtime.device, config.seed, store=copy_shard)
        self.optimizer = make_optimizer(self.model)  # after sharding: it must hold the shards
        self.module = torch.compile(self.model) if config.compile else self.model

    def zero_grad(self) -> None:
        """Drop the last step's gradients (`set_to_none`: freed, not filled with zeros)."""
        self.optimizer.zero_grad(set_to_none=True)

    def loss_scale(self) -> float | None:
        """None: no loss scaling in this precision."""
        return None

    def step_skipped(self) -> bool:
        """False: nothing here skips an update (non-finite steps: see nonfinite.py)."""
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

        Skipping the reduce-scatter (`set_requires_gradient_sync(False)`) would keep a full,
        unsharded gradient per parameter between micro-steps, accumulated in `COMPUTE_DTYPE`:
        more memory and lossy sums. Reduced every micro-step, the gradients accumulate in fp32
        on the shards (as torchtitan does).
        """
        return contextlib.nullcontext()

    def autocast(self) -> contextlib.AbstractContextManager:
        """No autocast: the parameters FSDP all-gathers are already in `COMPUTE_DTYPE`."""
        return contextlib.nullcontext()

    def backward(self, loss: Tensor) -> None:
        """Backward of a 0-dim loss already divided for gradient accumulation."""
        loss.backward()

    def clip_and_step(self, max_norm: float) -> Tensor:
        """Clip the global gradient L2 norm (over every rank's shards) to `max_norm`, then step;
        returns the pre-clip norm (0-dim, the whole norm on every rank)."""
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        self.optimizer.step()
        return grad_norm.full_tensor()  # a plain tensor: the loop mixes it with others

    def save(self, folder: Path) -> None:
        """Every rank writes its shards of the model and optimizer into `folder` with
        torch.distributed.checkpoint (a collective: returns once all shards are on disk)."""
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)

    def load(self, folder: Path) -> None:
        """Load what `save` wrote into the sharded model and its optimizer (a collective).

        Gradients are dropped first: `get_state_dict` fills an optimizer without state by a
        zero-gradient step only where no gradient is present, and with one present (after a
        warm-up or sanity backward) AdamW's moments would load into nothing, silently
        (pytorch#140898).

        Raises:
            ValueError: a shard file is missing, torn or from another model (DCP raises the
                same on every rank).
        """
        self.optimizer.zero_grad(set_to_none=True)
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        try:
            dcp.load(state, checkpoint_id=folder)  # fills `state` in place
        except (Exception, CheckpointException) as error:  # torn, missing or foreign files
            reason = f"{type(error).__name__}: {error}".strip().splitlines()[0][:300]
            raise ValueError(f"{folder} does not load ({reason}); move it away") from error
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )

    def full_state_dict(self) -> dict[str, Tensor]:
        """The whole, unsharded state dict on the CPU of every rank (a collective; keys without
        wrapper prefixes).

        Every rank holds all of it at once: for a model larger than one host's memory, convert
        a checkpoint offline with `torch.distributed.checkpoint.format_utils.dcp_to_torch_save`.
        """
        options = StateDictOptions(full_state_dict=True)
        full_state = get_model_state_dict(self.model, options=options)
        return {name: value.cpu() for name, value in full_state.items()}
