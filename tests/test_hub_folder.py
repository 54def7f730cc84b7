"""`init_from`: scaffold reads a Hugging Face model folder's config.json as the rendered project
does (the same parameter count as the rendered model, the same refusals), takes the model size,
family, vocabulary, context and tokenizer from it, and plans continued training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from test_shapes import LM_SAMPLE, parameter_count, rendered

from scaffold.answers import QUESTION_BY_KEY, build_answers, merge_sources
from scaffold.errors import AnswerError
from scaffold.hub_folder import read_hub_folder
from scaffold.planner import plan
from scaffold.variants import VARIANTS

LLAMA = {
    "model_type": "llama",
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}
QWEN2 = {**LLAMA, "model_type": "qwen2", "tie_word_embeddings": True, "use_sliding_window": False}
GPT2 = {"model_type": "gpt2", "vocab_size": 320, "n_embd": 64, "n_layer": 2, "n_head": 4}
GPT2 |= {"n_positions": 128}


def model_folder(path: Path, config: dict) -> Path:
    """A folder with config.json, a weights file and tokenizer.json (the weights' tensors are
    the project's to read: scaffold reads config.json and the weights' headers only)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file({"w": torch.zeros(4)}, path / "model.safetensors")
    (path / "tokenizer.json").write_text("{}")
    return path


@pytest.mark.parametrize("config", [LLAMA, QWEN2, GPT2], ids=["llama", "qwen2", "gpt2"])
def test_the_parameter_count_is_the_rendered_models(config, tmp_path):
    import torch

    shape = read_hub_folder(str(model_folder(tmp_path, config)), 64)
    (tmp_path / "tokenizer.json").unlink()  # a stand-in: the project loads a real one
    architecture = rendered(LM_SAMPLE, "hub.architecture").read_architecture(tmp_path)
    model_py = rendered(LM_SAMPLE, "model")
    with torch.device("meta"):
        if architecture.family == "llama":
            model = rendered(LM_SAMPLE, "models.llama").Llama(architecture.shape)
        else:
            width, depth, heads, positions = (64, 2, 4, 128)
            model = model_py.ByteGPT(width, depth, heads, positions, vocab_size=320)
    assert shape.params == parameter_count(model)
    assert (shape.family, shape.vocab, shape.block_size) == (architecture.family, 320, 64)


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"model_type": "mixtral"}, "model_type 'mixtral' is not supported; supported: llama"),
        ({"model_type": "mistral", "sliding_window": 64}, "sliding-window attention"),
        ({"rope_scaling": {"rope_type": "llama3"}}, "rope scaling (llama3)"),
        ({"num_local_experts": 8}, "a mixture of experts"),
        ({"hidden_act": "gelu"}, "an MLP of gelu"),
    ],
)
def test_an_architecture_the_project_cannot_hold_is_refused_with_what_it_can(
    change, refusal, tmp_path
):
    folder = model_folder(tmp_path, LLAMA | change)
    with pytest.raises(AnswerError, match="supported: llama, mistral and qwen2") as error:
        read_hub_folder(str(folder), 64)
    assert refusal in str(error.value) and "\n" not in str(error.value)


def test_a_folder_without_its_files_is_refused_naming_the_missing_one(tmp_path):
    with pytest.raises(AnswerError, match="does not exist"):
        read_hub_folder(str(tmp_path / "nowhere"), 64)
    with pytest.raises(AnswerError, match="holds no config.json"):
        read_hub_folder(str(tmp_path), 64)
    folder = model_folder(tmp_path, LLAMA)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(AnswerError, match="holds no tokenizer.json"):
        read_hub_folder(str(folder), 64)
    (folder / "model.safetensors").unlink()
    with pytest.raises(AnswerError, match="no model.safetensors or its index"):
        read_hub_folder(str(folder), 64)


def test_a_weights_file_cut_short_or_corrupt_is_refused_in_one_line_naming_it(tmp_path):
    folder = model_folder(tmp_path / "whole", LLAMA)
    weights = folder / "model.safetensors"
    whole = weights.read_bytes()
    read_hub_folder(str(folder), 64)
    broken = {
        "cut short": whole[:-3],
        "longer": whole + b"0",
        "header only": whole[: 8 + int.from_bytes(whole[:8], "little") - 1],
        "a few bytes": whole[:5],
        "not JSON": whole[:8] + b"[" + whole[9:],
        "not safetensors": b"<html>not found</html>",
    }
    for why, data in broken.items():
        weights.write_bytes(data)
        with pytest.raises(SafetensorError):  # safetensors refuses it too
            safe_open(weights, framework="pt")
        with pytest.raises(AnswerError, match="download it again") as error:
            read_hub_folder(str(folder), 64)
        message = str(error.value)
        assert message.startswith(f"init_from {weights} is not a complete safetensors file ("), why
        assert "\n" not in message, why
    sharded = model_folder(tmp_path / "sharded", LLAMA)
    (sharded / "model.safetensors").rename(sharded / "model-00001-of-00002.safetensors")
    save_file({"v": torch.zeros(2)}, sharded / "model-00002-of-00002.safetensors")
    weight_map = {"w": "model-00001-of-00002.safetensors", "v": "model-00002-of-00002.safetensors"}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    read_hub_folder(str(sharded), 64)
    second = sharded / "model-00002-of-00002.safetensors"
    second.write_bytes(second.read_bytes()[:-1])
    with pytest.raises(AnswerError, match=f"init_from {second} is not a complete safetensors"):
        read_hub_folder(str(sharded), 64)
    second.unlink()
    with pytest.raises(AnswerError, match="names shards that are not there: model-00002-of"):
        read_hub_folder(str(sharded), 64)


def test_a_tokenizer_larger_than_the_embedding_is_refused(tmp_path):
    folder = model_folder(tmp_path, LLAMA)
    tokenizer = {"model": {"vocab": {f"w{i}": i for i in range(300)}}}
    tokenizer["added_tokens"] = [{"id": 330, "content": "<|endoftext|>"}]
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(AnswerError, match="tokenizer.json has 331 tokens and the model's embed"):
        read_hub_folder(str(folder), 64)
    tokenizer["added_tokens"][0]["id"] = 319  # 320 tokens: the embedding's rows
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert read_hub_folder(str(folder), 64).vocab == 320


def lm_answers(**answers) -> dict:
    return {**VARIANTS["lm-cpu-single-fp32"], "project_name": "demo"} | answers


def test_init_from_plans_from_the_folders_config_and_tokenizer(tmp_path):
    folder = str(model_folder(tmp_path / "smol", LLAMA))
    variant = {k: v for k, v in lm_answers().items() if k not in ("model_size", "model_family")}
    answers = build_answers(merge_sources({"init_from": folder}, variant))
    shape = read_hub_folder(folder, 64)
    assert answers.model_size == str(shape.params) and answers.model_family == "llama"
    planned = plan(answers)
    settings = planned.settings
    assert settings["tokenizer"].value == f"{folder}/tokenizer.json"
    assert settings["vocab_size"].value == 320 and settings["init_from"].value == folder
    scratch = plan(build_answers(merge_sources({"model_size": answers.model_size}, variant)))
    assert settings["lr"].value == pytest.approx(scratch.settings["lr"].value / 10)
    assert "continued training" in settings["lr"].source
    assert settings["warmup_steps"].value < scratch.settings["warmup_steps"].value
    assert any(f"{folder}'s config.json (llama" in line for line in planned.reasons)
    data = planned.copier_data()
    assert data["init_from"] == folder and data["plan"]["vocab_size"]["python"] == "320"


def test_answers_that_contradict_the_folder_are_refused(tmp_path):
    folder = str(model_folder(tmp_path / "smol", LLAMA))
    with pytest.raises(AnswerError, match="model_size 7B contradicts init_from"):
        build_answers(merge_sources(lm_answers(init_from=folder, model_size="7B")))
    with pytest.raises(AnswerError, match="model_family gpt2 contradicts init_from"):
        build_answers(merge_sources(lm_answers(init_from=folder, model_family="gpt2")))
    image = {**VARIANTS["cpu-single-fp32"], "project_name": "demo", "init_from": folder}
    with pytest.raises(AnswerError, match="does not name its model"):
        plan(build_answers(merge_sources(image)))


def test_the_questionnaire_asks_what_the_folder_does_not_answer():
    lm = {"task": "language-model", "hardware": "cpu"}
    assert QUESTION_BY_KEY["init_from"].asked(lm)
    assert not QUESTION_BY_KEY["init_from"].asked({**lm, "task": "image-classification"})
    for key in ("model_size", "model_family"):
        assert QUESTION_BY_KEY[key].asked(lm)
        assert not QUESTION_BY_KEY[key].asked({**lm, "init_from": "/models/smol"})


def test_lora_is_planned_where_every_weight_does_not_fit_and_its_count_is_the_rendered_ones(
    tmp_path,
):
    import torch

    seven_b = {**LLAMA, "vocab_size": 32_000, "hidden_size": 4096, "intermediate_size": 11_008}
    seven_b |= {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32}
    folder = str(model_folder(tmp_path / "7b", seven_b))
    # One 80 GiB GPU and 64 GiB of host memory: every weight's state (16 bytes each) fits
    # neither, even offloaded; the adapters' beside the frozen weights fit the GPU.
    gpu = {**VARIANTS["lm-ddp-bf16"], "project_name": "demo", "gpus_per_node": 1}
    gpu |= {"host_memory_gb": 64.0}
    gpu = {k: v for k, v in gpu.items() if k not in ("model_size", "model_family", "strategy")}
    settings = plan(build_answers(merge_sources({"init_from": folder}, gpu))).settings
    assert settings["finetune"].value == "lora", settings["finetune"].source
    source = settings["finetune"].source
    assert "does not fit" in source and "LoRA at rank 16" in source

    small = str(model_folder(tmp_path / "small", LLAMA))
    settings = plan(build_answers(merge_sources({"init_from": small}, gpu))).settings
    assert settings["finetune"].value == "full" and "LoRA at rank 16" in settings["finetune"].source

    # The adapters' parameter count is the rendered model's, with PEFT's layers on it.
    shape = read_hub_folder(small, 64)
    (tmp_path / "small" / "tokenizer.json").unlink()
    architecture = rendered(LM_SAMPLE, "hub.architecture").read_architecture(tmp_path / "small")
    lora = rendered(LM_SAMPLE, "models.lora")
    with torch.device("meta"):
        model = rendered(LM_SAMPLE, "models.llama").Llama(architecture.shape)
    model.init_tensor = lambda *args: None
    targets = ",".join(lora.LLAMA_PROJECTIONS)
    settings = type("Settings", (), {"lora_targets": targets, "lora_rank": 16})
    settings.lora_alpha, settings.lora_dropout = 32, 0.0
    adapted = lora.add_adapters(model, settings)
    trained = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    assert shape.lora_parameters(16) == trained
