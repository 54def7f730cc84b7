"""Probe the machine for defaults: GPUs (via nvidia-smi, so torch need not be installed), MPS,
CPU cores and launcher environment. Never prompts and never fails: unknown means CPU."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    """What the probe saw. `gpu_memory_gb` is per GPU (GiB); `compute_capability` e.g. (8, 0)."""

    kind: str  # "cuda", "mps" or "cpu"
    gpu_count: int = 0
    gpu_name: str = ""
    compute_capability: tuple[int, int] | None = None
    gpu_memory_gb: float = 0.0
    cpu_cores: int = 1
    launcher: str = ""  # "slurm", "torchrun" or ""

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
        """Defaults for the questionnaire's hardware questions."""
        if self.kind != "cuda":
            return {"hardware": self.kind}
        return {
            "hardware": "cuda",
            "gpu_arch": self.gpu_arch,
            "gpus_per_node": max(1, self.gpu_count),
            "gpu_memory_gb": round(self.gpu_memory_gb, 1),
        }


def probe() -> Hardware:
    """Look at this machine; anything that cannot be read is left at its CPU default."""
    cores = os.cpu_count() or 1
    launcher = "slurm" if "SLURM_JOB_ID" in os.environ else ""
    launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else launcher
    gpus = _nvidia_smi()
    if gpus:
        name, memory_mib, capability = gpus[0]
        return Hardware("cuda", len(gpus), name, capability, memory_mib / 1024, cores, launcher)
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return Hardware("mps", cpu_cores=cores, launcher=launcher)
    return Hardware("cpu", cpu_cores=cores, launcher=launcher)


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
