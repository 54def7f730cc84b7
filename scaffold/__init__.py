"""scaffold: render runnable, correct-by-construction PyTorch training projects."""

__version__ = "0.7.0"
