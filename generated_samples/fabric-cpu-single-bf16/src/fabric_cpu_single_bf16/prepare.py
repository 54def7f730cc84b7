"""Prepare images: `python -m fabric_cpu_single_bf16.prepare SOURCES... [--out DIR]`.

The command line of `images.prepare_images` (images/pipeline.py says what it reads, how, and
what it writes), and how to train on what it prepared (`data_dir` in the config: data.py reads
the classes from the manifest).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from .config import Config, command_parser, load_config, user_errors
from .images import EVAL_CROP, ImageManifest, Options, prepare_images

DEFAULT_OUT = "data/images"


def main(argv: list[str] | None = None) -> ImageManifest:
    """Entry point; prints a line per phase, then what was prepared and how to train on it."""
    parser = command_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "sources", nargs="+", metavar="SOURCES", help="class folders or .csv/.parquet tables"
    )
    parser.add_argument("--config", default="configs/train.toml", help="defaults of the options")
    parser.add_argument("--out", help=f"the prepared folder (default: data_dir, or {DEFAULT_OUT})")
    parser.add_argument(
        "--image-size", type=int, help="stored shorter side (default: image_size / 0.875)"
    )
    parser.add_argument("--val-fraction", type=float, help="held out of each class (config's)")
    parser.add_argument("--max-bad", type=int, default=100, help="unreadable images skipped")
    parser.add_argument("--workers", type=int, help="decoding processes (default: CPUs)")
    args = parser.parse_args(argv)
    with user_errors():
        config = load_config(args.config, [])
        out = Path(args.out or config.data_dir or DEFAULT_OUT)
        if args.workers is not None and args.workers < 1:
            raise ValueError(f"--workers must be at least 1, got {args.workers}")
        options = Options(
            image_size=args.image_size or round(config.image_size / EVAL_CROP),
            val_fraction=config.val_fraction if args.val_fraction is None else args.val_fraction,
            seed=config.seed,
            max_bad=args.max_bad,
        )
        started = time.perf_counter()
        try:
            manifest = prepare_images(
                args.sources,
                out,
                options,
                workers=args.workers or os.cpu_count() or 1,
                progress=sys.stderr.isatty(),
                log=lambda line: print(f"prepare: {line}", file=sys.stderr, flush=True),
            )
        except KeyboardInterrupt:
            print(f"interrupted: {out} is as it was before", file=sys.stderr)
            raise SystemExit(130) from None
    seconds = time.perf_counter() - started
    train, val = manifest.images("train"), manifest.images("val")
    print(
        f"{out}: {train:,} train and {val:,} validation images ({manifest.val_from}) of "
        f"{len(manifest.classes)} classes, shorter side {manifest.image_size} px, in "
        f"{seconds:.1f} s"
    )
    if manifest.skipped:
        listed = "; ".join(entry["reason"] for entry in manifest.skipped[:5])
        print(f"skipped {len(manifest.skipped)} unreadable image(s): {listed}")
    print(training_advice(out, config))
    return manifest


def training_advice(out: Path, config: Config) -> str:
    """The command that trains on the prepared images: `data_dir` set where it is not `out`."""
    command = "python -m fabric_cpu_single_bf16.train"
    if Path(config.data_dir or "") == out:
        return f"to train on it: {command}"
    return f"to train on it: {command} data_dir={out} (or set data_dir in configs/train.toml)"


if __name__ == "__main__":
    main()
