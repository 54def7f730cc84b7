"""The loaders' reproducibility: distinct worker streams, and an exact epoch replay."""

from __future__ import annotations

import dataclasses
import json
import random
import sys

import numpy as np
import torch
from torch.utils.data import BatchSampler, Dataset, DistributedSampler, get_worker_info

from cuda_zero2_bf16.config import Config
from cuda_zero2_bf16.data import build_datasets
from cuda_zero2_bf16.loader import (
    epoch_iterator,
    make_eval_loader,
    make_train_loader,
    set_sampler_epoch,
)
from cuda_zero2_bf16.runtime import init_runtime

import launcher
from conftest import PROJECT_ROOT


class RandomProbe(Dataset):
    """Returns, per batch, the worker id and one draw from each RNG the worker holds."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, indices: list[int]) -> torch.Tensor:
        worker = get_worker_info()
        draws = [torch.rand(()).item(), np.random.rand(), random.random()]
        return torch.tensor([worker.id if worker else -1, *draws], dtype=torch.float64)


def worker_draws(config, epochs: int) -> list[list[list[float]]]:
    """Per epoch, per batch: [worker id, torch draw, numpy draw, random draw]."""
    runtime = init_runtime("cpu")  # samplers of several processes read the process group
    probe_config = dataclasses.replace(config, num_workers=2, micro_batch_size=8)
    loader = make_train_loader(RandomProbe(), probe_config, runtime)
    return [[batch.tolist() for batch in loader] for _ in range(epochs)]


def test_worker_streams_differ_across_workers_and_epochs(config):
    epochs = worker_draws(config, epochs=2)
    assert {row[0] for row in epochs[0]} == {0.0, 1.0}
    for column in (1, 2, 3):  # torch, numpy, random
        values = [row[column] for epoch in epochs for row in epoch]
        assert len(set(values)) == len(values), f"repeated draws in RNG column {column}"


def print_worker_draws() -> None:
    """`worker_draws` of two epochs at the seed given as the first argument, as one JSON line
    (run by the next test in a fresh process)."""
    print(json.dumps(worker_draws(Config(seed=int(sys.argv[1])), epochs=2)))


def test_worker_streams_reproduce_in_a_fresh_process(config):
    result = launcher.run(print_worker_draws, str(config.seed), cwd=PROJECT_ROOT)
    assert result.returncode == 0, result.stderr
    last_line = result.stdout.splitlines()[-1]  # libraries may log to stdout on import
    assert json.loads(last_line) == worker_draws(config, epochs=2)


def test_the_sample_order_depends_on_the_seed_and_epoch_not_the_world_size(config):
    """An optimizer step of 2 micro-batches in one process trains on the very samples that 2
    processes of one micro-batch each do (torch's DistributedSampler over 2 ranks, what a
    multi-process runtime uses): a global batch does not depend on how many processes share
    it."""
    train_set, _ = build_datasets(config)
    loader = make_train_loader(train_set, config, init_runtime("cpu"))
    size = config.micro_batch_size
    for epoch in (0, 1):
        one = [batch for batch in epoch_order(loader, epoch)]
        ranks = [
            list(BatchSampler(rank_sampler(train_set, config.seed, rank, epoch), size, True))
            for rank in (0, 1)
        ]
        for step in range(min(len(ranks[0]), len(one) // 2)):
            two = sorted(ranks[0][step] + ranks[1][step])
            assert sorted(one[2 * step] + one[2 * step + 1]) == two, (epoch, step)
    assert epoch_order(loader, 0) != epoch_order(loader, 1), "each epoch reshuffles"


def epoch_order(loader, epoch: int) -> list[list[int]]:
    """The sample indices of each micro-batch the loader's sampler yields in `epoch`."""
    set_sampler_epoch(loader.sampler.sampler, epoch)
    return list(loader.sampler)


def rank_sampler(dataset: Dataset, seed: int, rank: int, epoch: int) -> DistributedSampler:
    sampler = DistributedSampler(dataset, 2, rank, shuffle=True, seed=seed, drop_last=True)
    sampler.set_epoch(epoch)
    return sampler


def test_epoch_replay_resumes_at_the_same_batch(config):
    train_set, _ = build_datasets(config)
    loader = make_train_loader(train_set, config, init_runtime("cpu"))
    start_state = loader.generator.get_state()
    torch.manual_seed(0)  # random transforms in the main process draw from the global RNG
    straight = list(epoch_iterator(loader, 0, start_state, skip=0))
    torch.manual_seed(0)
    rng_after_five = None
    for index, _ in enumerate(epoch_iterator(loader, 0, start_state, skip=0)):
        if index == 4:
            rng_after_five = torch.get_rng_state()
            break
    resumed = epoch_iterator(loader, 0, start_state, skip=5)
    torch.set_rng_state(rng_after_five)  # what a resume does after replaying
    for expected, actual in zip(straight[5:], resumed, strict=True):
        assert torch.equal(expected[0], actual[0]) and torch.equal(expected[1], actual[1])


def test_a_validation_leaves_the_training_random_streams_as_they_were(config):
    """A run stopped where a validation is due validates first when it resumes, before the
    saved streams come back: a validation that drew from them would change every later
    dropout mask of the resumed run against the straight one."""
    _, val_set = build_datasets(config)
    loader = make_eval_loader(val_set, config, init_runtime("cpu"))
    torch.manual_seed(0)
    before = torch.get_rng_state()
    for _ in range(2):
        next(iter(loader))
    assert torch.equal(torch.get_rng_state(), before)


def test_workers_start_from_a_forkserver_once_a_process_group_exists(config):
    """A fork taken beside a process group's communication threads can copy a held lock into
    the worker, which then blocks for good; without a group a plain fork is safe and quicker."""
    probe_config = dataclasses.replace(config, num_workers=2)
    loader = make_train_loader(RandomProbe(), probe_config, init_runtime("cpu"))
    context = loader.multiprocessing_context
    method = context.get_start_method() if context is not None else None
    assert method == ("forkserver" if torch.distributed.is_initialized() else None)
