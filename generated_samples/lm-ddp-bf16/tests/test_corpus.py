"""prepare.py, corpus.py and generate.py on a corpus the tests write: token shards and their
manifest, a re-run that does nothing, a changed source, an interrupted prepare, jsonl and
parquet sources, the tokenizers, memory-mapped windows, sampling from a run's weights, and bad
input refused in one line. (test_model.py's memorised batch is continued by `generate`.)"""

from __future__ import annotations

import dataclasses
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from safetensors.torch import save_file

from lm_ddp_bf16 import prepare as prepare_module
from lm_ddp_bf16.corpus import MANIFEST, Codec, TokenWindows, read_manifest
from lm_ddp_bf16.data import build_datasets
from lm_ddp_bf16.generate import main as generate_main
from lm_ddp_bf16.model import build_model
from lm_ddp_bf16.prepare import main, prepare
from lm_ddp_bf16.sources import find_sources

HINT = "run prepare"
LINES = [f"line {n}: the quick brown fox {n % 7} jumps over the lazy dog\n" for n in range(400)]


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    """A folder of every source kind: text files (one nested), JSON lines and parquet."""
    root = tmp_path_factory.mktemp("sources")
    (root / "nested").mkdir()
    (root / "a.txt").write_text("".join(LINES[:200]))
    (root / "nested" / "b.md").write_text("".join(LINES[200:]))
    with open(root / "c.jsonl", "w") as file:
        for n in range(60):
            file.write(json.dumps({"text": f"record {n} of the jsonl file", "id": n}) + "\n")
    texts = [f"row {n} of the parquet file" for n in range(60)]
    pq.write_table(pa.table({"text": texts}), root / "d.parquet")
    return root


OPTIONS = {"document_bytes": 512, "shard_tokens": 4000, "workers": 1, "progress": False}


@pytest.fixture(scope="module")
def prepared(sources, tmp_path_factory) -> tuple[Path, object]:
    """The sources prepared once with bytes, in shards of at most 4,000 tokens."""
    out = tmp_path_factory.mktemp("corpus") / "bytes"
    return out, prepare([str(sources)], out, **OPTIONS)


def shard_tokens(out: Path, split: str) -> np.ndarray:
    manifest = read_manifest(out, HINT)
    shards = manifest.shards[split]
    return np.concatenate([np.fromfile(out / shard.file, dtype=manifest.dtype) for shard in shards])


def test_the_shards_hold_every_document_once_each_followed_by_end_of_text(prepared, sources):
    out, manifest = prepared
    assert manifest.tokenizer == "bytes" and manifest.dtype == "uint16"
    assert len(manifest.shards["train"]) > 1, "4,000-token shards: several"
    assert all(shard.tokens <= 4000 for shard in manifest.shards["train"])
    tokens = np.concatenate([shard_tokens(out, split) for split in ("train", "val")])
    documents = sum(manifest.documents.values())
    assert (tokens == manifest.eot_id).sum() == documents
    text = bytes(tokens[tokens != manifest.eot_id].astype(np.uint8)).decode()
    assert sorted(text.splitlines(keepends=True)) != []
    for line in (LINES[0], LINES[399], "record 59 of the jsonl file", "row 7 of the parquet"):
        assert text.count(line) == 1, line
    assert manifest.source_bytes == sum(p.stat().st_size for p in sources.rglob("*.*"))
    held_out = manifest.documents["val"] / documents
    assert 0.05 < held_out < 0.2, manifest.documents


def test_a_rerun_does_nothing_and_a_changed_source_is_noticed(prepared, sources, tmp_path):
    out, manifest = prepared
    written = (out / MANIFEST).stat().st_mtime_ns
    assert prepare([str(sources)], out, **OPTIONS) == manifest
    assert (out / MANIFEST).stat().st_mtime_ns == written, "nothing rewritten"
    copy = tmp_path / "sources"
    copy.mkdir()
    (copy / "a.txt").write_text("".join(LINES))
    first = prepare([str(copy)], tmp_path / "corpus", document_bytes=512, progress=False)
    (copy / "a.txt").write_text("".join(LINES) + "one more line\n")
    second = prepare([str(copy)], tmp_path / "corpus", document_bytes=512, progress=False)
    assert second.source_bytes == first.source_bytes + len("one more line\n")


def test_an_interrupted_prepare_leaves_the_previous_corpus_whole(sources, tmp_path, monkeypatch):
    out = tmp_path / "corpus"
    before = prepare([str(sources / "a.txt")], out, document_bytes=512, progress=False)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_module, "write_shards", killed)
    with pytest.raises(KeyboardInterrupt):
        prepare([str(sources)], out, document_bytes=512, progress=False)
    assert read_manifest(out, HINT) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"], "no partial folder left"


def test_worker_processes_and_one_process_write_the_same_corpus(sources, tmp_path):
    options = {"document_bytes": 512, "progress": False}
    one = prepare([str(sources)], tmp_path / "one", workers=1, **options)
    two = prepare([str(sources)], tmp_path / "two", workers=2, **options)
    assert one.shards == two.shards and one.documents == two.documents


def test_a_trained_bpe_is_deterministic_and_its_tokenizer_json_reproduces_it(
    sources, prepared, tmp_path
):
    options = {"tokenizer": "bpe", "vocab_size": 300, "document_bytes": 512, "progress": False}
    first = prepare([str(sources)], tmp_path / "first", **options)
    second = prepare([str(sources)], tmp_path / "second", **options)
    assert first.shards == second.shards and first.vocab_size == 300
    named = tmp_path / "first" / "tokenizer.json"
    again = prepare([str(sources)], tmp_path / "named", tokenizer=str(named), document_bytes=512)
    assert again.shards == first.shards and again.tokenizer == "file"
    codec = Codec(named)
    assert codec.eot_id == first.eot_id
    assert codec.decode(codec.encode_batch([LINES[3]])[0]) == LINES[3]
    _, as_bytes = prepared
    assert first.tokens("train") < as_bytes.tokens("train") / 2, "BPE: fewer tokens than bytes"


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


def test_the_command_line_prints_the_counts(sources, tmp_path, capsys):
    out = tmp_path / "cli"
    main([str(sources / "c.jsonl"), "--out", str(out), "--workers", "1"])
    assert f"{out}: " in capsys.readouterr().out and (out / MANIFEST).is_file()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: [str(root / "missing.txt")], "names no file"),
        (lambda root: [str(folder_of_csv(root))], r"holds no text \(.txt"),
        (lambda root: [str(empty_file(root))], "are empty"),
        (lambda root: [str(jsonl(root, '{"body": "x"}'))], "with a string 'text' field"),
        (lambda root: [str(parquet(root))], "has no column 'text'"),
        (lambda root: [str(binary(root))], "not a text, .jsonl or .parquet"),
    ],
)
def test_bad_sources_are_refused_in_one_line_with_nothing_written(tmp_path, make, message):
    with pytest.raises(ValueError, match=message) as refused:
        prepare(make(tmp_path), tmp_path / "out", progress=False)
    assert "\n" not in str(refused.value) and not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.*")), "no partial folder left"


def folder_of_csv(root: Path) -> Path:
    (root / "tables").mkdir()
    (root / "tables" / "x.csv").write_text("a,b\n")
    return root / "tables"


def empty_file(root: Path) -> Path:
    (root / "empty.txt").write_text("")
    return root / "empty.txt"


def jsonl(root: Path, line: str) -> Path:
    (root / "bad.jsonl").write_text('{"text": "fine"}\n' + line + "\n")
    return root / "bad.jsonl"


def parquet(root: Path) -> Path:
    pq.write_table(pa.table({"body": ["x"]}), root / "bad.parquet")
    return root / "bad.parquet"


def binary(root: Path) -> Path:
    (root / "weights.bin").write_bytes(b"\0\1")
    return root / "weights.bin"


def test_a_run_refuses_no_corpus_a_changed_shard_and_a_larger_vocabulary(
    config, prepared, tmp_path
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
    with pytest.raises(ValueError, match="set NUM_CLASSES = 50257"):
        build_datasets(dataclasses.replace(mine, data_dir=str(changed)))


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
    with pytest.raises(SystemExit, match="prompt is empty"):
        generate_main(["", "--run-dir", str(run_dir)])
    weights = build_model(config).state_dict()
    weights["token_embedding.weight"] = weights["token_embedding.weight"][:10]
    save_file(weights, run_dir / "small.safetensors")
    with pytest.raises(SystemExit, match="does not fit model.py as it is now"):
        generate_main([*args, "--weights", "small.safetensors"])


def test_generate_refuses_a_corpus_prepared_again_since_the_run(config, tmp_path):
    build_datasets(config)
    corpus = tmp_path / "corpus"
    shutil.copytree(config.data_dir, corpus)
    config = dataclasses.replace(config, data_dir=str(corpus))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(config.to_dict()))
    save_file(build_model(config).state_dict(), run_dir / "model.safetensors")
    with open(corpus / MANIFEST, "a") as manifest:
        manifest.write("\n")  # the same corpus to a reader, another file to a fingerprint
    with pytest.raises(SystemExit, match="was prepared again since"):
        generate_main(["x", "--run-dir", str(run_dir), "--device", "cpu"])


def test_prepare_refuses_bad_options_and_a_bad_tokenizer_and_skips_hidden_files(sources, tmp_path):
    out = ["--out", str(tmp_path / "out")]
    for option in (["--val-fraction", "0"], ["--max-bytes", "0"], ["--workers", "0"]):
        with pytest.raises(SystemExit, match=f"{option[0]} must be"):
            main([str(sources), *out, *option])
    bad = tmp_path / "mine.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit, match=f"{bad} is not a tokenizer.json"):
        main([str(sources), *out, "--tokenizer", str(bad)])
    assert not (tmp_path / "out").exists()
    folder = tmp_path / "repo"
    (folder / ".git").mkdir(parents=True)
    (folder / ".git" / "notes.txt").write_text("not a source")
    (folder / "a.txt").write_text("a source")
    assert find_sources([str(folder)]) == [folder / "a.txt"]
