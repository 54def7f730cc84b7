"""When a run saves: the checkpointer is told each step and decides itself.

It saves every `checkpoint_every` optimizer steps and at `stop_after_steps`; a step that is
validated is saved after its validation, which may make it the best; a stop signal saves the
step it arrives at (unless it is saved already) and ends the run. No save is written from
weights a non-finite update reached (`Safeguards.check_finite` comes first).
"""

from __future__ import annotations

from ..config import Config
from ..training.safeguards import Safeguards
from ..training.state import TrainState
from .store import CheckpointManager


class Checkpointer:
    """Saves `state`'s step through `manager` when a save is due (see the module docstring).

    Every method is a collective: every process calls it at the same point.
    """

    def __init__(
        self,
        config: Config,
        manager: CheckpointManager,
        state: TrainState,
        guards: Safeguards,
    ):
        self.config, self.manager, self.state, self.guards = config, manager, state, guards
        self.saved_step = state.step if manager.has_checkpoints() else None

    def step_done(self) -> None:
        """After an optimizer step: save a step that reaches `stop_after_steps`, or that
        `checkpoint_every` divides and no validation follows (that one saves it); then end the
        run if a stop signal arrived.

        Raises:
            FloatingPointError: a non-finite update reached the weights; nothing is written.
            Preempted: a process got a stop signal; the checkpoint is on disk.
        """
        stop = self.state.reached_stop_after(self.config)
        if stop or (self._periodic() and not self.state.validation_due(self.config)):
            self.save(is_best=False)
        self.stop_on_signal()

    def validation_done(self, improved: bool) -> None:
        """After a validation: save its step, as `best` too if it `improved` on the best
        (`TrainState.record_validation`)."""
        self.save(is_best=improved)

    def stop_on_signal(self) -> None:
        """If any process got a stop signal, save the current step unless it is saved, and end
        the run. Mid-validation, that checkpoint comes before the step's validation, which a
        resume runs first.

        Raises:
            Preempted: a process got a stop signal; the checkpoint is on disk.
        """
        if not self.guards.stop_agreed():
            return
        if self.saved_step != self.state.step:
            self.save(is_best=False)
        self.manager.wait()  # a background write must be on disk before the job goes
        raise self.guards.preempted(self.state.step)

    def save(self, is_best: bool) -> None:
        """Checkpoint the current step once no non-finite update can have reached it.

        Raises:
            FloatingPointError: one did (`Safeguards.check_finite`); nothing is written.
        """
        self.guards.check_finite()
        self.manager.save(self.state.step, is_best=is_best)
        self.saved_step = self.state.step

    def _periodic(self) -> bool:
        every = self.config.checkpoint_every
        return every > 0 and self.state.step % every == 0
