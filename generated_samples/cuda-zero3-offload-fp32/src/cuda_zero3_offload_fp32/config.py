"""Typed training configuration: defaults < configs/train.toml < command-line overrides."""

from __future__ import annotations

import argparse
import dataclasses
import decimal
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
    `tensorboard`, `logger`, `plot` and `profile_steps` choose what a run writes besides
    metrics.jsonl and its checkpoints (see report.py). `activation_checkpointing` recomputes
    each of the model's shard units in backward instead of keeping its activations (build.py).

    Raises:
        ValueError: a value outside its range; the message names the key.
    """

    seed: int = 1337
    device: str = "auto"
    num_workers: int = 0
    model_size: str = "100K"
    compile: bool = False
    activation_checkpointing: bool = False
    grad_accum_steps: int = 1
    lr: float = 2e-3
    beta1: float = 0.9
    beta2: float = 0.95
    max_grad_norm: float = 1.0
    monitor: str = "val_loss"
    checkpoint_every: int = 100
    keep_last: int = 3
    log_every: int = 10
    stop_after_steps: int = 0
    tensorboard: bool = True
    logger: str = "none"
    wandb_project: str = "cuda-zero3-offload-fp32"
    plot: bool = True
    profile_steps: str = ""
    # --- task: the example's data and schedule; yours to change with data.py and model.py ---
    run_dir: str = "runs/digits"
    val_fraction: float = 0.2
    augment: bool = True
    dropout: float = 0.1
    epochs: int = 30
    micro_batch_size: int = 64
    min_lr_ratio: float = 0.05
    warmup_steps: int = 40
    weight_decay: float = 0.05
    early_stop_patience: int = 5
    task_positive_keys: ClassVar[tuple[str, ...]] = ()
    # --- end of the task's section ---

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
        if self.logger not in LOGGERS:
            raise ValueError(f"logger must be one of {', '.join(LOGGERS)}, got {self.logger!r}")
        self.profile_window()

    def profile_window(self) -> tuple[int, int] | None:
        """`profile_steps` "START:STOP" as (START, STOP): optimizer steps START to STOP - 1 are
        profiled, like a Python slice; None when it is empty.

        Raises:
            ValueError: not two whole numbers with 1 <= START < STOP.
        """
        if not self.profile_steps:
            return None
        match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", self.profile_steps)
        if match is None or not 1 <= int(match.group(1)) < int(match.group(2)):
            raise ValueError(
                f"profile_steps must be START:STOP optimizer steps with 1 <= START < STOP "
                f"(e.g. 10:15), or empty; got {self.profile_steps!r}"
            )
        return int(match.group(1)), int(match.group(2))

    def to_dict(self) -> dict[str, Any]:
        """Plain-type dict (saved in checkpoints and the run summary)."""
        return dataclasses.asdict(self)


# Experiment trackers besides TensorBoard (`tensorboard`), which has a switch of its own.
LOGGERS = ("none", "wandb")

TYPE_NAMES = {int: "a whole number", float: "a number", bool: "true or false", str: "a string"}

PARAM_COUNT = re.compile(r"(\d+(?:\.\d+)?(?:E\d{1,2})?)([KMB]?)")
PARAM_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9}


def parse_param_count(size: str) -> int:
    """'100K' -> 100_000, '1.5M' -> 1_500_000, '7B' -> 7_000_000_000, '1e6' -> 1_000_000.

    scaffold's own `parse_model_size` follows the same rule with the same message (a test of
    scaffold's checks the two agree).

    Raises:
        ValueError: not a whole number of parameters of at least 1, written as a number with
            an optional exponent and an optional K, M or B suffix.
    """
    match = PARAM_COUNT.fullmatch(size.strip().upper())
    count = decimal.Decimal(match.group(1)) * PARAM_SUFFIXES[match.group(2)] if match else 0
    if count < 1 or count != count.to_integral_value():
        raise ValueError(
            f"model_size {size!r} is not a whole number of parameters of at least 1; "
            "use e.g. 100K, 2.5M, 7B or 1e6"
        )
    return int(count)


# The direction in which each monitored validation metric improves.
MONITOR_MODES = {"val_loss": "min", "val_accuracy": "max"}


def parse_command_line(argv: list[str] | None, description: str) -> tuple[Config, bool]:
    """`[--config PATH] [--resume] [key=value ...]` -> (the Config, whether to resume).

    Raises:
        ValueError: see `load_config`.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", default="configs/train.toml", help="TOML file of settings")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. lr=1e-3 epochs=5")
    args = parser.parse_args(argv)
    return load_config(args.config, args.overrides), args.resume


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> Config:
    """Build a Config from a TOML file (optional) and `key=value` overrides, applied in that order.

    Values are parsed as TOML (`lr=1e-3`, `compile=false`); a text setting takes the text as
    written, quoted or not (`run_dir=runs/try2`, `model_size=1e6`).

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
        key = key.strip()
        values.update(_checked_keys({key: _parse_value(key, raw.strip())}, "the command line"))
    return _typed_config(values)


def _parse_value(key: str, raw: str) -> Any:
    try:
        value = tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        return raw
    field = next((f for f in dataclasses.fields(Config) if f.name == key), None)
    text_setting = field is not None and isinstance(field.default, str)
    return raw if text_setting and not isinstance(value, str) else value


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
