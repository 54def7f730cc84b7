"""DataLoaders (`dataloaders.py`): seeded, resumable mid-epoch, the same order on any number of
workers; and the samplers (`samplers.py`): which samples each process reads, the same order on
any number of processes."""

from .dataloaders import epoch_iterator, make_eval_loader, make_train_loader, model_inputs
from .samplers import set_sampler_epoch

__all__ = [
    "epoch_iterator",
    "make_eval_loader",
    "make_train_loader",
    "model_inputs",
    "set_sampler_epoch",
]
