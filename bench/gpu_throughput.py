"""Language-model throughput on one GPU: the rendered loop against a bare loop, same config.

    python bench/gpu_throughput.py                  # on a CUDA GPU, a few minutes
    python bench/gpu_throughput.py --device cpu     # rehearse at a tiny size on a CPU
    python bench/gpu_throughput.py --smoke          # check every row runs (seconds, on a CPU)

Trains the committed `generated_samples/lm-ddp-bf16` project (bf16 autocast, fused AdamW, TF32;
DDP with world size 1, in-process) at a GPT-2-small-class size (`--model-size 124M`, context
`--block-size 1024`) with `bench/loops.py`, with and without `torch.compile`, beside the bare
loop at the same settings; runs alternate, `--repeats` times, median kept. Prints tokens/s,
MFU and the rendered / bare ratio. MFU counts 6 N FLOPs per token (N parameters; Kaplan et
al. 2020) over the dense bf16 peak of the detected GPU (the project's `task.PEAK_FLOPS`, from
NVIDIA's data sheets); it leaves out attention's FLOPs, so it reads a little low at long contexts.

`--smoke` is the rehearsal with one repeat of the smallest run (bench/loops.py's `--smoke`),
and torch.compile switched off by its own switch (TORCH_COMPILE_DISABLE=1: inductor's C++
build of the kernels takes a minute on a CPU), so it checks that the script and both loops
still run against the rendered project in seconds, not how fast.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "generated_samples" / "lm-ddp-bf16"
REHEARSAL = {"model_size": "200K", "block_size": "64", "micro_batch": 8}  # --device cpu


def time_loops(
    loops: list[str], epochs: int, settings: list[str], workdir: Path, smoke: bool
) -> list[dict]:
    """One fresh-process run of bench/loops.py on PROJECT in `workdir` (where the project's
    example corpus is prepared, once for every run); its JSON result for each of `loops`."""
    names = ",".join(loops)
    command = [sys.executable, str(ROOT / "bench" / "loops.py"), str(PROJECT), names, str(epochs)]
    env = {**os.environ, "PYTHONPATH": str(PROJECT / "src")}
    if smoke:
        command.append("--smoke")
        env["TORCH_COMPILE_DISABLE"] = "1"
    result = subprocess.run(
        [*command, *settings], env=env, capture_output=True, text=True, cwd=workdir
    )
    if result.returncode != 0:
        raise SystemExit(f"error: the {names} loop failed:\n{result.stderr[-3000:]}")
    return [json.loads(line) for line in result.stdout.splitlines()[-len(loops) :]]


def mfu(tokens_per_second: float, parameters: int, device: str) -> float | None:
    """Model FLOPs utilisation by the project's own rule (None on a CPU or an unknown GPU)."""
    if str(PROJECT / "src") not in sys.path:
        sys.path.insert(0, str(PROJECT / "src"))
    task = importlib.import_module("lm_ddp_bf16.task")
    return task.model_flops_utilization(6 * parameters * tokens_per_second, device)


def throughput_rows(args: argparse.Namespace, settings: list[str], workdir: Path) -> int:
    """Print the table's rows, without and with torch.compile; the model's parameter count."""
    for compiled in ("false", "true"):
        runs: dict[str, list[dict]] = {"bare": [], "rendered": []}
        arguments = [*settings, f"compile={compiled}"]
        for _ in range(args.repeats):
            # a measurement runs each loop in a process of its own; a smoke run both in one
            for loops in [list(runs)] if args.smoke else [[loop] for loop in runs]:
                results = time_loops(loops, args.epochs, arguments, workdir, args.smoke)
                for loop, result in zip(loops, results, strict=True):
                    runs[loop].append(result)
        rates = {
            loop: statistics.median(r["steps_per_second"] * r["tokens_per_step"] for r in results)
            for loop, results in runs.items()
        }
        parameters = runs["bare"][0]["parameters"]
        for loop, rate in rates.items():
            utilisation = mfu(rate, parameters, args.device)
            mfu_text = "n/a" if utilisation is None else f"{utilisation:.1%}"
            ratio = rate / rates["bare"]
            print(f"| {compiled} | {loop} | {rate:,.0f} | {mfu_text} | {ratio:.3f} |", flush=True)
    return parameters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu to rehearse")
    parser.add_argument("--model-size", default="124M")
    parser.add_argument("--block-size", type=int, default=1024, help="context, tokens")
    parser.add_argument("--micro-batch", type=int, default=32, help="sequences per step")
    parser.add_argument("--corpus-bytes", type=int, default=4_000_000)
    parser.add_argument("--epochs", type=int, default=2, help="the first is not timed")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="check every row runs (seconds)")
    args = parser.parse_args()
    if args.smoke:
        args.device, args.repeats, args.epochs = "cpu", 1, 2
    if args.device == "cpu":  # the script's own rehearsal, not a figure to keep
        args.model_size, args.block_size = REHEARSAL["model_size"], REHEARSAL["block_size"]
        args.micro_batch, args.corpus_bytes = REHEARSAL["micro_batch"], 200_000
    settings = [
        f"device={args.device}",
        f"model_size={args.model_size}",
        f"block_size={args.block_size}",
        f"micro_batch_size={args.micro_batch}",
        f"corpus_bytes={args.corpus_bytes}",
        "checkpoint_every=0",
        "log_every=50",
    ]
    print("| compile | loop | tokens/s | MFU | / bare |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="gpu-throughput-") as scratch:
        parameters = throughput_rows(args, settings, Path(scratch))
    sizes = "bench/loops.py's smoke sizes" if args.smoke else f"micro-batch {args.micro_batch}"
    print(f"\n{parameters:,} parameters, context {args.block_size}, {sizes}")


if __name__ == "__main__":
    main()
