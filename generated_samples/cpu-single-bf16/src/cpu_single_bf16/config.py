"""Typed training configuration: defaults < configs/train.toml < command-line overrides."""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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
    augment: bool = True
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

    def __post_init__(self) -> None:
        positive = ("epochs", "micro_batch_size", "grad_accum_steps", "lr", "max_grad_norm")
        for key in positive:
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)!r}")
        non_negative = ("num_workers", "warmup_steps", "weight_decay", "checkpoint_every")
        non_negative += ("keep_last", "stop_after_steps", "early_stop_patience")
        for key in non_negative:
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)!r}")
        for key in ("val_fraction", "dropout", "min_lr_ratio", "beta1", "beta2"):
            if not 0 <= getattr(self, key) < 1:
                raise ValueError(f"{key} must be in [0, 1), got {getattr(self, key)!r}")
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
        with open(path, "rb") as file:
            values.update(tomllib.load(file))
    for override in overrides:
        key, sep, raw = override.partition("=")
        if not sep:
            raise ValueError(f"override {override!r} is not key=value; e.g. lr=1e-3")
        values[key.strip()] = _parse_value(raw.strip())
    return _typed_config(values, source=str(path) if path else "overrides")


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        return raw


def _typed_config(values: dict[str, Any], source: str) -> Config:
    fields = {field.name: field for field in dataclasses.fields(Config)}
    for key, value in values.items():
        if key not in fields:
            raise ValueError(
                f"unknown config key {key!r} in {source}; known keys: {', '.join(fields)}"
            )
        expected = type(fields[key].default)
        if expected is float and type(value) is int:
            values[key] = float(value)
        elif type(value) is not expected:
            raise ValueError(
                f"config key {key!r} needs a {expected.__name__}, "
                f"got {value!r} ({type(value).__name__})"
            )
    return Config(**values)
