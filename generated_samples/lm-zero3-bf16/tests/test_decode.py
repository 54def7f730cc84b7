"""Using a trained language model: one decoding path with a key-value cache whose greedy output
is transformers' own, a chat through the model's template that stops at its end of turn, and
an export that carries the template and the end-of-turn id to transformers. transformers is the
reference: tiny random models saved by it as it saves every model on the Hub."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

from lm_zero3_bf16.chat import Conversation, talk
from lm_zero3_bf16.chat import main as chat_main
from lm_zero3_bf16.corpus import Codec, prepare
from lm_zero3_bf16.corpus.chat import ChatTemplate, encode_example
from lm_zero3_bf16.data import PLANNED_VOCABULARY
from lm_zero3_bf16.export import main as export_main
from lm_zero3_bf16.generate import main as generate_main
from lm_zero3_bf16.inference.decode import Decoder, Sampling
from lm_zero3_bf16.inference.sources import LanguageModel, end_of_turn_ids, folder_model
from lm_zero3_bf16.model import ByteGPT, build_model
from lm_zero3_bf16.models import KVCache, Llama, LlamaShape

from conftest import jinja

END_OF_TEXT, TURN_START, TURN_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHATML = jinja(
    "<% for m in messages %><|im_start|><< m['role'] >>\n<< m['content'] >><|im_end|>\n"
    "<% endfor %><% if add_generation_prompt %><|im_start|>assistant\n<% endif %>"
)
CONTEXT = 512  # the tiny models' positions: longer than the tests' block_size (32)
WORDS = "the cat sat on a mat and said hello how are you thanks fine good day 0123456789 +-=?!"


def chat_tokenizer(path: Path) -> Tokenizer:
    """A byte-level BPE of exactly PLANNED_VOCABULARY tokens with ChatML's special tokens, saved to
    `path` (tokenizer.json): the ids fill the model's vocabulary, so no id is padding."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=64, special_tokens=[END_OF_TEXT, TURN_START, TURN_END], show_progress=False
    )
    tokenizer.train_from_iterator([WORDS, "user assistant system\n"], trainer)
    filler = PLANNED_VOCABULARY - tokenizer.get_vocab_size(with_added_tokens=True)
    tokenizer.add_special_tokens([f"<|unused{number}|>" for number in range(filler)])
    assert tokenizer.get_vocab_size(with_added_tokens=True) == PLANNED_VOCABULARY
    tokenizer.save(str(path))
    return tokenizer


def llama() -> torch.nn.Module:
    """Grouped-query attention (4 query heads on 2 key-value heads), an untied head."""
    config = LlamaConfig(
        vocab_size=PLANNED_VOCABULARY,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        initializer_range=0.1,  # peaked logits: no near-ties for float rounding to flip
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def gpt2() -> torch.nn.Module:
    config = GPT2Config(
        vocab_size=PLANNED_VOCABULARY, n_embd=64, n_layer=2, n_head=4, n_positions=CONTEXT
    )
    config.initializer_range = 0.1
    return GPT2LMHeadModel(config)


@pytest.fixture(scope="module")
def chat_folders(tmp_path_factory) -> dict[str, Path]:
    """Each family's tiny model saved by `save_pretrained`, with the ChatML tokenizer, its
    template in chat_template.jinja (transformers 5's layout) and the end of text as its
    eos_token."""
    folders = {}
    for name, make in {"llama": llama, "gpt2": gpt2}.items():
        torch.manual_seed(0)
        folder = tmp_path_factory.mktemp(name)
        tokenizer = chat_tokenizer(folder / "tokenizer.json")
        model = make()
        model.generation_config.eos_token_id = tokenizer.token_to_id(END_OF_TEXT)
        model.save_pretrained(folder)
        settings = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": END_OF_TEXT}
        (folder / "tokenizer_config.json").write_text(json.dumps(settings))
        (folder / "chat_template.jinja").write_text(CHATML)
        folders[name] = folder
    return folders


def greedy(folder: Path, prompt: list[int], new: int) -> list[int]:
    """transformers' greedy continuation of `prompt` from the model folder: `new` tokens, not
    stopped early."""
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids, do_sample=False, max_new_tokens=new, min_new_tokens=new, eos_token_id=None
        )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_greedy_decoding_is_transformers_token_for_token_past_the_training_context(
    config, chat_folders, family
):
    """200 new tokens after a prompt longer than the training block_size, through the cache."""
    folder = chat_folders[family]
    model, architecture = folder_model(folder, torch.device("cpu"))
    assert architecture.max_positions == CONTEXT > 2 * config.block_size
    prompt = torch.randint(0, PLANNED_VOCABULARY, (config.block_size + 16,)).tolist()
    decoder = Decoder(model, CONTEXT)
    ours = list(decoder.stream(prompt, 200, Sampling(temperature=0)))
    assert ours == greedy(folder, prompt, 200)
    assert decoder.cache.length == len(prompt) + 199, "one forward per new token"


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_cached_logits_equal_a_whole_forward_whatever_the_chunks(config, family):
    """The cache's positions, masks and grouped-query heads: prompts read in chunks of any
    size, then one token at a time, give the logits of one pass over the whole sequence."""
    torch.manual_seed(0)
    if family == "llama":
        shape = LlamaShape.from_scratch(PLANNED_VOCABULARY, 64, 2, 4, 40)
        model = Llama(dataclasses.replace(shape, kv_heads=2)).eval()
    else:
        model = ByteGPT(64, 2, 2, 40).eval()
    tokens = torch.randint(0, PLANNED_VOCABULARY, (1, 40))
    cache = KVCache(2, 40)
    with torch.no_grad():
        whole = model(tokens)
        pieces = [model(tokens[:, a:b], cache=cache) for a, b in ((0, 9), (9, 10), (10, 25))]
        pieces += [model(tokens[:, t : t + 1], cache=cache) for t in range(25, 40)]
        torch.testing.assert_close(torch.cat(pieces, dim=1), whole, rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match="41 tokens; the model reads 40"):
            model(tokens[:, :1], cache=cache)


def test_decoding_refuses_a_prompt_the_context_cannot_hold_and_stops_at_its_end(
    chat_folders, capsys
):
    model, _ = folder_model(chat_folders["llama"], torch.device("cpu"))
    decoder = Decoder(model, 20)
    with pytest.raises(ValueError, match="the prompt is 20 tokens and the model reads at most 20"):
        list(decoder.stream(list(range(20)), 5, Sampling(temperature=0)))
    assert len(list(decoder.stream(list(range(15)), 50, Sampling(temperature=0)))) == 5
    args = ["--model", str(chat_folders["llama"]), "--temperature", "0", "--device", "cpu"]
    with pytest.raises(SystemExit, match="the prompt is .* tokens and the model reads at most"):
        generate_main(["hello " * CONTEXT, *args])
    with pytest.raises(SystemExit, match="--device 'foo' is no device; use auto, cpu"):
        generate_main(["hello", "--model", str(chat_folders["llama"]), "--device", "foo"])
    text = generate_main(["hello how are you", *args, "--max-new-tokens", "8"])
    assert text.startswith("hello how are you")


def test_chat_replies_through_the_template_and_stops_at_its_end_of_turn(chat_folders, tmp_path):
    """One message, the reply as transformers' `generate` gives it from the same template and
    folder, ended by `<|im_end|>` (its generation_config lists it, as an export's does)."""
    folder = tmp_path / "chat"
    folder.mkdir()
    for path in chat_folders["llama"].iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    codec = Codec(folder / "tokenizer.json", END_OF_TEXT)
    turn_end = codec.tokenizer.token_to_id(TURN_END)
    assert end_of_turn_ids(ChatTemplate(CHATML), codec) == [turn_end]
    messages = [{"role": "user", "content": "hello how are you"}]
    prompt = codec.encode_batch([ChatTemplate(CHATML).render(messages, True)])[0]
    # The first token of the greedy reply not drawn before it (past the first) becomes the end
    # of turn: its logit row and the end of turn's swap places, and nothing before it changes.
    before = greedy(folder, prompt, 8)
    ends = next(
        n for n in range(1, 8) if before[n] not in before[:n] and turn_end not in before[: n + 1]
    )
    weights = load_file(folder / "model.safetensors")
    rows = weights["lm_head.weight"]
    rows[[before[ends], turn_end]] = rows[[turn_end, before[ends]]]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    generation = json.loads((folder / "generation_config.json").read_text())
    generation["eos_token_id"] = [codec.eot_id, turn_end]
    (folder / "generation_config.json").write_text(json.dumps(generation))

    reply = chat_main(
        ["--model", str(folder), "--message", messages[0]["content"], "--temperature", "0"]
    )
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    assert ids["input_ids"] == prompt
    theirs = (
        AutoModelForCausalLM.from_pretrained(folder)
        .generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=20)[0, len(prompt) :]
        .tolist()
    )
    assert theirs == [*before[:ends], turn_end], "transformers stops at the end of turn"
    assert reply == tokenizer.decode(theirs[:-1]) and reply


def test_a_conversation_reuses_its_cache_and_replies_as_a_fresh_one_would(chat_folders):
    """Turn two reads only what turn one's cache does not hold, and says what a conversation
    started from the same messages says; /reset forgets; a full context ends a turn, not the
    chat."""
    model, architecture = folder_model(chat_folders["llama"], torch.device("cpu"))
    codec = Codec(chat_folders["llama"] / "tokenizer.json", END_OF_TEXT)
    stops = (codec.eot_id, codec.tokenizer.token_to_id(TURN_END))
    used = LanguageModel(model, codec, CONTEXT, ChatTemplate(CHATML), stops, "tiny")
    greedy_sampling = Sampling(temperature=0)
    conversation = Conversation(used, greedy_sampling, torch.device("cpu"), "be brief")
    first = "".join(conversation.reply("hello", 12))
    held = len(conversation.decoder.cached)
    second = "".join(conversation.reply("how are you", 12))
    fresh = Conversation(used, greedy_sampling, torch.device("cpu"), "be brief")
    fresh.messages = conversation.messages[:3]
    assert "".join(fresh.reply("how are you", 12)) == second
    assert held > 0 and conversation.messages[2] == {"role": "assistant", "content": first}
    with pytest.raises(ValueError, match="the message is empty"):
        list(conversation.reply("  ", 12))

    lines = iter(["/reset", "hello", "", "hello " * 200, "/exit"])
    written: list[str] = []
    replies = talk(conversation, 12, read=lambda _: next(lines), write=written.append)
    shown = "".join(written)
    assert replies == 1 and "reads at most 512, its reply included; shorten" in shown
    assert conversation.messages[-1]["content"] == first, "after /reset, the first reply again"


def test_an_export_carries_the_chat_template_and_ends_replies_at_the_end_of_turn(
    config, chat_folders, tmp_path
):
    """A run on chat records prepared with `--chat-template FILE`: its folder keeps the
    template, and the export holds it where transformers reads it (apply_chat_template renders
    what prepare trained on) with the end of turn in generation_config.json's eos_token_id."""
    tokenizer = chat_folders["llama"] / "tokenizer.json"
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    records = tmp_path / "chat.jsonl"
    conversations = [
        [{"role": "user", "content": f"{n}+{n}"}, {"role": "assistant", "content": str(2 * n)}]
        for n in range(40)
    ]
    records.write_text("".join(json.dumps({"messages": m}) + "\n" for m in conversations))
    data_dir = tmp_path / "data"
    options = {"format": "chat", "tokenizer": str(tokenizer), "chat_template": str(template)}
    prepare([str(records)], data_dir, val_fraction=0.2, max_example_tokens=32, **options)
    assert (data_dir / "chat_template.jinja").read_text() == CHATML

    run_dir = tmp_path / "run"
    run = dataclasses.replace(
        config, data_dir=str(data_dir), tokenizer=str(tokenizer), model_family="llama"
    )
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(run.to_dict()))
    for name, source in run.task_run_files().items():
        (run_dir / name).write_bytes(source.read_bytes())
    save_file(build_model(run).state_dict(), run_dir / "model.safetensors")
    out = tmp_path / "export"
    export_main([str(out), "--run-dir", str(run_dir)])

    assert (out / "chat_template.jinja").read_text() == CHATML
    codec = Codec(tokenizer, END_OF_TEXT)
    turn_end = codec.tokenizer.token_to_id(TURN_END)
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [codec.eot_id, turn_end]
    loaded = AutoTokenizer.from_pretrained(out)
    ids, _ = encode_example({"messages": conversations[3]}, "chat", codec, ChatTemplate(CHATML))
    assert (
        loaded.apply_chat_template(conversations[3], return_dict=True)["input_ids"] == ids.tolist()
    )
    reply = chat_main(["--run-dir", str(run_dir), "--message", "1+1", "--temperature", "0"])
    again = chat_main(["--model", str(out), "--message", "1+1", "--temperature", "0"])
    assert reply == again, "the run and its export talk alike"
