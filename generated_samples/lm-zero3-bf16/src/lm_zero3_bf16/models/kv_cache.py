"""The keys and values a decoder has computed, kept so that each new token reads them instead of
running the whole context again (the key-value cache of every autoregressive decoder: Pope et
al. 2022, "Efficiently Scaling Transformer Inference", section 2).

A `KVCache` holds one `LayerCache` per transformer block. A model's forward takes it (`cache=`):
the new tokens' positions start at `cache.length`, each block appends its keys and values and
attends over everything the cache holds, and the cache is then `length` + T long. Buffers are
allocated once, at their full `capacity`, on the first append: a step writes T positions in
place and allocates nothing. `truncate` goes back to a shorter prefix (a chat whose next turn
re-renders the conversation reuses what is unchanged).
"""

from __future__ import annotations

import torch
from torch import Tensor


class LayerCache:
    """One block's keys and values: `[B, kv_heads, capacity, head_dim]` buffers of the dtype
    and device of the first keys appended."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.length = 0
        self.keys: Tensor | None = None
        self.values: Tensor | None = None

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Add the keys and values of T new positions (`[B, kv_heads, T, head_dim]` each) and
        return every position's so far, `[B, kv_heads, length + T, head_dim]` (views of the
        buffers).

        Raises:
            ValueError: the cache would hold more than `capacity` positions.
        """
        start, end = self.length, self.length + keys.shape[2]
        if end > self.capacity:
            raise ValueError(f"{end} positions; the cache holds {self.capacity}")
        if self.keys is None or self.values is None:
            size = (*keys.shape[:2], self.capacity, keys.shape[3])
            self.keys = keys.new_empty(size)
            self.values = values.new_empty((*size[:3], values.shape[3]))
        self.keys[:, :, start:end] = keys
        self.values[:, :, start:end] = values
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]


class KVCache:
    """The cache of a whole decoder: `layers` LayerCaches of `capacity` positions each (at most
    the model's context: its `max_position_embeddings`)."""

    def __init__(self, layers: int, capacity: int):
        self.capacity = capacity
        self.layers = [LayerCache(capacity) for _ in range(layers)]

    @property
    def length(self) -> int:
        """Positions held (the next token's position)."""
        return self.layers[0].length if self.layers else 0

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (0: all)."""
        for layer in self.layers:
            layer.length = min(layer.length, length)

    def attention_mask(self, new: int, device: torch.device) -> Tensor | None:
        """The mask of `new` query positions appended after the `length` cached ones where
        they need one: bool `[new, length + new]`, True where a query may read a key. None on
        an empty cache (the attention's own causal mask serves) and for one new token (it
        reads every position); SDPA's `is_causal` aligns its mask to the top-left corner,
        which is wrong once the keys outnumber the queries."""
        start = self.length
        if start == 0 or new == 1:
            return None
        queries = torch.arange(start, start + new, device=device)[:, None]
        keys = torch.arange(start + new, device=device)[None, :]
        return keys <= queries


def new_positions(
    tokens: Tensor, cache: KVCache | None, max_positions: int
) -> tuple[Tensor, Tensor | None]:
    """The positions of `tokens` (int64 `[B, T]`) after the `cache.length` ones the cache holds
    (from 0 without one), int64 `[T]`, and the attention mask they need (`attention_mask`;
    None: the attention's own causal one).

    Raises:
        ValueError: they would reach past `max_positions`, the model's context.
    """
    start = 0 if cache is None else cache.length
    end = start + tokens.shape[1]
    if end > max_positions:
        raise ValueError(f"{end} tokens; the model reads {max_positions}")
    positions = torch.arange(start, end, device=tokens.device)
    return positions, None if cache is None else cache.attention_mask(
        tokens.shape[1], tokens.device
    )
