"""Checkpoints: the store (`store.py`: step folders written atomically, the latest complete one
found, keep-N), when a run saves (`schedule.py`), a resume's refusals and restore (`resume.py`)
and a resume on another number of processes (`world_size.py`)."""

from .resume import config_to_resume, start_or_resume
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
from .world_size import fit_to_checkpoint, split_global_batch

__all__ = [
    "COMPLETE_MARKER",
    "CheckpointManager",
    "Checkpointer",
    "LAST_WEIGHTS_FILE",
    "TRAINER_FILE",
    "WEIGHTS_FILE",
    "config_to_resume",
    "find_latest",
    "fit_to_checkpoint",
    "split_global_batch",
    "start_or_resume",
    "step_folder_name",
    "step_folders",
]
