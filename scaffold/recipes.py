"""Training recipes: the batch, peak learning rate, warmup and (for the language model) context
a model of a given size trains with, and where each comes from. The planner fits the batch to
memory with micro-batches and gradient accumulation."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    """How a model of some size is trained: the batch per optimizer step (`sequences` samples,
    per process or for the whole run), the peak learning rate and warmup, and for the language
    model its context and corpus. `name` and `citation` say where the values come from."""

    name: str
    citation: str
    sequences: int
    per_process: bool
    lr: float
    warmup_steps: int
    block_size: int = 0
    corpus_bytes: int = 0

    @property
    def batch(self) -> str:
        """The recipe's batch in words, e.g. "GPT-3 6.7B's 2M tokens (Brown et al...)"."""
        if self.per_process:
            return f"{self.name}'s {self.sequences} per process"
        tokens = self.sequences * self.block_size / 2**20
        return f"{self.name}'s {tokens:g}M tokens ({self.citation})"


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
GPT3_WARMUP_TOKENS = 375e6  # linear warmup over the first 375M tokens (Appendix B)
STDLIB_CORPUS_BYTES = 32_000_000  # all of the standard library's .py source (~31 MB)


def recipe_for(task: str, params: int) -> Recipe:
    """The batch, learning rate and warmup a model of `params` parameters trains with.

    The digits CNN keeps its example's recipe. The decoder takes the GPT-3 row nearest its size
    in log scale (Brown et al. 2020, Table 2.1: context 2048, batch, peak LR; warmup over 375M
    tokens) or, nearer the example's 100K-1M than GPT-3 Small's 125M, the example's own.
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
    )


# The language-model example's run (its config_fields.py): epochs over the corpus, and the share
# of the corpus held out for validation.
LM_EPOCHS = 4
LM_VAL_FRACTION = 0.1


def total_steps(recipe: Recipe, sequences_per_step: int) -> int:
    """Optimizer steps of the language model's example run with `recipe`'s corpus and context
    at `sequences_per_step` (an estimate: whole windows of the training share, per epoch)."""
    windows = (int(recipe.corpus_bytes * (1 - LM_VAL_FRACTION)) - 1) // recipe.block_size
    return LM_EPOCHS * max(1, math.ceil(windows / sequences_per_step))
