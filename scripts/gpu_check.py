"""What the CPU matrix cannot show, run on one CUDA GPU; prints a table last.

    python scripts/gpu_check.py                 # on a machine with a GPU, about 7 minutes
    python scripts/gpu_check.py --device cpu    # rehearse the script itself on a CPU
    python scripts/gpu_check.py --smoke         # every row at the smallest size, on a CPU

Trains the committed renders in `generated_samples/` (kept equal to the templates by the test
suite, so the GPU machine needs neither copier nor scaffold) briefly on the GPU: bf16 autocast
and fp16 with GradScaler numerics (initial loss near ln(classes), a finite, falling loss,
validation accuracy), DDP, FSDP2 (bf16 MixedPrecisionPolicy, DCP checkpoints) and DeepSpeed
ZeRO-2/3 over NCCL with world size 1 (torchrun, one process), torch.compile, and the run
summary's samples/s, tokens/s and MFU; last, the language model's throughput at GPT-2-small
size beside a bare loop (bench/gpu_throughput.py; `--only throughput` for it alone) and the
planner's predicted peak memory against `torch.cuda.max_memory_allocated` at 125M-1.3B
parameters, with and without activation checkpointing (bench/memory.py; `--only memory`). Rows with
a resume step also stop a second run there (`stop_after_steps`), continue it with `--resume`,
and report how far its final validation loss lies from the straight run's ("resume diff"; GPU
kernels such as atomics-based backward passes are not bitwise deterministic, so a small
non-zero figure is expected there).

`--smoke` checks that every row is still produced, not its figures (the quick tests run it):
on the CPU, each check SMOKE_STEPS optimizer steps from warmup_steps=1 (the first check with a
resume step resumes at SMOKE_RESUME_STEP: the script's resume path is the same for every
check), without plot or TensorBoard, torch.compile switched off by its own switch
(TORCH_COMPILE_DISABLE=1: inductor's C++ build takes a minute on a CPU), and the bench rows'
own `--smoke`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (label, variant, torchrun?, overrides, resume step or 0)
CHECKS = [
    ("bf16 autocast", "cuda-single-bf16", False, ["epochs=8"], 0),
    ("fp16 + GradScaler", "cuda-single-fp16", False, ["epochs=5"], 40),
    ("DDP, NCCL, world 1", "cuda-ddp-bf16", True, ["epochs=5"], 0),
    ("torch.compile", "cuda-single-bf16", False, ["epochs=5", "compile=true"], 0),
    ("LM tokens/s, MFU", "lm-ddp-bf16", True, ["epochs=1"], 0),
    ("FSDP2, NCCL, bf16", "lm-fsdp2-bf16", True, ["epochs=1", "checkpoint_every=50"], 60),
    ("ZeRO-2, NCCL, bf16", "cuda-zero2-bf16", True, ["epochs=5"], 40),
    ("ZeRO-3, NCCL, bf16", "lm-zero3-bf16", True, ["epochs=1", "checkpoint_every=50"], 60),
]
RESUME_TOLERANCE = 1e-2  # |val_loss difference| above which a resumed run is flagged
SMOKE_STEPS, SMOKE_RESUME_STEP = 4, 2
SMOKE_SETTINGS = [f"max_steps={SMOKE_STEPS}", "warmup_steps=1", "val_every=2", "val_batches=2"]
SMOKE_SETTINGS += ["checkpoint_every=2", "micro_batch_size=16", "plot=false", "tensorboard=false"]
# The language model's example corpus in a smoke run, and no bits-per-byte measurement at its
# end: the GPU plans' held-out text (up to 1 MiB) is a minute's forward pass on a CPU.
SMOKE_LM = ["corpus_bytes=40000", "eval_every=0"]


def smoke_check(variant: str, resume_step: int, resumed_already: bool) -> tuple[list[str], int]:
    """A check's overrides and resume step in a smoke run."""
    corpus = SMOKE_LM if variant.startswith("lm-") else []
    resume = SMOKE_RESUME_STEP if resume_step and not resumed_already else 0
    return [*SMOKE_SETTINGS, *corpus], resume


def train(project: Path, run_dir: Path, torchrun: bool, arguments: list[str], device: str,
          timeout: float, env: dict[str, str] | None = None) -> dict:  # fmt: skip
    """One training run of a rendered project; its summary.json plus `wall` (seconds)."""
    package = project.name.replace("-", "_")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
    command = [*launcher, "-m"] if torchrun else [sys.executable, "-m"]
    command += [f"{package}.train", f"device={device}", f"run_dir='{run_dir}'", *arguments]
    path = os.pathsep.join(filter(None, [str(project / "src"), os.environ.get("PYTHONPATH")]))
    start = time.perf_counter()
    result = subprocess.run(
        command, cwd=project, env={**os.environ, "PYTHONPATH": path, **(env or {})},
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    wall = time.perf_counter() - start
    if result.returncode != 0:
        sys.stderr.write(f"--- {project.name} {' '.join(arguments)}\n{result.stderr[-3000:]}\n")
        last_line = (result.stderr.strip().splitlines() or ["?"])[-1]
        return {"status": "FAIL: " + last_line, "wall": wall}
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary | {"status": "ok", "wall": wall}


def run_check(workdir: Path, variant: str, torchrun: bool, overrides: list[str], resume_step: int,
              device: str, deadline: float, env: dict[str, str] | None = None) -> dict:  # fmt: skip
    project = workdir / variant
    if not project.exists():
        shutil.copytree(ROOT / "generated_samples" / variant, project)
    run_dir = workdir / "runs" / f"{variant}-{len(list((workdir / 'runs').glob('*')))}"
    seconds = deadline - time.perf_counter()
    summary = train(project, run_dir, torchrun, overrides, device, seconds, env)
    if summary["status"] != "ok":
        return summary
    expected = summary["expected_initial_loss"]
    sane = abs(summary["initial_loss"] - expected) < 0.15 and math.isfinite(summary["val_loss"])
    if not (sane and summary["val_loss"] < expected):
        summary["status"] = "CHECK NUMERICS"
    if resume_step:
        stopped = run_dir.with_name(run_dir.name + "-resumed")
        stop = [*overrides, f"stop_after_steps={resume_step}"]
        for arguments in (stop, [*overrides, "--resume"]):
            resumed = train(project, stopped, torchrun, arguments, device,
                            deadline - time.perf_counter(), env)  # fmt: skip
            summary["wall"] += resumed["wall"]
            if resumed["status"] != "ok":
                return summary | {"status": "resume " + resumed["status"]}
        if not resumed.get("resumed_from"):
            return summary | {"status": "RESUME NOT TAKEN"}
        summary["resume_diff"] = abs(resumed["val_loss"] - summary["val_loss"])
        if summary["resume_diff"] > RESUME_TOLERANCE:
            summary["status"] = "RESUME DRIFT"
    return summary


def _cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    return "-" if value is None else format(value, fmt)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu to rehearse")
    parser.add_argument("--budget-seconds", type=float, default=540.0)
    parser.add_argument("--only", nargs="*", help="labels' first words to run (default: all)")
    parser.add_argument("--smoke", action="store_true", help="check every row runs, on a CPU")
    args = parser.parse_args()
    env = {"TORCH_COMPILE_DISABLE": "1"} if args.smoke else {}
    if args.smoke:
        args.device = "cpu"
    rows = []
    deadline = time.perf_counter() + args.budget_seconds
    with tempfile.TemporaryDirectory(prefix="gc-") as scratch:
        workdir = Path(scratch)
        (workdir / "runs").mkdir()
        for label, variant, torchrun, overrides, resume_step in CHECKS:
            if args.only and label.split(",")[0].split()[0] not in args.only:
                continue
            if deadline - time.perf_counter() < 20:
                rows.append((label, variant, {"status": "skipped: time budget", "wall": 0.0}))
                continue
            if args.smoke:
                resumed = any("resume_diff" in row for _, _, row in rows)
                overrides, resume_step = smoke_check(variant, resume_step, resumed)
            try:
                outcome = run_check(workdir, variant, torchrun, overrides, resume_step,
                                    args.device, deadline, env)  # fmt: skip
            except subprocess.TimeoutExpired:
                outcome = {"status": "FAIL: timed out", "wall": 0.0}
            rows.append((label, variant, outcome))
            print(label, json.dumps({k: v for k, v in outcome.items() if k != "config"}),
                  flush=True)  # fmt: skip
    print(f"{'check':<20}{'variant':<18}{'status':<16}{'init loss':>10}{'val loss':>9}"
          f"{'val acc':>8}{'samples/s':>11}{'tokens/s':>11}{'MFU':>7}{'resume diff':>12}"
          f"{'wall s':>8}")  # fmt: skip
    for label, variant, row in rows:
        cells = [
            _cell(row, "initial_loss", ".3f").rjust(10),
            _cell(row, "val_loss", ".3f").rjust(9),
            _cell(row, "val_accuracy", ".3f").rjust(8),
            _cell(row, "samples_per_second", ",.0f").rjust(11),
            _cell(row, "tokens_per_second", ",.0f").rjust(11),
            _cell(row, "mfu", ".1%").rjust(7),
            _cell(row, "resume_diff", ".1e").rjust(12),
        ]
        print(f"{label:<20}{variant:<18}{row['status'][:15]:<16}{''.join(cells)}"
              f"{row['wall']:>8.1f}")  # fmt: skip
    benches_ok = True
    for word, title, script, rehearsal in BENCHES:
        if not args.only or word in args.only:
            options = ["--smoke"] if args.smoke else [] if args.device == "cuda" else rehearsal
            device = [] if args.smoke else [f"--device={args.device}"]  # --smoke says where
            benches_ok &= bench_row(title, [script, *device, *options],
                                    deadline - time.perf_counter())  # fmt: skip
    return 0 if benches_ok and all(row["status"] == "ok" for _, _, row in rows) else 1


# (--only word, title, script under bench/, its options in a CPU rehearsal) of the rows that
# print tables:
# the rendered LM loop against a bare loop at GPT-2-small size, with and without torch.compile
# (tokens/s, MFU, ratio); the planner's memory estimate against torch.cuda.max_memory_allocated.
BENCHES = [
    ("throughput", "LM throughput vs bare loop", "gpu_throughput.py", []),
    ("memory", "Predicted vs measured peak memory", "memory.py", ["--first", "1"]),
]


def bench_row(title: str, arguments: list[str], seconds_left: float) -> bool:
    """Run a bench/ script with `arguments` in the time left; print its table."""
    if seconds_left < 60:
        print(f"{title}: skipped: time budget")
        return False
    command = [sys.executable, str(ROOT / "bench" / arguments[0]), *arguments[1:]]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=seconds_left)
    except subprocess.TimeoutExpired:
        print(f"{title}: FAIL: timed out")
        return False
    print(f"\n{title} (bench/{arguments[0]})")
    print(result.stdout if result.returncode == 0 else result.stderr[-3000:])
    return result.returncode == 0


if __name__ == "__main__":
    sys.exit(main())
