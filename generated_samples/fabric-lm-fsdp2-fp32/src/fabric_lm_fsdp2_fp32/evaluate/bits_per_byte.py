"""Bits per byte: how well a language model predicts text, in a unit that does not depend on its
tokenizer. A loss in nats per token rewards a tokenizer with longer tokens; the same negative
log-likelihood summed over a text and divided by ln 2 and by the text's UTF-8 bytes compares
any two models on the same text (Gao et al. 2020, "The Pile", section 4.1, reports it; nanochat
and lm-evaluation-harness's `bits_per_byte` compute it so).

The text is read as training reads a text corpus: documents one after another, each after the
end-of-text id, in non-overlapping windows of `context` tokens (nanoGPT's evaluation), every
token predicted from the window's tokens before it. End-of-text targets are not counted: they
are no bytes of the text. Perplexity is exp of the mean nats per counted token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..corpus import IGNORE_INDEX, Codec, Manifest, read_manifest
from ..corpus.shards import DTYPES
from ..runtime import Runtime, all_reduce_sum


@dataclass(frozen=True)
class HeldOutText:
    """Text as the model scores it: int64 `stream` `[N]`, its documents' token ids each after
    the end-of-text id `eot_id`, and the `bytes` of their UTF-8 text (the bytes the counted
    tokens encode) in `documents` documents."""

    stream: np.ndarray
    bytes: int
    documents: int
    eot_id: int

    @classmethod
    def from_documents(
        cls, documents: Iterable[list[int]], codec: Codec, max_bytes: int | None = None
    ) -> HeldOutText:
        """Documents of token ids, read until their text holds `max_bytes` (None: all): the
        last one read is cut to about the bytes left (its bytes are then those of the tokens
        kept, decoded).

        Raises:
            ValueError: no document holds a token.
        """
        pieces, total, count = [], 0, 0
        for ids in documents:
            if not len(ids):
                continue
            text_bytes = text_size(ids, codec)
            if max_bytes is not None and total + text_bytes > max_bytes:
                keep = max(1, math.ceil(len(ids) * (max_bytes - total) / text_bytes))
                ids = list(ids[:keep])
                text_bytes = text_size(ids, codec)
            pieces += [[codec.eot_id], list(ids)]
            total, count = total + text_bytes, count + 1
            if max_bytes is not None and total >= max_bytes:
                break
        if not count:
            raise ValueError("no text to score: the documents are empty")
        stream = np.fromiter((i for piece in pieces for i in piece), dtype=np.int64)
        return cls(stream, total, count, codec.eot_id)

    @classmethod
    def from_texts(
        cls, texts: Iterable[str], codec: Codec, max_bytes: int | None = None
    ) -> HeldOutText:
        """Texts (one document each) encoded with `codec` (`from_documents`)."""
        return cls.from_documents((codec.encode_batch([t])[0] for t in texts), codec, max_bytes)

    @classmethod
    def from_corpus(
        cls, data_dir: Path, manifest: Manifest, codec: Codec, max_bytes: int | None = None
    ) -> HeldOutText:
        """The validation split of the corpus prepared in `data_dir`, from its start: its
        documents (split at the end-of-text ids), or its examples (chat or instruction
        records: their whole text, template included) (`from_documents`)."""
        return cls.from_documents(split_documents(data_dir, manifest, "val"), codec, max_bytes)


def text_size(ids: Iterable[int], codec: Codec) -> int:
    """UTF-8 bytes of the text token ids encode: one a token for byte tokens (exact, wherever a
    cut falls), else the decoded text's."""
    ids = list(ids)
    if codec.tokenizer is None:
        return len(ids)
    return len(codec.decode(ids).encode("utf-8"))


def split_documents(data_dir: Path, manifest: Manifest, split: str) -> Iterable[np.ndarray]:
    """The token ids of each document (or example) of a prepared split, shard by shard."""
    dtype = DTYPES[manifest.dtype]
    for shard in manifest.shards[split]:
        tokens = np.fromfile(data_dir / shard.file, dtype=dtype).astype(np.int64)
        if shard.starts_file:
            starts = np.fromfile(data_dir / shard.starts_file, dtype=np.int64)
            ends = starts[1:]
            starts = starts[:-1]
        else:
            ends = np.flatnonzero(tokens == manifest.eot_id)
            starts = np.concatenate([[0], ends[:-1] + 1])
        for start, end in zip(starts, ends, strict=True):
            yield tokens[start:end]


@dataclass(frozen=True)
class Score:
    """The negative log-likelihood `nats` of `tokens` counted tokens that encode `bytes` bytes
    of text."""

    nats: float
    tokens: int
    bytes: int

    @property
    def bits_per_byte(self) -> float:
        """nats / ln 2 / bytes."""
        return self.nats / math.log(2) / max(self.bytes, 1)

    @property
    def loss(self) -> float:
        """Mean nats per counted token (the cross-entropy training reports)."""
        return self.nats / max(self.tokens, 1)

    @property
    def perplexity(self) -> float:
        """exp(loss): per token, so it depends on the tokenizer, unlike bits per byte."""
        return math.exp(self.loss)

    def figures(self) -> dict[str, float | int]:
        """Every figure by name, as eval.json and the metrics log record them."""
        return {
            "bits_per_byte": self.bits_per_byte,
            "loss": self.loss,
            "perplexity": self.perplexity,
            "tokens": self.tokens,
            "bytes": self.bytes,
        }


def windows(held_out: HeldOutText, context: int) -> tuple[Tensor, Tensor]:
    """The stream cut into non-overlapping windows: inputs and targets, int64 `[W, context]`
    each, targets the inputs shifted by one; a target past the stream's end or equal to the
    end-of-text id is IGNORE_INDEX (the last window's padding reads end-of-text ids)."""
    stream = torch.from_numpy(held_out.stream)
    count = max(1, math.ceil((len(stream) - 1) / context))
    padded = torch.full((count * context + 1,), -1, dtype=torch.int64)
    padded[: len(stream)] = stream
    inputs, targets = padded[:-1].view(count, context), padded[1:].view(count, context)
    inputs = inputs.masked_fill(inputs < 0, held_out.eot_id)
    ignored = (targets < 0) | (targets == held_out.eot_id)
    return inputs, targets.masked_fill(ignored, IGNORE_INDEX)


@torch.no_grad()
def score(
    forward: Callable[[Tensor], Tensor],
    held_out: HeldOutText,
    context: int,
    batch_size: int,
    device: torch.device,
    runtime: Runtime | None = None,
) -> Score:
    """The `Score` of `held_out` under `forward` (int64 inputs `[B, context]` -> logits `[B,
    context, V]`), read `batch_size` windows at a time. With a `runtime` of several processes,
    rank r reads windows r, r + W, ... and the sums are added over ranks: every rank runs as
    many forward passes (a sharded model gathers its weights in each), the last with windows
    that count nothing where the windows do not divide evenly; the result equals one
    process's up to the order of float additions."""
    inputs, targets = windows(held_out, context)
    if runtime is not None and runtime.world_size > 1:
        world = runtime.world_size
        per_rank = math.ceil(len(inputs) / world)
        spare = per_rank * world - len(inputs)
        inputs = torch.cat([inputs, inputs[:1].expand(spare, -1)])[runtime.rank :: world]
        unused = torch.full((spare, context), IGNORE_INDEX, dtype=torch.int64)
        targets = torch.cat([targets, unused])[runtime.rank :: world]
    sums = torch.zeros(2, dtype=torch.float64, device=device)
    for start in range(0, len(inputs), batch_size):
        logits = forward(inputs[start : start + batch_size].to(device))
        batch_targets = targets[start : start + batch_size].to(device).flatten()
        nats = F.cross_entropy(
            logits.float().flatten(0, 1), batch_targets, reduction="sum", ignore_index=IGNORE_INDEX
        )
        sums += torch.stack([nats.double(), (batch_targets != IGNORE_INDEX).sum().double()])
    if runtime is not None:
        sums = all_reduce_sum(sums, runtime)
    nats, tokens = sums.tolist()
    return Score(nats, int(tokens), held_out.bytes)


class HeldOutEvaluation:
    """Bits per byte during training (the config's `task_evaluation` hook): every `eval_every`
    optimizer steps, on the first `eval_bytes` of the prepared validation split (read once, so
    every measurement scores the same text), in windows of `block_size` tokens, `micro_batch_size`
    at a time, split over the ranks (`score`). A launch that starts at step `step` does not
    measure that step again."""

    def __init__(self, config: Any, runtime: Runtime, step: int):
        data_dir = Path(config.data_dir)
        manifest = read_manifest(data_dir, "prepare it first")
        codec = Codec.for_corpus(data_dir, manifest)
        self.text = HeldOutText.from_corpus(data_dir, manifest, codec, config.eval_bytes)
        self.every, self.runtime, self.last_step = config.eval_every, runtime, step
        self.context, self.batch_size = config.block_size, config.micro_batch_size

    def due(self, step: int, final: bool = False) -> bool:
        """Whether step `step` is one to measure: a multiple of `eval_every`, or the run's
        last (`final`), not measured yet."""
        return step > 0 and step != self.last_step and (final or step % self.every == 0)

    def measure(self, engine: Any, step: int) -> dict[str, Any]:
        """Score the held-out text with the engine's model (dropout off, its precision) at
        step `step`: `eval_bits_per_byte`, `eval_loss` (nats per token), `eval_tokens` and
        `eval_bytes`, the same on every rank."""

        def forward(inputs: Tensor) -> Tensor:
            with engine.autocast():
                return engine.module(inputs)

        engine.module.eval()
        with engine.inference():
            scored = score(
                forward, self.text, self.context, self.batch_size, self.runtime.device, self.runtime
            )
        engine.module.train()
        self.last_step = step
        return {
            "eval_bits_per_byte": scored.bits_per_byte,
            "eval_loss": scored.loss,
            "eval_tokens": scored.tokens,
            "eval_bytes": scored.bytes,
        }
