"""The task's settings: the example's data, model and schedule. Yours, with data.py, model.py
and task.py: `config.Config` takes every field here, and configs/train.toml sets their values.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from .images import AUGMENT_POLICIES, MANIFEST
from .images.store import manifest_at


@dataclass(frozen=True)
class TaskConfig:
    """The task's fields of the run's `Config` (units as there: `epochs` are passes over the
    training split, `warmup_steps` optimizer steps, `micro_batch_size` samples per process)."""

    run_dir: str = "runs/digits"
    data_dir: str = ""
    image_size: int = 224
    val_fraction: float = 0.2
    augment: bool = True
    augment_policy: str = "none"
    dropout: float = 0.1
    epochs: int = 30
    micro_batch_size: int = 64
    min_lr_ratio: float = 0.05
    warmup_steps: int = 40
    weight_decay: float = 0.05
    early_stop_patience: int = 5
    # data settings a resume must keep (checkpoint/resume.py): they fix what a checkpoint trained on
    task_resume_keys: ClassVar[tuple[str, ...]] = (
        "data_dir",
        "image_size",
        "val_fraction",
        "augment_policy",
        "data_fingerprint",
    )

    @property
    def data_fingerprint(self) -> str:
        """The content fingerprint of the images prepared in `data_dir` (their files'
        checksums and the classes, `ImageManifest.fingerprint`); '' for the bundled digits or
        before prepare."""
        manifest = manifest_at(Path(self.data_dir) / MANIFEST) if self.data_dir else None
        return manifest.fingerprint() if manifest else ""

    def task_problems(self) -> list[str]:
        """Every task setting outside its range, one message per key (empty when all are
        valid); `Config.problems` adds them to its own."""
        problems = []
        if not 0 <= self.dropout < 1:
            problems.append(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not 0 < self.val_fraction < 1:
            problems.append(f"val_fraction must be in (0, 1), got {self.val_fraction!r}")
        if self.image_size < 8:
            problems.append(f"image_size must be at least 8 pixels, got {self.image_size!r}")
        if self.augment_policy not in AUGMENT_POLICIES:
            choices = ", ".join(AUGMENT_POLICIES)
            problems.append(f"augment_policy must be one of {choices}, got {self.augment_policy!r}")
        return problems
