"""Rungs 2 and 3 of the sanity ladder, through the model contract: the initial loss matches
theory, and one batch can be memorised; no position sees a later token. Also the model-size rule of
configs/train.toml."""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch

from lm_ddp_bf16.config import load_config, parse_param_count
from lm_ddp_bf16.data import build_datasets
from lm_ddp_bf16.engine import Engine
from lm_ddp_bf16.inference.decode import generate
from lm_ddp_bf16.model import build_model
from lm_ddp_bf16.report.summary import expected_initial_loss
from lm_ddp_bf16.runtime import init_runtime
from lm_ddp_bf16.task import SUMS, eval_sums, loss_fn
from lm_ddp_bf16.train import train_step
from lm_ddp_bf16.training import build_optimizer, build_scheduler, seed_all


def one_batch(config, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    _, val_set = build_datasets(config)
    return val_set[list(range(min(size, len(val_set))))]


def test_initial_loss_is_ln_num_classes(config):
    inputs, targets = one_batch(config, 256)  # first, as a run: the data decide the classes
    seed_all(config.seed)
    model = build_model(config).eval()
    with torch.no_grad():
        loss = loss_fn(model(inputs), targets).item()
    assert abs(loss - expected_initial_loss(config)) < 0.15, loss


def test_no_position_sees_a_later_token(config):
    """Causality, through `forward(tokens)` alone: the logits at position t depend on tokens
    0..t only. A model that peeks at t + 1 learns to copy it, reaches a low loss and generates
    nonsense, and no other rung notices. The tokens after t change; the logits up to t must not
    (to a tolerance far below what one token moves, for models that mask with a large finite
    number), and those after t must (else the check proved nothing)."""
    seed_all(config.seed)
    model = build_model(config).eval()  # no dropout: two passes differ only by their tokens
    tokens, _ = one_batch(config, 4)
    length = tokens.shape[1]
    with torch.no_grad():
        before = model(tokens)
        tolerance = 1e-5 * before.abs().max().item()  # fp32 noise at the logits' own scale
        for t in (0, length // 2, length - 2):  # length - 2: only the last token changes
            changed = tokens.clone()
            shift = torch.randint_like(tokens[:, t + 1 :], 1, before.shape[-1])
            changed[:, t + 1 :] = (tokens[:, t + 1 :] + shift) % before.shape[-1]
            after = model(changed)
            seen = (after[:, : t + 1] - before[:, : t + 1]).abs().max().item()
            assert seen <= tolerance, f"positions <= {t} see a later token (moved {seen:.3g})"
            moved = (after[:, t + 1 :] - before[:, t + 1 :]).abs().max().item()
            assert moved > 100 * tolerance, f"tokens after {t} changed no logit ({moved:.3g})"


def test_eval_sums_stay_on_the_logits_device(config):
    """A sum built on the CPU beside CUDA logits fails the first validation on a GPU; the meta
    device shows the same mismatch on a CPU-only machine."""
    inputs, targets = one_batch(config, 4)
    with torch.no_grad():
        logits = build_model(config)(inputs)
    sums = eval_sums(logits.to("meta"), targets.to("meta"))
    assert sums.device.type == "meta" and sums.ndim == 1 and len(sums) >= len(SUMS)


def test_overfits_one_batch(config):
    # Memorising, not generalising: no regularisation, and twice the peak LR for the small
    # test-size model to get there within the steps.
    settings = {"dropout": 0.0, "warmup_steps": 10, "weight_decay": 0.0, "lr": 2 * config.lr}
    config = dataclasses.replace(config, **settings)
    seed_all(config.seed)
    make_optimizer = functools.partial(build_optimizer, config=config)
    engine = Engine(build_model(config), make_optimizer, init_runtime("cpu"), config)
    steps = 250
    scheduler = build_scheduler(engine.optimizer, config, total_steps=steps)
    batch = one_batch(config, 8)  # a model that cannot memorise 8 examples has a bug
    losses = [math.inf]
    while losses[-1] >= 0.05 and len(losses) <= steps:  # memorised: no need to go on
        loss, _, _ = train_step(engine, scheduler, [batch], 1, config.max_grad_norm)
        losses.append(loss.item())
    assert losses[-1] < 0.05, f"loss {losses[-1]:.3f} after {len(losses) - 1} steps"
    # Seen as text: a prefix of a memorised sequence is continued as it was learned. A prefix
    # that determines the rest: none that another sequence of the batch starts with (it has
    # their continuations too), and past a run of one token at the start, which a model with
    # relative positions only (rotary) cannot count.
    tokens = batch[0][:1]
    shared = max(int((other == tokens[0]).cumprod(0).sum()) for other in batch[0][1:])
    run = int((tokens[0] == tokens[0, 0]).cumprod(0).sum())
    prefix = max(8, shared + 1, run + 1)
    new = config.block_size - prefix
    out = generate(engine.model, tokens[:, :prefix], new, config.block_size, temperature=0)
    assert out.tolist() == tokens.tolist()


@pytest.mark.parametrize(
    ("text", "count"),
    [("100K", 100_000), ("1.5m", 1_500_000), ("7B", 7 * 10**9), ("4096", 4096), ("1e6", 10**6)],
)
def test_model_size_is_a_whole_parameter_count(text, count):
    assert parse_param_count(text) == count


def test_text_settings_take_the_command_lines_text_as_written():
    config = load_config(None, ["model_size=1e6", "run_dir=runs/try2", "lr=1e-3"])
    assert (config.model_size, config.run_dir, config.lr) == ("1e6", "runs/try2", 1e-3)


@pytest.mark.parametrize("text", ["0.5", "0.0001K", "-1", "", "1.5", "ten", "1e999"])
def test_a_model_size_that_is_not_a_whole_count_is_refused(text):
    with pytest.raises(ValueError, match="not a whole number of parameters"):
        parse_param_count(text)
