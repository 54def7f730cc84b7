"""Which files SOURCES name, what kind each is, and how its bytes are opened.

Text files (`.txt`, `.md`, `.rst`, `.py`, `.text`), JSON lines (`.jsonl`) and parquet files, text
and JSON lines also compressed (`.gz` with Python's gzip, `.zst` with the `zstandard` package).
A folder is searched recursively; its hidden files and folders (`.git/`...) are left out, and so
are files of other kinds, which are counted by suffix (`Sources.skipped`).
"""

from __future__ import annotations

import glob
import io
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".text")
COMPRESSED = (".gz", ".zst")
KINDS = "text (.txt, .md, .rst, .py), .jsonl or .parquet, text and .jsonl also .gz or .zst"


def source_kind(path: Path) -> str | None:
    """ "text", "jsonl" or "parquet" for a file prepare reads (a `.gz` or `.zst` suffix after a
    text or jsonl one), else None."""
    suffixes = [suffix.lower() for suffix in path.suffixes[-2:]]
    if suffixes and suffixes[-1] in COMPRESSED:
        suffixes = suffixes[:-1]
    elif suffixes and suffixes[-1] == ".parquet":
        return "parquet"
    if not suffixes:
        return None
    if suffixes[-1] == ".jsonl":
        return "jsonl"
    return "text" if suffixes[-1] in TEXT_SUFFIXES else None


def compression(path: Path) -> str | None:
    """ ".gz" or ".zst" for a compressed source, else None."""
    suffix = path.suffix.lower()
    return suffix if suffix in COMPRESSED else None


@dataclass(frozen=True)
class Sources:
    """The source files SOURCES name, each once, and what was left out of the folders named:
    `skipped` counts files of other kinds by suffix ("(none)" for no suffix)."""

    files: tuple[Path, ...]
    skipped: dict[str, int] = field(default_factory=dict)

    def describe_skipped(self, most: int = 5) -> str:
        """ "3,282 files of other kinds (.html 2,001, .png 1,200, ...)", or "" if none."""
        if not self.skipped:
            return ""
        counts = Counter(self.skipped).most_common()
        named = ", ".join(f"{suffix} {count:,}" for suffix, count in counts[:most])
        more = ", ..." if len(counts) > most else ""
        return f"{sum(self.skipped.values()):,} files of other kinds ({named}{more})"


def find_sources(patterns: list[str]) -> Sources:
    """The source files SOURCES name, in sorted order within each pattern.

    Raises:
        ValueError: a pattern that names nothing, a folder with no source in it, a file named
            directly (or by a glob) that is of no kind prepare reads, or no source with any
            bytes in it.
    """
    found: dict[Path, None] = {}
    skipped: Counter[str] = Counter()
    for pattern in patterns:
        path = Path(pattern)
        if path.is_dir():
            inside = sorted(
                p for p in path.rglob("*") if p.is_file() and not hidden(p.relative_to(path))
            )
            matches = [p for p in inside if source_kind(p)]
            skipped.update(p.suffix.lower() or "(none)" for p in inside if not source_kind(p))
            if not matches:
                raise ValueError(f"{pattern} holds no source file: {KINDS}")
        else:
            matches = [Path(p) for p in sorted(glob.glob(pattern, recursive=True))]
            matches = [p for p in matches if p.is_file()]
            if not matches:
                raise ValueError(f"{pattern} names no file; give files, folders or glob patterns")
        for match in matches:
            if not source_kind(match):
                raise ValueError(f"{match} is not {KINDS}; leave it out of SOURCES")
            found[match] = None
    files = tuple(found)
    if not any(source.stat().st_size for source in files):
        raise ValueError(f"the sources ({len(files)} file(s)) are empty; name files with text")
    return Sources(files, dict(skipped))


def hidden(path: Path) -> bool:
    """True for a path with a part that starts with a dot (`.git/`, `.cache/`, `.env`)."""
    return any(part.startswith(".") for part in path.parts)


def open_source(path: Path) -> BinaryIO:
    """The bytes of a source file, decompressed where it is `.gz` or `.zst`.

    Raises:
        ValueError: a `.zst` file where the `zstandard` package is not installed.
    """
    kind = compression(path)
    if kind == ".gz":
        import gzip

        return gzip.open(path, "rb")
    if kind == ".zst":
        try:
            import zstandard
        except ImportError:
            raise ValueError(f"{path}: reading .zst needs `pip install zstandard`") from None
        return io.BufferedReader(zstandard.open(path, "rb"))
    return open(path, "rb")


def plural(count: int, noun: str) -> str:
    """ "1 document", "2,000 documents"."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"
