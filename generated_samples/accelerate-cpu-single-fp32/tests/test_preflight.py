"""The preflight check (`python -m accelerate_cpu_single_fp32.preflight`): its verdicts on the
facts of a launch, and runs of it here that fail, each fault on its own line, or pass.
"""

from __future__ import annotations

import pytest
import torch

from accelerate_cpu_single_fp32.engine import PRECISION
from accelerate_cpu_single_fp32.planned import Allocation
from accelerate_cpu_single_fp32.preflight import command as preflight
from accelerate_cpu_single_fp32.preflight.checks import (
    CHECK_FAILED,
    FAIL,
    PASS,
    SHARDED_BYTES_PER_PARAMETER,
    SKIP,
    STATE_BYTES_PER_PARAMETER,
    STATE_ON_HOST,
    WARN,
    bus_bandwidth,
    devices_line,
    disk_line,
    host_memory_line,
    ranks_text,
    restored,
    state_bytes_per_process,
)

import launcher
from conftest import PROJECT_ROOT, TEST_OVERRIDES, preflight_rows, training_env

CUDA_PLAN = Allocation("cuda", 2, 4, 80.0, "hopper", 512.0)
H100 = {"type": "cuda", "cpus": 64, "count": 4, "name": "NVIDIA H100 80GB HBM3"}
H100 |= {"memory": 85_031_714_816, "capability": [9, 0], "precision_supported": True}
GIB = 2**30


def launch_facts(nodes: int, per_node: int, device: dict | None = None, **env: str) -> list[dict]:
    """The facts `facts.observe` reports, for `nodes` x `per_node` ranks started by
    the launcher with the variables `env` added."""
    facts = []
    for rank in range(nodes * per_node):
        variables = {"WORLD_SIZE": str(nodes * per_node), "LOCAL_WORLD_SIZE": str(per_node)}
        variables |= {"TORCHELASTIC_RUN_ID": "7", "SLURM_JOB_ID": None}
        variables |= {"SLURM_STEP_NUM_TASKS": None, "SLURM_STEP_NUM_NODES": None} | env
        fact = {"node": f"node{rank // per_node}", "host": f"node{rank // per_node}"}
        fact |= {"launcher": variables, "device": dict(device or H100), "rss": GIB}
        fact |= {"disk_free": 100 * GIB, "run_bytes": 0, "host_available": 64 * GIB}
        facts.append(fact)
    return facts


def test_the_devices_line_holds_each_gpu_to_the_plan():
    """Memory, compute capability, the engine's precision and a GPU per process, per node, on
    the GPU path (facts as a CUDA machine reports them); a CPU where the plan wants CUDA fails
    unless device=cpu asks for it."""
    assert devices_line(CUDA_PLAN, launch_facts(2, 4), "auto", PRECISION).verdict == PASS
    smaller = launch_facts(2, 4, H100 | {"memory": 42_949_672_960})
    line = devices_line(CUDA_PLAN, smaller, "auto", PRECISION)
    assert line.verdict == FAIL and "40.0 GiB GPUs, planned 80.0 GiB" in line.detail
    older = launch_facts(2, 4, H100 | {"capability": [8, 0]})
    line = devices_line(CUDA_PLAN, older, "auto", PRECISION)
    assert line.verdict == FAIL and "capability 8.0, planned 9.0+" in line.detail
    unsupported = launch_facts(2, 4, H100 | {"precision_supported": False})
    line = devices_line(CUDA_PLAN, unsupported, "auto", PRECISION)
    assert line.verdict == FAIL and f"no {PRECISION} on this GPU" in line.detail
    fewer = launch_facts(2, 4, H100 | {"count": 2})
    line = devices_line(CUDA_PLAN, fewer, "auto", PRECISION)
    assert "has 2 GPU(s) for 4 processes" in line.detail
    cpu = launch_facts(1, 2, {"type": "cpu", "cpus": 2})
    line = devices_line(CUDA_PLAN, cpu, "auto", PRECISION)
    assert line.verdict == FAIL and "pass device=cpu" in line.detail
    assert devices_line(CUDA_PLAN, cpu, "cpu", PRECISION).verdict == WARN
    missing = launch_facts(1, 1, {"error": "device=cuda is not available here"})
    assert "not available" in devices_line(CUDA_PLAN, missing, "cuda", PRECISION).detail


def test_the_disk_and_host_memory_lines_count_what_the_run_will_write_and_hold():
    """keep_last + 2 checkpoints and two weight files, less what the run folder holds already,
    against the free space or a quota; host memory for loader workers and the training state
    where it is held there."""
    facts = launch_facts(1, 2)
    assert disk_line(facts, "runs/a", 3, 10 * GIB, GIB, None).verdict == PASS  # 52 of 100
    assert disk_line(facts, "runs/a", 3, 20 * GIB, GIB, None).verdict == FAIL  # 102 of 100
    resumed = [fact | {"run_bytes": 60 * GIB} for fact in facts]
    assert disk_line(resumed, "runs/a", 3, 20 * GIB, GIB, None).verdict == PASS
    line = disk_line(facts, "runs/a", 3, 10 * GIB, GIB, limit=50 * GIB)
    assert line.verdict == FAIL and "50.00 GiB free" in line.detail
    parameters = 10**9  # 16 bytes of state each
    on_gpus = host_memory_line(facts, 2, 5 * parameters)
    assert on_gpus.verdict == (FAIL if STATE_ON_HOST else PASS), on_gpus  # 80 GB, 64 GiB free
    assert host_memory_line(facts, 40, parameters).verdict == FAIL  # 80 workers x 1 GiB
    cpu = [fact | {"device": {"type": "cpu", "cpus": 2}} for fact in facts]  # state on the host
    assert host_memory_line(cpu, 2, 5 * parameters).verdict == FAIL
    assert host_memory_line(cpu, 2, parameters // 10).verdict == PASS


def test_the_state_a_process_holds_follows_the_strategy():
    """16 bytes a parameter (fp32 weights, gradients, two AdamW moments): the part this strategy
    divides among 4 processes is divided, the rest held whole."""
    whole = STATE_BYTES_PER_PARAMETER - SHARDED_BYTES_PER_PARAMETER
    assert state_bytes_per_process(1000, 1) == 16_000
    assert state_bytes_per_process(1000, 4) == 1000 * whole + 250 * SHARDED_BYTES_PER_PARAMETER


def test_small_helpers():
    """Rank lists for the table, the all-reduce bus bandwidth (nccl-tests' 2(n-1)/n) and the
    round trip's verdict, which needs the weights to have moved after the save."""
    assert ranks_text([0, 1, 2, 5]) == "ranks 0-2, 5" and ranks_text([3]) == "rank 3"
    assert bus_bandwidth(10**9, 8, 1.0) == pytest.approx(1.75e9)
    assert restored({"saved": 2.0, "moved": 1.9, "loaded": 2.0})
    assert not restored({"saved": 2.0, "moved": 1.9, "loaded": 1.9})
    assert not restored({"saved": 2.0, "moved": 2.0, "loaded": 2.0})


def test_a_cpu_node_for_a_cuda_plan_and_an_unwritable_full_disk_fail_on_their_lines(
    tmp_path, monkeypatch, capsys
):
    """One run, three faults, each on its own line with exit status 3 and nothing trained: the
    plan asks for CUDA GPUs and this node has none (`device=auto`), the run folder cannot be
    written (below a file: permissions do not stop root), and a quota leaves too little disk."""
    monkeypatch.setattr(preflight, "PLANNED", CUDA_PLAN)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU node, even on a GPU one
    for name in ("MASTER_ADDR", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "a-file").write_text("not a folder")
    run_dir = tmp_path / "a-file" / "run"
    argv = [*TEST_OVERRIDES, "device=auto", f"run_dir='{run_dir}'", "--disk-limit-gib", "1e-9"]
    with pytest.raises(SystemExit) as exit_status:
        preflight.main(argv)
    rows = preflight_rows(capsys.readouterr().out)
    assert exit_status.value.code == CHECK_FAILED, rows
    assert rows["devices"][0] == FAIL and "the plan is 4 x 80.0 GiB CUDA GPUs" in rows["devices"][1]
    assert rows["run folder"][0] == FAIL and "Not a directory" in rows["run folder"][1]
    assert rows["disk"][0] == FAIL and "needed" in rows["disk"][1]
    assert rows["step"][0] == SKIP and rows["code"][0] == rows["data"][0] == PASS
    assert [path.name for path in tmp_path.iterdir()] == ["a-file"]
    assert (tmp_path / "a-file").read_text() == "not a folder"


def test_the_preflight_passes_here_and_leaves_nothing_behind(tmp_path):
    """On this machine (`device=cpu`): every check passes, the step and the checkpoint round
    trip run on the real model, and neither its files nor the run folder remain."""
    run_dir = tmp_path / "runs" / "a"
    argv = [*TEST_OVERRIDES, "device=cpu", f"run_dir='{run_dir}'"]
    result = launcher.run(preflight.main, *argv, cwd=PROJECT_ROOT, env=training_env(), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    rows = preflight_rows(result.stdout)
    assert set(rows) >= {"plan", "devices", "code", "config", "data", "run folder", "disk", "step"}
    assert {verdict for verdict, _ in rows.values()} <= {PASS, WARN}, rows
    assert "the saved loss back after the load" in rows["step"][1]
    assert list(tmp_path.iterdir()) == [], "the preflight left files behind"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_preflight_reads_this_gpu(tmp_path, capsys):
    """On a GPU: the devices line names it, and the verdicts agree with the exit status (the
    CPU tests above cover each verdict)."""
    argv = [*TEST_OVERRIDES, "device=cuda", f"run_dir='{tmp_path / 'run'}'", "--no-step"]
    with pytest.raises(SystemExit) as exit_status:
        preflight.main(argv)
    rows = preflight_rows(capsys.readouterr().out)
    assert torch.cuda.get_device_name() in rows["devices"][1] or rows["devices"][0] == FAIL
    assert (exit_status.value.code == 0) == all(verdict != FAIL for verdict, _ in rows.values())
