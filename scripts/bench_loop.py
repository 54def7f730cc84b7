"""Steps per second of the default project's training loop, optionally beside a baseline project.

    python scripts/bench_loop.py                        # the current template's default project
    python scripts/bench_loop.py --baseline OLD_PROJECT # and a project rendered earlier

Each run is a fresh `python -m <package>.train` with checkpoints off; steps/s is the summary's
optimizer steps over its training seconds (validation and start-up excluded). Runs alternate
between the projects and the median of `--repeats` is printed, so drift in the machine's load
falls on both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from scaffold.samples import fresh_template_cache, render_variant
from scaffold.variants import DEFAULT_VARIANT


def steps_per_second(project: Path, run_dir: Path, overrides: list[str]) -> float:
    package = next((project / "src").glob("*/train.py")).parent.name
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    command = [sys.executable, "-m", f"{package}.train", f"run_dir='{run_dir}'", *overrides]
    subprocess.run(command, cwd=project, env=env, check=True, capture_output=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary["steps"] / summary["train_seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="a rendered project to compare against")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    overrides = [f"epochs={args.epochs}", "checkpoint_every=0", "early_stop_patience=0"]
    with tempfile.TemporaryDirectory() as scratch:
        current = Path(scratch) / "current"
        with fresh_template_cache():
            render_variant(DEFAULT_VARIANT, current)
        projects = {"current": current} | ({"baseline": args.baseline} if args.baseline else {})
        rates: dict[str, list[float]] = {name: [] for name in projects}
        for repeat in range(args.repeats):
            for name, project in projects.items():
                run_dir = Path(scratch) / f"{name}-{repeat}"
                rates[name].append(steps_per_second(project, run_dir, overrides))
    print(f"{'project':<10} {'median steps/s':>15}  runs")
    for name, values in rates.items():
        runs = ", ".join(f"{value:.1f}" for value in values)
        print(f"{name:<10} {statistics.median(values):>15.1f}  {runs}")
    if args.baseline:
        ratio = statistics.median(rates["current"]) / statistics.median(rates["baseline"])
        print(f"current / baseline: {ratio:.3f}")


if __name__ == "__main__":
    main()
