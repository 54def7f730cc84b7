"""The language model's data path, measured: `python bench/data.py [--megabytes 200] [--readme]`.

1. Prepare throughput. A corpus of ~`--megabytes` MB of text files (the standard library's
   source, repeated with each copy's lines numbered so that no two copies are equal) is
   tokenized with a byte-level BPE of 8,192 tokens trained on its first 16 MB (HF
   `tokenizers`), three ways: the rendered project's `prepare` with its worker processes (one
   per core) and with one process, and, as the reference, the `tokenizers` library's own
   `encode_batch` over the same documents in one process (its own threads on every core),
   keeping the ids in memory and writing nothing. MB/s of source text; the target is prepare at
   >= 0.8x the reference.
2. Resident memory of a reader. Token shards of ~10 MB and ~1 GB (random ids, written
   directly) are read by the project's `TokenWindows` through its training DataLoader, 2,000
   micro-batches of 32 x 1,024 tokens each (epoch after epoch for the small one), in a fresh
   process; the growth of its resident set (VmRSS) over the reads is printed. The target:
   the two growths differ by < 50 MB.

Figures, not asserts. `--readme` writes the tables into bench/README.md between its markers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
MARKERS = ("<!-- data: start -->", "<!-- data: end -->")
VARIANT = "lm-cpu-single-fp32"


def write_corpus(folder: Path, megabytes: int) -> int:
    """Text files of ~8 MB in `folder`, ~`megabytes` MB in all; returns their bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    sources = sorted(p for p in root.glob("*.py"))
    text = "".join(p.read_text(encoding="utf-8", errors="replace") for p in sources)
    lines = text.splitlines(keepends=True)
    total, copy = 0, 0
    while total < megabytes * 10**6:
        numbered = "".join(f"{copy}:{n} {line}" for n, line in enumerate(lines))
        data = numbered.encode("utf-8")
        for start in range(0, len(data), 8 * 10**6):
            piece = data[start : start + 8 * 10**6]
            (folder / f"part-{copy:03d}-{start // (8 * 10**6):02d}.txt").write_bytes(piece)
            total += len(piece)
        copy += 1
    return total


def prepare_table(project: Path, megabytes: int) -> str:
    """Prepare's throughput against `encode_batch` (see the module docstring)."""
    sys.path.insert(0, str(project / "src"))
    from lm.prepare import prepare, train_bpe
    from lm.sources import DOCUMENT_BYTES, documents, find_sources
    from tokenizers import Tokenizer

    rows = ["| what | seconds | MB/s | / encode_batch |", "| --- | --- | --- | --- |"]
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "text"
        folder.mkdir()
        size = write_corpus(folder, megabytes)
        sources = find_sources([str(folder)])
        tokenizer_file = Path(scratch) / "tokenizer.json"
        start = time.perf_counter()
        train_bpe(sources, "text", 8192, 16 * 10**6, tokenizer_file)
        trained = time.perf_counter() - start

        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        start = time.perf_counter()
        batch, size_of_batch, tokens = [], 0, 0
        for source in sources:
            for text in documents(source, "text", None, DOCUMENT_BYTES):
                batch.append(text)
                size_of_batch += len(text)
                if size_of_batch >= 1 << 22:
                    tokens += sum(len(e.ids) for e in tokenizer.encode_batch(batch))
                    batch, size_of_batch = [], 0
        tokens += sum(len(e.ids) for e in tokenizer.encode_batch(batch))
        reference = time.perf_counter() - start

        timings = {}
        for workers in (os.cpu_count() or 1, 1):
            out = Path(scratch) / f"corpus-{workers}"
            start = time.perf_counter()
            prepare([str(folder)], out, str(tokenizer_file), workers=workers, progress=False)
            timings[workers] = time.perf_counter() - start

    megabyte = size / 10**6
    rows.append(f"| train the BPE (16 MB sample) | {trained:.1f} | {16 / trained:.1f} | |")
    rows.append(
        f"| `encode_batch`, one process | {reference:.1f} | {megabyte / reference:.1f} | 1.00 |"
    )
    for workers, seconds in timings.items():
        ratio = reference / seconds
        rows.append(
            f"| `prepare`, {workers} worker(s) | {seconds:.1f} | {megabyte / seconds:.1f} | "
            f"{ratio:.2f} |"
        )
    header = f"{megabyte:,.0f} MB of text, {tokens:,} tokens (BPE of 8,192), {os.cpu_count()} cores"
    return header + "\n\n" + "\n".join(rows)


READER = r"""
import dataclasses, json, sys
from pathlib import Path
from lm.config import load_config
from lm.corpus import Manifest, TokenWindows
from lm.loader import make_train_loader
from lm.runtime import init_runtime

def rss() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
folder = Path(sys.argv[1])
manifest = Manifest.from_json((folder / "manifest.json").read_text())
config = dataclasses.replace(load_config("configs/train.toml"), micro_batch_size=32)
windows = TokenWindows(folder, manifest.shards["train"], manifest.dtype, block_size=1024)
loader = make_train_loader(windows, config, init_runtime("cpu"))
def forever():
    while True:
        yield from loader
batches = forever()
next(batches)
before = rss()
for _ in range(1999):
    next(batches)
print(json.dumps({"growth": rss() - before, "windows": len(windows)}))
"""


def memory_table(project: Path) -> str:
    """Resident-set growth of a reader of a ~10 MB and a ~1 GB corpus (module docstring)."""
    import numpy as np

    sys.path.insert(0, str(project / "src"))
    from lm.corpus import Manifest, Shard, file_sha256

    rows = ["| corpus | tokens | RSS growth over 2,000 micro-batches |", "| --- | --- | --- |"]
    generator = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as scratch:
        for label, tokens in (("~10 MB", 5 * 10**6), ("~1 GB", 5 * 10**8)):
            folder = Path(scratch) / label.strip("~ ")
            folder.mkdir()
            shards = []
            for number, start in enumerate(range(0, tokens, 10**8)):
                count = min(10**8, tokens - start)
                path = folder / f"train-{number:05d}.bin"
                generator.integers(0, 257, count, dtype=np.uint16).tofile(path)
                shards.append(Shard(path.name, count, file_sha256(path)))
            manifest = Manifest(
                tokenizer="bytes",
                vocab_size=257,
                eot_id=256,
                dtype="uint16",
                shards={"train": tuple(shards), "val": ()},
                documents={"train": 1, "val": 0},
                source_bytes=tokens,
                request={},
            )
            (folder / "manifest.json").write_text(manifest.to_json())
            env = {**os.environ, "PYTHONPATH": str(project / "src"), "OMP_NUM_THREADS": "1"}
            result = subprocess.run(
                [sys.executable, "-c", READER, str(folder)],
                cwd=project,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            growth = json.loads(result.stdout.splitlines()[-1])["growth"]
            rows.append(f"| {label} | {tokens:,} | {growth / 2**20:.1f} MiB |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=200, help="size of the text corpus")
    parser.add_argument("--readme", action="store_true", help="write the tables into README.md")
    args = parser.parse_args()
    from scaffold.samples import render_variant

    with tempfile.TemporaryDirectory() as scratch:
        project = Path(scratch) / "lm"
        render_variant(VARIANT, project)
        text = "Prepare throughput:\n\n" + prepare_table(project, args.megabytes)
        text += "\n\nReader memory:\n\n" + memory_table(project)
    print(text)
    if args.readme:
        readme = BENCH / "README.md"
        content = readme.read_text()
        start, end = content.index(MARKERS[0]), content.index(MARKERS[1])
        stamp = f"Measured {time.strftime('%Y-%m-%d')} with `python bench/data.py`.\n\n"
        new = content[: start + len(MARKERS[0])] + "\n" + stamp + text + "\n" + content[end:]
        readme.write_text(new)


if __name__ == "__main__":
    sys.exit(main())
