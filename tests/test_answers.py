"""Answers and the planner: names, value checks, precision and strategy rules."""

from __future__ import annotations

import functools
import importlib
import sys
from pathlib import Path

import pytest
import yaml

from scaffold.answers import (
    QUESTION_BY_KEY,
    QUESTIONS,
    build_answers,
    merge_sources,
    package_name_for,
    parse_model_size,
)
from scaffold.errors import AnswerError, NotAvailableYet
from scaffold.planner import plan
from scaffold.renderable import FRAMEWORK_RENDERS, RENDERS
from scaffold.variants import DEFAULT_VARIANT, VARIANTS

REPO_ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = REPO_ROOT / "templates"


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


def test_copier_choices_and_the_questions_match_the_table_of_what_renders():
    """copier.yml lists what the template renders; `renderable.RENDERS` must agree value for
    value, and every question with choices offers exactly the table's."""
    copier_yml = yaml.safe_load((TEMPLATE / "copier.yml").read_text())
    for question in QUESTIONS:
        assert question.key in copier_yml, question.key
        assert question.choices == RENDERS.get(question.key, ()), question.key
    for key, values in RENDERS.items():
        assert copier_yml[key]["choices"] == [v for v in values if v != "auto"], key
    for framework, renders in FRAMEWORK_RENDERS.items():
        assert framework in RENDERS["framework"], framework
        for key, values in renders.items():
            assert set(values) < set(RENDERS[key]), (framework, key)


def answers(**values):
    """Answers for a machine whose memory is known (a CUDA answer needs its GPUs' memory)."""
    machine = {"project_name": "demo", "gpu_memory_gb": 80, "host_memory_gb": 512}
    return build_answers(merge_sources(values, machine))


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


def test_fsdp2_with_fp16_is_refused_with_the_way_out_and_auto_picks_fp32_there():
    volta = {"hardware": "cuda", "gpu_arch": "volta-turing", "gpus_per_node": 4}
    with pytest.raises(AnswerError, match="precision=bf16 or fp32"):
        plan(answers(**volta, strategy="fsdp2", precision="fp16"))
    resolved = plan(answers(**volta, strategy="fsdp2"))
    assert resolved.answers.precision == "fp32"
    assert "fp16's loss scaling is not rendered" in resolved.reasons[0]


def test_forcing_single_on_a_small_gpu_warns_about_memory():
    fits = answers(hardware="cuda", gpu_arch="ampere", gpu_memory_gb=16, model_size="40M")
    assert plan(fits).warnings == ()
    tight = answers(
        hardware="cuda", gpu_arch="ampere", gpu_memory_gb=0.5, model_size="40M", strategy="single"
    )
    assert "strategy=single does not fit" in plan(tight).warnings[0]


def test_cpu_answers_reset_gpu_fields():
    resolved = answers(hardware="cpu", gpu_arch="ampere", gpus_per_node=4)
    assert (resolved.gpu_arch, resolved.gpus_per_node) == ("none", 1)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_is_valid_and_fully_resolved(name):
    resolved = plan(build_answers(merge_sources(VARIANTS[name], {"project_name": "x"}))).answers
    assert resolved.precision != "auto" and resolved.strategy != "auto"
    assert set(VARIANTS[name]) | {"project_name"} == {q.key for q in QUESTIONS}


def test_variants_cover_every_value_that_renders():
    resolved = [
        build_answers(merge_sources(values, {"project_name": "x"})) for values in VARIANTS.values()
    ]
    for key, values in RENDERS.items():
        # hopper renders the files ampere does; finetune only sets train.toml's default, and
        # a variant names no model folder: each LM suite trains both with init_from overrides.
        # timm renders the files cnn does (backbone.py is in every image project), and each
        # image suite trains a timm backbone through config overrides; its plan is tested in
        # tests/test_backbone_plan.py.
        if key not in ("gpu_arch", "finetune"):
            wanted = set(values) - {"auto"} - ({"timm"} if key == "model_family" else set())
            covered = {getattr(answers, key) for answers in resolved}
            assert wanted <= covered, f"{key}: no variant renders {wanted - covered}"
    assert len(VARIANTS) >= 10


@functools.cache
def rendered_parse_param_count():
    """The model-size rule of a rendered project (`config.parse_param_count` of the default
    sample), imported from its package: config.py needs only the standard library and the
    task's settings (task_config.py, standard library too)."""
    package = next((REPO_ROOT / "generated_samples" / DEFAULT_VARIANT / "src").glob("*/config.py"))
    sys.path.insert(0, str(package.parent.parent))
    try:
        return importlib.import_module(f"{package.parent.name}.config").parse_param_count
    finally:
        sys.path.pop(0)


MODEL_SIZES = ["100K", "1.5m", "7B", "4096", "1e6", "2.5E3K", " 10M ", "1"]
MODEL_SIZES += ["0.5", "0.0001K", "-1", "", "1.5", "ten", "1e999", "0", "1KB", "nan", "1.2T"]


@pytest.mark.parametrize("text", MODEL_SIZES)
def test_scaffold_and_the_rendered_project_share_one_model_size_rule(text):
    rendered = rendered_parse_param_count()
    try:
        expected = rendered(text)
    except ValueError as error:
        with pytest.raises(AnswerError) as refused:
            parse_model_size(text)
        assert str(refused.value) == str(error)
    else:
        assert parse_model_size(text) == expected


@pytest.mark.parametrize(
    ("framework", "strategy"),
    [("fabric", "zero3"), ("fabric", "zero1"), ("accelerate", "fsdp2"), ("accelerate", "zero2")],
)
def test_a_strategy_the_framework_does_not_render_is_refused_with_the_way_out(framework, strategy):
    with pytest.raises(NotAvailableYet, match=f"framework={framework} with strategy={strategy}"):
        plan(answers(hardware="cuda", gpu_arch="ampere", gpus_per_node=4,
                     framework=framework, strategy=strategy))  # fmt: skip


def test_the_planners_own_choice_is_checked_against_the_framework():
    """7B on 4 x 16 GB: the planner picks ZeRO-3 with offload, which Fabric does not render;
    the message says auto chose it, and why."""
    with pytest.raises(NotAvailableYet, match=r"strategy=auto chose strategy=zero3-offload: .*"
                       r"framework=fabric does not render zero3-offload"):  # fmt: skip
        plan(answers(hardware="cuda", gpu_arch="ampere", gpus_per_node=4, gpu_memory_gb=16,
                     task="language-model", model_size="7B", framework="fabric"))  # fmt: skip


def test_every_framework_renders_what_the_planner_picks_for_a_small_model():
    for framework in ("pytorch", "fabric", "accelerate"):
        resolved = plan(answers(hardware="cuda", gpu_arch="ampere", gpus_per_node=4,
                                framework=framework)).answers  # fmt: skip
        assert (resolved.framework, resolved.strategy) == (framework, "ddp")


def test_the_questionnaire_disables_what_the_answers_so_far_rule_out_with_the_reason():
    from scaffold.questionnaire import unavailable

    strategy, precision = QUESTION_BY_KEY["strategy"], QUESTION_BY_KEY["precision"]
    fabric, accelerate = {"framework": "fabric"}, {"framework": "accelerate"}
    assert "framework=fabric with strategy=zero3 is not available" in unavailable(
        strategy, "zero3", fabric
    )
    assert "answer strategy=single or ddp" in unavailable(strategy, "fsdp2", accelerate)
    assert unavailable(strategy, "fsdp2", fabric) is None
    assert unavailable(strategy, "zero3", {"framework": "pytorch"}) is None
    assert "precision=fp16" in unavailable(precision, "fp16", accelerate)
    assert unavailable(precision, "fp16", fabric) is None
    gpu_arch = QUESTION_BY_KEY["gpu_arch"]
    assert "needs the GPU architecture" in unavailable(gpu_arch, "none", {"hardware": "cuda"})
    assert "MPS" in unavailable(strategy, "ddp", {"hardware": "mps"})
    assert "fp16 on CPU" in unavailable(precision, "fp16", {"hardware": "cpu"})
    # `auto` is refused when what it would pick for these answers cannot be rendered.
    big = {"task": "language-model", "model_size": "7B", "hardware": "cuda"}
    big |= {"gpu_arch": "ampere", "gpus_per_node": 4, "gpu_memory_gb": 16, "framework": "fabric"}
    assert "auto chose strategy=zero3-offload" in unavailable(strategy, "auto", big)


def test_accelerate_with_fp16_is_refused_and_auto_on_volta_picks_fp32():
    volta = {"hardware": "cuda", "gpu_arch": "volta-turing", "framework": "accelerate"}
    with pytest.raises(NotAvailableYet, match="framework=accelerate with precision=fp16"):
        plan(answers(**volta, precision="fp16"))
    with pytest.raises(AnswerError, match="Volta/Turing GPUs; answer fp32$"):
        plan(answers(**volta, precision="bf16"))
    resolved = plan(answers(**volta))
    assert resolved.answers.precision == "fp32"
    assert "does not render fp16" in resolved.reasons[0]


def test_a_size_in_trillions_is_read_and_one_in_quadrillions_is_too_large():
    """The README gives the decoder's limit as 1.2T: T is a suffix like B (the rendered config
    reads it too: `MODEL_SIZES`), and P is refused with the largest model the examples render."""
    from scaffold.recipes import GPT3_CONTEXT
    from scaffold.shapes import largest_decoder

    assert parse_model_size("1.2T") == 1_200_000_000_000
    assert parse_model_size("0.5t") == 500_000_000_000
    largest = largest_decoder(GPT3_CONTEXT).params
    with pytest.raises(AnswerError, match=rf"'1P' is too large: .* has {largest:,} parameters"):
        parse_model_size("1P")


@pytest.mark.parametrize(
    "question", [q for q in QUESTIONS if q.kind in (int, float)], ids=lambda q: q.key
)
def test_every_number_has_a_cap_and_its_refusal_gives_the_range(question):
    from scaffold.answers import coerce

    assert coerce(question, question.maximum) == question.maximum
    with pytest.raises(AnswerError, match=f"answer {question.accepted()}$"):
        coerce(question, question.maximum * 2)
    with pytest.raises(AnswerError, match=f"answer e.g. {question.key}=") as refused:
        coerce(question, "lots")
    hinted = str(refused.value).rsplit("=", 1)[1]  # a value a CUDA plan takes
    plan(answers(**{"hardware": "cuda", "gpu_arch": "ampere", question.key: hinted}))
