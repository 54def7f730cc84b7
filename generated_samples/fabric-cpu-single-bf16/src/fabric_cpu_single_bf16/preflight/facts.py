"""What one process of a launch observes before it trains: its launcher's variables, its device,
a fingerprint of its code, config and data, its run folder's disk and its host's memory.
`command.py` gathers them from every rank; `checks.py` judges them."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from ..checkpoint.resume import check_resumable
from ..checkpoint.store import complete_checkpoints, holds_checkpoints
from ..checkpoint.world_size import fit_to_checkpoint
from ..config import Config, command_line_parser, config_from_arguments
from ..data import build_datasets
from ..engine.build import build_on_meta
from ..training.run_folder import (
    NotARunFolder,
    fresh_start_refusal,
    holds_a_run,
    in_use,
    in_use_message,
    mark_as_a_run,
)

PACKAGE_DIR = Path(__file__).resolve().parents[1]
PROJECT_ROOT = PACKAGE_DIR.parents[1]
# The launcher variables a check reads: the ranks and sizes of "Environment Variables" in the
# torch.distributed.run docs, and the task and node counts of a SLURM job step (srun(1),
# "OUTPUT ENVIRONMENT VARIABLES").
LAUNCHER_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NUM_NODES",
)


def code_fingerprint() -> str:
    """SHA-256 of this package's source files (their paths and bytes, caches left out): the
    same on every rank that runs the same code."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(path.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()


def git_state() -> str:
    """The project's git commit, with ` (uncommitted changes)` when its tree differs from it;
    '' outside a git checkout or without git."""
    try:
        run = {"cwd": PROJECT_ROOT, "capture_output": True, "text": True, "timeout": 10}
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=True, **run)
        changes = subprocess.run(["git", "status", "--porcelain"], check=True, **run)
    except (OSError, subprocess.SubprocessError):
        return ""
    return commit.stdout.strip() + (" (uncommitted changes)" if changes.stdout.strip() else "")


def config_fingerprint(config: Config) -> str:
    """SHA-256 of the resolved config's fields."""
    values = json.dumps(dataclasses.asdict(config), sort_keys=True, default=str)
    return hashlib.sha256(values.encode()).hexdigest()


def data_fingerprint(config: Config, train: Dataset, val: Dataset) -> str:
    """SHA-256 of the task's data settings that a resume keeps (`task_resume_keys`, with a hash
    of the prepared data's manifest where the task has one) and the two splits' lengths."""
    settings = {key: getattr(config, key) for key in config.task_resume_keys}
    values = json.dumps([settings, len(train), len(val)], sort_keys=True, default=str)
    return hashlib.sha256(values.encode()).hexdigest()


def device_facts(device: torch.device) -> dict[str, Any]:
    """The device this rank trains on: its type, and on CUDA the GPUs this process sees, its
    own GPU's name, memory (bytes), compute capability and whether it computes in the engine's
    precision (bf16)."""
    facts: dict[str, Any] = {"type": device.type, "cpus": os.cpu_count() or 1}
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        facts |= {"count": torch.cuda.device_count(), "name": properties.name}
        facts |= {"memory": properties.total_memory}
        facts |= {"capability": [properties.major, properties.minor]}
        with torch.cuda.device(device):
            facts["precision_supported"] = torch.cuda.is_bf16_supported()  # Ampere and newer
    return facts


def nearest_existing(path: Path) -> Path:
    """`path`, or the closest folder above it that exists (where a run creates it)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def bytes_under(folder: Path) -> int:
    """Bytes of the files under `folder` (0 if it does not exist)."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def available_host_memory() -> int:
    """The bytes this host can give new allocations without swapping (MemAvailable of
    /proc/meminfo, proc(5)); 0 where there is no /proc (macOS)."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return 0
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    return int(fields.get("MemAvailable", "0 kB").split()[0]) * 1024


def resident_bytes() -> int:
    """This process's resident memory in bytes (VmRSS of /proc/self/status); 0 without /proc."""
    try:
        status = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return 0
    rss = [line.split()[1] for line in status if line.startswith("VmRSS:")]
    return int(rss[0]) * 1024 if rss else 0


def command_line(argv: list[str] | None, description: str) -> tuple[Config, bool, Any]:
    """The training command line (`--config`, overrides, `--resume`; config.py) and the
    preflight's own flags: `--no-step`, `--timeout` (seconds a phase waits for the ranks) and
    `--disk-limit-gib` (a quota below the free space) and `--starts-run`
    (`mark_if_starting`). Returns (Config, resume, arguments).

    Raises:
        ValueError: see `config.load_config`.
    """
    parser = command_line_parser(description)
    parser.add_argument("--no-step", action="store_true", help="skip the step and checkpoint")
    parser.add_argument("--timeout", type=positive, default=120.0, help="seconds to wait for ranks")
    parser.add_argument(
        "--disk-limit-gib",
        type=positive,
        default=None,
        help="GiB this run may write, when a quota allows less than the free space",
    )
    parser.add_argument(
        "--starts-run",
        action="store_true",
        help="the first phase of a run (launch/slurm.sbatch): mark run_dir as the run's",
    )
    args = parser.parse_intermixed_args(argv)
    return config_from_arguments(args), args.resume, args


def positive(text: str) -> float:
    """An argparse type: a number > 0.

    Raises:
        argparse.ArgumentTypeError: anything else (argparse exits with status 2).
    """
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"needs a number > 0, got {text!r}")
    return value


def run_folder_conflict(config: Config, resume: bool, world_size: int) -> str:
    """Why a run of `world_size` processes would refuse its run folder at once ('' when it
    would not), by the run's own rules: a run going on there; without `--resume`, a folder
    that holds checkpoints; with it, a folder where no run started, or a latest checkpoint
    `resume.check_resumable` refuses (another world size, changed settings or data)."""
    run_dir = Path(config.run_dir)
    if in_use(run_dir):
        return in_use_message(run_dir)
    checkpoints = run_dir / "checkpoints"
    if not resume:
        return fresh_start_refusal(run_dir) if holds_checkpoints(checkpoints) else ""
    if not holds_a_run(run_dir):
        return str(NotARunFolder(run_dir))
    latest = next(complete_checkpoints(checkpoints), None)
    if latest is None:
        return ""
    try:
        check_resumable(latest, fit_to_checkpoint(config, world_size, resume), world_size)
    except ValueError as error:
        return str(error)
    return ""


def observe(
    config: Config, resume: bool, world_size: int, device: torch.device | str, node: str
) -> dict[str, Any]:
    """Every fact of this process the checks compare (JSON-serialisable): `device` is the one
    the run resolves to, or the error that resolving it raised; `node` names this process's
    machine (the launcher's node rank where it gives one, else the host name). Builds the
    datasets as the run does (`data` is their fingerprint, or `error: ...`) and the model on
    the meta device (`parameters`), and judges the run folder as a run of `world_size`
    processes would (`run_conflict`)."""
    run_dir = Path(config.run_dir)
    disk_at = nearest_existing(run_dir)
    devices = device_facts(device) if isinstance(device, torch.device) else {"error": device}
    try:
        data = data_fingerprint(config, *build_datasets(config))
    except (OSError, ValueError) as error:
        data = f"error: {error}"
    return {
        "data": data,
        "run_conflict": run_folder_conflict(config, resume, world_size),
        "parameters": sum(parameter.numel() for parameter in build_on_meta(config).parameters()),
        "host": socket.gethostname(),
        "node": node,
        "launcher": {name: os.environ.get(name) for name in LAUNCHER_VARIABLES},
        "device": devices,
        "code": code_fingerprint(),
        "git": git_state(),
        "config": config_fingerprint(config),
        "disk_free": shutil.disk_usage(disk_at).free,
        "run_bytes": bytes_under(run_dir) if run_dir.is_dir() else 0,
        "host_available": available_host_memory(),
        "rss": resident_bytes(),
    }


def write_probe(run_dir: Path, name: str) -> str:
    """Create, fsync and keep the file `name` in `run_dir` (or the closest existing folder
    above it); '' when that worked, else why not. `remove_probe` deletes it."""
    try:
        path = nearest_existing(run_dir) / name
        with open(path, "w") as file:
            file.write(name)
            file.flush()
            os.fsync(file.fileno())
    except OSError as error:
        return f"{error.strerror or error} ({error.filename or run_dir})"
    return ""


def probes_missing(run_dir: Path, names: list[str]) -> list[str]:
    """The probe files of `names` this process cannot see in `run_dir`'s folder."""
    folder = nearest_existing(run_dir)
    return [name for name in names if not (folder / name).is_file()]


def mark_if_starting(config: Config, resume: bool, args: argparse.Namespace) -> None:
    """With `--starts-run` and without `--resume`, mark run_dir as a run's (`run_folder.
    mark_as_a_run`, as a training launch does first): the preflight is then the run's first
    phase, and a job requeued before its training started resumes at step 0 (its `--resume`
    would otherwise be refused). Call it on the main process."""
    if args.starts_run and not resume:
        mark_as_a_run(config.run_dir)


def remove_probe(run_dir: Path, name: str) -> None:
    """Delete the probe file `name` if it is there (and could be written)."""
    with contextlib.suppress(OSError):
        (nearest_existing(run_dir) / name).unlink(missing_ok=True)
