"""The sources `prepare` reads, as documents: text files cut at line breaks, JSON lines and
parquet files. Which files SOURCES name (`find_sources`) and the documents of one file
(`documents`), read a piece at a time: memory stays constant whatever a file's size."""

from __future__ import annotations

import glob
import json
from collections.abc import Iterator
from pathlib import Path

TEXT_SUFFIXES = {".txt", ".md", ".rst", ".py", ".text"}
DATA_SUFFIXES = {".jsonl", ".parquet"}
DOCUMENT_BYTES = 1 << 20  # a text file is cut into documents of at most this, at line breaks


def find_sources(patterns: list[str]) -> list[Path]:
    """The source files SOURCES name, each once, in sorted order within each pattern; a
    folder's hidden files and folders (`.git/`...) are left out.

    Raises:
        ValueError: a pattern that names nothing, a file of an unknown kind, or no source
            with any bytes in it.
    """
    found: dict[Path, None] = {}
    for pattern in patterns:
        path = Path(pattern)
        if path.is_dir():
            matches = sorted(
                p
                for p in path.rglob("*")
                if p.is_file() and readable_kind(p) and not hidden(p.relative_to(path))
            )
        else:
            matches = [Path(p) for p in sorted(glob.glob(pattern, recursive=True))]
            matches = [p for p in matches if p.is_file()]
        if not matches and path.is_dir():
            raise ValueError(
                f"{pattern} holds no text (.txt, .md, .rst, .py), .jsonl or .parquet file"
            )
        if not matches:
            raise ValueError(f"{pattern} names no file; give files, folders or glob patterns")
        for match in matches:
            if not readable_kind(match):
                raise ValueError(
                    f"{match} is not a text, .jsonl or .parquet file; leave it out of SOURCES"
                )
            found[match] = None
    sources = list(found)
    if not any(source.stat().st_size for source in sources):
        raise ValueError(f"the sources ({len(sources)} file(s)) are empty; name files with text")
    return sources


def hidden(path: Path) -> bool:
    """True for a path with a part that starts with a dot (`.git/`, `.cache/`, `.env`)."""
    return any(part.startswith(".") for part in path.parts)


def readable_kind(path: Path) -> bool:
    """True for a file prepare reads: text, .jsonl or .parquet."""
    return path.suffix.lower() in TEXT_SUFFIXES | DATA_SUFFIXES


def documents(
    path: Path, text_key: str, limit: int | None = None, document_bytes: int = DOCUMENT_BYTES
) -> Iterator[str]:
    """The documents of one source file, in file order (`limit`: stop after that many bytes
    of a text file, which is cut into documents of at most `document_bytes` at line breaks;
    jsonl and parquet files are read whole).

    Raises:
        ValueError: a jsonl line that is not an object with a string `text_key`, or a parquet
            file without that column.
    """
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        yield from jsonl_documents(path, text_key)
    elif suffix == ".parquet":
        yield from parquet_documents(path, text_key)
    else:
        yield from text_documents(path, limit, document_bytes)


def text_documents(path: Path, limit: int | None, document_bytes: int) -> Iterator[str]:
    """A text file as documents of at most `document_bytes`, cut at line breaks."""
    pieces: list[bytes] = []
    size, left = 0, path.stat().st_size if limit is None else limit
    with open(path, "rb") as file:
        for line in file:
            line = line[:left]
            left -= len(line)
            pieces.append(line)
            size += len(line)
            if size >= document_bytes or left <= 0:
                yield b"".join(pieces).decode("utf-8", errors="replace")
                pieces, size = [], 0
            if left <= 0:
                return
    if pieces:
        yield b"".join(pieces).decode("utf-8", errors="replace")


def jsonl_documents(path: Path, text_key: str) -> Iterator[str]:
    """The `text_key` field of each non-empty line of a JSON-lines file."""
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)[text_key]
            except (ValueError, KeyError, TypeError):
                text = None
            if not isinstance(text, str):
                raise ValueError(
                    f"{path}:{number} is not a JSON object with a string {text_key!r} field; "
                    "name the text field with --text-key"
                )
            yield text


def parquet_documents(path: Path, text_key: str) -> Iterator[str]:
    """The `text_key` column of a parquet file, read a record batch at a time."""
    import pyarrow.parquet as pq  # only where a parquet source is read

    table = pq.ParquetFile(path)
    if text_key not in table.schema_arrow.names:
        columns = ", ".join(table.schema_arrow.names)
        raise ValueError(
            f"{path} has no column {text_key!r} (it has: {columns}); name it with --text-key"
        )
    for batch in table.iter_batches(batch_size=1024, columns=[text_key]):
        yield from (text for text in batch.column(0).to_pylist() if text is not None)
