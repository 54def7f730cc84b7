"""Decode labelled images into uint8 shards: `prepare_images(sources, out, options)`, which
`python -m <package>.prepare SOURCES...` runs.

SOURCES are class folders or tables (sources.py). Every image is decoded by Pillow in
`workers` processes, EXIF-oriented, converted to RGB and resized to the storage size (its
shorter side, decode.py), then appended in the sources' order to its split's shards (store.py).
The validation split is the sources' `val/` images where they have any, else a fixed
`val_fraction` of each class, drawn from the seed and the class name (the same images at every
prepare of the same sources). An image Pillow cannot read whole is skipped and listed in the
manifest, up to `max_bad` of them: more than that fails the prepare, as most likely something
is wrong with the sources rather than with a few files.

Memory is bounded whatever the number of images: a worker decodes a job of consecutive images
(JOB_IMAGES at most) straight into shard files of its own and hashes them, so only index rows
travel back, and the shards keep the sources' order. Everything is written in a temporary
folder that replaces `out` only once complete (state_io.scratch_folder): an interrupted or
failed prepare leaves `out` as it was. A re-run on unchanged sources (paths, sizes and
modification times) with the same settings does nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ..state_io import (
    atomic_write_text,
    check_replaceable,
    locked,
    remove_stale_scratch,
    replace_folder,
    scratch_folder,
)
from .decode import BadImage, decode_image
from .sources import Found, Item, find_images
from .store import FORMAT, MANIFEST, SPLITS, ImageManifest, file_sha256, manifest_at

JOB_IMAGES = 1024  # a job's images, decoded by one worker into a shard per split (~200 MB at 256)


@dataclass(frozen=True)
class Options:
    """prepare's settings: `image_size` the stored shorter side (pixels), `val_fraction` of
    each class held out where the sources have no `val/` images, `seed` of that draw, `max_bad`
    unreadable images skipped before prepare fails."""

    image_size: int = 256
    val_fraction: float = 0.1
    seed: int = 0
    max_bad: int = 100

    def check(self) -> None:
        """Raises ValueError for a setting outside its range."""
        if self.image_size < 8:
            raise ValueError(f"--image-size must be at least 8 pixels, got {self.image_size}")
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"--val-fraction must be in (0, 1), got {self.val_fraction}")
        if self.max_bad < 0:
            raise ValueError(f"--max-bad must be 0 or more, got {self.max_bad}")


def prepare_images(
    sources: list[str],
    out: Path,
    options: Options | None = None,
    workers: int = 0,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> ImageManifest:
    """Prepare the images of `sources` in `out` (module docstring) in `workers` processes (0:
    this one); return the manifest. `progress` shows a bar in images/s; `log` gets a line per
    phase.

    Raises:
        ValueError: bad options or sources (sources.find_images), more than `max_bad`
            unreadable images, or a class or split left without images. Nothing is written
            then, and what `out` held is kept; so it is on KeyboardInterrupt.
    """
    say = log or (lambda line: None)
    options = options or Options()
    options.check()
    started = time.perf_counter()
    found = find_images(sources)
    check_replaceable(out, MANIFEST, [Path(source) for source in sources])
    request = {
        "format": FORMAT,
        "sources": [source_record(item) for item in found.items],
        "options": dataclasses.asdict(options),
    }
    say(
        f"found {len(found.items):,} images of {len(found.classes)} classes in "
        f"{time.perf_counter() - started:.1f} s"
        + (f" ({found.not_images} other files skipped)" if found.not_images else "")
    )
    existing = manifest_at(out / MANIFEST)
    if existing is not None and existing.request == request:
        with locked(out.parent, wait=True):
            remove_stale_scratch(out)  # what an interrupted prepare left
        say(f"{out} is up to date with its sources and settings")
        return existing
    splits = assign_splits(found, options)
    made = [folder for folder in (out.parent, *out.parent.parents) if not folder.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with scratch_folder(out) as scratch:
            manifest = write_images(found, splits, scratch, options, request, workers, progress)
            atomic_write_text(manifest.to_json(), scratch / MANIFEST)  # last: complete
            with locked(out.parent, wait=True):
                replace_folder(scratch, out, MANIFEST)
    except BaseException:
        for folder in made:  # the folders this call made, the deepest first: left empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    return manifest


def source_record(item: Item) -> dict[str, Any]:
    """What identifies a source image in the request: path, label, split, size, mtime."""
    stat = item.path.stat()
    return {
        "path": str(item.path),
        "label": item.label,
        "split": item.split,
        "bytes": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
    }


def assign_splits(found: Found, options: Options) -> list[str]:
    """Each item's split: the sources' own where they name a validation split; else
    `val_fraction` of each class (rounded, at least one image where the class has two or
    more), drawn by a generator seeded with the seed and the class name."""
    if found.has_val:
        return [item.split or "train" for item in found.items]
    splits = ["train"] * len(found.items)
    by_class: dict[str, list[int]] = {}
    for number, item in enumerate(found.items):
        by_class.setdefault(item.label, []).append(number)
    for label, numbers in by_class.items():
        held = min(max(round(len(numbers) * options.val_fraction), 1), len(numbers) - 1)
        for number in random.Random(f"{options.seed}:{label}").sample(numbers, held):
            splits[number] = "val"
    return splits


@dataclass(frozen=True)
class Job:
    """Consecutive images (in the sources' order) that one worker decodes into shard files of
    its own: (position in the sources, path, split, class id) each."""

    number: int
    images: tuple[tuple[int, str, str, int], ...]


@dataclass
class JobResult:
    """What a job wrote: per split its shard file (None: no image of that split) with its
    SHA-256 and index rows (shard column 0 until the job's place is known), and the images
    skipped as unreadable ({"path", "reason"})."""

    number: int
    files: dict[str, tuple[str, str] | None]
    rows: dict[str, list[tuple[int, int, int, int, int]]]
    skipped: list[dict[str, str]]


def make_jobs(found: Found, splits: list[str], workers: int) -> list[Job]:
    """The images in jobs of at most JOB_IMAGES, at least four per worker where there are
    that many images (the last jobs are short: the pool balances them)."""
    class_ids = {label: number for number, label in enumerate(found.classes)}
    images = [
        (number, str(item.path), splits[number], class_ids[item.label])
        for number, item in enumerate(found.items)
    ]
    size = max(1, min(JOB_IMAGES, -(-len(images) // (4 * max(workers, 1)))))
    return [
        Job(number, tuple(images[start : start + size]))
        for number, start in enumerate(range(0, len(images), size))
    ]


def decode_job(job: Job, scratch: Path, image_size: int) -> JobResult:
    """A worker's call: decode `job`'s images into `scratch`/<split>-<job>.pixels (one file
    per split, images one after another), hash them; unreadable images are skipped."""
    result = JobResult(job.number, {}, {split: [] for split in SPLITS}, [])
    offsets = dict.fromkeys(SPLITS, 0)
    with contextlib.ExitStack() as stack:
        files = {}
        for _, path, split, label in job.images:
            try:
                pixels = decode_image(Path(path), image_size)
            except BadImage as error:
                result.skipped.append({"path": path, "reason": str(error)})
                continue
            if split not in files:
                name = f"{split}-{job.number:05d}.pixels"
                files[split] = (name, stack.enter_context(open(scratch / name, "wb")))
            files[split][1].write(pixels.tobytes())
            height, width, _ = pixels.shape
            result.rows[split].append((0, offsets[split], height, width, label))
            offsets[split] += pixels.nbytes
    for split in SPLITS:
        name = files[split][0] if split in files else None
        result.files[split] = (name, file_sha256(scratch / name)) if name else None
    return result


def ignore_interrupts() -> None:
    """A worker leaves the terminal's Ctrl-C to prepare, which ends the pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def write_images(
    found: Found,
    splits: list[str],
    scratch: Path,
    options: Options,
    request: dict[str, Any],
    workers: int,
    progress: bool,
) -> ImageManifest:
    """Decode every image into `scratch`'s shards, a job of consecutive images at a time in
    `workers` processes (each writes and hashes its own shard files: nothing but index rows
    comes back); the manifest. The shards keep the sources' order: a job's shard follows the
    one before it, whichever worker finished first."""
    jobs = make_jobs(found, splits, workers)
    shards = {split: [] for split in SPLITS}
    rows = {split: [] for split in SPLITS}
    files, skipped = {}, []
    counts = {split: Counter() for split in SPLITS}
    pool = None
    if workers:
        pool = get_context("spawn").Pool(workers, initializer=ignore_interrupts)
    decode = functools.partial(decode_job, scratch=scratch, image_size=options.image_size)
    try:
        results = pool.imap(decode, jobs) if pool else map(decode, jobs)
        bar = tqdm(total=len(found.items), unit="img", disable=not progress, smoothing=0.05)
        with bar:
            for job, result in zip(jobs, results, strict=True):
                bar.update(len(job.images))
                skipped += result.skipped
                if len(skipped) > options.max_bad:
                    raise ValueError(too_many_bad(skipped, options.max_bad))
                for split in SPLITS:
                    if result.files[split] is None:
                        continue
                    name, sha256 = result.files[split]
                    files[name] = sha256
                    number = len(shards[split])
                    shards[split].append(name)
                    rows[split] += [(number, *row[1:]) for row in result.rows[split]]
                    counts[split].update(found.classes[row[-1]] for row in result.rows[split])
    finally:
        if pool is not None:
            pool.terminate()  # done, or stopping early: nothing left to wait for
            pool.join()
    for split in SPLITS:
        empty = [label for label in found.classes if counts[split][label] == 0]
        if split == "train" and empty:
            raise ValueError(
                f"class(es) {', '.join(empty)} have no readable training images; add some or "
                "remove them"
            )
        if not rows[split]:
            raise ValueError(f"no readable {split} images; add some")
    index = {}
    for split in SPLITS:
        index[split] = f"{split}.index.npy"
        np.save(scratch / index[split], np.array(rows[split], dtype=np.int64))
        files[index[split]] = file_sha256(scratch / index[split])
    return ImageManifest(
        classes=found.classes,
        image_size=options.image_size,
        counts={
            split: {label: counts[split][label] for label in found.classes} for split in SPLITS
        },
        shards=shards,
        index=index,
        files=files,
        skipped=skipped,
        val_from="val folders" if found.has_val else f"{options.val_fraction:g} of each class",
        request=request,
    )


def too_many_bad(skipped: list[dict[str, str]], max_bad: int) -> str:
    """The error of more than `max_bad` unreadable images, naming the first few."""
    first = "; ".join(entry["reason"] for entry in skipped[:3])
    return (
        f"more than {max_bad} images could not be read (first: {first}); fix or remove them, "
        "or raise --max-bad"
    )
