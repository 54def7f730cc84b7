"""Atomic checkpoints that resume exactly: last, best and the last N, every RNG state included.

A checkpoint is written to a temporary file in the same folder, fsynced, then renamed over its
name with `os.replace`, so a job killed mid-save leaves the previous checkpoint intact. Every
value is a tensor, number, string, list or dict, so `torch.load(path, weights_only=True)` loads
it: no pickled code runs on load.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

REQUIRED_KEYS = ("model", "optimizer", "scheduler", "precision", "progress", "ranks", "config")


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


def atomic_save(obj: Any, path: Path) -> None:
    """`torch.save` to a temporary sibling, fsync it, rename it over `path`, fsync the folder."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as file:
            torch.save(obj, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def _atomic_link(source: Path, name: Path) -> None:
    """Point `name` at `source`'s bytes (a hard link, else a copy), replacing `name` atomically."""
    tmp = name.with_name(f".{name.name}.tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:  # filesystems without hard links
        tmp.write_bytes(source.read_bytes())
    os.replace(tmp, name)
    _fsync_dir(name.parent)


def _fsync_dir(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class CheckpointManager:
    """Writes `step-<N>.pt`, keeps the newest `keep_last` of them, and `last.pt` / `best.pt`.

    `last.pt` and `best.pt` are hard links to step files, so pruning never removes them.
    """

    def __init__(self, directory: str | Path, keep_last: int):
        self.directory = Path(directory)
        self.keep_last = keep_last

    def save(self, state: dict[str, Any], step: int, is_best: bool) -> Path:
        """Write `state` for optimizer step `step`; returns the step file's path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"step-{step:08d}.pt"
        atomic_save(state, path)
        _atomic_link(path, self.directory / "last.pt")
        if is_best:
            _atomic_link(path, self.directory / "best.pt")
        step_files = self.step_files()
        for stale in step_files[: max(0, len(step_files) - self.keep_last)]:
            stale.unlink()
        return path

    def step_files(self) -> list[Path]:
        """Step checkpoints, oldest first."""
        return sorted(self.directory.glob("step-*.pt"))

    def load_latest(self, map_location: torch.device | str = "cpu") -> dict[str, Any] | None:
        """The newest checkpoint that loads and holds every required key, or None if none does.

        Tries `last.pt`, then step files newest first, so a damaged `last.pt` falls back to the
        step before it.
        """
        candidates = [self.directory / "last.pt", *reversed(self.step_files())]
        for path in candidates:
            if not path.is_file():
                continue
            try:
                state = torch.load(path, map_location=map_location, weights_only=True)
            except Exception:  # a truncated or foreign file: try the next one
                continue
            if isinstance(state, dict) and all(key in state for key in REQUIRED_KEYS):
                state["path"] = str(path)
                return state
        return None
