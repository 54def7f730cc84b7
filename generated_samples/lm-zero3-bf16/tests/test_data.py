"""Rung 1 of the sanity ladder: one batch of token windows has the shapes and dtypes expected."""

from __future__ import annotations

import torch

from lm_zero3_bf16.data import NUM_CLASSES, build_datasets, stdlib_sources
from lm_zero3_bf16.loader import make_train_loader


def test_batch_shapes_and_dtypes(config):
    train_set, val_set = build_datasets(config)
    inputs, targets = next(iter(make_train_loader(train_set, config)))
    assert inputs.shape == targets.shape == (config.micro_batch_size, config.block_size)
    assert inputs.dtype == targets.dtype == torch.int64
    assert inputs.min() >= 0 and inputs.max() < NUM_CLASSES
    assert torch.equal(inputs[:, 1:], targets[:, :-1]), "targets are the next tokens"
    tokens = (len(train_set) + len(val_set)) * config.block_size
    assert config.corpus_bytes - 2 * config.block_size - 2 <= tokens <= config.corpus_bytes


def test_corpus_is_read_in_a_fixed_order_and_split_at_the_end(config):
    sources = stdlib_sources()
    assert sources == sorted(sources, key=lambda p: p.as_posix()) and len(sources) > 100
    first, second = build_datasets(config), build_datasets(config)
    assert torch.equal(first[1].tokens, second[1].tokens)
    assert len(first[1].tokens) == config.corpus_bytes - len(first[0].tokens)


def test_text_path_is_read_as_bytes(config, tmp_path):
    import dataclasses

    text = tmp_path / "corpus.txt"
    text.write_text("hello, bytes! " * 200)
    train_set, _ = build_datasets(dataclasses.replace(config, text_path=str(text)))
    assert bytes(train_set.tokens[:14].tolist()) == b"hello, bytes! "
