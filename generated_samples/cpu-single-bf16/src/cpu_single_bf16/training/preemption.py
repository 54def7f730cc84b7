"""Preemption: a stop signal ends the run at the next optimizer step with a checkpoint.

SIGTERM (what `kill`, Kubernetes and most launchers send first) and SIGUSR1 (what SLURM's
`--signal=USR1@120` sends ahead of a time limit or a preemption) only set a flag here:
the step under way, its gradient accumulation included, runs to its end, so the checkpoint
holds a whole optimizer step. The loop asks `StopRequest.agreed` after every optimizer step and
between validation batches; every process takes part, so all stop at the same step even when
only one got the signal. The process then exits with `PREEMPTED_EXIT_CODE`, and
`--resume` continues the run from that checkpoint, bitwise as if it had not stopped.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

from ..runtime import STOP_SIGNALS, Runtime, any_process

# EX_TEMPFAIL of sysexits.h: "temporary failure; the user is invited to retry". A launcher
# tells a preempted run (requeue it with --resume) from a failed one by it.
PREEMPTED_EXIT_CODE = 75


class Preempted(SystemExit):
    """The run stopped on a stop signal after writing the checkpoint of optimizer step `step`.
    A `SystemExit` with code `PREEMPTED_EXIT_CODE`: uncaught, the process exits with it.
    `message` says what happened and how to continue."""

    def __init__(self, signal_name: str, step: int):
        super().__init__(PREEMPTED_EXIT_CODE)
        self.message = (
            f"stopped by {signal_name} at step {step} with a checkpoint; "
            "continue with --resume (same settings)"
        )

    def __str__(self) -> str:
        return self.message


class StopRequest:
    """Remembers the first stop signal this process received (`signal_name`, None until one
    arrives). `install` replaces the handlers of `STOP_SIGNALS`; `uninstall` puts the previous
    ones back."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.previous: dict[int, Any] = {}

    def install(self) -> None:
        """Catch `STOP_SIGNALS` (main thread only, as Python's `signal.signal` requires)."""
        for number in STOP_SIGNALS:
            self.previous[number] = signal.signal(number, self._received)

    def uninstall(self) -> None:
        """Restore the handlers `install` replaced."""
        for number, handler in self.previous.items():
            signal.signal(number, handler)
        self.previous.clear()

    def _received(self, number: int, frame: FrameType | None) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(number).name

    def agreed(self, runtime: Runtime) -> bool:
        """True when any process has received a stop signal (a collective: every process calls
        it at the same point of the loop)."""
        return any_process(self.signal_name is not None, runtime)
