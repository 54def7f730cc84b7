"""Answers and the planner: names, value checks, precision and strategy rules."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scaffold.answers import QUESTIONS, build_answers, merge_sources, package_name_for
from scaffold.errors import AnswerError, NotAvailableYet
from scaffold.planner import plan
from scaffold.variants import VARIANTS

TEMPLATE = Path(__file__).resolve().parents[1] / "templates"


@pytest.mark.parametrize(
    ("name", "package"),
    [("demo", "demo"), ("my-net", "my_net"), ("My.Net-2", "my_net_2"), ("a_b", "a_b")],
)
def test_package_name_normalisation(name, package):
    assert package_name_for(name) == package


@pytest.mark.parametrize(
    "name", ["2net", "a/b", "..", "a..b", "-x", "with space", "import", "json"]
)
def test_invalid_project_names(name):
    with pytest.raises(AnswerError):
        package_name_for(name)


def test_copier_choices_match_the_renderable_answers():
    """copier.yml lists what the template renders; answers.py must agree value for value."""
    copier_yml = yaml.safe_load((TEMPLATE / "copier.yml").read_text())
    for question in QUESTIONS:
        assert question.key in copier_yml, question.key
        if question.renderable:
            renderable = [v for v in question.renderable if v != "auto"]
            assert copier_yml[question.key]["choices"] == renderable, question.key


def answers(**values):
    return build_answers(merge_sources(values, {"project_name": "demo"}))


@pytest.mark.parametrize(
    ("hardware", "arch", "expected"),
    [("cpu", "none", "fp32"), ("cuda", "ampere", "bf16"), ("cuda", "hopper", "bf16"),
     ("cuda", "volta-turing", "fp16")],
)  # fmt: skip
def test_auto_precision_follows_the_hardware(hardware, arch, expected):
    resolved = plan(answers(hardware=hardware, gpu_arch=arch, gpu_memory_gb=16)).answers
    assert resolved.precision == expected
    assert resolved.strategy == "single"


def test_auto_strategy_with_many_gpus_picks_ddp():
    resolved = plan(answers(hardware="cuda", gpu_arch="ampere", gpus_per_node=8, gpu_memory_gb=80))
    assert resolved.answers.strategy == "ddp"


def test_a_model_too_big_for_each_gpu_is_sharded_with_fsdp2():
    resolved = plan(answers(hardware="cuda", gpu_arch="ampere", gpus_per_node=8,
                            gpu_memory_gb=0.5, model_size="40M"))  # fmt: skip
    assert resolved.answers.strategy == "fsdp2"
    assert any("shard it" in reason for reason in resolved.reasons)


def test_a_model_too_big_for_all_gpus_together_gets_zero3_with_cpu_offload():
    resolved = plan(answers(hardware="cuda", gpu_arch="hopper", gpus_per_node=2,
                            gpu_memory_gb=0.25, model_size="40M"))  # fmt: skip
    assert resolved.answers.strategy == "zero3-offload"
    assert any("CPU memory" in reason for reason in resolved.reasons)


def test_a_known_value_not_rendered_yet_is_refused_and_every_strategy_renders():
    with pytest.raises(NotAvailableYet, match="hardware=mps"):
        answers(hardware="mps")
    strategy = next(question for question in QUESTIONS if question.key == "strategy")
    assert all(strategy.renders(value) for value in strategy.choices)


def test_fsdp2_with_fp16_is_refused_with_the_way_out():
    with pytest.raises(AnswerError, match="precision=bf16 or fp32"):
        plan(answers(hardware="cuda", gpu_arch="volta-turing", gpus_per_node=4,
                     strategy="fsdp2"))  # fmt: skip


def test_forcing_single_on_a_small_gpu_warns_about_memory():
    fits = answers(hardware="cuda", gpu_arch="ampere", gpu_memory_gb=16, model_size="40M")
    assert plan(fits).warnings == ()
    tight = answers(
        hardware="cuda", gpu_arch="ampere", gpu_memory_gb=0.5, model_size="40M", strategy="single"
    )
    assert "may run out of memory" in plan(tight).warnings[0]


def test_cpu_answers_reset_gpu_fields():
    resolved = answers(hardware="cpu", gpu_arch="ampere", gpus_per_node=4)
    assert (resolved.gpu_arch, resolved.gpus_per_node) == ("none", 1)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_is_valid_and_fully_resolved(name):
    resolved = plan(build_answers(merge_sources(VARIANTS[name], {"project_name": "x"}))).answers
    assert resolved.precision != "auto" and resolved.strategy != "auto"
    assert set(VARIANTS[name]) | {"project_name"} == {q.key for q in QUESTIONS}


def test_variants_cover_every_renderable_value():
    for question in QUESTIONS:
        if question.key in ("hardware", "strategy", "precision", "framework", "task"):
            wanted = set(question.renderable) - {"auto"}
            covered = {answers[question.key] for answers in VARIANTS.values()}
            assert wanted <= covered, f"{question.key}: no variant renders {wanted - covered}"
    assert len(VARIANTS) >= 10
