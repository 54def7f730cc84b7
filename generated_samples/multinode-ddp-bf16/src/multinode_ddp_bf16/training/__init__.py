"""What the loop keeps and decides between steps: the training state and the data's position,
the optimizer and its schedule, validation, and the safeguards that may end a run (stop signals,
non-finite steps, the run folder's lock)."""

from .optim import WarmupCosine, build_optimizer, build_scheduler
from .preemption import PREEMPTED_EXIT_CODE, Preempted
from .run_folder import NotARunFolder, holds_a_run, mark_as_a_run
from .safeguards import Safeguards
from .state import TrainState
from .validation import evaluate

__all__ = [
    "NotARunFolder",
    "PREEMPTED_EXIT_CODE",
    "Preempted",
    "Safeguards",
    "TrainState",
    "WarmupCosine",
    "build_optimizer",
    "build_scheduler",
    "evaluate",
    "holds_a_run",
    "mark_as_a_run",
]
