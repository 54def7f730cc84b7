"""ZeRO-3's model without the whole of it on any process (deepspeed.readthedocs.io,
"Constructing Massive Models")."""

from __future__ import annotations

from typing import Any

import deepspeed
import torch
from torch import Tensor, nn

from .build import init_weights, is_on_meta


def partition(
    model: nn.Module, device: torch.device, seed: int, ds_config: dict[str, Any]
) -> nn.Module:
    """Each parameter of a model built on the meta device is initialised whole on the CPU
    (build.py), then at once partitioned by `deepspeed.zero.Init`, which keeps this rank's part
    (in CPU memory when ds_config offloads parameters) and frees the rest. Any other model is
    moved to `device` and left for `deepspeed.initialize` to partition. Returns the model."""
    if not is_on_meta(model):
        return model.to(device)

    def store(target: Tensor, full: Tensor) -> None:
        parameter = isinstance(target, nn.Parameter)
        full = nn.Parameter(full.to(device), target.requires_grad) if parameter else full.to(device)
        torch.utils.swap_tensors(target, full)  # the meta tensor becomes the whole one, in place
        if parameter:
            holder = nn.Module()  # zero.Init converts a module's parameters in place
            holder.register_parameter("parameter", target)
            deepspeed.zero.Init(
                module=holder, config_dict_or_path=ds_config, mem_efficient_linear=False
            )

    init_weights(model, seed, store)
    return model
