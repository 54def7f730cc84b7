"""Seeded, resumable DataLoaders over datasets that read a whole batch per `dataset[indices]`."""

from __future__ import annotations

import atexit
import itertools
import multiprocessing
import random
import signal
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import BatchSampler, DataLoader, Dataset

from ..config import Config
from ..runtime import STOP_SIGNALS, WORKER_CONTEXT, Runtime
from .samplers import eval_sampler, most_eval_batches, set_sampler_epoch, train_sampler


def model_inputs(inputs: Tensor | tuple[Tensor, ...], device: torch.device) -> tuple[Tensor, ...]:
    """A batch's inputs as the model's positional arguments, on `device`: a tensor is the one
    argument; a tuple (a dataset whose model takes several inputs) gives one each."""
    parts = inputs if isinstance(inputs, tuple | list) else (inputs,)
    return tuple(part.to(device, non_blocking=True) for part in parts)


def seed_worker(worker_id: int) -> None:
    """`worker_init_fn`: seed numpy and `random` from this worker's torch seed.

    DataLoader seeds each worker's torch RNG with `base_seed + worker_id`, and draws `base_seed`
    from the loader's generator at every `iter()`, so streams differ per worker and per epoch.
    Seeding numpy and `random` from it keeps random transforms written with them just as distinct
    (pytorch.org/docs/stable/notes/randomness.html#dataloader). Workers ignore the stop signals:
    a scheduler signals every process of the job, and a worker that died of it would fail the
    step the training process is finishing before it checkpoints.
    """
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)
    for number in STOP_SIGNALS:  # the training process decides when to stop; workers follow
        signal.signal(number, signal.SIG_IGN)


def stop_workers_at_exit() -> None:
    """Kill the DataLoader workers of this process still alive at its exit (registered with
    `atexit`). They ignore the stop signals (`seed_worker`), and multiprocessing's own exit
    handler ends daemonic children with SIGTERM and then joins them: a run that left its loader
    mid-epoch (a stop signal, an inf/NaN, any error) would wait at exit for good."""
    for child in multiprocessing.active_children():
        if child.daemon:
            child.kill()
            child.join()


# atexit runs its handlers last registered first: this one before multiprocessing's, which
# importing torch registered already.
atexit.register(stop_workers_at_exit)


class SkippingBatchSampler(BatchSampler):
    """A BatchSampler whose next iteration starts `skip` batches in (then `skip` is 0 again):
    the skipped batches' indices are drawn, their samples never read."""

    skip = 0

    def __iter__(self) -> Iterator[list[int]]:
        skip, self.skip = self.skip, 0
        return itertools.islice(super().__iter__(), skip, None)


def make_train_loader(dataset: Dataset, config: Config, runtime: Runtime) -> DataLoader:
    """Shuffled loader of this process's `micro_batch_size` batches (last partial one dropped).

    The order is `train_sampler`'s (samplers.py): a shuffle of the seed and the epoch alone,
    whatever the world size, of which each rank takes its slice. One `torch.Generator` seeded with
    `config.seed + rank` drives the workers' base seeds, so ranks draw different random
    streams; `epoch_iterator` restores it to replay an epoch exactly. Workers are not
    persistent: a persistent worker's RNG would carry over epochs and could not be replayed.
    Batches are pinned for asynchronous copies to a GPU.

    Raises:
        ValueError: not one whole batch per process (`micro_batch_size` too large).
    """
    generator = torch.Generator().manual_seed(config.seed + runtime.rank)
    sampler = SkippingBatchSampler(
        train_sampler(dataset, config.seed, runtime), config.micro_batch_size, drop_last=True
    )
    if len(sampler) == 0:
        raise ValueError(
            f"micro_batch_size={config.micro_batch_size} exceeds the {len(dataset)} training "
            "samples of a process; lower micro_batch_size"
        )
    return DataLoader(
        dataset,
        sampler=sampler,
        batch_size=None,  # the sampler yields whole batches; the dataset reads them at once
        num_workers=config.num_workers,
        worker_init_fn=seed_worker,
        generator=generator,
        pin_memory=runtime.device.type == "cuda",
        multiprocessing_context=WORKER_CONTEXT if config.num_workers > 0 else None,
    )


def make_eval_loader(dataset: Dataset, config: Config, runtime: Runtime) -> DataLoader:
    """Validation loader: this process's share, each sample once (the last batch may be smaller).

    Raises:
        ValueError: the validation split is empty.
    """
    if len(dataset) == 0:
        raise ValueError("the validation split is empty; raise val_fraction or the data size")
    sampler = BatchSampler(eval_sampler(dataset, runtime), config.micro_batch_size, drop_last=False)
    # Each pass over a DataLoader draws a seed from its generator, from the global RNG where it
    # has none: a validation would move the stream the next dropout masks come from, and a
    # resume, which validates before it restores the saved streams, would train on others.
    generator = torch.Generator().manual_seed(config.seed)
    return DataLoader(
        dataset,
        sampler=sampler,
        batch_size=None,
        pin_memory=runtime.device.type == "cuda",
        generator=generator,
    )


def padded_batches(
    loader: DataLoader, runtime: Runtime, limit: int = 0
) -> Iterator[tuple[Any, Any, bool]]:
    """`(inputs, targets, counted)` for each of this rank's validation batches (its first
    `limit` where `limit` > 0), then the loader's first sample again (`counted` False) until
    every rank has had as many passes as the rank with the most batches
    (`most_eval_batches`): a sharded model gathers its parameters in forward (a collective),
    so a rank with fewer batches would leave the others waiting for good. Only `counted`
    batches may add to the metrics."""
    batches = most_eval_batches(loader.dataset, loader.sampler.batch_size, runtime)
    batches = min(batches, limit) if limit > 0 else batches
    real = iter(loader)
    for _ in range(batches):
        batch = next(real, None)
        yield (*loader.dataset[[0]], False) if batch is None else (*batch, True)


def epoch_iterator(
    loader: DataLoader, epoch: int, generator_state: Tensor, skip: int, replay: bool = True
) -> Iterator:
    """Start `epoch` from the loader generator's state at that epoch's start; skip `skip` batches.

    With `replay`, skipping reads the batches, so workers' random streams are replayed too and
    the next batch is bitwise the one the interrupted run would have read. Without (a resume
    whose random streams start afresh), the sampler starts `skip` batches in and nothing
    skipped is read (`SkippingBatchSampler`).
    """
    set_sampler_epoch(loader.sampler.sampler, epoch)
    if hasattr(loader.dataset, "set_epoch"):  # samples that differ by epoch (seeded draws)
        loader.dataset.set_epoch(epoch)  # before iter(): the workers it starts copy the dataset
    loader.generator.set_state(generator_state)
    if not replay:
        loader.sampler.skip = skip
        return iter(loader)
    iterator = iter(loader)
    for _ in range(skip):
        next(iterator)
    return iterator


class TimedIterator:
    """Wraps an iterator and adds the seconds spent waiting in `next()` to `totals[key]`."""

    def __init__(self, iterator: Iterator, totals: dict[str, float], key: str):
        self.iterator, self.totals, self.key = iterator, totals, key

    def __iter__(self) -> TimedIterator:
        return self

    def __next__(self) -> Any:
        start = time.perf_counter()
        try:
            return next(self.iterator)
        finally:
            self.totals[self.key] += time.perf_counter() - start
