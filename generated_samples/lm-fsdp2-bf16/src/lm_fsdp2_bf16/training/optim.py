"""AdamW with no weight decay on biases and norm weights; linear warmup then cosine decay; a
task's parameters at a rate of their own (`task_lr_scale`)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from ..config import Config


def parameter_groups(
    model: nn.Module, weight_decay: float, lr: float, scales: Callable | None = None
) -> list[dict]:
    """AdamW groups: weights with ndim >= 2 decay; biases and norm weights (ndim 1) do not.

    Decaying biases and LayerNorm/GroupNorm gains only pulls them towards zero with no
    regularising benefit (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", 2019;
    the ndim rule as in nanoGPT's `configure_optimizers`).

    `scales(name) -> (lr factor, frozen epochs)` (the task's `task_lr_scale`, where it has one)
    gives parameters a peak rate of their own and epochs at a rate of 0 (a pretrained part
    fine-tuned slower than a new one, and held still at first: discriminative fine-tuning and
    gradual unfreezing, Howard & Ruder, "Universal Language Model Fine-tuning", 2018). Each
    (factor, epochs) pair gets its two groups, with `lr` = `lr` x factor and `frozen_epochs`
    where they are not (1, 0); the (1, 0) pair's groups carry neither key, as before (a
    sharded checkpoint's optimizer state lists every key of every group).
    """
    groups: dict[tuple[float, int, bool], dict] = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        scale, frozen = scales(name) if scales else (1.0, 0)
        for decays in (True, False):  # both groups of a pair, in this order
            group = {"params": [], "weight_decay": weight_decay if decays else 0.0}
            if (scale, frozen) != (1.0, 0):  # the default groups keep their checkpoints' keys
                group |= {"lr": lr * scale, "frozen_epochs": frozen}
            groups.setdefault((scale, frozen, decays), group)
        groups[(scale, frozen, parameter.ndim >= 2)]["params"].append(parameter)
    return list(groups.values())


def build_optimizer(model: nn.Module, config: Config) -> torch.optim.AdamW:
    """AdamW at the peak `lr` with the two groups of `parameter_groups`; fused when every
    parameter is on a CUDA device (one kernel for all parameters, the fastest implementation
    there: torch.optim.AdamW's docs), PyTorch's default implementation elsewhere. Build it
    after the model is on its device."""
    scales = getattr(config, "task_lr_scale", None)  # an optional hook of the task's
    groups = parameter_groups(model, config.weight_decay, config.lr, scales)
    on_cuda = all(p.is_cuda for group in groups for p in group["params"])
    return torch.optim.AdamW(
        groups,
        lr=config.lr,
        betas=(config.beta1, config.beta2),
        fused=True if on_cuda else None,
    )


class WarmupCosine:
    """LR multiplier per optimizer step: linear warmup to 1, then cosine decay to `min_ratio`.

    `factor(step)` for 0-based optimizer steps: (step + 1) / (warmup + 1) while step < warmup
    (Goyal et al., 2017, "Accurate, Large Minibatch SGD"), then
    min_ratio + (1 - min_ratio) * (1 + cos(pi * progress)) / 2 with progress in [0, 1]
    (Loshchilov & Hutter, 2017, "SGDR"); 0 for the first `frozen_steps` (a group held still,
    which then takes up the schedule where it is). A plain object, so its state saves with
    `weights_only`.
    """

    frozen_steps = 0  # a checkpoint of an earlier version saved none

    def __init__(
        self, warmup_steps: int, total_steps: int, min_ratio: float, frozen_steps: int = 0
    ):
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.min_ratio = min_ratio
        self.frozen_steps = frozen_steps

    def __call__(self, step: int) -> float:
        if step < self.frozen_steps:
            return 0.0
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: Config, total_steps: int, steps_per_epoch: int = 0
) -> LambdaLR:
    """Warmup + cosine over `total_steps` optimizer steps, one multiplier per parameter group,
    a group's `frozen_epochs` (parameter_groups) held at 0 for that many epochs of
    `steps_per_epoch`; `.step()` once per optimizer step."""
    factors = [
        WarmupCosine(
            config.warmup_steps,
            total_steps,
            config.min_lr_ratio,
            group.get("frozen_epochs", 0) * steps_per_epoch,
        )
        for group in optimizer.param_groups
    ]
    return LambdaLR(optimizer, factors)


def respan(scheduler: LambdaLR, total_steps: int) -> None:
    """Make `scheduler`'s warmup + cosine (`build_scheduler`'s) span `total_steps` optimizer
    steps from now on, the steps taken keeping their place: a run whose length in steps
    changed (it went on with other data)."""
    for factor in scheduler.lr_lambdas:
        factor.total_steps = total_steps
