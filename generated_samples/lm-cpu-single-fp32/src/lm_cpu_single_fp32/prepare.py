"""Tokenize text into token shards: `python -m lm_cpu_single_fp32.prepare SOURCES...`.

SOURCES are files, folders (searched recursively) or glob patterns of text files (`.txt`, `.md`,
`.py`, ...: cut into documents of at most 1 MiB at line breaks), `.jsonl` (one document per
line, its `--text-key` field) and `.parquet` (the `--text-key` column). The tokenizer is
`bytes` (one token per byte), `bpe` (a byte-level BPE of `--vocab-size` tokens trained on the
first `--tokenizer-sample-bytes` of the sources, with HF `tokenizers`) or the path of a
`tokenizer.json` (a GPT-2 or Llama tokenizer you have on disk). Every document is followed by
the end-of-text token; a fixed `--val-fraction` of whole documents is held out for validation
(evenly spaced within each source, at a phase drawn from a hash of its path).

The result is corpus.py's: flat token shards (`uint16` where the vocabulary fits, else
`uint32`) and `manifest.json`. Files are encoded in parallel (`--workers` processes), read and
written in pieces: memory stays constant whatever the corpus size. The corpus is written into a
temporary folder that replaces DIR only once complete; a re-run on unchanged sources with the
same settings does nothing, and a changed source is noticed (size or modification time).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from .config import load_config, user_errors
from .corpus import (
    CHUNK_BYTES,
    DTYPES,
    END_OF_TEXT,
    FORMAT,
    MANIFEST,
    SPLITS,
    TOKENIZER_FILE,
    Codec,
    Manifest,
    Shard,
    file_sha256,
)
from .sources import DATA_SUFFIXES, DOCUMENT_BYTES, documents, find_sources
from .state_io import atomic_write_text

BATCH_BYTES = 1 << 22  # text encoded in one call of the tokenizer


def is_validation(source: Path, number: int, val_fraction: float) -> bool:
    """Whether document `number` of `source` is held out: evenly spaced within each source
    (every 1 / val_fraction-th document), at a phase drawn from a hash of its path, so that the
    split depends on neither the order in which workers finish nor the other sources."""
    digest = hashlib.blake2b(source.as_posix().encode(), digest_size=8).digest()
    phase = int.from_bytes(digest, "little") / 2**64
    before, after = (math.floor(n * val_fraction + phase) for n in (number, number + 1))
    return after > before


# --- tokenizers ---


def encode_documents(codec: Codec, texts: list[str]) -> list[np.ndarray]:
    """Each text's token ids (int64 `[n]`), the end-of-text id appended."""
    return [np.array([*ids, codec.eot_id], dtype=np.int64) for ids in codec.encode_batch(texts)]


def train_bpe(sources: list[Path], text_key: str, vocab_size: int, sample_bytes: int, out: Path):
    """Train a byte-level BPE of `vocab_size` tokens (END_OF_TEXT included) on the first
    `sample_bytes` of the sources' documents and save it as `out` (a tokenizer.json).
    Deterministic: the same sample gives the same merges.

    Raises:
        ValueError: `vocab_size` below 257 (the 256 byte tokens and end-of-text).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise ValueError(f"--vocab-size {vocab_size} is below 257; a byte-level BPE needs 257")

    def sample() -> Iterator[str]:
        taken = 0
        for source in sources:
            for text in documents(source, text_key, sample_bytes - taken):
                yield text
                taken += len(text)
                if taken >= sample_bytes:
                    return

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(sample(), trainer)
    tokenizer.save(str(out))


# --- encoding, in worker processes ---


@dataclass(frozen=True)
class Job:
    """Some source files for one worker; each with the bytes of it to read (None: whole)."""

    number: int
    files: tuple[tuple[Path, int | None], ...]


@dataclass(frozen=True)
class Settings:
    """What every worker needs: the tokenizer, the text field, the split, the scratch folder."""

    tokenizer_file: Path | None
    eot: str | None
    text_key: str
    val_fraction: float
    document_bytes: int
    scratch: Path
    dtype: str


WORKER: dict[str, Any] = {}  # each worker process's Codec and Settings (`start_worker`)


def start_worker(settings: Settings, parallel_tokenizer: bool) -> None:
    """Load the tokenizer once per process; with several workers, the tokenizer's own
    threads would only compete with them for the cores."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    if not parallel_tokenizer:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    WORKER["codec"] = Codec(settings.tokenizer_file, settings.eot)
    WORKER["settings"] = settings


def encode_job(job: Job) -> dict[str, int]:
    """Encode one job's files into its part files (`part-NNNNN.<split>.bin` in the scratch
    folder), in file order; return its counts: bytes read, tokens and documents per split."""
    codec, settings = WORKER["codec"], WORKER["settings"]
    counts = dict.fromkeys(["bytes", *[f"{s}_tokens" for s in SPLITS]], 0)
    counts |= dict.fromkeys([f"{s}_documents" for s in SPLITS], 0)
    dtype = DTYPES[settings.dtype]
    with contextlib.ExitStack() as files:
        names = {split: settings.scratch / f"part-{job.number:05d}.{split}.bin" for split in SPLITS}
        parts = {split: files.enter_context(open(name, "wb")) for split, name in names.items()}
        for path, limit in job.files:
            counts["bytes"] += path.stat().st_size if limit is None else limit
            batch: list[tuple[str, str]] = []
            texts = documents(path, settings.text_key, limit, settings.document_bytes)
            for number, text in enumerate(texts):
                split = "val" if is_validation(path, number, settings.val_fraction) else "train"
                batch.append((split, text))
                if sum(len(text) for _, text in batch) >= BATCH_BYTES:
                    write_batch(codec, batch, parts, dtype, counts)
                    batch = []
            write_batch(codec, batch, parts, dtype, counts)
    return counts


def write_batch(codec: Codec, batch, parts, dtype, counts) -> None:
    """Encode `batch` ((split, text) pairs) and append each document's ids to its split."""
    if not batch:
        return
    encoded = encode_documents(codec, [text for _, text in batch])
    for (split, _), ids in zip(batch, encoded, strict=True):
        ids.astype(dtype).tofile(parts[split])
        counts[f"{split}_tokens"] += len(ids)
        counts[f"{split}_documents"] += 1


# --- the whole prepare ---


def prepare(
    patterns: list[str],
    out: Path,
    tokenizer: str = "bytes",
    vocab_size: int = 8192,
    text_key: str = "text",
    val_fraction: float = 0.1,
    document_bytes: int = DOCUMENT_BYTES,
    max_bytes: int | None = None,
    workers: int | None = None,
    shard_tokens: int = 1 << 27,
    tokenizer_sample_bytes: int = 1 << 27,
    eot: str | None = None,
    progress: bool = True,
) -> Manifest:
    """Prepare the corpus of SOURCES `patterns` in `out` (see the module docstring); return its
    manifest. `document_bytes` caps a text file's documents; `max_bytes` stops after that many
    bytes of the sources (a text file cut at a line break); `shard_tokens` caps each shard;
    `workers` defaults to the CPU count.

    Raises:
        ValueError: bad sources (`find_sources`, `documents`), an unknown tokenizer, a
            `val_fraction` outside (0, 1), or a corpus without a document in either split.
            Nothing is written then, and a corpus already in `out` is left as it was.
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"--val-fraction must be in (0, 1), got {val_fraction}")
    if max_bytes is not None and max_bytes < 1:
        raise ValueError(f"--max-bytes must be at least 1, got {max_bytes}")
    if tokenizer not in ("bytes", "bpe"):
        if not Path(tokenizer).is_file():
            raise ValueError(f"tokenizer {tokenizer}: no such file; name bytes, bpe or a file")
        Codec(Path(tokenizer), eot)  # its errors name the user's file, not our copy
    sources = find_sources(patterns)
    budgets = read_budgets(sources, max_bytes)
    request = {
        "format": FORMAT,
        "sources": [
            {"path": str(path), "bytes": path.stat().st_size, "mtime_ns": path.stat().st_mtime_ns}
            for path, _ in budgets
        ],
        "max_bytes": max_bytes,
        "tokenizer": tokenizer,
        "tokenizer_sha256": file_sha256(Path(tokenizer)) if Path(tokenizer).is_file() else None,
        "vocab_size": vocab_size if tokenizer == "bpe" else None,
        "tokenizer_sample_bytes": tokenizer_sample_bytes if tokenizer == "bpe" else None,
        "eot": eot,
        "text_key": text_key,
        "val_fraction": val_fraction,
        "document_bytes": document_bytes,
        "shard_tokens": shard_tokens,
    }
    existing = up_to_date(out, request)
    if existing is not None:
        if progress:
            print(f"{out} is up to date with its sources and settings", file=sys.stderr)
        return existing
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    scratch.chmod(0o777 & ~umask)  # mkdtemp's 0700 would hide the corpus from other users
    try:
        manifest = write_corpus(sources, budgets, scratch, request, workers, progress)
        replace_folder(scratch, out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return manifest


def read_budgets(sources: list[Path], max_bytes: int | None) -> list[tuple[Path, int | None]]:
    """Each source with the bytes of it to read (None: whole), sources past `max_bytes` left
    out; a text file that crosses it is cut there."""
    if max_bytes is None:
        return [(path, None) for path in sources]
    budgets, left = [], max_bytes
    for path in sources:
        if left <= 0:
            break
        size = path.stat().st_size
        cut = path.suffix.lower() not in DATA_SUFFIXES and size > left
        budgets.append((path, left if cut else None))
        left -= size
    return budgets


def up_to_date(out: Path, request: dict[str, Any]) -> Manifest | None:
    """The manifest in `out` when it was prepared from this very request (same sources, sizes,
    modification times and settings), else None."""
    try:
        manifest = Manifest.from_json((out / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return manifest if manifest.request == request else None


def write_corpus(sources, budgets, scratch: Path, request, workers, progress) -> Manifest:
    """Tokenizer, part files, shards and manifest, all in `scratch`."""
    tokenizer, settings_tokenizer = request["tokenizer"], None
    if tokenizer == "bpe":
        settings_tokenizer = scratch / TOKENIZER_FILE
        sample = request["tokenizer_sample_bytes"]
        train_bpe(sources, request["text_key"], request["vocab_size"], sample, settings_tokenizer)
    elif tokenizer != "bytes":
        settings_tokenizer = scratch / TOKENIZER_FILE
        shutil.copyfile(tokenizer, settings_tokenizer)
    codec = Codec(settings_tokenizer, request["eot"])
    dtype = "uint16" if codec.vocab_size <= 2**16 else "uint32"
    settings = Settings(
        settings_tokenizer,
        request["eot"],
        request["text_key"],
        request["val_fraction"],
        request["document_bytes"],
        scratch,
        dtype,
    )
    jobs = make_jobs(budgets, workers or os.cpu_count() or 1)
    totals = run_jobs(jobs, settings, workers or os.cpu_count() or 1, progress)
    held_out, documents = totals.get("val_documents", 0), totals.get("train_documents", 0)
    if not held_out or not documents:
        raise ValueError(
            f"the sources hold {held_out + documents} document(s), too few to hold some out "
            "for validation; add text, or cut text files into more documents (--document-bytes)"
        )
    shards = {
        split: write_shards(scratch, len(jobs), split, dtype, request["shard_tokens"])
        for split in SPLITS
    }
    manifest = Manifest(
        tokenizer="bytes" if tokenizer == "bytes" else "bpe" if tokenizer == "bpe" else "file",
        vocab_size=codec.vocab_size,
        eot_id=codec.eot_id,
        dtype=dtype,
        shards=shards,
        documents={split: totals[f"{split}_documents"] for split in SPLITS},
        source_bytes=totals["bytes"],
        request=request,
    )
    atomic_write_text(manifest.to_json(), scratch / MANIFEST)  # last: the corpus is complete
    return manifest


def make_jobs(budgets: list[tuple[Path, int | None]], workers: int) -> list[Job]:
    """The sources in order, grouped into jobs of about 8 MiB (at least one per worker where
    there are enough files): few jobs for many small files, one per large file."""
    total = sum(path.stat().st_size if limit is None else limit for path, limit in budgets)
    target = max(1, min(8 << 20, total // workers))
    jobs, files, size = [], [], 0
    for path, limit in budgets:
        files.append((path, limit))
        size += path.stat().st_size if limit is None else limit
        if size >= target:
            jobs.append(Job(len(jobs), tuple(files)))
            files, size = [], 0
    if files:
        jobs.append(Job(len(jobs), tuple(files)))
    return jobs


def run_jobs(jobs: list[Job], settings: Settings, workers: int, progress: bool) -> dict[str, int]:
    """Encode every job (in `workers` processes, or here for one), with a progress bar of
    bytes/s and tokens/s; return the summed counts."""
    totals: dict[str, int] = {}
    total_bytes = sum(p.stat().st_size if n is None else n for job in jobs for p, n in job.files)
    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="prepare", disable=not progress)
    start = time.perf_counter()

    def count(result: dict[str, int]) -> None:
        for key, value in result.items():
            totals[key] = totals.get(key, 0) + value
        tokens = totals["train_tokens"] + totals["val_tokens"]
        bar.update(result["bytes"])
        bar.set_postfix(tokens_per_s=f"{tokens / (time.perf_counter() - start):,.0f}")

    workers = min(workers, len(jobs))
    try:
        if workers <= 1:
            start_worker(settings, parallel_tokenizer=True)
            for job in jobs:
                count(encode_job(job))
        else:
            context = get_context("spawn")  # no fork of a process the tokenizer has threads in
            with ProcessPoolExecutor(
                workers, mp_context=context, initializer=start_worker, initargs=(settings, False)
            ) as pool:
                for result in pool.map(encode_job, jobs):
                    count(result)
    finally:
        bar.close()
    return totals


def write_shards(scratch: Path, parts: int, split: str, dtype: str, shard_tokens: int):
    """Concatenate one split's part files, in job order, into shards of at most
    `shard_tokens` tokens (`<split>-NNNNN.bin`, each fsynced), CHUNK_BYTES at a time; return
    their records."""
    itemsize = np.dtype(DTYPES[dtype]).itemsize
    shard_bytes = shard_tokens * itemsize
    chunks = part_chunks(scratch, parts, split)
    shards: list[Shard] = []
    pending = b""
    while True:
        path = scratch / f"{split}-{len(shards):05d}.bin"
        digest, written = hashlib.sha256(), 0
        with open(path, "wb") as shard:
            while written < shard_bytes and (pending := pending or next(chunks, b"")):
                piece, pending = pending[: shard_bytes - written], pending[shard_bytes - written :]
                shard.write(piece)
                digest.update(piece)
                written += len(piece)
            shard.flush()
            os.fsync(shard.fileno())
        if not written:
            path.unlink()
            return tuple(shards)
        shards.append(Shard(path.name, written // itemsize, digest.hexdigest()))


def part_chunks(scratch: Path, parts: int, split: str) -> Iterator[bytes]:
    """The bytes of one split's part files in job order, CHUNK_BYTES at most at a time; each
    part file is removed once read."""
    for number in range(parts):
        part = scratch / f"part-{number:05d}.{split}.bin"
        with open(part, "rb") as source:
            while chunk := source.read(CHUNK_BYTES):
                yield chunk
        part.unlink()


def replace_folder(scratch: Path, out: Path) -> None:
    """Put the complete corpus in `scratch` at `out`: renamed into place, the corpus it
    replaces (if any) removed after. A process that prepared the same corpus at the same time
    (every rank of a first run) may have put it there first: then `out` is kept."""
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        with contextlib.suppress(FileNotFoundError):  # another process moved it a moment ago
            out.rename(old / out.name)
    try:
        scratch.rename(out)
    except OSError:
        if not (out / MANIFEST).is_file():
            raise
    if out.exists():
        for old in out.parent.glob(f".{out.name}.old-*"):
            shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> Manifest:
    """Entry point; prints where the corpus is and its token counts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", metavar="SOURCES", help="files, folders or globs")
    parser.add_argument("--config", default="configs/train.toml", help="defaults of the options")
    parser.add_argument("--out", help="the corpus folder (default: the config's data_dir)")
    parser.add_argument("--tokenizer", help="bytes, bpe or a tokenizer.json (default: config's)")
    parser.add_argument(
        "--vocab-size", type=int, help="tokens of a trained bpe (default: the model's, or 8192)"
    )
    parser.add_argument("--text-key", default="text", help="the text field of jsonl and parquet")
    parser.add_argument("--val-fraction", type=float, help="documents held out (config's)")
    parser.add_argument("--max-bytes", type=int, help="read at most this many source bytes")
    parser.add_argument(
        "--document-bytes", type=int, default=DOCUMENT_BYTES, help="a text file's documents"
    )
    parser.add_argument("--workers", type=int, help="processes that encode (default: CPUs)")
    parser.add_argument("--shard-tokens", type=int, default=1 << 27, help="tokens per shard")
    parser.add_argument("--eot", help="the end-of-text token of a tokenizer.json")
    parser.add_argument(
        "--tokenizer-sample-bytes", type=int, default=1 << 27, help="text a bpe is trained on"
    )
    args = parser.parse_args(argv)
    from .data import NUM_CLASSES  # here: data.py imports this module

    # The model's vocabulary where it is a BPE's; a byte-level model's 257 is no BPE to train.
    vocab_size = args.vocab_size or (NUM_CLASSES if NUM_CLASSES > 257 else 8192)
    with user_errors():
        config = load_config(args.config, [])
        out = Path(args.out or config.data_dir)
        counts = ("workers", "document_bytes", "shard_tokens", "vocab_size")
        counts += ("tokenizer_sample_bytes",)
        for option, value in ((name, getattr(args, name)) for name in counts):
            option = "--" + option.replace("_", "-")  # --max-bytes: prepare() checks it
            if value is not None and value < 1:
                raise ValueError(f"{option} must be at least 1, got {value}")
        val_fraction = config.val_fraction if args.val_fraction is None else args.val_fraction
        started = time.perf_counter()
        try:
            manifest = prepare(
                args.sources,
                out,
                tokenizer=args.tokenizer or config.tokenizer,
                vocab_size=vocab_size,
                text_key=args.text_key,
                val_fraction=val_fraction,
                document_bytes=args.document_bytes,
                max_bytes=args.max_bytes,
                workers=args.workers,
                shard_tokens=args.shard_tokens,
                eot=args.eot,
                tokenizer_sample_bytes=args.tokenizer_sample_bytes,
                progress=sys.stderr.isatty(),
            )
        except KeyboardInterrupt:
            raise SystemExit(f"interrupted: {out} is as it was before") from None
    seconds = time.perf_counter() - started
    train, val = (manifest.tokens(split) for split in SPLITS)
    share = val / (train + val)
    print(
        f"{out}: {train:,} train and {val:,} validation tokens ({share:.1%}; "
        f"{manifest.documents['val']} of {sum(manifest.documents.values())} documents), "
        f"{manifest.tokenizer} tokenizer, {manifest.dtype}, in {seconds:.1f} s"
    )
    if manifest.vocab_size > NUM_CLASSES:
        print(
            f"the vocabulary has {manifest.vocab_size} tokens and the model {NUM_CLASSES}: "
            f"set NUM_CLASSES = {manifest.vocab_size} in data.py to train on it; its embedding "
            f"and head then take 2 x {manifest.vocab_size} x width of model_size's parameters "
            f"({2 * manifest.vocab_size * 32:,} at the smallest width, 32): a small model "
            "wants a smaller --vocab-size"
        )
    elif manifest.vocab_size < NUM_CLASSES:
        print(
            f"the vocabulary has {manifest.vocab_size} tokens and the model {NUM_CLASSES}: it "
            "trains as it is, the model's extra tokens padding that is never a target"
        )
    return manifest


if __name__ == "__main__":
    main()
