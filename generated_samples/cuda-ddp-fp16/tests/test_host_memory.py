"""engine/host_memory.py: on glibc, the memory a step frees stays mapped for the next step, so the
next step faults no pages in; a launcher's own allocator choice is left alone."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from cuda_ddp_fp16.engine import keep_freed_memory

from conftest import training_env

# A training step's pattern in miniature: 40 MB in blocks of 4 MB, every page written, all freed
# at its end. Prints the minor page faults per step after two warm-up steps.
PROBE = """
import resource, sys
from cuda_ddp_fp16.engine import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def step():
    blocks = [bytearray(4 << 20) for _ in range(10)]
    for block in blocks:
        block[::4096] = bytes(len(block[::4096]))
step(); step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


def faults_per_step(mode: str) -> float:
    env = {key: value for key, value in training_env().items() if not key.startswith("MALLOC")}
    command = [sys.executable, "-c", PROBE, mode]
    output = subprocess.run(command, env=env, capture_output=True, check=True).stdout
    return float(output.split()[-1])  # the last line: importing the engine may log before it


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_a_steps_freed_memory_stays_mapped_for_the_next_step():
    default, kept = faults_per_step("default"), faults_per_step("keep")
    assert default > 5_000, default  # glibc trims the freed 40 MB and faults it in again
    assert kept < 100, kept


def test_an_allocator_the_environment_chose_is_left_alone(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    assert keep_freed_memory() is False
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libjemalloc.so.2")
    assert keep_freed_memory() is False
