"""What a run reports: the metrics log with its trackers and progress bar (`run_log.py`,
`trackers.py`), the profiler window (`profiling.py`) and the end-of-run summary (`summary.py`)."""

from .profiling import ProfileWindow
from .run_log import ParameterCounts, RunLog, keep_records_up_to, parameter_counts
from .summary import finish_run
from .trackers import TensorBoardTracker, open_trackers

__all__ = [
    "ParameterCounts",
    "ProfileWindow",
    "RunLog",
    "TensorBoardTracker",
    "finish_run",
    "keep_records_up_to",
    "open_trackers",
    "parameter_counts",
]
