"""Chat and instruction data: the chat template renders as transformers renders it, only the
replies are trained, packed examples never see each other, and bad records are refused in one
line. The tests make their tokenizer, template and records."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from lm_zero3_bf16.corpus import IGNORE_INDEX, Codec, ExampleRows, prepare, read_manifest
from lm_zero3_bf16.corpus.chat import ChatTemplate, encode_example
from lm_zero3_bf16.corpus.examples import packed_rows
from lm_zero3_bf16.data import PLANNED_VOCABULARY, build_datasets
from lm_zero3_bf16.engine import build_on_meta, materialize
from lm_zero3_bf16.loader import make_train_loader
from lm_zero3_bf16.runtime import init_runtime
from lm_zero3_bf16.task import describe_throughput, loss_fn, throughput

from conftest import jinja

# ChatML, as Qwen2's and many others' tokenizer_config.json hold it.
CHATML = jinja(
    "<% for message in messages %><< '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' >><% endfor %>"
    "<% if add_generation_prompt %><< '<|im_start|>assistant\\n' >><% endif %>"
)
# A template that starts with the BOS token and ends each turn with the EOS token.
LLAMA_LIKE = jinja(
    "<< bos_token >><% for message in messages %>"
    "<% if message['role'] == 'system' %><< message['content'] + '\\n\\n' >>"
    "<% elif message['role'] == 'user' %><< '[INST] ' + message['content'] + ' [/INST]' >>"
    "<% else %><< ' ' + message['content'] + eos_token >><% endif %><% endfor %>"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>"]
CONVERSATIONS = [
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}],
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "name a prime"},
        {"role": "assistant", "content": "seven"},
        {"role": "user", "content": "another, über-kurz"},
        {"role": "assistant", "content": "eleven ✓"},
    ],
]


def chat_tokenizer(folder: Path, template: str) -> Path:
    """A small byte-level BPE with chat special tokens, and a tokenizer_config.json holding
    `template`, as a Hub model folder has them; returns the tokenizer.json. Its alphabet is the
    characters of the tests' texts, so its vocabulary fits the project's model."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(PLANNED_VOCABULARY, 160), special_tokens=SPECIALS, show_progress=False
    )
    texts = [json.dumps(CONVERSATIONS, ensure_ascii=False), "[INST] [/INST] 2+4= France:\n"]
    tokenizer.train_from_iterator(texts * 20, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"chat_template": template, "bos_token": "<s>", "eos_token": "</s>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder / "tokenizer.json"


@pytest.mark.parametrize("template", [CHATML, LLAMA_LIKE], ids=["chatml", "llama-like"])
def test_chat_template_renders_as_transformers_and_trains_the_replies_only(tmp_path, template):
    tokenizer_file = chat_tokenizer(tmp_path, template)
    reference = PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_file),
        chat_template=template,
        bos_token="<s>",
        eos_token="</s>",
    )
    codec = Codec(tokenizer_file, "<|endoftext|>")
    ours = ChatTemplate.load(tmp_path / "tokenizer_config.json")
    for messages in CONVERSATIONS:
        ids, mask = encode_example({"messages": messages}, "chat", codec, ours)
        expected = reference.apply_chat_template(messages, tokenize=True, return_dict=True)
        assert ids.tolist() == expected["input_ids"]
        trained = codec.decode([i for i, m in zip(ids.tolist(), mask.tolist(), strict=True) if m])
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        end = "<|im_end|>\n" if template == CHATML else "</s>"
        assert trained == "".join(f"{' ' * (template != CHATML)}{r}{end}" for r in replies)


def write_records(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def chat_records(count: int) -> list[dict]:
    """`count` conversations of one to three exchanges of different lengths."""
    records = []
    for number in range(count):
        messages = [{"role": "system", "content": "be brief"}] if number % 3 == 0 else []
        for turn in range(1 + number % 3):
            messages.append({"role": "user", "content": "name a prime " * (1 + turn)})
            messages.append({"role": "assistant", "content": "seven " * (1 + number % 4)})
        records.append({"messages": messages})
    return records


@pytest.fixture(scope="module")
def prepared_chat(tmp_path_factory) -> tuple[Path, Path]:
    """Chat records prepared with ChatML (examples of at most 64 tokens, longer ones dropped):
    the corpus folder, and the tokenizer.json."""
    folder = tmp_path_factory.mktemp("chat")
    tokenizer_file = chat_tokenizer(folder / "model", CHATML)
    source = write_records(folder / "chat.jsonl", chat_records(60))
    options = {"format": "chat", "tokenizer": str(tokenizer_file), "eot": "<|endoftext|>"}
    prepare([str(source)], folder / "data", max_example_tokens=64, val_fraction=0.2, **options)
    return folder / "data", tokenizer_file


def test_prepare_writes_masked_examples_and_counts_what_it_left_out(prepared_chat):
    data_dir, tokenizer_file = prepared_chat
    manifest = read_manifest(data_dir, "prepare it")
    assert manifest.kind == "chat" and manifest.longest_example <= 64
    assert manifest.skipped["dropped_too_long"] > 0, "the longest conversations exceed 64"
    kept = sum(manifest.documents.values()) + manifest.skipped["dropped_too_long"]
    assert kept == 60 and min(manifest.documents.values()) > 0
    codec = Codec(tokenizer_file, "<|endoftext|>")
    rows = ExampleRows(data_dir, manifest.shards["train"], manifest.dtype, 64, False, 0)
    inputs, targets = rows[list(range(len(rows)))]
    for row_inputs, row_targets in zip(inputs, targets, strict=True):
        text = codec.decode(row_inputs.tolist())
        trained = codec.decode(row_targets[row_targets != IGNORE_INDEX].tolist())
        assert text.startswith("<|im") and trained.startswith("seven")
        assert trained.count("<|im_end|>") == text.count("assistant\n")
        assert "name a prime" not in trained and "be brief" not in trained


def test_packing_places_every_example_once_in_rows_it_fits():
    lengths = np.random.default_rng(0).integers(1, 65, size=500)
    row_first, members = packed_rows(lengths, 64)
    assert sorted(members.tolist()) == list(range(500)), "each example in one row, once"
    bounds = zip(row_first[:-1], row_first[1:], strict=True)
    used = [int(lengths[members[a:b]].sum()) for a, b in bounds]
    assert max(used) <= 64
    assert len(used) < 1.1 * lengths.sum() / 64 + 1, "rows nearly full"
    one_by_one, _ = packed_rows(lengths, 64, window=1)  # consecutive examples only
    assert len(used) < len(one_by_one) - 1


def packed_pair(config, first: list[int], second: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One row holding two examples, then padding: tokens and documents `[1, T]`."""
    length = config.block_size
    tokens = torch.zeros(1, length, dtype=torch.int64)
    documents = torch.full((1, length), 2, dtype=torch.int64)
    tokens[0, : len(first)] = torch.tensor(first)
    tokens[0, len(first) : len(first) + len(second)] = torch.tensor(second)
    documents[0, : len(first)] = 0
    documents[0, len(first) : len(first) + len(second)] = 1
    return tokens, documents


def test_packed_examples_do_not_attend_to_each_other_and_restart_their_positions(config):
    model = materialize(build_on_meta(config), torch.device("cpu"), config.seed).eval()
    generator = torch.Generator().manual_seed(0)
    first, second, other = (
        torch.randint(0, PLANNED_VOCABULARY, (n,), generator=generator).tolist()
        for n in (11, 9, 11)
    )
    b = slice(11, 20)  # the second example's positions
    with torch.no_grad():
        tokens, documents = packed_pair(config, first, second)
        logits = model(tokens, documents)
        changed = model(packed_pair(config, other, second)[0], documents)
        torch.testing.assert_close(changed[0, b], logits[0, b], rtol=0, atol=0)
        alone = model(torch.tensor([second]))  # the same example in a row of its own
        torch.testing.assert_close(logits[0, b], alone[0], rtol=1e-5, atol=1e-5)
        # One document: the second example reads the first, so the test can fail.
        joined = torch.zeros_like(documents)
        moved = model(packed_pair(config, other, second)[0], joined)[0, b]
        assert (moved - model(tokens, joined)[0, b]).abs().max() > 1e-4


def test_the_loss_is_the_replies_alone_and_user_turns_give_no_gradient(config, prepared_chat):
    data_dir, _ = prepared_chat
    manifest = read_manifest(data_dir, "prepare it")
    rows = ExampleRows(data_dir, manifest.shards["train"], manifest.dtype, 64, True, 0)
    vocab = manifest.vocab_size
    config = dataclasses.replace(config, block_size=64)
    model = materialize(build_on_meta(config), torch.device("cpu"), config.seed)
    (tokens, documents), targets = rows[[0, 1, 2]]
    assert vocab <= PLANNED_VOCABULARY and documents.max() > 1, "rows hold several examples"

    def gradients(loss_of) -> list[torch.Tensor]:
        model.zero_grad()
        loss_of(model(tokens, documents)).backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    # The reference: every next token that the mask file marks trained, read from the shard.
    shard = manifest.shards["train"][0]
    flat = np.fromfile(data_dir / shard.file, dtype=manifest.dtype).astype(np.int64)
    mask = np.fromfile(data_dir / shard.mask_file, dtype=np.uint8)
    starts = np.fromfile(data_dir / shard.starts_file, dtype=np.int64)
    expected = torch.full_like(targets, IGNORE_INDEX)
    for row in range(3):
        at = 0
        for example in rows.row(row).tolist():
            start, end = starts[example], starts[example + 1]
            for t in range(start, end - 1):
                if mask[t + 1]:
                    expected[row, at + t - start] = int(flat[t + 1])
            at += end - start
    assert torch.equal(targets, expected)

    ours = gradients(lambda logits: loss_fn(logits, targets))
    user = (targets == IGNORE_INDEX) & (documents < documents.max(dim=1, keepdim=True).values)
    changed = targets.clone()
    changed[user] = IGNORE_INDEX  # already: a user turn's target ids are never read
    for a, b in zip(ours, gradients(lambda logits: loss_fn(logits, changed)), strict=True):
        assert torch.equal(a, b)
    counted = targets.clone()
    counted[user] = tokens.roll(-1, dims=1)[user]  # the user turns' own next tokens, counted
    moved = gradients(lambda logits: loss_fn(logits, counted))
    assert any(not torch.equal(a, b) for a, b in zip(ours, moved, strict=True))


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "one-a-row"])
def test_the_summarys_passes_over_the_corpus_are_its_epochs_of_example_tokens(
    config, prepared_chat, pack
):
    """Two whole epochs of the loader, some of whose rows are padding and whose last step of
    each epoch is short: the corpus tokens trained are those of the rows read (no padding),
    and the passes over the corpus are the Steps line's 2 epochs times the share one reads."""
    data_dir, _ = prepared_chat
    config = dataclasses.replace(
        config, data_dir=str(data_dir), prepare_example=False, block_size=64, pack=pack
    )
    config = dataclasses.replace(config, micro_batch_size=2, grad_accum_steps=3)
    train, _ = build_datasets(config)
    loader = make_train_loader(train, config, init_runtime("cpu"))
    read = sum(int(train.length[train.row(row)].sum()) for batch in loader.sampler for row in batch)
    steps = 2 * -(-len(loader) // config.grad_accum_steps)  # each epoch's last step is short
    summary = {"samples": 1, "train_seconds": 1.0, "config": config.to_dict(), "device": "cpu"}
    summary |= {"parameters": 50_000, "trained_parameters": 1_000, "steps": steps, "epochs": 2.0}
    summary |= {"samples_per_epoch": len(loader) * 2, "global_batch_size": 6}
    summary |= throughput(summary)
    corpus = read_manifest(data_dir, "prepare it").tokens("train")
    assert summary["padding_unpacked"] > 0.2, "padding the old count took for corpus tokens"
    assert summary["tokens_trained"] == pytest.approx(2 * read, rel=0.05)
    assert summary["epoch_share_of_corpus"] == pytest.approx(read / corpus, rel=0.05)
    assert 1.8 < summary["epochs_over_corpus"] <= 2.0
    assert summary["tokens_per_parameter"] == summary["tokens_trained"] / 1_000  # the trained
    share = summary["epoch_share_of_corpus"]
    line = describe_throughput(summary)
    assert f"(... per trained parameter; 2 epochs x {share:.1%} of the corpus's {corpus:,} " in (
        line.replace(f"{summary['tokens_per_parameter']:.3g}", "...")
    )
    assert f"= {summary['epochs_over_corpus']:.3g} passes over it)" in line


def test_completion_records_from_parquet_train_the_completion_and_end_of_text(tmp_path):
    table = pa.table({"prompt": ["2+2=", "capital of France: "], "completion": ["4", "Paris"]})
    pq.write_table(table, tmp_path / "pairs.parquet")
    manifest = prepare(
        [str(tmp_path / "pairs.parquet")],
        tmp_path / "data",
        format="completion",
        val_fraction=0.5,
        max_example_tokens=64,
    )
    codec = Codec(None)
    trained = []
    for split in ("train", "val"):
        rows = ExampleRows(tmp_path / "data", manifest.shards[split], manifest.dtype, 64, False, 0)
        _, targets = rows[list(range(len(rows)))]
        trained += [codec.decode(row[row != IGNORE_INDEX].tolist()) for row in targets]
    assert sorted(trained) == ["4\n\n", "Paris\n\n"]  # the end-of-text token decodes as "\n\n"


def test_prepare_reports_the_example_lengths_and_the_block_size_that_keeps_95_percent(tmp_path):
    # byte tokens: a prompt of k bytes and a one-byte completion are k + 2 tokens with the
    # end-of-text; lengths 10..29 in a shuffled order
    records = [{"prompt": "p" * k, "completion": "c"} for k in range(8, 28)]
    records = records[::3] + records[1::3] + records[2::3]
    source = write_records(tmp_path / "pairs.jsonl", records)
    settings = {"format": "completion", "val_fraction": 0.5}
    said: list[str] = []
    manifest = prepare(
        [str(source)], tmp_path / "a", max_example_tokens=25, log=said.append, **settings
    )
    # 20 lengths: the 10th, 19th and 20th shortest (nearest rank)
    assert manifest.skipped["example_tokens"] == {"p50": 19, "p95": 28, "p100": 29}
    assert manifest.skipped["dropped_too_long"] == 4  # 26..29 tokens: 20% of them
    (line,) = [line for line in said if line.startswith("encoded 16 examples")]
    assert "; examples of 19/28/29 tokens at the 50th/95th/100th percentile; " in line
    keep = "; to keep 95% of the examples whole (20% are longer than 25), set block_size >= 28 "
    assert keep in line
    said.clear()
    manifest = prepare(
        [str(source)], tmp_path / "b", max_example_tokens=28, log=said.append, **settings
    )
    assert manifest.skipped["dropped_too_long"] == 1  # 5%: no more than the 95% kept
    (line,) = [line for line in said if line.startswith("encoded 19 examples")]
    assert "examples of 19/28/29 tokens" in line and "block_size >=" not in line


def test_chat_or_completion_records_prepared_as_text_are_refused_naming_their_format(tmp_path):
    pq.write_table(pa.table({"messages": [CONVERSATIONS[0]]}), tmp_path / "chat.parquet")
    sources = {
        write_records(tmp_path / "chat.jsonl", chat_records(3)): "chat",
        write_records(tmp_path / "pairs.jsonl", [{"prompt": "2+2=", "completion": "4"}]): (
            "completion"
        ),
        tmp_path / "chat.parquet": "chat",
    }
    for source, format in sources.items():
        with pytest.raises(ValueError) as refused:
            prepare([str(source)], tmp_path / "data", val_fraction=0.5)  # --format text
        message = str(refused.value)
        assert message.startswith(f"{source}") and "\n" not in message
        assert f"these are {format} records" in message, message
        assert message.endswith(f"pass --format {format}"), message
        assert not (tmp_path / "data").exists()
    mixed = write_records(tmp_path / "mixed.jsonl", [{"text": "fine"}, *chat_records(1)])
    with pytest.raises(ValueError) as refused:  # a chat record among text ones: a bad record
        prepare([str(mixed)], tmp_path / "data", val_fraction=0.5)
    assert str(refused.value).startswith(
        f"{mixed}:2: no 'text' field (it has: messages); these are chat records: pass --format chat"
    )


def test_a_conversation_ending_in_a_user_turn_is_left_out_and_named_when_skipping(tmp_path):
    tokenizer_file = chat_tokenizer(tmp_path / "model", CHATML)
    unanswered = {"messages": [*CONVERSATIONS[1], {"role": "user", "content": "and?"}]}
    source = write_records(tmp_path / "chat.jsonl", [*chat_records(10), unanswered])
    manifest = prepare(
        [str(source)],
        tmp_path / "data",
        format="chat",
        tokenizer=str(tokenizer_file),
        eot="<|endoftext|>",
        val_fraction=0.2,
        skip_bad_records=True,
    )
    assert manifest.skipped["records"] == 1 and sum(manifest.documents.values()) == 10
    assert manifest.skipped["first_records"] == [
        f"{source}:11: its last message is a user turn with no reply after it to train; end the "
        "conversation with the assistant's reply, or drop that turn"
    ]


@pytest.mark.parametrize(
    ("record", "options", "message"),
    [
        ({"text": "no messages"}, {}, "no 'messages' list (it has: text)"),
        (
            {"messages": [{"role": "wizard", "content": "x"}]},
            {},
            "message 0 has role 'wizard', not one of system, user, assistant, tool",
        ),
        ({"messages": [{"role": "user", "content": "x"}]}, {}, "no assistant message"),
        (
            {"messages": [*CONVERSATIONS[0], {"role": "user", "content": "and?"}]},
            {},
            "chat.jsonl:1: its last message is a user turn with no reply after it to train; ",
        ),
        (CONVERSATIONS[0], {"chat_template": None, "bare": True}, "give one with --chat-template"),
        (CONVERSATIONS[0], {"tokenizer": "bpe"}, "encodes with the model's own tokenizer"),
    ],
    ids=["no-messages", "unknown-role", "no-reply", "ends-with-user", "no-template", "bpe"],
)
def test_bad_chat_input_is_refused_in_one_line_and_writes_nothing(
    tmp_path, record, options, message
):
    folder = tmp_path / "model"
    tokenizer_file = chat_tokenizer(folder, CHATML)
    if options.pop("bare", False):
        (folder / "tokenizer_config.json").unlink()
    source = write_records(tmp_path / "chat.jsonl", [record])
    settings = {"format": "chat", "tokenizer": str(tokenizer_file), "eot": "<|endoftext|>"}
    settings |= {"val_fraction": 0.5} | options
    with pytest.raises(ValueError) as raised:
        prepare([str(source)], tmp_path / "data", **settings)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert not (tmp_path / "data").exists()
