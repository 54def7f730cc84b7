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

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..corpus import IGNORE_INDEX, Codec, Manifest
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
            text_bytes = len(codec.decode(list(ids)).encode("utf-8"))
            if max_bytes is not None and total + text_bytes > max_bytes:
                keep = max(1, math.ceil(len(ids) * (max_bytes - total) / text_bytes))
                ids = list(ids[:keep])
                text_bytes = len(codec.decode(ids).encode("utf-8"))
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
