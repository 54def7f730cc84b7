"""Atomic one-file checkpoints that resume exactly: last, best and the last N.

The main process writes the whole model and optimizer state (every rank holds all of it under
DDP), with the scheduler, progress, every rank's RNG states and the config, as `step-<N>.pt`.
Writes are atomic (`state_io.atomic_save`), so a killed job leaves the previous checkpoint whole.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .state_io import atomic_save, fsync_dir, load_trusted

REQUIRED_KEYS = ("model", "optimizer", "scheduler", "precision", "progress", "ranks", "config")


def _atomic_link(source: Path, name: Path) -> None:
    """Point `name` at `source`'s bytes (a hard link, else a copy), replacing `name` atomically."""
    tmp = name.with_name(f".{name.name}.tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:  # filesystems without hard links
        tmp.write_bytes(source.read_bytes())
    os.replace(tmp, name)
    fsync_dir(name.parent)


class CheckpointManager:
    """Writes `step-<N>.pt`, keeps the newest `keep_last` of them, and `last.pt` / `best.pt`.

    `last.pt` and `best.pt` are hard links to step files, so pruning never removes them. Only
    the main process (`is_main`) writes; every process may call every method.
    """

    def __init__(self, directory: str | Path, keep_last: int, is_main: bool = True):
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.is_main = is_main

    def save(
        self,
        trained: nn.Module,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        extra: dict[str, Any],
        step: int,
        is_best: bool,
    ) -> None:
        """Write the bare `model`'s and `optimizer`'s states with `extra` for optimizer step
        `step` (the main process only; the caller holds the others at a barrier). `trained`,
        the wrapper the loop trains, is not needed: its keys would carry a prefix."""
        if not self.is_main:
            return
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), **extra}
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"step-{step:08d}.pt"
        atomic_save(state, path)
        _atomic_link(path, self.directory / "last.pt")
        if is_best:
            _atomic_link(path, self.directory / "best.pt")
        step_files = self.step_files()
        for stale in step_files[: max(0, len(step_files) - self.keep_last)]:
            stale.unlink()

    def step_files(self) -> list[Path]:
        """Step checkpoints, oldest first."""
        return sorted(self.directory.glob("step-*.pt"))

    def has_checkpoints(self) -> bool:
        """True if any checkpoint file exists, loadable or not."""
        return bool(self.step_files()) or (self.directory / "last.pt").exists()

    def load_latest(self) -> dict[str, Any] | None:
        """The newest checkpoint that loads and holds every required key, or None if none does.

        Tries `last.pt`, then step files newest first, so a damaged `last.pt` falls back to the
        step before it. The result has its file's `path` and `fallback` (True if not last.pt).
        """
        last = self.directory / "last.pt"
        for path in [last, *reversed(self.step_files())]:
            state = load_trusted(path, REQUIRED_KEYS) if path.is_file() else None
            if state is not None:
                return state | {"path": str(path), "fallback": path != last}
        return None

    def load_weights(
        self,
        saved: dict[str, Any],
        trained: nn.Module,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
    ) -> None:
        """Load a `load_latest` result's model and optimizer states (the bare model's keys)."""
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])

    def export_model(self, model: nn.Module, path: Path) -> None:
        """Write the bare `model`'s full state dict to `path` (main process): no wrapper prefix,
        loads into a plain model with `strict=True`."""
        if self.is_main:
            atomic_save(model.state_dict(), path)
