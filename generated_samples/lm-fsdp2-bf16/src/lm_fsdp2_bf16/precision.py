"""Precision policy under FSDP2: FSDP's `MixedPrecisionPolicy` casts, so no autocast.

FSDP2 keeps the fp32 sharded parameters the optimizer steps, and all-gathers them cast to
`PARAM_DTYPE` for forward and backward; gradients are reduce-scattered in fp32 and land on the
fp32 shards (pytorch.org/docs/stable/distributed.fsdp.fully_shard.html). bf16 needs no loss
scaling (fp32's exponent range); fp16 would, and is not offered with FSDP2 here.
Every variant's `precision.py` exports the same `PrecisionPolicy`, so `train.py` reads the same.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.fsdp import MixedPrecisionPolicy

PARAM_DTYPE = torch.bfloat16


class PrecisionPolicy:
    """Compute in `param_dtype` through FSDP's parameter casts; reductions and step in fp32.

    With bf16 parameters every op runs in bf16, layer norms and embedding backward included;
    on CPU their backward sums over tokens in bf16, so larger micro-batches lose more of their
    gradient there (GPU kernels sum in fp32).
    """

    def __init__(self, device: torch.device, param_dtype: torch.dtype = PARAM_DTYPE):
        self.device = device
        self.param_dtype = param_dtype
        self.name = "bf16" if param_dtype == torch.bfloat16 else "fp32"

    def mixed_precision(self) -> MixedPrecisionPolicy:
        """What `fully_shard` casts: parameters to `param_dtype`, gradient reductions in fp32."""
        return MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=torch.float32)

    def autocast(self) -> contextlib.AbstractContextManager:
        """No autocast: the parameters FSDP all-gathers are already in `PARAM_DTYPE`."""
        return contextlib.nullcontext()

    def backward(self, loss: Tensor, model: nn.Module) -> None:
        """Backward pass of a 0-dim loss (already divided for gradient accumulation)."""
        loss.backward()

    def clip_and_step(
        self, optimizer: torch.optim.Optimizer, model: nn.Module, max_norm: float
    ) -> Tensor:
        """Clip the global gradient L2 norm (over every rank's shards) to `max_norm`, then step;
        returns the pre-clip norm (a replicated DTensor)."""
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        return grad_norm

    def state_dict(self) -> dict[str, Any]:
        """Nothing to save: no loss scale."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore: no loss scale."""
