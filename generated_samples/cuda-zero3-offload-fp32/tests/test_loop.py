"""The optimizer step: gradient accumulation and clipping of unscaled gradients."""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch.optim.lr_scheduler import LambdaLR

from cuda_zero3_offload_fp32.data import build_datasets
from cuda_zero3_offload_fp32.model import build_model, loss_fn
from cuda_zero3_offload_fp32.parallel import full_model_state, init_runtime, wrap_model
from cuda_zero3_offload_fp32.precision import PrecisionPolicy
from cuda_zero3_offload_fp32.train import seed_everything, train_step

CPU = torch.device("cpu")
NO_CLIP = 1e9


def sgd_updates(model, micro_batches, config, precision=None, max_norm=NO_CLIP):
    """One train_step with plain SGD at lr 1: each parameter moves by minus its (clipped)
    gradient. Returns (before - after per parameter, the pre-clip gradient norm).

    The model is wrapped as train.py wraps it, so the strategy's gradient sync, reduction and
    clipping are the ones under test, wherever the strategy keeps its gradients.
    """
    precision = precision or PrecisionPolicy(CPU)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    config = dataclasses.replace(config, max_grad_norm=max_norm)
    trained, optimizer = wrap_model(
        model, lambda module: torch.optim.SGD(module.parameters(), lr=1.0), init_runtime("cpu"),
        precision, config,
    )  # fmt: skip
    scheduler = LambdaLR(optimizer, lambda step: 1.0)
    _, grad_norm = train_step(
        trained, micro_batches, len(micro_batches), optimizer, scheduler, precision, CPU, max_norm
    )
    after = full_model_state(model)
    return [before[name] - after[name] for name in before], grad_norm.item()


def tolerance(precision: PrecisionPolicy) -> dict[str, float]:
    return (
        {"rtol": 1e-4, "atol": 1e-6} if precision.name == "fp32" else {"rtol": 0.05, "atol": 2e-3}
    )


def first_batch(config, size: int = 64):
    seed_everything(config.seed)
    _, val_set = build_datasets(config)
    return val_set[list(range(size))]


def test_accumulated_micro_batches_equal_one_big_batch(config):
    config = dataclasses.replace(config, dropout=0.0)
    inputs, targets = first_batch(config)
    model = build_model(config)
    micro = [(inputs[i : i + 16], targets[i : i + 16]) for i in range(0, 64, 16)]
    precision = PrecisionPolicy(CPU)
    accumulated, _ = sgd_updates(copy.deepcopy(model), micro, config, precision)
    whole, _ = sgd_updates(copy.deepcopy(model), [(inputs, targets)], config, precision)
    for a, b in zip(accumulated, whole, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, **tolerance(precision))


def test_clipping_sees_the_true_gradient_norm(config):
    """Under fp16 the norm must be taken after unscale_; a scaled norm would be ~65536x larger."""
    config = dataclasses.replace(config, dropout=0.0)
    inputs, targets = first_batch(config)
    model = build_model(config)
    reference = copy.deepcopy(model)
    loss_fn(reference(inputs), targets).backward()
    expected = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad) for p in reference.parameters()])
    )
    precision = PrecisionPolicy(CPU)
    _, grad_norm = sgd_updates(model, [(inputs, targets)], config, precision)
    torch.testing.assert_close(
        torch.tensor(grad_norm, dtype=expected.dtype), expected, **tolerance(precision)
    )


def test_clipping_bounds_the_update(config):
    config = dataclasses.replace(config, dropout=0.0)
    batch = first_batch(config)
    max_norm = 1e-3
    updates, grad_norm = sgd_updates(build_model(config), [batch], config, max_norm=max_norm)
    assert grad_norm > 10 * max_norm, "the gradient must be large enough to need clipping"
    applied = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(u) for u in updates]))
    assert applied <= max_norm * 1.01
