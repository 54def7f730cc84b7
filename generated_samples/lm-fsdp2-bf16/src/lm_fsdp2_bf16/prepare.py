"""Tokenize text into token shards: `python -m lm_fsdp2_bf16.prepare SOURCES... [--out DIR]`.

The command line of `corpus.prepare` (corpus/pipeline.py says what it reads, how, and what it
writes), and what the corpus's vocabulary means for this project's model (which takes it
where NUM_CLASSES in data.py is None).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from .config import Config, command_parser, load_config, user_errors
from .corpus.chat import FORMATS
from .corpus.pipeline import DOCUMENT_BYTES, Options, plural, prepare, stop_on_sigterm
from .corpus.shards import BYTE_VOCABULARY, SPLITS, TOKENIZER_FILE, Manifest
from .data import NUM_CLASSES, PLANNED_VOCABULARY
from .task_config import tokenizer_problem


def main(argv: list[str] | None = None) -> Manifest:
    """Entry point; prints a line per phase, then where the corpus is and its token counts."""
    parser = command_parser(__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", metavar="SOURCES", help="files, folders or globs")
    parser.add_argument("--config", default="configs/train.toml", help="defaults of the options")
    parser.add_argument("--out", help="the corpus folder (default: the config's data_dir)")
    parser.add_argument("--tokenizer", help="bytes, bpe or a tokenizer.json (default: config's)")
    parser.add_argument(
        "--vocab-size", type=int, help="tokens of a trained bpe (default: the model's, or 8192)"
    )
    parser.add_argument("--text-key", default="text", help="the text field of jsonl and parquet")
    parser.add_argument(
        "--encoding", default="utf-8", help="of text files not valid UTF-8 (e.g. latin-1, utf-16)"
    )
    parser.add_argument("--val-fraction", type=float, help="documents held out (config's)")
    parser.add_argument("--max-bytes", type=int, help="read at most this many source bytes")
    parser.add_argument(
        "--document-bytes", type=int, default=DOCUMENT_BYTES, help="a text file's documents"
    )
    parser.add_argument("--workers", type=int, help="processes that encode (default: CPUs)")
    parser.add_argument("--shard-tokens", type=int, default=1 << 27, help="tokens per shard")
    parser.add_argument("--eot", help="the end-of-text token of a tokenizer.json")
    parser.add_argument("--tokenizer-sample-bytes", type=int, help="text a bpe is trained on")
    parser.add_argument("--skip-bad-files", action="store_true", help="leave out unreadable files")
    parser.add_argument("--skip-bad-records", action="store_true", help="and records with no text")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="text (documents), chat (jsonl/parquet `messages`) or completion (`prompt`, "
        "`completion`): examples trained on their replies or completions only",
    )
    parser.add_argument("--chat-template", help="a .jinja file (default: the tokenizer's own)")
    parser.add_argument(
        "--max-example-tokens", type=int, help="an example's most tokens (default: block_size)"
    )
    parser.add_argument(
        "--too-long", choices=("drop", "truncate"), default="drop", help="a longer example"
    )
    args = parser.parse_args(argv)
    # The model's vocabulary where it is a BPE's; a byte-level model's is no BPE to train.
    model_vocabulary = NUM_CLASSES or PLANNED_VOCABULARY
    bpe = model_vocabulary if model_vocabulary > BYTE_VOCABULARY else 8192
    vocab_size = args.vocab_size or bpe
    with user_errors():
        config = load_config(args.config, [])
        out = Path(args.out or config.data_dir)
        if args.workers is not None and args.workers < 1:
            raise ValueError(f"--workers must be at least 1, got {args.workers}")
        tokenizer = args.tokenizer or config.tokenizer
        check_tokenizer_options(args, tokenizer)
        if problem := tokenizer_problem(config.init_from, tokenizer):
            own = Path(config.init_from) / TOKENIZER_FILE
            raise ValueError(f"{problem}; pass --tokenizer {own}, or leave --tokenizer out")
        options = Options(
            tokenizer=tokenizer,
            vocab_size=vocab_size,
            tokenizer_sample_bytes=args.tokenizer_sample_bytes or Options.tokenizer_sample_bytes,
            eot=args.eot,
            text_key=args.text_key,
            encoding=args.encoding,
            val_fraction=config.val_fraction if args.val_fraction is None else args.val_fraction,
            document_bytes=args.document_bytes,
            max_bytes=args.max_bytes,
            shard_tokens=args.shard_tokens,
            skip_bad_files=args.skip_bad_files,
            skip_bad_records=args.skip_bad_records,
            format=args.format,
            chat_template=args.chat_template,
            max_example_tokens=args.max_example_tokens or config.block_size,
            too_long=args.too_long,
        )
        started = time.perf_counter()
        previous = signal.signal(signal.SIGTERM, stop_on_sigterm)
        try:
            manifest = prepare(
                args.sources,
                out,
                options,
                workers=args.workers or os.cpu_count() or 1,
                progress=sys.stderr.isatty(),
                log=lambda line: print(f"prepare: {line}", file=sys.stderr, flush=True),
            )
        except KeyboardInterrupt as stop:
            print(f"interrupted: {out} is as it was before", file=sys.stderr)
            raise SystemExit(128 + getattr(stop, "signal_number", signal.SIGINT)) from None
        finally:
            signal.signal(signal.SIGTERM, previous)
    seconds = time.perf_counter() - started
    train, val = (manifest.tokens(split) for split in SPLITS)
    share = val / (train + val)
    unit = "document" if manifest.kind == "text" else f"{manifest.kind} example"
    print(
        f"{out}: {train:,} train and {val:,} validation tokens ({share:.1%}; "
        f"{manifest.documents['val']:,} of {plural(sum(manifest.documents.values()), unit)}"
        f"), {manifest.tokenizer} tokenizer, {manifest.dtype}, in {seconds:.1f} s"
    )
    print(vocabulary_advice(manifest.vocab_size, NUM_CLASSES, config))
    return manifest


def check_tokenizer_options(args: argparse.Namespace, tokenizer: str) -> None:
    """Refuse an option the tokenizer does not use, rather than ignore it.

    Raises:
        ValueError: --vocab-size or --tokenizer-sample-bytes for a tokenizer that is not
            trained (bytes, a tokenizer.json), --eot for one that is no tokenizer.json.
    """
    source = "--tokenizer" if args.tokenizer else f"the config's tokenizer ({args.config})"
    trained = (
        ("--vocab-size", args.vocab_size),
        ("--tokenizer-sample-bytes", args.tokenizer_sample_bytes),
    )
    for option, value in trained:
        if value is not None and tokenizer != "bpe":
            raise ValueError(
                f"{option} sets a BPE that prepare trains, and the tokenizer is {tokenizer} "
                f"({source}); add --tokenizer bpe, or leave {option} out"
            )
    if args.eot is not None and tokenizer in ("bytes", "bpe"):
        raise ValueError(
            f"--eot names the end-of-text token of a tokenizer.json, and the tokenizer is "
            f"{tokenizer} (its own is used); leave --eot out"
        )


def vocabulary_advice(vocab_size: int, num_classes: int | None, config: Config) -> str:
    """What the corpus's vocabulary means for the model: with NUM_CLASSES unset (None), the
    model takes it, and the shape `model_size` then builds (where model.py says:
    `describe_shape`) against the planned one; with NUM_CLASSES set, whether it holds it. A
    model started from `init_from` keeps its folder's vocabulary."""
    if config.init_from and num_classes is None:
        return f"the vocabulary has {vocab_size} tokens; the model keeps {config.init_from}'s"
    if num_classes is None:
        advice = (
            f"the vocabulary has {vocab_size} tokens: the model takes it from the manifest "
            "(NUM_CLASSES in data.py is None)"
        )
        planned = PLANNED_VOCABULARY
    elif vocab_size < num_classes:
        return (
            f"the vocabulary has {vocab_size} tokens and the model {num_classes}: it trains as "
            "it is, the model's extra tokens padding that is never a target"
        )
    elif vocab_size == num_classes:
        return f"the vocabulary has {vocab_size} tokens, as the model (NUM_CLASSES in data.py)"
    else:
        advice = (
            f"the vocabulary has {vocab_size} tokens and the model {num_classes}: set "
            f"NUM_CLASSES = {vocab_size} (or None) in data.py to train on it"
        )
        planned = num_classes
    if vocab_size == planned:
        return f"{advice}, as planned"
    try:
        from .model import describe_shape
    except ImportError:  # a model.py of your own
        return advice
    return (
        f"{advice}; model_size={config.model_size} then builds "
        f"{describe_shape(config, vocab_size)} (at {planned}: "
        f"{describe_shape(config, planned)}): a larger vocabulary takes parameters from the "
        "blocks, and a small model wants a smaller --vocab-size"
    )


if __name__ == "__main__":
    main()
