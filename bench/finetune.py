"""Fine-tuning on CPU: LoRA's memory against full fine-tuning's, and packed against padded chat
examples: `python bench/finetune.py [--memory] [--packing]` (both by default; ~5 minutes on 2
cores).

Memory: a random ~100M-parameter Llama-shaped model (12 layers of width 768, 12 heads sharing 4
key-value heads, SwiGLU of 2048, the byte project's 257-token vocabulary) is saved as a model
folder; the committed `lm-cpu-single-fp32` sample starts from it (`init_from`) and takes two
optimizer steps through its own Engine and `train_step`, once training every weight and once
with `finetune=lora` (rank 16 on every projection), each in a fresh process. The peak is the
growth of the process's peak resident memory from before the model is built (the import's
file reads left out: the peak is reset once the weights are loaded, as bench/memory.py resets
it after its warm-up), against `scaffold.memory.estimate` of the same shape, micro-batch and
adapters.

Packing: ~3,000 chat conversations of a realistic length spread (turn lengths drawn
log-normally: most short, a long tail; about ShareGPT's shape) rendered by a ChatML template on
byte tokens, prepared with `--format chat` (examples above 512 tokens dropped), and trained
for 30 optimizer steps on a 10M-parameter Llama-style model at `block_size` 512, micro-batch 8,
once with `pack=true` and once with `pack=false`. Rows/s and tokens/s come from the run summary
(positions, padding included), the padding shares from prepare's manifest; trained-token
throughput is tokens/s x (1 - padding).

`--smoke`: both tables at SMOKE's sizes (a 2-layer model, 100 conversations, 2 steps), a check
that every row is still produced (seconds), not a figure to keep.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import importlib
import json
import math
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = "lm-cpu-single-fp32"
PACKAGE = SAMPLE.replace("-", "_")
SHAPE = {"width": 768, "depth": 12, "heads": 12, "kv_heads": 4, "intermediate": 2048}


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The packing table's run: conversations prepared, the model, its context and steps."""

    conversations: int = 3000
    model_size: str = "10M"
    block_size: int = 512
    steps: int = 30


SMOKE_SHAPE = {"width": 64, "depth": 2, "heads": 4, "kv_heads": 2, "intermediate": 128}
SMOKE = Sizes(100, "100K", 512, 2)
BLOCK_SIZE, MICRO_BATCH, STEPS = 256, 4, 2
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def sample_env() -> dict[str, str]:
    source = str(ROOT / "generated_samples" / SAMPLE / "src")
    return {**os.environ, "PYTHONPATH": source, "OMP_NUM_THREADS": str(os.cpu_count() or 1)}


def resident(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise SystemExit(f"error: no {field} in /proc/self/status (Linux only)")


def write_model(folder: Path, shape_of: dict[str, int]) -> None:
    """A random Llama of `shape_of` (SHAPE's keys) as a model folder (config.json,
    model.safetensors)."""
    sys.path.insert(0, str(ROOT / "generated_samples" / SAMPLE / "src"))
    from safetensors.torch import save_file

    llama = importlib.import_module(f"{PACKAGE}.models.llama")
    hub = importlib.import_module(f"{PACKAGE}.hub")
    shape = llama.LlamaShape(257, max_positions=BLOCK_SIZE, **shape_of)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(llama.Llama(shape).state_dict(), folder / "model.safetensors")
    config = hub.hub_config(hub.Architecture("llama", "llama", shape))
    (folder / "config.json").write_text(json.dumps(config))
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())  # the 256 bytes and end-of-text: the model's 257
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=257,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(["a"], trainer)
    tokenizer.save(str(folder / "tokenizer.json"))


def memory_child(folder: str, finetune: str, out: str) -> None:
    """Two optimizer steps from `folder` with `finetune`; the peak growth into `out`."""
    import torch

    sys.path.insert(0, str(ROOT / "generated_samples" / SAMPLE / "src"))
    modules = {
        name: importlib.import_module(f"{PACKAGE}.{name}")
        for name in ("config", "engine", "runtime", "train", "training")
    }
    overrides = [f"init_from={folder}", "model_family=llama", f"tokenizer={folder}/tokenizer.json"]
    overrides += [f"finetune={finetune}", f"block_size={BLOCK_SIZE}", "device=cpu"]
    overrides += [f"micro_batch_size={MICRO_BATCH}", "grad_accum_steps=1"]
    overrides += ["activation_checkpointing=false"]
    config = modules["config"].load_config(None, overrides)
    runtime = modules["runtime"].init_runtime("cpu")
    tokens = [torch.randint(0, 257, (MICRO_BATCH, BLOCK_SIZE + 1)) for _ in range(STEPS)]
    batches = [(window[:, :-1], window[:, 1:]) for window in tokens]
    gc.collect()
    before = resident("VmRSS")
    model = modules["engine"].build_on_meta(config)
    make_optimizer = functools.partial(modules["training"].build_optimizer, config=config)
    engine = modules["engine"].Engine(model, make_optimizer, runtime, config)
    Path("/proc/self/clear_refs").write_text("5")  # the weights' file reads are over
    scheduler = modules["training"].build_scheduler(engine.optimizer, config, total_steps=100)
    for batch in batches:
        modules["train"].train_step(engine, scheduler, [batch], 1, config.max_grad_norm)
    peak = resident("VmHWM") - before
    trained = sum(p.numel() for p in engine.model.parameters() if p.requires_grad)
    Path(out).write_text(json.dumps({"peak": peak, "trained": trained}))


def memory_rows(work: Path, shape_of: dict[str, int]) -> list[str]:
    """Measured and predicted peaks of full fine-tuning and LoRA of a `shape_of` model."""
    from scaffold.hub_folder import read_hub_folder
    from scaffold.memory import estimate

    folder = work / "model"
    write_model(folder, shape_of)
    shape = read_hub_folder(str(folder), BLOCK_SIZE)
    rows = ["| finetune | trained parameters | measured peak | predicted | measured / predicted |"]
    rows.append("| --- | --- | --- | --- | --- |")
    for finetune in ("full", "lora"):
        out = work / f"{finetune}.json"
        command = [sys.executable, __file__, "--memory-child", str(folder), finetune, str(out)]
        env = sample_env() | {"MALLOC_MMAP_THRESHOLD_": "65536"}
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"error: {finetune} failed:\n{done.stderr[-3000:]}")
        measured = json.loads(out.read_text())
        adapters = shape.lora_parameters(16) if finetune == "lora" else 0
        predicted = estimate(
            shape,
            strategy="single",
            precision="fp32",
            world_size=1,
            micro_batch=MICRO_BATCH,
            checkpointing=False,
            adapters=adapters,
        ).peak
        rows.append(
            f"| {finetune} | {measured['trained']:,} | {measured['peak'] / 2**20:,.0f} MiB | "
            f"{predicted / 2**20:,.0f} MiB | {measured['peak'] / predicted:.2f} |"
        )
    return rows


def conversations(count: int, seed: int = 0) -> list[dict]:
    """Chat records whose turns' lengths (in bytes) are log-normal: median ~50 bytes for a
    question, ~150 for a reply, a long tail; one to three exchanges, some with a system turn."""
    rng = random.Random(seed)
    words = ["the", "of", "model", "data", "train", "step", "loss", "batch", "token"]

    def text(median: float) -> str:
        length = max(4, int(rng.lognormvariate(math.log(median), 0.9)))
        out = []
        while sum(len(word) + 1 for word in out) < length:
            out.append(rng.choice(words))
        return " ".join(out)

    records = []
    for _ in range(count):
        messages = [{"role": "system", "content": text(40)}] if rng.random() < 0.3 else []
        for _ in range(rng.choice((1, 1, 2, 3))):
            messages.append({"role": "user", "content": text(50)})
            messages.append({"role": "assistant", "content": text(150)})
        records.append({"messages": messages})
    return records


def packing_rows(work: Path, sizes: Sizes) -> list[str]:
    """Packed against one example a row: rows/s, tokens/s, padding, trained tokens/s."""
    source, template = work / "chat.jsonl", work / "chatml.jinja"
    source.write_text(
        "".join(json.dumps(record) + "\n" for record in conversations(sizes.conversations))
    )
    template.write_text(CHATML)
    data = work / "chat"
    prepare = [sys.executable, "-m", f"{PACKAGE}.prepare", str(source), "--out", str(data)]
    prepare += ["--format", "chat", "--tokenizer", "bytes", "--chat-template", str(template)]
    config = ROOT / "generated_samples" / SAMPLE / "configs" / "train.toml"
    prepare += ["--max-example-tokens", str(sizes.block_size), "--config", str(config)]
    done = subprocess.run(prepare, env=sample_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: prepare failed:\n{done.stderr[-3000:]}")
    rows = ["| rows | rows/s | positions/s | padding | example tokens/s (padding left out) |"]
    rows.append("| --- | --- | --- | --- | --- |")
    for pack in ("false", "true"):
        run = work / f"run-{pack}"
        train = [sys.executable, "-m", f"{PACKAGE}.train", f"data_dir={data}", f"run_dir={run}"]
        train += ["prepare_example=false", f"model_size={sizes.model_size}", "device=cpu"]
        train += [f"block_size={sizes.block_size}", "micro_batch_size=8", "grad_accum_steps=1"]
        train += [f"max_steps={sizes.steps}", f"val_every={sizes.steps}", "val_batches=2"]
        train += ["model_family=llama", "tensorboard=false", "plot=false"]
        train += [f"pack={pack}", "checkpoint_every=0"]
        cwd = ROOT / "generated_samples" / SAMPLE
        done = subprocess.run(train, env=sample_env(), capture_output=True, text=True, cwd=cwd)
        if done.returncode != 0:
            raise SystemExit(f"error: pack={pack} failed:\n{done.stderr[-3000:]}")
        summary = json.loads((run / "summary.json").read_text())
        padding = summary["padding_packed" if pack == "true" else "padding_unpacked"]
        rows.append(
            f"| {'packed' if pack == 'true' else 'one example a row'} | "
            f"{summary['samples_per_second']:,.1f} | {summary['tokens_per_second']:,.0f} | "
            f"{padding:.1%} | {summary['tokens_per_second'] * (1 - padding):,.0f} |"
        )
    return rows


def main() -> None:
    if sys.argv[1:2] == ["--memory-child"]:
        memory_child(*sys.argv[2:5])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory", action="store_true", help="LoRA against full fine-tuning")
    parser.add_argument("--packing", action="store_true", help="packed against padded")
    parser.add_argument("--smoke", action="store_true", help="check every row runs (seconds)")
    args = parser.parse_args()
    both = not (args.memory or args.packing)
    shape, sizes = (SMOKE_SHAPE, SMOKE) if args.smoke else (SHAPE, Sizes())
    with tempfile.TemporaryDirectory() as scratch:
        if args.memory or both:
            print("\n".join(memory_rows(Path(scratch), shape)), flush=True)
        if args.packing or both:
            print("\n".join(packing_rows(Path(scratch), sizes)), flush=True)


if __name__ == "__main__":
    main()
