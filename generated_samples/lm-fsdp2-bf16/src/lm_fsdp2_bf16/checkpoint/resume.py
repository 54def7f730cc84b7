"""What a resume needs besides the model and optimizer: RNG states, the exact data position,
and the settings a checkpoint fixes.

A resumed run replays the interrupted epoch from the loader generator's state at that epoch's
start, skipping the batches already trained on, then restores the RNG states saved with the
checkpoint: the next batch, its random transforms and the dropout masks are bitwise the ones the
interrupted run would have drawn.

A resume on another number of processes (`allow_world_size_change`) keeps the global batch,
split the way scaffold's planner splits it (`split_global_batch`), and continues the epoch's
order (a shuffle of the seed and the epoch alone, the same at every world size) after the
sequences already trained on: none twice, none skipped. The per-rank random streams cannot be
carried over; they are derived afresh from the seed, the step and the rank (`derived_seed`).
An epoch drops the last samples that do not fill a micro-batch on every rank: with another
micro-batch x world size, that tail may hold fewer or more samples (less than one micro-batch
per rank).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from ..config import Config
from ..loader.dataloaders import epoch_iterator
from ..runtime import Runtime, any_process
from ..training.optim import respan
from ..training.run_folder import NotARunFolder, holds_a_run, mark_as_a_run
from ..training.state import TrainState
from .store import FORMAT_VERSION, Checkpoint, CheckpointManager, find_latest

# Settings a resume must share with the checkpoint: they fix the data order, the model's shape,
# and the optimizer and LR schedule that the checkpoint restores (a changed lr or epochs would
# be recorded but not applied); the task adds its data settings (`task_resume_keys`). To
# change them, start a new run_dir from the saved weights.
RESUME_INVARIANTS = ("seed", "model_size", "micro_batch_size", "grad_accum_steps")
RESUME_INVARIANTS += ("epochs", "max_steps", "lr", "min_lr_ratio", "warmup_steps", "weight_decay")
RESUME_INVARIANTS += ("beta1", "beta2")
# A resume on another world size keeps their product with it, the global batch, instead.
BATCH_SPLIT = ("micro_batch_size", "grad_accum_steps")


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


def split_global_batch(global_batch: int, world_size: int, max_micro_batch: int) -> tuple[int, int]:
    """(micro_batch_size, grad_accum_steps) that give `global_batch` samples per optimizer step
    over `world_size` processes, as scaffold's planner splits a batch: the largest divisor of
    the per-process samples that is at most `max_micro_batch` (the largest that fits), and the
    accumulation that makes up the rest.

    Raises:
        ValueError: `global_batch` does not divide by `world_size`.
    """
    if global_batch % world_size:
        raise ValueError(
            f"the run's global batch of {global_batch} samples does not divide among "
            f"{world_size} processes; launch a number of processes that divides {global_batch}"
        )
    per_process = global_batch // world_size
    micro = max(d for d in range(1, min(per_process, max_micro_batch) + 1) if per_process % d == 0)
    return micro, per_process // micro


@dataclass(frozen=True)
class WorldSizeChange:
    """A resume on `world_size` processes of a checkpoint written by `saved_world_size` at
    optimizer step `step`; each process now runs `grad_accum_steps` micro-batches of
    `micro_batch_size` per step, so the global batch is the checkpoint's."""

    step: int
    saved_world_size: int
    world_size: int
    micro_batch_size: int
    grad_accum_steps: int

    def describe(self) -> str:
        """One line for the log and the notice."""
        return (
            f"world size {self.saved_world_size} -> {self.world_size} at step {self.step} "
            f"(per process: micro-batch {self.micro_batch_size} x {self.grad_accum_steps} "
            "accumulation steps; the same global batch, another reduction order, new per-rank "
            "random streams)"
        )


def saved_global_batch(checkpoint: Checkpoint) -> int:
    """Samples per optimizer step of the run that wrote `checkpoint`, over all its processes."""
    saved = checkpoint.state["config"]
    return saved["micro_batch_size"] * saved["grad_accum_steps"] * len(checkpoint.state["ranks"])


def world_size_refusal(checkpoint: Checkpoint, config: Config, world_size: int) -> str | None:
    """Why this run may not continue `checkpoint` on `world_size` processes, or None (the
    same world size, or a change the config allows)."""
    saved_world = len(checkpoint.state["ranks"])
    if saved_world == world_size or config.allow_world_size_change:
        return None
    return (
        f"{checkpoint.folder} was written by {saved_world} process(es) and this run has "
        f"{world_size}; launch {saved_world}, or add --allow-world-size-change to continue "
        f"on {world_size} with the same global batch (the numerics change slightly)"
    )


def fit_to_checkpoint(config: Config, world_size: int, resume: bool) -> Config:
    """The config this run continues its latest checkpoint with. Reads files only: call it
    before anything is built. With `allow_world_size_change`, the checkpoint's global batch is
    kept: on another world size split anew (`split_global_batch`, at most the config's
    `micro_batch_size` per micro-batch), on the same one as the checkpoint split it. Else, or
    without `resume` or a checkpoint, `config` as it is.

    Raises:
        ValueError: the world size changed and `allow_world_size_change` is off (the message
            says what to do); the global batch does not divide by the world size.
    """
    latest = find_latest(Path(config.run_dir) / "checkpoints") if resume else None
    if latest is None:
        return config
    if reason := world_size_refusal(latest, config, world_size):
        raise ValueError(reason)
    if not config.allow_world_size_change:
        return config
    if len(latest.state["ranks"]) == world_size:
        saved = latest.state["config"]
        return dataclasses.replace(config, **{key: saved[key] for key in BATCH_SPLIT})
    global_batch = saved_global_batch(latest)
    micro, accumulation = split_global_batch(global_batch, world_size, config.micro_batch_size)
    return dataclasses.replace(config, micro_batch_size=micro, grad_accum_steps=accumulation)


class DataPosition:
    """This rank's RNG states and the train loader's generator state at the current epoch's
    start: a checkpoint component of its own on every rank (ranks draw differently)."""

    def __init__(self, loader: DataLoader):
        self.loader = loader
        self.epoch_start_state = loader.generator.get_state()
        self.pending_rng: dict[str, Any] | None = None
        self.replay = True  # read the skipped batches again: their random streams are ours
        self.iterator: Iterator | None = None  # the current epoch's, across validations

    def batches_from(self, epoch: int, skip: int) -> Iterator:
        """The current epoch's micro-batches: an iterator `begin_epoch` starts after `skip`
        on the epoch's first call, and the same one, where it left off, until `end_epoch`."""
        if self.iterator is None:
            self.iterator = self.begin_epoch(epoch, skip)
        return self.iterator

    def begin_epoch(self, epoch: int, skip: int) -> Iterator:
        """The batches of `epoch` after the first `skip` (micro-batches already trained on)."""
        iterator = epoch_iterator(self.loader, epoch, self.epoch_start_state, skip, self.replay)
        self.replay = True
        if self.pending_rng is not None:  # after the replay, so replayed reads shift no stream
            restore_rng_state(self.pending_rng)
            self.pending_rng = None
        return iterator

    def batches_after(self, samples: int, world_size: int) -> int:
        """This rank's micro-batches that hold the epoch's first `samples` samples (counted
        over every rank), at this loader's micro-batch and `world_size`: micro-batch b of every
        rank holds the order's samples [b, b + 1) x micro_batch_size x world_size.

        Raises:
            ValueError: `samples` ends inside a micro-batch (not at an optimizer step).
        """
        per_batch = self.loader.sampler.batch_size * world_size
        if samples % per_batch:
            raise ValueError(
                f"the checkpoint's data position ({samples} samples into the epoch) is not a "
                f"whole number of {per_batch}-sample micro-batches; resume it on the process "
                "count that wrote it"
            )
        return min(samples // per_batch, self.batches)

    def start_afresh(self, seed: int, step: int, rank: int) -> None:
        """Carry on without this rank's saved streams (a checkpoint of another world size):
        seed every RNG and the loader generator from `derived_seed(seed, step, rank)`, and let
        the next `begin_epoch` skip the batches trained on without reading them."""
        derived = derived_seed(seed, step, rank)
        seed_all(derived)
        self.epoch_start_state = torch.Generator().manual_seed(derived).get_state()
        self.pending_rng, self.replay = None, False

    @property
    def batches(self) -> int:
        """Micro-batches in one epoch of the training loader."""
        return len(self.loader)

    def close(self) -> None:
        """Let the current epoch's iterator, and any loader workers it keeps, go: the run is
        over (they hold the run folder's lock, which a forked worker shares)."""
        self.iterator = None

    def end_epoch(self) -> None:
        """Record where the next epoch starts; let the finished epoch's iterator (and any
        loader workers it keeps) go."""
        self.epoch_start_state = self.loader.generator.get_state()
        self.iterator = None

    def state_dict(self) -> dict[str, Any]:
        """The live RNG states and the generator state at the epoch's start."""
        return {"rng": capture_rng_state(), "loader_generator": self.epoch_start_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a saved position; the RNG states come back once the epoch is replayed."""
        self.epoch_start_state = state["loader_generator"]
        self.pending_rng = state["rng"]


def starting_state(config: Config, loader: DataLoader, world_size: int) -> TrainState:
    """Where a run over `loader` at `world_size` starts: step 0 of its first epoch, at the
    data position of `loader`, with its step budget and its length in steps (the epochs'
    steps of `grad_accum_steps` micro-batches, or a budget that ends it sooner)."""
    steps_per_epoch = math.ceil(len(loader) / config.grad_accum_steps)
    return TrainState(
        data=DataPosition(loader),
        step_budget=config.step_budget(world_size),
        run_steps=config.run_steps(steps_per_epoch, world_size),
    )


def check_resumable(checkpoint: Checkpoint, config: Config, world_size: int) -> str | None:
    """Refuse a checkpoint this run cannot continue: exactly, or on another world size where
    the config allows it (`world_size_refusal`), with the same global batch, or on changed
    data where it allows that (`data_change`). Returns that change in words, or None.

    Raises:
        ValueError: another checkpoint format, a process count `world_size_refusal` refuses,
            a changed `RESUME_INVARIANTS` or task setting (on another world size the global
            batch stands in for micro_batch_size and grad_accum_steps), or changed data that
            `data_change` refuses.
    """
    saved_format = checkpoint.state.get("format", 1)
    if saved_format != FORMAT_VERSION:
        raise ValueError(
            f"{checkpoint.folder} has checkpoint format {saved_format} and this code reads "
            f"format {FORMAT_VERSION}; resume it with the project version that wrote it"
        )
    saved_world = len(checkpoint.state["ranks"])
    if reason := world_size_refusal(checkpoint, config, world_size):
        raise ValueError(reason)
    # The task's keys that are not settings (values it derives from its data) are its
    # `task_data_change`'s to compare.
    defaults = {field.name: field.default for field in dataclasses.fields(config)}
    keys = [key for key in RESUME_INVARIANTS + config.task_resume_keys if key in defaults]
    if saved_world != world_size:
        keys = [key for key in keys if key not in BATCH_SPLIT]
        saved_batch = saved_global_batch(checkpoint)
        if config.global_batch_size(world_size) != saved_batch:
            raise ValueError(
                f"cannot resume with a global batch of {config.global_batch_size(world_size)} "
                f"(the checkpoint has {saved_batch}); keep micro_batch_size x "
                f"grad_accum_steps x processes at {saved_batch} or pass run_dir=NEW"
            )
    # A key a checkpoint of an earlier version does not have held its default value then.
    saved = {key: checkpoint.state["config"].get(key, defaults[key]) for key in keys}
    changed = [key for key in keys if saved[key] != getattr(config, key)]
    if changed:
        was = ", ".join(f"{key}={saved[key]}" for key in changed)
        raise ValueError(
            f"cannot resume with changed {', '.join(changed)} (the checkpoint has {was}); "
            "use the checkpoint's values or pass run_dir=NEW"
        )
    return data_change(checkpoint, config)


def data_change(checkpoint: Checkpoint, config: Config) -> str | None:
    """How the task's data differs from what `checkpoint` trained on, in words (None: it does
    not), where the run may continue on it: `allow_data_change`, and data the task can
    continue on. The task's `task_data_change` hook tells; a task without one, the values of
    its `task_resume_keys` that are no settings (derived from its data) that changed.

    Raises:
        ValueError: the data changed, and the config or the task refuses to go on with it.
    """
    saved = checkpoint.state["config"]
    hook = getattr(config, "task_data_change", None)  # an optional hook of the task's
    if hook is not None:
        change = hook(saved, config.run_dir)
    else:
        settings = {field.name for field in dataclasses.fields(config)}
        derived = [key for key in config.task_resume_keys if key not in settings]
        changed = [key for key in derived if saved.get(key) != getattr(config, key)]
        change = (f"{', '.join(changed)} changed", None) if changed else None
    if change is None:
        return None
    description, refusal = change
    if refusal:
        raise ValueError(
            f"cannot resume {checkpoint.folder}: the data changed since ({description}), and "
            f"the run cannot go on with it: {refusal}; or pass run_dir=NEW"
        )
    if not config.allow_data_change:
        raise ValueError(
            f"cannot resume {checkpoint.folder}: the data changed since ({description}); put "
            "it back as it was, add --allow-data-change to continue on it from a new epoch "
            "with the checkpoint's weights and optimizer, or pass run_dir=NEW"
        )
    return description


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


def fresh_start_refusal(run_dir: str | Path) -> str:
    """Why a launch without `--resume` may not start in `run_dir`, which holds checkpoints."""
    return (
        f"{run_dir} already holds a run; pass --resume to continue it "
        "or run_dir=NEW to start another"
    )


def start_or_resume(
    checkpoints: CheckpointManager,
    state: TrainState,
    runtime: Runtime,
    resume: bool,
) -> str | None:
    """With `resume`, restore the latest complete checkpoint into `checkpoints`' engine and
    components and `state` (`TrainState`, one of them) and return its folder (None when there
    is none yet); without, check the run folder is free to start in. A checkpoint of another
    world size (`fit_to_checkpoint` fitted the config to it) continues at its data position,
    with new per-rank random streams (`DataPosition.start_afresh`), and the change is
    appended to `state.world_size_changes` (a `WorldSizeChange` as a dict).

    Raises:
        ValueError: starting over in a folder that holds a run (it would mix two runs);
            resuming where checkpoints exist but none loads, or `check_resumable` refuses.
    """
    config = checkpoints.config
    if not resume:
        if checkpoints.has_checkpoints():
            raise ValueError(fresh_start_refusal(config.run_dir))
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
    changed_data = check_resumable(candidates[0], config, runtime.world_size)
    for checkpoint in candidates[:-1]:
        try:
            folder = _restore(checkpoints, checkpoint, state, changed_data)
            break
        except ValueError as error:  # every process or none fails: loads are collectives
            runtime.notice(f"{error}; trying the checkpoint before it")
    else:
        folder = _restore(checkpoints, candidates[-1], state, changed_data)
    state.end_used_up_epoch()
    return folder


def _restore(
    checkpoints: CheckpointManager,
    checkpoint: Checkpoint,
    state: TrainState,
    changed_data: str | None,
) -> str:
    config, runtime = checkpoints.config, checkpoints.runtime
    if checkpoint.fallback:
        runtime.notice(f"resuming from {checkpoint.folder}, not the one `last` names")
    saved_world = len(checkpoint.state["ranks"])
    if saved_world == runtime.world_size and changed_data is None:
        checkpoints.restore(checkpoint)
        return str(checkpoint.folder)
    if reason := world_size_refusal(checkpoint, config, runtime.world_size):
        raise ValueError(reason)
    checkpoints.restore(checkpoint, rank_states=False)
    if changed_data is not None:
        continue_on_new_data(state, config, checkpoints.components["scheduler"], changed_data)
        runtime.notice(f"resuming {checkpoint.folder} on changed data: {changed_data}")
    elif saved_world != runtime.world_size:
        saved_micro = checkpoint.state["config"]["micro_batch_size"]
        saved_epoch = len(state.data.loader.dataset) // saved_world // saved_micro
        if state.batch_in_epoch >= saved_epoch:  # the epoch's last step: done here too
            state.batch_in_epoch = state.data.batches
        else:
            samples = state.batch_in_epoch * saved_micro * saved_world
            state.batch_in_epoch = state.data.batches_after(samples, runtime.world_size)
    state.data.start_afresh(config.seed, state.step, runtime.rank)
    if saved_world != runtime.world_size:
        split = (config.micro_batch_size, config.grad_accum_steps)
        change = WorldSizeChange(state.step, saved_world, runtime.world_size, *split)
        state.world_size_changes.append(dataclasses.asdict(change))
        runtime.notice(f"resuming {checkpoint.folder}: {change.describe()}")
    return str(checkpoint.folder)


def continue_on_new_data(state: TrainState, config: Config, scheduler, change: str) -> None:
    """Go on from `state` (a checkpoint's, restored) on other data: from the start of a new
    epoch (the checkpoint's, where it was at one), the run's length in steps the steps taken
    plus the epochs left over the new data (or its step budget, where that ends it sooner),
    and the LR schedule spanning that; the `change` is recorded in `state.data_changes`."""
    if state.batch_in_epoch:
        state.epoch, state.batch_in_epoch = state.epoch + 1, 0
    steps_per_epoch = math.ceil(state.data.batches / config.grad_accum_steps)
    length = state.step + max(0, config.epochs - state.epoch) * steps_per_epoch
    state.run_steps = min(length, state.step_budget) if state.step_budget else length
    respan(scheduler, state.run_steps)
    state.data_changes.append({"step": state.step, "epoch": state.epoch, "change": change})
