"""What a resume needs besides the model and optimizer: RNG states, the exact data position,
and the settings a checkpoint fixes.

A resumed run replays the interrupted epoch from the loader generator's state at that epoch's
start, skipping the batches already trained on, then restores the RNG states saved with the
checkpoint: the next batch, its random transforms and the dropout masks are bitwise the ones the
interrupted run would have drawn.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from .checkpoint import FORMAT_VERSION, Checkpoint, CheckpointManager
from .config import Config
from .loader import epoch_iterator
from .run_folder import NotARunFolder, holds_a_run, mark_as_a_run
from .runtime import Runtime, any_process

# Settings a resume must share with the checkpoint: they fix the data order, the model's shape,
# and the optimizer and LR schedule that the checkpoint restores (a changed lr or epochs would
# be recorded but not applied); the task adds its data settings (`task_resume_keys`). To
# change them, start a new run_dir from the saved weights.
RESUME_INVARIANTS = ("seed", "model_size", "micro_batch_size", "grad_accum_steps")
RESUME_INVARIANTS += ("epochs", "lr", "min_lr_ratio", "warmup_steps", "weight_decay")
RESUME_INVARIANTS += ("beta1", "beta2")


def seed_everything(seed: int) -> None:
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


class DataPosition:
    """This rank's RNG states and the train loader's generator state at the current epoch's
    start: a checkpoint component of its own on every rank (ranks draw differently)."""

    def __init__(self, loader: DataLoader):
        self.loader = loader
        self.epoch_start_state = loader.generator.get_state()
        self.pending_rng: dict[str, Any] | None = None

    def begin_epoch(self, epoch: int, skip: int) -> Iterator:
        """The batches of `epoch` after the first `skip` (micro-batches already trained on)."""
        iterator = epoch_iterator(self.loader, epoch, self.epoch_start_state, skip)
        if self.pending_rng is not None:  # after the replay, so replayed reads shift no stream
            restore_rng_state(self.pending_rng)
            self.pending_rng = None
        return iterator

    @property
    def batches(self) -> int:
        """Micro-batches in one epoch of the training loader."""
        return len(self.loader)

    def end_epoch(self) -> None:
        """Record where the next epoch starts."""
        self.epoch_start_state = self.loader.generator.get_state()

    def state_dict(self) -> dict[str, Any]:
        """The live RNG states and the generator state at the epoch's start."""
        return {"rng": capture_rng_state(), "loader_generator": self.epoch_start_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a saved position; the RNG states come back once the epoch is replayed."""
        self.epoch_start_state = state["loader_generator"]
        self.pending_rng = state["rng"]


def check_resumable(checkpoint: Checkpoint, config: Config, world_size: int) -> None:
    """Refuse a checkpoint this run cannot continue exactly.

    Raises:
        ValueError: another checkpoint format, another process count, or a changed
            `RESUME_INVARIANTS` or task data setting.
    """
    saved_format = checkpoint.state.get("format", 1)
    if saved_format != FORMAT_VERSION:
        raise ValueError(
            f"{checkpoint.folder} has checkpoint format {saved_format} and this code reads "
            f"format {FORMAT_VERSION}; resume it with the project version that wrote it"
        )
    saved_world = len(checkpoint.state["ranks"])
    if saved_world != world_size:
        raise ValueError(
            f"cannot resume {saved_world}-process checkpoints with {world_size} processes; "
            "launch as many as the checkpoint had"
        )
    saved = checkpoint.state["config"]
    keys = RESUME_INVARIANTS + config.task_resume_keys
    changed = [key for key in keys if saved.get(key) != getattr(config, key)]
    derived = [key for key in changed if key not in {f.name for f in dataclasses.fields(config)}]
    if derived:  # not settings one can pass back: values the task derives from its data
        raise ValueError(
            f"cannot resume: the data changed since the checkpoint ({', '.join(derived)}); "
            "put it back as it was, or pass run_dir=NEW to start another run"
        )
    if changed:
        was = ", ".join(f"{key}={saved[key]}" for key in changed)
        raise ValueError(
            f"cannot resume with changed {', '.join(changed)} (the checkpoint has {was}); "
            "use the checkpoint's values or pass run_dir=NEW"
        )


def enter_run_folder(config: Config, runtime: Runtime, resume: bool) -> None:
    """With `resume`, refuse a folder where no run has started (a mistyped run_dir would
    otherwise train from scratch); then mark the folder as a run's (the main process), so that
    a job requeued with `--resume` after a first launch that ended during set-up still starts
    the run. A collective, called after the checks that refuse a config and before the costly
    set-up (the engine).

    Raises:
        NotARunFolder: `resume`, and no run has started in `run_dir`; nothing is written.
    """
    if resume and any_process(runtime.is_main and not holds_a_run(config.run_dir), runtime):
        raise NotARunFolder(config.run_dir)
    if runtime.is_main:
        mark_as_a_run(config.run_dir)


def start_or_resume(
    checkpoints: CheckpointManager, config: Config, runtime: Runtime, resume: bool
) -> str | None:
    """With `resume`, restore the latest complete checkpoint and return its folder (None when
    there is none yet); without, check the run folder is free to start in.

    Raises:
        ValueError: starting over in a folder that holds a run (it would mix two runs);
            resuming where checkpoints exist but none loads, or `check_resumable` refuses.
    """
    if not resume:
        if checkpoints.has_checkpoints():
            raise ValueError(
                f"{config.run_dir} already holds a run; pass --resume to continue it "
                "or run_dir=NEW to start another"
            )
        return None
    candidates = checkpoints.candidates()
    if not candidates:
        if checkpoints.has_checkpoints():
            raise ValueError(
                f"no checkpoint in {checkpoints.directory} loads (all damaged); "
                "move the folder away or pass run_dir=NEW"
            )
        runtime.notice(f"no checkpoint in {checkpoints.directory} yet; starting at step 0")
        return None
    check_resumable(candidates[0], config, runtime.world_size)
    for checkpoint in candidates[:-1]:
        try:
            return _restore(checkpoints, checkpoint, runtime)
        except ValueError as error:  # every process or none fails: loads are collectives
            runtime.notice(f"{error}; trying the checkpoint before it")
    return _restore(checkpoints, candidates[-1], runtime)


def _restore(checkpoints: CheckpointManager, checkpoint: Checkpoint, runtime: Runtime) -> str:
    if checkpoint.fallback:
        runtime.notice(f"resuming from {checkpoint.folder}, not the one `last` names")
    checkpoints.restore(checkpoint)
    return str(checkpoint.folder)
