"""The validation pass: the task's metrics over every validation sample of every rank, each
counted once (the last batches padded so that every rank runs as many forward passes)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from ..engine.strategy import Engine
from ..loader.dataloaders import model_inputs, padded_batches
from ..runtime import all_reduce_sum
from ..task import SUMS, eval_sums, validation_metrics


def evaluate(
    engine: Engine, loader: Iterable, max_batches: int, between_batches: Callable[[], None]
) -> dict:
    """The task's validation METRICS from the sums `eval_sums` gives, SUMS and any of its
    `extra` after them (counts per class, say), over every sample of every rank (of each
    rank's first `max_batches` batches where it is > 0: the same samples at every
    validation), in as many passes on every rank (`padded_batches`); `between_batches()`
    precedes each."""
    device, sums = engine.runtime.device, None
    engine.module.eval()  # dropout off
    with engine.inference():
        for inputs, targets, counted in padded_batches(loader, engine.runtime, max_batches):
            between_batches()
            with engine.autocast():
                logits = engine.module(*model_inputs(inputs, device))
            batch_sums = eval_sums(logits, targets.to(device))
            sums = torch.zeros_like(batch_sums) if sums is None else sums  # every rank has one
            if counted:
                sums += batch_sums
    engine.module.train()
    totals = all_reduce_sum(sums, engine.runtime).tolist()
    named = dict(zip(SUMS, totals, strict=False))  # the sums past SUMS: the task's `extra`
    return validation_metrics(named | {"extra": totals[len(SUMS) :]})
