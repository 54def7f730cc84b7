"""Language-model throughput on one GPU: the rendered loop against a bare loop, same config.

    python bench/gpu_throughput.py                  # on a CUDA GPU, a few minutes
    python bench/gpu_throughput.py --device cpu     # rehearse at a tiny size on a CPU

Trains the committed `generated_samples/lm-ddp-bf16` project (bf16 autocast, fused AdamW, TF32;
DDP with world size 1, in-process) at a GPT-2-small-class size (`--model-size 124M`, context
`--block-size 1024`) with `bench/loops.py`, with and without `torch.compile`, beside the bare
loop at the same settings; runs alternate, `--repeats` times, median kept. Prints tokens/s,
MFU and the rendered / bare ratio. MFU counts 6 N FLOPs per token (N parameters; Kaplan et
al. 2020) over the dense bf16 peak of the detected GPU (the project's `task.PEAK_FLOPS`, from
NVIDIA's data sheets); it leaves out attention's FLOPs, so it reads a little low at long contexts.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "generated_samples" / "lm-ddp-bf16"
REHEARSAL = {"model_size": "200K", "block_size": "64", "micro_batch": 8}  # --device cpu


def time_loop(loop: str, epochs: int, settings: list[str]) -> dict:
    """One fresh-process run of bench/loops.py on PROJECT; its JSON result."""
    command = [sys.executable, str(ROOT / "bench" / "loops.py"), str(PROJECT), loop, str(epochs)]
    env = {**os.environ, "PYTHONPATH": str(PROJECT / "src")}
    result = subprocess.run([*command, *settings], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"error: the {loop} loop failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.splitlines()[-1])


def mfu(tokens_per_second: float, parameters: int, device: str) -> float | None:
    """Model FLOPs utilisation by the project's own rule (None on a CPU or an unknown GPU)."""
    if str(PROJECT / "src") not in sys.path:
        sys.path.insert(0, str(PROJECT / "src"))
    task = importlib.import_module("lm_ddp_bf16.task")
    return task.model_flops_utilization(6 * parameters * tokens_per_second, device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu to rehearse")
    parser.add_argument("--model-size", default="124M")
    parser.add_argument("--block-size", type=int, default=1024, help="context, tokens")
    parser.add_argument("--micro-batch", type=int, default=32, help="sequences per step")
    parser.add_argument("--corpus-bytes", type=int, default=4_000_000)
    parser.add_argument("--epochs", type=int, default=2, help="the first is not timed")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
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
    for compiled in ("false", "true"):
        runs: dict[str, list[dict]] = {"bare": [], "rendered": []}
        for _ in range(args.repeats):
            for loop in runs:
                runs[loop].append(time_loop(loop, args.epochs, [*settings, f"compile={compiled}"]))
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
    print(f"\n{parameters:,} parameters, context {args.block_size}, micro-batch {args.micro_batch}")


if __name__ == "__main__":
    main()
