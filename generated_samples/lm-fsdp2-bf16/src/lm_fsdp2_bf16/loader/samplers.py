"""Which samples each process reads, in which order: the same for any number of processes.

The training order is a shuffle of the seed and the epoch alone, whatever the world size, of
which rank r takes positions r, r + world_size, ... (a one-process run trains on the same global
batches as N processes; MosaicML Streaming calls this elastic determinism). Validation gives
every sample to exactly one rank.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from torch.utils.data import Dataset, DistributedSampler, Sampler

from ..runtime import Runtime


def train_sampler(dataset: Dataset, seed: int, runtime: Runtime) -> Sampler:
    """This rank's share of a shuffle seeded by `seed` and the epoch (`set_sampler_epoch`).
    The tail that does not divide by the world size is dropped, so every rank runs the same
    number of steps."""
    return DistributedSampler(
        dataset, runtime.world_size, runtime.rank, shuffle=True, seed=seed, drop_last=True
    )


class ShardSampler(Sampler[int]):
    """Indices rank, rank + world_size, ...: every sample exactly once over all ranks.

    DistributedSampler pads the last shard with repeated samples, which would count some
    validation samples twice.
    """

    def __init__(self, dataset: Dataset, rank: int, world_size: int):
        self.indices = range(rank, len(dataset), world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def eval_sampler(dataset: Dataset, runtime: Runtime) -> Sampler:
    """This rank's shard of the validation set, without padding (all of it, in order, on one
    process)."""
    return ShardSampler(dataset, runtime.rank, runtime.world_size)


def most_eval_batches(dataset: Dataset, micro_batch_size: int, runtime: Runtime) -> int:
    """The number of validation batches of the process that has the most: rank 0's
    `ceil(len / world_size)` samples (`ShardSampler`), in batches of `micro_batch_size`."""
    return math.ceil(math.ceil(len(dataset) / runtime.world_size) / micro_batch_size)


def set_sampler_epoch(sampler: Sampler, epoch: int) -> None:
    """Reshuffle for `epoch`: without it every epoch repeats the same order."""
    sampler.set_epoch(epoch)
