"""Fresh processes for the tests' training runs, started in a fraction of a second.

A new interpreter spends ~5-8 s of a short test run importing torch, torch._dynamo (the first
optimizer step imports it), the data's libraries and the project, and the sanity ladder starts
a dozen runs. Here each run forks from a server that imported all of that once: Python's
forkserver start method ("Contexts and start methods" in the multiprocessing docs), the one
this project's DataLoader workers use. The fork is a new process in which nothing has run yet,
as in a new interpreter, with its own environment, working directory and session. What it
prints goes to two files, read back when it ends. `start` returns a handle with the parts of
`subprocess.Popen` the tests use.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

SERVER = multiprocessing.get_context("forkserver")


def preload(modules: Sequence[str]) -> None:
    """Have the server import `modules` when it starts (the first `start`); multiprocessing
    skips one that does not import. Also the preload of DataLoader workers started from this
    process: one server serves both."""
    SERVER.set_forkserver_preload(list(modules))


def run_entry_point(
    entry: Callable[[], object], argv: list[str], env: dict[str, str], cwd: str, output: str
) -> None:
    """The forked process: `entry()` as `python -m` would run it with `argv`, its stdout and
    stderr in `output`/stdout and `output`/stderr, and the interpreter's exit handlers run on
    the way out (multiprocessing ends a child without them)."""
    os.setsid()  # a session of its own, as start_new_session=True: a signal to it alone
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    if "OMP_NUM_THREADS" in env:  # read by torch's import, which happened in the server
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    for fd, name in ((1, "stdout"), (2, "stderr")):
        file = os.open(Path(output, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(file, fd)
        os.close(file)
    sys.argv = [sys.modules[entry.__module__].__file__, *argv]  # as `python -m` sets it
    try:
        entry()
    except SystemExit:
        raise  # multiprocessing turns the code into the exit status, as the interpreter does
    except BaseException:
        traceback.print_exc()
        raise SystemExit(1) from None
    finally:
        atexit._run_exitfuncs()


class Launched:
    """A started run: `pid`, `poll`, `wait`, `send_signal`, `kill` and `communicate` as
    `subprocess.Popen` has them, its exit status in `returncode` (-N: ended by signal N)."""

    def __init__(self, process: multiprocessing.process.BaseProcess, output: Path, args: list):
        self.process, self.output, self.args = process, output, args
        self.pid = process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit status; raises subprocess.TimeoutExpired if it runs past `timeout` s."""
        self.process.join(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout, *self.printed())
        return self.returncode

    def printed(self) -> tuple[str, str]:
        """(stdout, stderr) so far."""
        return tuple(
            Path(self.output, name).read_text(errors="replace") for name in ("stdout", "stderr")
        )

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return self.printed()

    def send_signal(self, number: int) -> None:
        os.kill(self.pid, number)

    def kill(self) -> None:
        """SIGKILL to the run and every process of its session (its DataLoader workers)."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                os.killpg(self.pid, signal.SIGKILL)
            self.process.join()

    def close(self) -> None:
        """`kill` it if it still runs, and remove the files of what it printed."""
        self.kill()
        shutil.rmtree(self.output, ignore_errors=True)

    def __enter__(self) -> Launched:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def start(
    entry: Callable[[], object], *argv: str, cwd: Path, env: Mapping[str, str] | None = None
) -> Launched:
    """Run `entry()` (a module-level function, e.g. `<package>.train.main`) with `sys.argv[1:]`
    = `argv` in a fresh process forked from the server, in `cwd`, with `env` (default: this
    process's environment) as its whole environment."""
    output = Path(tempfile.mkdtemp(prefix="run-"))
    env = dict(os.environ if env is None else env)
    args = [entry.__module__, *argv]
    process = SERVER.Process(
        target=run_entry_point, args=(entry, list(argv), env, str(cwd), str(output))
    )
    process.start()
    return Launched(process, output, args)


def run(
    entry: Callable[[], object],
    *argv: str,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess:
    """`start`, then wait for the end: its exit status and what it printed, as
    `subprocess.run(..., capture_output=True, text=True)` returns them."""
    with start(entry, *argv, cwd=cwd, env=env) as launched:
        stdout, stderr = launched.communicate(timeout)
        return subprocess.CompletedProcess(launched.args, launched.returncode, stdout, stderr)
