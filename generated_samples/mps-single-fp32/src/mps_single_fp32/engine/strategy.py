"""The training engine: one process trains the whole model on one device.

Every project's `strategy.py` has one `Engine` with the same verbs, so `train.py` never names a
strategy or a precision: `micro_step(last)`, `autocast()`, `backward(loss)`,
`clip_and_step(max_norm)`, `save(folder)` / `load(folder)` and `full_state_dict()`.

Precision is data, the constants `COMPUTE_DTYPE` and `GRAD_SCALER` that amp.py's step reads.
Saving and loading are replicated.py's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

from ..config import Config
from ..runtime import Runtime
from .amp import AmpEngine
from .replicated import place_model

STRATEGY = "single"
PRECISION = "fp32"
FRAMEWORK = "plain PyTorch"  # what runs the step, as the run summary names it
COMPUTE_DTYPE = torch.float32
GRAD_SCALER = False


class Engine(AmpEngine):
    """The model being trained, its optimizer and loss scaler, and the verbs of one step.

    `model` is the bare module (checkpoints and exports name its keys) and `optimizer` steps its
    parameters. `module` is what forward runs through: `model`, or its `torch.compile` wrapper.
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
        self.module = torch.compile(self.model) if config.compile else self.model
        self.optimizer = make_optimizer(self.model)
        self.start_amp(COMPUTE_DTYPE, GRAD_SCALER)

    def micro_step(self, last: bool) -> contextlib.AbstractContextManager:
        """Context for one micro-batch's forward + backward. With one process no gradients
        are exchanged, so the last micro-step (`last`) is like the others."""
        return contextlib.nullcontext()
