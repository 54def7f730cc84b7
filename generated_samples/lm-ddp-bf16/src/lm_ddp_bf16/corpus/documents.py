"""The documents of a source file, read as pieces of bounded size.

A text file is cut into documents at line breaks: a document ends at the first line break at
or after its `document_bytes`-th byte, so where a document ends depends only on where it
starts, and a read that starts at a document's start (a `Span`, which survey.py records) finds
the same documents in any process. A JSON-lines file holds one document per line (its
`text_key` field), a parquet file one per row of its `text_key` column. Documents are numbered
within their source from 0; lines and rows keep their numbers whether or not they hold one.

A document of any size is handed on in `Piece`s of at most PIECE_CHARS characters, cut before
the whitespace in front of a word (where a run of that many characters has none, anywhere):
what prepare holds is bounded by a piece and a read block, not by a document. A byte-level BPE
(GPT-2's, and the one prepare trains) splits words at the same places, so the pieces' tokens
are the whole document's.

Decoding is strict. A text file that is not valid in its encoding, or holds NUL characters (a
binary file, or UTF-16 without a byte-order mark), is a `BadSource`; a JSON line or parquet row
that holds no document is a `BadRecord`. Which documents are held out for validation is
`is_validation`'s.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NamedTuple

from .sources import open_source

PIECE_CHARS = 1 << 16  # characters of text handed on at once
BLOCK_BYTES = 1 << 20  # bytes of a source read at once
PARQUET_BATCH_ROWS = 64  # rows of a parquet column converted to Python strings at once
BREAK = re.compile(r"\s(?=\S)")  # where a piece may end: before the whitespace ahead of a word
JSON_TYPES = {type(None): "null", bool: "boolean", int: "number", float: "number"}
JSON_TYPES |= {str: "string", list: "array"}
OTHER_FORMATS = (("chat", {"messages"}), ("completion", {"prompt", "completion"}))  # --format


class BadSource(ValueError):
    """A source file that cannot be read as documents (the message names it and the fix)."""


class Piece(NamedTuple):
    """Text of document `number`; `last`: its last piece (end-of-text follows); `start`: on a
    document's first piece, the byte where it starts in its source (None for parquet rows)."""

    number: int
    text: str
    last: bool
    start: int | None = None


class BadRecord(NamedTuple):
    """Line or row `number` of its source, which holds no document, and why."""

    number: int
    reason: str
    start: int | None = None


@dataclass(frozen=True)
class Layout:
    """How a text source's bytes are read: `encoding` (a Python codec), the byte where its text
    starts (after a byte-order mark) and its line break in that encoding."""

    encoding: str
    start: int
    newline: bytes


@dataclass(frozen=True)
class Span:
    """The part of a source one job reads: from `start` (a document's first byte, or a parquet
    row group) to `end` (None: the end), its first document numbered `first`. `cut`: `end` is
    a `max_bytes` budget, not a document's end: the last document stops there (at its last
    whole character)."""

    start: int
    end: int | None
    first: int
    cut: bool = False


def is_validation(source: Path, number: int, val_fraction: float) -> bool:
    """Whether document `number` of `source` is held out: evenly spaced within each source
    (every 1 / val_fraction-th document), at a phase drawn from a hash of its path, so that the
    split depends on neither the order in which workers finish nor the other sources."""
    digest = hashlib.blake2b(source.as_posix().encode(), digest_size=8).digest()
    phase = int.from_bytes(digest, "little") / 2**64
    before, after = (math.floor(n * val_fraction + phase) for n in (number, number + 1))
    return after > before


def text_layout(path: Path, encoding: str) -> Layout:
    """How `path` is read in `encoding`: a UTF-8 byte-order mark is skipped; UTF-16 and UTF-32
    take their byte order from theirs (little-endian without one).

    Raises:
        BadSource: UTF-8 asked for, and the file starts with a UTF-16 byte-order mark.
    """
    with open_source(path) as stream:
        head = stream.read(4)
    name = codecs.lookup(encoding).name
    if name == "utf-8":
        if head[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
            raise BadSource(
                f"{path} is UTF-16 (it starts with a UTF-16 byte-order mark), not UTF-8; pass "
                "--encoding utf-16, or leave it out with --skip-bad-files"
            )
        start = len(codecs.BOM_UTF8) if head.startswith(codecs.BOM_UTF8) else 0
        return Layout(name, start, b"\n")
    if name in ("utf-16", "utf-32"):
        marks = {"le": getattr(codecs, f"BOM_{name.upper().replace('-', '')}_LE")}
        marks["be"] = getattr(codecs, f"BOM_{name.upper().replace('-', '')}_BE")
        order = next((order for order, mark in marks.items() if head.startswith(mark)), None)
        codec = f"{name}-{order or 'le'}"
        return Layout(codec, len(marks[order]) if order else 0, "\n".encode(codec))
    return Layout(name, 0, "\n".encode(name))


def check_encoding(encoding: str) -> None:
    """Refuse an `--encoding` prepare cannot read text files in.

    Raises:
        ValueError: not a text codec Python knows, or one whose line break is no fixed unit.
    """
    try:
        name = codecs.lookup(encoding).name
        newline = "\n".encode(name) if name not in ("utf-16", "utf-32") else b"\n\0"
    except LookupError:
        raise ValueError(
            f"--encoding {encoding} is not a text encoding Python knows; e.g. utf-8, latin-1, "
            "cp1252, utf-16"
        ) from None
    if len(newline) not in (1, 2, 4):
        raise ValueError(f"--encoding {encoding}: prepare cannot find its line breaks")


def read_pieces(
    path: Path,
    kind: str,
    layout: Layout | None,
    span: Span,
    text_key: str,
    document_bytes: int,
    digest=None,
) -> Iterator[Piece | BadRecord]:
    """The pieces of the documents in `span` of `path` (a "text", "jsonl" or "parquet" source;
    text and jsonl read with `layout`), and a `BadRecord` for each line or row that holds no
    document; `digest` (a hashlib object), if given, is updated with the bytes read.

    Raises:
        BadSource: text that is not valid in its encoding, or that holds NUL characters.
    """
    if kind == "parquet":
        yield from parquet_pieces(path, span, text_key)
        return
    with open_source(path) as stream:
        skip_to(stream, span.start)
        if kind == "jsonl":
            yield from jsonl_pieces(stream, span, text_key, digest)
        else:
            yield from TextReader(path, layout, document_bytes).pieces(stream, span, digest)


def skip_to(stream: BinaryIO, offset: int) -> None:
    """Move `stream` to byte `offset`: a seek, or a read where it cannot seek (compressed)."""
    if stream.seekable():
        stream.seek(offset)
        return
    while offset > 0:
        offset -= len(stream.read(min(offset, BLOCK_BYTES)) or b"\0" * offset)


def pieces_of(number: int, text: str, start: int | None) -> Iterator[Piece]:
    """Document `number` (all of `text`) as pieces of at most PIECE_CHARS characters."""
    begin = 0
    for end in cut_points(text, PIECE_CHARS):
        yield Piece(number, text[begin:end], False, start if begin == 0 else None)
        begin = end
    yield Piece(number, text[begin:], True, start if begin == 0 else None)


def cut_points(text: str, limit: int) -> Iterator[int]:
    """Where to cut `text` so that no piece but the last is longer than `limit` characters (the
    last may be up to `limit`): before the last whitespace ahead of a word in a piece's second
    half, else at `limit`."""
    begin = 0
    while len(text) - begin > limit:
        end = begin + limit
        breaks = (match.start() for match in BREAK.finditer(text, begin + limit // 2, end))
        begin = max(breaks, default=end)
        yield begin


class TextReader:
    """The documents of a text file as pieces (see the module docstring); strict decoding."""

    def __init__(self, path: Path, layout: Layout, document_bytes: int):
        self.path, self.layout, self.document_bytes = path, layout, document_bytes
        self.decoder = codecs.getincrementaldecoder(layout.encoding)(errors="strict")
        self.pending = ""  # the current document's text not yet handed on
        self.start: int | None = None  # its first byte, until its first piece is handed on

    def pieces(self, stream: BinaryIO, span: Span, digest) -> Iterator[Piece]:
        """Read `span` from `stream` (already at its start) a block at a time."""
        position, number, begun = span.start, span.first, span.start
        self.start = begun
        while span.end is None or position < span.end:
            size = BLOCK_BYTES if span.end is None else min(BLOCK_BYTES, span.end - position)
            block = stream.read(size)
            if not block:
                break
            if digest is not None:
                digest.update(block)
            offset = 0
            while offset < len(block):
                end = self.line_end(block, max(offset, begun + self.document_bytes - 1 - position))
                last = end >= 0
                data = block[offset : end if last else len(block)]
                self.pending += self.decode(data, position + offset, final=last)
                yield from self.hand_on(number, last)
                if not last:
                    break
                number, offset, begun = number + 1, end, position + end
                self.start = begun
            position += len(block)
        if self.start is None or self.pending or position > begun:  # a document the end cut
            self.pending += self.decode(b"", position, final=not span.cut)
            yield from self.hand_on(number, last=True)

    def line_end(self, block: bytes, search: int) -> int:
        """Where the first line break at or after `search` (at a code unit's start) ends in
        `block`, or -1."""
        newline, unit = self.layout.newline, len(self.layout.newline)
        search -= search % unit
        while (found := block.find(newline, search)) >= 0 and found % unit:
            search = found + unit - found % unit
        return found if found < 0 else found + unit

    def decode(self, data: bytes, position: int, final: bool) -> str:
        """`data` (from byte `position`) decoded, continuing the document; `final` ends it (a
        budget's cut does not: its incomplete last character is left out).

        Raises:
            BadSource: an invalid sequence, or a NUL character.
        """
        try:
            text = self.decoder.decode(data, final=final)
        except UnicodeDecodeError as error:
            raise BadSource(
                f"{self.path} is not valid {self.layout.encoding} (near byte "
                f"{position + max(0, error.start):,}: {error.reason}); name the encoding of "
                "files that are not UTF-8 with --encoding (e.g. latin-1), or leave it out with "
                "--skip-bad-files"
            ) from None
        if "\0" in text:
            raise BadSource(
                f"{self.path} holds NUL characters (a binary file, or UTF-16 without a "
                "byte-order mark: --encoding utf-16); leave it out of SOURCES or pass "
                "--skip-bad-files"
            )
        if final:
            self.decoder.reset()
        return text

    def hand_on(self, number: int, last: bool) -> Iterator[Piece]:
        """The pending text's whole pieces (all of it when `last`); the rest stays pending."""
        text, begin = self.pending, 0
        for end in cut_points(text, PIECE_CHARS):
            yield Piece(number, text[begin:end], False, self.start)
            begin, self.start = end, None
        self.pending = text[begin:] if begin else text
        if last:
            yield Piece(number, self.pending, True, self.start)
            self.pending, self.start = "", None


def jsonl_pieces(stream: BinaryIO, span: Span, text_key: str, digest) -> Iterator:
    """Each non-empty line of a JSON-lines `span` as a document's pieces, or a BadRecord."""
    position, number = span.start, span.first
    while span.end is None or position < span.end:
        line = stream.readline()
        if not line:
            return
        if digest is not None:
            digest.update(line)
        start, position = position, position + len(line)
        if line.strip():
            text = record_text(line, text_key)
            del line  # a long record: keep one copy of it, not three
            if isinstance(text, BadRecord):
                yield text._replace(number=number, start=start)
            else:
                yield from pieces_of(number, text, start)
        number += 1


def record_text(line: bytes, text_key: str) -> str | BadRecord:
    """The `text_key` string of one JSON line, or a BadRecord saying why there is none."""
    try:
        value = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        return BadRecord(0, "not UTF-8")
    except ValueError as error:
        return BadRecord(0, f"not JSON ({error.msg})")
    if not isinstance(value, dict):
        return BadRecord(0, f"a JSON {JSON_TYPES.get(type(value), 'value')}, not an object")
    if text_key not in value:
        fields = ", ".join(list(value)[:8]) or "none"
        fix = format_fix(value, text_key) or "name it with --text-key"
        return BadRecord(0, f"no {text_key!r} field (it has: {fields}); {fix}")
    return missing_text(value[text_key], text_key) or value[text_key]


def record_format(fields: Iterable[str], text_key: str) -> str | None:
    """The `--format` whose records have `fields` (a JSON record's keys, or a parquet file's
    columns) where they lack `text_key`: "chat" for `messages`, "completion" for `prompt` and
    `completion` (chat.py); None where they are neither, or hold `text_key` (text)."""
    names = set(fields)
    if text_key in names:
        return None
    return next((name for name, keys in OTHER_FORMATS if keys <= names), None)


def format_fix(fields: Iterable[str], text_key: str) -> str | None:
    """The fix where `fields` are those of another format's records (`record_format`): "these
    are chat records: pass --format chat" (or completion); else None."""
    other = record_format(fields, text_key)
    return f"these are {other} records: pass --format {other}" if other else None


def missing_text(value: object, text_key: str) -> BadRecord | None:
    """None for a string `value`; else the BadRecord of a null or non-string document."""
    if isinstance(value, str):
        return None
    kind = "null" if value is None else f"a {type(value).__name__}, not a string"
    return BadRecord(0, f"its {text_key!r} is {kind}")


def parquet_pieces(path: Path, span: Span, text_key: str) -> Iterator[Piece | BadRecord]:
    """The rows of row groups [span.start, span.end) of a parquet file: each row's `text_key`
    value as a document's pieces, or a BadRecord for a null."""
    import pyarrow.parquet as pq  # only where a parquet source is read

    table = pq.ParquetFile(path)
    end = table.num_row_groups if span.end is None else span.end
    batches = table.iter_batches(
        batch_size=PARQUET_BATCH_ROWS, row_groups=list(range(span.start, end)), columns=[text_key]
    )
    number = span.first
    for batch in batches:
        for value in batch.column(0).to_pylist():
            bad = missing_text(value, text_key)
            if bad is None:
                yield from pieces_of(number, value, None)
            else:
                yield bad._replace(number=number)
            number += 1
