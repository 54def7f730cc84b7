"""Train the example model. Run from the project root: with configs/train.toml as it is, with
any of its keys overridden, or continuing from the latest checkpoint:

    python -m cuda_zero3_offload_fp32.train
    python -m cuda_zero3_offload_fp32.train lr=1e-3 epochs=10
    python -m cuda_zero3_offload_fp32.train --resume

Order of one optimizer step (seeds: AMP and accumulation rules): zero_grad -> for each
micro-batch: autocast(forward + loss) -> backward(loss / micro-batches) -> unscale -> clip ->
step -> update -> scheduler.step(). Validation runs every epoch under eval() + inference_mode().
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sys
import time
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm import tqdm

from .checkpoint import CheckpointManager
from .config import RESUME_INVARIANTS, Config, load_config
from .data import NUM_CLASSES, build_datasets
from .loader import TimedIterator, epoch_iterator, make_eval_loader, make_train_loader
from .model import build_model, count_parameters, eval_sums, loss_fn, throughput
from .optim import build_optimizer, build_scheduler
from .parallel import (
    STRATEGY,
    Runtime,
    all_reduce_sum,
    barrier,
    gather_objects,
    gradient_sync,
    init_runtime,
    shutdown_runtime,
    wrap_model,
)
from .precision import PrecisionPolicy
from .progress import TrainState
from .report import MetricsLog, build_summary, model_flops_utilization, write_summary
from .state_io import capture_rng_state, restore_rng_state


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch (CPU and all CUDA devices)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train_step(
    model: nn.Module,
    micro_batches: Iterable[tuple[Tensor, Tensor]],
    num_micro_batches: int,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    precision: PrecisionPolicy,
    device: torch.device,
    max_grad_norm: float,
) -> tuple[Tensor, Tensor]:
    """One optimizer step over `num_micro_batches` micro-batches (gradient accumulation).

    Each micro-batch loss is divided by `num_micro_batches`, so the summed gradient equals that of
    one batch of all the samples. Returns (mean loss, pre-clip gradient norm) as 0-dim tensors,
    left on the device: `.item()` only when logging avoids a sync per step.
    """
    optimizer.zero_grad(set_to_none=True)
    total_loss = torch.zeros((), device=device)
    for index, (inputs, targets) in enumerate(micro_batches):
        inputs = inputs.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        # Gradients are all-reduced only on the last micro-batch (DDP's no_sync on the others).
        with gradient_sync(model, enabled=index == num_micro_batches - 1):
            with precision.autocast():
                loss = loss_fn(model(inputs), targets)
            precision.backward(loss / num_micro_batches, model)
        total_loss += loss.detach()
    grad_norm = precision.clip_and_step(optimizer, model, max_grad_norm)
    scheduler.step()  # once per optimizer step: warmup and T_max are counted in steps
    return total_loss / num_micro_batches, grad_norm


def evaluate(
    model: nn.Module, loader: Iterable, precision: PrecisionPolicy, runtime: Runtime
) -> dict[str, float]:
    """Validation loss and accuracy over every sample of every rank, weighted by sample count."""
    model.eval()  # dropout off
    sums = torch.zeros(3, dtype=torch.float64, device=runtime.device)
    with torch.inference_mode():
        for inputs, targets in loader:
            with precision.autocast():
                logits = model(inputs.to(runtime.device))
            sums += eval_sums(logits, targets.to(runtime.device))
    model.train()
    loss_sum, correct, count = all_reduce_sum(sums, runtime).tolist()
    return {"val_loss": loss_sum / count, "val_accuracy": correct / count}


class Trainer:
    """Builds every component from a Config, then runs epochs, validation and checkpoints."""

    def __init__(self, config: Config, runtime: Runtime):
        seed_everything(config.seed)
        self.config, self.runtime = config, runtime
        self.run_dir = Path(config.run_dir)
        pin = runtime.device.type == "cuda"
        train_set, val_set = build_datasets(config)
        if len(val_set) == 0:
            raise ValueError("the validation split is empty; raise val_fraction or the data size")
        self.train_loader = make_train_loader(train_set, config, runtime.rank, pin_memory=pin)
        self.val_loader = make_eval_loader(val_set, config, pin_memory=pin)
        self.model = build_model(config).to(runtime.device)  # the module checkpoints name
        # Counted before wrapping: ZeRO-3 leaves each rank's parameters with 0 elements.
        self.parameter_count = count_parameters(self.model)
        # The same initial weights on every rank; from here on, per-rank dropout streams.
        seed_everything(config.seed + runtime.rank)
        self.precision = PrecisionPolicy(runtime.device)
        # The strategy orders wrapping and optimizer: FSDP2 shards first, DeepSpeed wraps both.
        self.trained, self.optimizer = wrap_model(
            self.model, partial(build_optimizer, config=config), runtime, self.precision, config
        )
        self.batches_per_epoch = len(self.train_loader)
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"micro_batch_size={config.micro_batch_size} exceeds the {len(train_set)} training "
                "samples; lower micro_batch_size"
            )
        self.steps_per_epoch = math.ceil(self.batches_per_epoch / config.grad_accum_steps)
        total_steps = config.epochs * self.steps_per_epoch
        self.scheduler = build_scheduler(self.optimizer, config, total_steps)
        if config.warmup_steps >= total_steps:
            self.notice(f"warmup_steps={config.warmup_steps} covers all {total_steps} steps")
        self.state = TrainState(epoch_generator_state=self.train_loader.generator.get_state())
        self.checkpoints = CheckpointManager(
            self.run_dir / "checkpoints", config.keep_last, is_main=runtime.is_main
        )
        if config.compile:
            self.trained = torch.compile(self.trained)
        self.log = MetricsLog(self.run_dir / "metrics.jsonl", enabled=runtime.is_main)
        self.resumed_from: str | None = None
        self.pending_rng: dict[str, Any] | None = None
        self.stats = {"samples": 0, "train_seconds": 0.0, "data_seconds": 0.0}

    def resume(self) -> None:
        """Load the latest valid checkpoint, if any: model first, then optimizer and the rest.

        Raises:
            ValueError: checkpoints exist but none loads, or the run's data order or model
                shape settings (`RESUME_INVARIANTS`) differ from the checkpoint's.
        """
        saved = self.checkpoints.load_latest()
        if saved is None:
            if self.checkpoints.has_checkpoints():
                raise ValueError(
                    f"no checkpoint in {self.checkpoints.directory} loads (all damaged); "
                    "move the folder away or pass run_dir=NEW"
                )
            self.notice(f"no checkpoint in {self.checkpoints.directory} yet; starting at step 0")
            return
        if len(saved["ranks"]) != self.runtime.world_size:
            raise ValueError(
                f"cannot resume {len(saved['ranks'])}-process checkpoints with "
                f"{self.runtime.world_size} processes; launch as many as the checkpoint had"
            )
        saved_config = saved["config"]
        changed = [k for k in RESUME_INVARIANTS if saved_config[k] != getattr(self.config, k)]
        if changed:
            was = ", ".join(f"{key}={saved_config[key]}" for key in changed)
            raise ValueError(
                f"cannot resume with changed {', '.join(changed)} (the checkpoint has {was}); "
                "use the checkpoint's values or pass run_dir=NEW"
            )
        if saved["fallback"]:
            self.notice(f"the last checkpoint did not load; resuming from {saved['path']}")
        self.checkpoints.load_weights(saved, self.trained, self.model, self.optimizer)
        self.scheduler.load_state_dict(saved["scheduler"])
        self.precision.load_state_dict(saved["precision"])
        self.state = TrainState(**saved["progress"])
        mine = saved["ranks"][self.runtime.rank]  # each rank has its own RNGs and worker seeds
        self.state.epoch_generator_state = mine["loader_generator"]
        self.pending_rng = mine["rng"]  # restored after the epoch replay
        self.resumed_from = saved["path"]

    def check_fresh_start(self) -> None:
        """Refuse to start over in a run folder that holds checkpoints (it would mix two runs).

        Raises:
            ValueError: with the two ways out (`--resume`, or a new `run_dir`).
        """
        if self.checkpoints.directory.is_dir() and any(self.checkpoints.directory.iterdir()):
            raise ValueError(
                f"{self.run_dir} already holds a run; pass --resume to continue it "
                "or run_dir=NEW to start another"
            )

    def notice(self, message: str) -> None:
        """One line on stderr from the main process."""
        if self.runtime.is_main:
            print(message, file=sys.stderr)

    def save_checkpoint(self, is_best: bool) -> None:
        """Every process calls this: sharded strategies write a part on each rank."""
        mine = {"rng": capture_rng_state(), "loader_generator": self.state.epoch_generator_state}
        ranks = gather_objects(mine, self.runtime)  # what differs per rank, indexed by rank
        extra = {
            "scheduler": self.scheduler.state_dict(),
            "precision": self.precision.state_dict(),
            "progress": self.state.to_dict(),
            "ranks": ranks,
            "config": self.config.to_dict(),
        }
        self.checkpoints.save(
            self.trained, self.model, self.optimizer, extra, self.state.step, is_best
        )
        barrier(self.runtime)

    def fit(self) -> dict[str, Any]:
        """Train until `epochs`, early stopping or `stop_after_steps`; return the run summary."""
        config, state = self.config, self.state
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.runtime.is_main:
            (self.run_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
        patience = config.early_stop_patience
        early_stopped = 0 < patience <= state.epochs_without_improvement  # a resumed, ended run
        self.trained.train()
        while state.epoch < config.epochs and not early_stopped:
            if not self.train_epoch():
                break  # stopped mid-epoch by stop_after_steps; the checkpoint is written
            metrics = evaluate(self.trained, self.val_loader, self.precision, self.runtime)
            improved = state.record_validation(metrics, config.monitor)
            self.log.write("val", step=state.step, epoch=state.epoch + 1, **metrics)
            state.epoch += 1
            state.batch_in_epoch = 0
            state.epoch_generator_state = self.train_loader.generator.get_state()
            self.save_checkpoint(is_best=improved)
            early_stopped = 0 < patience <= state.epochs_without_improvement
            if state.step == config.stop_after_steps:
                break
        # The final weights as one full state dict, for inference or fine-tuning elsewhere.
        self.checkpoints.export_model(self.model, self.run_dir / "model.pt")
        return self.summary(early_stopped)

    def train_epoch(self) -> bool:
        """Run the rest of the current epoch; False when `stop_after_steps` stopped it early."""
        config, state = self.config, self.state
        iterator = TimedIterator(
            epoch_iterator(
                self.train_loader, state.epoch, state.epoch_generator_state, state.batch_in_epoch
            )
        )
        if self.pending_rng is not None:  # after the replay, so replayed reads shift no stream
            restore_rng_state(self.pending_rng)
            self.pending_rng = None
        bar = tqdm(
            total=self.steps_per_epoch,
            initial=math.ceil(state.batch_in_epoch / config.grad_accum_steps),
            desc=f"epoch {state.epoch + 1}/{config.epochs}",
            disable=not self.runtime.is_main,
            leave=False,
        )
        start = time.perf_counter()
        finished = True
        while state.batch_in_epoch < self.batches_per_epoch:
            count = min(config.grad_accum_steps, self.batches_per_epoch - state.batch_in_epoch)
            loss, grad_norm = train_step(
                self.trained,
                itertools.islice(iterator, count),
                count,
                self.optimizer,
                self.scheduler,
                self.precision,
                self.runtime.device,
                config.max_grad_norm,
            )
            state.batch_in_epoch += count
            state.step += 1
            self.stats["samples"] += count * config.micro_batch_size * self.runtime.world_size
            bar.update()
            if state.step == 1 or state.step % config.log_every == 0:
                self.log_step(loss, grad_norm, bar)
            stop = state.step == config.stop_after_steps
            periodic = config.checkpoint_every and state.step % config.checkpoint_every == 0
            if state.batch_in_epoch < self.batches_per_epoch and (stop or periodic):
                self.save_checkpoint(is_best=False)  # mid-epoch; epoch ends save after validation
            if stop and state.batch_in_epoch < self.batches_per_epoch:
                finished = False
                break
        bar.close()
        self.stats["train_seconds"] += time.perf_counter() - start
        self.stats["data_seconds"] += iterator.seconds
        return finished

    def log_step(self, loss: Tensor, grad_norm: Tensor, bar: tqdm) -> None:
        """Sync the step's loss to the host (the only `.item()` of the loop) and log it."""
        world = self.runtime.world_size  # every rank logs the same steps: a safe collective
        loss_value = all_reduce_sum(loss.detach().clone(), self.runtime).item() / world
        if not math.isfinite(loss_value):  # checked when logging, so no extra sync per step
            raise FloatingPointError(
                f"loss is {loss_value} at step {self.state.step}; lower lr, check inputs and "
                "labels, or use bf16 instead of fp16"
            )
        if self.state.step == 1:
            self.state.initial_loss = loss_value
        lr = self.scheduler.get_last_lr()[0]
        self.log.write(
            "train", step=self.state.step, loss=loss_value, lr=lr, grad_norm=grad_norm.item()
        )
        bar.set_postfix(loss=f"{loss_value:.4f}", lr=f"{lr:.2e}")

    def summary(self, early_stopped: bool) -> dict[str, Any]:
        """The run summary of the output contract; the main process prints and writes it."""
        summary = build_summary(
            config=self.config,
            state=self.state,
            stats=self.stats,
            device=self.runtime.device,
            world_size=self.runtime.world_size,
            strategy=STRATEGY,
            precision=self.precision.name,
            checkpoint_dir=self.checkpoints.directory,
            early_stopped=early_stopped,
            expected_initial_loss=math.log(NUM_CLASSES),
            resumed_from=self.resumed_from,
        )
        summary |= throughput(summary["samples_per_second"], self.config, self.parameter_count)
        if "model_flops_per_second" in summary:
            flops = summary["model_flops_per_second"]
            summary["mfu"] = model_flops_utilization(flops, self.runtime.device)
        if self.runtime.is_main:
            print(write_summary(self.run_dir, summary), end="")
        return summary


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command line: optional --config and --resume, then any number of key=value overrides."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/train.toml", help="TOML file of settings")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. lr=1e-3 epochs=5")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Entry point of `python -m cuda_zero3_offload_fp32.train`; returns the run summary."""
    args = parse_args(argv)
    runtime = None
    try:  # set-up errors are the user's to fix: one line, no traceback
        config = load_config(args.config, args.overrides)
        runtime = init_runtime(config.device)
        trainer = Trainer(config, runtime)
        if args.resume:
            trainer.resume()
        else:
            trainer.check_fresh_start()
    except (OSError, ValueError) as error:
        if runtime is not None:
            shutdown_runtime(runtime)
        raise SystemExit(f"error: {error}") from None
    try:
        return trainer.fit()
    finally:
        del trainer  # free DDP's reducer or FSDP's hooks before the group goes (see shutdown)
        shutdown_runtime(runtime)


if __name__ == "__main__":
    main()
