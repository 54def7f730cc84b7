"""The example models' shapes as a rendered project builds them from `model_size`, in plain
Python (scaffold does not need torch): the memory model counts these shapes' real parameters
and activations.

The rules are the rendered `model.py` files' own (`shape_for`, `width_for_param_count`);
`tests/test_shapes.py` builds the rendered models on the meta device and checks every count
and head count here against them, and against the tensors autograd saves in a real forward pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:  # backbones.py imports this module's Activations
    from scaffold.backbones import BackboneShape

BYTE_VOCAB = 257  # the byte tokenizer's vocabulary: 256 bytes and end-of-text
IMAGE_PIXELS = 8 * 8  # the digits: one channel of 8x8 pixels (data.py's IMAGE_SHAPE)
IMAGE_CLASSES = 10


@dataclass(frozen=True)
class PublishedDecoder:
    """A published decoder's shape: `depth` blocks of `width` channels in `heads` heads, and the
    nominal parameter count `size` it is known by; `counts` says what its embedding is (this
    example's depends on its own vocabulary)."""

    name: str
    size: int
    depth: int
    width: int
    heads: int
    counts: str
    source: str

    @property
    def head_dim(self) -> int:
        """Channels per attention head."""
        return self.width // self.heads

    @property
    def block_params(self) -> int:
        """Parameters of its blocks as this example builds them (12w^2 + 13w each; see
        `DecoderShape`): about Kaplan et al. 2020's non-embedding count N = 12 x depth x w^2."""
        return self.depth * (12 * self.width**2 + 13 * self.width)


_GPT = "a 50,257-token embedding"
_PYTHIA = "50,304-token input and output embeddings"
_LLAMA = "a 32,000-token embedding and a SwiGLU MLP"
_LLAMA2 = "a 32,000-token embedding, a SwiGLU MLP and grouped-query attention"
_GPT3_TABLE = "Brown et al. 2020, Table 2.1"
_PYTHIA_TABLE = "Biderman et al. 2023, Table 1"
_LLAMA_TABLE = "Touvron et al. 2023, Table 2"
# GPT-3 XL: Table 2.1 gives 24 heads of 128, which cannot make width 2048; 16 heads of 128 here,
# as Pythia-1.4B has at that width. GPT-3 13B: the table's width 5140 is 40 heads of 128, 5120;
# LLaMA-13B has the same shape. GPT-2's Table 2 lists its smallest as 117M; 124M is its recount.
# Llama 2's paper gives no widths: 70B's are its released configuration's. Left out: Pythia-1B
# (8 heads of 256), Pythia-14M and -31M (not in its table).
PUBLISHED_DECODERS = (
    PublishedDecoder("Pythia-70M", 70_000_000, 6, 512, 8, _PYTHIA, _PYTHIA_TABLE),
    PublishedDecoder("GPT-2", 124_000_000, 12, 768, 12, _GPT, "Radford et al. 2019, Table 2"),
    PublishedDecoder("GPT-3 Small", 125_000_000, 12, 768, 12, _GPT, _GPT3_TABLE),
    PublishedDecoder("Pythia-160M", 160_000_000, 12, 768, 12, _PYTHIA, _PYTHIA_TABLE),
    PublishedDecoder("GPT-3 Medium", 350_000_000, 24, 1024, 16, _GPT, _GPT3_TABLE),
    PublishedDecoder("Pythia-410M", 410_000_000, 24, 1024, 16, _PYTHIA, _PYTHIA_TABLE),
    PublishedDecoder("GPT-3 Large", 760_000_000, 24, 1536, 16, _GPT, _GPT3_TABLE),
    PublishedDecoder("GPT-3 XL", 1_300_000_000, 24, 2048, 16, _GPT, _GPT3_TABLE),
    PublishedDecoder("Pythia-1.4B", 1_400_000_000, 24, 2048, 16, _PYTHIA, _PYTHIA_TABLE),
    PublishedDecoder("GPT-3 2.7B", 2_700_000_000, 32, 2560, 32, _GPT, _GPT3_TABLE),
    PublishedDecoder("Pythia-2.8B", 2_800_000_000, 32, 2560, 32, _PYTHIA, _PYTHIA_TABLE),
    PublishedDecoder("GPT-3 6.7B", 6_700_000_000, 32, 4096, 32, _GPT, _GPT3_TABLE),
    PublishedDecoder("Pythia-6.9B", 6_900_000_000, 32, 4096, 32, _PYTHIA, _PYTHIA_TABLE),
    PublishedDecoder("LLaMA-7B", 7_000_000_000, 32, 4096, 32, _LLAMA, _LLAMA_TABLE),
    PublishedDecoder("Pythia-12B", 12_000_000_000, 36, 5120, 40, _PYTHIA, _PYTHIA_TABLE),
    PublishedDecoder("GPT-3 13B", 13_000_000_000, 40, 5120, 40, _GPT, _GPT3_TABLE),
    PublishedDecoder("LLaMA-33B", 33_000_000_000, 60, 6656, 52, _LLAMA, _LLAMA_TABLE),
    PublishedDecoder("LLaMA-65B", 65_000_000_000, 80, 8192, 64, _LLAMA, _LLAMA_TABLE),
    PublishedDecoder("Llama 2 70B", 70_000_000_000, 80, 8192, 64, _LLAMA2, "Touvron et al. 2023b"),
    PublishedDecoder("GPT-3 175B", 175_000_000_000, 96, 12288, 96, _GPT, _GPT3_TABLE),
)
SMALL_DECODER_PARAMS = 10**7  # up to here, the example's own small shapes
SMALL_HEAD_DIM = 32  # channels per head of the small shapes
DECODER_MAX_WIDTH = 32_768  # channels: 256 heads of 128, 512 of 64, 1024 of 32


def size_label(count: int) -> str:
    """A parameter count as it is written: 125_000_000 -> '125M', 1_300_000_000 -> '1.3B'."""
    for suffix, unit in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if count >= unit:
            return f"{count / unit:.4g}{suffix}"
    return str(count)


@dataclass(frozen=True)
class Activations:
    """Bytes one micro-batch keeps for backward, and its largest temporaries.

    `per_unit[i]`: what shard unit i saves inside itself; `unit_input[i]`: its input alone, all
    that activation checkpointing keeps of it (the rest is recomputed in backward); `outside`:
    what the layers outside the units save (embeddings, final norm, head, loss); `transient`:
    the largest gradient temporaries of one unit's backward, or of the loss's.
    """

    per_unit: tuple[int, ...]
    unit_input: tuple[int, ...]
    outside: int
    transient: int

    def saved(self, checkpointing: bool) -> int:
        """Bytes held at the end of forward."""
        units = self.unit_input if checkpointing else self.per_unit
        return self.outside + sum(units)


@dataclass(frozen=True)
class DecoderShape:
    """The example GPT (`ByteGPT`): `depth` pre-norm blocks of `width` channels in `heads`
    attention heads over `block_size` tokens of a vocabulary of `vocab` (data.py's input_spec);
    the shard units are the blocks. `row`: the published decoder whose shape it is (`exact`) or
    whose depth and head size it takes.

    Parameters per block: attention qkv 3w^2 + 3w and projection w^2 + w, MLP 4w^2 + 4w and
    4w^2 + w, two LayerNorms 4w: 12w^2 + 13w (the head count splits the channels, it adds no
    parameters). Outside: token and position embeddings (vocab + block_size) x w, the final
    LayerNorm 2w and the head vocab x w (no bias, not tied to the embedding).
    """

    width: int
    depth: int
    block_size: int
    heads: int
    row: PublishedDecoder | None = None
    exact: bool = False
    vocab: int = BYTE_VOCAB

    @property
    def unit_params(self) -> tuple[int, ...]:
        """Parameters of each shard unit (block)."""
        w = self.width
        return (12 * w * w + 13 * w,) * self.depth

    @property
    def root_params(self) -> int:
        """Parameters outside the shard units (what the root of a sharded model holds)."""
        return (2 * self.vocab + self.block_size + 2) * self.width

    @property
    def matmul_params(self) -> tuple[tuple[int, ...], int]:
        """Weights of the matmul layers (per unit, and outside): what autocast casts."""
        w = self.width
        return (12 * w * w,) * self.depth, self.vocab * w

    @property
    def params(self) -> int:
        """Every parameter."""
        return sum(self.unit_params) + self.root_params

    def describe(self) -> str:
        """e.g. 'decoder of 32 blocks, width 4096 (32 heads of 128), context 2048'."""
        return (
            f"decoder of {self.depth} blocks, width {self.width} ({self.head_words}), context "
            f"{self.block_size}"
        )

    @property
    def head_words(self) -> str:
        """e.g. '32 heads of 128' (channels)."""
        return f"{self.heads} head{'s' if self.heads > 1 else ''} of {self.width // self.heads}"

    def provenance(self) -> str:
        """Where the shape comes from, in one line of the plan: the published decoder it is,
        or the one whose depth and head size it takes, or the example's small shapes."""
        head = f"shape {self.depth} x {self.width}, {self.head_words}"
        row = self.row
        if row is None:
            return (
                f"{head}: the example's small decoder (2 blocks up to 1M parameters, 4 up to "
                f"{size_label(SMALL_DECODER_PARAMS)}, heads of {SMALL_HEAD_DIM}; the smallest "
                "width that reaches model_size)"
            )
        if self.exact:
            return (
                f"{head}: {row.name}'s ({row.source}); {self.params:,} parameters with "
                f"{self.vocab:,} tokens, an untied head and context {self.block_size} (the "
                f"published {size_label(row.size)} counts {row.counts})"
            )
        return (
            f"{head}: the depth and head size of {row.name} ({row.source}), the published "
            "decoder nearest in size, and the smallest width that reaches model_size"
        )

    def activations(
        self, micro_batch: int, residual_bytes: int, compute_bytes: int, dropout: float
    ) -> Activations:
        """What one micro-batch of `micro_batch` sequences saves for backward.

        Per token of a block (Korthikanti et al. 2022, "Reducing Activation Recomputation in
        Large Transformer Models", §4.1, adapted to this block and to a fused attention kernel
        that keeps no T x T scores): the two LayerNorm inputs (residual stream, 2 x w), the
        qkv input (w), q, k and v (3w), the attention output, which the projection reads in
        place (w), the first MLP input (w), the GELU input and the second MLP input (8w): 2
        residual and 14 compute elements of w; plus the LayerNorms' mean and rstd and the
        attention's log-sum-exp per head, in fp32, and CUDA's one-byte dropout mask per element
        of the MLP output when dropout is on (attention dropout is regenerated from its seed).
        Outside the blocks: the token ids (int64), the final LayerNorm's input and statistics,
        the head's input, and log-softmax's fp32 output over the vocabulary.

        `residual_bytes` is the residual stream's element size (fp32 under autocast: the
        embeddings and LayerNorms stay fp32); `compute_bytes` that of matmul inputs and outputs.
        """
        tokens = micro_batch * self.block_size
        w, heads = self.width, self.heads
        per_token = (2 * residual_bytes + 14 * compute_bytes) * w + 4 * (4 + heads)
        per_token += w if dropout > 0 else 0
        per_unit = (tokens * per_token,) * self.depth
        unit_input = (tokens * residual_bytes * w,) * self.depth
        outside = tokens * (16 + (residual_bytes + compute_bytes) * w + 4 * self.vocab)
        # Backward's temporaries: the logits' gradient and log-softmax's own (fp32 each), or
        # in a block the gradients of the MLP's 4w-wide tensors and of the residual stream.
        transient = tokens * max(8 * self.vocab, (8 * compute_bytes + 2 * 4) * w)
        return Activations(per_unit, unit_input, outside, transient)


@dataclass(frozen=True)
class CNNShape:
    """The digits CNN (`DigitsCNN`): three 3x3 conv blocks of width, 2 x width and 2 x width
    channels (each conv + GroupNorm + GELU; a 2x2 max-pool after the second) and a linear head
    over the flattened 2w x 4 x 4 features; the shard units are the conv blocks."""

    width: int

    @property
    def unit_params(self) -> tuple[int, ...]:
        """Parameters of each conv block: weights, biases and GroupNorm's affine pair."""
        w = self.width
        return (9 * w + w + 2 * w, 18 * w * w + 2 * w + 4 * w, 36 * w * w + 2 * w + 4 * w)

    @property
    def root_params(self) -> int:
        """The head: a linear layer from 32w features to the 10 classes."""
        return 32 * self.width * IMAGE_CLASSES + IMAGE_CLASSES

    @property
    def matmul_params(self) -> tuple[tuple[int, ...], int]:
        """Weights of the conv and linear layers (per unit, and outside): what autocast casts."""
        w = self.width
        return (9 * w, 18 * w * w, 36 * w * w), 32 * w * IMAGE_CLASSES

    @property
    def params(self) -> int:
        """Every parameter."""
        return sum(self.unit_params) + self.root_params

    def describe(self) -> str:
        """e.g. 'CNN of base width 40'."""
        return f"CNN of base width {self.width}"

    def activations(
        self, micro_batch: int, residual_bytes: int, compute_bytes: int, dropout: float
    ) -> Activations:
        """What one micro-batch saves for backward, per image: each block's conv input (in
        the compute dtype), its GroupNorm input (plus mean and rstd per group) and its GELU
        input (fp32 under autocast); the max-pool's input and its int64 indices; the head's
        input, and CUDA's one-byte dropout mask (eager CPU keeps a mask in the input dtype)."""
        w, c, r = self.width, compute_bytes, residual_bytes
        pixels = IMAGE_PIXELS
        first = pixels * (c + 2 * r * w) + 8 * 8
        second = pixels * w * (c + 4 * r) + 8 * 8
        third = pixels // 4 * 2 * w * (c + 2 * r) + 8 * 8
        per_unit = tuple(micro_batch * size for size in (first, second, third))
        unit_input = tuple(micro_batch * size for size in (pixels * r, pixels * w * r, 32 * w * r))
        pool = 2 * w * pixels * r + 2 * w * pixels // 4 * 8
        head = 32 * w * (c + (1 if dropout > 0 else 0))
        outside = micro_batch * (pool + head + 4 * IMAGE_CLASSES + 8)
        transient = micro_batch * 2 * pixels * 2 * w * 4
        return Activations(per_unit, unit_input, outside, transient)


# The shapes `scaffold.memory.estimate` takes: the examples' and a timm backbone's.
ModelShape = Union[DecoderShape, CNNShape, "BackboneShape"]


def published_decoder(params: int) -> PublishedDecoder | None:
    """The published decoder whose nominal size is `params` exactly ('125M', '1.3B', '7B'), if
    any (the first listed where two share a size)."""
    return next((row for row in PUBLISHED_DECODERS if row.size == params), None)


def nearest_published(params: int) -> PublishedDecoder:
    """The published decoder whose blocks' parameters (`block_params`, as this example builds
    them) are nearest `params` in log scale, the first listed on a tie. Not its nominal size:
    that counts a 32K-50K-token embedding, most of a small model's (Pythia-70M's blocks are
    19M), which a byte-level model does not have."""
    return min(PUBLISHED_DECODERS, key=lambda row: abs(math.log(params / row.block_params)))


def decoder_layout(params: int) -> tuple[int, int, PublishedDecoder | None]:
    """Blocks and channels per head for a parameter budget, and the published decoder they are
    taken from. Up to 10M parameters the example's own small shapes (2 blocks up to 1M, else 4;
    heads of 32), which the rendered tests train and time; beyond, the depth and head size of
    the nearest published decoder (`nearest_published`), so a size between published ones has
    the depth and heads of 64-128 channels that decoders of its size were trained with."""
    if params <= SMALL_DECODER_PARAMS:
        return (2 if params <= 10**6 else 4), SMALL_HEAD_DIM, None
    row = nearest_published(params)
    return row.depth, row.head_dim, row


def decoder_for(params: int, block_size: int, vocab: int = BYTE_VOCAB) -> DecoderShape:
    """The decoder `build_model` renders for `params` with a vocabulary of `vocab` tokens (its
    embedding and head count towards `params`): a published decoder's own shape when
    `params` is its nominal size (`published_decoder`); else, at `decoder_layout`'s depth and
    head size, the smallest width (a multiple of the head size, at most DECODER_MAX_WIDTH) that
    reaches `params`; the widest one when none does (see `largest_decoder`)."""
    row = published_decoder(params)
    if row is not None:
        return DecoderShape(row.width, row.depth, block_size, row.heads, row, True, vocab)
    depth, head_dim, row = decoder_layout(params)
    low, high = 1, DECODER_MAX_WIDTH // head_dim  # in heads
    while low < high:
        middle = (low + high) // 2
        shape = DecoderShape(head_dim * middle, depth, block_size, middle, vocab=vocab)
        low, high = (low, middle) if shape.params >= params else (middle + 1, high)
    return DecoderShape(head_dim * low, depth, block_size, low, row, vocab=vocab)


def cnn_for(params: int) -> CNNShape:
    """The CNN `build_model` renders for `params`: the smallest base width (a multiple of 8, at
    most 1024 of them) that reaches `params`."""
    low, high = 1, 1024  # in units of 8 channels (GroupNorm's 8 groups)
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if CNNShape(8 * middle).params >= params else (middle + 1, high)
    return CNNShape(8 * low)


def largest_decoder(block_size: int) -> DecoderShape:
    """The largest decoder the rendered `model.py` builds: the depth and head size of the
    largest published decoder at the widest width."""
    row = max(PUBLISHED_DECODERS, key=lambda row: row.block_params)  # nearest beyond it
    heads = DECODER_MAX_WIDTH // row.head_dim
    return DecoderShape(DECODER_MAX_WIDTH, row.depth, block_size, heads, row)
