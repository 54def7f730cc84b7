"""The allocation scaffold planned this project for, from its answers: `configs/train.toml`'s
micro-batch and accumulation were sized for it, and `python -m mps_single_fp32.preflight`
checks the allocation a launch got against it. Edit it when the project moves to other
hardware (and re-plan the batch: `scaffold plan` prints a plan for other answers)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Allocation:
    """Processes and devices of a run: `device` is cuda, cpu or mps; `processes_per_node` is
    one per GPU on CUDA; `gpu_memory_gib` is each GPU's memory in GiB (2**30 bytes; 0 off
    CUDA); `gpu_arch` the GPU architecture (none off CUDA); `host_memory_gib` each node's
    memory (0: not given)."""

    device: str
    nodes: int
    processes_per_node: int
    gpu_memory_gib: float
    gpu_arch: str
    host_memory_gib: float

    @property
    def world_size(self) -> int:
        """Processes in the whole run: nodes x processes per node."""
        return self.nodes * self.processes_per_node


PLANNED = Allocation(
    device="mps",
    nodes=1,
    processes_per_node=1,
    gpu_memory_gib=0.0,
    gpu_arch="none",
    host_memory_gib=16.0,
)

# The lowest compute capability of each architecture answer (NVIDIA's "CUDA GPUs - Compute
# Capability" table): Volta 7.0, Ampere 8.0, Hopper 9.0.
MIN_CAPABILITY = {"volta-turing": (7, 0), "ampere": (8, 0), "hopper": (9, 0)}
