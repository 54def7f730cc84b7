"""Training recipes: the batch, peak learning rate, warmup and (for the language model) context
a model of a given size trains with, and where each comes from. The planner fits the batch to
memory with micro-batches and gradient accumulation; where a published recipe's batch makes no
sense on the hardware (`for_hardware`, `within_accumulation`), the recipe it trains with says
what was traded and why."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from scaffold.shapes import BYTE_VOCAB


@dataclass(frozen=True)
class Recipe:
    """How a model of some size is trained: the batch per optimizer step (`sequences` samples,
    per process or for the whole run), the peak learning rate and warmup, and for the language
    model its context, corpus and tokenizer (`tokenizer`: 'bytes' or 'bpe', prepare.py's; and
    `vocab_size`, the model's vocabulary in tokens). `name` and `citation` say where the values
    come from;
    `warmup_tokens`, the warmup where the source gives it in tokens (kept when the batch
    changes); `notes`, for a setting that departs from the source's value, why."""

    name: str
    citation: str
    sequences: int
    per_process: bool
    lr: float
    warmup_steps: int
    block_size: int = 0
    corpus_bytes: int = 0
    tokenizer: str = ""
    vocab_size: int = 0
    warmup_tokens: int = 0
    notes: tuple[tuple[str, str], ...] = ()

    def note(self, key: str, default: str) -> str:
        """Why setting `key` departs from the recipe's source, or `default` where it does not."""
        return dict(self.notes).get(key, default)

    @property
    def batch(self) -> str:
        """The recipe's batch in words, e.g. "GPT-3 6.7B's 2M tokens (Brown et al...)"."""
        if self.per_process:
            return f"{self.name}'s {self.sequences} per process"
        tokens = self.sequences * self.block_size / 2**20
        return f"{self.name}'s {tokens:g}M tokens ({self.citation})"


# The large language models' vocabulary (the small ones keep BYTE_VOCAB): GPT-2's byte-level
# BPE of 50,257 tokens (Radford et al. 2019, §2.2) padded to 50,304, a multiple of 64, as
# nanoGPT pads it: the embedding and head then have tensor-core-friendly shapes.
BPE_VOCAB = 50_304

# The examples' own settings, tuned on their data at 100K-1M parameters.
DIGITS_RECIPE = Recipe("the example", "tuned for the digits CNN", 64, True, 2e-3, 40)
SMALL_LM_RECIPE = Recipe(
    "the example",
    "tuned for a 100K-1M decoder on the stdlib corpus",
    32,
    True,
    2e-3,
    50,
    block_size=64,
    corpus_bytes=300_000,
    tokenizer="bytes",
    vocab_size=BYTE_VOCAB,
)
# GPT-3's models (Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1):
# parameters, name, batch in sequences of 2048 tokens (0.5M tokens = 256 x 2048), peak LR.
GPT3_ROWS = (
    (125e6, "Small", 256, 6.0e-4),
    (350e6, "Medium", 256, 3.0e-4),
    (760e6, "Large", 256, 2.5e-4),
    (1.3e9, "XL", 512, 2.0e-4),
    (2.7e9, "2.7B", 512, 1.6e-4),
    (6.7e9, "6.7B", 1024, 1.2e-4),
    (13e9, "13B", 1024, 1.0e-4),
    (175e9, "175B", 1536, 0.6e-4),
)
GPT3_CITATION = "Brown et al. 2020, Table 2.1"
GPT3_CONTEXT = 2048
GPT3_WARMUP_TOKENS = 375_000_000  # linear warmup over the first 375M tokens (Appendix B)
STDLIB_CORPUS_BYTES = 32_000_000  # all of the standard library's .py source (~31 MB)


def recipe_for(task: str, params: int) -> Recipe:
    """The batch, learning rate and warmup a model of `params` parameters trains with.

    The digits CNN keeps its example's recipe. The decoder takes the GPT-3 row nearest its size
    in log scale (Brown et al. 2020, Table 2.1: context 2048, batch, peak LR; warmup over 375M
    tokens) with a byte-level BPE of GPT-2's vocabulary (BPE_VOCAB), trained on the corpus at
    prepare time, or, nearer the example's 100K-1M than GPT-3 Small's 125M, the example's own
    (byte tokens).
    """
    if task == "image-classification":
        return DIGITS_RECIPE
    size, name, sequences, lr = min(GPT3_ROWS, key=lambda row: abs(math.log(params / row[0])))
    if abs(math.log(params / 1e6)) < abs(math.log(params / size)):
        return SMALL_LM_RECIPE
    return Recipe(
        f"GPT-3 {name}",
        GPT3_CITATION,
        sequences,
        False,
        lr,
        math.ceil(GPT3_WARMUP_TOKENS / (sequences * GPT3_CONTEXT)),
        block_size=GPT3_CONTEXT,
        corpus_bytes=STDLIB_CORPUS_BYTES,
        tokenizer="bpe",
        vocab_size=BPE_VOCAB,
        warmup_tokens=GPT3_WARMUP_TOKENS,
    )


# A timm backbone's recipes. Fine-tuning pretrained weights (init_from): MAE's end-to-end
# fine-tuning recipe (He et al. 2022, "Masked Autoencoders Are Scalable Vision Learners",
# Appendix A.1, Table 9): AdamW, peak LR 5e-4 x batch / 256 (the linear scaling rule, Goyal et
# al. 2017), layer-wise LR decay 0.75, label smoothing 0.1, warmup 5 epochs. One ratio stands in
# for the layer-wise decay (the backbone's LR a tenth of the head's: 0.75^8, two-thirds of the
# way down a 12-block ViT-B), and the new head first learns on frozen features for an epoch, the
# order of LP-FT (Kumar et al. 2022, "Fine-Tuning can Distort Pretrained Features and
# Underperform Out-of-Distribution": a random head's gradients distort the features). From
# scratch, every weight is new: one LR for all, the example's.
FINETUNE_BASE_LR = 5e-4  # per 256 images of the global batch
FINETUNE_BACKBONE_LR_RATIO = 0.1
FINETUNE_FROZEN_EPOCHS = 1
FINETUNE_CITATION = "He et al. 2022, MAE, Appendix A.1, Table 9"


@dataclass(frozen=True)
class BackboneRecipe:
    """How a timm backbone trains: the batch, peak LR (the head's) and warmup (`recipe`), the
    backbone's LR as a share of the head's and its frozen epochs, each with its reason."""

    recipe: Recipe
    backbone_lr_ratio: float
    freeze_backbone_epochs: int
    reasons: dict[str, str]


def backbone_recipe(fine_tune: bool, world_size: int) -> BackboneRecipe:
    """The recipe of a timm backbone over `world_size` processes at the example's batch of
    DIGITS_RECIPE.sequences images per process: MAE's fine-tuning recipe where `fine_tune`
    (pretrained weights are given), else the example's (comment above)."""
    batch = DIGITS_RECIPE.sequences * world_size
    if not fine_tune:
        return BackboneRecipe(
            DIGITS_RECIPE,
            1.0,
            0,
            {
                "backbone_lr_ratio": "a backbone from scratch has no features to protect; "
                "one learning rate for every weight",
                "freeze_backbone_epochs": "frozen random features teach the head nothing",
            },
        )
    lr = FINETUNE_BASE_LR * batch / 256
    recipe = Recipe(
        "MAE's fine-tuning",
        FINETUNE_CITATION,
        DIGITS_RECIPE.sequences,
        True,
        lr,
        DIGITS_RECIPE.warmup_steps,
        notes=(
            (
                "lr",
                f"MAE's fine-tuning peak {_number(FINETUNE_BASE_LR)} x {batch} images / 256 "
                f"(the linear scaling rule; {FINETUNE_CITATION}), the new head's",
            ),
            (
                "warmup_steps",
                "the example's 40 steps: MAE warms up over 5 epochs, and the plan does not "
                "know an epoch's steps (set it once your data is prepared)",
            ),
        ),
    )
    return BackboneRecipe(
        recipe,
        FINETUNE_BACKBONE_LR_RATIO,
        FINETUNE_FROZEN_EPOCHS,
        {
            "backbone_lr_ratio": "the pretrained backbone at a tenth of the head's LR, for MAE's "
            f"layer-wise decay of 0.75 ({FINETUNE_CITATION}): 0.75^8 ~ 0.1",
            "freeze_backbone_epochs": "the new head learns on frozen features first, LP-FT's "
            "order (Kumar et al. 2022): a random head's gradients would distort them",
        },
    )


HOST_WORDS = {"cpu": "a CPU", "mps": "an Apple GPU (MPS)"}


def for_hardware(recipe: Recipe, hardware: str, params: int) -> Recipe:
    """`recipe` as `hardware` ('cuda', 'cpu' or 'mps') can train a model of `params` with it.

    GPT-3's context 2048 and 0.5M-3.2M-token batches (Table 2.1) are for GPU clusters: one
    optimizer step of GPT-3 Small's batch costs 6 x parameters x tokens FLOPs (Kaplan et al.
    2020, §2.1), 9e13 at 30M parameters, minutes on a CPU. On CPU and MPS the language model
    keeps the example's own context, batch, warmup, corpus and byte tokens (a 50K-token
    embedding and head would be most of a model a CPU trains); the peak LR is the GPT-3 row's,
    below the example's 2e-3 (tuned at 100K-1M parameters), since Table 2.1 lowers it as models
    grow. Not scaled by the batch ratio: at another context the problem itself changes, which
    no batch-scaling rule covers. Elsewhere `recipe` is returned as it is.
    """
    if hardware == "cuda" or recipe.per_process:
        return recipe
    example = SMALL_LM_RECIPE
    tokens = recipe.sequences * recipe.block_size
    flops = _number(6 * params * tokens)
    trade = (
        f"{recipe.name}'s recipe would be context {recipe.block_size} x {recipe.sequences} "
        f"sequences ({tokens / 2**20:g}M tokens, ~{flops} FLOPs per optimizer step at 6 x "
        f"parameters x tokens); on {HOST_WORDS[hardware]} kept the example's context "
        f"{example.block_size} x {example.sequences} sequences, its warmup and corpus, because "
        "steps that size are for GPU clusters"
    )
    lr = (
        f"{recipe.name}'s peak learning rate ({recipe.citation}), not the example's "
        f"{_number(example.lr)}, tuned at 100K-1M parameters"
    )
    vocabulary = (
        f"the example's byte tokens, not {recipe.name}'s BPE of {recipe.vocab_size:,}: its "
        "embedding and head would be most of a model a CPU trains"
    )
    notes = (("block_size", trade), ("lr", lr), ("tokenizer", vocabulary))
    return dataclasses.replace(example, lr=recipe.lr, notes=notes)


# At most this many micro-batches per optimizer step. More accumulation adds no throughput (the
# device runs the same micro-batches either way), only batch; and below the critical batch size
# a smaller batch reaches the same loss with no more tokens, only more optimizer steps
# (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training"). Much less would make
# AdamW's own step count: it moves ~28 bytes per parameter (reads weight, gradient and two
# moments, writes three), about a quarter of the time of a micro-batch of one 2048-token sequence
# (6 x parameters x 2048 FLOPs) on an H100 (3.35 TB/s; ~400 TFLOP/s, 40% of its bf16 peak);
# spread over 32 micro-batches, about 1%.
MAX_ACCUMULATION = 32


def within_accumulation(recipe: Recipe, micro_batch: int, world_size: int) -> Recipe:
    """`recipe` at no more than MAX_ACCUMULATION micro-batches of `micro_batch` per process per
    optimizer step: where its batch would need more, the largest batch within the cap
    (`micro_batch` x MAX_ACCUMULATION x `world_size`), the peak LR scaled by the square root of
    the batch ratio (the square-root scaling rule for Adam: Malladi et al. 2022, "On the SDEs
    and Scaling Rules for Adaptive Gradient Algorithms"), rounded to two significant digits,
    and the warmup kept in tokens. Otherwise `recipe` as it is."""
    per_process = (
        recipe.sequences if recipe.per_process else math.ceil(recipe.sequences / world_size)
    )
    accumulation = per_process // micro_batch
    if accumulation <= MAX_ACCUMULATION:
        return recipe
    capped = micro_batch * MAX_ACCUMULATION
    sequences = capped if recipe.per_process else capped * world_size
    ratio = sequences / recipe.sequences
    lr = float(f"{recipe.lr * math.sqrt(ratio):.1e}")
    if recipe.warmup_tokens:
        warmup = math.ceil(recipe.warmup_tokens / (sequences * recipe.block_size))
    else:
        warmup = math.ceil(recipe.warmup_steps / ratio)
    batch = (
        f"not {recipe.batch}, which would take {accumulation} micro-batches of {micro_batch} per "
        f"process: accumulation is capped at {MAX_ACCUMULATION} (more adds no throughput, only "
        "batch, and below the critical batch a smaller one needs no more tokens: McCandlish et "
        "al. 2018)"
    )
    lr_note = (
        f"{recipe.name}'s {_number(recipe.lr)} x sqrt({sequences}/{recipe.sequences}) for the "
        "smaller batch: the square-root scaling rule for Adam (Malladi et al. 2022)"
    )
    notes = (*recipe.notes, ("grad_accum_steps", batch), ("lr", lr_note))
    return dataclasses.replace(recipe, sequences=sequences, lr=lr, warmup_steps=warmup, notes=notes)


# The language-model example's run (its task_config.py): epochs over the corpus, and the share
# of the corpus held out for validation.
LM_EPOCHS = 4
LM_VAL_FRACTION = 0.1


def total_steps(recipe: Recipe, sequences_per_step: int) -> int:
    """Optimizer steps of the language model's example run with `recipe`'s corpus and context
    at `sequences_per_step` (an estimate: whole windows of the training share, per epoch)."""
    windows = (int(recipe.corpus_bytes * (1 - LM_VAL_FRACTION)) - 1) // recipe.block_size
    return LM_EPOCHS * max(1, math.ceil(windows / sequences_per_step))


def _number(value: float) -> str:
    """A rate or a count in two significant digits as configs/train.toml writes it: 2e-3, 9e13."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
