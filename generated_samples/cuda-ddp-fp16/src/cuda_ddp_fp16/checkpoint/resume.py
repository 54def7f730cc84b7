"""A resume: the refusals of a checkpoint this run cannot continue (another format, a changed
setting it fixes, changed data), and the restore of the latest one that loads into the engine,
the components and the training state.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from ..config import Config
from ..runtime import Runtime
from ..training.optim import respan
from ..training.run_folder import fresh_start_refusal
from ..training.state import TrainState
from .store import FORMAT_VERSION, SCAFFOLD_RELEASE, Checkpoint, CheckpointManager, find_latest
from .world_size import (
    BATCH_SPLIT,
    WorldSizeChange,
    fit_to_checkpoint,
    saved_global_batch,
    world_size_refusal,
)

# Settings a resume must share with the checkpoint: they fix the data order, the model's shape,
# and the optimizer and LR schedule that the checkpoint restores (a changed lr or epochs would
# be recorded but not applied); the task adds its data settings (`task_resume_keys`). To
# change them, start a new run_dir from the saved weights.
RESUME_INVARIANTS = ("seed", "model_size", "micro_batch_size", "grad_accum_steps")
RESUME_INVARIANTS += ("epochs", "max_steps", "lr", "min_lr_ratio", "warmup_steps", "weight_decay")
RESUME_INVARIANTS += ("beta1", "beta2")


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
        release = checkpoint.state.get("scaffold_release", "0.1.0")  # 0.1.0 recorded none
        written = (
            f"{checkpoint.folder} has checkpoint format {saved_format}, written by a project of "
            f"scaffold {release}, and this project (scaffold {SCAFFOLD_RELEASE}) reads format "
            f"{FORMAT_VERSION}"
        )
        if saved_format > FORMAT_VERSION:
            raise ValueError(f"{written}; `scaffold update` this project, or pass run_dir=NEW")
        raise ValueError(
            f"{written}; finish that run with the project as scaffold {release} rendered it "
            "(its commit before `scaffold update`), or pass run_dir=NEW"
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


def config_to_resume(config: Config, world_size: int, resume: bool) -> Config:
    """`fit_to_checkpoint`'s config; with `resume`, the latest checkpoint refused at once where
    `check_resumable` would refuse it, before any model is built or weights are read: a
    changed setting, init_from or data is said in a second, not after a large model has
    loaded. `start_or_resume` checks every checkpoint it tries again.

    Raises:
        ValueError: what `fit_to_checkpoint` or `check_resumable` raises.
    """
    config = fit_to_checkpoint(config, world_size, resume)
    latest = find_latest(Path(config.run_dir) / "checkpoints") if resume else None
    if latest is not None:
        check_resumable(latest, config, world_size)
    return config


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
    appended to `state.world_size_changes` (a `WorldSizeChange` as a dict). Each checkpoint
    tried is checked first (`check_resumable`), so `_restore` takes only what may continue.

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
    for checkpoint in candidates:
        # Each one checked, the fallbacks too: an earlier checkpoint may hold other settings.
        changed_data = check_resumable(checkpoint, config, runtime.world_size)
        try:
            folder = _restore(checkpoints, checkpoint, state, changed_data)
            break
        except ValueError as error:  # every process or none fails: loads are collectives
            if checkpoint is candidates[-1]:
                raise
            runtime.notice(f"{error}; trying the checkpoint before it")
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
