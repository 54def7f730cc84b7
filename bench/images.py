"""Real images on CPU: prepare's throughput against a bare Pillow loop, prepare's resident
memory against the number of images, and the loader's headroom over a timm model's step at
224x224 with augmentation: `.venv-vision/bin/python bench/images.py [--images 20000]` (the
Python of scripts/_venv.sh's .venv-vision, where torchvision loads; ~5 minutes on 2 cores).

Throughput: `--images` JPEGs of 256x256 (10 classes; noise over a gradient, quality 90) are
prepared by the committed `cpu-single-fp32` sample's `images.prepare_images` at the default
storage size (256: every image decoded, converted and written, none resized) in one process
per core, against a bare loop that decodes and converts the same files with Pillow in a
multiprocessing pool of as many processes (`Image.open`, `draft`, `load`, `convert("RGB")`,
`numpy.asarray`): the ratio is prepare's share of the decode-bound ceiling.

Memory: prepare runs in a fresh process on a tenth of the images and on all of them; the peak
resident memory of that process and the largest of its workers (ru_maxrss) should not grow
with the number of images (the index, 40 bytes an image, aside).

Headroom: the sample's own `python -m cpu_single_fp32.data_headroom` on the prepared images with
`model_family=timm backbone=resnet18` (timm's random initialisation), `image_size=224`, random
resized crops and flips, micro-batches of 32 and `num_workers` = cores: batches per second of the
loader alone against the optimizer step (its printed line is quoted).

`--smoke`: 400 images, a headroom of 2 batches and 1 step of resnet10t on 64x64 crops of 8: a
check that every figure is still produced (seconds), not a figure to keep.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "generated_samples" / "cpu-single-fp32"
sys.path.insert(0, str(SAMPLE / "src"))
CLASSES = 10


def make_image(job: tuple[str, int]) -> None:
    from PIL import Image

    path, seed = job
    generator = np.random.default_rng(seed)
    ramp = np.linspace(0, 160, 256, dtype=np.float32)[None, :, None]
    pixels = (ramp + generator.integers(0, 96, (256, 256, 3))).astype(np.uint8)
    Image.fromarray(pixels).save(path, quality=90)


def make_images(root: Path, count: int) -> list[str]:
    for number in range(CLASSES):
        (root / "train" / f"class{number}").mkdir(parents=True, exist_ok=True)
    paths = [str(root / "train" / f"class{i % CLASSES}" / f"{i:06d}.jpg") for i in range(count)]
    with Pool(os.cpu_count()) as pool:
        pool.map(make_image, [(path, i) for i, path in enumerate(paths)], chunksize=64)
    return paths


def bare_decode(path: str) -> int:
    from PIL import Image

    with Image.open(path) as image:
        image.draft("RGB", (256, 256))
        image.load()
        return np.asarray(image.convert("RGB")).nbytes


def bare_loop(paths: list[str]) -> float:
    """Images per second of a Pillow decode in a pool of one process per core."""
    started = time.perf_counter()
    with Pool(os.cpu_count()) as pool:
        sum(pool.imap(bare_decode, paths, chunksize=8))
    return len(paths) / (time.perf_counter() - started)


PREPARE_CHILD = """
import resource, sys, time
from pathlib import Path
from cpu_single_fp32.images import Options, prepare_images
started = time.perf_counter()
manifest = prepare_images([sys.argv[1]], Path(sys.argv[2]), Options(), workers=int(sys.argv[3]))
seconds = time.perf_counter() - started
images = manifest.images("train") + manifest.images("val")
own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(images, seconds, own, workers)
"""


def prepare_run(source: Path, out: Path) -> tuple[int, float, int, int]:
    """(images, seconds, peak KiB of prepare, peak KiB of its largest worker)."""
    env = {**os.environ, "PYTHONPATH": str(SAMPLE / "src")}
    command = [sys.executable, "-c", PREPARE_CHILD, str(source), str(out), str(os.cpu_count())]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    images, seconds, own, workers = result.stdout.split()
    return int(images), float(seconds), int(own), int(workers)


def subset(root: Path, paths: list[str], count: int) -> Path:
    """A folder of links to the first `count` images, in the same class layout."""
    target = root.parent / f"subset-{count}"
    for path in paths[:count]:
        link = target / Path(path).relative_to(root)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(path)
    return target


HEADROOM = {"backbone": "resnet18", "image_size": 224, "micro_batch_size": 32}
SMOKE_HEADROOM = {"backbone": "resnet10t", "image_size": 64, "micro_batch_size": 8}


def headroom(data_dir: Path, batches: int, steps: int, model: dict[str, object]) -> str:
    """The sample's data_headroom line for `model`'s backbone, crop size and micro-batch."""
    env = {**os.environ, "PYTHONPATH": str(SAMPLE / "src")}
    overrides = [
        f"data_dir={data_dir}",
        "model_family=timm",
        *(f"{key}={value}" for key, value in model.items()),
        f"num_workers={os.cpu_count()}",
        "device=cpu",
        "tensorboard=false",
        "plot=false",
        f"run_dir={data_dir.parent / 'run'}",
    ]
    command = [sys.executable, "-m", "cpu_single_fp32.data_headroom"]
    command += ["--batches", str(batches), "--steps", str(steps), *overrides]
    result = subprocess.run(command, env=env, capture_output=True, text=True, cwd=SAMPLE)
    lines = (result.stdout + result.stderr).strip().splitlines()
    return next((line for line in reversed(lines) if "headroom" in line.lower()), lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--batches", type=int, default=40, help="loader batches timed")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps timed")
    parser.add_argument("--smoke", action="store_true", help="check every figure runs (seconds)")
    args = parser.parse_args()
    model = SMOKE_HEADROOM if args.smoke else HEADROOM
    if args.smoke:
        args.images, args.batches, args.steps = 400, 2, 1
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "photos"
        started = time.perf_counter()
        paths = make_images(root, args.images)
        print(f"made {len(paths):,} JPEGs of 256x256 in {time.perf_counter() - started:.0f} s")
        bare = bare_loop(paths)
        images, seconds, own, workers = prepare_run(root, Path(folder) / "prepared")
        rate = images / seconds
        print(
            f"prepare: {rate:,.0f} images/s; bare Pillow pool: {bare:,.0f} images/s; "
            f"ratio {rate / bare:.2f} ({os.cpu_count()} processes each)"
        )
        small = args.images // 10
        few = prepare_run(subset(root, paths, small), Path(folder) / "prepared-small")
        print(
            f"peak resident memory, {small:,} images: prepare {few[2] / 1024:,.0f} MiB, "
            f"a worker {few[3] / 1024:,.0f} MiB; {images:,} images: prepare "
            f"{own / 1024:,.0f} MiB, a worker {workers / 1024:,.0f} MiB"
        )
        line = headroom(Path(folder) / "prepared", args.batches, args.steps, model)
        print(f"headroom: {line}")


if __name__ == "__main__":
    main()
