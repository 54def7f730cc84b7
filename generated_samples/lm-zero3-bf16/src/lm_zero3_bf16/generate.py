"""Sample from a trained model: `python -m lm_zero3_bf16.generate "PROMPT" [options]`.

Loads the run's config (`config.json` in its folder), its best weights (`model.safetensors`;
`--weights` names another file, e.g. `model-last.safetensors`) and the tokenizer it trained
with (the copy in its folder), then continues PROMPT one token at a time: temperature, then
the `top_k` most likely tokens, sampled with a seeded generator; temperature 0 takes the most
likely token. Ids past the tokenizer's vocabulary (a model's padding) are never sampled.
Stops after `--max-new-tokens` or at end-of-text.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from .checkpoint import WEIGHTS_FILE
from .config import Config, command_parser, load_config, user_errors
from .corpus import MANIFEST, RUN_MANIFEST, Codec, manifest_at, read_manifest
from .trained import load_trained


@torch.no_grad()
def generate(
    model: nn.Module,
    tokens: Tensor,
    max_new_tokens: int,
    block_size: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    eot_id: int | None = None,
    generator: torch.Generator | None = None,
    vocab_size: int | None = None,
) -> Tensor:
    """`tokens` (int64 `[1, T]`) followed by up to `max_new_tokens` sampled ones, each from the
    logits of the last `block_size` tokens (the context the model was trained at) over the
    first `vocab_size` ids (default: all; the rest pad the model's vocabulary and decode to
    nothing); stops after `eot_id`. `temperature` 0 is greedy. Returns int64 `[1, T + new]` on
    `tokens`'s device."""
    model.eval()
    for _ in range(max_new_tokens):
        logits = model(tokens[:, -block_size:])[:, -1, :vocab_size].float()  # [1, vocab_size]
        if temperature == 0:
            next_token = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k is not None and top_k < logits.shape[-1]:
                kth = torch.topk(logits, top_k).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probabilities = torch.softmax(logits, dim=-1)
            next_token = torch.multinomial(probabilities, 1, generator=generator)
        tokens = torch.cat([tokens, next_token], dim=1)
        if eot_id is not None and next_token.item() == eot_id:
            break
    return tokens


def run_codec(run_dir: Path, config: Config) -> Codec:
    """The tokenizer a run trained with: the copy its folder keeps (RUN_MANIFEST and its
    tokenizer.json). A run of an earlier version kept none: then its `data_dir`'s, which must
    still hold the corpus it trained on.

    Raises:
        ValueError: no copy in the run folder, and `data_dir` holds no corpus (where it is
            relative, the message says to run from where the run trained) or another one.
    """
    manifest = manifest_at(run_dir / RUN_MANIFEST)
    if manifest is not None:
        return Codec.for_corpus(run_dir, manifest)
    data_dir = Path(config.data_dir)
    saved = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    if not (data_dir / MANIFEST).is_file():
        relative = "" if data_dir.is_absolute() else ", a path relative to where the run trained"
        raise ValueError(
            f"{run_dir} keeps no tokenizer of its own (a run of an earlier version), and its "
            f"data_dir {data_dir}{relative} holds no corpus here; run generate from there"
        )
    if config.task_data_change(saved, str(run_dir)) is not None:
        raise ValueError(
            f"{data_dir} was prepared again since {run_dir} trained on it, and the run keeps no "
            "tokenizer of its own: prepare it as it was"
        )
    return Codec.for_corpus(data_dir, read_manifest(data_dir, "prepare it as it was"))


def main(argv: list[str] | None = None) -> str:
    """Entry point; prints the prompt and its continuation, and returns them."""
    parser = command_parser(__doc__.splitlines()[0])
    parser.add_argument("prompt", help="the text to continue")
    parser.add_argument("--run-dir", help="the trained run (default: configs/train.toml's)")
    parser.add_argument("--weights", default=WEIGHTS_FILE, help="a weights file of the run")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    parser.add_argument("--top-k", type=int, default=50, help="sample among the k likeliest")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, mps")
    args = parser.parse_args(argv)
    with user_errors():
        if args.max_new_tokens < 1 or args.temperature < 0 or args.top_k < 1:
            raise ValueError("--max-new-tokens and --top-k must be >= 1, --temperature >= 0")
        run_dir = Path(args.run_dir or load_config("configs/train.toml").run_dir)
        auto = "cuda" if torch.cuda.is_available() else "cpu"
        device = torch.device(auto if args.device == "auto" else args.device)
        model, config = load_trained(run_dir, args.weights, device)
        codec = run_codec(run_dir, config)
        prompt = codec.encode_batch([args.prompt])[0]
        if not prompt:
            raise ValueError("the prompt is empty; give some text to continue")
    generator = torch.Generator(device).manual_seed(args.seed)
    tokens = torch.tensor([prompt], dtype=torch.long, device=device)
    sample = {"temperature": args.temperature, "top_k": args.top_k, "generator": generator}
    sample |= {"eot_id": codec.eot_id, "vocab_size": codec.vocab_size}
    out = generate(model, tokens, args.max_new_tokens, config.block_size, **sample)
    text = codec.decode(out[0].tolist())
    print(text)
    return text


if __name__ == "__main__":
    main()
