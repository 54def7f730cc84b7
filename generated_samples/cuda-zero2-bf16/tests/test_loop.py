"""The optimizer step: gradient accumulation and clipping of unscaled gradients, through the
engine exactly as train.py drives it."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR

from cuda_zero2_bf16.data import build_datasets
from cuda_zero2_bf16.engine import Engine
from cuda_zero2_bf16.engine import strategy as engine_module
from cuda_zero2_bf16.model import build_model
from cuda_zero2_bf16.runtime import init_runtime
from cuda_zero2_bf16.task import loss_fn
from cuda_zero2_bf16.train import train_step
from cuda_zero2_bf16.training import seed_all

NO_CLIP = 1e9


def plain_sgd(module):
    return torch.optim.SGD(module.parameters(), lr=1.0)


def sgd_updates(model, micro_batches, config, max_norm=NO_CLIP):
    """One train_step with plain SGD at lr 1: each parameter moves by minus its (clipped)
    gradient. Returns (before - after per parameter, the pre-clip gradient norm).

    The engine wraps the model as in training, so the strategy's gradient sync, reduction and
    clipping are the ones under test, wherever it keeps its gradients.
    """
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    config = dataclasses.replace(config, max_grad_norm=max_norm)
    engine = Engine(model, plain_sgd, init_runtime("cpu"), config)
    scheduler = LambdaLR(engine.optimizer, lambda step: 1.0)
    _, grad_norm, _ = train_step(engine, scheduler, micro_batches, len(micro_batches), max_norm)
    after = engine.full_state_dict()
    return [before[name] - after[name] for name in before], grad_norm.item()


def tolerance() -> dict[str, float]:
    """fp32 differs only by summation order; lower compute precisions add rounding of their own."""
    exact = engine_module.COMPUTE_DTYPE is torch.float32
    return {"rtol": 1e-4, "atol": 1e-6} if exact else {"rtol": 0.05, "atol": 2e-3}


def first_batch(config, size: int = 64):
    seed_all(config.seed)
    _, val_set = build_datasets(config)
    return val_set[list(range(size))]


def test_accumulated_micro_batches_equal_one_big_batch(config, monkeypatch):
    """Checked in fp32 compute (loss scaling, where on, still applies): in a lower precision,
    sums over 16 and over 64 samples differ by rounding alone."""
    monkeypatch.setattr(engine_module, "COMPUTE_DTYPE", torch.float32)
    config = dataclasses.replace(config, dropout=0.0)
    inputs, targets = first_batch(config)
    model = build_model(config)
    micro = [(inputs[i : i + 16], targets[i : i + 16]) for i in range(0, 64, 16)]
    accumulated, _ = sgd_updates(copy.deepcopy(model), micro, config)
    whole, _ = sgd_updates(copy.deepcopy(model), [(inputs, targets)], config)
    for a, b in zip(accumulated, whole, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, **tolerance())


def test_clipping_sees_the_true_gradient_norm(config):
    """With loss scaling the norm must be taken after unscale_: a scaled norm would be ~65536x
    larger."""
    config = dataclasses.replace(config, dropout=0.0)
    inputs, targets = first_batch(config)
    model = build_model(config)
    reference = copy.deepcopy(model)
    loss_fn(reference(inputs), targets).backward()
    expected = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad) for p in reference.parameters()])
    )
    _, grad_norm = sgd_updates(model, [(inputs, targets)], config)
    torch.testing.assert_close(
        torch.tensor(grad_norm, dtype=expected.dtype), expected, **tolerance()
    )


def test_clipping_bounds_the_update(config):
    config = dataclasses.replace(config, dropout=0.0)
    batch = first_batch(config)
    max_norm = 1e-3
    updates, grad_norm = sgd_updates(build_model(config), [batch], config, max_norm=max_norm)
    assert grad_norm > 10 * max_norm, "the gradient must be large enough to need clipping"
    applied = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(u) for u in updates]))
    assert applied <= max_norm * 1.01


def test_layers_compute_in_the_rendered_dtype(config):
    """Frameworks may run another precision than the one asked for, without a word (a 16-bit
    setting changes on a CPU): the layers' outputs show what really ran."""
    seen: set[torch.dtype] = set()
    model = build_model(config)
    for module in model.modules():
        if isinstance(module, torch.nn.Linear | torch.nn.Conv2d):
            module.register_forward_hook(lambda _module, _inputs, out: seen.add(out.dtype))
    sgd_updates(model, [first_batch(config, size=8)], config)
    assert seen == {engine_module.COMPUTE_DTYPE}


def test_float32_matmuls_keep_full_precision_on_the_cpu():
    """TF32 is a CUDA setting: a CPU run's float32 matmuls stay as they were."""
    torch.set_float32_matmul_precision("highest")  # PyTorch's default, whatever ran before
    init_runtime("cpu")
    assert torch.get_float32_matmul_precision() == "highest"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_float32_matmuls_use_tf32_on_cuda():
    init_runtime("cuda")
    assert torch.get_float32_matmul_precision() == "high"
