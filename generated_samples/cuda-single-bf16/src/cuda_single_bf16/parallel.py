"""Parallelism: one process on one device.

Every strategy's `parallel.py` (single, DDP, FSDP2, ZeRO) exports these same functions, so
`train.py` never names a strategy. Here wrapping, gradient sync and reductions do nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset, RandomSampler, Sampler, SequentialSampler

from .config import Config
from .precision import PrecisionPolicy

STRATEGY = "single"


@dataclass(frozen=True)
class Runtime:
    """Where this process runs: its device, rank and the world size (number of processes)."""

    device: torch.device
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """True on the process that logs, prints and writes checkpoints (rank 0)."""
        return self.rank == 0


def resolve_device(name: str) -> torch.device:
    """`auto` -> cuda if available, else cpu; `cpu`, `cuda`, `cuda:N` or `mps` as named.

    Raises:
        ValueError: an unknown device, or one this machine does not have.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kind = name.split(":")[0]
    available = {"cpu": True, "cuda": torch.cuda.is_available()}
    available["mps"] = torch.backends.mps.is_available()
    if not available.get(kind, False):
        raise ValueError(f"device={name} is not available here; use device=auto or device=cpu")
    device = torch.device(name)
    return torch.device("cuda", torch.cuda.current_device()) if name == "cuda" else device


def init_runtime(device: str) -> Runtime:
    """Pick the device (see `resolve_device`) for this single process.

    Raises:
        ValueError: the device is unknown or not on this machine.
    """
    resolved = resolve_device(device)
    if resolved.type == "cuda":
        torch.cuda.set_device(resolved)
    return Runtime(resolved)


def wrap_model(
    model: nn.Module,
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
    runtime: Runtime,
    precision: PrecisionPolicy,
    config: Config,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The module the loop trains and its optimizer: here the bare `model` (precision is
    autocast's job, in `precision`)."""
    return model, make_optimizer(model)


def full_model_state(model: nn.Module) -> dict[str, Tensor]:
    """The bare model's whole state dict (every process gets all of it)."""
    return model.state_dict()


def gradient_sync(model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
    """Context for one micro-step's forward + backward; gradient all-reduce only when `enabled`."""
    return contextlib.nullcontext()


def all_reduce_sum(tensor: Tensor, runtime: Runtime) -> Tensor:
    """Sum `tensor` over all processes; the identity with one process."""
    return tensor


def gather_objects(obj: Any, runtime: Runtime) -> list[Any]:
    """Every process's `obj`, indexed by rank; `[obj]` with one process."""
    return [obj]


def train_sampler(dataset: Dataset, seed: int, generator: torch.Generator) -> Sampler:
    """Shuffled sample indices drawn from `generator` (whose state a resume restores)."""
    return RandomSampler(dataset, generator=generator)


def eval_sampler(dataset: Dataset) -> Sampler:
    """Every sample once, in order."""
    return SequentialSampler(dataset)


def set_sampler_epoch(sampler: Sampler, epoch: int) -> None:
    """Nothing to do: the shuffle comes from the loader's generator alone."""


def barrier(runtime: Runtime) -> None:
    """Wait for every process; nothing to wait for with one."""


def shutdown_runtime(runtime: Runtime) -> None:
    """Release the process group; a single process holds none."""
