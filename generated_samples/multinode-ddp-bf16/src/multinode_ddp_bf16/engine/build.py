"""The model as each process holds it: built on the meta device (shapes only, no memory), given
its initial weights where they live, and with activation checkpointing per shard unit.

Every engine materialises the model the same way, so a run on one process and a run sharded
over N start from the same weights for the same seed: each parameter's full tensor is drawn on
the CPU by `model.init_tensor` from one generator seeded with `seed`, in `named_parameters()`
order, and each process keeps what it stores of it (all of it, or its shard). No process ever
holds more than its shards and one full parameter, which is what lets a model larger than one
host's memory per process start at all (pytorch.org/docs/stable/meta.html).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..config import Config
from ..model import build_model


def build_on_meta(config: Config) -> nn.Module:
    """`build_model(config)` on the meta device, with activation checkpointing per shard unit
    when `config.activation_checkpointing` is on; an engine materialises it.

    A model without `init_tensor` could not be initialised from there: it is built whole on the
    CPU instead, initialised by its own `__init__` (from the RNG state the caller seeded), with
    a warning that every process then holds all of it during set-up.
    """
    with torch.device("meta"):
        model = build_model(config)
    if not callable(getattr(model, "init_tensor", None)):
        warnings.warn(
            f"{type(model).__name__} has no init_tensor(name, tensor, generator), so it is built "
            "whole on every process; add one (see model.py's contract) to build it on the meta "
            "device",
            stacklevel=2,
        )
        model = build_model(config)
    if config.activation_checkpointing:
        checkpoint_units(model)
    return model


def checkpoint_units(model: nn.Module) -> None:
    """Activation checkpointing per unit of `model.shard_units()`: a unit keeps only its input
    from forward and recomputes the rest in its backward, trading one more forward of it for
    the activations it would save (torch.utils.checkpoint, non-reentrant, RNG state replayed so
    dropout draws the same masks; pytorch.org/docs/stable/checkpoint.html). Parameter names and
    state dicts do not change."""
    for unit in model.shard_units():
        unit.forward = functools.partial(checkpoint, unit.forward, use_reentrant=False)


def is_on_meta(model: nn.Module) -> bool:
    """True while any parameter or buffer of `model` has no storage yet."""
    tensors = [*model.parameters(), *model.buffers()]
    return any(tensor.is_meta for tensor in tensors)


def copy_whole(target: Tensor, full: Tensor) -> None:
    """`init_weights`'s default `store`: the process keeps all of the tensor."""
    target.copy_(full)


def init_weights(
    model: nn.Module, seed: int, store: Callable[[Tensor, Tensor], None] = copy_whole
) -> None:
    """Give every parameter and buffer of `model` its initial value: the full tensor is drawn
    on the CPU by `model.init_tensor(name, tensor, generator)`, one at a time, from a generator
    seeded with `seed`, and `store(target, full)` keeps this process's part of it.

    Raises:
        TypeError: the model has no `init_tensor` (model.py's contract).
    """
    if not callable(getattr(model, "init_tensor", None)):
        raise TypeError(
            f"{type(model).__name__} has no init_tensor(name, tensor, generator); the project "
            "builds the model on the meta device and initialises it with it (see model.py)"
        )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, target in [*model.named_parameters(), *model.named_buffers()]:
            full = torch.empty(target.shape, dtype=target.dtype)
            model.init_tensor(name, full, generator)
            store(target, full)


def frozen_parameters(model: nn.Module) -> set[str]:
    """The names of `model`'s parameters that do not train (`requires_grad` False: a LoRA run's
    base weights). A checkpoint leaves them out: they are the model's start, built again at a
    resume (models/lora.py)."""
    return {name for name, parameter in model.named_parameters() if not parameter.requires_grad}


def trainable_state(model: nn.Module) -> dict[str, Tensor]:
    """`model.state_dict()` without its frozen parameters (`frozen_parameters`)."""
    frozen = frozen_parameters(model)
    return {name: value for name, value in model.state_dict().items() if name not in frozen}


def check_loaded(missing: list[str], unexpected: list[str], model: nn.Module, source: Path) -> None:
    """Refuse a load of `source` into `model` (a non-strict `load_state_dict`'s `missing` and
    `unexpected` keys) unless it set every parameter but the frozen ones, and nothing else.

    Raises:
        ValueError: naming the first keys that differ.
    """
    missing = sorted(set(missing) - frozen_parameters(model))
    if missing or unexpected:
        named = ", ".join([*missing[:3], *list(unexpected)[:3]])
        raise ValueError(
            f"{source} does not hold this model's trainable weights ({len(missing)} missing, "
            f"{len(unexpected)} unexpected: {named}); move it away"
        )


def materialize(
    model: nn.Module,
    device: torch.device,
    seed: int,
    store: Callable[[Tensor, Tensor], None] = copy_whole,
) -> nn.Module:
    """A model built on the meta device, allocated on `device` and initialised from `seed`
    (`init_weights`, keeping what `store` keeps); any other model is moved to `device` as it
    is. Returns the model."""
    if not is_on_meta(model):
        return model.to(device)
    model.to_empty(device=device)
    init_weights(model, seed, store)
    return model
