"""The example model: a decoder sized from a target parameter count in the shapes of published
decoders (GPT-3, Pythia, LLaMA: `shape_for`), GPT-style (`ByteGPT`, `model_family = "gpt2"`) or
Llama-style (models/llama.py, `model_family = "llama"`), or the shape of a Hugging Face model folder
(`init_from`: its config.json; the engines then load its weights, hub/).

This file is yours: replace the model with your own; `scaffold update` leaves it alone. What the
rest of the project needs from it (`train.py` imports nothing else from here):

- `build_model(config) -> nn.Module`, whose `forward(tokens)` maps int64 token ids `[B, T]`
  (T <= `config.block_size`) to raw next-token logits, float `[B, T, vocabulary]` (the
  vocabulary `data.input_spec` gives; no softmax: the loss applies log-softmax itself). Start
  the logits near zero, so the initial loss is ln(vocabulary), the sanity ladder's rung 2.
  For packed example data (`pack`), `forward(tokens, documents)` too: int64 `[B, T]` example
  indices, within which alone each position attends and from whose start it counts its
  position (models/packing.py).
- `model.shard_units() -> list[nn.Module]`: the submodules a strategy that shards the model
  wraps one at a time (each is gathered whole only while it runs) and activation checkpointing
  recomputes one at a time; the transformer blocks.
- `model.init_tensor(name, tensor, generator)`: fill `tensor`, a CPU tensor of the full shape
  of parameter (or buffer) `name`, with its initial value, drawing only from `generator`. The
  project builds the model on the meta device and initialises it one parameter at a time with
  this (engine/build.py), so a model sharded over N processes starts from the same weights as on one
  and no process ever holds the whole model. `__init__` calls it too: a model built directly
  is initialised.
- No BatchNorm: batch statistics would make K accumulated micro-batches differ from one batch
  of K times the size, and couple the samples of a batch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import Config, parse_param_count
from .corpus import MANIFEST, TOKENIZER_FILE
from .data import NUM_CLASSES, PLANNED_VOCABULARY, corpus_vocabulary, input_spec
from .hub import Architecture, GPT2Shape, HubWeights, read_architecture
from .models import (
    KVCache,
    LayerCache,
    Llama,
    LlamaShape,
    add_adapters,
    document_causal_mask,
    document_positions,
    new_positions,
)

# Published decoders' shapes: (name, nominal parameters, blocks, width, heads). A model_size equal
# to a nominal size builds that shape, with fewer parameters here: the nominal counts include
# each model's 32K-50K-token embeddings, and this model has 256 byte tokens (GPT-3 Small: 87M).
# GPT-3: Brown et al. 2020, Table 2.1 (XL: 16 heads of 128, as the table's 24 cannot make 2048;
# 13B: width 5120, 40 heads of 128, where the table prints 5140). GPT-2: Radford et al. 2019
# (124M, listed there as 117M). Pythia: Biderman et al. 2023, Table 1. LLaMA: Touvron et al.
# 2023, Table 2. Llama 2 70B: Touvron et al. 2023b, its released configuration.
PUBLISHED_SHAPES = (
    ("Pythia-70M", 70_000_000, 6, 512, 8),
    ("GPT-2", 124_000_000, 12, 768, 12),
    ("GPT-3 Small", 125_000_000, 12, 768, 12),
    ("Pythia-160M", 160_000_000, 12, 768, 12),
    ("GPT-3 Medium", 350_000_000, 24, 1024, 16),
    ("Pythia-410M", 410_000_000, 24, 1024, 16),
    ("GPT-3 Large", 760_000_000, 24, 1536, 16),
    ("GPT-3 XL", 1_300_000_000, 24, 2048, 16),
    ("Pythia-1.4B", 1_400_000_000, 24, 2048, 16),
    ("GPT-3 2.7B", 2_700_000_000, 32, 2560, 32),
    ("Pythia-2.8B", 2_800_000_000, 32, 2560, 32),
    ("GPT-3 6.7B", 6_700_000_000, 32, 4096, 32),
    ("Pythia-6.9B", 6_900_000_000, 32, 4096, 32),
    ("LLaMA-7B", 7_000_000_000, 32, 4096, 32),
    ("Pythia-12B", 12_000_000_000, 36, 5120, 40),
    ("GPT-3 13B", 13_000_000_000, 40, 5120, 40),
    ("LLaMA-33B", 33_000_000_000, 60, 6656, 52),
    ("LLaMA-65B", 65_000_000_000, 80, 8192, 64),
    ("Llama 2 70B", 70_000_000_000, 80, 8192, 64),
    ("GPT-3 175B", 175_000_000_000, 96, 12288, 96),
)
SMALL_MODEL_PARAMS = 10**7  # up to here, this example's own small shapes (the tests train them)
SMALL_HEAD_DIM = 32  # channels per head of the small shapes
MAX_WIDTH = 32_768  # channels: bounds the width search; scaffold refuses sizes that need more


class Shape(NamedTuple):
    """Blocks, channels and attention heads of a `ByteGPT`."""

    depth: int
    width: int
    heads: int


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position t sees positions <= t: `[B, T, C] -> [B, T, C]`;
    with `mask` (bool `[B, 1, T, T]`, packing.document_causal_mask), the positions it allows.
    With `cache` (models/kv_cache.py), the T new positions also read the cached ones and join
    them (`mask`, where given, is then `[T, cached + T]`: KVCache.attention_mask)."""

    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} does not split into {heads} heads")
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.dropout = dropout

    def forward(
        self, x: Tensor, mask: Tensor | None = None, cache: LayerCache | None = None
    ) -> Tensor:
        b, t, c = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.heads, c // self.heads)
        q, k, v = qkv.transpose(1, 3).unbind(dim=2)
        if cache is not None:
            k, v = cache.append(k, v)
        # q, k, v: [B, heads, T, C / heads]; without a mask the fused kernel applies the causal
        # one itself (one new token after cached ones reads every key).
        p = self.dropout if self.training else 0.0
        causal = mask is None and k.shape[2] == t
        y = F.scaled_dot_product_attention(q, k, v, mask, dropout_p=p, is_causal=causal)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x)); the MLP's GELU is
    exact, or GPT-2's tanh approximation (`gelu_approximate="tanh"`)."""

    def __init__(self, width: int, heads: int, dropout: float, gelu_approximate: str = "none"):
        super().__init__()
        self.ln_attn = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, dropout)
        self.ln_mlp = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width),
            nn.GELU(approximate=gelu_approximate),
            nn.Linear(4 * width, width),
            nn.Dropout(dropout),
        )

    def forward(
        self, x: Tensor, mask: Tensor | None = None, cache: LayerCache | None = None
    ) -> Tensor:
        x = x + self.attn(self.ln_attn(x), mask, cache)
        return x + self.mlp(self.ln_mlp(x))


class ByteGPT(nn.Module):
    """Token ids `[B, T]` (int64, < vocab_size, T <= block_size) -> next-token logits
    `[B, T, vocab_size]` (default PLANNED_VOCABULARY); transformers' `GPT2LMHeadModel` without tied
    embeddings (hub/names.py maps the names). Rows of packed examples come with their
    `documents` (int64 `[B, T]`, models/packing.py): each example attends to itself only, its
    positions counted from 0. With a `cache` (models/kv_cache.py; decoding), `tokens` follow
    the `cache.length` positions it holds and join them; positions past `block_size` raise
    ValueError."""

    def __init__(
        self,
        width: int,
        depth: int,
        heads: int,
        block_size: int,
        dropout: float = 0.0,
        vocab_size: int | None = None,
        gelu_approximate: str = "none",
    ):
        super().__init__()
        vocab_size = vocab_size or PLANNED_VOCABULARY
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.position_embedding = nn.Embedding(block_size, width)
        self.blocks = nn.ModuleList(
            Block(width, heads, dropout, gelu_approximate) for _ in range(depth)
        )
        self.ln_final = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        for name, parameter in self.named_parameters():  # nothing to fill on the meta device
            self.init_tensor(name, parameter.data)

    def forward(
        self, tokens: Tensor, documents: Tensor | None = None, cache: KVCache | None = None
    ) -> Tensor:
        positions, mask = new_positions(tokens, cache, self.position_embedding.num_embeddings)
        if documents is not None:
            positions, mask = document_positions(documents), document_causal_mask(documents)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        caches = [None] * len(self.blocks) if cache is None else cache.layers
        for block, block_cache in zip(self.blocks, caches, strict=True):
            x = block(x, mask, block_cache)
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


def shape_for(params: int, block_size: int, vocab_size: int | None = None) -> Shape:
    """The shape `build_model` builds for a budget of `params` parameters: a published decoder's
    own when `params` is its nominal size (PUBLISHED_SHAPES); else, at `layout_for`'s depth and
    head size, the smallest width that reaches `params` (`width_for_param_count`) with an
    embedding and head of `vocab_size` tokens (default PLANNED_VOCABULARY)."""
    for _, size, depth, width, heads in PUBLISHED_SHAPES:
        if size == params:
            return Shape(depth, width, heads)
    depth, head_dim = layout_for(params)
    width = width_for_param_count(params, depth, head_dim, block_size, vocab_size)
    return Shape(depth, width, width // head_dim)


def describe_shape(config: Config, vocab_size: int | None = None) -> str:
    """The model `model_size` builds with a vocabulary of `vocab_size` tokens (default
    PLANNED_VOCABULARY) in words: "4 blocks x 480 channels, 10.0M parameters"."""
    depth, width, heads = shape_for(
        parse_param_count(config.model_size), config.block_size, vocab_size
    )
    with torch.device("meta"):
        model = ByteGPT(width, depth, heads, config.block_size, vocab_size=vocab_size)
    return f"{depth} blocks x {width} channels, {count_parameters(model) / 1e6:.1f}M parameters"


def layout_for(params: int) -> tuple[int, int]:
    """Blocks and channels per head for a parameter budget. Up to SMALL_MODEL_PARAMS, 2 blocks
    (4 above 1M) of heads of 32; beyond, the depth and head size of the published decoder whose
    blocks, built as here, have the parameter count nearest `params` in log scale (not its
    nominal size, mostly embeddings in a small model: Pythia-70M's blocks have 19M)."""
    if params <= SMALL_MODEL_PARAMS:
        return (2 if params <= 10**6 else 4), SMALL_HEAD_DIM

    def distance(row: tuple[str, int, int, int, int]) -> float:
        _, _, depth, width, heads = row
        with torch.device("meta"):
            blocks = depth * count_parameters(Block(width, heads, 0.0))
        return abs(math.log(params / blocks))

    _, _, depth, width, heads = min(PUBLISHED_SHAPES, key=distance)
    return depth, width // heads


def width_for_param_count(
    target: int, depth: int, head_dim: int, block_size: int, vocab_size: int | None = None
) -> int:
    """Smallest width (a multiple of `head_dim`, at most MAX_WIDTH) whose model, with a
    vocabulary of `vocab_size` tokens (default PLANNED_VOCABULARY), reaches `target` parameters;
    MAX_WIDTH when none does.

    Counted on modules built on the meta device, so sizing allocates no memory: one block, and
    the model without blocks (embeddings, final norm, head).
    """
    low, high = 1, MAX_WIDTH // head_dim  # in heads
    while low < high:
        middle = (low + high) // 2
        width = head_dim * middle
        with torch.device("meta"):
            params = depth * count_parameters(Block(width, middle, 0.0))
            params += count_parameters(ByteGPT(width, 0, middle, block_size, vocab_size=vocab_size))
        low, high = (middle + 1, high) if params < target else (low, middle)
    return head_dim * low


def model_architecture(config: Config) -> Architecture:
    """What `build_model` builds: the architecture of `config.init_from`'s config.json (its own
    vocabulary), or the `model_family` decoder `shape_for` sizes from `config.model_size` over
    the data's vocabulary (`data.input_spec`: NUM_CLASSES, else the prepared corpus's).

    Raises:
        ValueError: init_from is no model folder this project can hold (hub/architecture.py),
            of another family than `model_family`, its vocabulary is not a NUM_CLASSES you
            set or is smaller than the prepared corpus's, or its context is shorter than
            `block_size`; or `input_spec`'s refusal.
    """
    if config.init_from:
        folder = config.init_from
        architecture = read_architecture(Path(folder))
        if architecture.family != config.model_family:
            raise ValueError(
                f"{folder} holds a {architecture.model_type} model and model_family is "
                f'{config.model_family}; set model_family = "{architecture.family}"'
            )
        if NUM_CLASSES is not None and architecture.vocab_size != NUM_CLASSES:
            raise ValueError(
                f"{folder} has a vocabulary of {architecture.vocab_size} tokens and data.py's "
                f"NUM_CLASSES is {NUM_CLASSES}; set NUM_CLASSES = {architecture.vocab_size}, "
                "or None to take the folder's"
            )
        corpus = corpus_vocabulary(config)
        if corpus and corpus > architecture.vocab_size:
            raise ValueError(
                f"{config.data_dir}'s tokenizer has {corpus} tokens and {folder}'s model "
                f"{architecture.vocab_size}; prepare it with the model's own tokenizer, "
                f"--tokenizer {Path(folder) / TOKENIZER_FILE}"
            )
        if config.block_size > architecture.max_positions:
            raise ValueError(
                f"block_size {config.block_size} is longer than {folder}'s context "
                f"({architecture.max_positions} tokens); set block_size <= "
                f"{architecture.max_positions}"
            )
        return architecture
    return scratch_architecture(config, input_spec(config)[0])


def scratch_architecture(config: Config, vocab_size: int) -> Architecture:
    """The `model_family` decoder `shape_for` sizes from `config.model_size` with an embedding
    and head of `vocab_size` tokens (a Llama of this depth, width and heads:
    LlamaShape.from_scratch)."""
    params = parse_param_count(config.model_size)
    depth, width, heads = shape_for(params, config.block_size, vocab_size)
    if config.model_family == "llama":
        shape = LlamaShape.from_scratch(vocab_size, width, depth, heads, config.block_size)
        return Architecture("llama", "llama", shape)
    shape = GPT2Shape(vocab_size, width, depth, heads, config.block_size)
    return Architecture("gpt2", "gpt2", shape)


def plan_change(config: Config) -> str | None:
    """What the data changed against the plan, in one line for the start of a run; None where
    the vocabulary is PLANNED_VOCABULARY, or `init_from`'s folder decides it. The line says
    where the vocabulary came from, the parameters of the embedding and head at it and as
    planned, and whether the blocks were kept (a published shape) or resized to hold
    `model_size` (`shape_for`), e.g. at block_size 256: "vocabulary 2,048 from
    data/mine/manifest.json (planned 50,304): embedding and head 1.7M parameters instead of
    9.7M; blocks widened from 4 x 96 to 4 x 416 to hold model_size 10M (10.1M parameters)".

    Raises:
        ValueError: see `data.input_spec`.
    """
    vocabulary = input_spec(config)[0]
    if config.init_from or vocabulary == PLANNED_VOCABULARY:
        return None
    planned = scratch_architecture(config, PLANNED_VOCABULARY)
    now = scratch_architecture(config, vocabulary)
    source = "NUM_CLASSES in data.py" if NUM_CLASSES else str(Path(config.data_dir) / MANIFEST)
    before, after = (f"{a.shape.depth} x {a.shape.width}" for a in (planned, now))
    with torch.device("meta"):
        total = count_parameters(decoder_for(now))
    held = f"model_size {config.model_size} ({in_words(total)} parameters)"
    if before == after:
        blocks = f"blocks kept at {after} for {held}"
    else:
        resized = "widened" if now.shape.width > planned.shape.width else "narrowed"
        blocks = f"blocks {resized} from {before} to {after} to hold {held}"
    embedding, planned_embedding = (in_words(embedding_parameters(a)) for a in (now, planned))
    return (
        f"vocabulary {vocabulary:,} from {source} (planned {PLANNED_VOCABULARY:,}): embedding "
        f"and head {embedding} parameters instead of {planned_embedding}; {blocks}"
    )


def in_words(count: int) -> str:
    """A parameter count as "19.3M" (millions), or "19.3K" (thousands) below a million."""
    return f"{count / 1e6:.1f}M" if count >= 10**6 else f"{count / 1e3:.1f}K"


def embedding_parameters(architecture: Architecture) -> int:
    """Parameters of the token embedding and the output head (one matrix where tied)."""
    shape = architecture.shape
    matrices = 1 if getattr(shape, "tied_embeddings", False) else 2
    return matrices * shape.vocab_size * shape.width


def decoder_for(architecture: Architecture, dropout: float = 0.0) -> nn.Module:
    """A new decoder of `architecture`'s family and shape, initialised by its `init_tensor`
    (nothing to fill where it is built on the meta device); `dropout` applies to the GPT-style
    one (Llama-style models train without dropout)."""
    shape = architecture.shape
    if isinstance(shape, LlamaShape):
        return Llama(shape)
    return ByteGPT(
        shape.width,
        shape.depth,
        shape.heads,
        shape.max_positions,
        dropout,
        shape.vocab_size,
        shape.gelu_approximate,
    )


def build_model(config: Config) -> nn.Module:
    """The decoder `model_architecture(config)` describes; `config.dropout` applies to the
    GPT-style one (Llama-style models train without dropout). With `init_from`, its
    `init_tensor` reads the folder's weights (`HubWeights`, which checks their names and shapes
    first): built on the meta device and materialised by the engine (engine/build.py), the
    model starts from them, each process reading only what it keeps. With `finetune = "lora"`
    they stay frozen and PEFT's LoRA adapters on `lora_targets` train (models/lora.py).

    Raises:
        ValueError: see `model_architecture` and `HubWeights`.
    """
    architecture = model_architecture(config)
    model = decoder_for(architecture, config.dropout)
    if config.init_from:
        model.init_tensor = HubWeights(
            Path(config.init_from), architecture.family, model
        ).init_tensor
    if config.finetune == "lora":  # frozen weights, low-rank adapters trained (models/lora.py)
        model = add_adapters(model, config)
    return model
