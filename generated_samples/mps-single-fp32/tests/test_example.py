"""Tests of the example data and model: rung 1 of the sanity ladder (one batch has the shapes
and dtypes expected) and the example's own properties. Yours, like data.py and model.py: change
them together; `scaffold update` leaves this file alone."""

from __future__ import annotations

import dataclasses

import torch

from mps_single_fp32.config import parse_param_count
from mps_single_fp32.data import IMAGE_SHAPE, NUM_CLASSES, build_datasets
from mps_single_fp32.loader import make_train_loader
from mps_single_fp32.model import DigitsCNN, build_model, width_for_param_count
from mps_single_fp32.runtime import init_runtime


def test_batch_shapes_and_dtypes(config):
    train_set, val_set = build_datasets(config)
    images, labels = next(iter(make_train_loader(train_set, config, init_runtime("cpu"))))
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


def parameter_count(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def test_model_is_the_smallest_width_that_reaches_model_size(config):
    target = parse_param_count(config.model_size)
    width = width_for_param_count(target)
    with torch.device("meta"):
        assert parameter_count(build_model(config)) == parameter_count(DigitsCNN(width))
        assert parameter_count(DigitsCNN(width)) >= target
        assert width == 8 or parameter_count(DigitsCNN(width - 8)) < target
