"""The planner's memory model against measurement: `python bench/memory.py [--device cuda]
[--readme] [--smoke]`.

Each row builds the rendered language model (a committed sample under generated_samples/, so
neither copier nor scaffold's CLI is needed) at one size, micro-batch and activation
checkpointing setting, in a fresh process, trains it for a few optimizer steps (forward,
backward, AdamW) through the project's own Engine and `train_step`, and measures the peak:

- CPU: the growth of the process's peak resident memory (`VmHWM`, reset through
  /proc/self/clear_refs) over the steps, with glibc's mmap threshold lowered so that a freed
  tensor's pages go back to the system at once (else the heap keeps them and the peak counts
  them again). One step of a tiny model runs first, so the code that loads on first use (the
  optimizer's first step imports torch._dynamo: ~80 MB resident) is not counted as training
  memory. FSDP2 rows run 2 gloo processes and take the larger rank.
- CUDA: `torch.cuda.max_memory_allocated`, what PyTorch's allocator handed out at most.

The prediction is `scaffold.memory.estimate` for the same shape, strategy, precision, process
count and micro-batch. The target is within +-25% of the measurement on every row.

`--images` measures the image backbones instead (in an environment with timm: .venv-vision):
IMAGE_ROWS each train a `TimmClassifier` (the committed sample's backbone.py, imported by path)
of 10 classes for STEPS AdamW steps on the CPU (fp32, or bf16 under CPU autocast; with or
without activation checkpointing) at each of the row's sizes, against
`estimate(backbone_shape(name, size, classes=10), strategy="single", precision=...,
checkpointing=...)`. The target there is +-15%. `--images --smoke`: IMAGE_SMOKE_ROWS, a check
that it runs.

`--smoke` measures SMOKE_ROWS on the CPU at a tiny size, each strategy and each checkpointing
setting once: a check that the script still runs against the samples and the planner, not a
figure to keep.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import gc
import importlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

BLOCK_SIZE = {"cpu": 256, "cuda": 2048}  # tokens per sequence: CPUs run short ones
STEPS = 2  # the second step's forward and backward hold the optimizer state too
# (sample, strategy, precision, processes, model size, micro-batch) per device; each row runs
# with and without activation checkpointing.
ROWS = {
    "cpu": [
        ("lm-cpu-single-fp32", "single", "fp32", 1, "10M", 4),
        ("lm-cpu-single-fp32", "single", "fp32", 1, "10M", 16),
        ("lm-cpu-single-fp32", "single", "fp32", 1, "50M", 4),
        ("lm-cpu-single-fp32", "single", "fp32", 1, "50M", 16),
        ("lm-cpu-single-fp32", "single", "fp32", 1, "200M", 2),
        ("lm-cpu-single-fp32", "single", "fp32", 1, "200M", 8),
        ("fabric-lm-fsdp2-fp32", "fsdp2", "fp32", 2, "50M", 8),  # bf16 is ~100x slower on CPU
    ],
    "cuda": [
        ("lm-ddp-bf16", "ddp", "bf16", 1, "125M", 8),
        ("lm-ddp-bf16", "ddp", "bf16", 1, "350M", 8),
        ("lm-ddp-bf16", "ddp", "bf16", 1, "760M", 4),
        ("lm-ddp-bf16", "ddp", "bf16", 1, "1.3B", 4),
        ("lm-fsdp2-bf16", "fsdp2", "bf16", 1, "760M", 8),
    ],
}
SMOKE_ROWS = [  # (row, checkpointing), on the CPU
    (("lm-cpu-single-fp32", "single", "fp32", 1, "1M", 2), False),
    (("fabric-lm-fsdp2-fp32", "fsdp2", "fp32", 2, "1M", 2), True),
]
MARKERS = ("<!-- memory: start -->", "<!-- memory: end -->")
IMAGE_MARKERS = ("<!-- memory-images: start -->", "<!-- memory-images: end -->")
IMAGE_SAMPLE = "cpu-single-fp32"  # whose backbone.py builds the TimmClassifier
IMAGE_ROWS = [  # (timm backbone, micro-batch, image sizes in pixels, precision, checkpointing)
    ("resnet18", 8, (112, 224), "fp32", False),
    ("resnet50", 8, (112, 224), "fp32", False),
    ("convnext_tiny", 8, (112, 224), "fp32", False),
    ("efficientnet_b0", 8, (112, 224), "fp32", False),
    ("vit_small_patch16_224", 8, (224,), "fp32", False),  # a ViT takes its own image size only
    # not in the activations table: the nearest-family estimates
    ("resnet34", 8, (112, 224), "fp32", False),
    ("convnext_small", 8, (112, 224), "fp32", False),
    # the activations table's bf16 rows: CPU autocast
    ("resnet18", 8, (224,), "bf16", False),
    ("resnet50", 8, (224,), "bf16", False),
    ("convnext_tiny", 8, (224,), "bf16", False),
    ("vit_small_patch16_224", 8, (224,), "bf16", False),
    # activation checkpointing per shard unit (the units' inputs, `unit_input`)
    ("resnet50", 8, (224,), "fp32", True),
    ("convnext_tiny", 8, (224,), "fp32", True),
    ("efficientnet_b0", 8, (224,), "fp32", True),
    ("vit_small_patch16_224", 8, (224,), "fp32", True),
]
IMAGE_SMOKE_ROWS = [("resnet10t", 2, (64,), "fp32", True)]
IMAGE_CLASSES = 10


def child(sample: str, size: str, micro: int, checkpointing: bool, device: str) -> None:
    """Measure one row in this process; write its JSON into $MEMORY_BENCH_OUT/rank<R>.json."""
    import torch

    package = sample.replace("-", "_")
    sys.path.insert(0, str(ROOT / "generated_samples" / sample / "src"))
    modules = {
        name: importlib.import_module(f"{package}.{name}")
        for name in ("config", "engine", "runtime", "train", "training")
    }
    block_size = BLOCK_SIZE[device]
    overrides = [f"model_size={size}", f"block_size={block_size}", f"micro_batch_size={micro}"]
    overrides += [f"activation_checkpointing={'true' if checkpointing else 'false'}"]
    overrides += [f"device={device}", "dropout=0.0", "grad_accum_steps=1"]
    config = modules["config"].load_config(None, overrides)
    runtime = modules["runtime"].init_runtime(device)
    tokens = [torch.randint(0, 256, (micro, block_size + 1)) for _ in range(STEPS)]
    batches = [(window[:, :-1], window[:, 1:]) for window in tokens]

    def train(config) -> Any:
        model = modules["engine"].build_on_meta(config)
        make_optimizer = functools.partial(modules["training"].build_optimizer, config=config)
        engine = modules["engine"].Engine(model, make_optimizer, runtime, config)
        scheduler = modules["training"].build_scheduler(engine.optimizer, config, total_steps=100)
        for batch in batches:
            modules["train"].train_step(engine, scheduler, [batch], 1, config.max_grad_norm)
        return engine

    train(dataclasses.replace(config, model_size="30K"))  # first-use code and buffers
    gc.collect()  # the warm-up's engine, whatever cycles its wrappers made
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # peak resident size := current
        before = resident("VmRSS")
    engine = train(config)
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = resident("VmHWM") - before
    params = sum(parameter.numel() for parameter in engine.model.parameters())
    out = Path(os.environ["MEMORY_BENCH_OUT"]) / f"rank{runtime.rank}.json"
    out.write_text(json.dumps({"peak": peak, "params": params}))


def image_child(name: str, size: int, micro: int, precision: str, checkpointing: bool) -> None:
    """Measure one image row in this process (the CPU's `VmHWM` growth over STEPS AdamW steps
    of a TimmClassifier in fp32, or in bf16 under CPU autocast; with `checkpointing`, each
    shard unit checkpointed as the rendered engine/build.py's `checkpoint_units` does); write
    its JSON into $MEMORY_BENCH_OUT/rank0.json."""
    import importlib.util
    import warnings

    import torch
    from torch.utils.checkpoint import checkpoint

    warnings.simplefilter("ignore")  # TimmClassifier warns of its random initialisation
    path = ROOT / "generated_samples" / IMAGE_SAMPLE / "src" / IMAGE_SAMPLE.replace("-", "_")
    spec = importlib.util.spec_from_file_location("backbone", path / "backbone.py")
    backbone = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backbone)

    def train(name: str, size: int, micro: int) -> Any:
        model = backbone.TimmClassifier(name, IMAGE_CLASSES, dropout=0.1)
        for unit in model.shard_units() if checkpointing else ():
            unit.forward = functools.partial(checkpoint, unit.forward, use_reentrant=False)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
        for _ in range(STEPS):
            images = torch.randn(micro, 3, size, size)
            labels = torch.randint(0, IMAGE_CLASSES, (micro,))
            optimizer.zero_grad(set_to_none=True)
            with autocast:
                logits = model(images)
            torch.nn.functional.cross_entropy(logits.float(), labels).backward()
            optimizer.step()
        return model

    train("resnet10t", 32, 1)  # first-use code and buffers
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # peak resident size := current
    before = resident("VmRSS")
    model = train(name, size, micro)
    peak = resident("VmHWM") - before
    params = sum(parameter.numel() for parameter in model.parameters())
    out = Path(os.environ["MEMORY_BENCH_OUT"]) / "rank0.json"
    out.write_text(json.dumps({"peak": peak, "params": params}))


def image_table(rows: list[tuple[str, int, tuple[int, ...], str, bool]]) -> str:
    """The markdown table of the image rows, each at each of its sizes: measured and predicted
    (one process)."""
    sys.path.insert(0, str(ROOT))
    from scaffold.backbones import backbone_shape
    from scaffold.memory import estimate, gib

    lines = [
        "| backbone | parameters | precision | image px | micro-batch | checkpointing "
        "| activations from | predicted GiB | measured GiB | predicted / measured |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, micro, sizes, precision, checkpointing in rows:
        for size in sizes:
            script = [str(Path(__file__).resolve()), "--image-child", name, str(size), str(micro)]
            script += [precision, str(int(checkpointing))]
            measured = measure_script(script, f"{name} {size} px")
            shape = backbone_shape(name, size, classes=IMAGE_CLASSES)
            assert shape.params == measured["params"], (shape.params, measured)
            predicted = estimate(
                shape,
                strategy="single",
                precision=precision,
                world_size=1,
                micro_batch=micro,
                checkpointing=checkpointing,
                dropout=0.1,
            ).peak
            ratio = predicted / measured["peak"]
            lines.append(
                f"| {name} | {shape.params:,} | {precision} | {size} | {micro} | "
                f"{'on' if checkpointing else 'off'} | {shape.measured} | "
                f"{gib(predicted)} | {gib(measured['peak'])} | {ratio:.2f} |"
            )
            print(lines[-1], file=sys.stderr, flush=True)
    return "\n".join(lines)


def measure_script(script: list[str], what: str) -> dict:
    """Run this script's `script` arguments in a fresh process, as `measure` does (one
    process, glibc's mmap threshold lowered); its figures."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    with tempfile.TemporaryDirectory() as out:
        env["MEMORY_BENCH_OUT"] = out
        result = subprocess.run([sys.executable, *script], env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"error: {what} failed:\n{result.stderr[-3000:]}")
        return json.loads((Path(out) / "rank0.json").read_text())


def resident(field: str) -> int:
    """`VmRSS` or `VmHWM` of this process in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise SystemExit(f"error: no {field} in /proc/self/status (Linux only)")


def measure(row: tuple, checkpointing: bool, device: str) -> dict:
    """Run one row in fresh processes (torchrun for several); the largest rank's figures."""
    sample, _, _, processes, size, micro = row
    script = [str(Path(__file__).resolve()), "--child", sample, size, str(micro)]
    script += [str(int(checkpointing)), device]
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone"]
        launcher += [f"--nproc-per-node={processes}"]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // processes))}
    env["MALLOC_MMAP_THRESHOLD_"] = "65536"  # freed tensors leave the resident set at once
    with tempfile.TemporaryDirectory() as out:
        env["MEMORY_BENCH_OUT"] = out
        result = subprocess.run([*launcher, *script], env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"error: {row} failed:\n{result.stderr[-3000:]}")
        figures = [json.loads(path.read_text()) for path in Path(out).glob("rank*.json")]
    return max(figures, key=lambda figure: figure["peak"])


def device_rows(device: str, first: int | None = None) -> list[tuple[tuple, bool]]:
    """`device`'s rows (the first `first`), each without and with activation checkpointing."""
    return [(row, checkpointing) for row in ROWS[device][:first] for checkpointing in (False, True)]


def table(device: str, rows: list[tuple[tuple, bool]]) -> str:
    """The markdown table of `rows` ((row, checkpointing) pairs), measured on `device` and
    predicted."""
    sys.path.insert(0, str(ROOT))  # scaffold from this checkout: the GPU machine installs none
    from scaffold.answers import parse_model_size
    from scaffold.memory import estimate, gib
    from scaffold.shapes import decoder_for

    lines = [
        "| strategy | precision | processes | model | parameters | micro-batch | checkpointing "
        "| predicted GiB | measured GiB | predicted / measured |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row, checkpointing in rows:
        _, strategy, precision, processes, size, micro = row
        measured = measure(row, checkpointing, device)
        shape = decoder_for(parse_model_size(size), BLOCK_SIZE[device])
        assert shape.params == measured["params"], (shape, measured)
        predicted = estimate(
            shape,
            strategy=strategy,
            precision=precision,
            world_size=processes,
            micro_batch=micro,
            checkpointing=checkpointing,
        ).peak
        ratio = predicted / measured["peak"]
        lines.append(
            f"| {strategy} | {precision} | {processes} | {size} | {shape.params:,} | {micro} "
            f"| {'on' if checkpointing else 'off'} | {gib(predicted)} | "
            f"{gib(measured['peak'])} | {ratio:.2f} |"
        )
        print(lines[-1], file=sys.stderr, flush=True)
    return "\n".join(lines)


def machine_line(device: str) -> str:
    import torch

    today = datetime.date.today().isoformat()
    name = torch.cuda.get_device_name() if device == "cuda" else platform.machine()
    return f"{today}, {name}, {os.cpu_count()} cores, torch {torch.__version__}"


def write_readme(text: str, markers: tuple[str, str] = MARKERS) -> None:
    readme = ROOT / "bench" / "README.md"
    content = readme.read_text()
    start, end = content.index(markers[0]), content.index(markers[1])
    readme.write_text(content[: start + len(markers[0])] + "\n" + text + "\n" + content[end:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--readme", action="store_true", help="write the table into README.md")
    parser.add_argument("--first", type=int, help="only the first N rows (a rehearsal)")
    parser.add_argument("--smoke", action="store_true", help="check every kind of row runs")
    parser.add_argument("--images", action="store_true", help="the image backbones' rows")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--image-child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.image_child:
        name, size, micro, precision, checkpointing = args.image_child
        image_child(name, int(size), int(micro), precision, checkpointing == "1")
        return
    if args.images:
        if args.device != "cpu" or (args.smoke and args.readme):
            raise SystemExit("error: --images runs on the CPU; drop --device (and --readme)")
        rows = IMAGE_SMOKE_ROWS if args.smoke else IMAGE_ROWS[: args.first]
        text = (
            f"Machine: {machine_line('cpu')}; {STEPS} AdamW steps per row, "
            f"{IMAGE_CLASSES} classes.\n\n{image_table(rows)}"
        )
        print(text)
        if args.readme:
            write_readme(text, IMAGE_MARKERS)
        return
    if args.smoke and (args.readme or args.device != "cpu"):
        raise SystemExit("error: --smoke runs tiny rows on the CPU; drop --readme and --device")
    if args.child:
        sample, size, micro, checkpointing, device = args.child
        child(sample, size, int(micro), checkpointing == "1", device)
        return
    rows = SMOKE_ROWS if args.smoke else device_rows(args.device, args.first)
    text = (
        f"Machine: {machine_line(args.device)}; context {BLOCK_SIZE[args.device]}, {STEPS} "
        f"optimizer steps per row.\n\n{table(args.device, rows)}"
    )
    print(text)
    if args.readme:
        write_readme(text)


if __name__ == "__main__":
    main()
