"""A Llama-architecture decoder: RMSNorm, rotary position embeddings, a SwiGLU MLP and
grouped-query attention, without biases (Touvron et al. 2023, "LLaMA", section 2.2; Ainslie et
al. 2023 for grouped-query attention). Llama 2 and 3, Mistral (without sliding-window
attention), Qwen2 (with q/k/v biases: `qkv_bias`) and SmolLM share this layout.

Yours, like model.py (`model_family = "llama"` builds it). Its module and parameter names are
transformers' `LlamaForCausalLM`'s (`model.layers.N.self_attn.q_proj.weight`, ...), so a
Hugging Face checkpoint's tensors load into it one-to-one (`init_from`, hub/) and its weights
export to a folder that `AutoModelForCausalLM` reads with no custom code (`export.py`). The
arithmetic follows transformers' (rotary tables in float32; RMSNorm, Zhang and Sennrich 2019,
on the float32 residual stream), so its logits equal theirs on the same weights
(tests/test_hub.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .kv_cache import KVCache, LayerCache, new_positions
from .packing import document_causal_mask, document_positions


@dataclass(frozen=True)
class LlamaShape:
    """Every size and switch of a `Llama`: transformers' `LlamaConfig` fields under the names
    in parentheses. `head_dim` 0 means `width // heads`."""

    vocab_size: int  # vocab_size
    width: int  # hidden_size
    depth: int  # num_hidden_layers
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads: heads / kv_heads query heads share each key-value head
    intermediate: int  # intermediate_size: the SwiGLU MLP's hidden channels
    max_positions: int  # max_position_embeddings: the longest context it was trained for
    rope_theta: float = 10_000.0  # rope_theta: the base of the rotary frequencies
    norm_eps: float = 1e-5  # rms_norm_eps
    tied_embeddings: bool = False  # tie_word_embeddings: the output layer is the embedding
    qkv_bias: bool = False  # Qwen2's biases on q, k and v (attention_bias puts one on o too)
    output_bias: bool = False  # attention_bias: a bias on o_proj as well
    head_dim: int = 0  # head_dim

    @property
    def channels_per_head(self) -> int:
        """Channels of one attention head."""
        return self.head_dim or self.width // self.heads

    @classmethod
    def from_scratch(
        cls, vocab_size: int, width: int, depth: int, heads: int, max_positions: int
    ) -> LlamaShape:
        """The shape of a new model of `depth` blocks of `width` channels in `heads` heads:
        one key-value head per query head, and LLaMA's MLP width, 2/3 of 4 x width rounded up
        to a multiple of 256 (of 32 below width 1024, where 256 would be most of it; LLaMA's
        reference code, `multiple_of`)."""
        multiple = 256 if width >= 1024 else 32
        intermediate = multiple * math.ceil(8 * width / 3 / multiple)
        return cls(vocab_size, width, depth, heads, heads, intermediate, max_positions)


def rotary_tables(positions: Tensor, channels: int, theta: float) -> Tensor:
    """cos and sin of the rotary angles of int64 `positions` (any shape `[..., T]`), float32
    `[2, ..., T, channels]`: position p turns channel pair (i, i + channels/2) by
    p / theta^(2i/channels) (Su et al. 2021, RoFormer, eq. 34; the half-split layout of
    transformers' Llama)."""
    device = positions.device
    exponents = torch.arange(0, channels, 2, dtype=torch.int64, device=device).float() / channels
    inverse_frequencies = 1.0 / (theta**exponents)
    angles = positions.float()[..., None] * inverse_frequencies
    angles = torch.cat((angles, angles), dim=-1)
    return torch.stack((angles.cos(), angles.sin()))


def rotate(x: Tensor, tables: Tensor) -> Tensor:
    """`x` `[B, heads, T, channels]` turned by the rotary `tables` (`rotary_tables`)."""
    cos, sin = tables[0].to(x.dtype), tables[1].to(x.dtype)
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class LlamaAttention(nn.Module):
    """Causal grouped-query self-attention with rotary positions: `[B, T, C] -> [B, T, C]`;
    with `mask` (bool `[B, 1, T, T]`, packing.document_causal_mask), the positions it allows.
    With `cache` (kv_cache.py), the T new positions also read the cached ones and join them
    (`mask`, where given, is then `[T, cached + T]`: KVCache.attention_mask)."""

    def __init__(self, shape: LlamaShape):
        super().__init__()
        if shape.heads % shape.kv_heads:
            raise ValueError(f"{shape.heads} heads do not share {shape.kv_heads} key-value heads")
        self.heads, self.kv_heads, self.head_dim = (
            shape.heads,
            shape.kv_heads,
            shape.channels_per_head,
        )
        self.q_proj = nn.Linear(shape.width, shape.heads * self.head_dim, bias=shape.qkv_bias)
        self.k_proj = nn.Linear(shape.width, shape.kv_heads * self.head_dim, bias=shape.qkv_bias)
        self.v_proj = nn.Linear(shape.width, shape.kv_heads * self.head_dim, bias=shape.qkv_bias)
        self.o_proj = nn.Linear(shape.heads * self.head_dim, shape.width, bias=shape.output_bias)

    def forward(
        self,
        x: Tensor,
        tables: Tensor,
        mask: Tensor | None = None,
        cache: LayerCache | None = None,
    ) -> Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, tables), rotate(k, tables)
        if cache is not None:
            k, v = cache.append(k, v)
        grouped = self.kv_heads != self.heads
        causal = mask is None and k.shape[2] == t  # else: one new token reads every key
        y = F.scaled_dot_product_attention(q, k, v, mask, is_causal=causal, enable_gqa=grouped)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)) (Shazeer 2020, "GLU Variants Improve Transformer")."""

    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.gate_proj = nn.Linear(shape.width, shape.intermediate, bias=False)
        self.up_proj = nn.Linear(shape.width, shape.intermediate, bias=False)
        self.down_proj = nn.Linear(shape.intermediate, shape.width, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(shape.width, eps=shape.norm_eps)
        self.self_attn = LlamaAttention(shape)
        self.post_attention_layernorm = nn.RMSNorm(shape.width, eps=shape.norm_eps)
        self.mlp = LlamaMLP(shape)

    def forward(
        self,
        x: Tensor,
        tables: Tensor,
        mask: Tensor | None = None,
        cache: LayerCache | None = None,
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), tables, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """The embedding, the blocks and the final norm: token ids `[B, T]` -> `[B, T, C]`."""

    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.width)
        self.layers = nn.ModuleList(LlamaDecoderLayer(shape) for _ in range(shape.depth))
        self.norm = nn.RMSNorm(shape.width, eps=shape.norm_eps)


class Llama(nn.Module):
    """Token ids `[B, T]` (int64, < `shape.vocab_size`, T <= `shape.max_positions`) ->
    next-token logits float `[B, T, vocab_size]`; transformers' `LlamaForCausalLM` layout.
    Rows of packed examples come with their `documents` (int64 `[B, T]`, packing.py): each
    example attends to itself only, its rotary positions counted from 0. With a `cache`
    (kv_cache.py; decoding), `tokens` follow the `cache.length` positions it holds and join
    them; positions past `max_positions` raise ValueError."""

    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.shape = shape
        self.model = LlamaModel(shape)
        # Tied: the output layer reads the embedding's weight; there is no second parameter
        # (none to re-tie after a meta build or sharding), as transformers saves it.
        self.lm_head = None
        if not shape.tied_embeddings:
            self.lm_head = nn.Linear(shape.width, shape.vocab_size, bias=False)
        for name, parameter in self.named_parameters():  # nothing to fill on the meta device
            self.init_tensor(name, parameter.data)

    def forward(
        self, tokens: Tensor, documents: Tensor | None = None, cache: KVCache | None = None
    ) -> Tensor:
        positions, mask = new_positions(tokens, cache, self.shape.max_positions)
        if documents is not None:  # [B, 1, T]: one row of positions per sequence, every head
            positions, mask = (
                document_positions(documents)[:, None],
                document_causal_mask(documents),
            )
        tables = rotary_tables(positions, self.shape.channels_per_head, self.shape.rope_theta)
        x = self.model.embed_tokens(tokens)
        caches = [None] * len(self.model.layers) if cache is None else cache.layers
        for layer, layer_cache in zip(self.model.layers, caches, strict=True):
            x = layer(x, tables, mask, layer_cache)
        x = self.model.norm(x)
        if self.lm_head is None:
            return F.linear(x, self.model.embed_tokens.weight)
        return self.lm_head(x)

    def shard_units(self) -> list[nn.Module]:
        """The decoder layers: the units a sharding strategy wraps one by one."""
        return list(self.model.layers)

    def init_tensor(
        self, name: str, tensor: Tensor, generator: torch.Generator | None = None
    ) -> None:
        """Fill `tensor` (parameter `name`'s full shape) in place: norm weights 1, biases 0,
        N(0, 0.02) for the other weights, and N(0, 1e-3) for the output layer (the embedding
        when tied): near-zero logits, an initial loss of ln(vocab_size) (rung 2)."""
        if name.endswith("norm.weight"):
            nn.init.ones_(tensor)
        elif name.endswith("bias"):
            nn.init.zeros_(tensor)
        else:
            output = name == "lm_head.weight" or (
                self.shape.tied_embeddings and name == "model.embed_tokens.weight"
            )
            nn.init.normal_(tensor, std=1e-3 if output else 0.02, generator=generator)
