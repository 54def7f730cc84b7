"""The training engine: DeepSpeed ZeRO stage 3 with CPU offload, one process per device.

ZeRO stage 3 partitions the optimizer state, the gradients and the parameters across ranks;
a model built on the meta device is partitioned as it is initialised (zero3_init.py), so no
process ever holds the whole of it. The optimizer state and parameters live in CPU memory,
where DeepSpeed's CPU Adam steps.

Every project's `strategy.py` has one `Engine` with the same verbs, so `train.py` never names a
strategy or a precision: `micro_step(last)`, `autocast()`, `backward(loss)`,
`clip_and_step(max_norm)`, `save(folder)` / `load(folder)` and `full_state_dict()`.

The DeepSpeed engine runs backward, gradient reduction, clipping, the optimizer step and
checkpoints (deepspeed_zero.py); this engine tells it where each accumulation step ends
(`micro_step`), and the loop steps the learning-rate schedule itself. Its settings are
`ds_config.json` beside this file, with the batch size, accumulation and clipping filled in
from `configs/train.toml`.

Precision is data: forward and loss compute in `COMPUTE_DTYPE` (fp32) under autocast
around the DeepSpeed engine (`torch.float32`: no autocast); parameters, gradients and optimizer
state stay fp32.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from deepspeed.ops.adam import DeepSpeedCPUAdam
from torch import nn

from ..config import Config
from ..runtime import Runtime
from .deepspeed_zero import ZeroEngine, read_ds_config
from .zero3_init import partition

STRATEGY = "zero3-offload"
PRECISION = "fp32"
FRAMEWORK = "plain PyTorch"  # what runs the step, as the run summary names it
COMPUTE_DTYPE = torch.float32


class Engine(ZeroEngine):
    """The DeepSpeed engine around the model, the optimizer it partitions, and the verbs of one
    step: `model` is the bare module (its parameters partitioned in place), `module` the
    DeepSpeed engine forward runs through. AdamW becomes DeepSpeed's vectorised CPU Adam, with
    the same groups and hyperparameters: the optimizer step runs on the CPU.

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
        if isinstance(self.optimizer, torch.optim.AdamW):
            groups = [dict(group) for group in self.optimizer.param_groups]
            self.optimizer = DeepSpeedCPUAdam(groups, adamw_mode=True)
        self.start_deepspeed(ds_config, COMPUTE_DTYPE)

    def load(self, folder: Path) -> None:
        """`ZeroEngine.load`, then the CPU Adam's bias correction replayed to the loaded step.

        Raises:
            ValueError: DeepSpeed found no checkpoint in `folder`.
        """
        super().load(folder)
        replay_cpu_adam_bias_correction(self.optimizer)


def replay_cpu_adam_bias_correction(optimizer: DeepSpeedCPUAdam) -> None:
    """Rebuild the C++ CPU Adam's running beta1**t and beta2**t after a resume.

    The C++ optimizer keeps them as float products, one multiplication per step, but a fresh
    one computes them with pow() at its first step after a resume. The two differ in the last
    bits, so without this the resumed run drifts from the straight one (DeepSpeed
    csrc/includes/cpu_adam.h, `IncrementStep`). Replaying steps 1..t on empty tensors rebuilds
    the same products and updates nothing.
    """
    steps = [int(state["step"]) for state in optimizer.state.values() if "step" in state]
    if not steps:
        return
    empty = torch.empty(0)
    group = optimizer.param_groups[0]
    beta1, beta2 = group["betas"]
    hyperparameters = (group["lr"], beta1, beta2, group["eps"], group["weight_decay"])
    for step in range(1, max(steps) + 1):
        optimizer.ds_opt_adam.adam_update(
            optimizer.opt_id, step, *hyperparameters, group["bias_correction"], *[empty] * 4
        )
