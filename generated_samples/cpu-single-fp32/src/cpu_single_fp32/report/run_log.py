"""What a run reports as it trains: the metrics log (JSON lines) and its trackers
(TensorBoard, W&B), the progress bar and the throughput counters. The run summary at its end
is summary.py's."""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from torch import Tensor, nn
from tqdm import tqdm

from .. import task
from ..config import Config
from ..loader.dataloaders import TimedIterator
from ..plot import read_records
from ..runtime import Runtime, all_reduce_sum
from ..state_io import atomic_write, atomic_write_text
from ..task import throughput
from ..training.state import TrainState, check_monitor, is_log_step
from ..training.validation import TaskEvaluation, task_evaluation
from .trackers import Tracker, check_trackers, open_trackers, scalar_tags


class ParameterCounts(NamedTuple):
    """A model's parameters (elements): `total`, and `trained`, those with `requires_grad` (all
    of them, or a LoRA run's adapters alone)."""

    total: int
    trained: int


def parameter_counts(model: nn.Module) -> ParameterCounts:
    """`model`'s parameter counts, read before any wrapper partitions it (meta tensors count)."""
    parameters = list(model.parameters())
    trained = sum(p.numel() for p in parameters if p.requires_grad)
    return ParameterCounts(sum(p.numel() for p in parameters), trained)


class RunLog:
    """What a run reports as it trains: its records (`MetricsFile`: where each launch starts,
    train steps and validations), the progress bar and the throughput counters (`stats`, which
    the run summary reads). Only the main process records and prints (off it, `NoRecords` and a
    disabled bar); every process counts and reduces alike. Used as a context, it closes on the
    way out.

    Raises:
        ValueError: a tracker the config asks for is not installed (`check_trackers`), or
            `monitor` is not one of the task's metrics (`check_monitor`).
    """

    def __init__(self, config: Config, runtime: Runtime, parameters: ParameterCounts):
        self.config, self.runtime = config, runtime
        self.parameters, self.trained_parameters = parameters
        self.config_values = config.to_dict()  # once: the task's derived keys may read files
        self.stats = {"samples": 0, "train_seconds": 0.0, "data_seconds": 0.0}
        self.bar: tqdm | None = None
        self.since_log = (0.0, 0)  # clock and sample count at the last train log line
        check_trackers(config)
        check_monitor(config.monitor)
        self.records = MetricsFile(config) if runtime.is_main else NoRecords()
        self.sources: list[Callable[[], dict[str, float]]] = []
        self.engine: Any = None
        self.evaluation: TaskEvaluation | None = None

    def evaluate_with(self, engine: Any) -> None:
        """Run the task's own evaluation (its config's `task_evaluation` hook, where it has
        one) with `engine` after each optimizer step it is due at and after the run's last,
        outside the training time; each is recorded as an "eval" row and the last goes into
        the run summary (`stats["evaluation"]`)."""
        self.engine = engine

    def also_log(self, values: Callable[[], dict[str, float]]) -> None:
        """Add `values()` (the safeguards' skipped-update count...) to every train log line."""
        self.sources.append(values)

    def start_run(self, state: TrainState, resumed_from: str | None) -> None:
        """Open the records at `state.step` (`MetricsFile.open`) and record where this launch
        starts, with the world size change and the data change this resume made
        (`TrainState.world_size_changes`' and `data_changes`' entries; None where it made
        none); open the progress bar over the run's steps. The main process first prints
        what the prepared data changed against the plan, in one line, where the task's
        `plan_change(config)` hook says (a vocabulary other than the planned one, say)."""
        hook = getattr(task, "plan_change", None)
        if self.runtime.is_main and hook is not None and (change := hook(self.config)):
            print(change, file=sys.stderr, flush=True)
        self.records.open(state.step)
        if self.engine is not None:
            self.evaluation = task_evaluation(self.config, self.runtime, state.step)

        def made_now(changes: list[dict[str, Any]]) -> dict[str, Any] | None:
            made = resumed_from is not None and changes and changes[-1]["step"] == state.step
            return changes[-1] if made else None

        self.write(
            "start",
            step=state.step,
            resumed_from=resumed_from,
            world_size_change=made_now(state.world_size_changes),
            data_change=made_now(state.data_changes),
        )
        self.bar = tqdm(
            total=state.run_steps,
            initial=state.step,
            desc="train",
            unit="step",
            disable=not self.runtime.is_main,
        )

    def write(self, kind: str, **values: Any) -> None:
        """Record `{"kind": kind, **values}` at `values["step"]` (a no-op off the main process)."""
        self.records.write(kind, values)

    @contextlib.contextmanager
    def training(self) -> Iterator[None]:
        """Time what runs inside as training (validations are not): the run summary's rates
        are per second of it, and so are the log lines' (from the start of each stretch)."""
        start = time.perf_counter()
        self.since_log = (start, self.stats["samples"])
        try:
            yield
        finally:
            self.stats["train_seconds"] += time.perf_counter() - start

    def timed(self, batches: Iterator) -> Iterator:
        """`batches`, the seconds spent waiting on them counted as data-loader time."""
        return TimedIterator(batches, self.stats, "data_seconds")

    def step(
        self,
        state: TrainState,
        micro_batches: int,
        loss: Tensor,
        grad_norm: Tensor,
        lr: float,
    ) -> float | None:
        """Count one optimizer step of `micro_batches` micro-batches; at step 1 and every
        `log_every` steps (`is_log_step`) sync its loss to the host, the loop's only `.item()`s,
        and log it with `lr` (the rate the step used), the pre-clip gradient norm, the values of
        `also_log`'s sources and the throughput since the previous log line (wall clock,
        validation excluded). Returns the loss logged (the mean over processes), None at a step
        not logged.

        An inf or NaN loss is logged as it is: training/nonfinite.py decides what it means.
        """
        world_size = self.runtime.world_size
        self.stats["samples"] += self.config.global_batch_size(world_size, micro_batches)
        self.bar.update()
        self._evaluate(state)
        if not is_log_step(state.step, self.config.log_every):
            return None
        world = self.runtime.world_size  # every rank logs the same steps: a safe collective
        loss_value = all_reduce_sum(loss.detach().clone(), self.runtime).item() / world
        values = {"loss": loss_value, "lr": lr, "grad_norm": grad_norm.item()}
        for source in self.sources:
            values |= source()
        self.write("train", step=state.step, **values, **self._recent_throughput())
        epoch = f"{state.epochs_done():.2f}"
        self.bar.set_postfix(epoch=epoch, loss=f"{loss_value:.4f}", lr=f"{lr:.2e}")
        return loss_value

    def _evaluate(self, state: TrainState) -> None:
        """The task's evaluation where it is due at this step (`evaluate_with`), its time taken
        out of the training time and of the next log line's window, as a validation's is."""
        final = state.length_reached(self.config)
        if self.evaluation is None or not self.evaluation.due(state.step, final):
            return
        start = time.perf_counter()
        figures = self.evaluation.measure(self.engine, state.step)
        elapsed = time.perf_counter() - start
        self.stats["train_seconds"] -= elapsed  # `training` adds the whole stretch at its end
        clock, samples = self.since_log
        self.since_log = (clock + elapsed, samples)
        self.write("eval", step=state.step, **figures)
        self.stats["evaluation"] = {"step": state.step, **figures}

    def _recent_throughput(self) -> dict[str, float]:
        """The task's rates (`task.throughput`: samples/s and the task's own) since the last
        train log line, or since training resumed after a validation."""
        (clock, samples), now = self.since_log, time.perf_counter()
        self.since_log = (now, self.stats["samples"])
        window = {
            "samples": self.stats["samples"] - samples,
            "train_seconds": now - clock,
            "config": self.config_values,
            "parameters": self.parameters,
            "device": str(self.runtime.device),
        }
        return {key: rate for key, rate in throughput(window).items() if rate is not None}

    def close(self) -> None:
        """Flush and close the records and the progress bar (idempotent; also on a stopped or
        failed run's way out)."""
        self.records.close()
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exception: object) -> None:
        self.close()


class MetricsFile:
    """The main process's records: `metrics.jsonl` in the run folder (one JSON object per
    line) and the same numbers to the trackers the config asks for (TensorBoard, W&B)."""

    def __init__(self, config: Config):
        self.config, self.path = config, Path(config.run_dir) / "metrics.jsonl"
        self.trackers: list[Tracker] = []

    def open(self, step: int) -> None:
        """Create the run folder and save in it the resolved config as config.json and the
        task's files (`task_run_files`: what its weights need later); drop what an earlier
        launch logged after optimizer step `step` (a killed run logs steps that its resume
        trains again); open the trackers."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        config_json = json.dumps(self.config.to_dict(), indent=2)
        (self.path.parent / "config.json").write_text(config_json, encoding="utf-8")
        task_run_files = getattr(self.config, "task_run_files", dict)  # an optional hook
        for name, source in task_run_files().items():
            atomic_write(self.path.parent / name, functools.partial(shutil.copyfile, source))
        keep_records_up_to(self.path, step)
        self.trackers = open_trackers(self.config, first_step=step + 1)

    def write(self, kind: str, values: dict[str, Any]) -> None:
        """Append `{"kind": kind, **values}` to metrics.jsonl and its numbers to the trackers,
        at `values["step"]`."""
        with open(self.path, "a", encoding="utf-8") as file:
            file.write(json.dumps({"kind": kind, **values}) + "\n")
        scalars = scalar_tags(kind, values)
        for tracker in self.trackers if scalars else ():
            tracker.log_scalars(scalars, values["step"])

    def close(self) -> None:
        """Flush and close the trackers (idempotent)."""
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []


class NoRecords:
    """The records of every process but the main one: nothing (torchtitan's loggers do the
    same off rank 0), so that no caller asks which rank it is on."""

    def open(self, step: int) -> None:
        """Nothing: the main process opens the run's records."""

    def write(self, kind: str, values: dict[str, Any]) -> None:
        """Nothing: the main process records."""

    def close(self) -> None:
        """Nothing to close."""


def keep_records_up_to(path: Path, step: int) -> None:
    """Rewrite metrics.jsonl at `path` without the records logged after optimizer step `step`
    and without a torn last line (atomically; untouched when there is nothing to drop).
    TensorBoard's `purge_step` does the same for its event files."""
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [record for record in read_records(path) if record["step"] <= step]
    if len(kept) != len(lines):
        atomic_write_text("".join(json.dumps(record) + "\n" for record in kept), path)
