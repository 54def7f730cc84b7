"""Sample from a trained model: `python -m lm_fsdp2_bf16.generate "PROMPT" [options]`.

Reads the run's model (`--run-dir`, default configs/train.toml's: its best weights,
`model.safetensors`; `--weights` names another file, `--checkpoint` a checkpoint folder) or a
Hugging Face model folder (`--model`, e.g. an export), with the tokenizer it trained with, and
continues PROMPT (inference/decode.py: a key-value cache, the model's whole context):
temperature, then the `top_k` most likely tokens, sampled with a seeded generator; temperature 0
takes the most likely token, as transformers' greedy `generate` does. Ids past the tokenizer's
vocabulary (a model's padding) are never sampled. Stops after `--max-new-tokens`, at the end
of text or of a chat turn, or where the model's context ends.
"""

from __future__ import annotations

import argparse
import sys

import torch

from .config import command_parser, user_errors
from .inference.decode import Decoder, Sampling
from .inference.sources import add_source_arguments, device_named, load_language_model


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """The sampling options generate and chat share: `--max-new-tokens`, `--temperature`,
    `--top-k`, `--seed` and `--device`."""
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    parser.add_argument("--top-k", type=int, default=50, help="sample among the k likeliest")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, mps")


def sampling_of(args: argparse.Namespace) -> tuple[Sampling, torch.device]:
    """The `Sampling` and device that `add_sampling_arguments`' options give.

    Raises:
        ValueError: --max-new-tokens below 1, a negative temperature, a top-k below 1, or a
            device this machine does not have.
    """
    if args.max_new_tokens < 1:
        raise ValueError("--max-new-tokens must be >= 1")
    sampling = Sampling(args.temperature, args.top_k, args.seed)
    sampling.check()
    return sampling, device_named(args.device)


def main(argv: list[str] | None = None) -> str:
    """Entry point; prints the prompt and its continuation, and returns them."""
    parser = command_parser(__doc__.splitlines()[0])
    parser.add_argument("prompt", help="the text to continue")
    add_source_arguments(parser)
    add_sampling_arguments(parser)
    args = parser.parse_args(argv)
    with user_errors():
        sampling, device = sampling_of(args)
        used = load_language_model(args, device)
        prompt = used.codec.encode_batch([args.prompt])[0]
        decoder = Decoder(used.model, used.context, used.codec.vocab_size, device)
        generator = torch.Generator(device).manual_seed(sampling.seed)
        stream = decoder.stream(prompt, args.max_new_tokens, sampling, used.stop_ids, generator)
        new = list(stream)
    if len(prompt) + len(new) == used.context and new[-1] not in used.stop_ids:
        print(f"(stopped at the model's context of {used.context} tokens)", file=sys.stderr)
    text = used.codec.decode(prompt + new)
    print(text)
    return text


if __name__ == "__main__":
    main()
