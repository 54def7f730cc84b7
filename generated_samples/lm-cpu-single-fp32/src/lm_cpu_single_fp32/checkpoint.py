"""Atomic checkpoints of registered components: `step-<N>/` folders, `last`, `best`, keep-N.

A checkpoint is the folder `step-<N>/` (N = optimizer steps): the engine's files (model and
optimizer state, as the strategy keeps them), `trainer.pt` (the state of every registered
component, each rank's own states and the config) and, written last, `COMPLETE`. It is written
as `.step-<N>.partial/` and renamed once whole, and only folders with the marker are loaded, so
a job killed mid-save never leaves a checkpoint that looks valid. `last` and `best` are one-line
files naming a step folder; pruning keeps the newest `keep_last` folders and the two named.
Every file loads with `torch.load(path, weights_only=True)`: no pickled code runs on load.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import save_file

from .config import Config
from .progress import TrainState
from .runtime import Runtime, barrier, gather_objects
from .state_io import atomic_save, atomic_write, atomic_write_text, fsync_dir, load_trusted

FORMAT_VERSION = 1  # of trainer.pt's layout; a resume refuses another (resume.py)
TRAINER_FILE = "trainer.pt"
WEIGHTS_FILE = "model.safetensors"  # the best checkpoint's weights: the ones to ship
LAST_WEIGHTS_FILE = "model-last.safetensors"  # the final step's
COMPLETE_MARKER = "COMPLETE"
TRAINER_KEYS = ("components", "ranks", "config")


class Stateful(Protocol):
    """A component whose state a checkpoint holds (scheduler, loop progress, RNG states...)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class EngineState(Protocol):
    """The engine: writes and reads its own files in a checkpoint folder (collectives)."""

    def save(self, folder: Path) -> None: ...

    def load(self, folder: Path) -> None: ...

    def full_state_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint folder and its `trainer.pt` state; `fallback` is True when it is
    not the folder `last` names (that one was missing or damaged)."""

    folder: Path
    state: dict[str, Any]
    fallback: bool


def standalone(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` on the CPU in storage of its own: safetensors refuses views into a shared
    buffer, and some wrappers keep every parameter in one flat buffer."""
    tensor = tensor.detach().cpu().contiguous()
    whole = tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    return tensor if whole else tensor.clone()


def _save_readable(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    save_file(tensors, path, metadata=metadata)
    path.chmod(0o644)  # safetensors creates the file owner-only, unlike every other file here


def step_folder_name(step: int) -> str:
    """The name of optimizer step `step`'s checkpoint folder: `step-00000042` for step 42."""
    return f"step-{step:08d}"


def step_folders(directory: Path) -> list[Path]:
    """Step checkpoint folders in `directory`, complete or not, oldest first."""
    return sorted(path for path in directory.glob("step-*") if path.is_dir())


def _pointed(directory: Path, pointer: str) -> Path | None:
    path = directory / pointer
    return directory / path.read_text().strip() if path.is_file() else None


def complete_checkpoints(directory: Path) -> Iterator[Checkpoint]:
    """Every complete checkpoint whose `trainer.pt` loads, newest first: the folder `last`
    names, then the other step folders (those are `fallback`s)."""
    last = _pointed(directory, "last")
    seen = set()
    for folder in [last, *reversed(step_folders(directory))]:
        if folder is None or folder in seen or not (folder / COMPLETE_MARKER).is_file():
            continue
        seen.add(folder)
        state = load_trusted(folder / TRAINER_FILE, TRAINER_KEYS)
        if state is not None:
            yield Checkpoint(folder, state, fallback=folder != last)


def find_latest(directory: Path) -> Checkpoint | None:
    """The newest complete checkpoint whose `trainer.pt` loads, or None if there is none."""
    return next(complete_checkpoints(directory), None)


class CheckpointManager:
    """Saves and restores the engine and the registered components of one run, in
    `<run_dir>/checkpoints/`, keeping the newest `keep_last` step folders.

    `components` have one state for the whole run (saved from the main process);
    `rank_components` have one per rank (gathered, and given back to the same rank). `save` and
    `restore` are collectives: every process calls them.
    """

    def __init__(
        self,
        config: Config,
        runtime: Runtime,
        engine: EngineState,
        components: dict[str, Stateful],
        rank_components: dict[str, Stateful],
    ):
        self.directory = Path(config.run_dir) / "checkpoints"
        self.keep_last = config.keep_last
        self.runtime = runtime
        self.engine = engine
        self.components = components
        self.rank_components = rank_components
        self.config = config

    def has_checkpoints(self) -> bool:
        """True if the checkpoint folder holds a checkpoint, loadable or not (a killed save's
        hidden temporaries do not count: a run killed in its first save starts afresh)."""
        folder = self.directory
        return folder.is_dir() and any(not path.name.startswith(".") for path in folder.iterdir())

    def candidates(self) -> list[Checkpoint]:
        """See `complete_checkpoints`."""
        return list(complete_checkpoints(self.directory))

    def save(self, step: int, is_best: bool) -> None:
        """Write checkpoint `step-<step>/`; `is_best` also points `best` at it."""
        name = step_folder_name(step)
        partial = self.directory / f".{name}.partial"
        if self.runtime.is_main:
            shutil.rmtree(partial, ignore_errors=True)  # what a killed save left behind
            partial.mkdir(parents=True)
        barrier(self.runtime)
        self.engine.save(partial)  # returns once every rank has written its part
        mine = {key: component.state_dict() for key, component in self.rank_components.items()}
        ranks = gather_objects(mine, self.runtime)
        if self.runtime.is_main:
            shared = {key: component.state_dict() for key, component in self.components.items()}
            state = {"components": shared, "ranks": ranks, "config": self.config.to_dict()}
            state["format"] = FORMAT_VERSION
            atomic_save(state, partial / TRAINER_FILE)
            atomic_write_text(name + "\n", partial / COMPLETE_MARKER)
            final = self.directory / name
            shutil.rmtree(final, ignore_errors=True)  # the same step saved again after a resume
            os.replace(partial, final)
            fsync_dir(self.directory)
            atomic_write_text(name + "\n", self.directory / "last")
            if is_best:
                atomic_write_text(name + "\n", self.directory / "best")
            self._prune()
        barrier(self.runtime)

    def restore(self, checkpoint: Checkpoint) -> None:
        """Load `checkpoint` into the engine first (model, then optimizer), then the components,
        then this rank's own states.

        Raises:
            ValueError: the engine's files do not load: torn, or their tensors do not fit
                this model or optimizer (another model.py).
        """
        try:
            self.engine.load(checkpoint.folder)
        except ValueError:
            raise
        except Exception as error:  # a torn file, or shapes and names of another model.py
            reason = (str(error).strip().splitlines() or [type(error).__name__])[-1][:300]
            raise ValueError(
                f"{checkpoint.folder} does not load into this model ({reason}); a torn file, "
                "or a checkpoint of another model.py: resume with the one that wrote it"
            ) from error
        for key, component in self.components.items():
            component.load_state_dict(checkpoint.state["components"][key])
        mine = checkpoint.state["ranks"][self.runtime.rank]
        for key, component in self.rank_components.items():
            component.load_state_dict(mine[key])

    def export_weights(self, state: TrainState) -> dict[str, str | None]:
        """Write the run's weights for use outside it (collectives; the main process writes):
        `<run_dir>/model.safetensors` (WEIGHTS_FILE) holds the best checkpoint's by the
        validation metric `monitor`, `<run_dir>/model-last.safetensors` (LAST_WEIGHTS_FILE)
        the final step's. Each is the engine's full state dict of the bare model: keys carry no
        wrapper prefixes, and `safetensors.torch.load_file` gives a dict that loads into the
        model with `strict=True`. Its metadata holds `"weights"` (`best` or `last`), the
        optimizer `"step"`, the resolved `"config"` as JSON and, for the best, `"monitor"` and
        its `"value"`. Unless the best checkpoint is the final step's, it is loaded back into
        the engine to be exported (the run is over). Before the first validation there is no
        best: only the last weights are written.

        Returns:
            The run summary's entries: {"best_weights": path or None, "last_weights": path}.
        """
        last = self._export(LAST_WEIGHTS_FILE, {"weights": "last", "step": str(state.step)})
        if state.best_step < 0:
            return {"best_weights": None, "last_weights": last}
        if state.best_step != state.step:
            self.engine.load(self.directory / step_folder_name(state.best_step))
        best = {"weights": "best", "step": str(state.best_step), "monitor": self.config.monitor}
        best["value"] = repr(state.best_value)
        return {"best_weights": self._export(WEIGHTS_FILE, best), "last_weights": last}

    def _export(self, name: str, metadata: dict[str, str]) -> str:
        """The engine's full model state dict into `<run_dir>/<name>` with `metadata` and the
        config (a collective; the main process writes); returns the path."""
        path = self.directory.parent / name
        state = self.engine.full_state_dict()
        if self.runtime.is_main:
            tensors = {key: standalone(tensor) for key, tensor in state.items()}
            metadata = {**metadata, "config": json.dumps(self.config.to_dict())}
            atomic_write(path, lambda tmp: _save_readable(tensors, tmp, metadata))
        return str(path)

    def _prune(self) -> None:
        keep = {_pointed(self.directory, "last"), _pointed(self.directory, "best")}
        folders = step_folders(self.directory)
        for stale in folders[: max(0, len(folders) - self.keep_last)]:
            if stale not in keep:
                shutil.rmtree(stale)
