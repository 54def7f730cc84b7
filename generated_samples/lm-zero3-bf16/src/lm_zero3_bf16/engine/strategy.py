"""The training engine: DeepSpeed ZeRO stage 3, one process per device.

ZeRO stage 3 partitions the optimizer state, the gradients and the parameters across ranks;
a model built on the meta device is partitioned as it is initialised (zero3_init.py), so no
process ever holds the whole of it.

Every project's `strategy.py` has one `Engine` with the same verbs, so `train.py` never names a
strategy or a precision: `micro_step(last)`, `autocast()`, `backward(loss)`,
`clip_and_step(max_norm)`, `save(folder)` / `load(folder)` and `full_state_dict()`.

The DeepSpeed engine runs backward, gradient reduction, clipping, the optimizer step and
checkpoints (deepspeed_zero.py); this engine tells it where each accumulation step ends
(`micro_step`), and the loop steps the learning-rate schedule itself. Its settings are
`ds_config.json` beside this file, with the batch size, accumulation and clipping filled in
from `configs/train.toml`.

Precision is data: forward and loss compute in `COMPUTE_DTYPE` (bf16) under autocast
around the DeepSpeed engine (`torch.float32`: no autocast); parameters, gradients and optimizer
state stay fp32.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..config import Config
from ..runtime import Runtime
from .deepspeed_zero import ZeroEngine, read_ds_config
from .zero3_init import partition

STRATEGY = "zero3"
PRECISION = "bf16"
FRAMEWORK = "plain PyTorch"  # what runs the step, as the run summary names it
COMPUTE_DTYPE = torch.bfloat16


class Engine(ZeroEngine):
    """The DeepSpeed engine around the model, the optimizer it partitions, and the verbs of one
    step: `model` is the bare module (its parameters partitioned in place), `module` the
    DeepSpeed engine forward runs through.

    Raises:
        ValueError: `compile=true` (not wired to DeepSpeed here) or a bad `ds_config.json`.
    """

    def __init__(
        self,
        model: nn.Module,
        make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
        runtime: Runtime,
        config: Config,
    ):
        self.runtime = runtime
        ds_config = read_ds_config(config, runtime)
        self.model = partition(model, runtime.device, config.seed, ds_config)
        self.optimizer = make_optimizer(self.model)
        self.start_deepspeed(ds_config, COMPUTE_DTYPE)
