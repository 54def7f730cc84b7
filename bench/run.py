"""The benchmarks, one command: `python bench/run.py [--repeats 5] [--readme] [--smoke]`.

1. Loop overhead: the rendered loop against a bare loop and the frameworks' loops, on the
   default digits project and the CPU language-model project (see `loops.py`). Each loop runs
   in a fresh process; runs alternate between loops, `--repeats` times, so drift in the
   machine's load falls on all alike; the table gives the median steps/s and its ratio to the
   bare loop.
2. Data-loading headroom: each project's `data_headroom` command (loader time per micro-batch
   against step time).

Prints markdown tables; `--readme` also writes them into bench/README.md between its markers.
`--smoke` checks that every row is still produced, not its speed (seconds, the quick tests run
it): one run of each loop, every loop of a project in one process, 2 epochs on a cut corpus,
and a few batches of headroom.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from scaffold.samples import fresh_template_cache, render_variant

BENCH = Path(__file__).resolve().parent
PROJECTS = {  # variant -> epochs per loop run (~150 timed steps each)
    "cpu-single-fp32": 8,
    "lm-cpu-single-fp32": 2,
}
LOOPS = ("bare", "bare+host_memory", "rendered", "lightning", "lightning-logged", "fabric")
LOOPS += ("accelerate",)
# The bare loop with glibc's thresholds as the rendered project's host_memory.py sets them: how
# much of the rendered loop's lead is its allocator setting, which any loop could take.
HOST_MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(2**30)}
MARKERS = ("<!-- results: start -->", "<!-- results: end -->")


def quiet_env(project: Path) -> dict[str, str]:
    """One torch thread (the figures compare loops, not thread pools), the project importable."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(project / "src")}


def time_loops(project: Path, loops: list[str], epochs: int, smoke: bool = False) -> list[float]:
    """Steps/s of each of `loops` in one fresh process of bench/loops.py on `project` (one
    loop a process for a measurement; `bare+host_memory` alone, since it sets the process's
    environment)."""
    env = quiet_env(project)
    if loops == ["bare+host_memory"]:
        loops, env = ["bare"], env | HOST_MEMORY_ENV
    command = [sys.executable, str(BENCH / "loops.py"), str(project), ",".join(loops), str(epochs)]
    command += ["--smoke"] if smoke else []
    result = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"error: {loops} on {project.name} failed:\n{result.stderr[-3000:]}")
    lines = result.stdout.splitlines()[-len(loops) :]
    return [json.loads(line)["steps_per_second"] for line in lines]


def loop_table(projects: dict[str, Path], repeats: int, smoke: bool = False) -> str:
    rows = [
        "| project | loop | median steps/s | / bare | runs |",
        "| --- | --- | --- | --- | --- |",
    ]
    for variant, project in projects.items():
        rates: dict[str, list[float]] = {loop: [] for loop in LOOPS}
        for _ in range(repeats):
            if smoke:  # every loop once, in one process, host_memory's bare run in its own
                rows_of = [loop for loop in LOOPS if loop != "bare+host_memory"]
                for loop, rate in zip(
                    rows_of, time_loops(project, rows_of, 2, smoke=True), strict=True
                ):
                    rates[loop].append(rate)
                rates["bare+host_memory"] += time_loops(project, ["bare+host_memory"], 2, True)
                continue
            for loop in LOOPS:
                rates[loop] += time_loops(project, [loop], PROJECTS[variant])
        bare = statistics.median(rates["bare"])
        for loop, values in rates.items():
            median = statistics.median(values)
            runs = ", ".join(f"{value:.1f}" for value in values)
            rows.append(f"| {variant} | {loop} | {median:.1f} | {median / bare:.3f} | {runs} |")
        print(f"{variant}: done", file=sys.stderr)
    return "\n".join(rows)


def headroom_table(projects: dict[str, Path], smoke: bool = False) -> str:
    """Each project's `data_headroom` at its defaults (`smoke`: 5 batches, 2 steps)."""
    arguments = ["--batches", "5", "--steps", "2"] if smoke else []
    rows = [
        "| project | loader ms / micro-batch | step ms | headroom |",
        "| --- | --- | --- | --- |",
    ]
    for variant, project in projects.items():
        package = next((project / "src").glob("*/train.py")).parent.name
        script = (
            f"import json; from {package}.data_headroom import main; "
            f"print(json.dumps(main({[*arguments, 'device=cpu']!r})))"
        )
        command = [sys.executable, "-c", script]
        result = subprocess.run(
            command, cwd=project, env=quiet_env(project), capture_output=True, text=True
        )
        if result.returncode != 0:
            raise SystemExit(f"error: data_headroom of {variant} failed:\n{result.stderr[-3000:]}")
        figures = json.loads(result.stdout.splitlines()[-1])
        loader_ms = 1e3 * figures["loader_seconds_per_batch"]
        step_ms = 1e3 * figures["step_seconds"]
        rows.append(f"| {variant} | {loader_ms:.3f} | {step_ms:.2f} | {figures['headroom']:.1f}x |")
    return "\n".join(rows)


def machine_line() -> str:
    today = datetime.date.today().isoformat()
    return (
        f"{today}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, Python {platform.python_version()}, one torch thread"
    )


def write_readme(text: str) -> None:
    readme = BENCH / "README.md"
    content = readme.read_text()
    start, end = content.index(MARKERS[0]), content.index(MARKERS[1])
    readme.write_text(content[: start + len(MARKERS[0])] + "\n" + text + "\n" + content[end:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per loop (median taken)")
    parser.add_argument("--readme", action="store_true", help="write the tables into README.md")
    parser.add_argument("--smoke", action="store_true", help="check every row runs (seconds)")
    args = parser.parse_args()
    if args.smoke and args.readme:
        raise SystemExit("error: --smoke figures are not measurements; drop --readme")
    if args.smoke:
        args.repeats = 1
    if args.repeats < 1:
        raise SystemExit("error: --repeats must be at least 1")
    with tempfile.TemporaryDirectory() as scratch:
        projects = {variant: Path(scratch) / variant for variant in PROJECTS}
        with fresh_template_cache():
            for variant, project in projects.items():
                render_variant(variant, project)
        text = "\n\n".join(
            [
                f"Machine: {machine_line()}.",
                "Loop overhead (fp32, CPU):\n\n" + loop_table(projects, args.repeats, args.smoke),
                "Data-loading headroom (defaults, CPU):\n\n" + headroom_table(projects, args.smoke),
            ]
        )
    print(text)
    if args.readme:
        write_readme(text)


if __name__ == "__main__":
    main()
