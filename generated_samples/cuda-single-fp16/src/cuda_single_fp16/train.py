"""Train: `python -m cuda_single_fp16.train [--resume] [--config PATH] [key=value ...]`.

One optimizer step, in the order of PyTorch's AMP recipe: zero_grad -> per micro-batch:
autocast(forward + loss), backward(loss * weight / micro-batches) -> unscale -> clip -> step ->
scheduler.step(). The run ends at the first of `epochs`, `max_steps` and the task's budget,
validated every `val_every` steps (0: each epoch's end) and at its end over every rank's
samples. A stop signal ends a run at a step with a checkpoint; inf/NaN steps are never saved."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from contextlib import closing
from typing import Any

import torch
from torch import Tensor
from torch.optim.lr_scheduler import LRScheduler

from .checkpoint import Checkpointer, CheckpointManager, config_to_resume, start_or_resume
from .config import Config, parse_command_line, user_errors
from .data import build_datasets
from .engine import Engine, build_on_meta, keep_freed_memory
from .loader import make_eval_loader, make_train_loader, model_inputs
from .report import ProfileWindow, RunLog, finish_run, parameter_counts
from .runtime import Runtime, init_runtime, shutdown_runtime
from .state_io import full_disk_exits
from .task import loss_fn, micro_batch_weights
from .training import (
    Safeguards,
    build_optimizer,
    build_scheduler,
    enter_run_folder,
    evaluate,
    seed_all,
    starting_state,
)


def train_step(
    engine: Engine, scheduler: LRScheduler, micro_batches: Iterable, count: int, max_norm: float
) -> tuple[Tensor, Tensor, bool]:
    """One optimizer step over the next `count` micro-batches (gradient accumulation), each
    mean loss weighted by `micro_batch_weights` and divided by `count`. Returns (mean loss,
    pre-clip gradient norm, whether the engine skipped the update), left on the device."""
    device = engine.runtime.device
    engine.zero_grad()
    total_loss = torch.zeros((), device=device)
    batches = list(itertools.islice(micro_batches, count))
    targets = [batch[1].to(device, non_blocking=True) for batch in batches]
    weights = micro_batch_weights(targets, engine.runtime)  # of the step's counted targets
    for index, (inputs, _) in enumerate(batches):
        with engine.micro_step(last=index == count - 1):
            with engine.autocast():
                logits = engine.module(*model_inputs(inputs, device))
                loss = loss_fn(logits, targets[index]) * weights[index]
            engine.backward(loss / count)
        total_loss += loss.detach()
    grad_norm = engine.clip_and_step(max_norm)
    if not (skipped := engine.step_skipped()):  # the schedule counts applied updates
        scheduler.step()  # once per optimizer step: warmup and decay are counted in steps
    return total_loss / count, grad_norm, skipped


class Trainer:
    """Builds every component of a run from a Config; `fit` trains, validates and checkpoints."""

    def __init__(self, config: Config, runtime: Runtime, resume: bool = False):
        if runtime.device.type == "cpu":  # activations in host memory: keep them mapped
            keep_freed_memory()
        # The batch split a checkpoint of another world size needs, before anything uses it.
        config = config_to_resume(config, runtime.world_size, resume)
        seed_all(config.seed)  # the same split and first shuffle on every rank
        self.config, self.runtime = config, runtime
        train_set, val_set = build_datasets(config)
        self.train_loader = make_train_loader(train_set, config, runtime)
        self.val_loader = make_eval_loader(val_set, config, runtime)
        model = build_on_meta(config)  # shapes only: the engine materialises the weights
        self.log = RunLog(config, runtime, parameter_counts(model))
        enter_run_folder(config, runtime, resume)  # after the refusals, before the engine
        seed_all(config.seed + runtime.rank)  # from here on, per-rank dropout streams
        self.engine = Engine(model, lambda module: build_optimizer(module, config), runtime, config)
        self.state = starting_state(config, self.train_loader, runtime.world_size)
        steps = (self.state.run_steps, self.state.steps_per_epoch)
        self.scheduler = build_scheduler(self.engine.optimizer, config, *steps)
        shared = {"scheduler": self.scheduler, "progress": self.state}
        per_rank = {"data_position": self.state.data}
        self.checkpoints = CheckpointManager(config, runtime, self.engine, shared, per_rank)
        self.resumed_from = start_or_resume(self.checkpoints, self.state, runtime, resume)
        self.guards = Safeguards(config, self.engine)
        self.log.also_log(self.guards.values)
        self.log.evaluate_with(self.engine)  # the task's own evaluation, if it has one
        self.checkpointer = Checkpointer(config, self.checkpoints, self.state, self.guards)
        self.profiler = ProfileWindow(config, runtime)

    def fit(self) -> dict[str, Any]:
        """Train until the run's length, early stopping or `stop_after_steps`; return the run
        summary. Raises Preempted (a stop signal) or FloatingPointError (inf/NaN), see
        training/safeguards.py."""
        config, state = self.config, self.state
        if not state.finished(config):  # a resumed run that had ended records nothing
            self.log.start_run(state, self.resumed_from)
            self.profiler.at_step(state.step)
        # Closed in reverse: loader workers, then a background save, then the run folder.
        with self.guards, self.log, self.profiler, closing(self.checkpoints), closing(state.data):
            while not state.finished(config):  # a due validation first: a resume may owe one
                self.validate() if state.validation_due(config) else self.train_until_validation()
            return finish_run(self.log, self.profiler, self.checkpoints, state, self.resumed_from)

    def validate(self) -> None:
        """Validate the current step on every rank, record it and checkpoint it."""
        state, between = self.state, self.checkpointer.stop_on_signal
        metrics = evaluate(self.engine, self.val_loader, self.config.val_batches, between)
        improved = state.record_validation(metrics, self.config)
        self.log.write("val", step=state.step, epoch=state.epochs_done(), **metrics)
        self.checkpointer.validation_done(improved)

    def train_until_validation(self) -> None:
        """Take optimizer steps until a validation is due or `stop_after_steps` is reached."""
        config, state = self.config, self.state
        with self.log.training():
            while not (state.validation_due(config) or state.reached_stop_after(config)):
                count = min(config.grad_accum_steps, state.batches_left())
                lr = self.scheduler.get_last_lr()[0]  # the rate this step runs at
                batches = self.log.timed(state.epoch_batches())
                step = train_step(self.engine, self.scheduler, batches, count, config.max_grad_norm)
                state.advance(count)  # a used-up epoch ends here
                self.guards.step_done(state.step, *step)
                state.note_loss(self.log.step(state, count, *step[:2], lr))
                self.profiler.at_step(state.step)
                self.checkpointer.step_done()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Entry point of `python -m cuda_single_fp16.train`; returns the run summary."""
    with user_errors():
        config, resume = parse_command_line(argv, description=__doc__.splitlines()[0])
        runtime = init_runtime(config.device)
    try:
        with user_errors():
            trainer = Trainer(config, runtime, resume)
        with full_disk_exits():  # one line that says where, and what to free
            return trainer.fit()  # a stop signal exits with 75 (training/preemption.py)
    finally:  # fit closed the log on every way out
        trainer = None  # free the wrapper's communication hooks before the process group goes
        shutdown_runtime(runtime)


if __name__ == "__main__":
    main()
