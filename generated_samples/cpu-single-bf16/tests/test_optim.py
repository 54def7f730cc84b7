"""Optimizer and schedule: no decay on biases and norms; warmup then cosine, per optimizer step."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from cpu_single_bf16.model import build_model
from cpu_single_bf16.runtime import init_runtime
from cpu_single_bf16.train import Trainer
from cpu_single_bf16.training import WarmupCosine, build_optimizer, build_scheduler

NORMS = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d)


def test_no_weight_decay_on_biases_and_norm_weights(config):
    model = build_model(config)
    optimizer = build_optimizer(model, config)
    decay_of = {
        id(p): group["weight_decay"] for group in optimizer.param_groups for p in group["params"]
    }
    assert len(decay_of) == sum(len(group["params"]) for group in optimizer.param_groups)
    assert set(decay_of) == {id(p) for p in model.parameters()}, "every parameter in one group"
    for module_name, module in model.named_modules():
        for name, parameter in module.named_parameters(recurse=False):
            no_decay = name == "bias" or isinstance(module, NORMS)
            expected = 0.0 if no_decay else config.weight_decay
            assert decay_of[id(parameter)] == expected, f"{module_name}.{name}"
    assert config.weight_decay > 0


def test_adamw_is_fused_only_where_every_parameter_is_on_cuda(config):
    """On a CPU, PyTorch's default AdamW runs: the fused setting changes nothing here."""
    optimizer = build_optimizer(build_model(config), config)
    assert not optimizer.defaults["fused"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_adamw_is_fused_on_cuda(config):
    optimizer = build_optimizer(build_model(config).cuda(), config)
    assert optimizer.defaults["fused"] is True


def test_warmup_then_cosine(config):
    optimizer = build_optimizer(build_model(config), config)
    total = 200
    scheduler = build_scheduler(optimizer, config, total_steps=total)
    lrs = []
    for _ in range(total):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    warmup = config.warmup_steps
    assert all(a < b for a, b in zip(lrs[:warmup], lrs[1 : warmup + 1], strict=True))
    assert lrs[warmup] == pytest.approx(config.lr)
    assert all(a >= b for a, b in zip(lrs[warmup:], lrs[warmup + 1 :], strict=False))
    assert scheduler.get_last_lr()[0] == pytest.approx(config.lr * config.min_lr_ratio)


def test_scheduler_steps_once_per_optimizer_step(config):
    config = dataclasses.replace(
        config, epochs=1, grad_accum_steps=3, checkpoint_every=0, log_every=1
    )
    trainer = Trainer(config, init_runtime("cpu"))
    trainer.fit()
    micro_batches = len(trainer.train_loader)
    assert trainer.state.step == -(-micro_batches // 3)
    assert trainer.scheduler.last_epoch == trainer.state.step
    # The LR logged with step s is the one step s ran at: factor(s - 1), s counting from 1.
    factor = WarmupCosine(config.warmup_steps, trainer.state.run_steps, config.min_lr_ratio)
    lines = (Path(config.run_dir) / "metrics.jsonl").read_text().splitlines()
    logged = [record for record in map(json.loads, lines) if record["kind"] == "train"]
    assert [r["step"] for r in logged] == list(range(1, trainer.state.step + 1))
    for record in logged:
        assert record["lr"] == pytest.approx(config.lr * factor(record["step"] - 1)), record
