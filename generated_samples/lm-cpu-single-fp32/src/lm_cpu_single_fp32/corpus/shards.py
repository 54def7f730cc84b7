"""A prepared corpus: `manifest.json` and the token shards `prepare.py` writes beside it, read
as memory-mapped windows.

The manifest is the contract between prepare and training: the tokenizer, its vocabulary and
end-of-text id, the shards' dtype, and per split (train, val) the shard files with their token
counts and SHA-256 checksums. A folder without a manifest holds no corpus: prepare writes it
last (state_io's atomic rule), so an interrupted prepare leaves nothing a run would read.

A corpus's identity is its content (`Manifest.fingerprint`: the shards' and the tokenizer's
checksums), not when its sources were touched: preparing the same sources again gives the same
corpus, and a run resumes on it. `describe_change` says what differs between two corpora.

Nothing here imports torch until a window is read: prepare's worker processes import this.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

MANIFEST = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"  # beside the shards, for "bpe" and a named tokenizer.json
RUN_MANIFEST = "corpus.json"  # a run folder's copy of the manifest of the corpus it trains on
FORMAT = 1
SPLITS = ("train", "val")
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
CHUNK_BYTES = 1 << 24  # what hashing or copying a shard holds in memory at once
END_OF_TEXT = "<|endoftext|>"  # the end-of-text token of a BPE trained by prepare
# The `bytes` tokenizer's vocabulary: the 256 byte values, then end-of-text (id 256); also the
# least a byte-level BPE has.
BYTE_VOCABULARY = 257
# End-of-text tokens of well-known tokenizers, for a tokenizer.json named without --eot.
KNOWN_EOT = (END_OF_TEXT, "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>")


@dataclass(frozen=True)
class Shard:
    """One token shard: `file` (in the corpus folder) holds `tokens` ids of the manifest's
    dtype, flat, documents each followed by the end-of-text id; `sha256` of its bytes.

    A shard of examples (chat or instruction records: the manifest's `kind`) holds them one
    after another, with nothing between them, and two files beside it: `mask_file`, a uint8
    per token (1: trained), and `starts_file`, int64 `[examples + 1]`: where each example
    starts in the shard, then the shard's end."""

    file: str
    tokens: int
    sha256: str
    mask_file: str = ""
    mask_sha256: str = ""
    starts_file: str = ""
    starts_sha256: str = ""
    examples: int = 0

    def files(self) -> dict[str, str]:
        """Each file of the shard, by name: its SHA-256."""
        named = {self.file: self.sha256}
        if self.mask_file:
            named |= {self.mask_file: self.mask_sha256, self.starts_file: self.starts_sha256}
        return named

    def expected_bytes(self, itemsize: int) -> dict[str, int]:
        """Each file's size in bytes, the token file's ids being `itemsize` bytes each."""
        sizes = {self.file: self.tokens * itemsize}
        if self.mask_file:
            sizes |= {self.mask_file: self.tokens, self.starts_file: 8 * (self.examples + 1)}
        return sizes


@dataclass(frozen=True)
class Manifest:
    """What a prepared corpus holds (see the module docstring). `request` is what prepare was
    asked (sources with their sizes and modification times in ns, tokenizer, settings), which a
    re-run compares to do nothing; `sources` each source read, with its bytes, their SHA-256
    and its documents; `skipped` what was left out (`files`: path -> why it cannot be read;
    `records`: lines or rows with no text, the first named in `first_records`; `other_kinds`:
    files of other kinds in the folders named, by suffix; of examples, those dropped or
    truncated for `--max-example-tokens` and `example_tokens`, their lengths in tokens before
    it at the 50th, 95th and 100th percentile: "p50", "p95", "p100"); `tokenizer_sha256` the
    tokenizer.json's ("" for bytes)."""

    tokenizer: str  # "bytes", "bpe" (trained at prepare) or "file" (a tokenizer.json named)
    vocab_size: int
    eot_id: int
    dtype: str
    shards: dict[str, tuple[Shard, ...]]
    documents: dict[str, int]
    source_bytes: int
    request: dict[str, Any]
    sources: tuple[dict[str, Any], ...] = ()
    skipped: dict[str, Any] = dataclasses.field(default_factory=dict)
    tokenizer_sha256: str = ""
    kind: str = "text"  # text (documents), chat or completion (examples with loss masks)
    longest_example: int = 0  # tokens of the longest example (examples only)
    format: int = FORMAT

    def tokens(self, split: str) -> int:
        """Tokens in `split` ("train" or "val"), end-of-text ids included."""
        return sum(shard.tokens for shard in self.shards[split])

    def fingerprint(self) -> str:
        """SHA-256 of what a model trained on this corpus depends on: the tokenizer (its file's
        checksum, its end-of-text id), the dtype, and each split's shard checksums in order."""
        content = {
            "tokenizer": self.tokenizer_sha256 or self.tokenizer,
            "eot_id": self.eot_id,
            "dtype": self.dtype,
            "shards": {split: [shard.sha256 for shard in self.shards[split]] for split in SPLITS},
        }
        if self.kind != "text":  # what is trained of each example is part of the data
            content["files"] = {
                split: [list(shard.files().values()) for shard in self.shards[split]]
                for split in SPLITS
            }
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()

    def to_json(self) -> str:
        """The manifest as written to manifest.json (sorted keys: equal manifests, equal text)."""
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse manifest.json's text.

        Raises:
            ValueError: not a manifest of this format.
        """
        values = json.loads(text)
        if values.get("format") != FORMAT:
            raise ValueError(f"manifest format {values.get('format')}, this code reads {FORMAT}")
        shards = {split: tuple(Shard(**s) for s in values["shards"][split]) for split in SPLITS}
        return cls(**(values | {"shards": shards, "sources": tuple(values.get("sources", ()))}))


def describe_change(before: Manifest, after: Manifest) -> str:
    """What differs between the corpus `before` and the corpus `after`, in one line: sources
    added, removed and changed (by their content), tokens per split, and the tokenizer."""
    old = {source["path"]: source.get("sha256") for source in before.sources}
    new = {source["path"]: source.get("sha256") for source in after.sources}
    parts = []
    for what, paths in (
        ("added", [path for path in new if path not in old]),
        ("removed", [path for path in old if path not in new]),
        ("changed", [path for path in new if path in old and new[path] != old[path]]),
    ):
        if paths:
            named = ", ".join(paths[:3]) + (", ..." if len(paths) > 3 else "")
            parts.append(f"{len(paths)} source(s) {what} ({named})")
    tokens = ", ".join(
        f"{split} {before.tokens(split):,} -> {after.tokens(split):,}" for split in SPLITS
    )
    tokenizer = "the same tokenizer" if same_tokenizer(before, after) else "another tokenizer"
    return "; ".join([*parts, f"tokens {tokens}", tokenizer])


def same_tokenizer(before: Manifest, after: Manifest) -> bool:
    """Whether two corpora were encoded by the same tokenizer: its file's checksum ("bytes"
    for the byte tokenizer), vocabulary and end-of-text id."""

    def key(manifest: Manifest) -> tuple[str, int, int]:
        return manifest.tokenizer_sha256 or manifest.tokenizer, manifest.vocab_size, manifest.eot_id

    return key(before) == key(after)


def manifest_at(path: Path) -> Manifest | None:
    """The manifest in the file `path`, or None where none reads there."""
    try:
        return Manifest.from_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def file_sha256(path: Path) -> str:
    """SHA-256 of the file at `path`, read in CHUNK_BYTES pieces (constant memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(data_dir: Path, prepare_hint: str) -> Manifest:
    """The manifest of the corpus in `data_dir`, every shard checked against it: its size
    always, its checksum when its modification time is newer than the manifest's.

    Raises:
        ValueError: no prepared corpus there (the message gives `prepare_hint`, the command
            that prepares one), an unreadable manifest, or a shard changed after prepare.
    """
    path = data_dir / MANIFEST
    if not path.is_file():
        raise ValueError(f"{data_dir} holds no prepared corpus (no {MANIFEST}); {prepare_hint}")
    try:
        manifest = Manifest.from_json(path.read_text(encoding="utf-8"))
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is not a corpus manifest ({error}); {prepare_hint}") from None
    written = path.stat().st_mtime_ns
    itemsize = np.dtype(DTYPES[manifest.dtype]).itemsize
    for split in SPLITS:
        for shard in manifest.shards[split]:
            sizes, checksums = shard.expected_bytes(itemsize), shard.files()
            for name, size in sizes.items():
                file = data_dir / name
                if not file.is_file():
                    raise ValueError(f"{file} is missing; {prepare_hint}")
                stat = file.stat()
                changed = stat.st_size != size
                if not changed and stat.st_mtime_ns > written:
                    changed = file_sha256(file) != checksums[name]
                if changed:
                    raise ValueError(f"{file} changed after prepare (checksum); {prepare_hint}")
    return manifest


class Codec:
    """Text to token ids and back: bytes (ids 0-255, end-of-text 256), or an HF `tokenizers`
    Tokenizer loaded from a tokenizer.json, whose end-of-text token is `eot_id`, else the token
    `eot`, else the first of KNOWN_EOT it has; an end-of-text token is one of the tokenizer's
    special or added tokens (an ordinary word would end documents that merely contain it).

    Raises:
        ValueError: not a tokenizer.json, or it has no such end-of-text token among its special
            and added tokens (name one with --eot).
    """

    def __init__(
        self, tokenizer_file: Path | None, eot: str | None = None, eot_id: int | None = None
    ):
        self.tokenizer = None
        if tokenizer_file is None:
            self.vocab_size, self.eot_id = BYTE_VOCABULARY, BYTE_VOCABULARY - 1
            return
        from tokenizers import Tokenizer  # only where a tokenizer is used

        try:
            self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        except Exception as error:  # tokenizers raises a bare Exception for a bad file
            raise ValueError(f"{tokenizer_file} is not a tokenizer.json ({error})") from None
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        if eot_id is not None:
            self.eot_id = eot_id
            return
        added = {token.content: i for i, token in self.tokenizer.get_added_tokens_decoder().items()}
        names = (eot,) if eot else KNOWN_EOT
        found = [added[name] for name in names if name in added]
        if not found:
            ordinary = eot is not None and self.tokenizer.token_to_id(eot) is not None
            kind = "is an ordinary token of" if ordinary else "is not a token of"
            what = (
                f"--eot {eot!r} {kind}" if eot else f"no end-of-text token ({', '.join(names)}) in"
            )
            special = ", ".join(list(added)[:8]) or "none"
            raise ValueError(
                f"{what} {tokenizer_file}; name one of its special or added tokens with --eot "
                f"(it has: {special})"
            )
        self.eot_id = found[0]

    @classmethod
    def for_corpus(cls, data_dir: Path, manifest: Manifest) -> Codec:
        """The tokenizer a corpus was prepared with (tokenizer.json beside its shards)."""
        if manifest.tokenizer == "bytes":
            return cls(None)
        return cls(data_dir / TOKENIZER_FILE, eot_id=manifest.eot_id)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids, no end-of-text added (the tokenizer's own threads)."""
        if self.tokenizer is None:
            return [list(text.encode("utf-8")) for text in texts]
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    def encode_with_ends(self, text: str) -> tuple[list[int], list[int]]:
        """The token ids of `text` (no end-of-text added) and where each token ends in it, in
        characters (a byte token ends with the character its byte belongs to)."""
        if self.tokenizer is None:
            ids = list(text.encode("utf-8"))
            ends = [end for end, char in enumerate(text, 1) for _ in char.encode("utf-8")]
            return ids, ends
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        return encoding.ids, [end for _, end in encoding.offsets]

    def decode(self, ids: list[int]) -> str:
        """The text of token ids; an end-of-text id becomes a blank line."""
        if self.tokenizer is None:
            pieces = [b"\n\n" if i == self.eot_id else bytes([i]) for i in ids if i <= 256]
            return b"".join(pieces).decode("utf-8", errors="replace")
        return self.tokenizer.decode(ids, skip_special_tokens=False)


class TokenWindows:
    """Non-overlapping windows of `block_size` + 1 tokens inside each shard of one split,
    read from memory-mapped shard files: no process copies the corpus, and DataLoader workers
    share its pages (the kernel's page cache) with the training process.

    `dataset[indices]` (a list of ints) returns `(inputs, targets)`, both int64
    `[B, block_size]`; targets are the inputs shifted left by one token. Window i of a shard
    starts at token i * block_size; a shard's last tokens that fill no window are not read.
    Each read maps the shards it needs and unmaps them after copying its windows out, as
    nanoGPT's reader does: a map kept open would keep every page a run has touched in the
    process's resident set, which would then grow towards the corpus's size.
    """

    def __init__(self, data_dir: Path, shards: tuple[Shard, ...], dtype: str, block_size: int):
        self.files = [data_dir / shard.file for shard in shards]
        self.dtype, self.block_size = DTYPES[dtype], block_size
        counts = [max(0, (shard.tokens - 1) // block_size) for shard in shards]
        self.first_window = np.cumsum([0, *counts])  # window index where each shard starts

    def __len__(self) -> int:
        return int(self.first_window[-1])

    def __getitem__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Raises IndexError: an index outside `[0, len(self))`."""
        import torch  # here: the rest of this module serves prepare, which needs no torch

        positions = np.asarray(indices, dtype=np.int64)
        if positions.size and not 0 <= positions.min() <= positions.max() < len(self):
            raise IndexError(f"windows {indices} are not all in [0, {len(self)})")
        shards = np.searchsorted(self.first_window, positions, side="right") - 1
        starts = (positions - self.first_window[shards]) * self.block_size
        span = self.block_size + 1
        windows = np.empty((len(positions), span), dtype=np.int64)  # [B, block_size + 1]
        for shard in np.unique(shards):
            tokens = np.memmap(self.files[shard], dtype=self.dtype, mode="r")
            for row in np.flatnonzero(shards == shard):
                windows[row] = tokens[starts[row] : starts[row] + span]
            del tokens  # unmapped here, before the next shard is mapped
        tokens = torch.from_numpy(windows)
        return tokens[:, :-1], tokens[:, 1:]
