"""What the CPU matrix cannot show, run on one CUDA GPU; prints a table last.

    python scripts/gpu_check.py                 # on a machine with a GPU, inside 8 minutes
    python scripts/gpu_check.py --device cpu    # rehearse the script itself on a CPU

Renders the CUDA variants with `scaffold new --variant` and trains each briefly on the GPU:
bf16 autocast and fp16 with GradScaler numerics (initial loss near ln(classes), a finite,
falling loss, validation accuracy), DDP and FSDP2 (bf16 MixedPrecisionPolicy, DCP checkpoints)
over NCCL with world size 1 (torchrun, one process), torch.compile, and the run summary's
samples/s, tokens/s and MFU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (label, variant, torchrun?, overrides)
CHECKS = [
    ("bf16 autocast", "cuda-single-bf16", False, ["epochs=8"]),
    ("fp16 + GradScaler", "cuda-single-fp16", False, ["epochs=8"]),
    ("DDP, NCCL, world 1", "cuda-ddp-bf16", True, ["epochs=5"]),
    ("torch.compile", "cuda-single-bf16", False, ["epochs=5", "compile=true"]),
    ("LM tokens/s, MFU", "lm-ddp-bf16", True, ["epochs=1"]),
    ("FSDP2, NCCL, bf16", "lm-fsdp2-bf16", True, ["epochs=1", "checkpoint_every=50"]),
]


def run_check(workdir: Path, variant: str, torchrun: bool, overrides: list[str], device: str,
              timeout: float) -> dict:  # fmt: skip
    project = workdir / variant
    if not project.exists():
        subprocess.run(
            [sys.executable, "-m", "scaffold", "new", variant, "--variant", variant],
            cwd=workdir, check=True, capture_output=True,
        )  # fmt: skip
    package = variant.replace("-", "_")
    run_dir = workdir / "runs" / f"{variant}-{len(list((workdir / 'runs').glob('*')))}"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
    command = [*launcher, "-m"] if torchrun else [sys.executable, "-m"]
    command += [f"{package}.train", f"device={device}", f"run_dir='{run_dir}'", *overrides]
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    start = time.perf_counter()
    result = subprocess.run(
        command, cwd=project, env=env, capture_output=True, text=True, timeout=timeout
    )
    wall = time.perf_counter() - start
    if result.returncode != 0:
        return {
            "status": "FAIL: " + (result.stderr.strip().splitlines() or ["?"])[-1],
            "wall": wall,
        }
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["wall"] = wall
    expected = summary["expected_initial_loss"]
    sane = abs(summary["initial_loss"] - expected) < 0.15 and math.isfinite(summary["val_loss"])
    summary["status"] = "ok" if sane and summary["val_loss"] < expected else "CHECK NUMERICS"
    return summary


def _cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    return "-" if value is None else format(value, fmt)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu to rehearse")
    parser.add_argument("--budget-seconds", type=float, default=420.0)
    args = parser.parse_args()
    rows = []
    deadline = time.perf_counter() + args.budget_seconds
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        (workdir / "runs").mkdir()
        for label, variant, torchrun, overrides in CHECKS:
            left = deadline - time.perf_counter()
            if left < 20:
                rows.append((label, variant, {"status": "skipped: time budget", "wall": 0.0}))
                continue
            try:
                outcome = run_check(workdir, variant, torchrun, overrides, args.device, left)
            except subprocess.TimeoutExpired:
                outcome = {"status": "FAIL: timed out", "wall": left}
            rows.append((label, variant, outcome))
    print(f"{'check':<20}{'variant':<18}{'status':<16}{'init loss':>10}{'val acc':>9}"
          f"{'samples/s':>11}{'tokens/s':>11}{'MFU':>7}{'wall s':>8}")  # fmt: skip
    for label, variant, row in rows:
        init, acc = _cell(row, "initial_loss", ".3f"), _cell(row, "val_accuracy", ".3f")
        rate, tokens = (
            _cell(row, "samples_per_second", ",.0f"),
            _cell(row, "tokens_per_second", ",.0f"),
        )
        mfu = _cell(row, "mfu", ".1%")
        print(f"{label:<20}{variant:<18}{row['status'][:15]:<16}{init:>10}{acc:>9}{rate:>11}"
              f"{tokens:>11}{mfu:>7}{row['wall']:>8.1f}")  # fmt: skip
    return 0 if all(row["status"] == "ok" for _, _, row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
