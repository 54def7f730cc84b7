"""Rows that hold several examples one after another (packed chat or instruction data): where
each example's positions start again, and the attention mask that keeps every example to itself.

A packed row comes with `documents`, int64 `[B, T]`: the index of the example each position
belongs to, non-decreasing along T (padding after the last example is one more index). With it,
a model attends causally within each example only (a block-diagonal causal mask) and numbers
its positions from 0 at each example's first token, so that an example trains exactly as it
would alone in a row of its own (tests/test_chat.py holds the models to it)."""

from __future__ import annotations

import torch
from torch import Tensor


def document_positions(documents: Tensor) -> Tensor:
    """Each position's offset from the first position of its example: int64 `[B, T]` from
    int64 `documents` `[B, T]` (0 at every example's first token)."""
    length = documents.shape[-1]
    index = torch.arange(length, device=documents.device).expand_as(documents)
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[..., 1:] = documents[..., 1:] != documents[..., :-1]
    first = torch.where(starts, index, 0).cummax(dim=-1).values  # the start of each one's example
    return index - first


def document_causal_mask(documents: Tensor) -> Tensor:
    """The attention mask of packed rows, bool `[B, 1, T, T]` (True: query t may read key s):
    s <= t and both in the same example. Every row of it holds its own diagonal, so no query
    is left with nothing to attend (which would make SDPA's softmax NaN)."""
    length = documents.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=documents.device).tril()
    same = documents[:, :, None] == documents[:, None, :]
    return (same & causal)[:, None]
