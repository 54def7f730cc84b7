"""What may end a run between its steps.

Stop signals end the run at the next optimizer step with a checkpoint (preemption.py; the
checkpointer saves, checkpoint/schedule.py); non-finite steps are counted, stop the run when they
must, and are never checkpointed (nonfinite.py); one run at a time holds the run folder
(run_folder.py). The loop reports each step here.
"""

from __future__ import annotations

from types import TracebackType

from torch import Tensor

from ..config import Config
from ..engine.strategy import Engine
from ..runtime import barrier
from .nonfinite import NonFiniteSteps
from .preemption import Preempted, StopRequest
from .run_folder import RunFolderLock
from .state import is_log_step


class Safeguards:
    """Stop signals, non-finite steps and the run folder's lock of one run. Use it as a context
    around the loop: the stop signals' handlers are installed inside it, and leaving it lets
    the next run of the folder start. A stopped run's processes leave it together.

    Raises:
        ValueError: another run holds the run folder (`RunFolderLock`).
    """

    def __init__(self, config: Config, engine: Engine):
        self.engine, self.runtime = engine, engine.runtime
        self.log_every = config.log_every
        self.stop_request = StopRequest()
        self.nonfinite = NonFiniteSteps(config.max_nonfinite_steps, self.runtime.device)
        self.run_folder = RunFolderLock(config.run_dir, self.runtime)

    def __enter__(self) -> Safeguards:
        self.stop_request.install()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if isinstance(error, Preempted):  # every process stopped at the same step
            # A launcher ends the other processes as soon as one exits with a non-zero code: none
            # leaves before the rest have closed what they write (the main process's trackers).
            barrier(self.runtime)
        self.stop_request.uninstall()
        self.run_folder.release()

    def step_done(self, step: int, loss: Tensor, grad_norm: Tensor, skipped: bool) -> None:
        """Count optimizer step `step`: its 0-dim loss and gradient norm, left on the device;
        `skipped`: the engine dropped its update. At the steps the log syncs anyway
        (`is_log_step`), stop if an applied update was non-finite: the check's sync is free.

        Raises:
            FloatingPointError: too many skipped updates in a row (`NonFiniteSteps.record`), or
                a non-finite update was applied (`NonFiniteSteps.check`).
        """
        self.nonfinite.record(step, loss, grad_norm, skipped)
        if is_log_step(step, self.log_every):
            self.nonfinite.check()

    def values(self) -> dict[str, float]:
        """The skipped-update count and, with loss scaling, the scale, for the log line."""
        scale = self.engine.loss_scale()
        values = {"skipped_steps": self.nonfinite.skipped}
        return values if scale is None else values | {"loss_scale": scale}

    def check_finite(self) -> None:
        """Before a checkpoint: stop if a non-finite update reached the weights (a host sync).

        Raises:
            FloatingPointError: one did (`NonFiniteSteps.check`); nothing may be written.
        """
        self.nonfinite.check()

    def stop_agreed(self) -> bool:
        """True when any process has received a stop signal (a collective: every process calls
        it at the same point)."""
        return self.stop_request.agreed(self.runtime)

    def preempted(self, step: int) -> Preempted:
        """The error that ends a stopped run at optimizer `step`, its message printed once."""
        signal_name = self.stop_request.signal_name or "another process's stop signal"
        stopped = Preempted(signal_name, step)
        self.runtime.notice(stopped.message)
        return stopped
