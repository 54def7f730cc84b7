"""Using a trained model: a finished run read back (`trained.py`)."""

from .trained import load_trained, run_config, run_weights

__all__ = ["load_trained", "run_config", "run_weights"]
