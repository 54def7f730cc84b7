"""One run per run folder, and what killed runs of it left behind.

The main process holds an exclusive `flock` on `<run_dir>/.lock` for the run's life; the
kernel drops it when the process ends, however it ends (SIGKILL and power loss included). A
second run in the same folder is refused instead of interleaving its checkpoints and logs
with the first. Holding the lock also proves that no live process is writing in the folder, so
the temporaries a killed save left there (`checkpoints/.step-<N>.partial/` folders and
`.<name>.tmp<pid>` files) are removed when a run starts: at a large model's checkpoint size,
a few preemptions would otherwise fill a disk.

`--resume` needs a folder where a run has started (`holds_a_run`): a mistyped run_dir would
otherwise train from scratch under the name of a run that does not exist. A launch marks its
folder before its costly set-up (`mark_as_a_run`, from `enter_run_folder`), so a job
requeued with `--resume` after a first launch that ended early, even before its first
checkpoint, still starts the run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import weakref
from collections.abc import Callable
from pathlib import Path

from ..config import Config
from ..runtime import Runtime, any_process

LOCK_FILE = ".lock"
TEMPORARY = re.compile(r"\..+\.(partial|tmp\d+)")  # what checkpoint/store.py and state_io.py write
# What a launch leaves in its run folder, in order: the lock file (before the engine is built),
# then checkpoints/ and metrics.jsonl. Any one of them marks the folder as a run's.
RUN_TRACES = (LOCK_FILE, "checkpoints", "metrics.jsonl")


class NotARunFolder(ValueError):
    """`--resume` named a folder where no run has started (`holds_a_run` is False)."""

    def __init__(self, run_dir: str | Path):
        super().__init__(
            f"--resume: no run has started in {run_dir} (it holds no checkpoints/, "
            "metrics.jsonl or .lock); check run_dir, or drop --resume to start a new run there"
        )


def holds_a_run(run_dir: str | Path) -> bool:
    """True if a launch has started a run in `run_dir` (one of `RUN_TRACES` is there), also one
    that ended before its first checkpoint."""
    return any((Path(run_dir) / name).exists() for name in RUN_TRACES)


def mark_as_a_run(run_dir: str) -> None:
    """Create `<run_dir>/.lock`, unlocked (`RunFolderLock` locks it once the run is built), so
    that `holds_a_run` is True before the costly part of a launch's set-up. A folder it cannot
    write is left to `RunFolderLock` to report, in the words that name the fix."""
    with contextlib.suppress(OSError):
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / LOCK_FILE).touch()


class RunFolderLock:
    """Takes `<run_dir>/.lock` on the main process (every process calls it: a collective),
    then removes the folder's stale temporaries; the lock is held until `release` or until
    this object is collected.

    Raises:
        ValueError: another process holds the lock (a run is going on in this folder), or
            the folder cannot be created or locked.
    """

    def __init__(self, run_dir: str, runtime: Runtime):
        self.path = Path(run_dir) / LOCK_FILE
        self.closer: Callable[[], object] = lambda: None
        problem = self._acquire() if runtime.is_main else None
        if any_process(problem is not None, runtime):
            raise ValueError(problem or f"the main process could not lock {self.path}")
        if runtime.is_main:
            removed = remove_stale_temporaries(Path(run_dir))
            if removed:
                runtime.notice(f"removed {len(removed)} temporaries of killed saves in {run_dir}")

    def release(self) -> None:
        """Let the next run of this folder start (idempotent)."""
        self.closer()  # closing the descriptor drops its flock

    def _acquire(self) -> str | None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            return f"cannot lock {self.path} ({error.strerror}); choose a writable run_dir"
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            return in_use_message(self.path.parent)
        self.closer = weakref.finalize(self, os.close, descriptor)  # also when collected
        os.ftruncate(descriptor, 0)
        os.write(descriptor, f"pid {os.getpid()} on {os.uname().nodename}\n".encode())
        return None


def in_use_message(run_dir: str | Path) -> str:
    """What to do about a run folder whose lock a live run holds, naming the holder."""
    holder = (Path(run_dir) / LOCK_FILE).read_text(encoding="utf-8").strip() or "another process"
    fix = "wait for that run to end, stop it, or pass run_dir=NEW"
    return f"{run_dir} is in use by {holder}; {fix}"


def in_use(run_dir: str | Path) -> bool:
    """True if a live process holds `run_dir`'s lock (a run is going on there); takes and drops
    the lock to tell, creating nothing."""
    try:
        descriptor = os.open(Path(run_dir) / LOCK_FILE, os.O_RDWR)
    except OSError:  # no lock file (no run), or one this process cannot open
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)  # also drops a lock taken here
    return False


def remove_stale_temporaries(run_dir: Path) -> list[Path]:
    """Delete every temporary that `checkpoint/store.py` and `state_io.py` write under `run_dir`
    (only safe with the folder's lock held: then no live process is writing them); return
    their paths."""
    stale = [path for path in run_dir.rglob(".*") if TEMPORARY.fullmatch(path.name)]
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return stale


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
