"""The task's settings: the example's data, model and schedule. Yours, with data.py, model.py
and task.py: `config.Config` takes every field here, and configs/train.toml sets their values.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar


@dataclass(frozen=True)
class TaskConfig:
    """The task's fields of the run's `Config` (units as there: `epochs` are passes over the
    training split, `warmup_steps` optimizer steps, `micro_batch_size` samples per process)."""

    run_dir: str = "runs/stdlib-lm"
    data_dir: str = "data/stdlib"
    prepare_example: bool = True
    tokenizer: str = "bytes"
    val_fraction: float = 0.1
    corpus_bytes: int = 300_000
    block_size: int = 64
    dropout: float = 0.0
    epochs: int = 4
    micro_batch_size: int = 32
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    early_stop_patience: int = 3
    # data settings a resume must keep (resume.py): they fix what the checkpoint trained on
    task_resume_keys: ClassVar[tuple[str, ...]] = ("data_dir", "block_size", "data_fingerprint")

    @property
    def data_fingerprint(self) -> str:
        """SHA-256 of the prepared corpus's manifest.json in `data_dir` ('' before prepare):
        a resume refuses a corpus prepared again there from other sources or settings."""
        path = Path(self.data_dir) / "manifest.json"
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""

    def task_problems(self) -> list[str]:
        """Every task setting outside its range, one message per key (empty when all are
        valid); `Config.problems` adds them to its own."""
        problems = []
        for key in ("block_size", "corpus_bytes"):
            if getattr(self, key) <= 0:
                problems.append(f"{key} must be > 0, got {getattr(self, key)!r}")
        if not 0 <= self.dropout < 1:
            problems.append(f"dropout must be in [0, 1), got {self.dropout!r}")
        if self.tokenizer not in ("bytes", "bpe") and not self.tokenizer.endswith(".json"):
            problems.append(
                f"tokenizer must be bytes, bpe or a tokenizer.json path, got {self.tokenizer!r}"
            )
        if not 0 < self.val_fraction < 1:
            problems.append(f"val_fraction must be in (0, 1), got {self.val_fraction!r}")
        return problems
