"""Seeds and random states: every RNG a run draws from (Python, numpy, torch on the CPU and
every CUDA device), seeded at the start, captured into a checkpoint and restored from it, and
seeds derived for a rank's streams where a checkpoint's cannot be carried over."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np
import torch


def seed_all(seed: int) -> None:
    """Seed Python, numpy and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def capture_rng_state() -> dict[str, Any]:
    """torch (CPU and every CUDA device), numpy and Python `random` states as loadable values.

    numpy's state tuple holds an ndarray, which `weights_only=True` refuses: stored as a list.
    """
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [kind, keys.tolist(), pos, has_gauss, cached_gaussian],
        "python": random.getstate(),
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of `capture_rng_state`."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, keys, pos, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached_gaussian))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


def derived_seed(seed: int, step: int, rank: int) -> int:
    """A seed in [0, 2**32) for `rank`'s random streams from optimizer step `step` on, the same
    on every launch: the first 4 bytes of SHA-256 of "seed:step:rank" (numpy takes 32 bits)."""
    digest = hashlib.sha256(f"{seed}:{step}:{rank}".encode()).digest()
    return int.from_bytes(digest[:4], "little")
