"""The task's settings: the example's data, model and schedule. Yours, with data.py, model.py
and task.py: `config.Config` takes every field here, and configs/train.toml sets their values.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from .images import AUGMENT_POLICIES, MANIFEST
from .images.store import manifest_at

RUN_MANIFEST = "images.json"  # a run folder's copy of the manifest of the images it trains on
# The example's small CNN (model.py), or a pretrained backbone from timm (backbone.py).
MODEL_FAMILIES = ("cnn", "timm")


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
    model_family: str = "cnn"
    backbone: str = ""
    init_from: str = ""
    backbone_lr_ratio: float = 0.1
    freeze_backbone_epochs: int = 0
    dropout: float = 0.1
    epochs: int = 30
    micro_batch_size: int = 64
    min_lr_ratio: float = 0.05
    warmup_steps: int = 40
    weight_decay: float = 0.05
    early_stop_patience: int = 5
    # data settings a resume must keep (checkpoint/resume.py): they fix what a checkpoint trained on
    task_resume_keys: ClassVar[tuple[str, ...]] = (
        "model_family",
        "backbone",
        "init_from",
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

    def task_data_change(self, saved: dict[str, Any], run_dir: str) -> tuple[str, None] | None:
        """How the images in `data_dir` differ from those a checkpoint trained on (`saved`: its
        config), or None where they are the same; a run may go on with changed images
        (`allow_data_change`). A checkpoint of an earlier version recorded no fingerprint: it
        trained on the digits ('')."""
        before = saved.get("data_fingerprint", "")
        if before == self.data_fingerprint:
            return None
        now = f"the images in {self.data_dir}" if self.data_dir else "the digits"
        return f"{now} are not those the checkpoint trained on", None

    def task_lr_scale(self, name: str) -> tuple[float, int]:
        """(factor of the peak LR, epochs held at 0) of parameter `name` (training/optim.py's
        hook): a timm backbone's pretrained weights `backbone_lr_ratio` and
        `freeze_backbone_epochs`, so the new head learns first and fastest; (1, 0) for the rest
        and for the example's CNN."""
        if self.model_family == "timm" and "backbone" in name.split("."):
            return self.backbone_lr_ratio, self.freeze_backbone_epochs
        return 1.0, 0

    def task_run_files(self) -> dict[str, Path]:
        """Files a run keeps in its folder, copied there when a launch starts, so its weights
        stay usable whatever becomes of `data_dir`: the prepared images' manifest
        (RUN_MANIFEST: the class names, in class-id order, and the stored size predict
        resizes to). None for the digits."""
        return {RUN_MANIFEST: Path(self.data_dir) / MANIFEST} if self.data_dir else {}

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
        if self.model_family not in MODEL_FAMILIES:
            choices = ", ".join(MODEL_FAMILIES)
            problems.append(f"model_family must be one of {choices}, got {self.model_family!r}")
        if self.model_family == "timm" and not self.data_dir:
            problems.append(
                'model_family = "timm" fine-tunes on your RGB images, not the 8x8 digits: prepare '
                "them (python -m cpu_ddp_fp32.prepare) and set data_dir to the folder"
            )
        if not 0 < self.backbone_lr_ratio <= 1:
            problems.append(f"backbone_lr_ratio must be in (0, 1], got {self.backbone_lr_ratio!r}")
        if self.freeze_backbone_epochs < 0:
            problems.append(
                f"freeze_backbone_epochs must be >= 0, got {self.freeze_backbone_epochs!r}"
            )
        if self.augment_policy not in AUGMENT_POLICIES:
            choices = ", ".join(AUGMENT_POLICIES)
            problems.append(f"augment_policy must be one of {choices}, got {self.augment_policy!r}")
        return problems
