"""The training engine: Lightning Fabric, DDP, one process per device.

Every project's `strategy.py` has one `Engine` with the same verbs, so `train.py` never names a
strategy or a precision: `micro_step(last)`, `autocast()`, `backward(loss)`,
`clip_and_step(max_norm)`, `save(folder)` / `load(folder)` and `full_state_dict()`.

Fabric runs the step (fabric_step.py): its `setup` wraps the model in DistributedDataParallel,
and `no_backward_sync` skips the gradient all-reduce on all but the last micro-step. The
process group is the one `runtime.py` joined from torchrun's environment; Fabric uses it rather
than starting its own. Precision is data: `COMPUTE_DTYPE` picks Fabric's precision setting,
`FABRIC_PRECISION`. Saving and loading are replicated.py's.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import lightning
import torch
from lightning.fabric import Fabric
from torch import nn

from ..config import Config
from ..runtime import Runtime
from .fabric_step import FabricEngine, launch, precision_plugin
from .replicated import place_model

STRATEGY = "ddp"
PRECISION = "fp32"
FRAMEWORK = f"Lightning Fabric {lightning.__version__}"  # as the run summary names it
COMPUTE_DTYPE = torch.float32
FABRIC_PRECISION = "32-true"  # Fabric's name for COMPUTE_DTYPE

# A conv over one input channel has a size-1 dimension whose gradient stride can differ from
# the bucket's; size-1 strides address no memory, so the layouts agree.
warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")


class Engine(FabricEngine):
    """The model being trained, its optimizer and loss scaler, and the verbs of one step.

    `model` is the bare module (checkpoints and exports name its keys) and `optimizer` steps its
    parameters. `module` is what forward runs through: Fabric's wrapper of the DDP module,
    compiled if `compile` is on.

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
        plugin, self.scaler = precision_plugin(runtime.device, COMPUTE_DTYPE, FABRIC_PRECISION)
        self.fabric = Fabric(
            accelerator=runtime.device.type,
            devices=runtime.local_world_size,
            num_nodes=runtime.world_size // runtime.local_world_size,
            strategy="ddp",
            plugins=[plugin],
        )
        launch(self.fabric, runtime, fix="launch with torchrun")
        self.model = place_model(model, runtime.device, config.seed)
        optimizer = make_optimizer(self.model)
        # Handed a compiled module, Fabric wraps the original and compiles the wrapper again.
        compiled = torch.compile(self.model) if config.compile else self.model
        self.module, self.optimizer = self.fabric.setup(compiled, optimizer)
