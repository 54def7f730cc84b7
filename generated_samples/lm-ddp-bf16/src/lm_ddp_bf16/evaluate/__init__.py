"""Measuring a trained language model: bits per byte on any text, comparable across tokenizers
(`bits_per_byte.py`, which training also reports every `eval_every` steps), lm-evaluation-
harness tasks on its Hugging Face export (`harness.py`), and the command that runs both
(`python -m <package>.evaluate`, `__main__.py`)."""

from .bits_per_byte import HeldOutText, Score, score

__all__ = ["HeldOutText", "Score", "score"]
