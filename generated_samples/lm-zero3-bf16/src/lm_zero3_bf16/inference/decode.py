"""Decoding: the one path by which every command that samples from the language model (generate,
chat) turns a prompt into new tokens.

The prompt is read in one forward pass that fills a key-value cache (models/kv_cache.py); each
new token is then one forward pass of one position that reads the cache, so a token costs the
same at any context length up to the model's (its `max_position_embeddings`), instead of a
forward pass over the whole window. A `Decoder` keeps its cache between calls: the next prompt
reuses the cached positions it starts with (a chat's next turn re-reads only the new messages).
A model whose `forward` takes no `cache` (a model.py of your own) is run on its whole context
for each token instead, with the same results.

Each token comes from the last position's logits over the tokenizer's ids (`vocab_size`; the
rest pad the model's vocabulary and decode to nothing): greedy at temperature 0, else divided
by the temperature, cut to the `top_k` likeliest and sampled from a seeded generator, as
transformers' `generate` does with `do_sample`, `temperature` and `top_k`.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..models import KVCache


@dataclass(frozen=True)
class Sampling:
    """How a token is drawn from the logits: `temperature` 0 is greedy (the likeliest id);
    `top_k` keeps the k likeliest (None: all); `seed` seeds the generator."""

    temperature: float = 0.8
    top_k: int | None = 50
    seed: int = 1337

    def check(self) -> None:
        """Raises ValueError: a negative temperature or a top_k below 1."""
        if self.temperature < 0 or (self.top_k is not None and self.top_k < 1):
            raise ValueError("--temperature must be >= 0 and --top-k >= 1")


def pick(logits: Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """The next token's id from float `logits` `[vocab]` (`Sampling`)."""
    if sampling.temperature == 0:
        return int(logits.argmax())
    logits = logits / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator))


def takes_cache(model: nn.Module) -> bool:
    """Whether `model.forward` takes a `cache` (model.py's and models/llama.py's do)."""
    return "cache" in inspect.signature(model.forward).parameters


class Decoder:
    """`model` (token ids `[1, T]` -> logits `[1, T, V]`) decoding on `device` within `context`
    positions (the most it reads), sampling among its first `vocab_size` ids (None: all)."""

    def __init__(
        self,
        model: nn.Module,
        context: int,
        vocab_size: int | None = None,
        device: torch.device | None = None,
    ):
        self.model = model.eval()
        self.context, self.vocab_size = context, vocab_size
        self.device = device or next(model.parameters()).device
        self.cache = None
        if takes_cache(model):
            self.cache = KVCache(len(model.shard_units()), context)
        self.cached: list[int] = []  # the tokens whose keys and values the cache holds

    def room(self, prompt_tokens: int) -> int:
        """New tokens that fit after a prompt of `prompt_tokens` tokens.

        Raises:
            ValueError: the prompt alone fills the context.
        """
        if prompt_tokens >= self.context:
            raise ValueError(
                f"the prompt is {prompt_tokens} tokens and the model reads at most "
                f"{self.context}, its reply included; shorten it to {self.context - 1} or fewer"
            )
        return self.context - prompt_tokens

    @torch.no_grad()
    def stream(
        self,
        prompt: list[int],
        max_new_tokens: int,
        sampling: Sampling,
        stop_ids: Iterable[int] = (),
        generator: torch.Generator | None = None,
    ) -> Iterator[int]:
        """Yield up to `max_new_tokens` new token ids after `prompt` (ids, at least one), one
        at a time as each is drawn, ending after one of `stop_ids` (which is yielded) or at
        the context's end.

        Raises:
            ValueError: `prompt` is empty or fills the context (`room`).
        """
        if not prompt:
            raise ValueError("the prompt is empty; give some text to continue")
        stops = set(stop_ids)
        budget = min(max_new_tokens, self.room(len(prompt)))
        tokens, feed = list(prompt), self.reuse(prompt)
        for _ in range(budget):
            token = pick(self.next_logits(tokens, feed), sampling, generator)
            yield token
            if token in stops:
                return
            tokens.append(token)
            feed = [token]

    def reuse(self, prompt: list[int]) -> list[int]:
        """Keep the cached positions `prompt` starts with (all but its last token at most) and
        return the tokens still to read."""
        if self.cache is None:
            return prompt
        keep = 0
        for cached, token in zip(self.cached, prompt[:-1], strict=False):
            if cached != token:
                break
            keep += 1
        self.cache.truncate(keep)
        self.cached = self.cached[:keep]
        return prompt[keep:]

    def next_logits(self, tokens: list[int], feed: list[int]) -> Tensor:
        """The float logits `[vocab_size]` that follow `tokens`, reading `feed` (their last
        ones, after what the cache holds)."""
        if self.cache is None:
            window = torch.tensor([tokens[-self.context :]], device=self.device)
            logits = self.model(window)
        else:
            ids = torch.tensor([feed], device=self.device)
            logits = self.model(ids, cache=self.cache)
            self.cached.extend(feed)
        return logits[0, -1, : self.vocab_size].float()


def generate(
    model: nn.Module,
    tokens: Tensor,
    max_new_tokens: int,
    context: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    stop_ids: Iterable[int] = (),
    generator: torch.Generator | None = None,
    vocab_size: int | None = None,
) -> Tensor:
    """`tokens` (int64 `[1, T]`) followed by up to `max_new_tokens` new ones (`Decoder.stream`,
    ending after one of `stop_ids`): int64 `[1, T + new]` on `tokens`'s device.

    Raises:
        ValueError: `tokens` is empty or fills the `context`.
    """
    decoder = Decoder(model, context, vocab_size, tokens.device)
    sampling = Sampling(temperature, top_k)
    new = decoder.stream(tokens[0].tolist(), max_new_tokens, sampling, stop_ids, generator)
    return torch.cat([tokens, torch.tensor([list(new)], dtype=tokens.dtype).to(tokens)], dim=1)
