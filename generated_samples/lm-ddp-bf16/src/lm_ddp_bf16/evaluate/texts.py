"""The texts `python -m <package>.evaluate DATA ...` scores: the files and folders DATA names, of
the kinds prepare reads (corpus/sources.py: text files, each one document; JSON lines and
parquet files, each record's text field one document)."""

from __future__ import annotations

import json
from collections.abc import Iterator

from ..corpus.sources import KINDS, find_sources, open_source, source_kind


def read_texts(patterns: list[str], text_key: str = "text") -> Iterator[str]:
    """Each document of the files `patterns` name, in order.

    Raises:
        ValueError: a pattern names nothing, a file is not UTF-8, or a record has no
            `text_key` string (chat records are named: score them as prepare renders them,
            through a prepared corpus).
    """
    sources = find_sources(patterns)
    if not sources.files:
        raise ValueError(f"{' '.join(patterns)}: no files to score; name {KINDS} files")
    for path in sources.files:
        kind = source_kind(path)
        if kind == "parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path, columns=[text_key])
            yield from (text for text in table.column(text_key).to_pylist() if text)
            continue
        with open_source(path) as stream:
            data = stream.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{path} is not UTF-8 text ({error.reason})") from None
        if kind != "jsonl":
            yield text
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                raise ValueError(f"{path}:{number}: not a JSON record") from None
            value = record.get(text_key) if isinstance(record, dict) else None
            if not isinstance(value, str):
                chat = isinstance(record, dict) and "messages" in record
                hint = (
                    "these are chat records: prepare them with --format chat, and evaluate a "
                    "run trained on them (--run-dir), which scores its prepared validation split"
                    if chat
                    else "name the field with --text-key"
                )
                raise ValueError(f"{path}:{number}: no {text_key!r} string; {hint}")
            yield value
