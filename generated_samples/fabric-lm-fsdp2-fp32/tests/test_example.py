"""Tests of the example data and model: rung 1 of the sanity ladder (one batch has the shapes
and dtypes expected) and the example's own properties. Yours, like data.py and model.py: change
them together; `scaffold update` leaves this file alone."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest
import torch

from fabric_lm_fsdp2_fp32.config import parse_param_count
from fabric_lm_fsdp2_fp32.data import build_datasets, input_spec, stdlib_sources
from fabric_lm_fsdp2_fp32.loader import make_train_loader
from fabric_lm_fsdp2_fp32.model import ByteGPT, build_model, shape_for
from fabric_lm_fsdp2_fp32.runtime import init_runtime
from fabric_lm_fsdp2_fp32.task import describe_throughput, throughput


def test_batch_shapes_and_dtypes(config):
    train_set, val_set = build_datasets(config)
    inputs, targets = next(iter(make_train_loader(train_set, config, init_runtime("cpu"))))
    assert inputs.shape == targets.shape == (config.micro_batch_size, config.block_size)
    assert inputs.dtype == targets.dtype == torch.int64
    assert inputs.min() >= 0 and inputs.max() < input_spec(config)[0]
    assert torch.equal(inputs[:, 1:], targets[:, :-1]), "targets are the next tokens"
    manifest = json.loads((Path(config.data_dir) / "manifest.json").read_text())
    assert manifest["source_bytes"] == config.corpus_bytes
    held_out = manifest["documents"]["val"] / sum(manifest["documents"].values())
    assert abs(held_out - config.val_fraction) < 0.1, manifest["documents"]


def test_the_example_corpus_is_the_stdlib_in_a_fixed_order(config):
    sources = stdlib_sources()
    assert sources == sorted(sources, key=lambda p: p.as_posix()) and len(sources) > 100
    first, second = build_datasets(config), build_datasets(config)
    assert torch.equal(first[0][[0, 5]][0], second[0][[0, 5]][0])
    text = bytes(first[0][[0]][0][0].tolist()).decode("utf-8", errors="replace")
    assert text in "".join(source.read_text() for source in sources[:3]), "first files first"


def test_the_summary_knows_the_data_and_many_passes_over_a_small_corpus_are_warned_of(config):
    train, _ = build_datasets(config)
    manifest = json.loads((Path(config.data_dir) / "manifest.json").read_text())
    corpus = sum(shard["tokens"] for shard in manifest["shards"]["train"])
    loader = make_train_loader(train, config, init_runtime("cpu"))
    windows = len(loader) * config.micro_batch_size  # the windows an epoch of it reads
    summary = {"samples": 64, "train_seconds": 1.0, "config": config.to_dict(), "device": "cpu"}
    summary |= {"epochs": 2.5, "samples_per_epoch": windows, "trained_parameters": 1000}
    facts = throughput(summary | {"parameters": 5000, "steps": 10, "global_batch_size": 32})
    assert facts["tokens_per_step"] == 32 * config.block_size
    assert facts["tokens_trained"] == round(2.5 * windows * config.block_size)
    assert facts["epochs_over_corpus"] == pytest.approx(facts["tokens_trained"] / corpus)
    # an epoch reads every token but the shards' tails and a last partial micro-batch
    assert 0.9 < facts["epoch_share_of_corpus"] <= 1
    assert facts["epochs_over_corpus"] == pytest.approx(2.5 * facts["epoch_share_of_corpus"])
    assert facts["tokens_per_parameter"] == pytest.approx(facts["tokens_trained"] / 1000)
    earlier = {"samples": 64, "train_seconds": 1.0, "config": config.to_dict(), "device": "cpu"}
    earlier |= {"parameters": 1000, "steps": 10, "global_batch_size": 32}  # no loader count
    facts = throughput(earlier)  # as a test of an earlier release asks: full steps counted
    assert facts["tokens_trained"] == 10 * 32 * config.block_size
    assert facts["epochs_over_corpus"] == pytest.approx(facts["tokens_trained"] / corpus)
    assert facts["epoch_share_of_corpus"] is None and "passes over the corpus" in (
        describe_throughput(earlier | facts | {"mfu": None})
    )
    with pytest.warns(UserWarning, match="beyond ~4 epochs"):
        build_datasets(dataclasses.replace(config, epochs=50))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_datasets(dataclasses.replace(config, epochs=4))
        build_datasets(dataclasses.replace(config, epochs=50, max_tokens=2 * corpus))


def test_max_tokens_is_the_runs_length_in_whole_optimizer_steps(config):
    """The run's length is the machinery's (test_train.py runs a `max_steps` budget): here,
    the steps that train `max_tokens` at each world size's global batch."""
    config = dataclasses.replace(config, max_tokens=10_000, epochs=50)
    tokens_per_step = config.global_batch_size(1) * config.block_size
    assert config.step_budget(1) == 10_000 // tokens_per_step, "at most max_tokens"
    assert config.step_budget(2) == 10_000 // (2 * tokens_per_step), "per global batch"
    assert dataclasses.replace(config, max_tokens=1).step_budget(1) == 1, "one step at least"
    assert dataclasses.replace(config, max_steps=2).step_budget(1) == 2, "the least of both"
    assert config.run_steps(1000, 1) == config.step_budget(1), "sooner than 50 epochs"
    assert dataclasses.replace(config, max_tokens=0).step_budget(1) == 0


def test_a_changed_corpus_bytes_is_said_to_change_nothing_once_prepared(config):
    build_datasets(config)
    with pytest.warns(UserWarning, match="only sizes the example's first prepare"):
        build_datasets(dataclasses.replace(config, corpus_bytes=config.corpus_bytes + 1))


def parameter_count(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def test_model_is_the_smallest_width_that_reaches_model_size(config):
    config = dataclasses.replace(config, model_family="gpt2")
    target = parse_param_count(config.model_size)
    vocabulary = input_spec(config)[0]  # the test corpus's, whatever the plan
    depth, width, heads = shape_for(target, config.block_size, vocabulary)
    head_dim, block_size = width // heads, config.block_size
    with torch.device("meta"):
        model = build_model(config)
        built = ByteGPT(width, depth, heads, block_size, vocab_size=vocabulary)
        assert parameter_count(model) == parameter_count(built)
        assert model.blocks[0].attn.heads == heads
        assert parameter_count(model) >= target
        narrower = (width - head_dim, depth, heads - 1, block_size)
        smaller = ByteGPT(*narrower, vocab_size=vocabulary) if heads > 1 else None
        assert smaller is None or parameter_count(smaller) < target


@pytest.mark.parametrize(
    ("size", "depth", "width", "heads"), [("125M", 12, 768, 12), ("7B", 32, 4096, 32)]
)
def test_a_published_size_builds_that_models_shape(config, size, depth, width, heads):
    """125M is GPT-3 Small's 12 blocks of 768 channels in 12 heads (Brown et al. 2020, Table
    2.1), 7B LLaMA-7B's 32 of 4096 in 32; not widths solved for the nominal counts, which
    include a 32K-50K-token embedding this byte-level model does not have."""
    with torch.device("meta"):
        model = build_model(dataclasses.replace(config, model_size=size, model_family="gpt2"))
        llama = build_model(dataclasses.replace(config, model_size=size, model_family="llama"))
    attention = model.blocks[0].attn
    assert (len(model.blocks), attention.qkv.in_features, attention.heads) == (depth, width, heads)
    layers, attention = llama.model.layers, llama.model.layers[0].self_attn
    assert (len(layers), attention.q_proj.in_features, attention.heads) == (depth, width, heads)
    # LLaMA's MLP: 2/3 of 4 x width, rounded up to a multiple of 256 (7B: 11008)
    assert layers[0].mlp.up_proj.out_features == {"125M": 2048, "7B": 11008}[size]
