"""The preflight check, `python -m <package>.preflight` (`command.py`): what each rank observes
(`facts.py`), the verdicts on it (`checks.py`) and a rehearsed optimizer step (`step.py`)."""

from .command import main

__all__ = [
    "main",
]
