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

from lm_cpu_single_fp32.corpus import prepare
from lm_cpu_single_fp32.corpus.shards import END_OF_TEXT
from lm_cpu_single_fp32.data import PLANNED_VOCABULARY
from lm_cpu_single_fp32.engine import PRECISION
from lm_cpu_single_fp32.evaluate.__main__ import main as evaluate_main
from lm_cpu_single_fp32.evaluate.harness import OFFLINE_ENV, _absolute_data_files, run_tasks

from conftest import run_training

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


def test_unknown_task_is_one_line_naming_the_local_tasks(
    model_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lm_eval.tasks

    class LocalOnly(lm_eval.tasks.TaskManager):  # indexing lm-eval's own 15,000 tasks: ~8 s
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **{**kwargs, "include_defaults": False})

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", LocalOnly)
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


# Training the task into a run takes 8 s in fp32 on a CPU and three times as long in a 16-bit
# precision; what it checks after the training (export, lm-eval, the metric) is the same code in
# every variant.
@pytest.mark.skipif(PRECISION != "fp32", reason="trained where training is quick: fp32 variants")
def test_a_run_trained_on_a_task_answers_it_where_its_base_model_guesses(tmp_path: Path) -> None:
    """`evaluate --tasks` on a run: a tiny Llama trained on tiny_choice's answers (its jsonl's
    text lines, in shuffled documents) scores acc 1.0 through the run's export; the folder it
    started from, about chance (0.25 for four choices)."""
    lines = [json.loads(line)["text"] for line in (TASK_DIR / "tiny_choice.jsonl").open()]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=PLANNED_VOCABULARY,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer)
    base = tmp_path / "base"
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=END_OF_TEXT)
    fast.save_pretrained(base)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=PLANNED_VOCABULARY,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        eos_token_id=tokenizer.token_to_id(END_OF_TEXT),
    )
    LlamaForCausalLM(config).save_pretrained(base)
    order = torch.Generator().manual_seed(0)
    shuffled = (torch.randperm(len(lines), generator=order).tolist() for _ in range(40))
    documents = ["".join(lines[i] for i in indices) for indices in shuffled]
    corpus = tmp_path / "answers.jsonl"
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in documents))
    data_dir, run_dir = tmp_path / "data", tmp_path / "run"
    prepare([str(corpus)], data_dir, tokenizer=str(base / "tokenizer.json"), val_fraction=0.1)
    settings = [f"init_from={base}", "model_family=llama", f"tokenizer={base / 'tokenizer.json'}"]
    settings += [f"data_dir={data_dir}", "prepare_example=false", f"run_dir={run_dir}"]
    settings += ["block_size=64", "micro_batch_size=16", "epochs=100", "max_steps=150", "lr=3e-3"]
    run_training(*settings, "warmup_steps=10", "checkpoint_every=0")
    argv = ["--run-dir", str(run_dir), "--weights", "model-last.safetensors", "--max-bytes", "500"]
    results = evaluate_main([*argv, "--tasks", "tiny_choice", "--task-dir", str(TASK_DIR)])
    assert results["tasks"]["tiny_choice"]["acc"] == 1.0
    guessed = run_tasks(base, ["tiny_choice"], task_dir=TASK_DIR)["tiny_choice"]["acc"]
    assert guessed <= 0.5
