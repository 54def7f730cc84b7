"""Probe the machine for defaults: GPUs (via nvidia-smi, so torch need not be installed), MPS,
CPU cores, host memory and launcher environment. Never prompts and never fails: unknown means
CPU, and a memory size that cannot be read is 0."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Hardware:
    """What the probe saw. `gpu_memory_gb` is per GPU and `host_memory_gb` this machine's (both
    GiB); `compute_capability` e.g. (8, 0); `nodes` the nodes of a SLURM allocation, else 1."""

    kind: str  # "cuda", "mps" or "cpu"
    gpu_count: int = 0
    gpu_name: str = ""
    compute_capability: tuple[int, int] | None = None
    gpu_memory_gb: float = 0.0
    cpu_cores: int = 1
    launcher: str = ""  # "slurm", "torchrun" or ""
    host_memory_gb: float = 0.0
    nodes: int = 1

    @property
    def gpu_arch(self) -> str:
        """`hopper` (sm 9.x+), `ampere` (sm 8.x, Ada included), `volta-turing` (sm 7.x), `none`."""
        if self.compute_capability is None:
            return "none"
        major = self.compute_capability[0]
        if major >= 9:
            return "hopper"
        if major == 8:
            return "ampere"
        return "volta-turing" if major == 7 else "none"

    def answer_defaults(self) -> dict[str, object]:
        """Defaults for the questionnaire's hardware questions (memory sizes the probe could
        not read are left out)."""
        defaults: dict[str, object] = {"hardware": self.kind}
        if self.host_memory_gb:
            defaults["host_memory_gb"] = round(self.host_memory_gb, 1)
        if self.kind == "cuda":
            defaults |= {
                "gpu_arch": self.gpu_arch,
                "gpus_per_node": max(1, self.gpu_count),
                "num_nodes": self.nodes,
                "gpu_memory_gb": round(self.gpu_memory_gb, 1),
            }
        return defaults


def probe() -> Hardware:
    """Look at this machine; anything that cannot be read is left at its CPU default."""
    cores = os.cpu_count() or 1
    launcher = "slurm" if "SLURM_JOB_ID" in os.environ else ""
    launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else launcher
    host = dict(cpu_cores=cores, launcher=launcher, host_memory_gb=_host_memory_gib())
    gpus = _nvidia_smi()
    if gpus:
        name, memory_mib, capability = gpus[0]
        nodes = os.environ.get("SLURM_JOB_NUM_NODES", os.environ.get("SLURM_NNODES", "1"))
        nodes_count = int(nodes) if nodes.isdigit() and int(nodes) > 0 else 1
        return Hardware(
            "cuda", len(gpus), name, capability, memory_mib / 1024, **host, nodes=nodes_count
        )
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return Hardware("mps", **host)
    return Hardware("cpu", **host)


def _host_memory_gib() -> float:
    """Physical memory in GiB, or a container's cgroup limit if lower; 0.0 if unreadable."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0.0
    try:  # cgroup v2: "max" or a byte count
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        total = min(total, int(limit)) if limit.isdigit() else total
    except OSError:
        pass
    return total / 2**30


def _nvidia_smi() -> list[tuple[str, float, tuple[int, int]]]:
    """(name, memory MiB, compute capability) per GPU, or [] without a working nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return []
    query = "--query-gpu=name,memory.total,compute_cap"
    try:
        output = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        gpus = []
        for line in output.strip().splitlines():
            name, memory, capability = (field.strip() for field in line.split(","))
            major, minor = capability.split(".")
            gpus.append((name, float(memory), (int(major), int(minor))))
        return gpus
    except (OSError, subprocess.SubprocessError, ValueError):
        return []
