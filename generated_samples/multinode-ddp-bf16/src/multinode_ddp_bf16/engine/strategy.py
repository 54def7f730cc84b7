"""The training engine: DistributedDataParallel, one process per device.

Every project's `strategy.py` has one `Engine` with the same verbs, so `train.py` never names a
strategy or a precision: `micro_step(last)`, `autocast()`, `backward(loss)`,
`clip_and_step(max_norm)`, `save(folder)` / `load(folder)` and `full_state_dict()`.

Each process holds the whole model; DDP broadcasts rank 0's parameters on construction and
all-reduces (averages) gradients in backward, except inside `micro_step(last=False)` (DDP's
`no_sync`), so an accumulation step communicates once (pytorch.org/docs/stable/notes/ddp.html).
Gradients are views into DDP's buckets (`gradient_as_bucket_view`): no second copy of them.

Precision is data, the constants `COMPUTE_DTYPE` and `GRAD_SCALER` that amp.py's step reads.
Saving and loading are replicated.py's.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..config import Config
from ..runtime import Runtime
from .amp import AmpEngine
from .replicated import place_model

STRATEGY = "ddp"
PRECISION = "bf16"
FRAMEWORK = "plain PyTorch"  # what runs the step, as the run summary names it
COMPUTE_DTYPE = torch.bfloat16
GRAD_SCALER = False

# A conv over one input channel has a size-1 dimension whose gradient stride can differ from
# the bucket's; size-1 strides address no memory, so the layouts agree.
warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")


class Engine(AmpEngine):
    """The model being trained, its optimizer and loss scaler, and the verbs of one step.

    `model` is the bare module (checkpoints and exports name its keys) and `optimizer` steps its
    parameters. `module` is what forward runs through: the DDP wrapper, compiled if `compile`
    is on.
    """

    def __init__(
        self,
        model: nn.Module,
        make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
        runtime: Runtime,
        config: Config,
    ):
        self.runtime = runtime
        self.model = place_model(model, runtime.device, config.seed)
        device_ids = [runtime.local_rank] if runtime.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(
            self.model, device_ids=device_ids, gradient_as_bucket_view=True
        )
        self.module = torch.compile(self.ddp) if config.compile else self.ddp
        self.optimizer = make_optimizer(self.model)
        self.start_amp(COMPUTE_DTYPE, GRAD_SCALER)

    def micro_step(self, last: bool) -> contextlib.AbstractContextManager:
        """Context for one micro-batch's forward + backward: gradients are all-reduced only on
        the `last` micro-step of an accumulation step (`no_sync` on the others)."""
        return contextlib.nullcontext() if last else self.ddp.no_sync()
