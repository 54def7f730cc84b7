"""The training engine: Lightning Fabric's `ModelParallelStrategy` with FSDP2 (`fully_shard`),
one process per device.

Every project's `strategy.py` has one `Engine` with the same verbs, so `train.py` never names a
strategy or a precision: `micro_step(last)`, `autocast()`, `backward(loss)`,
`clip_and_step(max_norm)`, `save(folder)` / `load(folder)` and `full_state_dict()`.

Fabric calls `shard_model` on its device mesh in `setup_module`, so each rank stores
1/world_size of every parameter, gradient and optimizer state (how the model is cut:
sharding.py). Fabric's `FSDPStrategy` (FSDP1) refuses CPUs; this strategy runs on both.
`backward` and `clip_gradients` are Fabric's; checkpoints are its sharded `save` / `load`
(torch.distributed.checkpoint). The process group is the one `runtime.py` joined from
torchrun's environment.

Precision is data: FSDP all-gathers the parameters in `COMPUTE_DTYPE` (fp32), so
every op computes in it without autocast (Fabric's precision stays "32-true"); gradients are
reduced and stepped in fp32.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning
import torch
from lightning.fabric import Fabric
from lightning.fabric.strategies import ModelParallelStrategy
from torch import Tensor, nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.device_mesh import DeviceMesh

from ..config import Config
from ..runtime import Runtime
from .build import materialize
from .sharding import ShardedEngine, copy_shard, shard

STRATEGY = "fsdp2"
PRECISION = "fp32"
FRAMEWORK = f"Lightning Fabric {lightning.__version__}"  # as the run summary names it
COMPUTE_DTYPE = torch.float32
ENGINE_FOLDER = "engine"  # the sharded model and optimizer states in a checkpoint folder


def shard_model(model: nn.Module, mesh: DeviceMesh, device: torch.device, seed: int) -> nn.Module:
    """Fabric's `parallelize_fn` (with `device` and `seed` bound): shard `model` in place over
    the mesh's "data_parallel" dimension, then allocate and initialise this rank's shards
    (build.py) while it is still on the meta device. Returns `model` (now also an
    `FSDPModule`).

    Fabric's mesh is 2-D (data_parallel x tensor_parallel); handed the whole mesh,
    `fully_shard` would replicate over the first dimension and shard over the second (HSDP):
    with tensor_parallel 1, every rank would hold the whole model.
    """
    shard(model, mesh["data_parallel"], COMPUTE_DTYPE)
    materialize(getattr(model, "_orig_mod", model), device, seed, store=copy_shard)  # compiled?
    return model


class Engine(ShardedEngine):
    """The sharded model, its optimizer, and the verbs of one step.

    `model` is the bare module, sharded in place (it is also an `FSDPModule` now); `module` is
    Fabric's wrapper that forward runs through, compiled if `compile` is on; `optimizer` is
    Fabric's wrapper of the optimizer `make_optimizer` builds over the DTensor shards.

    Raises:
        ValueError: Fabric chose another device or process count than `runtime` holds.
    """

    def __init__(
        self,
        model: nn.Module,
        make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
        runtime: Runtime,
        config: Config,
    ):
        self.runtime = runtime
        strategy = ModelParallelStrategy(
            parallelize_fn=functools.partial(shard_model, device=runtime.device, seed=config.seed),
            data_parallel_size=runtime.world_size,
            tensor_parallel_size=1,
        )
        self.fabric = Fabric(
            accelerator=runtime.device.type,
            devices=runtime.local_world_size,
            num_nodes=runtime.world_size // runtime.local_world_size,
            strategy=strategy,
            precision="32-true",
        )
        self.fabric.launch()  # under torchrun: no new processes, the group already exists
        fabric_world = (self.fabric.world_size, self.fabric.device)
        if fabric_world != (runtime.world_size, runtime.device):
            raise ValueError(
                f"Fabric runs {fabric_world[0]} processes on {fabric_world[1]}, the project "
                f"{runtime.world_size} on {runtime.device}; launch with torchrun"
            )
        self.model = model  # on the meta device until `shard_model` materialises its shards
        # Fabric compiles again after sharding when handed a compiled module.
        compiled = torch.compile(self.model) if config.compile else self.model
        self.module = self.fabric.setup_module(compiled)
        # After sharding: the optimizer must hold the shards.
        self.optimizer = self.fabric.setup_optimizers(make_optimizer(self.model))

    def backward(self, loss: Tensor) -> None:
        """Backward of a 0-dim loss already divided for gradient accumulation."""
        self.fabric.backward(loss)

    def clip_and_step(self, max_norm: float) -> Tensor:
        """Clip the global gradient L2 norm (over every rank's shards) to `max_norm`, then step;
        returns the pre-clip norm (0-dim, the whole norm on every rank; inf or NaN when a
        gradient is, as Fabric is told not to raise)."""
        grad_norm = self.fabric.clip_gradients(
            self.module, self.optimizer, max_norm=max_norm, error_if_nonfinite=False
        )
        self.optimizer.step()
        return grad_norm.full_tensor()  # a plain tensor: the loop mixes it with others

    def save(self, folder: Path) -> None:
        """Every rank writes its shards of the model and optimizer into `folder / ENGINE_FOLDER`
        (Fabric's sharded save; a collective: returns once all shards are on disk)."""
        self.fabric.save(folder / ENGINE_FOLDER, self._states())

    def load(self, folder: Path) -> None:
        """Load what `save` wrote into the sharded model and its optimizer (a collective).

        Raises:
            ValueError: the engine folder in `folder` is missing or damaged.
        """
        path = folder / ENGINE_FOLDER
        self.optimizer.zero_grad(set_to_none=True)  # as the plain FSDP2 engine: pytorch#140898
        try:
            # torch.load's own default since torch 2.6 is weights_only=True; Fabric.load takes
            # the argument only from Lightning 2.6.1
            self.fabric.load(path, self._states(), strict=True)
        except (Exception, CheckpointException) as error:  # missing, torn or foreign
            reason = f"{type(error).__name__}: {error}".splitlines()[0]
            raise ValueError(f"{path} does not load ({reason}); move {folder} away") from error

    def _states(self) -> dict[str, Any]:
        return {"model": self.module, "optimizer": self.optimizer}
