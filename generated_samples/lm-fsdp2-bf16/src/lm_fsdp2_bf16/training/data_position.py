"""Where the data is in its epoch: the train loader's generator state at the epoch's start and
this rank's RNG states, a checkpoint component of its own on every rank.

A resumed run replays the interrupted epoch from the loader generator's state at that epoch's
start, skipping the batches already trained on, then restores the RNG states saved with the
checkpoint: the next batch, its random transforms and the dropout masks are bitwise the ones the
interrupted run would have drawn.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from ..config import Config
from ..loader.dataloaders import epoch_iterator
from .seeding import capture_rng_state, derived_seed, restore_rng_state, seed_all
from .state import TrainState


class DataPosition:
    """This rank's RNG states and the train loader's generator state at the current epoch's
    start: a checkpoint component of its own on every rank (ranks draw differently)."""

    def __init__(self, loader: DataLoader):
        self.loader = loader
        self.epoch_start_state = loader.generator.get_state()
        self.pending_rng: dict[str, Any] | None = None
        self.replay = True  # read the skipped batches again: their random streams are ours
        self.iterator: Iterator | None = None  # the current epoch's, across validations

    def batches_from(self, epoch: int, skip: int) -> Iterator:
        """The current epoch's micro-batches: an iterator `begin_epoch` starts after `skip`
        on the epoch's first call, and the same one, where it left off, until `end_epoch`."""
        if self.iterator is None:
            self.iterator = self.begin_epoch(epoch, skip)
        return self.iterator

    def begin_epoch(self, epoch: int, skip: int) -> Iterator:
        """The batches of `epoch` after the first `skip` (micro-batches already trained on)."""
        iterator = epoch_iterator(self.loader, epoch, self.epoch_start_state, skip, self.replay)
        self.replay = True
        if self.pending_rng is not None:  # after the replay, so replayed reads shift no stream
            restore_rng_state(self.pending_rng)
            self.pending_rng = None
        return iterator

    def batches_after(self, samples: int, world_size: int) -> int:
        """This rank's micro-batches that hold the epoch's first `samples` samples (counted
        over every rank), at this loader's micro-batch and `world_size`: micro-batch b of every
        rank holds the order's samples [b, b + 1) x micro_batch_size x world_size.

        Raises:
            ValueError: `samples` ends inside a micro-batch (not at an optimizer step).
        """
        per_batch = self.loader.sampler.batch_size * world_size
        if samples % per_batch:
            raise ValueError(
                f"the checkpoint's data position ({samples} samples into the epoch) is not a "
                f"whole number of {per_batch}-sample micro-batches; resume it on the process "
                "count that wrote it"
            )
        return min(samples // per_batch, self.batches)

    def start_afresh(self, seed: int, step: int, rank: int) -> None:
        """Carry on without this rank's saved streams (a checkpoint of another world size):
        seed every RNG and the loader generator from `derived_seed(seed, step, rank)`, and let
        the next `begin_epoch` skip the batches trained on without reading them."""
        derived = derived_seed(seed, step, rank)
        seed_all(derived)
        self.epoch_start_state = torch.Generator().manual_seed(derived).get_state()
        self.pending_rng, self.replay = None, False

    @property
    def batches(self) -> int:
        """Micro-batches in one epoch of the training loader."""
        return len(self.loader)

    def close(self) -> None:
        """Let the current epoch's iterator, and any loader workers it keeps, go: the run is
        over (they hold the run folder's lock, which a forked worker shares)."""
        self.iterator = None

    def end_epoch(self) -> None:
        """Record where the next epoch starts; let the finished epoch's iterator (and any
        loader workers it keeps) go."""
        self.epoch_start_state = self.loader.generator.get_state()
        self.iterator = None

    def state_dict(self) -> dict[str, Any]:
        """The live RNG states and the generator state at the epoch's start."""
        return {"rng": capture_rng_state(), "loader_generator": self.epoch_start_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a saved position; the RNG states come back once the epoch is replayed."""
        self.epoch_start_state = state["loader_generator"]
        self.pending_rng = state["rng"]


def starting_state(config: Config, loader: DataLoader, world_size: int) -> TrainState:
    """Where a run over `loader` at `world_size` starts: step 0 of its first epoch, at the
    data position of `loader`, with its step budget and its length in steps (the epochs'
    steps of `grad_accum_steps` micro-batches, or a budget that ends it sooner)."""
    steps_per_epoch = math.ceil(len(loader) / config.grad_accum_steps)
    return TrainState(
        data=DataPosition(loader),
        step_budget=config.step_budget(world_size),
        run_steps=config.run_steps(steps_per_epoch, world_size),
        steps_per_epoch=steps_per_epoch,
    )
