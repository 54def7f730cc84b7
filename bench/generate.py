"""Decoding speed: the rendered project's `generate` against transformers' `generate`, on CPU.

A random model of each family (a Llama of width 512, 8 layers, 8 heads sharing 4 key-value
heads; a GPT-2 of the same width and depth; the byte project's 257-token vocabulary, 1,024
positions) is saved by transformers as a model folder. Both read it: the project through
`inference.sources.folder_model` and `inference.decode.Decoder` (what `generate --model FOLDER`
runs), transformers through `AutoModelForCausalLM.from_pretrained(folder).generate(...)`. Each
continues the same random prompt of 64 and of 512 tokens greedily by NEW_TOKENS tokens, not
stopped early (transformers: `min_new_tokens`, no `eos_token_id`); the time covers the prompt's
prefill and every new token, best of `--repeats` after one untimed run. The table says whether
the two produced the same tokens; where not, whether the project's are those of transformers'
own forward pass over the whole sequence at each step (its cached `generate` then rounded a
near-tie of a random model the other way).

Usage: .venv/bin/python bench/generate.py [--repeats 3]   (about a minute on 2 cores)
`--smoke`: a 2-layer model of width 64, 8 new tokens, one repeat: a check that the script still
runs against the sample and transformers (seconds), not a figure to keep.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "generated_samples" / "lm-cpu-single-fp32"
PACKAGE = "lm_cpu_single_fp32"
# Weights drawn at 0.1 (transformers' default: 0.02) give peaked logits, so that greedy choices
# are not near-ties that float rounding may flip: the two decoders' tokens can be compared.
INIT_STD = 0.1
SHAPES = {
    "llama": {
        "vocab_size": 257,
        "hidden_size": 512,
        "intermediate_size": 1408,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "max_position_embeddings": 1024,
    },
    "gpt2": {"vocab_size": 257, "n_embd": 512, "n_layer": 8, "n_head": 8, "n_positions": 1024},
}
SMOKE_LLAMA = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
SMOKE_SHAPES = {
    "llama": SHAPES["llama"] | SMOKE_LLAMA,
    "gpt2": SHAPES["gpt2"] | {"n_embd": 64, "n_layer": 2},
}
CONTEXTS = (64, 512)
NEW_TOKENS = 128
SMOKE_NEW_TOKENS = 8


def save_model(family: str, shape: dict, folder: Path) -> None:
    """A seeded random model of `family` at `shape`, saved by transformers into `folder`."""
    import transformers

    torch.manual_seed(0)
    if family == "llama":
        config = transformers.LlamaConfig(**shape, initializer_range=INIT_STD)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.GPT2Config(**shape, initializer_range=INIT_STD)
        config.bos_token_id = config.eos_token_id = None  # GPT-2's 50256 is past this vocabulary
        model = transformers.GPT2LMHeadModel(config)
    model.save_pretrained(folder)


def timed(run, repeats: int) -> tuple[float, list[int]]:
    """The best of `repeats` timed calls of `run` (after one untimed), in seconds, and what the
    last returned."""
    out = run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - start)
    return best, out


def measure(folder: Path, context: int, new: int, repeats: int) -> dict:
    """Tokens per second of both decoders on `folder`'s model after a `context`-token prompt."""
    import transformers

    decode = importlib.import_module(f"{PACKAGE}.inference.decode")
    sources = importlib.import_module(f"{PACKAGE}.inference.sources")
    ours, architecture = sources.folder_model(folder, torch.device("cpu"))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    generator = torch.Generator().manual_seed(context)
    prompt = torch.randint(0, 257, (context,), generator=generator).tolist()

    def project() -> list[int]:
        decoder = decode.Decoder(ours, architecture.max_positions)
        return list(decoder.stream(prompt, new, decode.Sampling(temperature=0)))

    def reference() -> list[int]:
        with torch.no_grad():
            out = theirs.generate(
                torch.tensor([prompt]),
                do_sample=False,
                max_new_tokens=new,
                min_new_tokens=new,
                eos_token_id=None,
                pad_token_id=0,
            )
        return out[0, context:].tolist()

    project_seconds, project_tokens = timed(project, repeats)
    reference_seconds, reference_tokens = timed(reference, repeats)
    same = "yes" if project_tokens == reference_tokens else "NO"
    if same == "NO" and project_tokens == uncached_greedy(theirs, prompt, new):
        same = "no; = transformers' uncached"
    return {"project": new / project_seconds, "transformers": new / reference_seconds, "same": same}


def uncached_greedy(model, prompt: list[int], new: int) -> list[int]:
    """transformers' greedy tokens from a forward pass over the whole sequence for each (no
    cache): the reference where its cached `generate` rounds a near-tie the other way."""
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(new):
            tokens.append(int(model(torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(prompt) :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: does it still run")
    args = parser.parse_args()
    sys.path.insert(0, str(SAMPLE / "src"))
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    new = SMOKE_NEW_TOKENS if args.smoke else NEW_TOKENS
    repeats = 1 if args.smoke else args.repeats
    print(f"greedy decoding of {new} new tokens on CPU ({torch.get_num_threads()} threads)\n")
    print("| model | prompt tokens | project tokens/s | transformers tokens/s | ratio | same |")
    print("| --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as scratch:
        for family, shape in shapes.items():
            folder = Path(scratch) / family
            save_model(family, shape, folder)
            for context in CONTEXTS:
                row = measure(folder, context, new, repeats)
                ratio = row["project"] / row["transformers"]
                print(
                    f"| {family} | {context} | {row['project']:.1f} | {row['transformers']:.1f} "
                    f"| {ratio:.2f}x | {row['same']} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
