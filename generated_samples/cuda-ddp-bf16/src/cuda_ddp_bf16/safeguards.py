"""What may end a run between its steps, and the checkpoint that ends it.

Stop signals end the run at the next optimizer step with a checkpoint (preemption.py);
non-finite steps are counted, stop the run when they must, and are never checkpointed
(nonfinite.py); one run at a time holds the run folder (run_folder.py). The loop reports each
step here and saves through `save`.
"""

from __future__ import annotations

from types import TracebackType

from torch import Tensor

from .checkpoint import CheckpointManager
from .config import Config
from .engine import Engine
from .nonfinite import NonFiniteSteps
from .preemption import Preempted, StopRequest
from .progress import TrainState
from .run_folder import RunFolderLock
from .runtime import barrier


class Safeguards:
    """Stop signals, non-finite steps and the run folder's lock of one run. Use it as a context
    around the loop: the stop signals' handlers are installed inside it, and leaving it lets
    the next run of the folder start. A stopped run's processes leave it together.

    Raises:
        ValueError: another run holds the run folder (`RunFolderLock`).
    """

    def __init__(
        self, config: Config, engine: Engine, checkpoints: CheckpointManager, state: TrainState
    ):
        self.engine, self.checkpoints, self.state = engine, checkpoints, state
        self.runtime = engine.runtime
        self.stop_request = StopRequest()
        self.nonfinite = NonFiniteSteps(config.max_nonfinite_steps, self.runtime.device)
        self.saved_step = state.step if checkpoints.has_checkpoints() else None
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

    def step_done(self, loss: Tensor, grad_norm: Tensor, skipped: bool) -> None:
        """Count the step the loop just took: its 0-dim loss and gradient norm, left on the
        device; `skipped`: the engine dropped its update.

        Raises:
            FloatingPointError: too many skipped updates in a row (`NonFiniteSteps.record`).
        """
        self.nonfinite.record(self.state.step, loss, grad_norm, skipped)

    def logged(self, synced: bool) -> None:
        """After the step's log call: where it synced with the device (`synced`, a log line
        was written), stop if an applied update was non-finite; the check's sync is free there.

        Raises:
            FloatingPointError: see `NonFiniteSteps.check`.
        """
        if synced:
            self.nonfinite.check()

    def values(self) -> dict[str, float]:
        """The skipped-update count and, with loss scaling, the scale, for the log line."""
        scale = self.engine.loss_scale()
        values = {"skipped_steps": self.nonfinite.skipped}
        return values if scale is None else values | {"loss_scale": scale}

    def save(self, is_best: bool) -> None:
        """Checkpoint the current step once no non-finite update can have reached it.

        Raises:
            FloatingPointError: one did (`NonFiniteSteps.check`); nothing is written.
        """
        self.nonfinite.check()
        self.checkpoints.save(self.state.step, is_best=is_best)
        self.saved_step = self.state.step

    def stop_if_signalled(self) -> None:
        """If any process has received a stop signal (a collective: every process calls it at
        the same point), checkpoint the current step unless it is saved already, and end
        the run. Mid-validation, that checkpoint comes before the epoch's validation, which a
        resume runs again.

        Raises:
            Preempted: a process got a stop signal; the checkpoint is on disk.
        """
        if not self.stop_request.agreed(self.runtime):
            return
        if self.saved_step != self.state.step:
            self.save(is_best=False)
        signal_name = self.stop_request.signal_name or "another process's stop signal"
        stopped = Preempted(signal_name, self.state.step)
        self.runtime.notice(stopped.message)
        raise stopped
