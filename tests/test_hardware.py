"""The hardware probe: what a machine's nvidia-smi, memory and SLURM allocation become as
answer defaults. The command-line tests run the probe through a stand-in nvidia-smi too."""

from __future__ import annotations

import pytest

from scaffold import hardware
from scaffold.hardware import Hardware, probe


def fake_nvidia_smi(monkeypatch, lines: list[str]) -> None:
    monkeypatch.setattr(hardware, "_nvidia_smi", lambda: lines)


def test_gpus_become_cuda_answers_with_their_architecture_memory_and_nodes(monkeypatch):
    fake_nvidia_smi(monkeypatch, [("NVIDIA A100-SXM4-40GB", 40960.0, (8, 0))] * 4)
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    monkeypatch.setattr(hardware, "_host_memory_gib", lambda: 503.7)
    defaults = probe().answer_defaults()
    assert defaults == {
        "hardware": "cuda",
        "gpu_arch": "ampere",
        "gpus_per_node": 4,
        "num_nodes": 2,
        "gpu_memory_gb": 40.0,
        "host_memory_gb": 503.7,
    }


def test_no_gpu_means_cpu_with_the_hosts_memory(monkeypatch):
    fake_nvidia_smi(monkeypatch, [])
    monkeypatch.setattr(hardware.platform, "system", lambda: "Linux")
    monkeypatch.setattr(hardware, "_host_memory_gib", lambda: 23.5)
    assert probe().answer_defaults() == {"hardware": "cpu", "host_memory_gb": 23.5}


def test_an_apple_silicon_mac_means_mps(monkeypatch):
    fake_nvidia_smi(monkeypatch, [])
    monkeypatch.setattr(hardware.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(hardware.platform, "machine", lambda: "arm64")
    assert probe().kind == "mps"


def test_unreadable_memory_is_left_to_the_static_default(monkeypatch):
    fake_nvidia_smi(monkeypatch, [])
    monkeypatch.setattr(hardware, "_host_memory_gib", lambda: 0.0)
    assert "host_memory_gb" not in probe().answer_defaults()


def test_this_machines_host_memory_reads_as_a_plausible_size():
    assert 0.1 < hardware._host_memory_gib() < 1 << 20  # GiB: more than 100 MiB, under 1 PiB


@pytest.mark.parametrize(
    ("capability", "arch"),
    [((9, 0), "hopper"), ((10, 0), "hopper"), ((8, 9), "ampere"), ((7, 5), "volta-turing"),
     ((6, 1), "none"), (None, "none")],
)  # fmt: skip
def test_compute_capability_names_the_architecture(capability, arch):
    assert Hardware("cuda", compute_capability=capability).gpu_arch == arch
