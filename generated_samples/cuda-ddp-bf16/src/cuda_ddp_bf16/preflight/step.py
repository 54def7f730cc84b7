"""The preflight's rehearsal: one optimizer step at micro-batch 1 on the real model, built on
meta and materialised by the engine as a run does, then a checkpoint written, the weights moved
by a second step, and the checkpoint loaded back. Every stage is the run's own code
(`Trainer`, `train_step`, `CheckpointManager`)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from ..checkpoint.store import find_latest
from ..config import Config
from ..engine.strategy import Engine
from ..loader import model_inputs
from ..runtime import Runtime
from ..task import loss_fn
from ..train import Trainer, train_step

# Steps tried to move the weights after the save: a loss scaler skips its first steps while it
# lowers the scale (each skip halves it).
MOST_MOVING_STEPS = 8


def rehearsal_config(config: Config, folder: Path) -> Config:
    """`config` at micro-batch 1 without accumulation, writing into `folder`, with nothing
    written besides its checkpoints (no TensorBoard, tracker, plot or profile) and no loader
    workers."""
    quiet = {"tensorboard": False, "logger": "none", "plot": False, "profile_steps": ""}
    batch = {"micro_batch_size": 1, "grad_accum_steps": 1, "num_workers": 0}
    return dataclasses.replace(config, run_dir=str(folder), **quiet, **batch)


def _synchronize(runtime: Runtime) -> None:
    if runtime.device.type == "cuda":
        torch.cuda.synchronize(runtime.device)


def probe_loss(engine: Engine, batch: Any) -> float:
    """The loss of `batch` under the current weights, in eval mode (no dropout)."""
    inputs = model_inputs(batch[0], engine.runtime.device)
    targets = batch[1].to(engine.runtime.device)
    engine.module.eval()
    with engine.inference(), engine.autocast():
        loss = loss_fn(engine.module(*inputs), targets).float().item()
    engine.module.train()
    return loss


def rehearse(config: Config, runtime: Runtime, folder: Path) -> dict[str, Any]:
    """Run the rehearsal in `folder` (empty; removed by the caller) and return its figures:
    `step_seconds`, `save_seconds`, `load_seconds`, `peak_bytes` (the device's allocated peak
    in the first step; 0 off CUDA), and the probe losses `saved`, `moved` (after the steps
    that followed the save) and `loaded`
    (after the load: equal to `saved` when the round trip restored the weights). A collective:
    every rank calls it.

    Raises:
        What the run would raise: out of memory, a set-up error, a failed save or load.
    """
    trainer = Trainer(rehearsal_config(config, folder), runtime)
    engine, scheduler, checkpoints = trainer.engine, trainer.scheduler, trainer.checkpoints
    try:
        batches = iter(trainer.train_loader)
        probe = next(batches)
        if runtime.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(runtime.device)
        start = time.perf_counter()
        train_step(engine, scheduler, iter([probe]), 1, config.max_grad_norm)
        _synchronize(runtime)
        step_seconds = time.perf_counter() - start
        on_cuda = runtime.device.type == "cuda"
        peak = torch.cuda.max_memory_allocated(runtime.device) if on_cuda else 0
        saved = probe_loss(engine, probe)
        trainer.state.advance(1)
        start = time.perf_counter()
        checkpoints.save(trainer.state.step, is_best=False)
        checkpoints.wait()
        save_seconds = time.perf_counter() - start
        moved = saved
        for _ in range(MOST_MOVING_STEPS):
            train_step(engine, scheduler, batches, 1, config.max_grad_norm)
            if (moved := probe_loss(engine, probe)) != saved:
                break
        start = time.perf_counter()
        checkpoints.restore(find_latest(checkpoints.directory))
        _synchronize(runtime)
        load_seconds = time.perf_counter() - start
        loaded = probe_loss(engine, probe)
    finally:
        checkpoints.close()
    figures = {"step_seconds": step_seconds, "save_seconds": save_seconds}
    figures |= {"load_seconds": load_seconds, "peak_bytes": peak}
    return figures | {"saved": saved, "moved": moved, "loaded": loaded}


def rehearse_or_error(config: Config, runtime: Runtime, folder: Path) -> dict[str, Any]:
    """`rehearse`'s figures, or {"error": "<type>: <message>"} with what it raised: what the
    run would die of, reported in the table rather than raised."""
    try:
        return rehearse(config, runtime, folder)
    except Exception as error:
        return {"error": f"{type(error).__name__}: {str(error).strip()[:300]}"}
