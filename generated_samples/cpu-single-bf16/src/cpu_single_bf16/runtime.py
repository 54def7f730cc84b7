"""Where this run executes: one process on one device.

Every project's `runtime.py` exports the same names (`Runtime`, `init_runtime`, reductions,
`barrier`, `shutdown_runtime`), so `train.py` reads the same for any process count.
With one process, reductions return their input and there is nothing to wait for.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

# DataLoader workers start the platform's default way (a plain fork on Linux, the quickest):
# without a process group there are no communication threads whose locks a fork could copy.
WORKER_CONTEXT = None

# What a launcher or scheduler sends to stop a job: SIGTERM (kill, Kubernetes and most launchers)
# and SIGUSR1 (SLURM's `--signal=USR1@120`, ahead of a time limit or a preemption). The training
# process turns either into a checkpoint (training/preemption.py); DataLoader workers ignore them.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


@dataclass(frozen=True)
class Runtime:
    """This process: its device, rank (always 0) and the world size (always 1)."""

    device: torch.device
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """True on the process that logs, prints and writes checkpoints (rank 0)."""
        return self.rank == 0

    def notice(self, message: str) -> None:
        """One line on stderr from the main process, on a line of its own: above the progress
        bar, which redraws its line in place without ending it."""
        if self.is_main:
            tqdm.write(message, file=sys.stderr)


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


def all_reduce_sum(tensor: Tensor, runtime: Runtime) -> Tensor:
    """Sum `tensor` over all processes: with one process, `tensor` itself."""
    return tensor


def gather_objects(obj: Any, runtime: Runtime) -> list[Any]:
    """Every process's `obj`, indexed by rank: `[obj]` with one process."""
    return [obj]


def any_process(flag: bool, runtime: Runtime) -> bool:
    """True if `flag` is True on any process: with one process, `flag` itself."""
    return flag


def barrier(runtime: Runtime) -> None:
    """Wait for every process: there is no other to wait for."""


def shutdown_runtime(runtime: Runtime) -> None:
    """Release what `init_runtime` took: a single process holds no process group."""
