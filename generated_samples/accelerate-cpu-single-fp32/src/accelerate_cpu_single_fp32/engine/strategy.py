"""The training engine: HF Accelerate, one process on one device.

Every project's `strategy.py` has one `Engine` with the same verbs, so `train.py` never names a
strategy or a precision: `micro_step(last)`, `autocast()`, `backward(loss)`,
`clip_and_step(max_norm)`, `save(folder)` / `load(folder)` and `full_state_dict()`.

Accelerate runs the step (accelerate_step.py). Precision is data: `COMPUTE_DTYPE` picks
Accelerate's `mixed_precision`, `MIXED_PRECISION`. Saving and loading are replicated.py's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import accelerate
import torch
from torch import nn

from ..config import Config
from ..runtime import Runtime
from .accelerate_step import AccelerateEngine, start_accelerator
from .replicated import place_model

STRATEGY = "single"
PRECISION = "fp32"
FRAMEWORK = f"HF Accelerate {accelerate.__version__}"  # as the run summary names it
COMPUTE_DTYPE = torch.float32
MIXED_PRECISION = "no"  # Accelerate's name for COMPUTE_DTYPE


class Engine(AccelerateEngine):
    """The model being trained, its optimizer and loss scaler, and the verbs of one step.

    `model` is the bare module (checkpoints and exports name its keys) and `optimizer` steps its
    parameters. `module` is what forward runs through: the prepared module, compiled if
    `compile` is on.

    Raises:
        ValueError: Accelerate picked another device or process count than `runtime` holds.
    """

    def __init__(
        self,
        model: nn.Module,
        make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
        runtime: Runtime,
        config: Config,
    ):
        self.runtime = runtime
        fix = "start one process, without a launcher"
        self.accelerator = start_accelerator(
            runtime, COMPUTE_DTYPE, MIXED_PRECISION, config.compile, fix
        )
        self.model = place_model(model, runtime.device, config.seed)
        self.module, self.optimizer = self.accelerator.prepare(
            self.model, make_optimizer(self.model)
        )
        # Without loss scaling, a disabled scaler saves and loads an empty state.
        self.scaler = self.accelerator.scaler or torch.amp.GradScaler(enabled=False)

    def micro_step(self, last: bool) -> contextlib.AbstractContextManager:
        """Context for one micro-batch's forward + backward: one process exchanges no
        gradients, so the last micro-step (`last`) is like the others."""
        return contextlib.nullcontext()
