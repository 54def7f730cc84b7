"""Typed training configuration: defaults < configs/train.toml < command-line overrides."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import decimal
import difflib
import math
import re
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .task_config import TaskConfig


@dataclass(frozen=True)
class Config(TaskConfig):
    """Every hyperparameter of a run: the task's (`TaskConfig`, task_config.py) and the
    machinery's below; `configs/train.toml` documents each key.

    Units: `epochs` are passes over the training split; `max_steps`, `warmup_steps`,
    `val_every`, `checkpoint_every`, `log_every` and `stop_after_steps` count optimizer steps
    (one step = `grad_accum_steps` micro-batches of `micro_batch_size` samples per process);
    `val_batches` counts micro-batches per process; `lr` is the peak learning rate.
    The run's length is the first reached of `epochs`, `max_steps` (> 0) and the task's own
    budget (`step_budget`); the LR schedule spans it (`run_steps`). A TaskConfig may define
    three hooks, which a task without them does without: `task_max_steps(samples_per_step)`
    (its budget in optimizer steps, 0 for none), `task_data_change(saved_config, run_dir)`
    (how its data differs from a checkpoint's, in words, and why a run may not go on with it;
    None when it does not: checkpoint/resume.py) and `task_run_files()` (files a run keeps in its
    folder, by name: report/run_log.py).
    `tensorboard`, `logger`, `plot` and `profile_steps` choose what a run writes besides
    metrics.jsonl and its checkpoints (see report/run_log.py and report/summary.py).
    `activation_checkpointing` recomputes each of the model's shard units in backward instead
    of keeping its activations (engine/build.py).

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
    max_steps: int = 0
    val_every: int = 0
    val_batches: int = 0
    monitor: str = "val_loss"
    checkpoint_every: int = 100
    keep_last: int = 3
    log_every: int = 10
    stop_after_steps: int = 0
    allow_world_size_change: bool = False
    allow_data_change: bool = False
    async_checkpoint: bool = False
    max_nonfinite_steps: int = 20
    tensorboard: bool = True
    logger: str = "none"
    wandb_project: str = "cpu-ddp-fp32"
    plot: bool = True
    profile_steps: str = ""

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))

    def problems(self) -> list[str]:
        """Every value outside its range, one message per key (empty when all are valid)."""
        problems = self.task_problems()
        positive = ("epochs", "micro_batch_size", "grad_accum_steps", "lr", "max_grad_norm")
        positive += ("max_nonfinite_steps",)
        for key in positive:
            if getattr(self, key) <= 0:
                problems.append(f"{key} must be > 0, got {getattr(self, key)!r}")
        non_negative = ("num_workers", "warmup_steps", "weight_decay", "checkpoint_every")
        non_negative += ("keep_last", "stop_after_steps", "early_stop_patience", "max_steps")
        non_negative += ("val_every", "val_batches")
        for key in non_negative:
            if getattr(self, key) < 0:
                problems.append(f"{key} must be >= 0, got {getattr(self, key)!r}")
        for key in ("min_lr_ratio", "beta1", "beta2"):
            if not 0 <= getattr(self, key) < 1:
                problems.append(f"{key} must be in [0, 1), got {getattr(self, key)!r}")
        if not math.isfinite(self.lr):
            problems.append(f"lr must be a finite number, got {self.lr!r}")
        if self.log_every < 1:
            problems.append(f"log_every must be >= 1, got {self.log_every!r}")
        if self.logger not in LOGGERS:
            problems.append(f"logger must be one of {', '.join(LOGGERS)}, got {self.logger!r}")
        for check in (lambda: parse_param_count(self.model_size), self.profile_window):
            try:
                check()
            except ValueError as error:
                problems.append(str(error))
        return problems

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

    def step_budget(self, world_size: int) -> int:
        """Optimizer steps the run may take besides its `epochs` (0: no other limit): the
        least of `max_steps` and the task's own budget at this world size's global batch,
        where its TaskConfig has `task_max_steps` (a hook tasks may define)."""
        task_max_steps = getattr(self, "task_max_steps", lambda samples_per_step: 0)
        task_steps = task_max_steps(self.global_batch_size(world_size))
        return min((n for n in (self.max_steps, task_steps) if n > 0), default=0)

    def run_steps(self, steps_per_epoch: int, world_size: int) -> int:
        """Optimizer steps of the whole run: `epochs` x `steps_per_epoch`, or the
        `step_budget` where it ends the run sooner. The LR schedule spans this."""
        budget, epochs = self.step_budget(world_size), self.epochs * steps_per_epoch
        return min(epochs, budget) if budget else epochs

    def global_batch_size(self, world_size: int, micro_batches: int | None = None) -> int:
        """Samples in one optimizer step over `world_size` processes: micro_batch_size x
        world_size x micro_batches (default `grad_accum_steps`; an epoch's last step may have
        fewer micro-batches)."""
        micro_batches = self.grad_accum_steps if micro_batches is None else micro_batches
        return self.micro_batch_size * world_size * micro_batches

    def to_dict(self) -> dict[str, Any]:
        """Plain-type dict (saved in checkpoints and the run summary), with the task's resume
        keys that are derived values rather than fields (a fingerprint of the data...)."""
        values = dataclasses.asdict(self)
        return values | {key: getattr(self, key) for key in self.task_resume_keys}


# Experiment trackers besides TensorBoard (`tensorboard`), which has a switch of its own.
LOGGERS = ("none", "wandb")

TYPE_NAMES = {int: "a whole number", float: "a number", bool: "true or false", str: "a string"}

PARAM_COUNT = re.compile(r"(\d+(?:\.\d+)?(?:E\d{1,2})?)([KMBT]?)")
PARAM_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def parse_param_count(size: str) -> int:
    """'100K' -> 100_000, '1.5M' -> 1_500_000, '7B' -> 7_000_000_000, '1e6' -> 1_000_000.

    scaffold's own `parse_model_size` follows the same rule with the same message (a test of
    scaffold's checks the two agree).

    Raises:
        ValueError: not a whole number of parameters of at least 1, written as a number with
            an optional exponent and an optional K, M, B or T suffix.
    """
    match = PARAM_COUNT.fullmatch(size.strip().upper())
    count = decimal.Decimal(match.group(1)) * PARAM_SUFFIXES[match.group(2)] if match else 0
    if count < 1 or count != count.to_integral_value():
        raise ValueError(
            f"model_size {size!r} is not a whole number of parameters of at least 1; "
            "use e.g. 100K, 2.5M, 7B or 1e6"
        )
    return int(count)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Raise an OSError or ValueError from inside as `SystemExit("error: ...")`: set-up errors
    (a bad key, a missing file) are the user's to fix, in one line without a traceback."""
    try:
        yield
    except (OSError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None


def parse_command_line(argv: list[str] | None, description: str) -> tuple[Config, bool]:
    """`[key=value ...]` with `--config PATH`, `--resume`, `--allow-world-size-change` (the
    same as `allow_world_size_change=true`) and `--allow-data-change` anywhere among them ->
    (the Config, whether to resume). Exits with status 2, as argparse does, on an unknown
    flag.

    Raises:
        ValueError: see `load_config`.
    """
    args = command_line_parser(description).parse_intermixed_args(argv)
    return config_from_arguments(args), args.resume


def command_line_parser(description: str) -> argparse.ArgumentParser:
    """The parser of a training command line (see `parse_command_line`), for entry points
    that take the same settings and add flags of their own."""
    parser = command_parser(description)
    parser.add_argument("--config", default="configs/train.toml", help="TOML file of settings")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    parser.add_argument(
        "--allow-world-size-change",
        action="store_true",
        help="resume a checkpoint written by another number of processes (allow_world_size_change)",
    )
    parser.add_argument(
        "--allow-data-change",
        action="store_true",
        help="resume on changed data, from a new epoch (allow_data_change)",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. lr=1e-3 epochs=5")
    return parser


def command_parser(description: str) -> argparse.ArgumentParser:
    """The argument parser of one of the project's commands: named as it runs (`python -m
    <package>.<command>`, not its file's name) and taking no abbreviated flag (`--res` is no
    `--resume`: a typo does not resume a run)."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    # A package run with -m (`<package>.preflight`) runs its __main__ module.
    program = f"python -m {spec.name.removesuffix('.__main__')}" if spec is not None else None
    return argparse.ArgumentParser(prog=program, description=description, allow_abbrev=False)


def config_from_arguments(args: argparse.Namespace) -> Config:
    """The Config of `command_line_parser`'s parsed arguments (a flag after an override is
    still a flag: parse them with `parse_intermixed_args`).

    Raises:
        ValueError: see `load_config`.
    """
    overrides = args.overrides + ["allow_world_size_change=true"] * args.allow_world_size_change
    overrides += ["allow_data_change=true"] * args.allow_data_change
    return load_config(args.config, overrides)


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> Config:
    """Build a Config from a TOML file (optional) and `key=value` overrides, applied in that order.

    Values are parsed as TOML (`lr=1e-3`, `compile=false`); a text setting takes the text as
    written, quoted or not (`run_dir=runs/try2`, `model_size=1e6`).

    Raises:
        ValueError: every unknown key, value of the wrong type or out of its range, and
            override without `=`, listed in one message; a missing or unreadable TOML file.
    """
    values: dict[str, Any] = {}
    problems: list[str] = []
    if path is not None:
        try:
            with open(path, "rb") as file:
                values.update(_known_keys(tomllib.load(file), str(path), problems))
        except FileNotFoundError:
            raise ValueError(f"config file {path} not found; pass --config PATH") from None
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"config file {path} is not valid TOML: {error}") from None
    for override in overrides:
        key, sep, raw = override.partition("=")
        if not sep:
            problems.append(f"override {override!r} is not key=value; e.g. lr=1e-3")
            continue
        key = key.strip()
        parsed = {key: _parse_value(key, raw.strip())}
        values.update(_known_keys(parsed, "the command line", problems))
    return _typed_config(values, problems)


def _parse_value(key: str, raw: str) -> Any:
    try:
        value = tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        return raw
    field = next((f for f in dataclasses.fields(Config) if f.name == key), None)
    text_setting = field is not None and isinstance(field.default, str)
    return raw if text_setting and not isinstance(value, str) else value


def _known_keys(values: dict[str, Any], source: str, problems: list[str]) -> dict[str, Any]:
    known = [field.name for field in dataclasses.fields(Config)]
    for key in values:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(known)}"
            problems.append(f"unknown config key {key!r} in {source} ({hint})")
    return {key: value for key, value in values.items() if key in known}


def _typed_config(values: dict[str, Any], problems: list[str]) -> Config:
    """The Config of `values`, or one ValueError listing `problems` and every type or range
    problem found (so a user fixes them all at once, not one per run)."""
    fields = {field.name: field for field in dataclasses.fields(Config)}
    typed = {}
    for key, value in values.items():
        expected = type(fields[key].default)
        if expected is float and type(value) is int:
            typed[key] = float(value)
        elif type(value) is expected:
            typed[key] = value
        else:
            problems.append(f"config key {key!r} needs {TYPE_NAMES[expected]}, got {value!r}")
    unchecked = Config.__new__(Config)  # to check the ranges of what is typed right too
    for name, field in fields.items():
        object.__setattr__(unchecked, name, typed.get(name, field.default))
    problems += unchecked.problems()
    if len(problems) > 1:
        raise ValueError(f"{len(problems)} config problems: " + "; ".join(problems))
    if problems:
        raise ValueError(problems[0])
    return Config(**typed)
