"""AdamW with no weight decay on biases and norm weights; linear warmup then cosine decay."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from ..config import Config


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: weights with ndim >= 2 decay; biases and norm weights (ndim 1) do not.

    Decaying biases and LayerNorm/GroupNorm gains only pulls them towards zero with no
    regularising benefit (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", 2019;
    the ndim rule as in nanoGPT's `configure_optimizers`).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, config: Config) -> torch.optim.AdamW:
    """AdamW at the peak `lr` with the two groups of `parameter_groups`; fused when every
    parameter is on a CUDA device (one kernel for all parameters, the fastest implementation
    there: torch.optim.AdamW's docs), PyTorch's default implementation elsewhere. Build it
    after the model is on its device."""
    groups = parameter_groups(model, config.weight_decay)
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
    (Loshchilov & Hutter, 2017, "SGDR"). A plain object, so its state saves with `weights_only`.
    """

    def __init__(self, warmup_steps: int, total_steps: int, min_ratio: float):
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.min_ratio = min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, config: Config, total_steps: int) -> LambdaLR:
    """Warmup + cosine over `total_steps` optimizer steps; `.step()` once per optimizer step."""
    return LambdaLR(optimizer, WarmupCosine(config.warmup_steps, total_steps, config.min_lr_ratio))


def respan(scheduler: LambdaLR, total_steps: int) -> None:
    """Make `scheduler`'s warmup + cosine (`build_scheduler`'s) span `total_steps` optimizer
    steps from now on, the steps taken keeping their place: a run whose length in steps
    changed (it went on with other data)."""
    scheduler.lr_lambdas[0].total_steps = total_steps
