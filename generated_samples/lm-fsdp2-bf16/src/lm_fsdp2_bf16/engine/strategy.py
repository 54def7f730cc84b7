"""The training engine: FSDP2 (`fully_shard`), one process per device.

Every project's `strategy.py` has one `Engine` with the same verbs, so `train.py` never names a
strategy or a precision: `micro_step(last)`, `autocast()`, `backward(loss)`,
`clip_and_step(max_norm)`, `save(folder)` / `load(folder)` and `full_state_dict()`.

Each rank stores 1/world_size of every parameter, gradient and optimizer state (DTensor
shards; how the model is cut: sharding.py). The model arrives on the meta device and is
sharded there: each rank then allocates and initialises its shards alone (build.py), never
the whole model. Checkpoints are torch.distributed.checkpoint's, every rank writing its shards.

Precision is data: FSDP all-gathers the parameters in `COMPUTE_DTYPE` (bf16), so
every op computes in it without autocast; gradients are reduced and stepped in fp32.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh

from ..config import Config
from ..runtime import Runtime
from .build import check_loaded, materialize
from .sharding import ShardedEngine, copy_shard, shard

STRATEGY = "fsdp2"
PRECISION = "bf16"
FRAMEWORK = "plain PyTorch"  # what runs the step, as the run summary names it
COMPUTE_DTYPE = torch.bfloat16
# A checkpoint holds what trains: frozen weights (a LoRA run's base) are the model's start,
# built again at a resume; a load then checks it set every trainable one (`check_loaded`).
TRAINABLE = StateDictOptions(ignore_frozen_params=True, strict=False)


class Engine(ShardedEngine):
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
        shard(model, init_device_mesh(runtime.device.type, (runtime.world_size,)), COMPUTE_DTYPE)
        self.model = materialize(model, runtime.device, config.seed, store=copy_shard)
        self.optimizer = make_optimizer(self.model)  # after sharding: it must hold the shards
        self.module = torch.compile(self.model) if config.compile else self.model
        self.save_group: dist.ProcessGroup | None = None  # for background saves (start_save)

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
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer, options=TRAINABLE)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)

    def start_save(self, folder: Path) -> Callable[[], None]:
        """Copy this rank's shards of what `save` writes to host memory and write them into
        `folder` in the background (torch.distributed.checkpoint's `async_save`); returns what
        waits for the write. The write's collectives run on a gloo group of their own, made at
        the first call (a collective), never interleaved with the training's."""
        if self.save_group is None:
            self.save_group = dist.new_group(backend="gloo")
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer, options=TRAINABLE)
        state = {"model": model_state, "optimizer": optimizer_state}
        return dcp.async_save(state, checkpoint_id=folder, process_group=self.save_group).result

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
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer, options=TRAINABLE)
        state = {"model": model_state, "optimizer": optimizer_state}
        try:
            dcp.load(state, checkpoint_id=folder)  # fills `state` in place
        except (Exception, CheckpointException) as error:  # torn, missing or foreign files
            reason = f"{type(error).__name__}: {error}".strip().splitlines()[0][:300]
            raise ValueError(f"{folder} does not load ({reason}); move it away") from error
        loaded = set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=TRAINABLE,
        )
        check_loaded(loaded.missing_keys, loaded.unexpected_keys, self.model, folder)
