"""The example data of a byte-level language model: the Python standard library's own source
(read offline, in a fixed order), or your text file (`text_path` in configs/train.toml).

This file is yours: replace the data with your own; `scaffold update` leaves it alone. What the
rest of the project needs from it (`train.py` imports nothing else from here):

- `build_datasets(config) -> (train, validation)`: two map-style datasets with `len()` where
  `dataset[list_of_indices]` returns a whole batch `(inputs, targets)`, both int64 token ids
  `[B, block_size]` in `[0, NUM_CLASSES)`, targets the inputs shifted left by one token.
- `NUM_CLASSES`: the vocabulary size (the initial loss is ln of it).
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch
from torch import Tensor
from torch.utils.data import Dataset

from .config import Config

NUM_CLASSES = 256  # the vocabulary: one token per byte value


class TokenWindows(Dataset):
    """Non-overlapping windows of a token stream, read a whole batch at a time.

    `dataset[indices]` (a list of ints) returns `(inputs, targets)`, both int64 `[B, block_size]`;
    targets are the inputs shifted left by one token (next-token prediction).
    """

    def __init__(self, tokens: Tensor, block_size: int):
        self.tokens = tokens  # [N] uint8
        self.block_size = block_size
        self.offsets = torch.arange(block_size + 1)

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.block_size

    def __getitem__(self, indices: list[int]) -> tuple[Tensor, Tensor]:
        starts = torch.as_tensor(indices, dtype=torch.long) * self.block_size
        windows = self.tokens[starts.unsqueeze(1) + self.offsets].long()  # [B, T + 1]
        return windows[:, :-1], windows[:, 1:]


def stdlib_sources() -> list[Path]:
    """The standard library's .py files in a fixed order (site-packages and caches excluded)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "__pycache__"}
    files = [p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def read_corpus(config: Config) -> bytes:
    """The first `corpus_bytes` bytes of `text_path`, or of the stdlib sources concatenated.

    Raises:
        ValueError: `text_path` does not exist, or the corpus is too short for two windows.
    """
    if config.text_path:
        path = Path(config.text_path)
        if not path.is_file():
            raise ValueError(f"text_path {path} is not a file; point it at a UTF-8 text file")
        with open(path, "rb") as file:
            corpus = file.read(config.corpus_bytes)
    else:
        chunks, size = [], 0
        for source in stdlib_sources():
            chunks.append(source.read_bytes())
            size += len(chunks[-1])
            if size >= config.corpus_bytes:
                break
        corpus = b"".join(chunks)[: config.corpus_bytes]
    if len(corpus) < 4 * (config.block_size + 1):
        raise ValueError(
            f"the corpus has {len(corpus)} bytes, too few for block_size={config.block_size}; "
            "raise corpus_bytes or lower block_size"
        )
    return corpus


def build_datasets(config: Config) -> tuple[TokenWindows, TokenWindows]:
    """Split the corpus's bytes: the last `val_fraction` is validation (no window straddles)."""
    tokens = torch.frombuffer(bytearray(read_corpus(config)), dtype=torch.uint8)
    split = int(len(tokens) * (1 - config.val_fraction))
    return TokenWindows(tokens[:split], config.block_size), TokenWindows(
        tokens[split:], config.block_size
    )
