"""Where this run executes: one process per device, launched by torchrun, in one process group.

Every project's `runtime.py` exports the same names (`Runtime`, `init_runtime`, reductions,
`barrier`, `shutdown_runtime`), so `train.py` reads the same for any process count.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from tqdm import tqdm

# DataLoader workers start from a clean forkserver process: a fork taken while one of the
# group's gloo or NCCL threads holds a lock leaves the worker blocked for good (seen on CPU:
# the first resumed epoch never got its batch). Python 3.14 made forkserver the Linux default
# for this reason. The server imports what a worker runs once, before any thread exists, so
# each worker forks with torch and the data modules loaded: workers are not persistent, and
# importing them afresh cost ~7 s per epoch here (a 2-process run of 8 steps: 15.4 s -> 1.3 s).
# Only those: a worker never calls the engine, whose framework's import alone took up to 4.5 s
# of every process's server start (a 2-process run with workers, resumed: 25 s -> 12 s).
WORKER_CONTEXT = multiprocessing.get_context("forkserver")
WORKER_CONTEXT.set_forkserver_preload([f"{__package__}.loader", f"{__package__}.data"])

# What a launcher or scheduler sends to stop a job: SIGTERM (kill, Kubernetes and most launchers)
# and SIGUSR1 (SLURM's `--signal=USR1@120`, ahead of a time limit or a preemption). The training
# process turns either into a checkpoint (training/preemption.py); DataLoader workers ignore them.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


@dataclass(frozen=True)
class Runtime:
    """Where this process runs: its device, global rank, the world size, its rank on this node
    and the number of processes on this node."""

    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    control_group: dist.ProcessGroup | None = None  # gloo, for host-side flags (any_process)

    @property
    def is_main(self) -> bool:
        """True on the process that logs, prints and writes checkpoints (rank 0)."""
        return self.rank == 0

    def notice(self, message: str) -> None:
        """One line on stderr from the main process, on a line of its own: above the progress
        bar, which redraws its line in place without ending it."""
        if self.is_main:
            tqdm.write(message, file=sys.stderr)


def resolve_device(name: str, local_rank: int) -> torch.device:
    """`auto` -> this process's GPU (cuda:LOCAL_RANK) if CUDA is available, else cpu.

    Raises:
        ValueError: an unknown device, or one this machine does not have.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name not in ("cpu", "cuda"):
        raise ValueError(f"device={name} is not supported with torchrun; use device=auto or cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device=cuda is not available here; use device=auto or device=cpu")
    return torch.device("cuda", local_rank) if name == "cuda" else torch.device("cpu")


def init_runtime(device: str) -> Runtime:
    """Join the process group torchrun set up (NCCL on GPUs, gloo on CPU).

    Without torchrun's environment (RANK, WORLD_SIZE...) a one-process group is created, so
    tests and quick runs work as `python -m` too.

    Raises:
        ValueError: the device is unknown or not on this machine.
    """
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    resolved = resolve_device(device, local_rank)
    if resolved.type == "cuda":
        torch.cuda.set_device(resolved)
    if not dist.is_initialized():
        backend = "nccl" if resolved.type == "cuda" else "gloo"
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend, rank=rank, world_size=world_size)
        else:  # a lone process: a file store needs no free port
            store = os.path.join(tempfile.mkdtemp(prefix="process-group-store-"), "store")
            dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1)
    # Flags such as a stop request are agreed on the CPU: over NCCL, reading the result back
    # would wait for every GPU kernel queued so far, once per step.
    control = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    return Runtime(resolved, rank, world_size, local_rank, local_world_size, control)


def all_reduce_sum(tensor: Tensor, runtime: Runtime) -> Tensor:
    """Sum `tensor` over all processes, in place; returns it."""
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def gather_objects(obj: Any, runtime: Runtime) -> list[Any]:
    """Every process's `obj` (picklable), indexed by rank."""
    gathered: list[Any] = [None] * runtime.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def any_process(flag: bool, runtime: Runtime) -> bool:
    """True if `flag` is True on any process (a collective on the CPU: no GPU sync)."""
    total = torch.tensor([int(flag)])
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=runtime.control_group)
    return bool(total.item())


def barrier(runtime: Runtime) -> None:
    """Wait until every process gets here."""
    dist.barrier()


def shutdown_runtime(runtime: Runtime) -> None:
    """Leave the process group. Collect garbage first: destroying the group while a wrapper's
    communication hooks are still alive aborted 12-30% of gloo runs at exit ("terminate called
    without an active exception"); with the collection first, 0 of 49."""
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
