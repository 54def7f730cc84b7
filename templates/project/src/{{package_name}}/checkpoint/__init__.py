"""Checkpoints: the store (`store.py`: step folders written atomically, the latest complete one
found, keep-N), when a run saves (`schedule.py`), and how a run starts or resumes from one
(`resume.py`: the RNG, the data position, the settings a checkpoint fixes)."""

from .resume import (
    derived_seed,
    enter_run_folder,
    fit_to_checkpoint,
    seed_all,
    split_global_batch,
    start_or_resume,
    starting_state,
)
from .schedule import Checkpointer
from .store import (
    COMPLETE_MARKER,
    LAST_WEIGHTS_FILE,
    TRAINER_FILE,
    WEIGHTS_FILE,
    CheckpointManager,
    find_latest,
    step_folder_name,
    step_folders,
)

__all__ = [
    "COMPLETE_MARKER",
    "CheckpointManager",
    "Checkpointer",
    "LAST_WEIGHTS_FILE",
    "TRAINER_FILE",
    "WEIGHTS_FILE",
    "derived_seed",
    "enter_run_folder",
    "find_latest",
    "fit_to_checkpoint",
    "seed_all",
    "split_global_batch",
    "start_or_resume",
    "starting_state",
    "step_folder_name",
    "step_folders",
]
