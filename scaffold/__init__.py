"""scaffold: render runnable, correct-by-construction PyTorch training projects."""

__version__ = "0.5.1"
