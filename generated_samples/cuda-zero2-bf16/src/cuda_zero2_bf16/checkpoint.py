"""Sharded checkpoints: each rank writes its own shards, through `parallel.save_sharded`
(DeepSpeed's save_checkpoint).

A checkpoint is the folder `step-<N>/`: the strategy's shard files, `trainer.pt` (the
scheduler, progress, every rank's RNG states and the config) and, written last, `COMPLETE`.
All of it is first written as `.step-<N>.partial/` and renamed once whole, and only folders with
the marker are ever loaded, so a job killed mid-save never leaves a checkpoint that looks valid.
`last` and `best` are one-line files naming a step folder; pruning keeps the folders they name.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .parallel import full_model_state, load_sharded, save_sharded
from .state_io import atomic_save, atomic_write_text, fsync_dir, load_trusted

REQUIRED_KEYS = ("scheduler", "precision", "progress", "ranks", "config")
TRAINER_FILE = "trainer.pt"
COMPLETE_MARKER = "COMPLETE"


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


class CheckpointManager:
    """Writes `step-<N>/` folders, keeps the newest `keep_last` of them plus `last` and `best`.

    `save`, `load_weights` and `export_model` are collectives: every process calls them. Only
    the main process (`is_main`) writes `trainer.pt`, the marker and the pointers.
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
        """Write the sharded model and optimizer states with `extra` for optimizer step `step`
        (`trained` is what the loop trains, `model` the bare module inside it)."""
        name = f"step-{step:08d}"
        partial = self.directory / f".{name}.partial"
        if self.is_main:
            self.directory.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(partial, ignore_errors=True)  # what a killed save left behind
        _barrier()
        save_sharded(partial, trained, model, optimizer)  # returns once all ranks have written
        if not self.is_main:
            return
        atomic_save(extra, partial / TRAINER_FILE)
        atomic_write_text(name + "\n", partial / COMPLETE_MARKER)
        final = self.directory / name
        shutil.rmtree(final, ignore_errors=True)  # the same step saved again after a resume
        os.replace(partial, final)
        fsync_dir(self.directory)
        atomic_write_text(name + "\n", self.directory / "last")
        if is_best:
            atomic_write_text(name + "\n", self.directory / "best")
        self._prune()

    def _pointed(self, pointer: str) -> Path | None:
        path = self.directory / pointer
        return self.directory / path.read_text().strip() if path.is_file() else None

    def _prune(self) -> None:
        keep = {self._pointed("last"), self._pointed("best")}
        folders = self.step_folders()
        for stale in folders[: max(0, len(folders) - self.keep_last)]:
            if stale not in keep:
                shutil.rmtree(stale)

    def step_folders(self) -> list[Path]:
        """Step checkpoint folders, complete or not, oldest first."""
        return sorted(path for path in self.directory.glob("step-*") if path.is_dir())

    def has_checkpoints(self) -> bool:
        """True if any checkpoint folder exists, loadable or not."""
        return bool(self.step_folders())

    def load_latest(self) -> dict[str, Any] | None:
        """The newest complete checkpoint's `trainer.pt` state, or None if none loads.

        Tries the folder `last` names, then step folders newest first. The result has the
        folder's `path` and `fallback` (True if it is not the one `last` names).
        """
        last = self._pointed("last")
        for folder in [last, *reversed(self.step_folders())]:
            if folder is None or not (folder / COMPLETE_MARKER).is_file():
                continue
            state = load_trusted(folder / TRAINER_FILE, REQUIRED_KEYS)
            if state is not None:
                return state | {"path": str(folder), "fallback": folder != last}
        return None

    def load_weights(
        self,
        saved: dict[str, Any],
        trained: nn.Module,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
    ) -> None:
        """Load the model and optimizer shards of a `load_latest` result (a collective)."""
        load_sharded(Path(saved["path"]), trained, model, optimizer)

    def export_model(self, model: nn.Module, path: Path) -> None:
        """Gather the full, unsharded model state dict and write it to `path` from the main
        process (a collective): prefix-free names, loads into a plain model with `strict=True`."""
        full_state = full_model_state(model)
        if self.is_main:
            atomic_save(full_state, path)
