"""Shared fixtures of the sanity ladder: a config per test and a way to train in a fresh process."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import struct
import subprocess
import time
import zlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fabric_cpu_single_bf16.checkpoint import LAST_WEIGHTS_FILE
from fabric_cpu_single_bf16.config import Config, load_config
from fabric_cpu_single_bf16.plot import DPI, FIGURE_INCHES
from fabric_cpu_single_bf16.runtime import Runtime, init_runtime
from fabric_cpu_single_bf16.train import main as train_main

import launcher

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# A smaller model and data for the tests: the example's defaults would take minutes on a CPU.
# A quarter of the example's model: the ladder checks the machinery, and CPUs without native
# 16-bit matrix units run low-precision convolutions several times slower than fp32. The batch,
# learning rate and schedule are the example's own, whatever the planner chose for the model
# size this project was rendered at.
TEST_SETTINGS: dict[str, object] = {"model_size": "25K", "micro_batch_size": 64, "lr": 2e-3}
TEST_SETTINGS |= {"grad_accum_steps": 1, "warmup_steps": 40, "activation_checkpointing": False}
# The ladder runs on the digits' CNN whatever model configs/train.toml names (a timm backbone
# trains on prepared images: tests/test_images.py prepares some and trains one, from the
# template's own fine-tuning settings rather than those planned for this project's backbone).
# A task of your own (its task_config.py) without these keys keeps its own.
EXAMPLE_MODEL = {"model_family": "cnn", "backbone": "", "init_from": "", "data_dir": ""}
EXAMPLE_MODEL |= {"backbone_lr_ratio": 0.1, "freeze_backbone_epochs": 0}
CONFIG_KEYS = {field.name for field in dataclasses.fields(Config)}
TEST_SETTINGS |= {key: value for key, value in EXAMPLE_MODEL.items() if key in CONFIG_KEYS}
# Ranks draw their own random shifts and dropout: off where runs of 1 and 2 processes compare.
RANDOMNESS_OFF = ["augment=false", "dropout=0.0"]
# The task's own evaluation between validations: the image task has none.
TASK_EVALUATION: list[str] = []
# Libraries a run imports besides the project's modules (tests/launcher.py preloads them).
RUN_IMPORTS: list[str] = ["sklearn.datasets"]  # build_datasets imports it

TEST_OVERRIDES = [f"{key}={json.dumps(value)}" for key, value in TEST_SETTINGS.items()]
# What a training run imports, on its way too (the first optimizer step imports torch._dynamo):
# imported once, by the launcher's server.
RUN_IMPORTS += ["fabric_cpu_single_bf16.train", "torch._dynamo", "torch.utils.tensorboard"]
RUN_IMPORTS.append("fabric_cpu_single_bf16.preflight")  # the preflight's rehearsal trains too
launcher.preload([*RUN_IMPORTS, "matplotlib.figure"])


@pytest.fixture
def runtime() -> Runtime:
    """This process on the CPU (a one-process group where the strategy needs one)."""
    return init_runtime("cpu")


def config_for_tests(run_dir: Path) -> Config:
    """The project's configs/train.toml on the CPU, with TEST_SETTINGS, writing into `run_dir`."""
    base = load_config(PROJECT_ROOT / "configs" / "train.toml")
    return dataclasses.replace(base, run_dir=str(run_dir), device="cpu", **TEST_SETTINGS)


@pytest.fixture
def config(tmp_path: Path, runtime: Runtime) -> Config:
    """`config_for_tests` with the run folder in the test's temp dir."""
    return config_for_tests(tmp_path / "run")


def training_env() -> dict[str, str]:
    """The environment of a training run: this process's, with the project's `src` importable
    by the processes the run starts."""
    return {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")}


def start_training(*args: str) -> launcher.Launched:
    """The training entry point (`python -m <package>.train`) with ARGS, TEST_SETTINGS applied
    first, started in a fresh process (`launcher.start`) in PROJECT_ROOT."""
    return launcher.start(train_main, *TEST_OVERRIDES, *args, cwd=PROJECT_ROOT, env=training_env())


def run_training(*args: str) -> subprocess.CompletedProcess:
    """`start_training` with ARGS, waited for; fails the test unless it exits with 0."""
    result = launcher.run(train_main, *TEST_OVERRIDES, *args, cwd=PROJECT_ROOT, env=training_env())
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def preflight_rows(stdout: str) -> dict[str, tuple[str, str]]:
    """The preflight's table in `stdout` as {check: (verdict, detail)}, read by the header's
    column positions."""
    lines = stdout.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("check "))
    verdict_at, detail_at = lines[start].index("verdict"), lines[start].index("detail")
    rows = {}
    for line in itertools.takewhile(lambda row: row.strip(), lines[start + 1 :]):
        if line.startswith("preflight:"):
            break
        rows[line[:verdict_at].strip()] = (line[verdict_at:detail_at].strip(), line[detail_at:])
    return rows


def logged_records(run_dir: Path, kind: str | None = None) -> list[dict]:
    """metrics.jsonl of `run_dir`, one dict per line in file order; only `kind`'s if given."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if kind in (None, record["kind"])]


def wait_for_train_step(process: launcher.Launched, run_dir: Path, step: int, seconds: float):
    """Return once the run `process` writes in `run_dir` has logged train step `step` or a later
    one; fail if the process ends first or `seconds` pass."""
    deadline = time.monotonic() + seconds
    while not (run_dir / "metrics.jsonl").is_file() or not any(
        record["step"] >= step for record in logged_records(run_dir, "train")
    ):
        assert process.poll() is None and time.monotonic() < deadline, f"step {step} not logged"
        time.sleep(0.02)


def exported_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The run's final weights, as `model-last.safetensors` holds them."""
    return load_file(run_dir / LAST_WEIGHTS_FILE)


def tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the run's TensorBoard folder, by tag, as (step, value) in step order,
    read by TensorBoard's own reader (which drops what a `purge_step` purged)."""
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in tags}


def assert_loss_curve_png(path: Path) -> None:
    """`path` is a whole PNG of the plot's size: the signature, every chunk's CRC-32 and the
    closing IEND chunk (PNG specification, ISO/IEC 15948), and the IHDR's width and height."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    offset, chunks = 8, {}
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind, body = data[offset + 4 : offset + 8], data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"chunk {kind!r} is damaged"
        chunks.setdefault(kind, body)
        offset += 12 + length
    assert b"IEND" in chunks and b"IDAT" in chunks
    width, height = struct.unpack(">II", chunks[b"IHDR"][:8])
    assert (width, height) == tuple(round(inches * DPI) for inches in FIGURE_INCHES)
