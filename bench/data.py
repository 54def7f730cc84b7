"""The language model's data path, measured: `python bench/data.py [--megabytes 200] [--readme]`
(`--smoke`: every table at SMOKE's sizes, in seconds: a check that they are still produced).

1. Prepare throughput. A corpus of ~`--megabytes` MB of text files (the standard library's
   source, repeated with each copy's lines numbered so that no two copies are equal) is
   tokenized with a byte-level BPE of 8,192 tokens trained on its first 16 MB (HF
   `tokenizers`), three ways: the rendered project's `prepare` with its worker processes (one
   per core) and with one process, and, as the reference, the `tokenizers` library's own
   `encode_batch` over the same documents in one process (its own threads on every core),
   keeping the ids in memory and writing nothing. MB/s of source text; the target is prepare at
   >= 0.8x the reference.
2. Prepare's peak memory. 60 MB of text as one JSON-lines record, and the same bytes as 1,000
   records of 60 KB, each prepared with that BPE in one worker process; the peak resident set
   of the largest process of each prepare (`ru_maxrss` of its process tree). The target: within
   200 MB of each other (a document is encoded in bounded pieces, whatever its size).
3. Stopping prepare. `prepare` with a worker per core is sent SIGINT (as Ctrl-C) or SIGTERM a
   second into its work; the seconds until it has exited, and the processes of its group left
   after that (its workers: the target is none, within a few seconds).
4. Resident memory of a reader. Token shards of ~10 MB and ~1 GB (random ids, written
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
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
MARKERS = ("<!-- data: start -->", "<!-- data: end -->")
VARIANT = "lm-cpu-single-fp32"


@dataclass(frozen=True)
class Sizes:
    """What the tables measure (the module docstring's figures); SMOKE's are the smallest."""

    megabytes: int = 200  # the text corpus of the throughput table
    vocab_size: int = 8192  # the BPE's tokens
    bpe_sample_bytes: int = 16 * 10**6  # the text the BPE is trained on
    record_bytes: int = 60 * 10**6  # the one record of the memory table (1,000 others hold it too)
    signal_after: float = 1.0  # seconds into prepare's work that the stop signal is sent
    reader_tokens: tuple[int, int] = (5 * 10**6, 5 * 10**8)  # the two corpora a reader reads
    reader_batches: int = 2000  # micro-batches the reader reads


SMOKE = Sizes(1, 512, 10**6, 10**6, 0.2, (10**5, 10**6), 20)


def megabytes(size: int) -> str:
    """`size` bytes as the tables name them: "60 MB", "~1 GB"."""
    return f"{size / 10**9:g} GB" if size >= 10**9 else f"{size / 10**6:g} MB"


def write_corpus(folder: Path, size_mb: int) -> int:
    """Text files of ~8 MB in `folder`, `size_mb` MB in all (below 64 MB, a smoke run's, in
    200 files: a ~10% validation split drawn by each document's hash then holds some out);
    returns their bytes."""
    lines = stdlib_text().splitlines(keepends=True)
    total, copy, wanted = 0, 0, size_mb * 10**6
    file_bytes = 8 * 10**6 if wanted >= 64 * 10**6 else wanted // 200
    while total < wanted:
        numbered = "".join(f"{copy}:{n} {line}" for n, line in enumerate(lines))
        data = numbered.encode("utf-8")
        for start in range(0, len(data), file_bytes):
            piece = data[start : start + min(file_bytes, wanted - total)]
            if not piece:
                break
            (folder / f"part-{copy:03d}-{start // file_bytes:04d}.txt").write_bytes(piece)
            total += len(piece)
        copy += 1
    return total


def train_tokenizer(project: Path, folder: Path, out: Path, sizes: Sizes) -> float:
    """Train the BPE of `sizes.vocab_size` tokens on `folder`'s first `sizes.bpe_sample_bytes`
    into `out`; its seconds."""
    sys.path.insert(0, str(project / "src"))
    from lm.corpus.jobs import train_bpe
    from lm.corpus.pipeline import DOCUMENT_BYTES
    from lm.corpus.sources import find_sources
    from lm.corpus.survey import survey_source

    sources = find_sources([str(folder)]).files
    surveys = [survey_source(path, "text", DOCUMENT_BYTES, "utf-8", None, 0.1) for path in sources]
    start = time.perf_counter()
    train_bpe(surveys, "text", DOCUMENT_BYTES, sizes.vocab_size, sizes.bpe_sample_bytes, out, False)
    return time.perf_counter() - start


def prepare_table(project: Path, sizes: Sizes, scratch: Path) -> str:
    """Prepare's throughput against `encode_batch` (see the module docstring)."""
    sys.path.insert(0, str(project / "src"))
    from lm.corpus.documents import Piece, read_pieces
    from lm.corpus.pipeline import DOCUMENT_BYTES, Options, prepare
    from lm.corpus.sources import find_sources
    from lm.corpus.survey import survey_source
    from tokenizers import Tokenizer

    rows = ["| what | seconds | MB/s | / encode_batch |", "| --- | --- | --- | --- |"]
    folder = scratch / "text"
    folder.mkdir()
    size = write_corpus(folder, sizes.megabytes)
    tokenizer_file = scratch / "tokenizer.json"
    trained = train_tokenizer(project, folder, tokenizer_file, sizes)

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    start = time.perf_counter()
    batch, size_of_batch, tokens = [], 0, 0
    for path in find_sources([str(folder)]).files:
        surveyed = survey_source(path, "text", DOCUMENT_BYTES, "utf-8", None, 0.1)
        for span in surveyed.spans:
            for piece in read_pieces(path, "text", surveyed.layout, span, "text", DOCUMENT_BYTES):
                if isinstance(piece, Piece):
                    batch.append(piece.text)
                    size_of_batch += len(piece.text)
                if size_of_batch >= 1 << 22:
                    tokens += sum(len(e.ids) for e in tokenizer.encode_batch(batch))
                    batch, size_of_batch = [], 0
    tokens += sum(len(e.ids) for e in tokenizer.encode_batch(batch))
    reference = time.perf_counter() - start

    timings = {}
    for workers in (os.cpu_count() or 1, 1):
        start = time.perf_counter()
        options = Options(tokenizer=str(tokenizer_file))
        prepare([str(folder)], scratch / f"corpus-{workers}", options, workers=workers)
        timings[workers] = time.perf_counter() - start

    megabyte, sample = size / 10**6, min(size, sizes.bpe_sample_bytes)
    rows.append(
        f"| train the BPE ({megabytes(sample)} sample) | {trained:.1f} | "
        f"{sample / 10**6 / trained:.1f} | |"
    )
    rows.append(
        f"| `encode_batch`, one process | {reference:.1f} | {megabyte / reference:.1f} | 1.00 |"
    )
    for workers, seconds in timings.items():
        ratio = reference / seconds
        rows.append(
            f"| `prepare`, {workers} worker(s) | {seconds:.1f} | {megabyte / seconds:.1f} | "
            f"{ratio:.2f} |"
        )
    header = (
        f"{megabyte:,.0f} MB of text, {tokens:,} tokens (BPE of {sizes.vocab_size:,}), "
        f"{os.cpu_count()} cores"
    )
    return header + "\n\n" + "\n".join(rows)


PEAK = r"""
import resource, subprocess, sys
subprocess.run([sys.executable, "-m", "lm.prepare", *sys.argv[1:]], check=True,
               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""


def memory_of_prepare_table(project: Path, scratch: Path, sizes: Sizes) -> str:
    """Prepare's peak memory on one record of `sizes.record_bytes` and on 1,000 records that
    share its bytes (the module docstring's second table)."""
    text = stdlib_text()
    while len(text) < sizes.record_bytes:
        text += text
    text, piece = text[: sizes.record_bytes], sizes.record_bytes // 1000
    one, many = scratch / "one", scratch / "many"
    one.mkdir()
    many.mkdir()
    # The single record's file has company: a corpus of one document holds none out.
    (one / "record.jsonl").write_text(json.dumps({"text": text}) + "\n")
    small = [json.dumps({"text": text[n : n + piece]}) for n in range(0, len(text), piece)]
    (one / "others.jsonl").write_text("\n".join(small[:20]) + "\n")
    (many / "records.jsonl").write_text("\n".join(small) + "\n")
    (many / "others.jsonl").write_text("\n".join(small[:20]) + "\n")
    tokenizer_file = scratch / "tokenizer.json"
    if not tokenizer_file.is_file():
        train_tokenizer(project, many, tokenizer_file, sizes)
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    rows = ["| corpus | peak RSS, largest process |", "| --- | --- |"]
    peaks = {}
    labels = (f"one {megabytes(len(text))} record", f"1,000 records of {piece / 1000:g} KB")
    for label, folder in zip(labels, (one, many), strict=True):
        command = [sys.executable, "-c", PEAK, str(folder), "--out", str(folder / "corpus")]
        command += ["--tokenizer", str(tokenizer_file), "--workers", "1"]
        result = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True)
        peaks[label] = int(result.stdout.split()[-1])
        rows.append(f"| {label} | {peaks[label] / 2**20:,.0f} MiB |")
    difference = abs(peaks[labels[0]] - peaks[labels[1]])
    rows.append(f"| difference | {difference / 2**20:,.0f} MiB (target: < 200) |")
    return "\n".join(rows)


def stop_table(project: Path, scratch: Path, sizes: Sizes) -> str:
    """How fast prepare stops on SIGINT and SIGTERM, and what of it is left (the module
    docstring's third table)."""
    folder = scratch / "text"
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    command = [sys.executable, "-m", "lm.prepare", str(folder), "--out", str(scratch / "stop")]
    command += ["--tokenizer", "bpe", "--vocab-size", str(sizes.vocab_size)]
    rows = ["| signal | phase | seconds to exit | exit status | processes left |"]
    rows.append("| --- | --- | --- | --- | --- |")
    for stop in (signal.SIGINT, signal.SIGTERM):
        process = subprocess.Popen(
            command, cwd=project, env=env, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        phase = process.stderr.readline().split(":")[1].split()[0]  # "surveyed"
        time.sleep(sizes.signal_after)
        sent = time.perf_counter()
        process.send_signal(stop)
        process.wait()
        seconds = time.perf_counter() - sent
        time.sleep(1.0)
        left = running_in_group(process.pid)
        process.stderr.close()
        name = f"{stop.name} ({'Ctrl-C' if stop == signal.SIGINT else 'kill PID'})"
        rows.append(
            f"| {name} | after {phase}, +{sizes.signal_after:g} s | {seconds:.2f} | "
            f"{process.returncode} | {len(left)} |"
        )
    rows.append("")
    rows.append("Processes left: those of its group still running a second after it exited.")
    return "\n".join(rows)


def running_in_group(group: int) -> list[int]:
    """The processes of process group `group` still running (zombies, which a container's
    init may never reap, are not)."""
    running = []
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            running.append(int(status.parent.name))
    return running


def stdlib_text() -> str:
    """The standard library's top-level .py files, concatenated."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return "".join(
        p.read_text(encoding="utf-8", errors="replace") for p in sorted(root.glob("*.py"))
    )


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
for _ in range(int(sys.argv[2]) - 1):
    next(batches)
print(json.dumps({"growth": rss() - before, "windows": len(windows)}))
"""


def memory_table(project: Path, sizes: Sizes) -> str:
    """Resident-set growth of a reader of a small and a large corpus (module docstring)."""
    import numpy as np

    sys.path.insert(0, str(project / "src"))
    from lm.corpus.shards import Manifest, Shard, file_sha256

    rows = [f"| corpus | tokens | RSS growth over {sizes.reader_batches:,} micro-batches |"]
    rows.append("| --- | --- | --- |")
    generator = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as scratch:
        for tokens in sizes.reader_tokens:
            label = "~" + megabytes(2 * tokens)  # uint16 tokens
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
                [sys.executable, "-c", READER, str(folder), str(sizes.reader_batches)],
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
    parser.add_argument("--smoke", action="store_true", help="check every table runs (seconds)")
    args = parser.parse_args()
    if args.smoke and args.readme:
        raise SystemExit("error: --smoke figures are not measurements; drop --readme")
    sizes = SMOKE if args.smoke else Sizes(megabytes=args.megabytes)
    from scaffold.samples import render_variant

    with tempfile.TemporaryDirectory() as scratch:
        project = Path(scratch) / "lm"
        render_variant(VARIANT, project)
        work = Path(scratch) / "work"
        work.mkdir()
        text = "Prepare throughput:\n\n" + prepare_table(project, sizes, work)
        text += "\n\nPrepare's peak memory:\n\n" + memory_of_prepare_table(project, work, sizes)
        text += "\n\nStopping prepare:\n\n" + stop_table(project, work, sizes)
        text += "\n\nReader memory:\n\n" + memory_table(project, sizes)
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
