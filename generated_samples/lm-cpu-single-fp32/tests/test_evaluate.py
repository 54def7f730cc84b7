"""evaluate and bits per byte: the figure of a known model on a known text is the one computed by
hand from transformers' logits, a run is scored on its validation split with the results kept
in its folder, training measures the held-out text every `eval_every` steps as the command
does, and ranks that split the windows add up to one process's figure."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM

from lm_cpu_single_fp32.corpus import Codec
from lm_cpu_single_fp32.corpus.shards import END_OF_TEXT
from lm_cpu_single_fp32.data import PLANNED_VOCABULARY, build_datasets
from lm_cpu_single_fp32.engine import PRECISION
from lm_cpu_single_fp32.evaluate import HeldOutText, bits_per_byte, score
from lm_cpu_single_fp32.evaluate.__main__ import main as evaluate_main
from lm_cpu_single_fp32.model import build_model

from conftest import run_training, tensorboard_scalars

TEXT = "the cat sat on the mat; héllo wörld ✓ 0123\n"  # non-ASCII: bytes are not characters


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A tiny random Llama saved by transformers, with a byte-level BPE of PLANNED_VOCABULARY
    tokens."""
    folder = tmp_path_factory.mktemp("llama")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=PLANNED_VOCABULARY,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([TEXT * 3], trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=PLANNED_VOCABULARY,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=128,
        eos_token_id=tokenizer.token_to_id(END_OF_TEXT),
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def test_bits_per_byte_is_transformers_nll_over_the_texts_utf8_bytes(folder, tmp_path, capsys):
    text_file = tmp_path / "text.txt"
    text_file.write_text(TEXT, encoding="utf-8")
    results = evaluate_main([str(text_file), "--model", str(folder), "--device", "cpu"])
    figures = results["text"]["figures"]

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = tokenizer.encode(TEXT, add_special_tokens=False).ids
    reference = LlamaForCausalLM.from_pretrained(folder).eval()
    inputs = torch.tensor([[tokenizer.token_to_id(END_OF_TEXT), *ids]])  # after end-of-text
    with torch.no_grad():
        logits = reference(inputs).logits[0, :-1]
    nats = F.cross_entropy(logits, torch.tensor(ids), reduction="sum").item()
    size = len(TEXT.encode("utf-8"))
    assert size > len(TEXT) and figures["bytes"] == size and figures["tokens"] == len(ids)
    assert figures["bits_per_byte"] == pytest.approx(nats / math.log(2) / size, rel=1e-5)
    assert figures["perplexity"] == pytest.approx(math.exp(nats / len(ids)), rel=1e-5)
    assert f"bits per byte {figures['bits_per_byte']:.4f}" in capsys.readouterr().out

    records = tmp_path / "records.jsonl"  # each record one document; the first bytes only
    records.write_text("".join(json.dumps({"text": TEXT}) + "\n" for _ in range(3)))
    half = evaluate_main([str(records), "--model", str(folder), "--max-bytes", str(size)])
    assert half["text"]["figures"]["bytes"] == size
    assert half["text"]["figures"]["bits_per_byte"] == pytest.approx(figures["bits_per_byte"])
    with pytest.raises(SystemExit, match="no 'text' string; these are chat records"):
        records.write_text(json.dumps({"messages": []}) + "\n")
        evaluate_main([str(records), "--model", str(folder)])
    with pytest.raises(SystemExit, match="has no validation split: name the texts"):
        evaluate_main(["--model", str(folder)])


def test_a_run_is_scored_on_its_validation_split_and_keeps_the_results(config, tmp_path, capsys):
    """Byte tokens: every counted token is one byte, so bits per byte is the loss over ln 2."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    build_datasets(config)  # the test corpus, prepared if it is not yet
    (run_dir / "config.json").write_text(json.dumps(config.to_dict()))
    for name, source in config.task_run_files().items():
        (run_dir / name).write_bytes(source.read_bytes())
    save_file(build_model(config).state_dict(), run_dir / "model.safetensors")
    results = evaluate_main(["--run-dir", str(run_dir), "--max-bytes", "3000"])
    figures = results["text"]["figures"]
    assert figures["bytes"] == figures["tokens"] and 3000 <= figures["bytes"] < 3000 + 64
    assert figures["bits_per_byte"] == pytest.approx(figures["loss"] / math.log(2))
    random_weights = math.log(PLANNED_VOCABULARY)
    assert figures["loss"] == pytest.approx(random_weights, rel=0.05), "random weights"
    kept = json.loads((run_dir / "eval.json").read_text())["model.safetensors"]["texts"]
    assert list(kept.values()) == [results["text"]]
    events = EventAccumulator(str(run_dir / "tensorboard" / "eval"))
    events.Reload()
    (scalar,) = events.Scalars("eval/bits_per_byte")
    assert (scalar.step, scalar.value) == (0, pytest.approx(figures["bits_per_byte"], rel=1e-6))
    text_file = tmp_path / "mine.txt"  # another text's figures go beside the first's
    text_file.write_text("def f():\n    return 1\n")
    evaluate_main([str(text_file), "--run-dir", str(run_dir)])
    kept = json.loads((run_dir / "eval.json").read_text())["model.safetensors"]["texts"]
    assert list(kept) == [results["text"]["source"], str(text_file)]
    with pytest.raises(SystemExit, match="byte tokens, for which transformers .* no tokenizer"):
        evaluate_main(["--run-dir", str(run_dir), "--tasks", "anything"])
    with pytest.raises(SystemExit, match="--task-dir and --limit choose lm-eval tasks"):
        evaluate_main(["--run-dir", str(run_dir), "--limit", "3"])


def test_training_measures_the_held_out_text_as_the_command_does(config, tmp_path):
    run_dir = tmp_path / "run"
    run_training(f"run_dir={run_dir}", "max_steps=4", "eval_every=2", "eval_bytes=2000")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [record for record in records if record["kind"] == "eval"]
    assert [record["step"] for record in evals] == [2, 4]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["evaluation"] == {key: evals[-1][key] for key in summary["evaluation"]}
    assert summary["evaluation"]["step"] == 4
    tags = tensorboard_scalars(run_dir)
    assert [step for step, _ in tags["eval/bits_per_byte"]] == [2, 4]
    argv = ["--run-dir", str(run_dir), "--weights", "model-last.safetensors"]
    offline = evaluate_main([*argv, "--max-bytes", "2000", "--batch-size", "32"])
    measured = evals[-1]["eval_bits_per_byte"]
    tolerance = 1e-4 if PRECISION == "fp32" else 2e-2  # training measures in its precision
    assert offline["text"]["figures"]["bits_per_byte"] == pytest.approx(measured, rel=tolerance)


def test_ranks_that_split_the_windows_add_up_to_one_process(config, monkeypatch):
    """Every rank runs as many forward passes; the sums over ranks are one process's."""
    codec = Codec(None)
    text = HeldOutText.from_texts(["abc" * 50, "de" * 70, "f" * 33], codec)
    torch.manual_seed(0)
    model = build_model(dataclasses.replace(config, dropout=0.0)).eval()
    calls: list[int] = []

    def forward(inputs):
        calls.append(len(inputs))
        return model(inputs)

    one = score(forward, text, config.block_size, 3, torch.device("cpu"))
    monkeypatch.setattr(bits_per_byte, "all_reduce_sum", lambda tensor, runtime: tensor)
    parts = []
    for rank in range(2):
        calls.clear()
        runtime = type("Runtime", (), {"world_size": 2, "rank": rank})()
        parts.append(score(forward, text, config.block_size, 3, torch.device("cpu"), runtime))
        assert len(calls) == 2, "each rank runs ceil(ceil(W / 2) / 3) forward passes"
    assert sum(part.nats for part in parts) == pytest.approx(one.nats, rel=1e-6)
    assert sum(part.tokens for part in parts) == one.tokens == 150 + 140 + 33
