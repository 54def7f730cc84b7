"""Atomic checkpoints of registered components: `step-<N>/` folders, `last`, `best`, keep-N.

A checkpoint is the folder `step-<N>/` (N = optimizer steps): the engine's files (model and
optimizer state, as the strategy keeps them), `trainer.pt` (the state of every registered
component, each rank's own states and the config) and, written last, `COMPLETE`. It is written
as `.step-<N>.partial/` and renamed once whole, and only folders with the marker are loaded, so
a job killed mid-save never leaves a checkpoint that looks valid. `last` and `best` are one-line
files naming a step folder; pruning keeps the newest `keep_last` folders and the two named.
Every file loads with `torch.load(path, weights_only=True)`: no pickled code runs on load.

With `async_checkpoint`, a save copies the state to host memory at the step it is due and a
background thread writes it, while training goes on: the same files in the same order, the
marker and the rename only after every file is written and fsynced, then `last` and `best`.
A second save waits for the first; so do a stop signal's exit, the end of the run and its
weight export (`CheckpointManager.wait`). A job killed during a background write leaves its
`.partial` folder, which the next start removes: the resume takes the checkpoint before it.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import save_file

from ..config import Config
from ..runtime import Runtime, barrier, gather_objects
from ..state_io import (
    FULL_DISK,
    atomic_save,
    atomic_write,
    atomic_write_text,
    fsync_dir,
    load_trusted,
)
from ..training.state import TrainState

FORMAT_VERSION = 1  # of trainer.pt's layout; a resume refuses another (resume.py)
# The scaffold release whose template rendered this project (a scaffold test holds the two
# equal): each checkpoint records it, so that a refusal of another format names the release
# that can finish the run.
SCAFFOLD_RELEASE = "0.7.0"
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
    """The engine: writes and reads its own files in a checkpoint folder (collectives).
    `start_save` (engines that save in the background: the config refuses `async_checkpoint`
    for the others) copies what `save` writes to host memory and returns the write."""

    def save(self, folder: Path) -> None: ...

    def start_save(self, folder: Path) -> Callable[[], None]: ...

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


def holds_checkpoints(directory: Path) -> bool:
    """True if `directory` holds a checkpoint, loadable or not (a killed save's hidden
    temporaries do not count: a run killed in its first save starts afresh)."""
    return directory.is_dir() and any(not path.name.startswith(".") for path in directory.iterdir())


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
        self.writer: ThreadPoolExecutor | None = None  # one thread: saves written in order
        if config.async_checkpoint:
            self.writer = ThreadPoolExecutor(1, "checkpoint-writer")
        self.in_flight: Future | None = None
        self.in_flight_name = ""  # the checkpoint being written in the background
        self.stall_seconds: list[float] = []  # the training thread's time in each save

    def has_checkpoints(self) -> bool:
        """See `holds_checkpoints`."""
        return holds_checkpoints(self.directory)

    def candidates(self) -> list[Checkpoint]:
        """See `complete_checkpoints`."""
        return list(complete_checkpoints(self.directory))

    def save(self, step: int, is_best: bool) -> None:
        """Write checkpoint `step-<step>/`; `is_best` also points `best` at it. With
        `async_checkpoint`, return once the state is in host memory, the write under way in
        the background (after the save before it has finished: `wait`). The seconds the
        calling thread spent here are appended to `stall_seconds`.

        Raises:
            OSError: the disk is full (ENOSPC, or EDQUOT for a quota); its message says where,
                how much a checkpoint takes and what to free. The step's partial folder is
                removed, and `last` still names the checkpoint before.
        """
        start = time.perf_counter()
        self.wait()
        name = step_folder_name(step)
        try:
            self._save(name, is_best)
        except OSError as error:
            raise self._no_space(name, error) from None
        self.stall_seconds.append(time.perf_counter() - start)

    def _save(self, name: str, is_best: bool) -> None:
        partial = self._partial(name)
        if self.runtime.is_main:
            shutil.rmtree(partial, ignore_errors=True)  # what a killed save left behind
            partial.mkdir(parents=True)
        barrier(self.runtime)
        if self.writer is not None:
            write_engine = self.engine.start_save(partial)
        else:
            self.engine.save(partial)  # returns once every rank has written its part
            write_engine = None
        mine = {key: component.state_dict() for key, component in self.rank_components.items()}
        ranks = gather_objects(mine, self.runtime)
        state = None
        if self.runtime.is_main:
            shared = {key: component.state_dict() for key, component in self.components.items()}
            state = {"components": shared, "ranks": ranks, "config": self.config.to_dict()}
            written = {"format": FORMAT_VERSION, "scaffold_release": SCAFFOLD_RELEASE}
            state = copy.deepcopy(state) | written  # a copy: training goes on
        finish = functools.partial(self._finish, name, state, is_best, write_engine)
        if self.writer is not None:
            self.in_flight = self.writer.submit(finish)
            self.in_flight_name = name
        else:
            finish()
            barrier(self.runtime)

    def _no_space(self, name: str, error: OSError) -> OSError:
        """`error` as it is, or, for a full disk, one whose message says where, how much a
        checkpoint of this run takes (the latest one's size) and what to free; the partial
        folder of checkpoint `name` is removed first."""
        if error.errno not in FULL_DISK:
            return error
        shutil.rmtree(self._partial(name), ignore_errors=True)
        latest = _pointed(self.directory, "last")
        free = shutil.disk_usage(self.directory).free / 2**20
        size = ""
        if latest is not None and latest.is_dir():
            taken = sum(path.stat().st_size for path in latest.rglob("*") if path.is_file())
            size = f", and a checkpoint of this run takes {taken / 2**20:,.0f} MiB"
        still = f"{latest.name} is still the latest checkpoint" if latest else "no checkpoint yet"
        message = (
            f"no space left on device writing checkpoint {name} in {self.directory} "
            f"({free:,.0f} MiB free{size}): free space there, or lower keep_last (now "
            f"{self.keep_last}); {still}"
        )
        return OSError(error.errno, message)

    def _finish(
        self,
        name: str,
        state: dict[str, Any] | None,
        is_best: bool,
        write_engine: Callable[[], None] | None,
    ) -> None:
        """The rest of checkpoint `name`'s save once the state is staged: the engine's own
        write (if it was not done in `save`), then on the main process `trainer.pt`, the
        marker, the rename of its `.partial` folder, the pointers and the pruning."""
        if write_engine is not None:
            write_engine()  # on the main process, once every rank's part is on disk
        if state is None:
            return
        partial = self._partial(name)
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

    def wait(self) -> None:
        """Return once the background save in flight (if any) is complete on disk, `last`
        naming it. A collective, like `save`.

        Raises:
            What the background write raised (a full disk...).
        """
        if self.in_flight is None:
            return
        in_flight, self.in_flight = self.in_flight, None
        try:
            in_flight.result()
        except OSError as error:
            raise self._no_space(self.in_flight_name, error) from None
        barrier(self.runtime)

    def close(self) -> None:
        """Let the background write in flight finish, on this process alone (a run ending on
        an error: no collective), and stop the writer thread."""
        if self.writer is not None:
            self.writer.shutdown(wait=True)

    def restore(self, checkpoint: Checkpoint, rank_states: bool = True) -> None:
        """Load `checkpoint` into the engine first (model, then optimizer), then the components,
        then, with `rank_states`, this rank's own states (a checkpoint of another world size
        holds none that are this rank's).

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
        if not rank_states:
            return
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
        self.wait()  # the best checkpoint may be the one still being written
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

    def _partial(self, name: str) -> Path:
        """Where checkpoint `name` is written before its rename (hidden, never loaded)."""
        return self.directory / f".{name}.partial"

    def _prune(self) -> None:
        keep = {_pointed(self.directory, "last"), _pointed(self.directory, "best")}
        folders = step_folders(self.directory)
        for stale in folders[: max(0, len(folders) - self.keep_last)]:
            if stale not in keep:
                shutil.rmtree(stale)
