"""Import and export of a Hugging Face model folder: the rendered project's against transformers'.

A ~300M-parameter random Llama-shaped model (27 layers of width 1024, 16 heads sharing 4
key-value heads, SwiGLU of 2816, the byte project's 257-token vocabulary) is saved by
transformers twice: as one model.safetensors, and sharded at 500 MB with an index. Each
measurement runs in a fresh process (Linux: peak resident memory reset after the imports):

- import, project: `build_on_meta` + `materialize` with `init_from` (one process, as every engine
  builds; the folder's tensors read one at a time into the model's own);
- import, transformers: `AutoModelForCausalLM.from_pretrained(folder)`;
- export, project: `hub.export_folder` from a run's weights file (one tensor at a time);
- export, transformers: `model.save_pretrained(out)` of the model it loaded (the load not timed,
  the memory it holds not counted: peak growth during the save only).

Usage: .venv/bin/python bench/hub_io.py [--work DIR]   (about 2 minutes on 2 cores, 6 GB of disk)
`--smoke`: every row at SMOKE_SHAPE (a 2-layer model sharded at SMOKE_SHARD), a check that the
script still runs against the sample and transformers (seconds), not a figure to keep.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "generated_samples" / "lm-cpu-single-fp32"
PACKAGE = "lm_cpu_single_fp32"
SHAPE = {
    "vocab_size": 257,
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
}
SHARD = "500MB"
SMOKE_SHAPE = SHAPE | {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
SMOKE_SHARD = "100KB"  # ~150 KB a layer: one shard a layer

MEASURE = r"""
import json, sys, time
from pathlib import Path
def resident(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
import torch, transformers, safetensors
from {package}.config import load_config
from {package}.engine import build_on_meta, materialize
from {package}.hub import export_folder, read_architecture
kind, folder, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
model = None
if kind == "export-transformers":
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
Path("/proc/self/clear_refs").write_text("5")
before, start = resident("VmRSS"), time.perf_counter()
if kind == "import-project":
    overrides = [f"init_from={{folder}}", "model_family=llama"]
    config = load_config("{sample}/configs/train.toml", overrides)
    model = materialize(build_on_meta(config), torch.device("cpu"), 0)
elif kind == "import-transformers":
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
elif kind == "export-project":
    export_folder(folder / "model.safetensors", read_architecture(folder), out)
else:
    model.save_pretrained(out)
seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "growth": resident("VmHWM") - before}}))
"""


def measure(kind: str, folder: Path, out: Path) -> dict:
    """One measurement in a fresh process: {"seconds", "growth" (peak resident bytes)}."""
    code = MEASURE.format(package=PACKAGE, sample=SAMPLE)
    env = {"PYTHONPATH": str(SAMPLE / "src"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-c", code, kind, str(folder), str(out)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def save_checkpoints(work: Path, shape: dict[str, int], shard: str) -> dict[str, Path]:
    """A random Llama of `shape` saved by transformers, in one file and sharded at `shard`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**shape))
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params:,} parameters, {4 * params / 2**30:.2f} GiB in fp32")
    folders = {"one file": work / "single", f"sharded ({shard})": work / "sharded"}
    model.save_pretrained(folders["one file"], max_shard_size="20GB")
    model.save_pretrained(folders[f"sharded ({shard})"], max_shard_size=shard)
    return folders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, help="scratch folder (default: a temporary one)")
    parser.add_argument("--smoke", action="store_true", help="check every row runs (seconds)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="hub-io-"))
    try:
        shape, shard = (SMOKE_SHAPE, SMOKE_SHARD) if args.smoke else (SHAPE, SHARD)
        folders = save_checkpoints(work, shape, shard)
        columns = ("checkpoint", "operation", "project s", "transformers s", "project MiB")
        print(f"| {' | '.join(columns)} | transformers MiB |")
        print("| --- | --- | ---: | ---: | ---: | ---: |")
        for label, folder in folders.items():
            for operation in ("import", "export"):
                if operation == "export" and label != "one file":
                    continue  # the project exports from a run's one weights file
                ours = measure(f"{operation}-project", folder, work / "out")
                theirs = measure(f"{operation}-transformers", folder, work / "out")
                print(
                    f"| {label} | {operation} | {ours['seconds']:.1f} | {theirs['seconds']:.1f} "
                    f"| {ours['growth'] / 2**20:.0f} | {theirs['growth'] / 2**20:.0f} |"
                )
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"({time.perf_counter() - started:.0f} s)")
