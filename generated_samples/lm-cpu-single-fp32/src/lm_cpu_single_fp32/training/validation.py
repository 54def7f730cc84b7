"""The validation pass: the task's metrics over every validation sample of every rank, each
counted once (the last batches padded so that every rank runs as many forward passes)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

import torch

from ..config import Config
from ..engine.strategy import Engine
from ..loader.dataloaders import model_inputs, padded_batches
from ..runtime import Runtime, all_reduce_sum
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


class TaskEvaluation(Protocol):
    """A task's own measurement between validations (its config's `task_evaluation` hook):
    due at some optimizer steps and at a run's last (`final`), it runs on the engine in every
    process and returns its figures (the same in every process)."""

    def due(self, step: int, final: bool = False) -> bool: ...

    def measure(self, engine: Engine, step: int) -> dict[str, Any]: ...


def task_evaluation(config: Config, runtime: Runtime, step: int) -> TaskEvaluation | None:
    """The config's `task_evaluation(runtime, step)` hook's evaluation for a launch that starts
    at optimizer step `step` (None: the task has none, or it is switched off); the run log
    runs it (report/run_log.py)."""
    hook = getattr(config, "task_evaluation", None)  # an optional hook of the task's
    return None if hook is None else hook(runtime, step)
