"""The language model's corpus: sources found and read (`sources.py`, `documents.py`), surveyed
and tokenized in parallel jobs (`survey.py`, `jobs.py`) into memory-mapped token shards with their
manifest (`shards.py`), by `prepare` (`pipeline.py`), which `python -m <package>.prepare`
runs."""

from .chat import TEMPLATE_FILE
from .documents import PIECE_CHARS, Span, read_pieces, text_layout
from .examples import IGNORE_INDEX, ExampleRows
from .pipeline import Options, prepare
from .shards import (
    MANIFEST,
    RUN_MANIFEST,
    TOKENIZER_FILE,
    Codec,
    Manifest,
    TokenWindows,
    describe_change,
    manifest_at,
    read_manifest,
    same_tokenizer,
)
from .sources import find_sources

__all__ = [
    "Codec",
    "ExampleRows",
    "IGNORE_INDEX",
    "MANIFEST",
    "Manifest",
    "Options",
    "PIECE_CHARS",
    "RUN_MANIFEST",
    "Span",
    "TEMPLATE_FILE",
    "TOKENIZER_FILE",
    "TokenWindows",
    "describe_change",
    "find_sources",
    "manifest_at",
    "prepare",
    "read_manifest",
    "read_pieces",
    "same_tokenizer",
    "text_layout",
]
