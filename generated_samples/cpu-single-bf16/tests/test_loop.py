"""The optimizer step: gradient accumulation and clipping of unscaled gradients."""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch.optim.lr_scheduler import LambdaLR

from cpu_single_bf16.data import build_datasets
from cpu_single_bf16.model import build_model, loss_fn
from cpu_single_bf16.parallel import init_runtime, wrap_model
from cpu_single_bf16.precision import PrecisionPolicy
from cpu_single_bf16.train import seed_everything, train_step

CPU = torch.device("cpu")
NO_CLIP = 1e9


def gradients_after_step(model, micro_batches, precision=None):
    """Run one train_step with a zero-LR SGD (parameters stay put) and return the gradients.

    The model is wrapped as train.py wraps it, so the strategy's gradient sync is under test.
    """
    precision = precision or PrecisionPolicy(CPU)
    trained = wrap_model(model, init_runtime("cpu"), precision)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scheduler = LambdaLR(optimizer, lambda step: 1.0)
    _, grad_norm = train_step(
        trained, micro_batches, len(micro_batches), optimizer, scheduler, precision, CPU, NO_CLIP
    )
    return [p.grad.clone() for p in model.parameters()], grad_norm


def tolerance(precision: PrecisionPolicy) -> dict[str, float]:
    return (
        {"rtol": 1e-4, "atol": 1e-6} if precision.name == "fp32" else {"rtol": 0.05, "atol": 2e-3}
    )


def test_accumulated_micro_batches_equal_one_big_batch(config):
    config = dataclasses.replace(config, dropout=0.0)
    seed_everything(config.seed)
    model = build_model(config)
    _, val_set = build_datasets(config)
    inputs, targets = val_set[list(range(64))]
    micro = [(inputs[i : i + 16], targets[i : i + 16]) for i in range(0, 64, 16)]
    precision = PrecisionPolicy(CPU)
    accumulated, _ = gradients_after_step(copy.deepcopy(model), micro, precision)
    whole, _ = gradients_after_step(copy.deepcopy(model), [(inputs, targets)], precision)
    for a, b in zip(accumulated, whole, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, **tolerance(precision))


def test_clipping_sees_the_true_gradient_norm(config):
    """Under fp16 the norm must be taken after unscale_; a scaled norm would be ~65536x larger."""
    config = dataclasses.replace(config, dropout=0.0)
    seed_everything(config.seed)
    model = build_model(config)
    _, val_set = build_datasets(config)
    batch = val_set[list(range(64))]
    reference = copy.deepcopy(model)
    loss_fn(reference(batch[0]), batch[1]).backward()
    expected = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad) for p in reference.parameters()])
    )
    precision = PrecisionPolicy(CPU)
    _, grad_norm = gradients_after_step(model, [batch], precision)
    torch.testing.assert_close(grad_norm, expected, **tolerance(precision))


def test_clipping_bounds_the_update(config):
    config = dataclasses.replace(config, dropout=0.0)
    seed_everything(config.seed)
    model = build_model(config)
    _, val_set = build_datasets(config)
    batch = val_set[list(range(64))]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scheduler = LambdaLR(optimizer, lambda step: 1.0)
    max_norm = 1e-3
    train_step(model, [batch], 1, optimizer, scheduler, PrecisionPolicy(CPU), CPU, max_norm)
    clipped = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad) for p in model.parameters()])
    )
    assert clipped <= max_norm * 1.01
