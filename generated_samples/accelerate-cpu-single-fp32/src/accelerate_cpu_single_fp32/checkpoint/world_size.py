"""A resume on another number of processes (`allow_world_size_change`): the config fitted to
the checkpoint before anything is built, keeping its global batch split the way scaffold's
planner splits a batch (`split_global_batch`), or the one-line refusal where the config does
not allow it.

The epoch's order (a shuffle of the seed and the epoch alone, the same at every world size)
continues after the sequences already trained on: none twice, none skipped. The per-rank random
streams cannot be carried over; they are derived afresh from the seed, the step and the rank
(`training.seeding.derived_seed`). An epoch drops the last samples that do not fill a
micro-batch on every rank: with another micro-batch x world size, that tail may hold fewer or
more samples (less than one micro-batch per rank).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ..config import Config
from .store import Checkpoint, find_latest

# A resume on another world size keeps their product with it, the global batch, instead.
BATCH_SPLIT = ("micro_batch_size", "grad_accum_steps")


def split_global_batch(global_batch: int, world_size: int, max_micro_batch: int) -> tuple[int, int]:
    """(micro_batch_size, grad_accum_steps) that give `global_batch` samples per optimizer step
    over `world_size` processes, as scaffold's planner splits a batch: the largest divisor of
    the per-process samples that is at most `max_micro_batch` (the largest that fits), and the
    accumulation that makes up the rest.

    Raises:
        ValueError: `global_batch` does not divide by `world_size`.
    """
    if global_batch % world_size:
        raise ValueError(
            f"the run's global batch of {global_batch} samples does not divide among "
            f"{world_size} processes; launch a number of processes that divides {global_batch}"
        )
    per_process = global_batch // world_size
    micro = max(d for d in range(1, min(per_process, max_micro_batch) + 1) if per_process % d == 0)
    return micro, per_process // micro


@dataclass(frozen=True)
class WorldSizeChange:
    """A resume on `world_size` processes of a checkpoint written by `saved_world_size` at
    optimizer step `step`; each process now runs `grad_accum_steps` micro-batches of
    `micro_batch_size` per step, so the global batch is the checkpoint's."""

    step: int
    saved_world_size: int
    world_size: int
    micro_batch_size: int
    grad_accum_steps: int

    def describe(self) -> str:
        """One line for the log and the notice."""
        return (
            f"world size {self.saved_world_size} -> {self.world_size} at step {self.step} "
            f"(per process: micro-batch {self.micro_batch_size} x {self.grad_accum_steps} "
            "accumulation steps; the same global batch, another reduction order, new per-rank "
            "random streams)"
        )


def saved_global_batch(checkpoint: Checkpoint) -> int:
    """Samples per optimizer step of the run that wrote `checkpoint`, over all its processes."""
    saved = checkpoint.state["config"]
    return saved["micro_batch_size"] * saved["grad_accum_steps"] * len(checkpoint.state["ranks"])


def world_size_refusal(checkpoint: Checkpoint, config: Config, world_size: int) -> str | None:
    """Why this run may not continue `checkpoint` on `world_size` processes, or None (the
    same world size, or a change the config allows)."""
    saved_world = len(checkpoint.state["ranks"])
    if saved_world == world_size or config.allow_world_size_change:
        return None
    return (
        f"{checkpoint.folder} was written by {saved_world} process(es) and this run has "
        f"{world_size}; launch {saved_world}, or add --allow-world-size-change to continue "
        f"on {world_size} with the same global batch (the numerics change slightly)"
    )


def fit_to_checkpoint(config: Config, world_size: int, resume: bool) -> Config:
    """The config this run continues its latest checkpoint with. Reads files only: call it
    before anything is built. With `allow_world_size_change`, the checkpoint's global batch is
    kept: on another world size split anew (`split_global_batch`, at most the config's
    `micro_batch_size` per micro-batch), on the same one as the checkpoint split it. Else, or
    without `resume` or a checkpoint, `config` as it is.

    Raises:
        ValueError: the world size changed and `allow_world_size_change` is off (the message
            says what to do); the global batch does not divide by the world size.
    """
    latest = find_latest(Path(config.run_dir) / "checkpoints") if resume else None
    if latest is None:
        return config
    if reason := world_size_refusal(latest, config, world_size):
        raise ValueError(reason)
    if not config.allow_world_size_change:
        return config
    if len(latest.state["ranks"]) == world_size:
        saved = latest.state["config"]
        return dataclasses.replace(config, **{key: saved[key] for key in BATCH_SPLIT})
    global_batch = saved_global_batch(latest)
    micro, accumulation = split_global_batch(global_batch, world_size, config.micro_batch_size)
    return dataclasses.replace(config, micro_batch_size=micro, grad_accum_steps=accumulation)
