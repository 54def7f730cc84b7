"""The example model: a GPT-style decoder over bytes, sized from a target parameter count.

This file is yours: replace the model with your own; `scaffold update` leaves it alone. What the
rest of the project needs from it (`train.py` imports nothing else from here):

- `build_model(config) -> nn.Module`, whose `forward(tokens)` maps int64 token ids `[B, T]`
  (T <= `config.block_size`) to raw next-token logits, float `[B, T, NUM_CLASSES]` (no
  softmax: the loss applies log-softmax itself). Start the logits near zero, so the initial
  loss is ln(NUM_CLASSES), the sanity ladder's rung 2.
- `model.shard_units() -> list[nn.Module]`: the submodules a strategy that shards the model
  wraps one at a time (each is gathered whole only while it runs) and activation checkpointing
  recomputes one at a time; the transformer blocks.
- `model.init_tensor(name, tensor, generator)`: fill `tensor`, a CPU tensor of the full shape
  of parameter (or buffer) `name`, with its initial value, drawing only from `generator`. The
  project builds the model on the meta device and initialises it one parameter at a time with
  this (build.py), so a model sharded over N processes starts from the same weights as on one
  and no process ever holds the whole model. `__init__` calls it too: a model built directly
  is initialised.
- No BatchNorm: batch statistics would make K accumulated micro-batches differ from one batch
  of K times the size, and couple the samples of a batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import Config, parse_param_count
from .data import NUM_CLASSES

HEAD_DIM = 32  # channels per attention head; the width is a multiple of it


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position t sees positions <= t: `[B, T, C] -> [B, T, C]`."""

    def __init__(self, width: int, dropout: float):
        super().__init__()
        self.heads = width // HEAD_DIM
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, HEAD_DIM).transpose(1, 3).unbind(dim=2)
        # q, k, v: [B, heads, T, HEAD_DIM]; the fused kernel applies the causal mask itself.
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, width: int, dropout: float):
        super().__init__()
        self.ln_attn = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, dropout)
        self.ln_mlp = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout)
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_attn(x))
        return x + self.mlp(self.ln_mlp(x))


class ByteGPT(nn.Module):
    """Token ids `[B, T]` (int64, < 256) -> next-token logits `[B, T, 256]`."""

    def __init__(self, width: int, depth: int, block_size: int, dropout: float = 0.0):
        super().__init__()
        self.token_embedding = nn.Embedding(NUM_CLASSES, width)
        self.position_embedding = nn.Embedding(block_size, width)
        self.blocks = nn.ModuleList(Block(width, dropout) for _ in range(depth))
        self.ln_final = nn.LayerNorm(width)
        self.head = nn.Linear(width, NUM_CLASSES, bias=False)
        for name, parameter in self.named_parameters():  # nothing to fill on the meta device
            self.init_tensor(name, parameter.data)

    def forward(self, tokens: Tensor) -> Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_final(x))

    def shard_units(self) -> list[nn.Module]:
        """The transformer blocks: the units a sharding strategy wraps one by one."""
        return list(self.blocks)

    def init_tensor(
        self, name: str, tensor: Tensor, generator: torch.Generator | None = None
    ) -> None:
        """Fill `tensor` (parameter `name`'s full shape) in place: N(0, 0.02) for linear and
        embedding weights (GPT-2's), zero biases, LayerNorm weights 1 and biases 0, and
        N(0, 1e-3) for the head: near-zero logits, an initial loss of ln(256) (rung 2)."""
        owner = self.get_submodule(name.rpartition(".")[0])
        if isinstance(owner, nn.LayerNorm):
            nn.init.constant_(tensor, 1.0 if name.endswith("weight") else 0.0)
        elif name.endswith("bias"):
            nn.init.zeros_(tensor)
        else:
            std = 1e-3 if owner is self.head else 0.02
            nn.init.normal_(tensor, std=std, generator=generator)


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters in `model`."""
    return sum(parameter.numel() for parameter in model.parameters())


def depth_for(params: int) -> int:
    """Blocks for a parameter budget: 2 up to 1M, then twice as many for every tenfold (4 up to
    20M, 8 up to 200M, 16 up to 2B, 32 up to 20B), 64 beyond."""
    limits = (10**6, 2 * 10**7, 2 * 10**8, 2 * 10**9, 2 * 10**10)
    return 2 ** (1 + sum(params > limit for limit in limits))


def width_for_param_count(target: int, depth: int, block_size: int) -> int:
    """Smallest width (a multiple of HEAD_DIM) whose model reaches `target` parameters.

    Built on the meta device, so sizing allocates no memory.
    """
    low, high = 1, 1024  # in units of HEAD_DIM channels
    while low < high:
        middle = (low + high) // 2
        with torch.device("meta"):
            params = count_parameters(ByteGPT(HEAD_DIM * middle, depth, block_size))
        low, high = (middle + 1, high) if params < target else (low, middle)
    return HEAD_DIM * low


def build_model(config: Config) -> ByteGPT:
    """The decoder whose width best reaches `config.model_size` at `depth_for` blocks."""
    target = parse_param_count(config.model_size)
    depth = depth_for(target)
    width = width_for_param_count(target, depth, config.block_size)
    return ByteGPT(width, depth, config.block_size, config.dropout)
