"""engine/build.py: the model built on the meta device gets the same weights from the same seed
however it is stored, and activation checkpointing keeps the gradients while it keeps fewer
activations."""

from __future__ import annotations

import copy
import dataclasses
import functools

import pytest
import torch
from torch import nn

from fabric_lm_fsdp2_fp32.data import build_datasets
from fabric_lm_fsdp2_fp32.engine import build as build_module
from fabric_lm_fsdp2_fp32.engine import (
    build_on_meta,
    checkpoint_units,
    init_weights,
    is_on_meta,
    materialize,
)
from fabric_lm_fsdp2_fp32.model import build_model
from fabric_lm_fsdp2_fp32.report.summary import expected_initial_loss
from fabric_lm_fsdp2_fp32.task import loss_fn
from fabric_lm_fsdp2_fp32.training import seed_all


def one_batch(config, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    train_set, _ = build_datasets(config)
    return train_set[list(range(min(size, len(train_set))))]


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


@pytest.fixture
def meta_model(config) -> nn.Module:
    """The model on the meta device, built after the data as a run builds it (the data decide
    its classes); a model of your own without `init_tensor` is built whole instead
    (engine/build.py), and these tests of the meta path do not apply to it."""
    build_datasets(config)
    model = build_on_meta(config)
    if not is_on_meta(model):
        pytest.skip("model.py's model has no init_tensor: engine/build.py builds it whole")
    return model


def test_the_meta_model_materialises_the_same_weights_from_the_same_seed(config, meta_model):
    meta = meta_model
    assert is_on_meta(meta) and all(p.device.type == "meta" for p in meta.parameters())
    first = materialize(meta, torch.device("cpu"), seed=7)
    assert not is_on_meta(first)
    again = weights(materialize(build_on_meta(config), torch.device("cpu"), seed=7))
    other = weights(materialize(build_on_meta(config), torch.device("cpu"), seed=8))
    for name, tensor in weights(first).items():
        assert torch.equal(tensor, again[name]), name
    assert any(not torch.equal(tensor, other[name]) for name, tensor in weights(first).items())
    # A model built whole on the CPU and initialised from the seed gets the same weights: what
    # a sharding engine's ranks each keep a piece of is the one-process model's.
    whole = build_model(config)
    init_weights(whole, seed=7)
    for name, tensor in weights(whole).items():
        assert torch.equal(tensor, again[name]), name


def test_the_materialised_model_starts_at_the_theoretical_loss(config, meta_model):
    model = materialize(meta_model, torch.device("cpu"), seed=config.seed).eval()
    inputs, targets = one_batch(config, 64)
    with torch.no_grad():
        loss = loss_fn(model(inputs), targets).item()
    assert abs(loss - expected_initial_loss(config)) < 0.15, loss


def test_a_model_without_init_tensor_is_refused_with_the_way_out():
    with torch.device("meta"):
        model = nn.Linear(4, 2)
    with pytest.raises(TypeError, match="init_tensor"):
        materialize(model, torch.device("cpu"), seed=0)


def saved_and_gradients(model: nn.Module, batch, seed: int) -> tuple[int, dict[str, torch.Tensor]]:
    """Bytes autograd keeps for backward from inside the model's checkpoint units in one
    training forward (each storage once, the parameters' own excluded), and the parameters'
    gradients after its backward. What the units keep is what checkpointing changes; the
    head's logits, at a 50K vocabulary the largest tensor of a small model, are outside them."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}
    depth = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if depth[0] and storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    def enter(*_) -> None:
        depth[0] += 1

    def leave(*_) -> None:
        depth[0] -= 1

    hooks = []
    for unit in model.shard_units():
        hooks += [unit.register_forward_pre_hook(enter), unit.register_forward_hook(leave)]
    seed_all(seed)  # the same dropout draws in both models
    inputs, targets = batch
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = loss_fn(model(inputs), targets)
    for hook in hooks:
        hook.remove()
    loss.backward()
    return sum(saved.values()), {name: p.grad for name, p in model.named_parameters()}


def test_activation_checkpointing_keeps_the_gradients_and_keeps_fewer_activations(config):
    plain = build_model(config).train()
    checkpointed = copy.deepcopy(plain)
    checkpoint_units(checkpointed)
    batch = one_batch(config, 32)
    plain_bytes, expected = saved_and_gradients(plain, batch, seed=3)
    checkpointed_bytes, actual = saved_and_gradients(checkpointed, batch, seed=3)
    for name, gradient in expected.items():
        assert torch.allclose(actual[name], gradient, rtol=1e-5, atol=1e-7), name
    # A checkpointed unit keeps only its input (held by the checkpoint, not by the unit's own
    # operations); the rest is recomputed in backward.
    assert plain_bytes > 0
    assert checkpointed_bytes < plain_bytes / 2, (checkpointed_bytes, plain_bytes)


def test_a_model_without_init_tensor_is_built_whole_with_a_warning(config, monkeypatch):
    class Plain(nn.Linear):  # what many models are: initialised in __init__ alone
        def shard_units(self) -> list[nn.Module]:
            return []

    monkeypatch.setattr(build_module, "build_model", lambda config: Plain(4, 2))
    with pytest.warns(UserWarning, match="has no init_tensor"):
        model = build_on_meta(config)
    assert not is_on_meta(model)


def test_the_config_switch_checkpoints_every_shard_unit(config):
    on = build_on_meta(dataclasses.replace(config, activation_checkpointing=True))
    off = build_on_meta(dataclasses.replace(config, activation_checkpointing=False))
    assert all(isinstance(unit.forward, functools.partial) for unit in on.shard_units())
    assert not any(isinstance(unit.forward, functools.partial) for unit in off.shard_units())
