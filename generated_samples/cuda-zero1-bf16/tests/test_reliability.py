"""Runs that meet a stop signal, a non-finite step, unequal validation shards, a damaged or
foreign checkpoint, a bad config, a busy run folder or a `--resume` of a folder where no run
started: each loses nothing and says what happened."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from cuda_zero1_bf16.checkpoint import TRAINER_FILE, find_latest, step_folders
from cuda_zero1_bf16.config import Config, load_config, parse_command_line
from cuda_zero1_bf16.data import build_datasets
from cuda_zero1_bf16.engine import Engine
from cuda_zero1_bf16.loader import dataloaders as loader
from cuda_zero1_bf16.runtime import init_runtime
from cuda_zero1_bf16.state_io import atomic_save
from cuda_zero1_bf16.train import Trainer, main, train_step
from cuda_zero1_bf16.training import (
    PREEMPTED_EXIT_CODE,
    NotARunFolder,
    Preempted,
    evaluate,
    holds_a_run,
    mark_as_a_run,
)

from conftest import (
    PROJECT_ROOT,
    TEST_OVERRIDES,
    config_for_tests,
    exported_weights,
    logged_records,
    start_training,
    wait_for_train_step,
)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Config:
    """One epoch of two-micro-batch steps with a checkpoint every 4 steps, trained once for
    this module without a stop: the run every interrupted one must reproduce."""
    config = config_for_tests(tmp_path_factory.mktemp("straight") / "run")
    config = dataclasses.replace(config, epochs=1, grad_accum_steps=2, checkpoint_every=4)
    Trainer(config, init_runtime("cpu")).fit()
    return config


def on_forward(trainer: Trainer, act) -> list[int]:
    """Call `act(calls, training)` after every forward pass of the bare model, with the count
    of training passes so far; returns the counter."""
    calls = [0]

    def hook(module, args, output):
        calls[0] += module.training
        return act(calls[0], module.training, output)

    trainer.engine.model.register_forward_hook(hook)
    return calls


def send_stop_signal_once(sent: list[bool]) -> None:
    if not sent:
        sent.append(True)
        os.kill(os.getpid(), signal.SIGTERM)  # a real signal, to this process


def train_steps_logged(run_dir: Path) -> list[int]:
    return [record["step"] for record in logged_records(run_dir, "train")]


# Where the signal lands: the first micro-batch of step 3 (of 2), the first validation batch,
# and the checkpoint of step 4 while it is written. The run stops at the step it names.
STOPS = {"mid-accumulation": 3, "mid-validation": "last", "mid-save": 4}


@pytest.mark.parametrize("where", STOPS)
def test_a_stop_signal_checkpoints_and_the_resumed_run_ends_bitwise(straight, tmp_path, where):
    config = dataclasses.replace(straight, run_dir=str(tmp_path / "run"), log_every=1)
    trainer, sent = Trainer(config, init_runtime("cpu")), []
    if where == "mid-save":  # `start_save` stages a background save
        name = "start_save" if config.async_checkpoint else "save"
        save = getattr(trainer.engine, name)
        setattr(trainer.engine, name, lambda folder: (send_stop_signal_once(sent), save(folder))[1])
    else:

        def act(calls, training, output):
            if (training and calls == 5) if where == "mid-accumulation" else not training:
                send_stop_signal_once(sent)

        on_forward(trainer, act)
    with pytest.raises(Preempted, match="SIGTERM"):
        trainer.fit()
    stopped_at = trainer.state.run_steps if STOPS[where] == "last" else STOPS[where]
    saved = find_latest(Path(config.run_dir) / "checkpoints")
    assert saved.state["components"]["progress"]["step"] == stopped_at
    Trainer(config, init_runtime("cpu"), resume=True).fit()
    expected, resumed = exported_weights(Path(straight.run_dir)), exported_weights(tmp_path / "run")
    assert all(torch.equal(resumed[name], value) for name, value in expected.items())
    logged = train_steps_logged(tmp_path / "run")
    assert logged == list(range(1, trainer.state.run_steps + 1)), "each step logged once"


def test_the_stop_notice_starts_a_line_of_its_own(config, capsys):
    """The progress bar redraws its line in place without ending it: the notice printed after
    it read as the bar's tail ("...lr=9.76e-05]stopped by SIGTERM at step 2..."). Cursor moves
    (other bars of this test process) are left out."""
    trainer, sent = Trainer(dataclasses.replace(config, log_every=1), init_runtime("cpu")), []

    def act(calls, training, output):
        if training and calls == 2:
            send_stop_signal_once(sent)

    on_forward(trainer, act)
    with pytest.raises(Preempted):
        trainer.fit()
    stderr = capsys.readouterr().err
    before = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", stderr[: stderr.index("stopped by SIGTERM")])
    assert "%|" in before and before.endswith(("\r", "\n")), repr(stderr[-300:])


def test_signals_between_runs_keep_their_previous_handlers(config):
    before = signal.getsignal(signal.SIGTERM)
    Trainer(dataclasses.replace(config, stop_after_steps=1), init_runtime("cpu")).fit()
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_stopped_run_with_loader_workers_exits(tmp_path):
    """The workers ignore the stop signals (the run decides when to stop): its exit must still
    end them. Before, a run stopped mid-epoch saved its checkpoint, then waited for good."""
    run_dir = tmp_path / "run"
    with start_training(
        "device=cpu", "num_workers=2", "log_every=1", f"run_dir='{run_dir.as_posix()}'"
    ) as run:
        wait_for_train_step(run, run_dir, 1, seconds=120)
        run.send_signal(signal.SIGTERM)
        try:
            stderr = run.communicate(timeout=60)[1]
        except subprocess.TimeoutExpired:  # leaving the `with` kills it, the workers too
            pytest.fail("the stopped run did not exit within 60 s")
    assert run.returncode == PREEMPTED_EXIT_CODE, stderr[-3000:]
    assert "stopped by SIGTERM" in stderr


def test_validation_pads_to_the_most_batches_and_counts_each_sample_once(config, monkeypatch):
    trainer = Trainer(config, init_runtime("cpu"))
    passes = on_forward(trainer, lambda calls, training, output: None)
    evals = []
    trainer.engine.model.register_forward_hook(lambda module, args, output: evals.append(1))
    batches = len(trainer.val_loader)
    exact = evaluate(trainer.engine, trainer.val_loader, 0, lambda: None)
    # as if another rank had two more validation batches than this one
    monkeypatch.setattr(loader, "most_eval_batches", lambda *args: batches + 2)
    padded = evaluate(trainer.engine, trainer.val_loader, 0, lambda: None)
    assert len(evals) == 2 * batches + 2 and passes[0] == 0
    assert padded == exact, "the padding passes count nothing"
    evals.clear()
    bounded = evaluate(trainer.engine, trainer.val_loader, 2, lambda: None)  # val_batches=2
    assert len(evals) == 2 and bounded != exact, "the first two batches only"


def poison(output):
    return output * float("inf")  # inf logits: an inf/NaN loss and gradients


def test_a_skipped_update_is_counted_and_does_not_move_the_schedule(config):
    config = dataclasses.replace(config, log_every=1, stop_after_steps=5)
    trainer = Trainer(config, init_runtime("cpu"))
    on_forward(trainer, lambda calls, training, output: poison(output) if calls == 3 else None)
    trainer.fit()
    assert trainer.guards.nonfinite.skipped == 1 and trainer.state.step == 5
    assert trainer.scheduler.last_epoch == 4, "the schedule counts applied updates only"
    records = logged_records(Path(config.run_dir))
    skipped = [record["skipped_steps"] for record in records if record["kind"] == "train"]
    assert skipped == [0, 0, 1, 1, 1]


def test_skipped_updates_in_a_row_stop_the_run_with_the_weights_untouched(config):
    config = dataclasses.replace(config, max_nonfinite_steps=3, checkpoint_every=1)
    trainer = Trainer(config, init_runtime("cpu"))
    before = {name: value.clone() for name, value in trainer.engine.full_state_dict().items()}
    on_forward(trainer, lambda calls, training, output: poison(output) if training else None)
    with pytest.raises(FloatingPointError, match="3 optimizer steps in a row"):
        trainer.fit()
    after = trainer.engine.full_state_dict()
    assert all(torch.equal(after[name], value) for name, value in before.items())
    assert trainer.scheduler.last_epoch == 0


def test_the_optimizer_state_loads_whatever_gradients_are_present(config, tmp_path):
    config = dataclasses.replace(config, stop_after_steps=2, dropout=0.0)  # the same masks
    first = Trainer(config, init_runtime("cpu"))
    first.fit()
    other = dataclasses.replace(config, run_dir=str(tmp_path / "other"))
    second = Trainer(other, init_runtime("cpu"))
    batch = next(iter(second.train_loader))
    inputs, targets = batch  # no optimizer state yet, gradients present (a sanity backward):
    with second.engine.autocast():
        loss = second.engine.module(inputs).float().mean()
    second.engine.backward(loss)
    second.checkpoints.restore(find_latest(first.checkpoints.directory))
    for trainer in (first, second):  # the same next step: equal only if AdamW's state loaded
        train_step(trainer.engine, trainer.scheduler, [batch], 1, config.max_grad_norm)
    expected, loaded = first.engine.full_state_dict(), second.engine.full_state_dict()
    assert all(torch.equal(loaded[name], value) for name, value in expected.items())


@pytest.fixture
def two_checkpoints(straight, tmp_path) -> tuple[Config, list[Path]]:
    """A copy of the straight run for one test to damage: its config and step folders."""
    config = dataclasses.replace(straight, run_dir=str(tmp_path / "run"))
    shutil.copytree(straight.run_dir, config.run_dir)
    return config, step_folders(Path(config.run_dir) / "checkpoints")


def test_a_checkpoint_of_an_earlier_version_resumes_where_its_epoch_ended(two_checkpoints):
    """An earlier version wrote a stop signal's checkpoint before the epoch's validation, its
    data used up and the epoch not yet ended, and counted early stopping in epochs: the resume
    ends that epoch, runs the validation it owes, and trains nothing twice."""
    config, folders = two_checkpoints
    batches = len(loader.make_train_loader(build_datasets(config)[0], config, init_runtime("cpu")))

    def as_earlier_versions(state):
        progress = state["components"]["progress"]
        for key in ("validated_step", "validations_without_improvement", "data_changes"):
            progress.pop(key)
        progress.update(epoch=0, batch_in_epoch=batches, history=[], epochs_without_improvement=0)
        progress.update(best_value=float("nan"), best_step=-1, best_epoch=-1)

    rewrite_trainer_state(folders[-1], as_earlier_versions)
    summary = Trainer(config, init_runtime("cpu"), resume=True).fit()
    run_dir = Path(config.run_dir)
    resumed_at = logged_records(run_dir, "start")[-1]["step"]
    assert resumed_at == summary["steps"], "the epoch's steps were done: none trained again"
    assert logged_records(run_dir, "val")[-1]["step"] == summary["steps"]
    assert summary["epochs"] == 1 and summary["best"]["step"] == summary["steps"]


def test_a_torn_newest_checkpoint_falls_back_to_the_one_before(two_checkpoints):
    config, folders = two_checkpoints
    for path in folders[-1].rglob("*"):  # every engine file torn, trainer.pt intact
        if path.is_file() and path.name not in (TRAINER_FILE, "COMPLETE"):
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    trainer = Trainer(config, init_runtime("cpu"), resume=True)
    assert trainer.resumed_from == str(folders[-2])


def rewrite_trainer_state(folder: Path, change) -> None:
    state = torch.load(folder / TRAINER_FILE, weights_only=True)
    change(state)
    atomic_save(state, folder / TRAINER_FILE)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda state: state.update(format=99, scaffold_release="9.0.0"),
            "format 99, written by a project of scaffold 9.0.0, .*; `scaffold update` this project",
        ),
        (
            lambda state: state.update(format=0, scaffold_release="0.0.1"),
            "format 0, written by .* 0.0.1, .* finish that run with the project as scaffold 0.0.1",
        ),
        (lambda state: state["ranks"].append(state["ranks"][0]), "written by 2 process"),
        (lambda state: state["config"].update(seed=7), "changed seed"),
    ],
)
def test_a_foreign_checkpoint_is_refused_in_one_line_saying_what_differs(
    two_checkpoints, change, message
):
    config, folders = two_checkpoints
    for folder in folders:
        rewrite_trainer_state(folder, change)
    with pytest.raises(ValueError, match=message) as refused:
        Trainer(config, init_runtime("cpu"), resume=True)
    assert "\n" not in str(refused.value)


def test_every_config_problem_is_listed_in_one_error():
    overrides = ["lr=-1", "grad_accum_steps=0", "epochs=many", "learning_rate=1", "dropout"]
    overrides += ["val_evry=5", "val_every=-1"]
    with pytest.raises(ValueError) as refused:
        load_config(None, overrides)
    message = str(refused.value)
    assert message.startswith("7 config problems") and "\n" not in message
    for problem in [
        "lr must be > 0",
        "grad_accum_steps must be > 0",
        "'epochs' needs a whole number",
        "unknown config key 'learning_rate'",
        "unknown config key 'val_evry' in the command line (did you mean val_every?)",
        "val_every must be >= 0",
        "'dropout' is not key=value",
    ]:
        assert problem in message


def test_a_second_run_in_a_busy_folder_is_refused(config):
    first = Trainer(config, init_runtime("cpu"))
    with pytest.raises(ValueError, match="in use by pid"):
        Trainer(config, init_runtime("cpu"), resume=True)
    first.guards.run_folder.release()
    Trainer(config, init_runtime("cpu"), resume=True)


CONFIG_FILE = ["--config", str(PROJECT_ROOT / "configs" / "train.toml")]


@pytest.mark.parametrize("made", [False, True], ids=["missing", "empty"])
def test_a_resume_where_no_run_started_is_refused_in_one_line(tmp_path, monkeypatch, made):
    """A mistyped run_dir under --resume trained a whole run from scratch: it is refused in one
    line that names the folder and the way out, on the command line and through the API."""
    run_dir = tmp_path / "runs" / "nonexistent3b"
    if made:
        run_dir.mkdir(parents=True)
    before = sorted(tmp_path.rglob("*"))
    # main leaves the process group on its way out; later tests share this process's group.
    monkeypatch.setattr("cuda_zero1_bf16.train.shutdown_runtime", lambda runtime: None)
    with pytest.raises(SystemExit) as exited:
        main([*CONFIG_FILE, *TEST_OVERRIDES, "device=cpu", "--resume", f"run_dir='{run_dir}'"])
    message = str(exited.value.code)  # a set-up error's one line, exit status 1
    assert message.startswith("error: --resume") and "\n" not in message, message
    assert str(run_dir) in message and "drop --resume" in message, message
    with pytest.raises(NotARunFolder, match="drop --resume"):
        Trainer(config_for_tests(run_dir), init_runtime("cpu"), resume=True)
    assert sorted(tmp_path.rglob("*")) == before, "nothing written"


def test_a_resume_of_a_run_that_ended_in_its_set_up_starts_it(config, monkeypatch):
    """A SLURM requeue passes --resume: after a first launch that ended before its first
    checkpoint, even while its engine was built, the folder is a run's, and the run starts at
    step 0."""

    class Preempted(Engine):
        def __init__(self, *args):
            raise OSError("preempted during set-up")

    monkeypatch.setattr("cuda_zero1_bf16.train.Engine", Preempted)
    with pytest.raises(OSError, match="preempted"):
        Trainer(config, init_runtime("cpu"))
    monkeypatch.undo()
    assert holds_a_run(config.run_dir)
    _, resume = parse_command_line([*CONFIG_FILE, f"run_dir='{config.run_dir}'", "--resume"], "")
    trainer = Trainer(config, init_runtime("cpu"), resume=resume)
    assert resume and trainer.resumed_from is None and trainer.state.step == 0


def test_flags_may_follow_the_overrides(tmp_path):
    run_dir = tmp_path / "run"
    mark_as_a_run(str(run_dir))  # --resume needs a folder where a run started
    argv = [f"run_dir='{run_dir.as_posix()}'", "--resume", "stop_after_steps=80", *CONFIG_FILE]
    config, resume = parse_command_line([*argv, "lr=1e-3", "--allow-world-size-change"], "")
    assert resume and (config.stop_after_steps, config.lr) == (80, 1e-3)
    assert config.allow_world_size_change
    assert config.run_dir == run_dir.as_posix()


def test_a_start_removes_what_killed_saves_left_behind(config):
    Trainer(dataclasses.replace(config, stop_after_steps=1), init_runtime("cpu")).fit()
    checkpoints = Path(config.run_dir) / "checkpoints"
    partial = checkpoints / ".step-00000009.partial"
    partial.mkdir()
    (partial / "shard").write_bytes(b"half")
    leftovers = [partial, checkpoints / ".last.tmp4242", Path(config.run_dir) / ".x.tmp7"]
    for path in leftovers[1:]:
        path.write_bytes(b"half")
    keep = Path(config.run_dir) / ".keep.tmp"  # not a name our writers use
    keep.write_bytes(b"theirs")
    Trainer(config, init_runtime("cpu"), resume=True)
    assert not any(path.exists() for path in leftovers) and keep.exists()


def test_a_resume_past_stop_after_steps_stops_at_once(config):
    Trainer(dataclasses.replace(config, stop_after_steps=3), init_runtime("cpu")).fit()
    trainer = Trainer(dataclasses.replace(config, stop_after_steps=2), init_runtime("cpu"), True)
    trainer.fit()
    assert trainer.state.step == 3 and not math.isnan(trainer.state.initial_loss)
