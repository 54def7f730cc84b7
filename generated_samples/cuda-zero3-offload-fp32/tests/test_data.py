"""Rung 1 of the sanity ladder: one batch of the digits has the shapes and dtypes expected."""

from __future__ import annotations

import dataclasses

import torch

from cuda_zero3_offload_fp32.data import IMAGE_SHAPE, NUM_CLASSES, build_datasets
from cuda_zero3_offload_fp32.loader import make_train_loader


def test_batch_shapes_and_dtypes(config):
    train_set, val_set = build_datasets(config)
    images, labels = next(iter(make_train_loader(train_set, config)))
    assert images.shape == (config.micro_batch_size, *IMAGE_SHAPE)
    assert images.dtype == torch.float32
    assert labels.shape == (config.micro_batch_size,)
    assert labels.dtype == torch.int64
    assert labels.min() >= 0 and labels.max() < NUM_CLASSES
    assert len(train_set) + len(val_set) == 1797
    assert abs(len(val_set) - 1797 * config.val_fraction) <= 1


def test_split_is_fixed_by_the_seed(config):
    first, second = build_datasets(config)[1], build_datasets(config)[1]
    assert torch.equal(first[list(range(len(first)))][0], second[list(range(len(second)))][0])
    other = build_datasets(dataclasses.replace(config, seed=config.seed + 1))[1]
    assert not torch.equal(first.labels, other.labels)
