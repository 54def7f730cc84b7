"""Containers and clusters without SLURM: each variant's Dockerfile (read with Docker's own
parser) and .dockerignore, and the distributed variants' Kubeflow TrainJob and SkyPilot task,
checked against the answers and plan they were rendered for (`.copier-answers.yml`) and against
the torchrun command of `launch/multinode.sh`."""

from __future__ import annotations

import fnmatch
import re
import shlex
from pathlib import Path

import dockerfile
import pytest
import yaml
from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob
from shared_renders import raw_render

from scaffold.variants import VARIANTS

# ZeRO on the CPU renders Dockerfiles of its own that no named variant reaches.
UNNAMED_RENDERS = {
    f"aa-cpu-{strategy}": {**VARIANTS["cpu-ddp-fp32"], "strategy": strategy}
    for strategy in ("zero1", "zero3-offload")
}
RENDERS = [*VARIANTS, *UNNAMED_RENDERS]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CUDA_INDEX = re.compile(r"https://download\.pytorch\.org/whl/cu12(\d)$")
# The C++ ops each ZeRO engine loads, which its Dockerfile compiles in: the CPU backend's
# shared-memory collectives, and CPU Adam where the optimizer state is offloaded.
SHM_COMM, CPU_ADAM = "DS_BUILD_SHM_COMM", "DS_BUILD_CPU_ADAM"
# SkyPilot 0.14.1's task schema (sky.utils.schemas.get_task_schema(), additionalProperties
# false) and its resources' keys: skypilot itself takes 30-50 s and 460 MB to install.
SKYPILOT_TASK_KEYS = {
    "name", "workdir", "event_callback", "num_nodes", "resources", "file_mounts", "service",
    "pool", "setup", "run", "envs", "secrets", "managed_secrets", "inputs", "outputs",
    "file_mounts_mapping", "config", "volumes", "volume_mounts", "api_server_access",
}  # fmt: skip
SKYPILOT_RESOURCES_KEYS = {"accelerators", "cpus", "memory", "infra", "image_id", "use_spot"}
SKYPILOT_GPUS = {
    "hopper": {"H100", "H200"},
    "ampere": {"A100", "A100-80GB"},
    "volta-turing": {"V100", "V100-32GB"},
}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def render(factory: pytest.TempPathFactory, name: str) -> tuple[Path, dict]:
    """The shared raw render of `name` and the answers it recorded (the plan's included)."""
    project = raw_render(factory, name, UNNAMED_RENDERS.get(name))
    return project, yaml.safe_load((project / ".copier-answers.yml").read_text())


def distributed(name: str) -> bool:
    return {**VARIANTS, **UNNAMED_RENDERS}[name]["strategy"] != "single"


def torchrun_command(script: str) -> dict[str, str]:
    """The flags of the script's torchrun command (its continuation lines joined), with the
    module under "-m"."""
    words = shlex.split(script.replace("\\\n", " "), comments=True)
    flags, rest = {}, words[words.index("torchrun") + 1 :]
    while rest[0] != "-m":
        key, _, value = rest.pop(0).partition("=")
        flags[key] = value
    flags["-m"] = rest[1]
    return flags


@pytest.mark.parametrize("name", RENDERS)
def test_every_project_but_an_apple_gpu_one_has_a_dockerfile(tmp_path_factory, name):
    project, answers = render(tmp_path_factory, name)
    in_container = answers["hardware"] != "mps"
    assert (project / "Dockerfile").is_file() is in_container
    assert (project / ".dockerignore").is_file() is in_container


@pytest.mark.parametrize("name", [name for name in RENDERS if "mps" not in name])
def test_the_dockerfile_installs_the_torch_and_deepspeed_the_variant_runs(tmp_path_factory, name):
    """Every COPY source is in the project; torch comes from the hardware's wheel index;
    DeepSpeed is installed, against that torch, exactly where the engine is ZeRO's, with
    exactly the ops it loads compiled in; the project installs with its dev extra; and the
    container runs the sanity ladder unless told otherwise."""
    project, answers = render(tmp_path_factory, name)
    commands = dockerfile.parse_file(str(project / "Dockerfile"))
    for command in commands:
        if command.cmd in ("COPY", "ADD"):
            assert all((project / source).exists() for source in command.value[:-1]), command
    runs = " ".join(" ".join(c.value) for c in commands if c.cmd == "RUN")
    indexes = re.findall(r"--index-url (\S+)", runs)
    (base,) = [c.value[0] for c in commands if c.cmd == "FROM"]
    zero = answers["strategy"].startswith("zero")
    if answers["hardware"] == "cpu":
        assert indexes == [CPU_INDEX] and base.startswith("python:")
    else:
        (index,) = indexes
        minor = CUDA_INDEX.match(index).group(1)
        # Volta runs only torch's CUDA 12.6 wheels; DeepSpeed compiles with the same CUDA.
        assert minor == "6" if answers["gpu_arch"] == "volta-turing" else minor in "89"
        expected = rf"nvidia/cuda:12\.{minor}\.\d+-devel-" if zero else r"python:"
        assert re.match(expected, base), base
    ops = set(re.findall(r"\b(DS_BUILD_\w+)=1", runs))
    if zero:
        wanted = {SHM_COMM} if answers["hardware"] == "cpu" else set()
        wanted |= {CPU_ADAM} if answers["strategy"] == "zero3-offload" else set()
        assert ops == wanted
        assert f"DS_ACCELERATOR={answers['hardware']} " in runs and "--no-build-isolation" in runs
    else:
        assert "deepspeed" not in runs.lower() and "DS_" not in runs
    copied = next(i for i, c in enumerate(commands) if c.cmd == "COPY")
    assert [c.cmd for c in commands[copied:]] == ["COPY", "RUN", "CMD"], "installs come first"
    assert commands[copied + 1].value[-1].endswith('pip install -e ".[dev]"')
    assert "dev = [" in (project / "pyproject.toml").read_text()
    assert commands[-1].json and commands[-1].value == ("pytest",)


@pytest.mark.parametrize("name", [name for name in RENDERS if "mps" not in name])
def test_the_build_context_leaves_out_runs_data_the_venv_caches_and_git(tmp_path_factory, name):
    project, _ = render(tmp_path_factory, name)
    lines = (project / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]

    def ignored(path: str) -> bool:
        return any(fnmatch.fnmatch(path, p.removeprefix("**/").rstrip("/")) for p in patterns)

    for path in ("runs", "data", ".venv", ".git", ".pytest_cache", "__pycache__", "x.pyc"):
        assert ignored(path), path
    for path in ("src", "tests", "configs", "pyproject.toml", "README.md", "launch"):
        assert not ignored(path), path


@pytest.mark.parametrize("name", [name for name in RENDERS if distributed(name)])
def test_the_trainjob_is_kubeflow_trainers_and_runs_the_planned_nodes(tmp_path_factory, name):
    """launch/trainjob.yaml is a TrainJob of kubeflow-trainer-api's models, every key one of
    their fields (`from_dict` drops unknown keys: the round trip shows any), with the planned
    nodes and GPUs (processes on a CPU) per node, started by torchrun on the module that
    launch/multinode.sh starts."""
    project, answers = render(tmp_path_factory, name)
    manifest = yaml.safe_load((project / "launch" / "trainjob.yaml").read_text())
    assert TrainerV1alpha1TrainJob.from_dict(manifest).to_dict() == manifest
    assert manifest["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert manifest["kind"] == "TrainJob" and DNS_LABEL.match(manifest["metadata"]["name"])
    assert manifest["spec"]["runtimeRef"] == {"name": "torch-distributed"}
    trainer = manifest["spec"]["trainer"]
    assert trainer["image"] == f"REGISTRY/{manifest['metadata']['name']}:latest"
    assert trainer["numNodes"] == answers["num_nodes"]
    assert trainer["numProcPerNode"] == answers["gpus_per_node"]
    gpus = {"limits": {"nvidia.com/gpu": answers["gpus_per_node"]}}
    assert trainer.get("resourcesPerNode") == (gpus if answers["hardware"] == "cuda" else None)
    multinode = torchrun_command((project / "launch" / "multinode.sh").read_text())
    assert multinode["-m"] == f"{answers['package_name']}.train"
    # The runtime sets torchrun's PET_* variables (nodes, processes, node rank, first node).
    assert trainer["command"] == ["torchrun", "-m", multinode["-m"]]


def test_a_misspelt_trainjob_field_fails_the_round_trip():
    """The check above has teeth: kubeflow-trainer-api's `from_dict` drops an unknown key."""
    manifest = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNode": 2}},
    }
    assert TrainerV1alpha1TrainJob.from_dict(manifest).to_dict() != manifest


@pytest.mark.parametrize("name", [name for name in RENDERS if distributed(name)])
def test_the_skypilot_task_runs_multinode_sh_s_torchrun_on_the_planned_nodes(
    tmp_path_factory, name
):
    """launch/skypilot.yaml has only keys of SkyPilot's task schema, the planned nodes and
    GPUs of the answered architecture, installs torch from the hardware's index, and starts
    launch/multinode.sh's torchrun command (module, c10d rendezvous) from SkyPilot's
    variables."""
    project, answers = render(tmp_path_factory, name)
    task = yaml.safe_load((project / "launch" / "skypilot.yaml").read_text())
    assert set(task) <= SKYPILOT_TASK_KEYS and set(task["resources"]) <= SKYPILOT_RESOURCES_KEYS
    assert task["num_nodes"] == answers["num_nodes"] and DNS_LABEL.match(task["name"])
    assert all(isinstance(task[key], str) for key in ("workdir", "setup", "run"))
    cuda = answers["hardware"] == "cuda"
    if cuda:
        gpu, count = task["resources"]["accelerators"].split(":")
        assert gpu in SKYPILOT_GPUS[answers["gpu_arch"]] and int(count) == answers["gpus_per_node"]
    else:
        assert "accelerators" not in task["resources"]
    index = re.search(r"--index-url (\S+)", task["setup"]).group(1)
    assert bool(CUDA_INDEX.match(index)) if cuda else index == CPU_INDEX
    assert 'install -e ".[dev]"' in task["setup"]
    multinode = torchrun_command((project / "launch" / "multinode.sh").read_text())
    sky = torchrun_command(task["run"])
    assert sky.keys() == multinode.keys() and sky["-m"] == multinode["-m"]
    assert sky["--rdzv-backend"] == multinode["--rdzv-backend"] == "c10d"
    assert sky["--nnodes"] == "$SKYPILOT_NUM_NODES"
    per_node = "$SKYPILOT_NUM_GPUS_PER_NODE" if cuda else str(answers["gpus_per_node"])
    assert sky["--nproc-per-node"] == per_node
    assert sky["--rdzv-endpoint"] == "$HEAD_NODE:29500"
    assert "$SKYPILOT_NODE_IPS" in task["run"] and "$SKYPILOT_NODE_RANK" in task["run"]
