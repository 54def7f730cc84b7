"""The training stall per checkpoint, synchronous against background saves:
`python bench/checkpoint_stall.py [--model-size 50M] [--repeats 3] [--readme] [--smoke]`.

The language model at `--model-size` trains in a fresh process (or two, under torchrun, for the
sharded format) with a checkpoint every `EVERY` optimizer steps, once with
`async_checkpoint=false` and once with `true`; the run summary's `checkpoint_stall_seconds`
(the seconds the training thread spent in the saves) over `checkpoint_saves` is the stall per
checkpoint. Runs alternate between the two settings, `--repeats` times, and the median is given.

- single file: `lm-cpu-single-fp32`, one process, the whole state in one `engine.pt`;
- sharded: `lm-fsdp2-bf16`, two gloo processes, each writing its shards with
  torch.distributed.checkpoint (`async_save` in the background).

The target (issue 27): the stall with background saves at most a quarter of the synchronous one.
`--smoke` checks that every row is still produced (a 100K model on a 40 KB corpus, one run of
each), not the figures.
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

BENCH = Path(__file__).resolve().parent
SAMPLES = BENCH.parent / "generated_samples"
EVERY = 4  # optimizer steps between checkpoints
STEPS = 12  # three checkpoints a run: at 4, 8 and 12 (stop_after_steps)
FORMATS = {"single file": ("lm-cpu-single-fp32", 1), "sharded": ("lm-fsdp2-bf16", 2)}
MARKERS = ("<!-- checkpoint-stall: start -->", "<!-- checkpoint-stall: end -->")


CORPUS_BYTES = {False: 300_000, True: 40_000}  # the example corpus, by --smoke


def run(
    variant: str,
    processes: int,
    model_size: str,
    background: bool,
    scratch: Path,
    corpus_bytes: int = CORPUS_BYTES[False],
) -> dict:
    """The run summary of one training run of `variant` on `processes` processes."""
    run_dir = scratch / f"run-{variant}-{background}"
    settings = [
        "device=cpu",
        f"model_size={model_size}",
        "block_size=64",
        "micro_batch_size=4",
        "grad_accum_steps=1",
        f"corpus_bytes={corpus_bytes}",
        "tokenizer=bytes",
        f"data_dir={scratch / 'corpus'}",
        f"run_dir={run_dir}",
        f"checkpoint_every={EVERY}",
        f"stop_after_steps={STEPS}",
        "keep_last=1",
        "log_every=4",
        "tensorboard=false",
        "plot=false",
        "activation_checkpointing=false",
        f"async_checkpoint={str(background).lower()}",
    ]
    package = variant.replace("-", "_")
    launch = [sys.executable, "-m", f"{package}.train"]
    if processes > 1:
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        launch += [f"--nproc-per-node={processes}", "-m", f"{package}.train"]
    env = {**os.environ, "PYTHONPATH": str(SAMPLES / variant / "src"), "OMP_NUM_THREADS": "1"}
    env["TMPDIR"] = str(scratch)
    subprocess.run(
        [*launch, *settings], cwd=SAMPLES / variant, env=env, check=True, capture_output=True
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    return summary


def measure(model_size: str, repeats: int, corpus_bytes: int = CORPUS_BYTES[False]) -> list[dict]:
    """One row per format: the median stall per checkpoint and the median seconds per step
    (the run's training time over its steps, saves included), sync and async."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="stall-") as folder:
        scratch = Path(folder)
        for name, (variant, processes) in FORMATS.items():
            stalls: dict[bool, list[float]] = {False: [], True: []}
            steps: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(repeats):
                for background in (False, True):
                    summary = run(variant, processes, model_size, background, scratch, corpus_bytes)
                    saves = summary["checkpoint_saves"]
                    stalls[background].append(summary["checkpoint_stall_seconds"] / saves)
                    steps[background].append(summary["train_seconds"] / summary["steps"])
                    print(f"{name} async={background}: {stalls[background][-1]:.3f} s per save")
            sync, background = (statistics.median(stalls[key]) for key in (False, True))
            rows.append(
                {
                    "format": f"{name} ({variant}, {processes} process(es))",
                    "sync": sync,
                    "async": background,
                    "ratio": background / sync,
                    "step": statistics.median(steps[False]),
                    "step_async": statistics.median(steps[True]),
                }
            )
    return rows


def table(rows: list[dict], model_size: str, repeats: int) -> str:
    lines = [
        f"Measured {datetime.date.today()} on {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, one torch thread a process; the {model_size} decoder, "
        f"micro-batch 4 x 64 tokens, a checkpoint every {EVERY} steps, median of {repeats}.",
        "",
        "| format | stall per checkpoint, sync (s) | async (s) | async / sync "
        "| s per step, sync | s per step, async |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['format']} | {row['sync']:.3f} | {row['async']:.3f} | "
            f"{row['ratio']:.2f} | {row['step']:.2f} | {row['step_async']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def write_readme(text: str) -> None:
    readme = BENCH / "README.md"
    content = readme.read_text()
    start, end = MARKERS
    before, _, rest = content.partition(start)
    _, _, after = rest.partition(end)
    readme.write_text(f"{before}{start}\n{text}{end}{after}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-size", default="50M")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--readme", action="store_true", help="write the table into README.md")
    parser.add_argument("--smoke", action="store_true", help="check every row runs (seconds)")
    args = parser.parse_args()
    if args.smoke and args.readme:
        raise SystemExit("error: --smoke figures are not measurements; drop --readme")
    if args.smoke:
        args.model_size, args.repeats = "100K", 1
    rows = measure(args.model_size, args.repeats, CORPUS_BYTES[args.smoke])
    text = table(rows, args.model_size, args.repeats)
    print(text)
    if args.readme:
        write_readme(text)


if __name__ == "__main__":
    main()
