"""The example data of a language model: a corpus prepared into token shards (`prepare.py`),
read as memory-mapped windows (`corpus/shards.py`). Out of the box, the Python standard
library's own source, prepared offline into `data_dir` at the first run.

This file is yours: replace the data with your own; `scaffold update` leaves it alone. What the
rest of the project needs from it (`train.py` imports nothing else from here):

- `build_datasets(config) -> (train, validation)`: two map-style datasets with `len()` where
  `dataset[list_of_indices]` returns a whole batch `(inputs, targets)`, both int64 token ids
  `[B, block_size]` in `[0, vocabulary)`, targets the inputs shifted left by one token
  (IGNORE_INDEX where a token is not trained). `inputs` may be a tuple of tensors, the model's
  arguments: packed chat examples are `(tokens, documents)` (corpus/examples.py).
- `input_spec(config) -> (vocabulary, shape)`: the model's vocabulary in tokens (the initial
  loss is ln of it) and one input's shape `(block_size,)`, which `model.py` builds for. The
  vocabulary is `NUM_CLASSES` where you set it, else the prepared corpus's
  (`corpus_vocabulary(config)`: `vocab_size` in `data_dir`'s manifest.json, its tokenizer's
  vocabulary; where that is gone, in the copy a run keeps in `run_dir`), else, with nothing
  prepared yet, PLANNED_VOCABULARY, which scaffold's planner chose with the tokenizer
  (`scaffold plan` says why). A NUM_CLASSES above the corpus's vocabulary is padding, never a
  target; below it, it is refused.
- `NUM_CLASSES`, `PLANNED_VOCABULARY` and `corpus_vocabulary(config)`, which `model.py` also
  reads: a model folder (`init_from`) keeps its own vocabulary, refused where it is not a
  NUM_CLASSES you set or cannot hold the corpus's; and the run's start says what the
  vocabulary changed against the plan (`model.plan_change`).
"""

from __future__ import annotations

import sys
import sysconfig
import warnings
from pathlib import Path

from .config import Config, parse_param_count
from .corpus import (
    MANIFEST,
    RUN_MANIFEST,
    ExampleRows,
    Options,
    TokenWindows,
    manifest_at,
    prepare,
    read_manifest,
)

# What a prepared corpus is read as: windows of its text, or its chat or instruction examples.
Dataset = TokenWindows | ExampleRows
# The model's vocabulary: None takes the prepared corpus's (its manifest's vocab_size); a number
# of your own wins (at least the corpus's: more is padding).
NUM_CLASSES: int | None = None
# The vocabulary before anything is prepared, and the example's BPE size where it trains one:
# 256 byte values and end-of-text (tokenizer = "bytes").
PLANNED_VOCABULARY = 257
# The example cuts the stdlib's files into documents of at most 4 KiB at line breaks: enough
# documents in a small corpus for validation to be `val_fraction` of them.
EXAMPLE_DOCUMENT_BYTES = 4096


def stdlib_sources() -> list[Path]:
    """The standard library's .py files in a fixed order (site-packages and caches excluded)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "__pycache__"}
    files = [p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def prepare_example(config: Config) -> None:
    """Prepare the example's corpus in `data_dir` when it holds none and is empty or absent:
    the first `corpus_bytes` of the standard library's source, with the config's tokenizer
    (`bpe`: one of NUM_CLASSES or PLANNED_VOCABULARY tokens trained on it). Where it holds one
    prepared from another `corpus_bytes`, warn that the setting changes nothing there.
    Every process of a first run may do it at once; each writes its own temporary folder and
    the same corpus lands in `data_dir` (state_io.replace_folder)."""
    data_dir = Path(config.data_dir)
    if data_dir.exists() and any(data_dir.iterdir()):
        prepared = manifest_at(data_dir / MANIFEST)
        asked = prepared.request.get("max_bytes") if prepared else config.corpus_bytes
        if asked != config.corpus_bytes and prepared.kind == "text":  # examples: no budget
            was = "all of its sources" if asked is None else f"{asked:,} bytes"
            warnings.warn(
                f"corpus_bytes={config.corpus_bytes:,}, but {data_dir} was prepared from {was}: "
                f"corpus_bytes only sizes the example's first prepare; delete {data_dir} to "
                "prepare it again",
                stacklevel=3,
            )
        return  # a corpus, or the user's own files: read_manifest says which
    root = Path(sysconfig.get_paths()["stdlib"])
    sources = [str(path) for path in stdlib_sources()]
    print(f"preparing the example corpus (the stdlib's source) in {data_dir}", file=sys.stderr)
    options = Options(
        tokenizer=config.tokenizer,
        vocab_size=NUM_CLASSES or PLANNED_VOCABULARY,
        val_fraction=config.val_fraction,
        document_bytes=EXAMPLE_DOCUMENT_BYTES,
        max_bytes=config.corpus_bytes,
    )
    prepare(sources or [str(root)], data_dir, options)


def warn_of_repeats(config: Config, train_tokens: int) -> None:
    """Warn when the run will pass over a corpus more than 4 times (its `epochs`, or fewer
    where `max_tokens` or `max_steps` at one process's batch ends it sooner) while it holds
    fewer than 20 tokens per parameter: compute-optimal training sees ~20 (Hoffmann et al.
    2022), and beyond ~4 epochs repeated tokens are worth much less than new ones (Muennighoff
    et al. 2023, "Scaling Data-Constrained Language Models")."""
    per_parameter = train_tokens / parse_param_count(config.model_size)
    budget = config.step_budget(1) * config.global_batch_size(1) * config.block_size
    passes = min(config.epochs, budget / train_tokens) if budget else config.epochs
    if passes > 4 and per_parameter < 20:
        warnings.warn(
            f"{passes:.3g} epochs over {train_tokens:,} training tokens, "
            f"{per_parameter:.3g} per parameter of model_size={config.model_size}: beyond ~4 "
            "epochs repeats add little; prepare more text or train a smaller model",
            stacklevel=3,
        )


def corpus_vocabulary(config: Config) -> int | None:
    """The vocabulary in tokens of the corpus prepared in `data_dir` (its manifest's
    `vocab_size`) or, where that is gone, of the corpus the run in `run_dir` trained on (the
    copy it keeps, RUN_MANIFEST); None where neither has one."""
    prepared = manifest_at(Path(config.data_dir) / MANIFEST)
    prepared = prepared or manifest_at(Path(config.run_dir) / RUN_MANIFEST)
    return prepared.vocab_size if prepared else None


def input_spec(config: Config) -> tuple[int, tuple[int]]:
    """(the model's vocabulary in tokens, one input's shape `(block_size,)`): NUM_CLASSES where
    set, else the prepared corpus's (`corpus_vocabulary`), else PLANNED_VOCABULARY (nothing
    prepared yet).

    Raises:
        ValueError: NUM_CLASSES is set below the prepared corpus's vocabulary.
    """
    corpus = corpus_vocabulary(config)
    vocabulary = NUM_CLASSES or corpus or PLANNED_VOCABULARY
    if corpus and corpus > vocabulary:
        raise ValueError(
            f"{config.data_dir}'s tokenizer has {corpus} tokens and the model {vocabulary} "
            f"(NUM_CLASSES in data.py); set NUM_CLASSES = {corpus}, or None to take the corpus's"
        )
    return vocabulary, (config.block_size,)


def build_datasets(config: Config) -> tuple[Dataset, Dataset]:
    """The prepared corpus's train and validation windows of `block_size` tokens, or for chat
    and instruction examples their rows (`pack`: several examples a row).

    Raises:
        ValueError: no prepared corpus in `data_dir` (the message gives the prepare command),
            a shard changed since, a vocabulary larger than a NUM_CLASSES of yours
            (`input_spec`), or too few tokens for a window in either split.
    """
    if config.prepare_example:
        prepare_example(config)
    data_dir = Path(config.data_dir)
    hint = f"run `python -m {__package__}.prepare SOURCES --out {data_dir}` first"
    manifest = read_manifest(data_dir, hint)
    input_spec(config)  # refuses a NUM_CLASSES below the corpus's vocabulary
    if manifest.kind == "text":
        train, val = (
            TokenWindows(data_dir, manifest.shards[split], manifest.dtype, config.block_size)
            for split in ("train", "val")
        )
    else:  # chat or instruction examples, each row one of them or packed
        train, val = (
            ExampleRows(
                data_dir,
                manifest.shards[split],
                manifest.dtype,
                config.block_size,
                config.pack,
                manifest.eot_id,
            )
            for split in ("train", "val")
        )
    warn_of_repeats(config, manifest.tokens("train"))
    if not len(train) or not len(val):
        raise ValueError(
            f"{data_dir} has {manifest.tokens('train')} train and {manifest.tokens('val')} "
            f"validation tokens, too few for windows of block_size={config.block_size}; "
            "prepare more text or lower block_size"
        )
    return train, val
