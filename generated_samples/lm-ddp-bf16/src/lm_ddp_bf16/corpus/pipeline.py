"""Tokenize text into token shards: `prepare(sources, out, options)`, which
`python -m <package>.prepare SOURCES...` runs.

SOURCES are files, folders (searched recursively; their files of other kinds are skipped and
counted) or glob patterns of text files (`.txt`, `.md`, `.rst`, `.py`, `.text`), JSON lines
(`.jsonl`: one document per line, its `--text-key` field) and parquet files (the `--text-key`
column); text and JSON lines may be compressed (`.gz`, `.zst`). Text files are cut into
documents at line breaks (`--document-bytes`; documents.py). The tokenizer is `bytes` (one
token per byte), `bpe` (a byte-level BPE of `--vocab-size` tokens trained on the first
`--tokenizer-sample-bytes` of the sources, with HF `tokenizers`) or the path of a
`tokenizer.json` (a GPT-2 or Llama tokenizer you have on disk). Every document is followed by
the end-of-text token; a fixed `--val-fraction` of whole documents is held out for validation
(evenly spaced within each source, at a phase drawn from a hash of its path).

Nothing is decoded loosely: a text file that is not valid UTF-8 (nor in `--encoding`, where
one is named for such files) or holds NUL characters is refused by name, and so is a JSON line
or parquet row that holds no text, before anything is encoded; `--skip-bad-files` and
`--skip-bad-records` leave them out instead, counted in the output and the manifest.

It runs in phases, each printed with its time: survey the sources (survey.py: every
file read once through, in parallel), train the BPE, encode (in `--workers` processes; jobs of
a few MiB, so that one large file uses every core) and write the shards. Memory is bounded
whatever the size of a document or of the corpus (documents.py's pieces). The result is
shards.py's: flat token shards (`uint16` where the vocabulary fits, else `uint32`) and
`manifest.json`, written in a temporary folder that replaces DIR only once complete. A Ctrl-C
or SIGTERM stops it at once, its workers ended and DIR as it was; the next prepare removes what
it left. A re-run on
unchanged sources (sizes and modification times) with the same settings does nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ..state_io import (
    FULL_DISK,
    atomic_write_text,
    check_replaceable,
    locked,
    remove_stale_scratch,
    replace_folder,
    scratch_folder,
)
from .chat import FORMATS
from .documents import check_encoding
from .examples import chat_template_file, write_examples
from .jobs import Job, Settings, Workers, encode_job, make_jobs, part_file, train_bpe
from .shards import (
    BYTE_VOCABULARY,
    CHUNK_BYTES,
    DTYPES,
    FORMAT,
    MANIFEST,
    SPLITS,
    TOKENIZER_FILE,
    Codec,
    Manifest,
    Shard,
    file_sha256,
    manifest_at,
)
from .sources import Sources, compression, find_sources, plural, source_kind
from .survey import NAMED, Survey, survey_source

DOCUMENT_BYTES = 1 << 20  # a text file is cut into documents of about this, at line breaks


@dataclass(frozen=True)
class Options:
    """What prepare is asked besides its sources and output (the command line's options):
    the tokenizer ("bytes", "bpe" or a tokenizer.json path), the BPE's `vocab_size` and
    `tokenizer_sample_bytes`, the end-of-text token `eot` of a tokenizer.json, the `text_key`
    of JSON lines and parquet, the `encoding` of text files not valid UTF-8, the
    `val_fraction` of documents held out, the `document_bytes` a text file is cut at,
    `max_bytes` of sources read (None: all), the `shard_tokens` of a shard, and whether files
    and records that cannot be read are left out (`skip_bad_files`, `skip_bad_records`)
    rather than refused. For chat and instruction records (`format` "chat" or "completion",
    examples.py): the `chat_template` file (None: the tokenizer's own), the
    `max_example_tokens` of an example and what becomes of a longer one (`too_long`: "drop"
    or "truncate")."""

    tokenizer: str = "bytes"
    vocab_size: int = 8192
    tokenizer_sample_bytes: int = 1 << 27
    eot: str | None = None
    text_key: str = "text"
    encoding: str = "utf-8"
    val_fraction: float = 0.1
    document_bytes: int = DOCUMENT_BYTES
    max_bytes: int | None = None
    shard_tokens: int = 1 << 27
    skip_bad_files: bool = False
    skip_bad_records: bool = False
    format: str = "text"
    chat_template: str | None = None
    max_example_tokens: int = 2048
    too_long: str = "drop"

    def check(self) -> None:
        """Raises ValueError: a setting outside its range, an unknown encoding, a tokenizer
        that is neither bytes, bpe nor a tokenizer.json with the end-of-text token `eot`."""
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"--val-fraction must be in (0, 1), got {self.val_fraction}")
        counts = ("vocab_size", "tokenizer_sample_bytes", "document_bytes", "shard_tokens")
        for name in counts + ("max_bytes",) * (self.max_bytes is not None):
            if getattr(self, name) < 1:
                option = "--" + name.replace("_", "-")
                raise ValueError(f"{option} must be at least 1, got {getattr(self, name)}")
        if self.tokenizer == "bpe" and self.vocab_size < BYTE_VOCABULARY:
            raise ValueError(
                f"--vocab-size {self.vocab_size} is below {BYTE_VOCABULARY}; a byte-level BPE "
                f"needs {BYTE_VOCABULARY}"
            )
        check_encoding(self.encoding)
        self.check_examples()
        if self.tokenizer not in ("bytes", "bpe"):
            if not Path(self.tokenizer).is_file():
                raise ValueError(
                    f"tokenizer {self.tokenizer}: no such file; name bytes, bpe or a file"
                )
            Codec(Path(self.tokenizer), self.eot)  # its errors name the user's file, not our copy

    def check_examples(self) -> None:
        """Raises ValueError: an unknown format or too_long, a max_example_tokens below 2, a
        chat template that is no file, or records to be encoded by a BPE prepare would train
        (a model that follows a template knows its tokenizer already)."""
        if self.format not in FORMATS:
            raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.format == "text":
            return
        if self.too_long not in ("drop", "truncate"):
            raise ValueError(f"--too-long must be drop or truncate, got {self.too_long!r}")
        if self.max_example_tokens < 2:
            raise ValueError(
                f"--max-example-tokens must be at least 2, got {self.max_example_tokens}"
            )
        if self.tokenizer == "bpe":
            raise ValueError(
                f"--format {self.format} encodes with the model's own tokenizer; pass --tokenizer "
                "with its tokenizer.json (a model started from init_from has one), or bytes"
            )
        if self.chat_template and not Path(self.chat_template).is_file():
            raise ValueError(f"--chat-template {self.chat_template}: no such file")


def prepare(
    patterns: list[str],
    out: Path,
    options: Options | None = None,
    workers: int = 0,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
    **settings: Any,
) -> Manifest:
    """Prepare the corpus of SOURCES `patterns` in `out` (see the module docstring) with
    `options` (default `Options()`), any of whose fields `settings` may change (`prepare(...,
    tokenizer="bpe")`, as callers written before `Options` do), in `workers` processes (0: in
    this one); return its manifest. `progress` shows a bar while it encodes; `log` gets a line
    per phase.

    Raises:
        ValueError: bad options or sources, a file or record that cannot be read (unless left
            out), a corpus without a document in either split, or a full disk (the message
            says where and how much). Nothing is written then, and a corpus already in `out`
            is left as it was; so it is on KeyboardInterrupt.
    """
    say = log or (lambda line: None)
    options = dataclasses.replace(options or Options(), **settings)
    options.check()
    sources = find_sources(patterns)
    check_replaceable(out, MANIFEST, list(sources.files))
    budgets = read_budgets(sources.files, options.max_bytes)
    named = options.tokenizer not in ("bytes", "bpe")  # a tokenizer.json: its content counts
    request = {
        "format": FORMAT,
        "sources": [
            {"path": str(path), "bytes": path.stat().st_size, "mtime_ns": path.stat().st_mtime_ns}
            for path, _ in budgets
        ],
        **dataclasses.asdict(options),
        "tokenizer_sha256": file_sha256(Path(options.tokenizer)) if named else None,
    }
    if options.format != "text":  # the template decides what is trained
        template = chat_template_file(options)
        request["chat_template_sha256"] = file_sha256(template) if template else None
    existing = up_to_date(out, request)
    if existing is not None:
        with locked(out.parent, wait=True):
            remove_stale_scratch(out)  # what an interrupted prepare left
        say(f"{out} is up to date with its sources and settings")
        return existing
    made = [folder for folder in (out.parent, *out.parent.parents) if not folder.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with scratch_folder(out) as scratch, Workers(workers) as pool:
            if options.format == "text":
                phases = Phases(sources, options, scratch, pool, progress, say)
                manifest = phases.write_corpus(budgets, request)
            else:
                manifest = write_examples(sources.files, options, scratch, request, progress, say)
                atomic_write_text(manifest.to_json(), scratch / MANIFEST)  # last: complete
            with locked(out.parent, wait=True):  # another rank's may have landed meanwhile
                if up_to_date(out, request) is None:
                    replace_folder(scratch, out, MANIFEST)
    except BaseException as error:
        full = isinstance(error, OSError) and error.errno in FULL_DISK
        message = disk_full(out, budgets) if full else None
        for folder in made:  # the folders this call made, the deepest first: left empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        if message:
            raise ValueError(message) from None
        raise
    return manifest


def read_budgets(sources: tuple[Path, ...], max_bytes: int | None) -> list[tuple[Path, int | None]]:
    """Each source with the bytes of it to read (None: whole), sources past `max_bytes` left
    out; an uncompressed text file that crosses it is cut there (JSON lines, parquet and
    compressed files are read whole)."""
    if max_bytes is None:
        return [(path, None) for path in sources]
    budgets, left = [], max_bytes
    for path in sources:
        if left <= 0:
            break
        size = path.stat().st_size
        cuttable = source_kind(path) == "text" and not compression(path)
        budgets.append((path, left if cuttable and size > left else None))
        left -= size
    return budgets


def up_to_date(out: Path, request: dict[str, Any]) -> Manifest | None:
    """The manifest in `out` when it was prepared from this very request (same sources, sizes,
    modification times and settings), else None."""
    manifest = manifest_at(out / MANIFEST)
    if manifest is None:
        return None
    return manifest if manifest.request == request else None


def disk_full(out: Path, budgets: list[tuple[Path, int | None]]) -> str:
    """What to do when the disk under `out` filled up while the corpus was written."""
    source = sum(path.stat().st_size if limit is None else limit for path, limit in budgets)
    free = shutil.disk_usage(out.parent).free
    return (
        f"no space left on device in {out.parent} while writing the corpus ({free / 2**20:,.0f} "
        f"MiB free): it takes up to {4 * 2 * source / 2**20:,.0f} MiB while it is assembled (a "
        "token of at most 4 bytes per source byte, twice); free space or pass --out on "
        f"another disk. {out} is as it was"
    )


class Phases:
    """The phases of one prepare, in `scratch`, with `pool`'s workers (module docstring)."""

    def __init__(
        self, sources: Sources, options: Options, scratch: Path, pool: Workers, progress: bool, say
    ):
        self.sources, self.options, self.scratch = sources, options, scratch
        self.pool, self.progress, self.say = pool, progress, say

    def write_corpus(
        self, budgets: list[tuple[Path, int | None]], request: dict[str, Any]
    ) -> Manifest:
        """Survey, tokenizer, encoding, shards and manifest, all in the scratch folder."""
        options = self.options
        surveys, left_out = self.survey(budgets)
        codec, tokenizer_file = self.tokenizer(surveys)
        dtype = "uint16" if codec.vocab_size <= 2**16 else "uint32"
        settings = Settings(
            tokenizer_file,
            codec.eot_id,
            options.text_key,
            options.val_fraction,
            options.document_bytes,
            self.scratch,
            dtype,
        )
        jobs = make_jobs(surveys)
        totals = self.encode(jobs, settings)
        started = time.perf_counter()
        shards = {
            split: write_shards(self.scratch, len(jobs), split, dtype, options.shard_tokens)
            for split in SPLITS
        }
        count = sum(len(split) for split in shards.values())
        self.say(f"wrote {count} shard(s) in {time.perf_counter() - started:.1f} s")
        bad_records = sum(survey.bad_records for survey in surveys)
        manifest = Manifest(
            tokenizer=options.tokenizer if options.tokenizer in ("bytes", "bpe") else "file",
            vocab_size=codec.vocab_size,
            eot_id=codec.eot_id,
            dtype=dtype,
            shards=shards,
            documents={split: totals[f"{split}_documents"] for split in SPLITS},
            source_bytes=sum(survey.bytes for survey in surveys),
            request=request,
            sources=tuple(source_record(survey) for survey in surveys),
            skipped={
                "files": {str(survey.path): survey.problem for survey in left_out},
                "records": bad_records,
                "first_records": first_bad(surveys),
                "other_kinds": self.sources.skipped,
            },
            tokenizer_sha256=file_sha256(tokenizer_file) if tokenizer_file else "",
        )
        atomic_write_text(manifest.to_json(), self.scratch / MANIFEST)  # last: it is complete
        return manifest

    def survey(self, budgets: list[tuple[Path, int | None]]) -> tuple[list[Survey], list[Survey]]:
        """Every source surveyed (in the workers); returns the readable ones and those left
        out (`skip_bad_files`).

        Raises:
            ValueError: a file that cannot be read or a record with no text (unless left out).
        """
        options, started = self.options, time.perf_counter()
        survey = functools.partial(
            survey_budget,
            text_key=options.text_key,
            document_bytes=options.document_bytes,
            encoding=options.encoding,
            val_fraction=options.val_fraction,
        )
        chunk = max(1, len(budgets) // 64)
        surveys = list(self.pool.map(survey, budgets, chunk))
        usable = [survey for survey in surveys if survey.problem is None]
        left_out = [survey for survey in surveys if survey.problem is not None]
        if left_out and not options.skip_bad_files:
            others = ", ".join(str(survey.path) for survey in left_out[1:NAMED])
            more = f" (and {len(left_out) - 1:,} more: {others}{', ...' * (len(left_out) > NAMED)})"
            raise ValueError(left_out[0].problem + (more if len(left_out) > 1 else ""))
        bad = sum(survey.bad_records for survey in usable)
        named = first_bad(usable)
        if bad and not options.skip_bad_records:
            listed = ", ".join(named) + (", ..." if bad > len(named) else "")
            raise ValueError(
                f"{named[0]}; {bad:,} record(s) in all hold no document ({listed}): fix them, "
                "or pass --skip-bad-records to leave them out"
            )
        if not usable:
            raise ValueError(f"no source can be read (all {len(surveys)} left out); name others")
        check_split(usable, options)
        documents = sum(survey.documents for survey in usable)
        read = sum(survey.bytes for survey in usable)
        line = (
            f"surveyed {plural(len(usable), 'source file')}, {tqdm.format_sizeof(read, 'B')}, "
            f"in {time.perf_counter() - started:.1f} s: {plural(documents, 'document')}"
        )
        if left_out:
            names = ", ".join(str(survey.path) for survey in left_out[:NAMED])
            line += f"; left out {len(left_out):,} file(s) that cannot be read ({names})"
        if bad:
            line += f"; left out {bad:,} record(s) with no text ({', '.join(named)})"
        if self.sources.skipped:
            line += f"; skipped {self.sources.describe_skipped()} in the folders named"
        self.say(line)
        return usable, left_out

    def tokenizer(self, surveys: list[Survey]) -> tuple[Codec, Path | None]:
        """The codec the corpus is encoded with, and its tokenizer.json in the scratch folder
        (None for bytes): a BPE trained in a worker, or a copy of the file named."""
        options, started = self.options, time.perf_counter()
        if options.tokenizer == "bytes":
            return Codec(None), None
        tokenizer_file = self.scratch / TOKENIZER_FILE
        if options.tokenizer != "bpe":
            shutil.copyfile(options.tokenizer, tokenizer_file)
            return Codec(tokenizer_file, options.eot), tokenizer_file
        self.pool.call(
            train_bpe,
            surveys,
            options.text_key,
            options.document_bytes,
            options.vocab_size,
            options.tokenizer_sample_bytes,
            tokenizer_file,
            self.progress,
        )
        codec = Codec(tokenizer_file)
        sample = min(options.tokenizer_sample_bytes, sum(survey.bytes for survey in surveys))
        fewer = f" ({options.vocab_size:,} asked: the sample has no more pairs to merge)"
        self.say(
            f"trained a byte-level BPE of {codec.vocab_size:,} tokens"
            f"{fewer if codec.vocab_size < options.vocab_size else ''} on "
            f"{tqdm.format_sizeof(sample, 'B')} in {time.perf_counter() - started:.1f} s"
        )
        return codec, tokenizer_file

    def encode(self, jobs: list[Job], settings: Settings) -> Counter[str]:
        """Encode every job in the workers, with a bar of bytes/s and tokens/s; the summed
        counts."""
        totals: Counter[str] = Counter()
        total = sum(job.bytes for job in jobs)
        started = time.perf_counter()
        encode = functools.partial(encode_job, settings=settings)
        with tqdm(
            total=total, unit="B", unit_scale=True, desc="encode", disable=not self.progress
        ) as bar:
            for counts in self.pool.map(encode, jobs):
                totals.update(counts)
                bar.update(counts["bytes"])
                tokens = totals["train_tokens"] + totals["val_tokens"]
                bar.set_postfix(tokens_per_s=f"{tokens / (time.perf_counter() - started):,.0f}")
        seconds = time.perf_counter() - started
        tokens = totals["train_tokens"] + totals["val_tokens"]
        self.say(
            f"encoded {tokens:,} tokens in {len(jobs):,} job(s) in {seconds:.1f} s "
            f"({total / 1e6 / max(seconds, 1e-9):,.2f} MB/s)"
        )
        return totals


def survey_budget(budget: tuple[Path, int | None], **settings: Any) -> Survey:
    """`survey_source` of one (path, bytes to read) pair with `settings`: what the workers
    map over."""
    path, limit = budget
    return survey_source(path, limit=limit, **settings)


def source_record(survey: Survey) -> dict[str, Any]:
    """A source as the manifest lists it: path, bytes, their SHA-256, documents and, for text,
    the encoding it was read in."""
    record = {"path": str(survey.path), "bytes": survey.bytes, "sha256": survey.sha256}
    record["documents"] = survey.documents
    return record | ({"encoding": survey.layout.encoding} if survey.kind == "text" else {})


def first_bad(surveys: list[Survey]) -> list[str]:
    """The first NAMED bad records of the surveyed sources, "path:line: reason"."""
    return [name for survey in surveys for name in survey.first_bad][:NAMED]


def check_split(surveys: list[Survey], options: Options) -> None:
    """Refuse a corpus with no document in either split (as the survey counted them), saying
    which fix applies, before anything is encoded.

    Raises:
        ValueError: naming --val-fraction, --document-bytes (where a text file's documents
            hold line breaks to cut at) or more text.
    """
    documents = sum(survey.documents for survey in surveys)
    held_out = sum(survey.held_out for survey in surveys)
    if 0 < held_out < documents:
        return
    cuttable = any(
        survey.kind == "text" and survey.line_breaks > survey.documents for survey in surveys
    )
    more = (
        "cut the text files into more documents with a smaller --document-bytes"
        if cuttable
        else "add text"
    )
    if documents > 1 and not held_out:
        raising = (
            f"raise it to {1 / documents:.2g} or more, or "
            if 1 / documents > options.val_fraction
            else ""
        )
        raise ValueError(
            f"none of the {documents:,} documents is held out for validation at --val-fraction "
            f"{options.val_fraction:g} (each source holds out its own share): {raising}{more}"
        )
    if documents > 1:
        raise ValueError(
            f"all {documents:,} documents are held out for validation at --val-fraction "
            f"{options.val_fraction:g}: lower it, or {more}"
        )
    raise ValueError(
        f"the sources hold {plural(documents, 'document')}, too few to hold one out for "
        f"validation; {more}"
    )


def write_shards(
    scratch: Path, jobs: int, split: str, dtype: str, shard_tokens: int
) -> tuple[Shard, ...]:
    """Concatenate one split's part files, in job order, into shards of at most
    `shard_tokens` tokens (`<split>-NNNNN.bin`, each fsynced), CHUNK_BYTES at a time; return
    their records."""
    itemsize = np.dtype(DTYPES[dtype]).itemsize
    shard_bytes = shard_tokens * itemsize
    chunks = part_chunks(scratch, jobs, split)
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


def part_chunks(scratch: Path, jobs: int, split: str) -> Iterator[bytes]:
    """The bytes of one split's part files in job order, CHUNK_BYTES at most at a time; each
    part file is removed once read."""
    for number in range(jobs):
        part = part_file(scratch, number, split)
        with open(part, "rb") as source:
            while chunk := source.read(CHUNK_BYTES):
                yield chunk
        part.unlink()


def stop_on_sigterm(number: int, frame: object) -> None:
    """SIGTERM's handler while prepare runs: stop as Ctrl-C does, exiting 128 + 15."""
    raise Stopped(number)


class Stopped(KeyboardInterrupt):
    """A stop signal other than the terminal's SIGINT, `signal_number` the signal's."""

    def __init__(self, signal_number: int):
        super().__init__(signal_number)
        self.signal_number = signal_number
