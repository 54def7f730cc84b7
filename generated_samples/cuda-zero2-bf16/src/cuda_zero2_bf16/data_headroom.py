"""Is data loading the bottleneck? Loader time per micro-batch against step time.

    python -m <package>.data_headroom [--batches 200] [--steps 20] [key=value ...]

Reads 200 micro-batches from the training DataLoader alone, then times optimizer steps on
micro-batches already in memory, and prints both and their ratio. When the loader alone is
slower than a step, data loading is the bottleneck: fix it before anything else (more
`num_workers`, lighter transforms, data prepared offline; PyTorch's performance tuning guide,
pytorch.org/tutorials/recipes/recipes/tuning_guide.html). A loader at least 10x faster than a
step leaves room for heavier transforms. Nothing is written: the Trainer works in a temporary
folder.
"""

from __future__ import annotations

import dataclasses
import itertools
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from .config import command_parser, load_config, user_errors
from .runtime import init_runtime, shutdown_runtime
from .train import Trainer, train_step

HEADROOM_TARGET = 10.0  # loader this many times faster than a step: room for heavier transforms


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # queued kernels belong to the step being timed


def _batches_forever(loader: Any) -> Iterator:
    """The loader's batches, epoch after epoch (a fresh `iter()` per pass, as training does)."""
    while True:
        yield from loader


def measure_headroom(trainer: Trainer, batches: int = 200, steps: int = 20) -> dict[str, float]:
    """Seconds per micro-batch of `trainer.train_loader` alone and per optimizer step.

    `batches` micro-batches are read without training (the first pass's start-up, e.g. forking
    workers, included, as every epoch pays it). Then `steps` optimizer steps of
    `grad_accum_steps` micro-batches each run on batches read beforehand, after two untimed
    steps. `headroom` is step seconds over the loader's seconds for the micro-batches one step
    consumes: below 1, the GPU (or CPU) waits for data. Trains the trainer's model for
    `steps + 2` steps: use a throw-away Trainer.

    Raises:
        ValueError: `batches` or `steps` below 1.
    """
    if batches < 1 or steps < 1:
        raise ValueError(f"batches={batches} and steps={steps} must both be at least 1")
    config, device = trainer.config, trainer.runtime.device
    start = time.perf_counter()
    held = list(itertools.islice(_batches_forever(trainer.train_loader), batches))
    loader_seconds = (time.perf_counter() - start) / batches
    count = config.grad_accum_steps
    micro_batches = list(itertools.islice(itertools.cycle(held), count))
    for _ in range(2):  # lazy initialisation and allocator warm-up are not a step's cost
        train_step(trainer.engine, trainer.scheduler, micro_batches, count, config.max_grad_norm)
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        train_step(trainer.engine, trainer.scheduler, micro_batches, count, config.max_grad_norm)
    _synchronize(device)
    step_seconds = (time.perf_counter() - start) / steps
    return {
        "loader_seconds_per_batch": loader_seconds,
        "step_seconds": step_seconds,
        "micro_batches_per_step": count,
        "headroom": step_seconds / (loader_seconds * count),
    }


def describe(figures: dict[str, float]) -> str:
    """Two lines for a terminal: the figures, then what they mean."""
    loader_ms = 1e3 * figures["loader_seconds_per_batch"]
    step_ms = 1e3 * figures["step_seconds"]
    count, headroom = figures["micro_batches_per_step"], figures["headroom"]
    if headroom < 1:
        verdict = "data loading is the bottleneck: raise num_workers or make batches cheaper"
    elif headroom < HEADROOM_TARGET:
        verdict = f"data keeps up, with less than {HEADROOM_TARGET:.0f}x to spare"
    else:
        verdict = "data keeps up with room to spare"
    return (
        f"loader {loader_ms:.3f} ms per micro-batch | step {step_ms:.2f} ms "
        f"({count} micro-batch(es)) | headroom {headroom:.1f}x\n{verdict}"
    )


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Entry point; prints `describe` of `measure_headroom` and returns the figures."""
    parser = command_parser(__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/train.toml", help="TOML file of settings")
    parser.add_argument("--batches", type=int, default=200, help="micro-batches read alone")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps timed")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. num_workers=4")
    args = parser.parse_intermixed_args(argv)  # options and key=value in any order
    if args.batches < 1 or args.steps < 1:
        counts = f"--batches {args.batches}, --steps {args.steps}"
        raise SystemExit(f"error: --batches and --steps must be at least 1 (got {counts})")
    with user_errors():
        config = load_config(args.config, args.overrides)
        runtime = init_runtime(config.device)
    try:
        with user_errors(), tempfile.TemporaryDirectory() as scratch:
            run_dir = str(Path(scratch) / "run")
            trainer = Trainer(dataclasses.replace(config, run_dir=run_dir), runtime)
            figures = measure_headroom(trainer, args.batches, args.steps)
            del trainer
    finally:
        shutdown_runtime(runtime)
    if runtime.is_main:
        print(describe(figures))
    return figures


if __name__ == "__main__":
    main()
