"""Rungs 2 and 3 of the sanity ladder: initial loss matches theory; one batch can be memorised."""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import torch

from cuda_zero1_bf16.config import parse_param_count
from cuda_zero1_bf16.data import NUM_CLASSES, build_datasets
from cuda_zero1_bf16.model import build_model, count_parameters, eval_sums, loss_fn
from cuda_zero1_bf16.optim import build_optimizer, build_scheduler
from cuda_zero1_bf16.parallel import init_runtime, wrap_model
from cuda_zero1_bf16.precision import PrecisionPolicy
from cuda_zero1_bf16.train import seed_everything, train_step


def one_batch(config, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    _, val_set = build_datasets(config)
    return val_set[list(range(min(size, len(val_set))))]


def test_initial_loss_is_ln_num_classes(config):
    seed_everything(config.seed)
    model = build_model(config).eval()
    inputs, targets = one_batch(config, 256)
    with torch.no_grad():
        loss = loss_fn(model(inputs), targets).item()
    assert abs(loss - math.log(NUM_CLASSES)) < 0.15, loss


def test_eval_sums_stay_on_the_logits_device(config):
    """A sum built on the CPU beside CUDA logits fails the first validation on a GPU; the meta
    device shows the same mismatch on a CPU-only machine."""
    inputs, targets = one_batch(config, 4)
    with torch.no_grad():
        logits = build_model(config)(inputs)
    sums = eval_sums(logits.to("meta"), targets.to("meta"))
    assert sums.device.type == "meta" and sums.shape == (3,)


def test_overfits_one_batch(config):
    config = dataclasses.replace(config, dropout=0.0, warmup_steps=10, weight_decay=0.0)
    seed_everything(config.seed)
    device = torch.device("cpu")
    precision = PrecisionPolicy(device)
    trained, optimizer = wrap_model(
        build_model(config), partial(build_optimizer, config=config), init_runtime("cpu"),
        precision, config,
    )  # fmt: skip
    steps = 250
    scheduler = build_scheduler(optimizer, config, total_steps=steps)
    batch = one_batch(config, 8)  # the seeds: a model that cannot memorise 8 examples has a bug
    for _ in range(steps):
        loss, _ = train_step(
            trained, [batch], 1, optimizer, scheduler, precision, device, config.max_grad_norm
        )
    assert loss.item() < 0.05, loss.item()


def test_model_is_sized_from_model_size(config):
    target = parse_param_count(config.model_size)
    params = count_parameters(build_model(config))
    assert target <= params < 1.5 * target, (target, params)


def test_parse_param_count():
    assert parse_param_count("100K") == 100_000
    assert parse_param_count("1.5m") == 1_500_000
    assert parse_param_count("7B") == 7_000_000_000
    assert parse_param_count("4096") == 4096
