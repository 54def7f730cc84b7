"""lm-evaluation-harness on an exported model folder, offline: the tiny local tasks in
tests/eval_tasks run on a tiny random transformers model (saved as transformers saves every model
on the Hub) from any working directory, and bad requests are refused in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from fabric_lm_fsdp2_fp32.evaluate.harness import OFFLINE_ENV, _absolute_data_files, run_tasks

TASK_DIR = Path(__file__).resolve().parent / "eval_tasks"
TASKS = ["tiny_choice", "tiny_answer"]


@pytest.fixture(autouse=True)
def offline_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The offline switches run_tasks sets, undone after each test."""
    for name, value in OFFLINE_ENV.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with a byte-level BPE tokenizer trained on the tasks' text."""
    texts = [
        json.loads(line)["text"]
        for path in sorted(TASK_DIR.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    folder = tmp_path_factory.mktemp("tiny-llama")
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    ).save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=0,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def test_runs_local_tasks_from_any_directory(
    model_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tasks' data_files are relative to their YAML files, not to the working directory.
    monkeypatch.chdir(tmp_path)
    results = run_tasks(model_folder, TASKS, task_dir=TASK_DIR, batch_size=4, limit=4)
    assert set(results) == set(TASKS)
    assert set(results["tiny_choice"]) == {"acc", "acc_norm"}
    assert set(results["tiny_answer"]) == {"exact_match"}
    for metrics in results.values():
        for value in metrics.values():
            assert isinstance(value, float) and 0.0 <= value <= 1.0


def test_unknown_task_is_one_line_naming_the_local_tasks(model_folder: Path) -> None:
    with pytest.raises(ValueError, match="unknown lm-eval task 'no_such_task'") as raised:
        run_tasks(model_folder, ["tiny_choice", "no_such_task"], task_dir=TASK_DIR)
    message = str(raised.value)
    assert "\n" not in message and "tiny_answer, tiny_choice" in message


def test_folder_transformers_cannot_load_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="transformers cannot load") as raised:
        run_tasks(tmp_path, ["tiny_choice"], task_dir=TASK_DIR)
    assert "\n" not in str(raised.value)


def test_missing_lm_eval_names_the_extra(
    model_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    with pytest.raises(ValueError, match=r"pip install -e '\.\[eval\]'"):
        run_tasks(model_folder, ["tiny_choice"], task_dir=TASK_DIR)


@pytest.mark.parametrize(
    ("data_files", "expected"),
    [
        ("a.jsonl", "/tasks/a.jsonl"),
        (["a.jsonl", "/abs/b.jsonl"], ["/tasks/a.jsonl", "/abs/b.jsonl"]),
        (
            {"test": "a.jsonl", "train": ["hf://datasets/x/y.jsonl"]},
            {"test": "/tasks/a.jsonl", "train": ["hf://datasets/x/y.jsonl"]},
        ),
    ],
)
def test_relative_data_files_are_anchored_at_the_yaml(data_files, expected) -> None:
    config = {"task": "t", "dataset_kwargs": {"data_files": data_files}}
    anchored = _absolute_data_files(config, Path("/tasks/t.yaml"))
    assert anchored["dataset_kwargs"]["data_files"] == expected
    assert config["dataset_kwargs"]["data_files"] == data_files
