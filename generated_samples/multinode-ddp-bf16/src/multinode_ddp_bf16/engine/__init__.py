"""The engine: how the model is built, placed, wrapped and stepped under this project's strategy.

`strategy.py` is the one engine this variant renders (its strategy and framework): the wrapped
and the bare module, the optimizer, and the verbs the loop calls. `build.py` builds the model on
the meta device and materialises each process's weights; the rest are what the engines share."""

from .build import build_on_meta, checkpoint_units, init_weights, is_on_meta, materialize
from .host_memory import keep_freed_memory
from .strategy import COMPUTE_DTYPE, PRECISION, Engine

__all__ = [
    "COMPUTE_DTYPE",
    "Engine",
    "PRECISION",
    "build_on_meta",
    "checkpoint_units",
    "init_weights",
    "is_on_meta",
    "keep_freed_memory",
    "materialize",
]
