"""The survey of a source, before anything is encoded: whether it reads (text that decodes
strictly, in UTF-8 or else the `--encoding` named; JSON lines and parquet rows that hold
documents), how many documents it holds and holds out, its bytes' SHA-256, and where jobs may
start reading it: `Span`s of about JOB_BYTES, each at a document's start, so that one large
file is encoded on every core and a job is short.

A compressed source cannot be read from the middle: it is one span. A parquet file is cut
between row groups.
"""

from __future__ import annotations

import codecs
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from .documents import (
    BadRecord,
    BadSource,
    Layout,
    Piece,
    Span,
    format_fix,
    is_validation,
    read_pieces,
    record_format,
    text_layout,
)
from .sources import compression, open_source, source_kind

JOB_BYTES = 1 << 22  # source bytes of one encoding job, about
NAMED = 5  # bad records a survey names


@dataclass(frozen=True)
class Survey:
    """What prepare knows of one source before encoding it (see the module docstring).

    `layout`: how its text is read (the encoding that decoded it); `bytes`: what it adds to
    the corpus's source bytes (its size, or a `max_bytes` budget); `documents`, of which
    `held_out` for validation; `line_breaks`: in a text file, how many it holds (more than
    documents: a smaller --document-bytes would cut more); `first_bad`: "path:line: reason"
    of its first NAMED bad records; `problem`: why the whole file cannot be read (then
    nothing else is known).
    """

    path: Path
    kind: str
    layout: Layout | None
    spans: tuple[Span, ...]
    bytes: int
    sha256: str = ""
    documents: int = 0
    held_out: int = 0
    line_breaks: int = 0
    bad_records: int = 0
    first_bad: tuple[str, ...] = ()
    problem: str | None = None

    def span_bytes(self, span: Span) -> int:
        """The source bytes `span` covers (a parquet row group span: its share of the file)."""
        if self.kind == "parquet":
            return self.bytes * len(range(span.start, span.end)) // max(1, self.spans[-1].end)
        return (self.bytes if span.end is None else span.end) - span.start


@dataclass
class Count:
    """What a survey counts as it reads a source's pieces (`Survey`'s fields of the same name)."""

    path: Path
    val_fraction: float
    documents: int = 0
    held_out: int = 0
    bad_records: int = 0
    first_bad: list[str] = field(default_factory=list)

    def add(self, item: Piece | BadRecord, where: str) -> None:
        """Count `item`: a document's last piece, or a bad record (named as `path:where`)."""
        if isinstance(item, BadRecord):
            self.bad_records += 1
            if len(self.first_bad) < NAMED:
                self.first_bad.append(f"{self.path}:{where}: {item.reason}")
        elif item.last:
            self.documents += 1
            self.held_out += is_validation(self.path, item.number, self.val_fraction)

    def fields(self) -> dict[str, object]:
        """The counts as Survey's keyword arguments."""
        names = ("documents", "held_out", "bad_records")
        return {name: getattr(self, name) for name in names} | {"first_bad": tuple(self.first_bad)}


class Tally:
    """A hashlib object's `update` that also counts `newline`s."""

    def __init__(self, newline: bytes):
        self.digest, self.newline, self.count = hashlib.sha256(), newline, 0

    def update(self, data: bytes) -> None:
        self.digest.update(data)
        self.count += data.count(self.newline)


def survey_source(
    path: Path,
    text_key: str,
    document_bytes: int,
    encoding: str,
    limit: int | None,
    val_fraction: float,
) -> Survey:
    """Read `path` once through (its first `limit` bytes, for a text file cut by a
    `max_bytes` budget) and return its Survey; a file that cannot be read has `problem` set.
    A text file that is not valid UTF-8 is read again in `encoding`, where that is another."""
    kind = source_kind(path)
    size = path.stat().st_size if limit is None else limit
    args = (text_key, document_bytes, limit, size, val_fraction)
    try:
        if kind == "parquet":
            return survey_parquet(path, text_key, size, val_fraction)
        if kind == "jsonl":
            check_first_record(path, text_key)
        try:
            return read_through(path, kind, text_layout(path, "utf-8"), *args)
        except BadSource:
            if kind != "text" or codecs.lookup(encoding).name == "utf-8":
                raise
            return read_through(path, kind, text_layout(path, encoding), *args)
    except BadSource as error:
        return Survey(path, kind, None, (), size, problem=str(error))


def check_first_record(path: Path, text_key: str) -> None:
    """Refuse a JSON-lines source whose first record is a chat or completion record (it has
    `messages`, or `prompt` and `completion`, and no `text_key`): `--format text` would find
    no document in any of its records. Reads the first non-blank line only.

    Raises:
        BadSource: "<path>: these are chat records (...): pass --format chat" (or completion).
    """
    with open_source(path) as stream:
        line = next((line for line in stream if line.strip()), b"")
    try:
        record = json.loads(line.decode("utf-8"))
    except ValueError:  # not JSON (nor UTF-8): its BadRecord says so
        return
    other = record_format(record, text_key) if isinstance(record, dict) else None
    if other:
        raise BadSource(
            f"{path}: these are {other} records (the first has no {text_key!r} field): pass "
            f"--format {other}"
        )


def read_through(
    path: Path,
    kind: str,
    layout: Layout,
    text_key: str,
    document_bytes: int,
    limit: int | None,
    size: int,
    val_fraction: float,
) -> Survey:
    """The Survey of a text or JSON-lines source read with `layout` (see `survey_source`).

    Raises:
        BadSource: its text does not decode, or holds NUL characters.
    """
    tally, count = Tally(layout.newline), Count(path, val_fraction)
    whole = Span(layout.start, limit, 0, cut=limit is not None)
    spans, begun, first = [], layout.start, 0
    for item in read_pieces(path, kind, layout, whole, text_key, document_bytes, tally):
        start = item.start
        if start is not None and start - begun >= JOB_BYTES and not compression(path):
            spans.append(Span(begun, start, first))
            begun, first = start, item.number
        count.add(item, str(item.number + 1))
    spans.append(Span(begun, limit, first, cut=limit is not None))
    line_breaks = tally.count if kind == "text" else 0
    return Survey(
        path,
        kind,
        layout,
        tuple(spans),
        size,
        tally.digest.hexdigest(),
        line_breaks=line_breaks,
        **count.fields(),
    )


def survey_parquet(path: Path, text_key: str, size: int, val_fraction: float) -> Survey:
    """A parquet file's Survey: spans of whole row groups; a null value is a bad record.

    Raises:
        BadSource: not a parquet file, no `text_key` column, or one that does not hold text.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except Exception as error:  # pyarrow raises its own ArrowInvalid for a damaged file
        raise BadSource(f"{path} is not a parquet file ({error}); leave it out") from None
    names = table.schema_arrow.names
    if text_key not in names:
        raise BadSource(
            f"{path} has no column {text_key!r} (it has: {', '.join(names)}); "
            f"{format_fix(names, text_key) or 'name it with --text-key'}"
        )
    kind = table.schema_arrow.field(text_key).type
    if not (
        pa.types.is_string(kind) or pa.types.is_large_string(kind) or str(kind) == "string_view"
    ):
        raise BadSource(
            f"{path}'s column {text_key!r} holds {kind}, not text; name a text column with "
            "--text-key"
        )
    spans, begun, first, rows, grouped = [], 0, 0, 0, 0
    for group in range(table.num_row_groups):
        meta = table.metadata.row_group(group)
        if grouped >= JOB_BYTES:
            spans.append(Span(begun, group, first))
            begun, first, grouped = group, rows, 0
        rows += meta.num_rows
        grouped += meta.total_byte_size
    spans.append(Span(begun, table.num_row_groups, first))
    count = Count(path, val_fraction)
    for item in read_pieces(path, "parquet", None, Span(0, table.num_row_groups, 0), text_key, 0):
        count.add(item, f"row {item.number}")
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 24):
            digest.update(chunk)
    return Survey(path, "parquet", None, tuple(spans), size, digest.hexdigest(), **count.fields())
