"""Prepared images: `manifest.json` and the uint8 shards `prepare` writes beside it, read back
memory-mapped, one image at a time.

Per split (train, val): shard files `<split>-<job>.pixels` (the manifest lists them in order),
each the images' RGB bytes one after another (`[height, width, 3]` each, row-major), and
`<split>.index.npy`, int64 `[images, 5]`: each image's shard number, byte offset, height, width
and class id, in the order prepare read them. The manifest is the contract between prepare and
training: the classes in class-id order, the storage size (every image's shorter side), counts
per class and split, the files with their SHA-256, the images skipped as unreadable, and the
request (sources with sizes and modification times, and the settings) that prepared them. It
is written last: a folder without one holds nothing a run would read.

Nothing here imports torch: prepare's worker processes import this.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST = "manifest.json"
FORMAT = 1
SPLITS = ("train", "val")
INDEX_COLUMNS = ("shard", "offset", "height", "width", "label")
CHUNK_BYTES = 1 << 24  # what hashing a shard holds in memory at once


@dataclass(frozen=True)
class ImageManifest:
    """What a prepared image folder holds (module docstring); `files` maps each file to its
    SHA-256, `shards[split]` lists the split's shard files in order, `index[split]` names its
    index file, `counts[split][class]` its images per class."""

    classes: tuple[str, ...]
    image_size: int
    counts: dict[str, dict[str, int]]
    shards: dict[str, list[str]]
    index: dict[str, str]
    files: dict[str, str]
    skipped: list[dict[str, str]] = field(default_factory=list)
    val_from: str = "val folders"
    request: dict[str, Any] = field(default_factory=dict)
    format: int = FORMAT
    kind: str = "images"

    def images(self, split: str) -> int:
        """The number of images of `split`."""
        return sum(self.counts[split].values())

    def fingerprint(self) -> str:
        """The identity of the prepared content: a SHA-256 of every file's checksum and the
        classes. The same sources prepared with the same settings give the same fingerprint."""
        named = json.dumps([self.classes, sorted(self.files.items())])
        return hashlib.sha256(named.encode()).hexdigest()

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ImageManifest:
        fields = json.loads(text)
        return cls(**{**fields, "classes": tuple(fields["classes"])})


def manifest_at(path: Path) -> ImageManifest | None:
    """The manifest at `path`, or None where there is none (or not an image manifest)."""
    try:
        manifest = ImageManifest.from_json(path.read_text())
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return manifest if manifest.format == FORMAT and manifest.kind == "images" else None


def read_manifest(data_dir: Path, prepare_hint: str) -> ImageManifest:
    """The manifest of the images prepared in `data_dir`, its files checked for size.

    Raises:
        ValueError: no manifest there (`prepare_hint` says how to make one), or a file missing
            or of the wrong size (a copy that did not finish).
    """
    manifest = manifest_at(data_dir / MANIFEST)
    if manifest is None:
        raise ValueError(f"no prepared images in {data_dir}: {prepare_hint}")
    for split in SPLITS:
        index = np.load(data_dir / manifest.index[split], mmap_mode="r")
        ends = np.zeros(len(manifest.shards[split]), dtype=np.int64)  # one pass, not per row
        np.maximum.at(ends, index[:, 0], index[:, 1] + index[:, 2] * index[:, 3] * 3)
        for number, name in enumerate(manifest.shards[split]):
            path = data_dir / name
            size = path.stat().st_size if path.is_file() else -1
            if size < ends[number]:
                raise ValueError(
                    f"{path} is missing or shorter than its index says ({size} bytes): "
                    "prepare the images again"
                )
    return manifest


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


class StoredImages:
    """One split of a prepared folder: `len()` images, `labels` int64 `[N]`, `pixels(i)` a
    read-only uint8 `[height, width, 3]` view of image i in its memory-mapped shard.

    The shards are mapped on first use in each process (a DataLoader worker maps its own; the
    object pickles without them), so resident memory is what the pages read hold, whatever the
    number of images.
    """

    def __init__(self, data_dir: Path, manifest: ImageManifest, split: str):
        self.paths = [data_dir / name for name in manifest.shards[split]]
        self.index = np.load(data_dir / manifest.index[split])
        self.labels = self.index[:, INDEX_COLUMNS.index("label")].copy()
        self._shards: list[np.memmap] | None = None

    def __len__(self) -> int:
        return len(self.index)

    def pixels(self, i: int) -> np.ndarray:
        if self._shards is None:
            self._shards = [np.memmap(path, dtype=np.uint8, mode="r") for path in self.paths]
        shard, offset, height, width, _ = (int(value) for value in self.index[i])
        flat = self._shards[shard][offset : offset + height * width * 3]
        return flat.reshape(height, width, 3)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_shards": None}
