"""Training loops, timed, in this process:

    python bench/loops.py PROJECT LOOP[,LOOP...] EPOCHS [key=value ...]   # device=cuda for a GPU
    python bench/loops.py PROJECT all 2 --smoke     # every loop, the smallest run: a check

Every loop trains the rendered project's own model, dataset, AdamW (its weight-decay groups;
fused on CUDA), compute dtype and micro-batch, with its config's key=value overrides, for EPOCHS
epochs. Only optimizer steps after the first epoch are timed (the first pays for lazy
initialisation, allocator warm-up and compilation); validation is left out of the time. Prints
one JSON line per loop: {"loop", "steps", "seconds", "steps_per_second", "tokens_per_step",
"parameters"} (tokens_per_step: 0 for a task without tokens). Loops named together run one
after another in this process (a smoke check's economy); a measurement runs one per process.
`--smoke` trains the smallest run (2 epochs; a language model's corpus cut to SMOKE_CORPUS_BYTES):
it checks that every loop still runs against the rendered project, not its speed.

Loops:
    rendered            the project's `Trainer.fit`, as `train` and `train --resume` run it
                        (clipping, schedule, validation, logging, progress bar, checkpoint
                        cadence); its figures are the run summary's
    bare                a hand-written loop over the dataset's batch reads: no DataLoader,
                        no clipping, no schedule, no logging; the project's autocast dtype,
                        `torch.compile` when `compile=true`, TF32 on CUDA
    lightning           Lightning's Trainer, progress bar, logger and checkpoints off
    lightning-logged    the same with its progress bar, `self.log`, clipping and the schedule
    fabric              Lightning Fabric's loop as its docs show
    accelerate          HF Accelerate's loop as its docs show (its DataLoader not prepared)
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

CPU = torch.device("cpu")


def project_modules(project: Path) -> dict[str, ModuleType]:
    """The rendered project's modules by name (config, data, engine, model, training, ...)."""
    sys.path.insert(0, str(project / "src"))
    package = next((project / "src").glob("*/train.py")).parent.name
    names = ("config", "data", "engine", "loader", "model", "training", "task", "train")
    names += ("runtime",)
    return {name: importlib.import_module(f"{package}.{name}") for name in names}


# A smoke run: a language model's example corpus cut to this many bytes, and micro-batches of
# this many samples: a few optimizer steps an epoch.
SMOKE_CORPUS_BYTES, SMOKE_MICRO_BATCH = 40_000, 256


def bench_config(
    modules: dict[str, ModuleType],
    project: Path,
    run_dir: Path,
    epochs: int,
    settings: list[str],
    smoke: bool = False,
) -> Any:
    """The project's config with `settings` (key=value), then: no augmentation (its cost is the
    data's, not the loop's), no early stopping, no accumulation, and a run of `epochs` epochs
    exactly (no step or token budget ends it sooner); `smoke`: micro-batches of
    SMOKE_MICRO_BATCH and the example corpus cut to SMOKE_CORPUS_BYTES where the task has one."""
    config = modules["config"].load_config(project / "configs" / "train.toml", settings)
    optional = {"augment": False, "max_tokens": 0}
    if smoke:
        optional |= {"corpus_bytes": SMOKE_CORPUS_BYTES, "micro_batch_size": SMOKE_MICRO_BATCH}
    extra = {key: value for key, value in optional.items() if hasattr(config, key)}
    return dataclasses.replace(
        config,
        run_dir=str(run_dir),
        epochs=epochs,
        max_steps=0,
        early_stop_patience=0,
        grad_accum_steps=1,
        **extra,
    )


def batch_loader(dataset: Any, micro_batch_size: int) -> DataLoader:
    """The DataLoader the frameworks' loops read: shuffled whole-batch reads, as the project's."""
    sampler = BatchSampler(RandomSampler(dataset), micro_batch_size, drop_last=True)
    return DataLoader(dataset, sampler=sampler, batch_size=None)


class StepClock:
    """Counts optimizer steps; starts its clock when the first timed step begins."""

    def __init__(self, untimed_steps: int, device: torch.device = CPU):
        self.untimed_steps, self.steps, self.start = untimed_steps, 0, 0.0
        self.device = device

    def tick(self) -> None:
        """Call once before each optimizer step."""
        if self.steps == self.untimed_steps:
            synchronize(self.device)
            self.start = time.perf_counter()
        self.steps += 1

    def result(self, loop: str) -> dict[str, Any]:
        synchronize(self.device)
        seconds = time.perf_counter() - self.start
        timed = self.steps - self.untimed_steps
        return {
            "loop": loop,
            "steps": timed,
            "seconds": seconds,
            "steps_per_second": timed / seconds,
        }


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # queued kernels belong to the steps being timed


def run_rendered(modules: dict[str, ModuleType], config: Any) -> dict[str, Any]:
    """The project's own path, as `python -m <package>.train` and a `--resume` of it run it.

    A first launch (`Trainer.fit` with `stop_after_steps` at the end of the first epoch, the
    preemption drill) trains the untimed epoch and checkpoints there; a second resumes that
    checkpoint in this process (where torch.compile's code for the model class, compiled in the
    first, serves the second's new instance without recompiling; the allocator is warm) and
    trains to the run's end: validation on its schedule,
    checkpoints at their cadence, the metrics log, TensorBoard and the progress bar, as a
    user's run pays them. The figures are the second launch's run summary: its optimizer steps
    over its `train_seconds` (the summary's training time: validation excluded, the step-cadence
    checkpoints and the loader's waits included). `launch_seconds` is that launch's whole
    `fit`, validations, their checkpoints and the end-of-run export included.
    """
    train, runtime = modules["train"], modules["runtime"].init_runtime(config.device)
    train_set, _ = modules["data"].build_datasets(config)
    loader = modules["loader"].make_train_loader(train_set, config, runtime)
    warm_up = dataclasses.replace(config, stop_after_steps=len(loader))  # one micro-batch a step
    first = train.Trainer(warm_up, runtime).fit()
    start = time.perf_counter()
    summary = train.Trainer(config, runtime, resume=True).fit()
    launch_seconds = time.perf_counter() - start
    modules["runtime"].shutdown_runtime(runtime)
    steps = summary["steps"] - first["steps"]
    return {
        "loop": "rendered",
        "steps": steps,
        "seconds": summary["train_seconds"],
        "steps_per_second": steps / summary["train_seconds"],
        "launch_seconds": launch_seconds,
    }


def shuffled_batches(dataset: Any, micro_batch_size: int, epochs: int) -> Iterator[Any]:
    for _ in range(epochs):
        order = torch.randperm(len(dataset)).tolist()
        for start in range(0, len(order) - micro_batch_size + 1, micro_batch_size):
            yield dataset[order[start : start + micro_batch_size]]


def run_bare(modules: dict[str, ModuleType], config: Any, steps_per_epoch: int) -> dict[str, Any]:
    device = torch.device(config.device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    train_set, _ = modules["data"].build_datasets(config)
    model = modules["model"].build_model(config).to(device)
    optimizer = modules["training"].build_optimizer(model, config)
    forward = torch.compile(model) if config.compile else model
    dtype = modules["engine"].COMPUTE_DTYPE
    loss_fn, clock = modules["task"].loss_fn, StepClock(steps_per_epoch, device)
    for inputs, targets in shuffled_batches(train_set, config.micro_batch_size, config.epochs):
        clock.tick()
        inputs = inputs.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not torch.float32):
            loss = loss_fn(forward(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return clock.result("bare")


def run_lightning(
    modules: dict[str, ModuleType], config: Any, steps_per_epoch: int, logged: bool
) -> dict[str, Any]:
    import lightning as L

    clock = StepClock(steps_per_epoch)
    optim = modules["training"]

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = modules["model"].build_model(config)

        def training_step(self, batch: Any, batch_index: int) -> torch.Tensor:
            clock.tick()
            loss = modules["task"].loss_fn(self.model(batch[0]), batch[1])
            if logged:
                self.log("loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self) -> Any:
            optimizer = optim.build_optimizer(self.model, config)
            if not logged:
                return optimizer
            total = config.epochs * steps_per_epoch
            scheduler = optim.build_scheduler(optimizer, config, total)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
            }

    train_set, _ = modules["data"].build_datasets(config)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=config.epochs,
        logger=logged,
        enable_progress_bar=logged,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        gradient_clip_val=config.max_grad_norm if logged else None,
        default_root_dir=config.run_dir,
    )
    trainer.fit(Module(), batch_loader(train_set, config.micro_batch_size))
    return clock.result("lightning-logged" if logged else "lightning")


def framework_loop(
    model: Any,
    optimizer: Any,
    loader: Any,
    backward: Callable[[torch.Tensor], None],
    loss_fn: Callable,
    clock: StepClock,
    config: Any,
) -> None:
    """The loop Fabric's and Accelerate's docs show, with the framework's own `backward`."""
    for _ in range(config.epochs):
        for inputs, targets in loader:
            clock.tick()
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), targets)
            backward(loss)
            optimizer.step()


def run_fabric(modules: dict[str, ModuleType], config: Any, steps_per_epoch: int) -> dict[str, Any]:
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=1, precision="32-true")
    model = modules["model"].build_model(config)
    optimizer = modules["training"].build_optimizer(model, config)
    model, optimizer = fabric.setup(model, optimizer)
    train_set, _ = modules["data"].build_datasets(config)
    loader = fabric.setup_dataloaders(batch_loader(train_set, config.micro_batch_size))
    clock = StepClock(steps_per_epoch)
    framework_loop(
        model, optimizer, loader, fabric.backward, modules["task"].loss_fn, clock, config
    )
    return clock.result("fabric")


def run_accelerate(
    modules: dict[str, ModuleType], config: Any, steps_per_epoch: int
) -> dict[str, Any]:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = modules["model"].build_model(config)
    optimizer = modules["training"].build_optimizer(model, config)
    train_set, _ = modules["data"].build_datasets(config)
    # The loader is not prepared: Accelerate rebuilds a DataLoader from its batch_size and
    # refuses one whose sampler yields whole batches (batch_size=None). With one CPU process
    # preparing it would only move batches to the CPU.
    loader = batch_loader(train_set, config.micro_batch_size)
    model, optimizer = accelerator.prepare(model, optimizer)
    clock = StepClock(steps_per_epoch)
    loss_fn = modules["task"].loss_fn
    framework_loop(model, optimizer, loader, accelerator.backward, loss_fn, clock, config)
    return clock.result("accelerate")


def run_loops(
    project: Path, loops: list[str], epochs: int, settings: list[str], smoke: bool = False
) -> list[dict[str, Any]]:
    """Train `project`'s model with each of `loops` in turn for `epochs` epochs, each from seed
    0 in a run folder of its own; the timed figures of each (the module docstring's JSON).

    Raises:
        ValueError: an unknown loop name, fewer than 2 epochs (the first is not timed), or a
            framework loop asked for another device than the CPU (they are written for it).
    """
    unknown = [loop for loop in loops if loop not in LOOPS]
    if unknown:
        raise ValueError(f"unknown loop {unknown[0]!r}; pick from {', '.join(LOOPS)}")
    if epochs < 2:
        raise ValueError(f"epochs={epochs}: the first epoch is not timed; give at least 2")
    modules = project_modules(project)
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for number, loop in enumerate(loops):
            run_dir = Path(scratch) / f"run-{number}"
            config = bench_config(modules, project, run_dir, epochs, settings, smoke)
            if loop not in ("rendered", "bare") and config.device != "cpu":
                raise ValueError(
                    f"the {loop} loop runs on the CPU only; drop device={config.device}"
                )
            torch.manual_seed(0)
            results.append(run_one(modules, loop, config))
    return results


def run_one(modules: dict[str, ModuleType], loop: str, config: Any) -> dict[str, Any]:
    """One loop's figures, with the tokens per step and the model's parameters."""
    train_set, _ = modules["data"].build_datasets(config)
    steps_per_epoch = len(train_set) // config.micro_batch_size
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "rendered": lambda: run_rendered(modules, config),
        "bare": lambda: run_bare(modules, config, steps_per_epoch),
        "lightning": lambda: run_lightning(modules, config, steps_per_epoch, logged=False),
        "lightning-logged": lambda: run_lightning(modules, config, steps_per_epoch, True),
        "fabric": lambda: run_fabric(modules, config, steps_per_epoch),
        "accelerate": lambda: run_accelerate(modules, config, steps_per_epoch),
    }
    result = runners[loop]()
    inputs, _ = train_set[list(range(config.micro_batch_size))]
    result["tokens_per_step"] = inputs.numel() if not inputs.is_floating_point() else 0
    result["parameters"] = sum(p.numel() for p in modules["model"].build_model(config).parameters())
    return result


LOOPS = ("rendered", "bare", "lightning", "lightning-logged", "fabric", "accelerate")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("project", type=Path, help="a rendered project's folder")
    parser.add_argument(
        "loops", help=f"one of {', '.join(LOOPS)}, several joined by commas, or all"
    )
    parser.add_argument("epochs", type=int, help="epochs per loop, the first not timed (>= 2)")
    parser.add_argument("settings", nargs="*", metavar="key=value", help="config overrides")
    parser.add_argument("--smoke", action="store_true", help="the smallest run, as a check")
    args = parser.parse_intermixed_args()  # --smoke anywhere among the settings
    settings = ["device=cpu", *args.settings]  # a later device=cuda wins
    loops = list(LOOPS) if args.loops == "all" else args.loops.split(",")
    try:
        results = run_loops(args.project, loops, args.epochs, settings, args.smoke)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    for result in results:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
