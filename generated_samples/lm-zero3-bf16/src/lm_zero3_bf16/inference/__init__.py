"""Using a trained model: a finished run read back (`trained.py`),
any language model the commands take (a run, a checkpoint or a Hugging Face folder, with its
tokenizer and chat template: `sources.py`) and the one decoding path of generate and chat, with
a key-value cache (`decode.py`)."""

from .trained import load_trained, run_config, run_weights

__all__ = ["load_trained", "run_config", "run_weights"]
