"""Models in and out: a Hugging Face model folder imported with `init_from` gives transformers'
own logits, a run trained from it exports a folder that transformers loads with the project's
logits, and bad folders are refused in one line. transformers is the reference: the tests
build tiny random models with it and save them as it saves every model on the Hub."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from lm_ddp_bf16 import data as user_data
from lm_ddp_bf16 import model as user_model
from lm_ddp_bf16.config import load_config
from lm_ddp_bf16.corpus import Codec, prepare
from lm_ddp_bf16.corpus.chat import ChatTemplate, encode_example
from lm_ddp_bf16.corpus.shards import END_OF_TEXT
from lm_ddp_bf16.data import PLANNED_VOCABULARY
from lm_ddp_bf16.engine import build_on_meta, materialize
from lm_ddp_bf16.export import main as export_main
from lm_ddp_bf16.hub import export_folder, read_architecture
from lm_ddp_bf16.inference import load_trained
from lm_ddp_bf16.model import build_model, model_architecture
from lm_ddp_bf16.models import adapter_state, base_name
from lm_ddp_bf16.train import main as train_main

import launcher
from conftest import (
    PROJECT_ROOT,
    TEST_OVERRIDES,
    exported_weights,
    jinja,
    run_training,
    training_env,
)

# Tiny models of each architecture the families hold, at the project's vocabulary: grouped-query
# attention with an untied head (Llama), q/k/v biases with tied embeddings (Qwen2), and GPT-2.
ARCHITECTURES = {
    "llama": lambda: LlamaForCausalLM(
        LlamaConfig(
            vocab_size=PLANNED_VOCABULARY,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            rope_theta=500_000.0,
            bos_token_id=None,
            eos_token_id=PLANNED_VOCABULARY - 1,
        )
    ),
    "qwen2": lambda: Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=PLANNED_VOCABULARY,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            tie_word_embeddings=True,
        )
    ),
    "gpt2": lambda: GPT2LMHeadModel(
        GPT2Config(
            vocab_size=PLANNED_VOCABULARY,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=64,
            bos_token_id=PLANNED_VOCABULARY - 1,
            eos_token_id=PLANNED_VOCABULARY - 1,
        )
    ),
}
FAMILY = {"llama": "llama", "qwen2": "llama", "gpt2": "gpt2"}


def byte_tokenizer(path: Path) -> None:
    """A byte-level tokenizer.json of PLANNED_VOCABULARY tokens: the 256 bytes and end-of-text (no
    merges), the project's vocabulary, in the format a Hub model's tokenizer has."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=PLANNED_VOCABULARY,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(["def f():\n    return 1\n"], trainer)
    tokenizer.save(str(path))


@pytest.fixture(scope="module")
def hub_folders(tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module]]:
    """Each architecture's tiny model, seeded, saved by `save_pretrained` with a tokenizer."""
    folders = {}
    for name, make in ARCHITECTURES.items():
        torch.manual_seed(0)
        model = make().eval()
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        byte_tokenizer(folder / "tokenizer.json")
        folders[name] = (folder, model)
    return folders


def started_from(config, folder: Path, family: str):
    """`config` starting from the model folder `folder`, with its tokenizer where it has one."""
    tokenizer = folder / "tokenizer.json"
    tokenizer = str(tokenizer) if tokenizer.is_file() else "bytes"
    return dataclasses.replace(
        config, init_from=str(folder), model_family=family, tokenizer=tokenizer
    )


def imported(config, folder: Path, family: str) -> torch.nn.Module:
    """The project's model started from `folder`, as every engine builds it: on the meta
    device, materialised by `init_tensor` (here, the folder's weights)."""
    config = started_from(config, folder, family)
    return materialize(build_on_meta(config), torch.device("cpu"), config.seed).eval()


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_an_imported_model_gives_transformers_logits(config, hub_folders, name):
    folder, reference = hub_folders[name]
    model = imported(config, folder, FAMILY[name])
    tokens = torch.randint(0, PLANNED_VOCABULARY, (2, config.block_size))
    with torch.no_grad():
        ours, theirs = model(tokens), reference(tokens).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    other = materialize(build_on_meta(config), torch.device("cpu"), config.seed)
    assert not torch.equal(other(tokens), ours), "a model from scratch differs (the test can fail)"


def chat_records(count: int) -> list[dict]:
    """Short sums asked and answered: conversations of different lengths."""
    records = []
    for number in range(count):
        a, b = number % 13, number % 7
        messages = [{"role": "user", "content": f"{a}+{b}"}]
        messages.append({"role": "assistant", "content": str(a + b) + "!" * (number % 5)})
        records.append({"messages": messages})
    return records


def chat_model_and_data(model: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the model folder `model` with a chat template, and chat records prepared with
    its tokenizer into masked examples: the folder and the corpus."""
    folder = copy_folder(model, tmp_path / "chat-model")
    template = jinja("<% for m in messages %><< m['content'] + eos_token >><% endfor %>")
    config_file = folder / "tokenizer_config.json"
    config_file.write_text(json.dumps({"chat_template": template, "eos_token": END_OF_TEXT}))
    records = tmp_path / "chat.jsonl"
    records.write_text("".join(json.dumps(record) + "\n" for record in chat_records(400)))
    tokenizer = str(folder / "tokenizer.json")
    options = {"format": "chat", "tokenizer": tokenizer, "max_example_tokens": 32}
    prepare([str(records)], tmp_path / "data", val_fraction=0.1, **options)
    return folder, tmp_path / "data"


def test_a_run_from_an_import_exports_a_folder_transformers_loads_with_its_logits(
    config, hub_folders, tmp_path
):
    """The fine-tuning path end to end: a model folder with a chat template, chat records
    prepared into masked examples, trained packed, then exported."""
    folder, data_dir = chat_model_and_data(hub_folders["llama"][0], tmp_path)
    config_file = folder / "tokenizer_config.json"
    run_dir, tokenizer = tmp_path / "run", folder / "tokenizer.json"
    settings = [f"init_from={folder}", "model_family=llama", f"tokenizer={tokenizer}"]
    run_training(*settings, f"data_dir={data_dir}", f"run_dir={run_dir}", "max_steps=3")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["padding_packed"] < summary["padding_unpacked"] / 2, "packing packs"
    model, trained = load_trained(run_dir, "model-last.safetensors", torch.device("cpu"))
    started = load_file(folder / "model.safetensors")
    assert not torch.equal(started["lm_head.weight"], model.lm_head.weight), "it trained"

    out = tmp_path / "export"
    export_main([str(out), "--run-dir", str(run_dir), "--weights", "model-last.safetensors"])
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    tokens = torch.randint(0, PLANNED_VOCABULARY, (2, trained.block_size))
    with torch.no_grad():
        expected = model.eval()(tokens)
        torch.testing.assert_close(loaded(tokens).logits, expected, rtol=1e-5, atol=1e-5)
    text = "def f():\n    return 1\n"
    codec = Codec(tokenizer)
    loaded_tokenizer = AutoTokenizer.from_pretrained(out)
    assert loaded_tokenizer(text)["input_ids"] == codec.encode_batch([text])[0]
    conversation = chat_records(3)[2]  # the exported folder keeps the chat template
    ids, _ = encode_example(conversation, "chat", codec, ChatTemplate.load(config_file))
    expected = loaded_tokenizer.apply_chat_template(conversation["messages"], return_dict=True)
    assert expected["input_ids"] == ids.tolist()

    again = tmp_path / "again"  # export -> import -> export: the same tensors, bit for bit
    save_file(imported(config, out, "llama").state_dict(), tmp_path / "reimported.safetensors")
    export_folder(tmp_path / "reimported.safetensors", read_architecture(out), again)
    first, second = load_file(out / "model.safetensors"), load_file(again / "model.safetensors")
    assert sorted(first) == sorted(second)
    for key, tensor in first.items():
        assert torch.equal(tensor, second[key]), key
    assert json.loads((again / "config.json").read_text()) == json.loads(
        (out / "config.json").read_text()
    )

    # A checkpoint of the run, in its strategy's format, exports the weights it holds: the
    # last one's are the run's last.
    step = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    argv = [str(tmp_path / "from-step"), "--run-dir", str(run_dir), "--checkpoint", str(step)]
    result = launcher.run(export_main, *argv, cwd=PROJECT_ROOT, env=training_env())
    assert result.returncode == 0, result.stderr[-3000:]
    from_step = load_file(tmp_path / "from-step" / "model.safetensors")
    assert from_step.keys() == first.keys()
    assert all(torch.equal(from_step[key], tensor) for key, tensor in first.items())

    moved = copy_folder(folder, tmp_path / "moved")  # the same weights elsewhere: another start
    elsewhere = [f"init_from={moved}", "model_family=llama", f"tokenizer={tokenizer}"]
    argv = [*elsewhere, f"data_dir={data_dir}", f"run_dir={run_dir}", "max_steps=3", "--resume"]
    result = launcher.run(train_main, *TEST_OVERRIDES, *argv, cwd=PROJECT_ROOT, env=training_env())
    assert result.returncode != 0 and "cannot resume with changed init_from" in result.stderr


def test_a_model_from_scratch_exports_sharded_as_transformers_shards(config, tmp_path):
    model = materialize(build_on_meta(config), torch.device("cpu"), config.seed).eval()
    weights = tmp_path / "weights.safetensors"
    save_file(model.state_dict(), weights)
    out = tmp_path / "export"
    files = export_folder(weights, model_architecture(config), out, max_shard_bytes=20_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all(out / shard in files for shard in shards)
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    tokens = torch.randint(0, PLANNED_VOCABULARY, (2, config.block_size))
    with torch.no_grad():
        expected = model(tokens)
        torch.testing.assert_close(loaded(tokens).logits, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="exists and is not empty"):
        export_folder(weights, model_architecture(config), out)
    assert sorted(out.iterdir()) == files, "a refused export writes nothing"
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []


def write_config(folder: Path, **changes) -> None:
    """Change fields of `folder`'s config.json."""
    path = folder / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def copy_folder(source: Path, target: Path) -> Path:
    """A copy of a model folder, to break."""
    target.mkdir()
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def test_a_lora_run_trains_its_adapters_only_resumes_bitwise_and_exports_for_peft(
    hub_folders, tmp_path
):
    """finetune = lora on an imported Llama, on packed chat examples: the folder's weights
    stay as they are, the adapters train, a resume from the middle of an epoch ends bitwise
    where the straight run ends, the checkpoints hold the adapters, and the export is PEFT's
    adapter, or the merged model transformers loads."""
    folder, data_dir = chat_model_and_data(hub_folders["llama"][0], tmp_path)
    tokenizer = folder / "tokenizer.json"
    lora = [f"init_from={folder}", "model_family=llama", f"tokenizer={tokenizer}"]
    lora += ["finetune=lora", "lora_rank=4", f"data_dir={data_dir}", "max_steps=4"]
    lora += ["lr=0.01", "warmup_steps=1", "val_every=2", "checkpoint_every=2"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_training(*lora, f"run_dir={straight}")
    run_training(*lora, f"run_dir={resumed}", "stop_after_steps=2")
    run_training(*lora, f"run_dir={resumed}", "--resume")
    trained, again = exported_weights(straight), exported_weights(resumed)
    assert trained.keys() == again.keys()
    assert all(torch.equal(trained[key], again[key]) for key in trained), "bitwise resume"
    started = load_file(folder / "model.safetensors")
    adapters = adapter_state(trained)
    base = {base_name(key): value for key, value in trained.items() if key not in adapters}
    assert base.keys() == started.keys()
    assert all(torch.equal(base[key], started[key]) for key in base), "frozen weights"
    assert all(t.abs().sum() > 0 for key, t in adapters.items() if "lora_B" in key), "trained"
    summary = json.loads((straight / "summary.json").read_text())
    assert summary["trained_parameters"] == sum(t.numel() for t in adapters.values())
    assert summary["trained_parameters"] < summary["parameters"] / 10
    per_trained = summary["tokens_trained"] / summary["trained_parameters"]
    assert summary["tokens_per_parameter"] == pytest.approx(per_trained)
    assert summary["epochs_over_corpus"] == pytest.approx(
        summary["epochs"] * summary["epoch_share_of_corpus"]
    )
    step = sorted((straight / "checkpoints").glob("step-*"))[-1]  # adapters and their moments
    assert folder_bytes(step) < (folder / "model.safetensors").stat().st_size

    model, _ = load_trained(straight, "model-last.safetensors", torch.device("cpu"))
    tokens = torch.randint(0, PLANNED_VOCABULARY, (2, 16))
    with torch.no_grad():
        expected = model.eval()(tokens)
        last = ["--run-dir", str(straight), "--weights", "model-last.safetensors"]
        export_main([str(tmp_path / "adapter"), *last])
        onto = AutoModelForCausalLM.from_pretrained(folder)
        peft_model = PeftModel.from_pretrained(onto, tmp_path / "adapter").eval()
        torch.testing.assert_close(peft_model(tokens).logits, expected, rtol=1e-5, atol=1e-5)
        conversation = chat_records(3)[2]["messages"]  # the tokenizer beside the adapter
        own = AutoTokenizer.from_pretrained(folder).apply_chat_template(conversation)
        beside = AutoTokenizer.from_pretrained(tmp_path / "adapter")
        assert beside.apply_chat_template(conversation) == own
        assert (tmp_path / "adapter" / "chat_template.jinja").is_file()
        export_main([str(tmp_path / "merged"), *last, "--merge"])
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
        torch.testing.assert_close(merged(tokens).logits, expected, rtol=1e-5, atol=1e-5)
    name = "model.layers.0.self_attn.q_proj"
    a, b = adapters[f"{name}.lora_A.default.weight"], adapters[f"{name}.lora_B.default.weight"]
    scale = load_config(PROJECT_ROOT / "configs" / "train.toml").lora_alpha / 4  # alpha / rank
    folded = started[f"{name}.weight"] + scale * b @ a
    torch.testing.assert_close(merged.state_dict()[f"{name}.weight"], folded, rtol=0, atol=1e-6)

    changed = {key: value + 1e-3 for key, value in started.items()}  # another base: refused
    save_file(changed, folder / "model.safetensors", metadata={"format": "pt"})
    argv = [*TEST_OVERRIDES, *lora, f"run_dir={resumed}", "--resume"]
    result = launcher.run(train_main, *argv, cwd=PROJECT_ROOT, env=training_env())
    assert result.returncode != 0 and "not those the adapters trained on" in result.stderr
    with pytest.raises(ValueError, match="finetune = lora adapts a Llama-family model"):
        load_config(PROJECT_ROOT / "configs" / "train.toml", ["finetune=lora"])


def test_bad_model_folders_are_refused_in_one_line(config, hub_folders, tmp_path, monkeypatch):
    folder, _ = hub_folders["llama"]

    def refusal(broken: Path, family: str = "llama") -> str:
        with pytest.raises(ValueError) as error:
            build_model(started_from(config, broken, family))
        assert "\n" not in str(error.value)
        return str(error.value)

    assert "holds no config.json" in refusal(tmp_path)
    assert "does not exist" in refusal(tmp_path / "nowhere")
    larger = copy_folder(folder, tmp_path / "larger")
    words = {f"w{i}": i for i in range(PLANNED_VOCABULARY + 10)}
    Tokenizer(models.WordLevel(words, unk_token="w0")).save(str(larger / "tokenizer.json"))
    assert f"has {PLANNED_VOCABULARY + 10:,} tokens and the model's embedding" in refusal(larger)
    moe = copy_folder(folder, tmp_path / "moe")
    write_config(moe, model_type="mixtral", num_local_experts=8)
    assert "model_type 'mixtral' is not supported; supported: llama, mistral" in refusal(moe)
    window = copy_folder(folder, tmp_path / "window")
    write_config(window, model_type="mistral", sliding_window=16)
    assert "sliding-window attention" in refusal(window)
    scaled = copy_folder(folder, tmp_path / "scaled")
    write_config(scaled, rope_scaling={"rope_type": "llama3", "factor": 8.0})
    assert "rope scaling (llama3)" in refusal(scaled)
    wider = copy_folder(folder, tmp_path / "wider")
    write_config(wider, vocab_size=PLANNED_VOCABULARY + 64)
    wide = PLANNED_VOCABULARY + 64  # the folder keeps its own vocabulary, NUM_CLASSES unset
    assert model_architecture(started_from(config, wider, "llama")).vocab_size == wide
    for module in (user_data, user_model):  # a NUM_CLASSES of the user's, where both read it
        monkeypatch.setattr(module, "NUM_CLASSES", PLANNED_VOCABULARY)
    assert f"set NUM_CLASSES = {wide}, or None" in refusal(wider)
    monkeypatch.setattr(user_model, "corpus_vocabulary", lambda _: PLANNED_VOCABULARY + 1)
    corpus = f"tokenizer has {PLANNED_VOCABULARY + 1} tokens and {folder}'s model"
    assert corpus in refusal(folder), "a corpus the folder's vocabulary cannot hold"
    monkeypatch.undo()
    assert "model_family is gpt2" in refusal(folder, "gpt2")
    shape = copy_folder(folder, tmp_path / "shape")
    write_config(shape, intermediate_size=128)
    assert "disagree with its config.json: model.layers.0.mlp.gate_proj.weight" in refusal(shape)
    cut = copy_folder(folder, tmp_path / "cut")
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # a download cut short
    assert f"{weights} is not a complete safetensors file (" in refusal(cut)
    assert refusal(cut).endswith("; download it again")
    keys = copy_folder(folder, tmp_path / "keys")
    tensors = load_file(keys / "model.safetensors")
    tensors["model.extra.weight"] = tensors.pop("model.norm.weight")
    save_file(tensors, keys / "model.safetensors")
    message = refusal(keys)
    assert "missing model.norm.weight; unexpected model.extra.weight" in message
    (keys / "model.safetensors").unlink()
    assert "holds no model.safetensors or model.safetensors.index.json" in refusal(keys)
    with pytest.raises(ValueError, match="the one init_from's model was trained with"):
        load_config(PROJECT_ROOT / "configs" / "train.toml", [f"init_from={folder}"])
    short = dataclasses.replace(config, block_size=65)
    with pytest.raises(ValueError, match="block_size 65 is longer than"):
        build_model(started_from(short, folder, "llama"))
