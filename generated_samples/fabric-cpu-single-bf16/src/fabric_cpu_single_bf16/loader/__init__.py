"""DataLoaders: seeded, resumable mid-epoch, the same order on any number of workers."""

from .dataloaders import epoch_iterator, make_eval_loader, make_train_loader

__all__ = [
    "epoch_iterator",
    "make_eval_loader",
    "make_train_loader",
]
