"""The example models' shapes as a rendered project builds them from `model_size`, in plain
Python (scaffold does not need torch): the memory model counts these shapes' real parameters
and activations.

The rules are the rendered `model.py` files' own (`depth_for`, `width_for_param_count`);
`tests/test_shapes.py` builds the rendered models on the meta device and checks every count
here against them, and against the tensors autograd saves in a real forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

VOCAB = 256  # the byte-level decoder's vocabulary (data.py's NUM_CLASSES)
HEAD_DIM = 32  # channels per attention head (model.py)
IMAGE_PIXELS = 8 * 8  # the digits: one channel of 8x8 pixels (data.py's IMAGE_SHAPE)
IMAGE_CLASSES = 10


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
    """The byte-level GPT (`ByteGPT`): `depth` pre-norm blocks of `width` channels over
    `block_size` tokens; the shard units are the blocks.

    Parameters per block: attention qkv 3w^2 + 3w and projection w^2 + w, MLP 4w^2 + 4w and
    4w^2 + w, two LayerNorms 4w: 12w^2 + 13w. Outside: token and position embeddings
    (256 + block_size) x w, the final LayerNorm 2w and the head 256 x w (no bias).
    """

    width: int
    depth: int
    block_size: int

    @property
    def unit_params(self) -> tuple[int, ...]:
        """Parameters of each shard unit (block)."""
        w = self.width
        return (12 * w * w + 13 * w,) * self.depth

    @property
    def root_params(self) -> int:
        """Parameters outside the shard units (what the root of a sharded model holds)."""
        return (2 * VOCAB + self.block_size + 2) * self.width

    @property
    def matmul_params(self) -> tuple[tuple[int, ...], int]:
        """Weights of the matmul layers (per unit, and outside): what autocast casts."""
        w = self.width
        return (12 * w * w,) * self.depth, VOCAB * w

    @property
    def params(self) -> int:
        """Every parameter."""
        return sum(self.unit_params) + self.root_params

    def describe(self) -> str:
        """e.g. 'decoder of 32 blocks, width 4288, context 2048'."""
        return f"decoder of {self.depth} blocks, width {self.width}, context {self.block_size}"

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
        w, heads = self.width, self.width // HEAD_DIM
        per_token = (2 * residual_bytes + 14 * compute_bytes) * w + 4 * (4 + heads)
        per_token += w if dropout > 0 else 0
        per_unit = (tokens * per_token,) * self.depth
        unit_input = (tokens * residual_bytes * w,) * self.depth
        outside = tokens * (16 + (residual_bytes + compute_bytes) * w + 4 * VOCAB)
        # Backward's temporaries: the logits' gradient and log-softmax's own (fp32 each), or
        # in a block the gradients of the MLP's 4w-wide tensors and of the residual stream.
        transient = tokens * max(8 * VOCAB, (8 * compute_bytes + 2 * 4) * w)
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


ModelShape = DecoderShape | CNNShape


DECODER_MAX_WIDTH_UNITS = 1024  # widths up to 1024 x HEAD_DIM = 32,768 channels


def decoder_depth(params: int) -> int:
    """Blocks for a parameter budget: 2 up to 1M, then twice as many for every tenfold (4 up to
    20M, 8 up to 200M, 16 up to 2B, 32 up to 20B), 64 beyond."""
    limits = (10**6, 2 * 10**7, 2 * 10**8, 2 * 10**9, 2 * 10**10)
    return 2 ** (1 + sum(params > limit for limit in limits))


def decoder_for(params: int, block_size: int) -> DecoderShape:
    """The decoder `build_model` renders for `params`: at `decoder_depth` blocks, the smallest
    width (a multiple of HEAD_DIM, at most DECODER_MAX_WIDTH_UNITS of them) that reaches
    `params`; the widest one when none does (see `largest_decoder`)."""
    depth = decoder_depth(params)
    low, high = 1, DECODER_MAX_WIDTH_UNITS
    while low < high:
        middle = (low + high) // 2
        reached = DecoderShape(HEAD_DIM * middle, depth, block_size).params >= params
        low, high = (low, middle) if reached else (middle + 1, high)
    return DecoderShape(HEAD_DIM * low, depth, block_size)


def cnn_for(params: int) -> CNNShape:
    """The CNN `build_model` renders for `params`: the smallest base width (a multiple of 8, at
    most 1024 of them) that reaches `params`."""
    low, high = 1, 1024  # in units of 8 channels (GroupNorm's 8 groups)
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if CNNShape(8 * middle).params >= params else (middle + 1, high)
    return CNNShape(8 * low)


def largest_decoder(block_size: int) -> DecoderShape:
    """The largest decoder the rendered `model.py` builds: 64 blocks of the widest width."""
    return DecoderShape(HEAD_DIM * DECODER_MAX_WIDTH_UNITS, decoder_depth(10**12), block_size)
