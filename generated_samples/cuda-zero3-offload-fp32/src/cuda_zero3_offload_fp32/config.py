"""Typed training configuration: defaults < configs/train.toml < command-line overrides."""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar


@dataclass(frozen=True)
class Config:
    """Every hyperparameter of a run; `configs/train.toml` documents each key.

    Units: `epochs` are passes over the training split; `warmup_steps`, `checkpoint_every`,
    `log_every` and `stop_after_steps` count optimizer steps (one step = `grad_accum_steps`
    micro-batches of `micro_batch_size` samples); `lr` is the peak learning rate.

    Raises:
        ValueError: a value outside its range; the message names the key.
    """

    seed: int = 1337
    run_dir: str = "runs/digits"
    device: str = "auto"
    val_fraction: float = 0.2
    num_workers: int = 0
    model_size: str = "100K"
    dropout: float = 0.1
    compile: bool = False
    epochs: int = 30
    micro_batch_size: int = 64
    grad_accum_steps: int = 1
    lr: float = 2e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 40
    weight_decay: float = 0.05
    beta1: float = 0.9
    beta2: float = 0.95
    max_grad_norm: float = 1.0
    monitor: str = "val_loss"
    early_stop_patience: int = 5
    checkpoint_every: int = 100
    keep_last: int = 3
    log_every: int = 10
    stop_after_steps: int = 0
    # Task: image classification on the 8x8 digits.
    augment: bool = True
    task_positive_keys: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        positive = ("epochs", "micro_batch_size", "grad_accum_steps", "lr", "max_grad_norm")
        positive += self.task_positive_keys
        for key in positive:
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)!r}")
        non_negative = ("num_workers", "warmup_steps", "weight_decay", "checkpoint_every")
        non_negative += ("keep_last", "stop_after_steps", "early_stop_patience")
        for key in non_negative:
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)!r}")
        for key in ("dropout", "min_lr_ratio", "beta1", "beta2"):
            if not 0 <= getattr(self, key) < 1:
                raise ValueError(f"{key} must be in [0, 1), got {getattr(self, key)!r}")
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction!r}")
        if not math.isfinite(self.lr):
            raise ValueError(f"lr must be a finite number, got {self.lr!r}")
        parse_param_count(self.model_size)
        if self.monitor not in MONITOR_MODES:
            raise ValueError(
                f"monitor must be one of {sorted(MONITOR_MODES)}, got {self.monitor!r}"
            )
        if self.log_every < 1:
            raise ValueError(f"log_every must be >= 1, got {self.log_every!r}")

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step on one process: micro_batch_size * grad_accum_steps."""
        return self.micro_batch_size * self.grad_accum_steps

    def to_dict(self) -> dict[str, Any]:
        """Plain-type dict (saved in checkpoints and the run summary)."""
        return dataclasses.asdict(self)


TYPE_NAMES = {int: "a whole number", float: "a number", bool: "true or false", str: "a string"}

# Settings a resume must share with the checkpoint: they fix the data order and model shape.
# Settings a resume must share with the checkpoint: they fix the data order, the model's shape,
# and the optimizer and LR schedule that the checkpoint restores (a changed lr or epochs would
# be recorded but not applied). To change them, start a new run_dir from the saved weights.
RESUME_INVARIANTS = ("seed", "model_size", "micro_batch_size", "grad_accum_steps", "val_fraction")
RESUME_INVARIANTS += ("epochs", "lr", "min_lr_ratio", "warmup_steps", "weight_decay")
RESUME_INVARIANTS += ("beta1", "beta2")


def parse_param_count(size: str) -> int:
    """'100K' -> 100_000, '1.5M' -> 1_500_000, '7B' -> 7_000_000_000; plain ints too.

    Raises:
        ValueError: the text is not a positive number with an optional K, M or B suffix.
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMB]?)\s*", size.upper())
    if match is None or float(match.group(1)) * 1000 < 1:
        raise ValueError(f"model_size {size!r} is not a parameter count; use e.g. 100K or 2M")
    scale = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9}[match.group(2)]
    return int(float(match.group(1)) * scale)


# The direction in which each monitored validation metric improves.
MONITOR_MODES = {"val_loss": "min", "val_accuracy": "max"}


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> Config:
    """Build a Config from a TOML file (optional) and `key=value` overrides, applied in that order.

    Values are parsed as TOML (`lr=1e-3`, `augment=false`); a value that is not valid TOML is
    taken as a string (`run_dir=runs/try2`).

    Raises:
        ValueError: an unknown key, a value of the wrong type, or an override without `=`.
    """
    values: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as file:
                values.update(_checked_keys(tomllib.load(file), source=str(path)))
        except FileNotFoundError:
            raise ValueError(f"config file {path} not found; pass --config PATH") from None
    for override in overrides:
        key, sep, raw = override.partition("=")
        if not sep:
            raise ValueError(f"override {override!r} is not key=value; e.g. lr=1e-3")
        values.update(_checked_keys({key.strip(): _parse_value(raw.strip())}, "the command line"))
    return _typed_config(values)


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        return raw


def _checked_keys(values: dict[str, Any], source: str) -> dict[str, Any]:
    known = [field.name for field in dataclasses.fields(Config)]
    for key in values:
        if key not in known:
            raise ValueError(
                f"unknown config key {key!r} in {source}; known keys: {', '.join(known)}"
            )
    return values


def _typed_config(values: dict[str, Any]) -> Config:
    fields = {field.name: field for field in dataclasses.fields(Config)}
    for key, value in values.items():
        expected = type(fields[key].default)
        if expected is float and type(value) is int:
            values[key] = float(value)
        elif type(value) is not expected:
            raise ValueError(f"config key {key!r} needs {TYPE_NAMES[expected]}, got {value!r}")
    return Config(**values)
