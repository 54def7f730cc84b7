"""What the loop keeps and decides between steps: the training state (`state.py`) and the
data's position in its epoch (`data_position.py`), the seeds and random states
(`seeding.py`), the optimizer and its schedule, validation, and the safeguards that may end a
run (stop signals, non-finite steps, the run folder's lock)."""

from .data_position import starting_state
from .optim import WarmupCosine, build_optimizer, build_scheduler
from .preemption import PREEMPTED_EXIT_CODE, Preempted
from .run_folder import NotARunFolder, enter_run_folder, holds_a_run, mark_as_a_run
from .safeguards import Safeguards
from .seeding import derived_seed, seed_all
from .state import TrainState
from .validation import TaskEvaluation, evaluate, task_evaluation

__all__ = [
    "NotARunFolder",
    "PREEMPTED_EXIT_CODE",
    "Preempted",
    "Safeguards",
    "TaskEvaluation",
    "TrainState",
    "WarmupCosine",
    "build_optimizer",
    "build_scheduler",
    "derived_seed",
    "enter_run_folder",
    "evaluate",
    "holds_a_run",
    "mark_as_a_run",
    "seed_all",
    "starting_state",
    "task_evaluation",
]
