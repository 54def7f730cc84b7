"""The rendered README's quick start: the install gets the torch build the hardware needs, and a
multi-node project leads with the launch its plan assumed."""

from __future__ import annotations

import re

import pytest
from shared_renders import raw_render

from scaffold.variants import VARIANTS

CPU_INDEX = re.compile(
    r"pip install torch( torchvision)? --index-url https://download.pytorch.org/whl/cpu"
)
LAUNCH = re.compile(r"(sbatch|\S+=\S+ bash|bash) ")  # a command line that starts training


def quick_start(factory: pytest.TempPathFactory, variant: str) -> str:
    """The shell block of the Quick start section of `variant`'s README (copier alone)."""
    readme = (raw_render(factory, variant) / "README.md").read_text()
    section = readme[readme.index("## Quick start") :]
    return section[: section.index("\n## ", 1)]


@pytest.mark.parametrize(
    ("variant", "cpu_index"),
    [("cpu-single-fp32", True), ("mps-single-fp32", False), ("cuda-single-bf16", False)],
)
def test_a_cpu_project_installs_the_cpu_build_of_torch_first(tmp_path_factory, variant, cpu_index):
    """PyPI's Linux torch is the CUDA build: a CPU project's `pip install -e ".[dev]"` pulled
    GBs of CUDA libraries. macOS wheels are CPU + MPS already; a CUDA project wants CUDA."""
    section = quick_start(tmp_path_factory, variant)
    lines = section.splitlines()
    install = next(i for i, line in enumerate(lines) if line.startswith('pip install -e ".[dev]"'))
    assert any(CPU_INDEX.match(line) for line in lines[:install]) == cpu_index, section
    if variant.startswith("mps"):
        assert "no extra index" in section, section


def test_a_multinode_project_leads_with_the_multinode_launch(tmp_path_factory):
    """The quick start of a 2-node plan started one node's processes, half the planned run."""
    answers = VARIANTS["multinode-ddp-bf16"]
    nodes, per_node = answers["num_nodes"], answers["gpus_per_node"]
    section = quick_start(tmp_path_factory, "multinode-ddp-bf16")
    launches = [line for line in section.splitlines() if LAUNCH.match(line)]
    assert launches[0].startswith("sbatch launch/slurm.sbatch"), launches
    assert f"{nodes} nodes x {per_node} GPUs" in launches[0], launches
    assert "launch/multinode.sh" in launches[1] and f"{nodes} nodes" in launches[1], launches
    smoke = [line for line in launches if "launch/torchrun.sh" in line]
    assert smoke and "smoke run" in smoke[0] and f"of the {nodes * per_node}" in smoke[0], launches
    assert all(launches.index(line) > 1 for line in smoke), "the one-node run comes after"
