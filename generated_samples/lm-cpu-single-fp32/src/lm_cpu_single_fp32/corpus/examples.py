"""Chat and instruction data: records prepared into example shards with loss masks
(`write_examples`, which `prepare` runs for `--format chat` or `completion`), read as rows of
`block_size` tokens (`ExampleRows`), one example a row or packed several to a row.

An example is trained as a whole or not at all: prepare drops (or, with `--too-long truncate`,
cuts) one longer than `--max-example-tokens` (the config's block_size), and counts it in the
manifest, with the examples' lengths at the 50th, 95th and 100th percentile; where more than
5% are too long, it names the block_size that keeps 95% of them whole. Which records are held
out for validation is `is_validation`'s, per source and record number, as for text.

A row's targets are its inputs shifted left by one token within each example; a target is
IGNORE_INDEX where its token is not trained (the prompt, a user's turn, the system message),
after an example's last token, and on padding. Packed, a row holds whole examples one after
another (`packed_rows`: first fit over the last rows opened, in the prepared order), and comes
with its `documents` (models/packing.py), so that no example attends to another.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from .chat import TEMPLATE_FILE, ChatTemplate, encode_example, read_records, template_beside
from .documents import BadRecord, is_validation
from .shards import CHUNK_BYTES, DTYPES, SPLITS, TOKENIZER_FILE, Codec, Manifest, Shard, file_sha256
from .sources import plural

if TYPE_CHECKING:
    import torch

    from .pipeline import Options

IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index: a target that counts for nothing
PACKING_WINDOW = 64  # open rows an example may join (`packed_rows`)
NAMED = 5  # bad records named in a message
PERCENTILES = (50, 95, 100)  # of the examples' lengths, which prepare reports
KEEP_PERCENTILE = 95  # the share of whole examples prepare tells how to keep


def chat_template_file(options: Options) -> Path | None:
    """The file the chat template comes from: `--chat-template`, else the one beside the
    tokenizer.json; None for completion records, which need none.

    Raises:
        ValueError: chat records, and no template given or beside the tokenizer.
    """
    if options.format != "chat":
        return None
    if options.chat_template:
        return Path(options.chat_template)
    beside = (
        None if options.tokenizer in ("bytes", "bpe") else template_beside(Path(options.tokenizer))
    )
    if beside is None:
        raise ValueError(
            f"--format chat renders conversations with the tokenizer's chat template, and "
            f"{options.tokenizer} has none (no chat_template in a tokenizer_config.json or "
            "chat_template.jinja beside it); give one with --chat-template FILE"
        )
    return beside


class ShardWriter:
    """Writes one split's examples into shards of at most `shard_tokens` tokens (an example is
    never split; one longer than that fills a shard of its own), each with its mask and starts
    files (Shard), fsynced when closed. It holds at most CHUNK_BYTES of tokens before it
    appends them to the files."""

    def __init__(self, folder: Path, split: str, dtype: str, shard_tokens: int):
        self.folder, self.split, self.dtype, self.shard_tokens = folder, split, dtype, shard_tokens
        self.shards: list[Shard] = []
        self.paths: dict[str, Path] = {}
        self.pending: dict[str, list[bytes]] = {"tokens": [], "mask": []}
        self.pending_bytes = 0
        self.starts: list[int] = []

    def add(self, ids: np.ndarray, mask: np.ndarray) -> None:
        """Append one example: int64 token ids and their uint8 mask, of the same length."""
        if self.starts and self.starts[-1] + len(ids) > self.shard_tokens:
            self.close_shard()
        if not self.paths:
            stem = f"{self.split}-{len(self.shards):05d}"
            names = {"tokens": f"{stem}.bin", "mask": f"{stem}.mask.bin"}
            self.paths = {role: self.folder / name for role, name in names.items()}
            self.paths["starts"] = self.folder / f"{stem}.starts.bin"
            self.starts = [0]
        self.pending["tokens"].append(ids.astype(DTYPES[self.dtype]).tobytes())
        self.pending["mask"].append(mask.astype(np.uint8).tobytes())
        self.pending_bytes += len(self.pending["tokens"][-1])
        self.starts.append(self.starts[-1] + len(ids))
        if self.pending_bytes >= CHUNK_BYTES:
            self.write_pending()

    def write_pending(self, sync: bool = False) -> None:
        """Append the examples held to the shard's files (`sync`: and fsync them)."""
        for role, pieces in self.pending.items():
            with open(self.paths[role], "ab") as file:
                file.write(b"".join(pieces))
                if sync:
                    file.flush()
                    os.fsync(file.fileno())
            pieces.clear()
        self.pending_bytes = 0

    def close_shard(self) -> None:
        """Finish the shard being written (if any): its files written whole and fsynced."""
        if not self.paths:
            return
        self.write_pending(sync=True)
        with open(self.paths["starts"], "wb") as file:
            file.write(np.asarray(self.starts, dtype=np.int64).tobytes())
            file.flush()
            os.fsync(file.fileno())
        paths, self.paths = self.paths, {}
        self.shards.append(
            Shard(
                paths["tokens"].name,
                self.starts[-1],
                file_sha256(paths["tokens"]),
                mask_file=paths["mask"].name,
                mask_sha256=file_sha256(paths["mask"]),
                starts_file=paths["starts"].name,
                starts_sha256=file_sha256(paths["starts"]),
                examples=len(self.starts) - 1,
            )
        )

    def finish(self) -> tuple[Shard, ...]:
        """Close the last shard; the split's shards."""
        self.close_shard()
        return tuple(self.shards)


def write_examples(
    files: tuple[Path, ...],
    options: Options,
    scratch: Path,
    request: dict[str, Any],
    progress: bool,
    say: Callable[[str], None],
) -> Manifest:
    """Read every record of `files`, render and encode it, and write the example shards and
    their manifest into `scratch` (the manifest last); return the manifest.

    Raises:
        ValueError: a record that is not of `options.format` (unless `skip_bad_records`), chat
            records without a chat template, one the template refuses, or a split without an
            example.
    """
    started = time.perf_counter()
    tokenizer_file = None
    if options.tokenizer != "bytes":
        tokenizer_file = scratch / TOKENIZER_FILE
        shutil.copyfile(options.tokenizer, tokenizer_file)
    codec = Codec(tokenizer_file, options.eot)
    template_file = chat_template_file(options)
    template = ChatTemplate.load(template_file) if template_file else None
    if template is not None:  # kept with the corpus: runs, chat and export read it from there
        (scratch / TEMPLATE_FILE).write_text(template.source, encoding="utf-8")
    dtype = "uint16" if codec.vocab_size <= 2**16 else "uint32"
    writers = {split: ShardWriter(scratch, split, dtype, options.shard_tokens) for split in SPLITS}
    counts: Counter[str] = Counter()
    bad: list[str] = []
    longest, sources = 0, []
    lengths = array("q")  # each encoded example's tokens, before the limit
    with tqdm(desc="examples", unit=" records", disable=not progress) as bar:
        for path in files:
            examples = 0
            for number, record in read_records(path, options.format):
                bar.update()
                if isinstance(record, BadRecord):
                    bad.append(f"{path}:{number + 1}: {record.reason}")
                    if not options.skip_bad_records:
                        raise ValueError(f"{bad[0]}; fix it, or pass --skip-bad-records")
                    continue
                try:
                    ids, mask = encode_example(record, options.format, codec, template)
                except ValueError as error:
                    raise ValueError(f"{path}:{number + 1}: {error}") from None
                lengths.append(len(ids))
                if len(ids) > options.max_example_tokens:
                    if options.too_long == "drop":
                        counts["dropped_too_long"] += 1
                        continue
                    ids, mask = (
                        ids[: options.max_example_tokens],
                        mask[: options.max_example_tokens],
                    )
                    counts["truncated"] += 1
                if not mask[1:].any():  # the first token is never a target
                    counts["dropped_nothing_trained"] += 1
                    continue
                split = "val" if is_validation(path, number, options.val_fraction) else "train"
                writers[split].add(ids, mask)
                counts[f"{split}_examples"] += 1
                counts["trained_tokens"] += int(mask[1:].sum())
                longest, examples = max(longest, len(ids)), examples + 1
            sources.append({"path": str(path), "bytes": path.stat().st_size, "examples": examples})
    shards = {split: writer.finish() for split, writer in writers.items()}
    check_examples(counts, options)
    manifest = Manifest(
        tokenizer="bytes" if tokenizer_file is None else "file",
        vocab_size=codec.vocab_size,
        eot_id=codec.eot_id,
        dtype=dtype,
        shards=shards,
        documents={split: counts[f"{split}_examples"] for split in SPLITS},
        source_bytes=sum(source["bytes"] for source in sources),
        request=request,
        sources=tuple(sources),
        skipped={
            "records": len(bad),
            "first_records": bad[:NAMED],
            "dropped_too_long": counts["dropped_too_long"],
            "truncated": counts["truncated"],
            "dropped_nothing_trained": counts["dropped_nothing_trained"],
            "example_tokens": length_percentiles(lengths),
        },
        tokenizer_sha256=file_sha256(tokenizer_file) if tokenizer_file else "",
        kind=options.format,
        longest_example=longest,
    )
    tokens = sum(manifest.tokens(split) for split in SPLITS)
    say(
        f"encoded {sum(manifest.documents.values()):,} examples, {tokens:,} tokens "
        f"({counts['trained_tokens'] / max(tokens, 1):.1%} trained), in "
        f"{time.perf_counter() - started:.1f} s; {describe_lengths(manifest)}; "
        f"{describe_left_out(manifest, options.max_example_tokens)}"
    )
    return manifest


def check_examples(counts: Counter[str], options: Options) -> None:
    """Refuse prepared examples with none in a split, saying what to change.

    Raises:
        ValueError: no training or no validation example.
    """
    left = counts["train_examples"] + counts["val_examples"]
    too_long, untrained = counts["dropped_too_long"], counts["dropped_nothing_trained"]
    limit = options.max_example_tokens
    if not left:
        hints = []
        if too_long:
            hints.append(
                f"{plural(too_long, 'example')} longer than --max-example-tokens {limit}: raise "
                "it (and block_size) or pass --too-long truncate"
            )
        if untrained:
            hints.append(
                f"{plural(untrained, 'example')} with no trained token in their first {limit} "
                "tokens (the replies come after the cut): raise --max-example-tokens and "
                "block_size"
            )
        raise ValueError("no example is left to train on" + "".join(f"; {h}" for h in hints))
    for split, name in (("train", "training"), ("val", "validation")):
        if not counts[f"{split}_examples"]:
            raise ValueError(
                f"no {name} example among {left:,} at --val-fraction {options.val_fraction:g}: "
                "add records or change --val-fraction"
            )


def length_percentiles(lengths: Sequence[int]) -> dict[str, int]:
    """The lengths (tokens) at each of PERCENTILES, by nearest rank, as {"p50": ..., "p95":
    ..., "p100": ...}: "p95" is the shortest length that at least 95% of `lengths` are no
    longer than (a limit of it keeps 95% whole), "p100" the longest; {} for no lengths."""
    ordered = np.sort(np.asarray(lengths, dtype=np.int64))
    if not len(ordered):
        return {}
    rank = {q: max(math.ceil(q * len(ordered) / 100), 1) for q in PERCENTILES}
    return {f"p{q}": int(ordered[rank[q] - 1]) for q in PERCENTILES}


def describe_lengths(manifest: Manifest) -> str:
    """The examples' lengths at PERCENTILES, in words ("" where none was encoded)."""
    lengths = manifest.skipped.get("example_tokens") or {}
    if not lengths:
        return "no example encoded"
    values = "/".join(f"{lengths[f'p{q}']:,}" for q in PERCENTILES)
    names = "/".join(f"{q}th" for q in PERCENTILES)
    return f"examples of {values} tokens at the {names} percentile"


def describe_left_out(manifest: Manifest, limit: int) -> str:
    """What prepare left out of the examples, in words ("nothing left out" if nothing), with
    the block_size that keeps KEEP_PERCENTILE% of them whole where more than the rest were too
    long for `limit` tokens (dropped or truncated)."""
    skipped = manifest.skipped
    parts = [
        f"{skipped.get(key, 0):,} {what}"
        for key, what in (
            ("records", "bad record(s) skipped"),
            ("dropped_too_long", f"longer than {limit} tokens, dropped"),
            ("truncated", f"longer than {limit} tokens, truncated"),
            ("dropped_nothing_trained", "with no trained token left, dropped"),
        )
        if skipped.get(key)
    ]
    too_long = skipped.get("dropped_too_long", 0) + skipped.get("truncated", 0)
    encoded = sum(manifest.documents.values()) + skipped.get("dropped_too_long", 0)
    encoded += skipped.get("dropped_nothing_trained", 0)  # each encoded example is one of these
    keep = (skipped.get("example_tokens") or {}).get(f"p{KEEP_PERCENTILE}")
    if keep and too_long * 100 > (100 - KEEP_PERCENTILE) * encoded:
        parts.append(
            f"to keep {KEEP_PERCENTILE}% of the examples whole ({too_long / encoded:.0%} are "
            f"longer than {limit}), set block_size >= {keep:,} in configs/train.toml "
            "(--max-example-tokens follows it; init_from's max_position_embeddings at most)"
        )
    return "; ".join(parts) or "nothing left out"


class ExampleRows:
    """The examples of one split as rows of `block_size` tokens, read from memory-mapped shards
    (module docstring): `dataset[indices]` (a list of ints) returns `(inputs, targets)`, both
    int64 `[B, block_size]`, or with `pack`, `((inputs, documents), targets)`, `documents`
    int64 `[B, block_size]` (models/packing.py). Padding is `pad_id` in the inputs,
    IGNORE_INDEX in the targets.

    Raises:
        ValueError: an example longer than `block_size` (prepare it again with
            --max-example-tokens at most block_size).
    """

    def __init__(
        self,
        data_dir: Path,
        shards: tuple[Shard, ...],
        dtype: str,
        block_size: int,
        pack: bool,
        pad_id: int,
    ):
        self.data_dir, self.shards, self.dtype = data_dir, shards, DTYPES[dtype]
        self.block_size, self.pack, self.pad_id = block_size, pack, pad_id
        per_shard = [np.fromfile(data_dir / shard.starts_file, dtype=np.int64) for shard in shards]
        self.shard_of = np.concatenate(
            [np.full(len(s) - 1, i, dtype=np.int64) for i, s in enumerate(per_shard)] or [[]]
        ).astype(np.int64)
        self.start = np.concatenate([s[:-1] for s in per_shard] or [[]]).astype(np.int64)
        self.length = np.concatenate([np.diff(s) for s in per_shard] or [[]]).astype(np.int64)
        if len(self.length) and self.length.max() > block_size:
            raise ValueError(
                f"{data_dir} holds examples of up to {self.length.max():,} tokens, longer than "
                f"block_size={block_size}; prepare it again with --max-example-tokens "
                f"{block_size}, or raise block_size"
            )
        every = np.arange(len(self.length), dtype=np.int64)
        self.row_first, self.members = (
            packed_rows(self.length, block_size) if pack else (np.arange(len(every) + 1), every)
        )

    def __len__(self) -> int:
        return len(self.row_first) - 1

    def row(self, index: int) -> np.ndarray:
        """The examples of row `index`, in the order they sit in it."""
        return self.members[self.row_first[index] : self.row_first[index + 1]]

    def padding_share(self, pack: bool | None = None) -> float:
        """The share of the rows' positions that are padding, packed or (`pack=False`) one
        example a row."""
        if pack is None or pack == self.pack:
            rows = len(self)
        else:
            rows = (
                len(packed_rows(self.length, self.block_size)[0]) - 1 if pack else len(self.length)
            )
        return 1 - float(self.length.sum()) / max(rows * self.block_size, 1)

    def __getitem__(self, indices: list[int]) -> tuple[Any, torch.Tensor]:
        """Raises IndexError: an index outside `[0, len(self))`."""
        import torch  # here: the rest of this module serves prepare, which needs no torch

        rows = np.asarray(indices, dtype=np.int64)
        if rows.size and not 0 <= rows.min() <= rows.max() < len(self):
            raise IndexError(f"rows {indices} are not all in [0, {len(self)})")
        shape = (len(rows), self.block_size)
        inputs = np.full(shape, self.pad_id, dtype=np.int64)
        targets = np.full(shape, IGNORE_INDEX, dtype=np.int64)
        documents = np.empty(shape, dtype=np.int64)
        examples = [self.row(int(row)) for row in rows]
        needed = sorted({int(self.shard_of[e]) for row in examples for e in row})
        for shard in needed:  # each shard mapped once per batch, unmapped before the next
            tokens = np.memmap(self.data_dir / self.shards[shard].file, self.dtype, mode="r")
            mask = np.memmap(self.data_dir / self.shards[shard].mask_file, np.uint8, mode="r")
            for b, row in enumerate(examples):
                at = 0
                for number, example in enumerate(row):
                    if self.shard_of[example] != shard:
                        at += int(self.length[example])
                        continue
                    start, length = int(self.start[example]), int(self.length[example])
                    ids = tokens[start : start + length].astype(np.int64)
                    trained = mask[start + 1 : start + length].astype(bool)
                    inputs[b, at : at + length] = ids
                    targets[b, at : at + length - 1] = np.where(trained, ids[1:], IGNORE_INDEX)
                    documents[b, at : at + length] = number
                    at += length
            del tokens, mask
        for b, row in enumerate(examples):  # padding: one more document of its own
            used = int(self.length[row].sum())
            documents[b, used:] = len(row)
        batch = torch.from_numpy(inputs), torch.from_numpy(targets)
        if not self.pack:
            return batch
        return (batch[0], torch.from_numpy(documents)), batch[1]


def packed_rows(
    lengths: np.ndarray, block_size: int, window: int = PACKING_WINDOW
) -> tuple[np.ndarray, np.ndarray]:
    """Examples packed into rows of `block_size` tokens (each example is at most that long):
    (`row_first`, `members`), int64: row r holds examples `members[row_first[r]:row_first[r +
    1]]`. In the prepared order, each example goes into the first of the last `window` rows
    opened that still has room for it, else opens a row (first fit over a bounded window: most
    of first-fit's fill, in one pass, nearly in order); a row left behind by the window is
    final. A function of the lengths alone, so the rows are the same at any world size."""
    rows: list[list[int]] = []
    room: list[int] = []  # of the open rows (the last `window` opened), in opening order
    opened = 0  # index in `rows` of the first open row
    for index, length in enumerate(lengths.tolist()):
        for offset, left in enumerate(room):
            if length <= left:
                rows[opened + offset].append(index)
                room[offset] = left - length
                break
        else:
            rows.append([index])
            room.append(block_size - length)
            if len(room) > window:
                room.pop(0)
                opened += 1
    sizes = np.asarray([len(row) for row in rows], dtype=np.int64)
    row_first = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    members = np.asarray([index for row in rows for index in row], dtype=np.int64)
    return row_first, members
