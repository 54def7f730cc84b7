"""Seeded, resumable DataLoaders over datasets that read a whole batch per `dataset[indices]`."""

from __future__ import annotations

import multiprocessing
import random
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import BatchSampler, DataLoader, Dataset

from .config import Config
from .parallel import eval_sampler, set_sampler_epoch, train_sampler


def worker_start_method() -> str | None:
    """How DataLoader workers start: from a clean forkserver process once this process has a
    process group, else by the platform's default (a plain fork on Linux, the quickest).

    A fork taken while one of the group's gloo or NCCL threads holds a lock leaves the worker
    blocked for good (seen with ZeRO-3 offload on CPU: the first resumed epoch never got its
    batch). Python 3.14 made forkserver the Linux default for this reason.
    """
    grouped = torch.distributed.is_available() and torch.distributed.is_initialized()
    forkserver = "forkserver" in multiprocessing.get_all_start_methods()
    return "forkserver" if grouped and forkserver else None


def seed_worker(worker_id: int) -> None:
    """`worker_init_fn`: seed numpy and `random` from this worker's torch seed.

    DataLoader seeds each worker's torch RNG with `base_seed + worker_id`, and draws `base_seed`
    from the loader's generator at every `iter()`, so streams differ per worker and per epoch.
    Seeding numpy and `random` from it keeps augmentation written with them just as distinct
    (pytorch.org/docs/stable/notes/randomness.html#dataloader).
    """
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)


def make_train_loader(
    dataset: Dataset, config: Config, rank: int = 0, pin_memory: bool = False
) -> DataLoader:
    """Shuffled loader of this process's `micro_batch_size` batches (last partial one dropped).

    One `torch.Generator` seeded with `config.seed + rank` drives the workers' base seeds, so
    ranks draw different augmentations (and the shuffle, unless the strategy's sampler shuffles
    by seed and epoch, the same on every rank); `epoch_iterator` restores it to replay an epoch
    exactly. Workers are not persistent: a persistent worker's RNG would carry over epochs and
    could not be replayed.
    """
    generator = torch.Generator().manual_seed(config.seed + rank)
    sampler = BatchSampler(
        train_sampler(dataset, config.seed, generator), config.micro_batch_size, drop_last=True
    )
    return DataLoader(
        dataset,
        sampler=sampler,
        batch_size=None,  # the sampler yields whole batches; the dataset reads them at once
        num_workers=config.num_workers,
        worker_init_fn=seed_worker,
        generator=generator,
        pin_memory=pin_memory,
        multiprocessing_context=worker_start_method() if config.num_workers > 0 else None,
    )


def make_eval_loader(dataset: Dataset, config: Config, pin_memory: bool = False) -> DataLoader:
    """Validation loader: this process's share, each sample once (the last batch may be smaller)."""
    sampler = BatchSampler(eval_sampler(dataset), config.micro_batch_size, drop_last=False)
    return DataLoader(dataset, sampler=sampler, batch_size=None, pin_memory=pin_memory)


def epoch_iterator(loader: DataLoader, epoch: int, generator_state: Tensor, skip: int) -> Iterator:
    """Start `epoch` from the loader generator's state at that epoch's start; skip `skip` batches.

    Skipping reads the batches (not just offsets the sampler), so workers' random streams are
    replayed too and the next batch is bitwise the one the interrupted run would have read.
    """
    set_sampler_epoch(loader.sampler.sampler, epoch)
    loader.generator.set_state(generator_state)
    iterator = iter(loader)
    for _ in range(skip):
        next(iterator)
    return iterator


class TimedIterator:
    """Wraps an iterator and adds the seconds spent waiting in `next()` to `self.seconds`."""

    def __init__(self, iterator: Iterator):
        self.iterator = iterator
        self.seconds = 0.0

    def __iter__(self) -> TimedIterator:
        return self

    def __next__(self) -> Any:
        start = time.perf_counter()
        try:
            return next(self.iterator)
        finally:
            self.seconds += time.perf_counter() - start
