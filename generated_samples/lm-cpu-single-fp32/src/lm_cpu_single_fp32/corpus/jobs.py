"""What prepare runs in worker processes: the surveys, the BPE training and the encoding jobs,
and the pool that runs them.

The pool is spawned processes (`Workers`), or this process where none are asked for. A Ctrl-C
or SIGTERM in prepare ends every worker at once (`Workers.close` terminates them; they ignore
the terminal's SIGINT, which is prepare's to handle), and a worker whose prepare was killed
outright exits within a second (`watch_parent`). An encoding job is a few MiB of sources: a
large file is split into many, so that it is encoded on every core.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from .documents import BadRecord, Piece, Span, is_validation, read_pieces
from .shards import DTYPES, END_OF_TEXT, SPLITS, Codec
from .survey import JOB_BYTES, Survey

BATCH_CHARS = 1 << 20  # text encoded in one call of the tokenizer: ~150 MB of its working memory


@dataclass(frozen=True)
class Settings:
    """What an encoding job needs besides its sources: the tokenizer (None: bytes) and its
    end-of-text id, the text field, the split, the document cut, where part files go, dtype."""

    tokenizer_file: Path | None
    eot_id: int
    text_key: str
    val_fraction: float
    document_bytes: int
    scratch: Path
    dtype: str


@dataclass(frozen=True)
class Job:
    """Spans of surveyed sources that one worker encodes, in order, into its part files."""

    number: int
    parts: tuple[tuple[Survey, Span], ...]

    @property
    def bytes(self) -> int:
        """The source bytes the job covers."""
        return sum(survey.span_bytes(span) for survey, span in self.parts)


def make_jobs(surveys: list[Survey]) -> list[Job]:
    """The surveyed sources' spans in order, grouped into jobs of about JOB_BYTES: few jobs for
    many small files, several for a large one."""
    jobs, parts, size = [], [], 0
    for survey in surveys:
        for span in survey.spans:
            parts.append((survey, span))
            size += survey.span_bytes(span)
            if size >= JOB_BYTES:
                jobs.append(Job(len(jobs), tuple(parts)))
                parts, size = [], 0
    if parts:
        jobs.append(Job(len(jobs), tuple(parts)))
    return jobs


def part_file(scratch: Path, job: int, split: str) -> Path:
    """Where job `job` writes its tokens of `split`."""
    return scratch / f"part-{job:05d}.{split}.bin"


CODECS: dict[tuple[Path | None, int], Codec] = {}  # this process's, loaded once each


def encode_job(job: Job, settings: Settings) -> dict[str, int]:
    """Encode `job`'s documents into its part files (one per split), in order, every document
    followed by end-of-text; return its counts: bytes read, tokens and documents per split."""
    key = (settings.tokenizer_file, settings.eot_id)
    if key not in CODECS:
        CODECS[key] = Codec(settings.tokenizer_file, eot_id=settings.eot_id)
    codec = CODECS[key]
    counts = dict.fromkeys([f"{s}_{what}" for s in SPLITS for what in ("tokens", "documents")], 0)
    counts["bytes"] = job.bytes
    with contextlib.ExitStack() as stack:
        files = {
            s: stack.enter_context(open(part_file(settings.scratch, job.number, s), "wb"))
            for s in SPLITS
        }
        batch: list[tuple[str, Piece]] = []
        size = 0
        for survey, span in job.parts:
            pieces = read_pieces(
                survey.path,
                survey.kind,
                survey.layout,
                span,
                settings.text_key,
                settings.document_bytes,
            )
            for piece in pieces:
                if isinstance(piece, BadRecord):
                    continue  # the survey counted it; prepare runs only where it may be left out
                held_out = is_validation(survey.path, piece.number, settings.val_fraction)
                batch.append(("val" if held_out else "train", piece))
                size += len(piece.text)
                if size >= BATCH_CHARS:
                    write_batch(codec, batch, files, DTYPES[settings.dtype], counts)
                    batch, size = [], 0
        write_batch(codec, batch, files, DTYPES[settings.dtype], counts)
    return counts


def write_batch(codec: Codec, batch, files, dtype, counts: dict[str, int]) -> None:
    """Encode `batch` ((split, piece) pairs) in one call and append each piece's ids to its
    split's part file, end-of-text after a document's last piece."""
    if not batch:
        return
    for (split, piece), ids in zip(
        batch, codec.encode_batch([p.text for _, p in batch]), strict=True
    ):
        tokens = np.array([*ids, codec.eot_id] if piece.last else ids, dtype=dtype)
        files[split].write(tokens.tobytes())
        counts[f"{split}_tokens"] += len(tokens)
        counts[f"{split}_documents"] += piece.last


def train_bpe(
    surveys: list[Survey],
    text_key: str,
    document_bytes: int,
    vocab_size: int,
    sample_bytes: int,
    out: Path,
    progress: bool,
) -> None:
    """Train a byte-level BPE of `vocab_size` tokens (END_OF_TEXT included) on the first
    `sample_bytes` characters of the surveyed sources' documents (in pieces, as they are
    encoded) and save it as `out`, a tokenizer.json; `progress`: the trainer's own bars.
    Deterministic: the same sample gives the same merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def sample() -> Iterator[str]:
        taken = 0
        for survey in surveys:
            for span in survey.spans:
                for piece in read_pieces(
                    survey.path, survey.kind, survey.layout, span, text_key, document_bytes
                ):
                    if isinstance(piece, Piece):
                        yield piece.text
                        taken += len(piece.text)
                        if taken >= sample_bytes:
                            return

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress,
    )
    tokenizer.train_from_iterator(sample(), trainer)
    tokenizer.save(str(out))


# --- the pool ---


def start_worker(parent: int, parallel_tokenizer: bool) -> None:
    """A worker's set-up: the terminal's SIGINT is prepare's to handle; with several workers,
    the tokenizer's own threads would only compete with them for the cores."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not parallel_tokenizer:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    threading.Thread(target=watch_parent, args=(parent,), daemon=True).start()


def watch_parent(parent: int) -> None:
    """Exit this worker once its prepare process is gone (killed with SIGKILL, say): a worker
    is never left behind."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


class Workers:
    """`processes` spawned worker processes (0: this process does the work) that run the calls
    of `map` and `call`. Used as a context; leaving it on an exception (a Ctrl-C included)
    terminates them at once, whatever they are doing."""

    def __init__(self, processes: int):
        self.pool = None
        if processes:
            context = get_context("spawn")  # no fork of a process the tokenizer has threads in
            arguments = (os.getpid(), processes == 1)
            self.pool = context.Pool(processes, initializer=start_worker, initargs=arguments)

    def map(self, function: Callable, items: Iterable, chunksize: int = 1) -> Iterator[Any]:
        """`function(item)` of each item, in order, as they finish."""
        if self.pool is None:
            return map(function, items)
        return self.pool.imap(function, items, chunksize)

    def call(self, function: Callable, *args: Any) -> Any:
        """`function(*args)` in a worker (here without a pool)."""
        return function(*args) if self.pool is None else self.pool.apply(function, args)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, kind, *rest) -> None:
        if self.pool is None:
            return
        if kind is None:
            self.pool.close()
        else:
            self.pool.terminate()
        self.pool.join()
