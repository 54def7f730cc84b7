"""prepare.py, corpus/shards.py and generate.py on corpora the tests write: token shards and their
manifest, a re-run that does nothing, a changed source, an interrupted or killed prepare,
every source kind (text, jsonl, parquet, compressed), text that is not UTF-8, bad records,
documents of any size read in bounded pieces and large files in many jobs, the tokenizers,
memory-mapped windows, sampling from a run's weights, and bad input refused in one line.
(test_model.py's memorised batch is continued by `generate`.)"""

from __future__ import annotations

import dataclasses
import errno
import gzip
import json
import math
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import zstandard
from safetensors.torch import load_file, save_file
from torch import nn

from lm_fsdp2_bf16 import data as user_data
from lm_fsdp2_bf16 import model as user_model
from lm_fsdp2_bf16.corpus import (
    MANIFEST,
    PIECE_CHARS,
    Codec,
    Manifest,
    Options,
    Span,
    TokenWindows,
    find_sources,
    pipeline,
    prepare,
    read_manifest,
    read_pieces,
    survey,
    text_layout,
)
from lm_fsdp2_bf16.corpus import jobs as prepare_jobs
from lm_fsdp2_bf16.data import PLANNED_VOCABULARY, build_datasets, input_spec
from lm_fsdp2_bf16.generate import main as generate_main
from lm_fsdp2_bf16.inference.decode import generate
from lm_fsdp2_bf16.model import build_model, model_architecture, plan_change
from lm_fsdp2_bf16.prepare import main
from lm_fsdp2_bf16.runtime import init_runtime
from lm_fsdp2_bf16.state_io import remove_stale_scratch
from lm_fsdp2_bf16.train import Trainer

HINT = "run prepare"
LINES = [f"line {n}: the quick brown fox {n % 7} jumps over the lazy dog\n" for n in range(400)]
SMALL = Options(document_bytes=512, shard_tokens=4000)
BPE_300 = dataclasses.replace(SMALL, tokenizer="bpe", vocab_size=300)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    """A folder of every source kind: text files (one nested, one gzipped), JSON lines (one
    zstd-compressed) and parquet, and two files of other kinds."""
    root = tmp_path_factory.mktemp("sources")
    (root / "nested").mkdir()
    (root / "a.txt").write_text("".join(LINES[:150]))
    (root / "nested" / "b.md").write_text("".join(LINES[150:300]))
    with gzip.open(root / "e.txt.gz", "wt") as file:
        file.write("".join(LINES[300:]))
    records = [json.dumps({"text": f"record {n} of the jsonl file", "id": n}) for n in range(60)]
    (root / "c.jsonl").write_text("\n".join(records[:30]) + "\n")
    with zstandard.open(root / "f.jsonl.zst", "wt") as file:
        file.write("\n".join(records[30:]) + "\n")
    texts = [f"row {n} of the parquet file" for n in range(60)]
    pq.write_table(pa.table({"text": texts}), root / "d.parquet")
    (root / "notes.html").write_text("<p>not a source</p>")
    (root / "logo.png").write_bytes(b"\x89PNG")
    return root


@pytest.fixture(scope="module")
def prepared(sources, tmp_path_factory) -> tuple[Path, Manifest]:
    """The sources prepared once with bytes, in shards of at most 4,000 tokens."""
    out = tmp_path_factory.mktemp("corpus") / "bytes"
    return out, prepare([str(sources)], out, SMALL)


@pytest.fixture(scope="module")
def prepared_bpe(sources, tmp_path_factory) -> tuple[Path, Manifest]:
    """The sources prepared once with a byte-level BPE trained to 300 tokens: a vocabulary
    other than the plan's (the bytes' 257, or a large model's 50,304)."""
    out = tmp_path_factory.mktemp("corpus") / "bpe"
    return out, prepare([str(sources)], out, BPE_300)


def shard_tokens(out: Path, split: str) -> np.ndarray:
    manifest = read_manifest(out, HINT)
    shards = manifest.shards[split]
    return np.concatenate([np.fromfile(out / shard.file, dtype=manifest.dtype) for shard in shards])


def corpus_text(out: Path) -> str:
    """Every token of a bytes corpus, train then validation, as text (end-of-text: a `|`)."""
    tokens = np.concatenate([shard_tokens(out, split) for split in ("train", "val")])
    return bytes(np.where(tokens == 256, ord("|"), tokens).astype(np.uint8)).decode()


def test_the_shards_hold_every_document_once_each_followed_by_end_of_text(prepared, sources):
    out, manifest = prepared
    assert manifest.tokenizer == "bytes" and manifest.dtype == "uint16"
    assert len(manifest.shards["train"]) > 1, "4,000-token shards: several"
    assert all(shard.tokens <= 4000 for shard in manifest.shards["train"])
    text = corpus_text(out)
    assert text.count("|") == sum(manifest.documents.values())
    for line in (
        LINES[0],
        LINES[299],
        LINES[399],
        "record 59 of the jsonl",
        "row 7 of the parquet",
    ):
        assert text.count(line) == 1, line
    readable = [p for p in sources.rglob("*.*") if p.suffix not in (".html", ".png")]
    assert manifest.source_bytes == sum(p.stat().st_size for p in readable)
    assert {Path(s["path"]).name for s in manifest.sources} == {p.name for p in readable}
    assert manifest.skipped["other_kinds"] == {".html": 1, ".png": 1}
    held_out = manifest.documents["val"] / sum(manifest.documents.values())
    assert 0.05 < held_out < 0.2, manifest.documents


def test_a_rerun_does_nothing_and_the_corpus_identity_is_its_content(prepared, sources, tmp_path):
    out, manifest = prepared
    written = (out / MANIFEST).stat().st_mtime_ns
    again = prepare([str(sources)], out, document_bytes=512, shard_tokens=4000)  # as SMALL
    assert again == manifest and (out / MANIFEST).stat().st_mtime_ns == written, "no rewrite"
    copy = tmp_path / "sources"
    copy.mkdir()
    (copy / "a.txt").write_text("".join(LINES))
    first = prepare([str(copy)], tmp_path / "corpus", SMALL)
    os.utime(copy / "a.txt", ns=(1, 1))  # touched: prepared again, to the same content
    again = prepare([str(copy)], tmp_path / "corpus", SMALL)
    assert again.request != first.request and again.fingerprint() == first.fingerprint()
    (copy / "a.txt").write_text("".join(LINES) + "one more line\n")
    second = prepare([str(copy)], tmp_path / "corpus", SMALL)
    assert second.source_bytes == first.source_bytes + len("one more line\n")
    assert second.fingerprint() != first.fingerprint()


def test_an_interrupted_prepare_leaves_the_previous_corpus_whole(sources, tmp_path, monkeypatch):
    out = tmp_path / "corpus"
    before = prepare([str(sources / "a.txt")], out, SMALL)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "write_shards", killed)
    with pytest.raises(KeyboardInterrupt):
        prepare([str(sources)], out, SMALL)
    assert read_manifest(out, HINT) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"], "no partial folder left"


def test_worker_processes_one_process_and_many_small_jobs_write_the_same_corpus(
    sources, tmp_path, monkeypatch
):
    """Jobs that start inside a file (at a document's start) find the same documents as a
    read of the whole file, in this process or in workers."""
    one = prepare([str(sources)], tmp_path / "one", SMALL)
    two = prepare([str(sources)], tmp_path / "two", SMALL, workers=2)
    monkeypatch.setattr(survey, "JOB_BYTES", 1000)
    monkeypatch.setattr(prepare_jobs, "JOB_BYTES", 1000)
    surveyed = survey.survey_source(sources / "a.txt", "text", 512, "utf-8", None, 0.1)
    assert len(surveyed.spans) > 5
    jobs = prepare([str(sources)], tmp_path / "jobs", SMALL)
    assert one.shards == two.shards == jobs.shards and one.documents == jobs.documents


def test_a_document_of_any_size_is_read_in_bounded_pieces_with_the_whole_documents_tokens(
    tmp_path,
):
    """A 1 MB line (text) and a 1 MB record (jsonl) are handed on in pieces of at most
    PIECE_CHARS characters, cut before whitespace, and a trained BPE gives their pieces the
    tokens it gives the whole document."""
    words = " ".join(f"word{n % 977} é" for n in range(90_000))  # ~1 MB, no line break
    (tmp_path / "long.txt").write_text(words + "\n")
    (tmp_path / "long.jsonl").write_text(json.dumps({"text": words}) + "\n")
    for name, kind in (("long.txt", "text"), ("long.jsonl", "jsonl")):
        path = tmp_path / name
        layout = text_layout(path, "utf-8")
        pieces = list(read_pieces(path, kind, layout, Span(0, None, 0), "text", 1 << 20))
        assert len(pieces) > 10 and all(len(piece.text) <= PIECE_CHARS for piece in pieces)
        assert all(piece.number == 0 for piece in pieces) and pieces[-1].last
        assert "".join(piece.text for piece in pieces).rstrip("\n") == words
        assert all(piece.text[0] == " " for piece in pieces[1:]), "cut before whitespace"
    options = Options(tokenizer="bpe", vocab_size=400, val_fraction=0.5)
    second = json.dumps({"text": "a second document"})
    (tmp_path / "long.jsonl").write_text(json.dumps({"text": words}) + "\n" + second + "\n")
    manifest = prepare([str(tmp_path / "long.jsonl")], tmp_path / "c", options)
    whole = Codec(tmp_path / "c" / "tokenizer.json").encode_batch([words])[0]
    splits = [shard_tokens(tmp_path / "c", split).tolist() for split in ("train", "val")]
    assert [*whole, manifest.eot_id] in splits, "the long document's tokens, and only them"


def test_text_that_is_not_utf8_is_refused_by_name_or_left_out_and_counted(tmp_path, capsys):
    """Text that is not valid UTF-8 is refused by name, or left out and counted; --encoding
    reads the files that are not valid UTF-8 in another encoding, and only those."""
    good = tmp_path / "good.txt"
    good.write_text("".join(LINES) + "un résumé en UTF-8\n")
    bad = {
        "latin1.txt": ("Café au lait\n" * 20).encode("latin-1"),
        "utf16.txt": ("Héllo\n" * 20).encode("utf-16"),
        "binary.txt": b"\0\1\2 binary " * 100,
    }
    for name, data in bad.items():
        (tmp_path / name).write_bytes(data)
    messages = {
        "latin1.txt": "is not valid utf-8",
        "utf16.txt": "UTF-16 byte-order mark",
        "binary.txt": "holds NUL characters",
    }
    for name, message in messages.items():
        with pytest.raises(ValueError, match=message) as refused:
            prepare([str(good), str(tmp_path / name)], tmp_path / "out", SMALL)
        assert name in str(refused.value) and "\n" not in str(refused.value)
        assert not (tmp_path / "out").exists()
    out = tmp_path / "out"
    main([str(tmp_path), "--out", str(out), "--skip-bad-files", "--document-bytes", "512"])
    printed = capsys.readouterr().err
    assert "left out 3 file(s) that cannot be read" in printed and "latin1.txt" in printed
    manifest = read_manifest(out, HINT)
    assert sorted(Path(path).name for path in manifest.skipped["files"]) == sorted(bad)
    assert "\ufffd" not in corpus_text(out) and "\0" not in corpus_text(out)
    mixed = tmp_path / "mixed"
    options = ["--encoding", "latin-1", "--document-bytes", "64", "--val-fraction", "0.5"]
    main([str(good), str(tmp_path / "latin1.txt"), "--out", str(mixed), *options])
    text = corpus_text(mixed)
    assert "un résumé en UTF-8" in text and "Café au lait" in text and "Ã" not in text
    encodings = {Path(s["path"]).name: s["encoding"] for s in read_manifest(mixed, HINT).sources}
    assert encodings == {"good.txt": "utf-8", "latin1.txt": "iso8859-1"}
    for name, encoding, text in (
        ("latin1", "latin-1", "Café au lait\n"),
        ("utf16", "utf-16", "Héllo\n"),
    ):
        options = Options(encoding=encoding, val_fraction=0.5, document_bytes=64)
        manifest = prepare([str(tmp_path / f"{name}.txt")], tmp_path / name, options)
        assert corpus_text(tmp_path / name).replace("|", "").count(text) == 20
        assert manifest.documents["val"] and manifest.documents["train"]
    with pytest.raises(ValueError, match="--encoding klingon is not a text encoding"):
        prepare([str(good)], tmp_path / "x", Options(encoding="klingon"))


def test_records_with_no_text_are_refused_before_encoding_or_left_out_by_one_rule(
    tmp_path, monkeypatch
):
    lines = ['{"text": "fine"}', "not json", "null", "12", "[1]", '{"body": "x"}', '{"text": null}']
    (tmp_path / "mixed.jsonl").write_text("\n".join(lines * 3) + "\n")
    pq.write_table(pa.table({"text": ["a row", None, "another row"]}), tmp_path / "rows.parquet")
    encoded = []
    monkeypatch.setattr(prepare_jobs, "encode_job", lambda *args, **kwargs: encoded.append(args))
    with pytest.raises(ValueError, match=r"mixed.jsonl:2: not JSON .*19 record\(s\) in all"):
        prepare([str(tmp_path)], tmp_path / "out", SMALL)
    assert not encoded, "refused before anything is encoded"
    monkeypatch.undo()
    refusals = {
        "mixed.jsonl": "mixed.jsonl:2: not JSON (Expecting value); ",
        "rows.parquet": "rows.parquet:row 1: its 'text' is null; ",
    }
    for name, first in refusals.items():
        with pytest.raises(ValueError, match="--skip-bad-records") as refused:
            prepare([str(tmp_path / name)], tmp_path / "out", SMALL)
        assert str(refused.value).startswith(f"{tmp_path}/{first}") and "\n" not in str(
            refused.value
        )
        assert "--text-key" not in str(refused.value).split(";")[0]
    keyed = tmp_path / "other" / "keyed.jsonl"
    keyed.parent.mkdir()
    keyed.write_text('{"body": "x"}\n')
    with pytest.raises(ValueError, match=r"keyed.jsonl:1: no 'text' field \(it has: body\); name"):
        prepare([str(keyed)], tmp_path / "out", SMALL)
    for line, kind in (("null", "null"), ("12", "number"), ("[1]", "array")):
        keyed.write_text(line + "\n")
        with pytest.raises(ValueError, match=f"keyed.jsonl:1: a JSON {kind}, not an object"):
            prepare([str(keyed)], tmp_path / "out", SMALL)
    options = dataclasses.replace(SMALL, skip_bad_records=True, val_fraction=0.5)
    manifest = prepare(
        [str(tmp_path / "mixed.jsonl"), str(tmp_path / "rows.parquet")], tmp_path / "out", options
    )
    assert manifest.skipped["records"] == 18 + 1 and sum(manifest.documents.values()) == 3 + 2
    assert manifest.skipped["first_records"][0].endswith(
        "mixed.jsonl:2: not JSON (Expecting value)"
    )


def test_an_interrupted_or_killed_prepare_ends_its_workers_at_once(tmp_path):
    """SIGTERM (as Ctrl-C) stops prepare within seconds, every worker ended, the previous
    corpus whole and no partial folder left; a prepare killed outright (SIGKILL) leaves no
    worker behind either, and the next prepare removes the folder it left."""
    source = tmp_path / "big.txt"
    source.write_text("".join(f"{n}: {LINES[n % 400]}" for n in range(100_000)))  # ~6 MB
    out = tmp_path / "corpus"
    prepare([str(source)], out, Options(max_bytes=10_000, document_bytes=1000, val_fraction=0.5))
    before = read_manifest(out, HINT)
    command = [sys.executable, "-m", "lm_fsdp2_bf16.prepare", str(source), "--out", str(out)]
    command += [
        "--workers",
        "2",
        "--tokenizer",
        "bpe",
        "--vocab-size",
        "2000",
        "--val-fraction",
        "0.5",
    ]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    for stop in (signal.SIGTERM, signal.SIGKILL):
        process = subprocess.Popen(
            command, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        assert "surveyed" in process.stderr.readline(), "the survey ends first"
        time.sleep(0.5)  # into the BPE training or the encoding
        sent = time.monotonic()
        process.send_signal(stop)
        process.wait(timeout=10)
        stopped = time.monotonic() - sent
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and group_alive(process.pid):
            time.sleep(0.1)
        assert not group_alive(process.pid), f"{stop.name}: a worker outlived prepare"
        assert stopped < 3, f"{stop.name}: {stopped:.1f} s to stop"
        assert read_manifest(out, HINT) == before
        if stop == signal.SIGTERM:
            assert process.returncode == 128 + signal.SIGTERM
            assert "interrupted" in process.stderr.read()
            assert not list(tmp_path.glob(".corpus.partial-*")), "SIGTERM cleans up"
        process.stderr.close()
    assert list(tmp_path.glob(".corpus.partial-*")), "SIGKILL leaves its folder"
    again = prepare(
        [str(source)], out, Options(max_bytes=10_000, document_bytes=1000, val_fraction=0.5)
    )
    assert again == before and not list(tmp_path.glob(".corpus.partial-*")), "the next removes it"
    assert remove_stale_scratch(out) == []


def group_alive(group: int) -> bool:
    """Whether any process of process group `group` is alive (zombies are not)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    states = []
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group:
            states.append(fields[0])
    return any(state != "Z" for state in states)


def test_a_full_disk_is_named_and_the_previous_corpus_kept(sources, tmp_path, monkeypatch):
    out = tmp_path / "corpus"
    before = prepare([str(sources / "a.txt")], out, SMALL)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pipeline, "write_shards", full)
    with pytest.raises(
        ValueError, match=r"no space left on device in .* MiB free\): it takes up to"
    ):
        prepare([str(sources)], out, SMALL)
    assert read_manifest(out, HINT) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"], "no partial folder left"


def test_a_trained_bpe_is_deterministic_and_its_tokenizer_json_reproduces_it(
    sources, prepared, prepared_bpe, tmp_path
):
    out, first = prepared_bpe
    second = prepare([str(sources)], tmp_path / "second", BPE_300)
    assert first.shards == second.shards and first.vocab_size == 300
    named = out / "tokenizer.json"
    again = prepare(
        [str(sources)], tmp_path / "named", dataclasses.replace(SMALL, tokenizer=str(named))
    )
    assert again.shards == first.shards and again.tokenizer == "file"
    codec = Codec(named)
    assert codec.eot_id == first.eot_id
    assert codec.decode(codec.encode_batch([LINES[3]])[0]) == LINES[3]
    _, as_bytes = prepared
    assert first.tokens("train") < as_bytes.tokens("train") / 2, "BPE: fewer tokens than bytes"
    with pytest.raises(ValueError, match=r"--eot 'l' is an ordinary token of .*special or added"):
        Codec(named, eot="l")


def test_windows_read_the_shards_and_pickle_without_the_corpus(prepared):
    out, manifest = prepared
    windows = TokenWindows(out, manifest.shards["train"], manifest.dtype, block_size=16)
    inputs, targets = windows[[0, len(windows) - 1]]
    assert inputs.shape == targets.shape == (2, 16)
    first = np.fromfile(out / manifest.shards["train"][0].file, dtype=manifest.dtype)
    assert inputs[0].tolist() == first[:16].tolist() and targets[0].tolist() == first[1:17].tolist()
    assert len(pickle.dumps(windows)) < 2000, "a worker gets file names, not the tokens"
    per_shard = [(shard.tokens - 1) // 16 for shard in manifest.shards["train"]]
    assert len(windows) == sum(per_shard)
    for outside in ([len(windows)], [-1], [0, len(windows) + 5]):
        with pytest.raises(IndexError, match=f"not all in \\[0, {len(windows)}\\)"):
            windows[outside]


def test_the_command_line_prints_each_phase_and_the_counts(sources, tmp_path, capsys):
    out = tmp_path / "cli"
    main(
        [
            str(sources / "c.jsonl"),
            "--out",
            str(out),
            "--workers",
            "1",
            "--tokenizer",
            "bpe",
            "--vocab-size",
            "300",
            "--val-fraction",
            "0.3",
        ]
    )
    printed = capsys.readouterr()
    assert f"{out}: " in printed.out and (out / MANIFEST).is_file()
    vocabulary = read_manifest(out, HINT).vocab_size
    for phase in (
        "surveyed 1 source file, ",
        f"trained a byte-level BPE of {vocabulary:,} tokens",
        "encoded",
        "wrote",
    ):
        assert f"prepare: {phase}" in printed.err, phase


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: [str(root / "missing.txt")], "names no file"),
        (lambda root: [str(folder_of_csv(root))], r"holds no source file: text \(.txt"),
        (lambda root: [str(empty_file(root))], "are empty"),
        (lambda root: [str(parquet(root))], "has no column 'text'"),
        (lambda root: [str(binary(root))], "weights.bin is not text"),
        (lambda root: [str(one_document(root, "x" * 5000))], "1 document, too few .*; add text"),
        (lambda root: [str(one_document(root, "x\n" * 5000))], "smaller --document-bytes"),
        (
            lambda root: [str(jsonl_records(root, 3))],
            r"none of the 3 documents .* 0.33 or more, or add",
        ),
    ],
)
def test_bad_sources_are_refused_in_one_line_with_nothing_written(tmp_path, make, message):
    with pytest.raises(ValueError, match=message) as refused:
        prepare(make(tmp_path), tmp_path / "new" / "out", Options(val_fraction=1e-6))
    assert "\n" not in str(refused.value) and not (tmp_path / "new").exists(), "no folder left"


def folder_of_csv(root: Path) -> Path:
    (root / "tables").mkdir()
    (root / "tables" / "x.csv").write_text("a,b\n")
    return root / "tables"


def empty_file(root: Path) -> Path:
    (root / "empty.txt").write_text("")
    return root / "empty.txt"


def parquet(root: Path) -> Path:
    pq.write_table(pa.table({"body": ["x"]}), root / "bad.parquet")
    return root / "bad.parquet"


def binary(root: Path) -> Path:
    (root / "weights.bin").write_bytes(b"\0\1")
    return root / "weights.bin"


def one_document(root: Path, text: str) -> Path:
    (root / "one.txt").write_text(text)
    return root / "one.txt"


def jsonl_records(root: Path, count: int) -> Path:
    (root / "few.jsonl").write_text(
        "".join(json.dumps({"text": f"r{n}"}) + "\n" for n in range(count))
    )
    return root / "few.jsonl"


def test_a_run_refuses_no_corpus_a_changed_shard_and_a_larger_vocabulary(
    config, prepared, tmp_path, monkeypatch
):
    out, manifest = prepared
    mine = dataclasses.replace(config, data_dir=str(tmp_path / "none"), prepare_example=False)
    with pytest.raises(ValueError, match=r"no prepared corpus .*prepare SOURCES --out"):
        build_datasets(mine)
    changed = tmp_path / "changed"
    changed.mkdir()
    for file in out.iterdir():
        (changed / file.name).write_bytes(file.read_bytes())
    shard = changed / manifest.shards["train"][0].file
    tokens = np.fromfile(shard, dtype=manifest.dtype)
    tokens[0] += 1
    tokens.tofile(shard)
    with pytest.raises(ValueError, match="changed after prepare"):
        build_datasets(dataclasses.replace(mine, data_dir=str(changed)))
    big = dataclasses.replace(manifest, vocab_size=50_257)
    (changed / MANIFEST).write_text(big.to_json())
    tokens[0] -= 1
    tokens.tofile(shard)
    larger = dataclasses.replace(mine, data_dir=str(changed))
    assert input_spec(larger) == (50_257, (config.block_size,)), "the corpus's vocabulary"
    monkeypatch.setattr(user_data, "NUM_CLASSES", 257)  # a NUM_CLASSES of the user's, too small
    with pytest.raises(ValueError, match="set NUM_CLASSES = 50257, or None") as refused:
        build_datasets(larger)
    assert "\n" not in str(refused.value)


def test_a_corpus_of_another_vocabulary_trains_with_no_edit_and_the_start_says_so(
    config, prepared_bpe, tmp_path, capsys, monkeypatch
):
    """With NUM_CLASSES unset the model takes the prepared corpus's vocabulary (its
    manifest's), trains on it, and the start names the change against the plan in one line; a
    NUM_CLASSES of the user's wins, and one below the corpus's is refused."""
    out, manifest = prepared_bpe
    assert manifest.vocab_size != PLANNED_VOCABULARY
    run = dataclasses.replace(
        config, data_dir=str(out), prepare_example=False, run_dir=str(tmp_path / "run")
    )
    summary = Trainer(dataclasses.replace(run, max_steps=1), init_runtime("cpu")).fit()
    weights = load_file(tmp_path / "run" / "model.safetensors")
    embedding = weights.get("token_embedding.weight", weights.get("model.embed_tokens.weight"))
    assert embedding.shape[0] == manifest.vocab_size and summary["steps"] == 1
    assert summary["expected_initial_loss"] == pytest.approx(math.log(manifest.vocab_size))
    assert summary["initial_loss"] == pytest.approx(math.log(manifest.vocab_size), abs=0.15)
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "(planned " in line]
    assert line.startswith(
        f"vocabulary {manifest.vocab_size:,} from {out / MANIFEST} (planned "
        f"{PLANNED_VOCABULARY:,}): embedding and head "
    ), line
    assert " instead of " in line and f"model_size {run.model_size} (" in line
    for module in (user_data, user_model):  # a NUM_CLASSES of the user's, where both read it
        monkeypatch.setattr(module, "NUM_CLASSES", manifest.vocab_size + 20)
    assert model_architecture(run).vocab_size == manifest.vocab_size + 20
    assert plan_change(run).startswith(f"vocabulary {manifest.vocab_size + 20} from NUM_CLASSES")
    monkeypatch.setattr(user_data, "NUM_CLASSES", manifest.vocab_size - 1)
    with pytest.raises(ValueError, match=f"set NUM_CLASSES = {manifest.vocab_size}, or None"):
        build_model(run)


def test_generate_continues_a_prompt_with_a_runs_weights_and_refuses_a_missing_run(
    config, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    build_datasets(config)  # the test corpus, prepared if it is not yet
    (run_dir / "config.json").write_text(json.dumps(config.to_dict()))
    save_file(build_model(config).state_dict(), run_dir / "model.safetensors")
    args = ["def main(", "--run-dir", str(run_dir), "--max-new-tokens", "5", "--device", "cpu"]
    greedy = generate_main([*args, "--temperature", "0"])
    assert greedy.startswith("def main(") and greedy == generate_main([*args, "--temperature", "0"])
    sampled = {generate_main([*args, "--seed", str(seed)]) for seed in range(4)}
    assert len(sampled) > 1, "the seed draws the samples"
    with pytest.raises(SystemExit, match="config.json not found; train first"):
        generate_main(["x", "--run-dir", str(tmp_path / "none")])
    stopped = tmp_path / "stopped"  # a run a stop signal ended before it exported weights
    (stopped / "checkpoints").mkdir(parents=True)
    (stopped / "checkpoints" / "last").write_text("step-00000002\n")
    (stopped / "config.json").write_text(json.dumps(config.to_dict()))
    with pytest.raises(SystemExit, match="exports its weights when it ends .*--resume"):
        generate_main(["x", "--run-dir", str(stopped)])
    with pytest.raises(SystemExit, match="prompt is empty"):
        generate_main(["", "--run-dir", str(run_dir)])
    weights = build_model(config).state_dict()
    embedding = next(name for name in weights if "embed" in name)  # either family's
    weights[embedding] = weights[embedding][:10]
    save_file(weights, run_dir / "small.safetensors")
    with pytest.raises(SystemExit, match="does not fit model.py as it is now"):
        generate_main([*args, "--weights", "small.safetensors"])


def test_a_resume_follows_the_corpus_content_and_goes_on_with_changed_data_when_asked(
    config, tmp_path
):
    """Preparing the same sources again (a touched file) keeps a run resumable; a grown corpus
    is refused in words that say what changed, and --allow-data-change continues from the
    checkpoint at a new epoch; another tokenizer is refused even then. The run folder keeps
    the tokenizer and manifest it trained on: generate works with the corpus gone."""
    text, corpus = tmp_path / "text", tmp_path / "corpus"
    text.mkdir()
    (text / "a.txt").write_text("".join(LINES))
    prepare([str(text)], corpus, SMALL)
    run = dataclasses.replace(
        config, data_dir=str(corpus), prepare_example=False, run_dir=str(tmp_path / "run")
    )
    run = dataclasses.replace(run, epochs=2, checkpoint_every=0)
    Trainer(dataclasses.replace(run, stop_after_steps=3), init_runtime("cpu")).fit()
    assert (tmp_path / "run" / "corpus.json").is_file()
    os.utime(text / "a.txt", ns=(1, 1))
    prepare([str(text)], corpus, SMALL)  # again, to the same tokens
    Trainer(dataclasses.replace(run, stop_after_steps=5), init_runtime("cpu"), resume=True).fit()
    (text / "b.txt").write_text("".join(LINES[:200]))
    prepare([str(text)], corpus, SMALL)
    refusal = r"changed since \(1 source\(s\) added \(.*b.txt\); tokens train .* the same tokenizer"
    with pytest.raises(ValueError, match=refusal + r"\); .*--allow-data-change"):
        Trainer(run, init_runtime("cpu"), resume=True)
    resumed = Trainer(dataclasses.replace(run, allow_data_change=True), init_runtime("cpu"), True)
    summary = resumed.fit()
    (change,) = summary["data_changes"]
    assert (change["step"], change["epoch"]) == (5, 1) and "b.txt" in change["change"]
    assert summary["steps"] == 5 + resumed.state.data.batches, "epoch 2 over the new corpus"
    assert resumed.scheduler.lr_lambdas[0].total_steps == summary["steps"]
    assert "data changed at step 5" in (tmp_path / "run" / "summary.md").read_text()
    prepare([str(text)], corpus, dataclasses.replace(SMALL, tokenizer="bpe", vocab_size=257))
    retokenized = (
        r"another tokenizer\), and the run cannot go on .*--tokenizer bytes, the run's own"
    )
    for allowed in (False, True):  # the flag would not help: the message says what would
        with pytest.raises(ValueError, match=retokenized) as refused:
            Trainer(dataclasses.replace(run, allow_data_change=allowed), init_runtime("cpu"), True)
        assert "--allow-data-change" not in str(refused.value)
    shutil.rmtree(corpus)
    args = ["def", "--run-dir", str(tmp_path / "run"), "--max-new-tokens", "3", "--device", "cpu"]
    assert generate_main(args).startswith("def"), "the run's own tokenizer"


def test_generate_never_samples_ids_past_the_tokenizers_vocabulary():
    """A model whose vocabulary is larger than its tokenizer's (NUM_CLASSES above a corpus's)
    has padding ids that decode to nothing: they are never sampled."""

    class FavoursPadding(nn.Module):
        def forward(self, tokens):
            logits = torch.zeros(*tokens.shape, 320)
            logits[..., 300] = 10.0  # a padding id, the likeliest
            return logits

    start, generator = torch.tensor([[1]]), torch.Generator().manual_seed(0)
    options = {"context": 32, "generator": generator}
    assert 300 in generate(FavoursPadding(), start, 5, temperature=0, **options)
    for temperature in (0, 1.0):
        options |= {"temperature": temperature, "vocab_size": 257}
        sampled = generate(FavoursPadding(), start, 20, **options)
        assert sampled.shape == (1, 21) and sampled.max() < 257


def test_generate_of_a_run_that_kept_no_tokenizer_refuses_another_corpus(config, tmp_path):
    """A run of an earlier version kept no tokenizer of its own: generate takes its data_dir's,
    and refuses one prepared again to other tokens since, or one it cannot find."""
    build_datasets(config)
    corpus = tmp_path / "corpus"
    shutil.copytree(config.data_dir, corpus)
    config = dataclasses.replace(config, data_dir=str(corpus))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(config.to_dict()))
    save_file(build_model(config).state_dict(), run_dir / "model.safetensors")
    args = ["x", "--run-dir", str(run_dir), "--device", "cpu", "--max-new-tokens", "2"]
    assert generate_main(args).startswith("x")
    manifest = read_manifest(corpus, HINT)
    (corpus / MANIFEST).write_text(dataclasses.replace(manifest, eot_id=255).to_json())
    with pytest.raises(SystemExit, match="was prepared again since"):
        generate_main(args)
    elsewhere = dataclasses.replace(config, data_dir="no/such/folder")
    (run_dir / "config.json").write_text(json.dumps(elsewhere.to_dict()))
    with pytest.raises(SystemExit, match="relative to where the run trained"):
        generate_main(args)


def test_prepare_refuses_bad_options_and_a_bad_tokenizer_and_skips_hidden_files(sources, tmp_path):
    out = ["--out", str(tmp_path / "out")]
    for option in (["--val-fraction", "0"], ["--max-bytes", "0"], ["--workers", "0"]):
        with pytest.raises(SystemExit, match=f"{option[0]} must be"):
            main([str(sources), *out, *option])
    bad = tmp_path / "mine.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit, match=f"{bad} is not a tokenizer.json"):
        main([str(sources), *out, "--tokenizer", str(bad)])
    unused = {
        "--vocab-size": "sets a BPE that prepare trains, and the tokenizer is bytes",
        "--tokenizer-sample-bytes": "sets a BPE that prepare trains",
        "--eot": "names the end-of-text token of a tokenizer.json",
    }
    for option, refusal in unused.items():
        with pytest.raises(SystemExit, match=refusal):
            main([str(sources), *out, "--tokenizer", "bytes", option, "512"])
    with pytest.raises(SystemExit) as abbreviated:  # no flag abbreviations: a typo is refused
        main([str(sources), *out, "--skip-bad-file"])
    assert abbreviated.value.code == 2
    assert not (tmp_path / "out").exists()
    folder = tmp_path / "repo"
    (folder / ".git").mkdir(parents=True)
    (folder / ".git" / "notes.txt").write_text("not a source")
    (folder / "a.txt").write_text("a source")
    assert find_sources([str(folder)]).files == (folder / "a.txt",)
