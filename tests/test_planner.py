"""The memory model and the planner: reference cases computed by hand from the formulas, the
choices of strategy, micro-batch, accumulation and checkpointing, recipes, and what is refused
or only warned about."""

from __future__ import annotations

import math

import pytest

from scaffold.answer_rules import check
from scaffold.answers import build_answers, merge_sources
from scaffold.errors import AnswerError, NotAvailableYet
from scaffold.fitting import fit, usable_bytes
from scaffold.memory import GIB, LAYOUTS, estimate
from scaffold.planner import Decision, Setting, plan
from scaffold.recipes import MAX_ACCUMULATION, recipe_for
from scaffold.shapes import decoder_for, largest_decoder

H100S = {"hardware": "cuda", "gpu_arch": "hopper", "gpus_per_node": 8, "gpu_memory_gb": 80}
H100S |= {"host_memory_gb": 1024, "task": "language-model"}


def answers(**values):
    return build_answers(merge_sources(values, {"project_name": "demo"}))


def model_state(result) -> int:
    return result.weights + result.gradients + result.optimizer


def test_7b_bf16_adamw_on_8_x_80_gb_does_not_fit_ddp_and_fits_fsdp2():
    """By hand: 7B renders LLaMA-7B's shape (Touvron et al. 2023, Table 2: 32 blocks of width
    4096, 32 heads of 128), GPT-3 6.7B's too, and on GPUs GPT-3's recipe with GPT-2's BPE
    vocabulary padded to 50,304; at context 2048 it has
    32 x (12 x 4096^2 + 13 x 4096) + (2 x 50,304 + 2048 + 2) x 4096 = 6,864,642,048 parameters
    (the published 6.7B counts a 32,000-token embedding and a SwiGLU MLP); with AdamW each
    keeps 4 + 4 + 8 = 16 bytes: 102.3 GiB per GPU under DDP, more than the 68 GiB usable of an
    80 GB GPU (85%); FSDP2 divides it by 8 (12.8 GiB)."""
    shape = decoder_for(7 * 10**9, 2048, 50_304)
    assert (shape.depth, shape.width, shape.heads) == (32, 4096, 32)
    assert shape.params == 32 * (12 * 4096**2 + 13 * 4096) + (2 * 50_304 + 2048 + 2) * 4096
    run = {"precision": "bf16", "world_size": 8, "micro_batch": 1, "checkpointing": True}
    ddp = estimate(shape, strategy="ddp", **run)
    fsdp2 = estimate(shape, strategy="fsdp2", **run)
    assert model_state(ddp) == 16 * 6_864_642_048
    assert model_state(ddp) / GIB == pytest.approx(102.3, abs=0.05)
    assert model_state(fsdp2) == 16 * math.ceil(6_864_642_048 / 8)
    usable = 0.85 * 80 * GIB
    assert ddp.peak > usable > fsdp2.peak
    planned = plan(answers(**H100S, model_size="7B"))
    assert planned.shape == shape
    assert planned.answers.strategy == "fsdp2"
    assert planned.estimate.peak <= planned.usable == int(usable)
    reason = next(r for r in planned.reasons if r.startswith("strategy="))
    assert "102.3 GiB" in reason and "68.0 GiB usable" in reason
    assert any(
        r.startswith("shape 32 x 4096, 32 heads of 128: LLaMA-7B's") for r in planned.reasons
    )


def test_the_vocabulary_is_gpt2s_bpe_on_gpus_and_bytes_for_small_models_and_off_gpus():
    """The embedding and head count at the planned vocabulary: a 125M decoder on a GPU trains
    a BPE of 50,304 tokens, which its memory estimate and rendered settings carry; a 1M one,
    or any size on a CPU, the example's 257 byte tokens."""
    gpu = {"task": "language-model", "hardware": "cuda", "gpu_arch": "ampere"}
    gpu |= {"gpu_memory_gb": 24, "host_memory_gb": 64}
    large = plan(answers(**gpu, model_size="125M"))
    settings = large.settings
    assert (settings["tokenizer"].value, settings["vocab_size"].value) == ("bpe", 50_304)
    assert large.shape.vocab == 50_304 and large.shape.root_params == (2 * 50_304 + 2048 + 2) * 768
    assert large.copier_data()["plan"]["tokenizer"]["toml"] == '"bpe"'
    for values in ({**gpu, "model_size": "1M"}, {"task": "language-model", "model_size": "30M"}):
        small = plan(answers(**values))
        assert small.settings["tokenizer"].value == "bytes"
        assert small.shape.vocab == small.settings["vocab_size"].value == 257
    on_cpu = plan(answers(task="language-model", model_size="30M"))
    assert "not GPT-3 Small's BPE of 50,304" in on_cpu.settings["tokenizer"].source
    # the logits over 50,304 tokens dominate a micro-batch's activations at context 2048
    assert large.shape.activations(1, 4, 2, 0.0).outside > 2048 * 4 * 50_304


def test_125m_on_one_24_gb_gpu_trains_on_a_single_device_with_gpt3_smalls_recipe():
    planned = plan(answers(task="language-model", model_size="125M", hardware="cuda",
                           gpu_arch="ampere", gpu_memory_gb=24, host_memory_gb=64))  # fmt: skip
    settings = {key: setting.value for key, setting in planned.settings.items()}
    assert planned.answers.strategy == "single"
    assert settings["block_size"] == 2048 and settings["lr"] == 6e-4
    # GPT-3 Small's 0.5M tokens per step: 256 sequences of 2048.
    assert settings["micro_batch_size"] * settings["grad_accum_steps"] == 256
    assert settings["grad_accum_steps"] <= MAX_ACCUMULATION
    assert not settings["activation_checkpointing"]
    # Its shape too: 12 blocks of 768 in 12 heads of 64, 12 x (12 x 768^2 + 13 x 768) +
    # (2 x 50,304 + 2048 + 2) x 768 = 163,895,808 parameters with GPT-2's padded BPE.
    assert (planned.shape.depth, planned.shape.width, planned.shape.heads) == (12, 768, 12)
    shape_line = next(r for r in planned.reasons if r.startswith("shape "))
    assert "GPT-3 Small's (Brown et al. 2020, Table 2.1); 163,895,808 parameters" in shape_line
    assert "the published 125M counts a 50,257-token embedding" in shape_line


def test_the_micro_batch_is_the_largest_divisor_of_the_batch_that_fits():
    planned = plan(answers(**H100S, model_size="7B"))
    micro = planned.settings["micro_batch_size"].value
    accumulation = planned.settings["grad_accum_steps"].value
    assert micro * accumulation * 8 == 1024  # GPT-3 6.7B's 2M tokens
    run = {"strategy": "fsdp2", "precision": "bf16", "world_size": 8, "checkpointing": False}
    larger = min(size for size in range(micro + 1, 129) if 128 % size == 0)
    assert estimate(planned.shape, micro_batch=micro, **run).peak <= planned.usable
    assert estimate(planned.shape, micro_batch=larger, **run).peak > planned.usable


def test_activation_checkpointing_only_when_nothing_fits_without_it():
    """1.3B (GPT-3 XL's 24 x 2048, 50,304 tokens) on one 27 GiB GPU: micro-batch 1 does not fit
    without checkpointing, and does with it; at 28 GiB micro-batch 1 fits without it, so it
    stays off, and at 34 GiB micro-batch 2 does."""
    one_gpu = {"task": "language-model", "model_size": "1.3B", "hardware": "cuda"}
    one_gpu |= {"gpu_arch": "ampere", "host_memory_gb": 512}
    tight = plan(answers(**one_gpu, gpu_memory_gb=27))
    run = {"strategy": "single", "precision": "bf16", "world_size": 1, "micro_batch": 1}
    assert estimate(tight.shape, checkpointing=False, **run).peak > tight.usable
    assert estimate(tight.shape, checkpointing=True, **run).peak <= tight.usable
    assert tight.settings["activation_checkpointing"].value is True
    for memory, micro_batch in ((28, 1), (34, 2)):
        roomy = plan(answers(**one_gpu, gpu_memory_gb=memory))
        assert roomy.settings["activation_checkpointing"].value is False
        assert roomy.settings["micro_batch_size"].value == micro_batch


def test_checkpointing_keeps_fewer_activations_and_a_lower_peak():
    shape = decoder_for(10**9, 2048)
    run = {"strategy": "single", "precision": "bf16", "world_size": 1, "micro_batch": 4}
    plain, checkpointed = (estimate(shape, checkpointing=on, **run) for on in (False, True))
    assert checkpointed.activations < plain.activations / 5
    assert checkpointed.peak < plain.peak


@pytest.mark.parametrize(
    ("strategy", "weights", "gradients", "optimizer"),
    [("single", 4, 4, 8), ("ddp", 4, 4, 8), ("zero1", 4, 4, 12 / 4), ("zero2", 4, 4 / 4, 12 / 4),
     ("zero3", 4 / 4, 4 / 4, 12 / 4), ("fsdp2", 4 / 4, 4 / 4, 8 / 4), ("zero3-offload", 0, 0, 0)],
)  # fmt: skip
def test_each_strategy_divides_the_model_state_as_the_zero_paper_says(
    strategy, weights, gradients, optimizer
):
    """Bytes per parameter per device over 4 processes: ZeRO-1 shards the optimizer state
    (DeepSpeed's K = 12: fp32 partition and two moments), ZeRO-2 also gradients, ZeRO-3 and
    FSDP2 also weights; offload keeps all of it in host memory."""
    shape = decoder_for(10**8, 64)
    result = estimate(shape, strategy=strategy, precision="bf16", world_size=4, micro_batch=1,
                      checkpointing=False, processes_per_node=4)  # fmt: skip
    params = shape.params
    assert result.weights == pytest.approx(weights * params, rel=1e-6)
    assert result.gradients == pytest.approx(gradients * params, rel=1e-6)
    assert result.optimizer == pytest.approx(optimizer * params, rel=1e-6)
    assert result.host == (16 * math.ceil(params / 4) * 4 if LAYOUTS[strategy].offload else 0)


def test_a_1b_model_on_one_24_gb_gpu_accumulates_at_most_the_cap_and_scales_the_lr():
    """1B: GPT-3 XL's recipe (the nearest row: 512 sequences of 2048, peak LR 2e-4); one 24 GiB
    GPU fits micro-batch 1 (1,067,201,280 parameters: 24 blocks of 1920, see test_shapes), so
    the recipe would accumulate 512 micro-batches. Capped at 32: 1 x 32 x 1 = 32 sequences,
    LR 2e-4 x sqrt(32 / 512) = 5e-5, and GPT-3's warmup still 375M tokens: 375e6 / (32 x 2048)
    = 5722.05, 5723 steps (then a tenth of the planned run, which is shorter)."""
    planned = plan(answers(task="language-model", model_size="1B", hardware="cuda",
                           gpu_arch="ampere", gpu_memory_gb=24, host_memory_gb=64))  # fmt: skip
    settings = {key: setting.value for key, setting in planned.settings.items()}
    assert (settings["micro_batch_size"], settings["grad_accum_steps"]) == (1, MAX_ACCUMULATION)
    assert settings["lr"] == pytest.approx(2e-4 * math.sqrt(32 / 512)) == 5e-5
    accumulation = planned.settings["grad_accum_steps"].source
    assert "not GPT-3 XL's 1M tokens" in accumulation and "512 micro-batches of 1" in accumulation
    assert "sqrt(32/512)" in planned.settings["lr"].source
    assert "Malladi et al. 2022" in planned.settings["lr"].source
    windows = (int(32_000_000 * 0.9) - 1) // 2048
    assert settings["warmup_steps"] == 4 * math.ceil(windows / 32) // 10
    assert "would be 5723 steps" in planned.settings["warmup_steps"].source


def test_a_capped_batch_over_several_gpus_keeps_micro_x_accumulation_x_processes():
    """7B on 2 x 24 GB with offload: micro-batch 2 of GPT-3 6.7B's 1024 sequences would take
    256 micro-batches per process; capped: 2 x 32 x 2 = 128 sequences, LR 1.2e-4 x sqrt(1/8)
    = 4.2e-5 (two significant digits)."""
    planned = plan(answers(**{**H100S, "gpus_per_node": 2, "gpu_memory_gb": 24}, model_size="7B"))
    settings = {key: setting.value for key, setting in planned.settings.items()}
    assert (settings["micro_batch_size"], settings["grad_accum_steps"]) == (2, 32)
    assert "2 x 32 x 2 process(es) = 128 sequences" in planned.settings["grad_accum_steps"].source
    assert settings["lr"] == 4.2e-5


@pytest.mark.parametrize("hardware", ["cpu", "mps"])
def test_a_30m_model_off_gpus_keeps_the_examples_context_and_batch_and_says_why(hardware):
    """GPT-3 Small's recipe (the nearest row to 30M) is context 2048 x 256 sequences, 9.4e13
    FLOPs per step at 6 x 30M x 2^19 tokens: for GPU clusters. On a CPU or an Apple GPU the
    plan keeps the example's 64 x 32 and takes GPT-3 Small's 6e-4 as peak LR."""
    planned = plan(answers(task="language-model", model_size="30M", hardware=hardware,
                           host_memory_gb=16))  # fmt: skip
    settings = {key: setting.value for key, setting in planned.settings.items()}
    assert settings["block_size"] == 64 != 2048
    assert settings["micro_batch_size"] * settings["grad_accum_steps"] == 32
    example = (settings["lr"], settings["warmup_steps"], settings["corpus_bytes"])
    assert example == (6e-4, 50, 300_000)
    trade = planned.settings["block_size"].source
    assert trade.startswith("GPT-3 Small's recipe would be context 2048 x 256 sequences")
    assert "~9.4e13 FLOPs" in trade and "kept the example's context 64 x 32 sequences" in trade
    assert "not the example's 2e-3" in planned.settings["lr"].source


def test_a_model_that_fits_no_gpu_even_sharded_keeps_its_state_in_host_memory():
    planned = plan(answers(**{**H100S, "gpus_per_node": 2, "gpu_memory_gb": 24}, model_size="7B"))
    assert planned.answers.strategy == "zero3-offload"
    assert planned.estimate.host <= 0.85 * 1024 * GIB
    assert any("CPU memory" in reason for reason in planned.reasons)


@pytest.mark.parametrize(
    "values",
    [{"task": "language-model", "model_size": "7B", "hardware": "cpu", "host_memory_gb": 16},
     {**H100S, "model_size": "70B", "host_memory_gb": 256}],
)  # fmt: skip
def test_a_model_larger_than_all_device_and_host_memory_is_refused(values):
    with pytest.raises(AnswerError, match="more than the usable .* GiB"):
        plan(answers(**values))


def test_a_risky_override_is_accepted_with_a_warning_that_gives_the_numbers():
    planned = plan(answers(**H100S, model_size="7B", strategy="ddp"))
    assert planned.answers.strategy == "ddp"
    (warning,) = planned.warnings
    assert "strategy=ddp does not fit" in warning and "usable: 68.0 GiB" in warning
    assert "strategy=auto would choose fsdp2" in warning


def test_each_candidate_strategy_is_estimated_once_per_precision(monkeypatch):
    """An answered ddp that does not fit: its fit, auto's ladder (ddp, then fsdp2) and the
    warning naming auto's choice read one search; Volta's fp16 that auto turns into fp32 for
    a sharded model searches once more, at fp32."""
    from scaffold import planner

    estimated = []

    def counted(answers, strategy, precision, shape, recipe):
        estimated.append((strategy, precision))
        return fit(answers, strategy, precision, shape, recipe)

    monkeypatch.setattr(planner, "fit", counted)
    plan(answers(**H100S, model_size="7B", strategy="ddp"))
    assert estimated == [("ddp", "bf16"), ("fsdp2", "bf16")]
    estimated.clear()
    plan(answers(**H100S | {"gpu_arch": "volta-turing", "gpu_memory_gb": 32}, model_size="7B"))
    assert len(estimated) == len(set(estimated)), estimated
    assert {precision for _, precision in estimated} == {"fp16", "fp32"}


def test_cuda_needs_its_memory_and_an_unknown_host_memory_is_not_checked():
    with pytest.raises(AnswerError, match="answer gpu_memory_gb in GiB"):
        plan(answers(hardware="cuda", gpu_arch="hopper", gpus_per_node=8))
    planned = plan(answers(task="language-model", model_size="10M", hardware="cpu"))
    assert planned.usable == 0 and planned.answers.strategy == "single"
    assert "not given" in next(r for r in planned.reasons if r.startswith("strategy="))
    assert not planned.settings["activation_checkpointing"].value
    assert "not given" in planned.settings["activation_checkpointing"].source


def test_gpt3s_warmup_is_kept_within_a_tenth_of_the_planned_run():
    """GPT-3 Small warms up over 375M tokens: 716 steps of 256 x 2048 tokens, more than the ~220
    steps that 4 epochs over the stdlib corpus make; the plan takes a tenth of those and says
    what GPT-3's would be."""
    planned = plan(answers(task="language-model", model_size="125M", hardware="cuda",
                           gpu_arch="ampere", gpu_memory_gb=24, host_memory_gb=64))  # fmt: skip
    warmup = planned.settings["warmup_steps"]
    windows = (int(32_000_000 * 0.9) - 1) // 2048
    assert warmup.value == 4 * math.ceil(windows / 256) // 10
    assert "would be 716 steps" in warmup.source


@pytest.mark.parametrize(
    "values",
    [
        {"task": "language-model"},  # the CPU example: 100K parameters, 32 x 64 tokens a step
        {"task": "language-model", "model_size": "10M"},
        H100S | {"model_size": "125M"},
    ],
)
def test_a_language_models_run_is_a_token_budget_validated_twenty_times(values):
    """~20 tokens per parameter (Hoffmann et al. 2022) to two significant digits, validated
    every twentieth of its steps, each validation ~2M tokens over every process."""
    planned = plan(answers(**values))
    settings = {key: setting.value for key, setting in planned.settings.items()}
    tokens = settings["max_tokens"]
    assert tokens == float(f"{20 * planned.shape.params:.2g}")
    world = planned.answers.world_size
    sequences = settings["micro_batch_size"] * settings["grad_accum_steps"] * world
    steps = math.ceil(tokens / (sequences * settings["block_size"]))
    every = settings["val_every"]
    assert every == float(f"{steps / 20:.2g}") and 15 < steps / every < 25
    batch_tokens = settings["micro_batch_size"] * settings["block_size"] * world
    assert 2**21 <= settings["val_batches"] * batch_tokens < 2**21 + batch_tokens
    assert "Hoffmann et al. 2022" in planned.settings["max_tokens"].source


def test_the_digits_cnn_validates_its_whole_split_at_each_epochs_end():
    settings = plan(answers(task="image-classification")).settings
    assert "max_tokens" not in settings
    assert (settings["val_every"].value, settings["val_batches"].value) == (0, 0)


def test_volta_shards_a_model_too_large_for_one_gpu_in_fp32_not_fp16():
    planned = plan(answers(task="language-model", model_size="7B", hardware="cuda",
                           gpu_arch="volta-turing", gpus_per_node=8, gpu_memory_gb=32))  # fmt: skip
    assert (planned.answers.strategy, planned.answers.precision) == ("fsdp2", "fp32")
    assert "fp16's loss scaling is not rendered" in planned.reasons[0]


def test_each_resolved_answer_is_one_decision_record_that_says_who_decided():
    """auto's choices carry the planner's reason; an answered value is kept "as answered";
    the fp16 fallback replaces the precision decision whole, and `reasons` are their lines."""
    volta = {"task": "language-model", "model_size": "7B", "hardware": "cuda"}
    volta |= {"gpu_arch": "volta-turing", "gpus_per_node": 8, "gpu_memory_gb": 32}
    planned = plan(answers(**volta))
    assert (planned.precision.key, planned.precision.value) == ("precision", "fp32")
    assert planned.precision.source == planned.strategy.source == "auto"
    assert planned.reasons[0] == planned.precision.line()
    assert planned.strategy.line() in planned.reasons and "fp16" not in planned.strategy.reason
    kept = plan(answers(**volta, strategy="zero3-offload", precision="fp32"))
    assert kept.strategy == Decision("strategy", "zero3-offload", "as answered", "answered")
    assert kept.precision.line() == "precision=fp32: as answered"


def test_offload_that_host_memory_cannot_hold_is_blamed_on_host_memory():
    planned = plan(answers(task="language-model", model_size="2B", hardware="cuda",
                           gpu_arch="ampere", gpu_memory_gb=24, host_memory_gb=24))  # fmt: skip
    assert planned.answers.strategy == "zero3-offload"
    assert "of host memory per node, more than the" in planned.warnings[0]
    assert "fits" not in planned.settings["micro_batch_size"].source


@pytest.mark.parametrize(
    ("params", "name", "lr", "sequences"),
    [(10**5, "the example", 2e-3, 32), (10**7, "the example", 2e-3, 32),
     (2 * 10**7, "GPT-3 Small", 6e-4, 256), (125 * 10**6, "GPT-3 Small", 6e-4, 256),
     (3 * 10**8, "GPT-3 Medium", 3e-4, 256), (7 * 10**9, "GPT-3 6.7B", 1.2e-4, 1024),
     (10**12, "GPT-3 175B", 0.6e-4, 1536)],
)  # fmt: skip
def test_the_language_models_recipe_is_the_nearest_gpt3_row_or_the_examples(
    params, name, lr, sequences
):
    recipe = recipe_for("language-model", params)
    assert (recipe.name, recipe.lr, recipe.sequences) == (name, lr, sequences)
    assert recipe.per_process == (name == "the example")


def test_usable_memory_is_a_share_of_the_device_or_of_unified_memory():
    assert usable_bytes(answers(hardware="cpu", host_memory_gb=32)) == int(0.85 * 32 * GIB)
    assert usable_bytes(answers(hardware="mps", host_memory_gb=32)) == int(0.75 * 32 * GIB)
    gpu = answers(hardware="cuda", gpu_arch="ampere", gpu_memory_gb=40, host_memory_gb=1)
    assert usable_bytes(gpu) == int(0.85 * 40 * GIB)


def test_fit_reports_when_nothing_fits():
    tiny = answers(task="language-model", model_size="7B", hardware="cuda", gpu_arch="ampere",
                   gpu_memory_gb=24, host_memory_gb=4096)  # fmt: skip
    recipe = recipe_for("language-model", tiny.model_params)
    shape = decoder_for(tiny.model_params, recipe.block_size)
    result = fit(tiny, "single", "bf16", shape, recipe)
    assert not result.fits and result.micro_batch == 1 and result.checkpointing


@pytest.mark.parametrize(
    ("value", "toml", "python"),
    [(2e-3, "2e-3", "2e-3"), (1.2e-4, "1.2e-4", "1.2e-4"), (6e-4, "6e-4", "6e-4"),
     (True, "true", "True"), (300_000, "300_000", "300_000"), (64, "64", "64")],
)  # fmt: skip
def test_settings_render_as_toml_and_python_literals(value, toml, python):
    setting = Setting(value, "why")
    assert (setting.as_toml(), setting.as_python()) == (toml, python)


# --- MPS and the checks of partial answers ---


def test_mps_plans_one_device_in_fp32():
    planned = plan(answers(hardware="mps", host_memory_gb=16))
    assert (planned.answers.strategy, planned.answers.precision) == ("single", "fp32")
    warned = plan(answers(hardware="mps", host_memory_gb=16, precision="bf16"))
    assert "untested" in warned.warnings[0]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2", "zero2", "zero3-offload"])
def test_mps_refuses_strategies_of_several_processes(strategy):
    with pytest.raises(AnswerError, match="MPS"):
        plan(answers(hardware="mps", strategy=strategy))


@pytest.mark.parametrize("framework", ["fabric", "accelerate"])
def test_frameworks_are_not_rendered_for_mps(framework):
    with pytest.raises(NotAvailableYet, match=f"framework={framework} with hardware=mps"):
        plan(answers(hardware="mps", framework=framework))


@pytest.mark.parametrize(
    ("values", "message"),
    [({"hardware": "cuda", "gpu_arch": "none"}, "needs the GPU architecture"),
     ({"hardware": "cpu", "precision": "fp16"}, "fp16 on CPU"),
     ({"gpu_arch": "volta-turing", "precision": "bf16"}, "Volta/Turing"),
     ({"strategy": "fsdp2", "precision": "fp16"}, "sharded loss scaling"),
     ({"task": "image-classification", "model_size": "60M"}, "too large"),
     ({"framework": "accelerate", "strategy": "fsdp2"}, "not available yet"),
     ({"hardware": "cuda", "gpu_memory_gb": 0.0}, "answer gpu_memory_gb"),
     ({"task": "language-model", "model_size": "2e12"}, "largest decoder the example renders")],
)  # fmt: skip
def test_each_rule_checks_the_answers_it_needs_as_soon_as_they_are_given(values, message):
    for key in values:  # one answer alone is never refused by a rule about two
        check({key: values[key]})
    with pytest.raises(AnswerError, match=message):
        check(values)


def test_the_largest_decoder_is_refused_just_above_it():
    """96 blocks (GPT-3 175B's depth) of the widest width, 32,768 = 256 heads of 128:
    96 x (12 x 32768^2 + 13 x 32768) + (2 x 257 + 2048 + 2) x 32768 parameters."""
    largest = largest_decoder(2048)
    assert (largest.depth, largest.width, largest.heads) == (96, 32768, 256)
    assert largest.params == 96 * (12 * 32768**2 + 13 * 32768) + 2564 * 32768 == 1_237_075_492_864
    check({"task": "language-model", "model_size": str(largest.params)})
    with pytest.raises(AnswerError, match="96 blocks of width 32,768"):
        check({"task": "language-model", "model_size": str(largest.params + 1)})


V100S = {"hardware": "cuda", "gpu_arch": "volta-turing", "gpu_memory_gb": 16, "host_memory_gb": 256}


def test_a_backbone_is_planned_as_the_decoder_is_from_its_own_memory():
    """A ViT-L at 224 px on one 16 GiB GPU: its state (304M parameters x 16 bytes, 4.5 GiB)
    fits, 64 images of activations do not, so the micro-batch shrinks and accumulation makes
    up the example's 64; a ViT-H on eight 8 GiB GPUs: its state (632M x 16 bytes, 9.4 GiB)
    fits none of them whole, so the model is sharded over them, one unit per block."""
    vit_l = plan(answers(backbone="vit_large_patch16_224", precision="fp32", **V100S))
    micro = vit_l.settings["micro_batch_size"].value
    assert micro < 64 and micro * vit_l.settings["grad_accum_steps"].value == 64
    assert vit_l.estimate.peak <= vit_l.usable and vit_l.answers.strategy == "single"
    assert model_state(vit_l.estimate) == 16 * vit_l.shape.params
    eight = {**V100S, "gpus_per_node": 8, "gpu_memory_gb": 8, "precision": "fp32"}
    vit_h = plan(answers(backbone="vit_huge_patch14_224", **eight))
    assert vit_h.answers.strategy == "fsdp2" and len(vit_h.shape.unit_params) == 32
    assert "does not fit one GPU" in vit_h.strategy.reason


def test_a_backbones_recipe_follows_its_weights(tmp_path):
    """Scratch: one LR for every weight and no frozen epochs; the same backbone fine-tuned from
    a weights file: MAE's LR for its batch, the backbone at a tenth of it, one frozen epoch,
    each with its source."""
    from test_backbones import shapes_of, write_safetensors

    scratch = plan(answers(backbone="test_convnext", image_size=32)).settings
    assert (scratch["backbone_lr_ratio"].value, scratch["freeze_backbone_epochs"].value) == (1.0, 0)
    weights = write_safetensors(tmp_path / "w.safetensors", shapes_of("test_convnext", {}))
    tuned = plan(answers(backbone="test_convnext", image_size=32, init_from=str(weights)))
    settings = tuned.settings
    assert (settings["backbone_lr_ratio"].value, settings["freeze_backbone_epochs"].value) == (
        0.1,
        1,
    )
    assert settings["lr"].value == pytest.approx(5e-4 * 64 / 256)
    assert (
        "He et al. 2022" in settings["lr"].source
        and "LP-FT" in settings["freeze_backbone_epochs"].source
    )
    assert settings["init_from"].value == str(weights.resolve())
