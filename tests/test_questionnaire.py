"""The questionnaire without a terminal: going back, and what the strategy choices say."""

from __future__ import annotations

import os
import re

import pytest

from scaffold import questionnaire
from scaffold.answer_rules import partial_answers
from scaffold.answers import QUESTION_BY_KEY
from scaffold.memory import GIB
from scaffold.planner import plan
from scaffold.questionnaire import BACK, ask, strategy_instruction, strategy_title

CPU_16 = {"task": "language-model", "hardware": "cpu", "host_memory_gb": 16.0}
H100S = {"task": "language-model", "hardware": "cuda", "gpu_arch": "hopper", "gpus_per_node": 8}
H100S |= {"num_nodes": 1, "gpu_memory_gb": 80.0, "host_memory_gb": 1024.0, "model_size": "7B"}


def script(monkeypatch, replies: list) -> list[tuple[str, object]]:
    """Answer the questions with `replies` in order (BACK goes back); return (key, default
    offered) for each question asked."""
    asked: list[tuple[str, object]] = []
    pending = iter(replies)

    def reply(question, default, known, first):
        asked.append((question.key, default))
        answer = next(pending)
        assert not (answer == BACK and first), "the first question has no back"
        return answer

    monkeypatch.setattr(questionnaire, "_ask_one", reply)
    return asked


def test_back_returns_to_the_previous_question_offering_its_answer(monkeypatch):
    """cuda, then back from the GPU questions to hardware (which offers cuda), cpu instead: the
    GPU questions are skipped from there on and their answers are gone."""
    replies = ["language-model", "", "cuda", "ampere", 4, BACK, BACK, BACK, "cpu", 32.0]
    replies += ["1M", "gpt2", "pytorch", "auto", "auto", False]
    asked = script(monkeypatch, replies)
    answers = ask({"project_name": "demo"}, {"hardware": "cpu", "host_memory_gb": 16.0})
    keys = [key for key, _ in asked]
    assert keys[:9] == ["task", "init_from", "hardware", "gpu_arch", "gpus_per_node"] + [
        "num_nodes",
        "gpus_per_node",
        "gpu_arch",
        "hardware",
    ]
    assert asked[6] == ("gpus_per_node", 4), "going back offers the answer given"
    assert asked[8] == ("hardware", "cuda")
    assert keys[9:] == ["host_memory_gb", "model_size", "model_family", "framework"] + [
        "precision",
        "strategy",
        "compile",
    ]
    assert answers["hardware"] == "cpu" and answers["host_memory_gb"] == 32.0
    assert not {"gpu_arch", "gpus_per_node"} & set(answers), "answers taken back are gone"


def test_the_first_question_asked_offers_no_back(monkeypatch):
    """`script` fails if BACK is answered where `first` is set: back to the task, and the task
    is the first question asked again (the image task is not asked for a model folder)."""
    asked = script(monkeypatch, ["language-model", BACK, "image-classification", "", "cpu"] + [
        16.0, "100K", "pytorch", "auto", "auto", False])  # fmt: skip
    answers = ask({"project_name": "demo"}, {})
    assert [key for key, _ in asked][:5] == ["task", "init_from", "task", "backbone", "hardware"]
    assert asked[2] == ("task", "language-model")
    assert answers["task"] == "image-classification"


def test_an_image_backbone_is_asked_its_weights_and_image_size_not_a_model_size(monkeypatch):
    """The image task asks for a timm backbone; one answered asks what it starts from and the
    crop it sees, and not model_size or model_family (the backbone's own); none asks neither
    (the example's CNN is sized by model_size)."""
    replies = ["image-classification", "resnet18", "", 160, "cpu", 16.0, "pytorch", "auto"]
    asked = script(monkeypatch, [*replies, "auto", False])
    answers = ask({"project_name": "demo"}, {})
    keys = [key for key, _ in asked]
    assert keys[:4] == ["task", "backbone", "init_from", "image_size"]
    assert "model_size" not in keys and "model_family" not in keys
    assert (answers["backbone"], answers["image_size"]) == ("resnet18", 160)
    asked = script(monkeypatch, ["image-classification", "", "cpu", 16.0, "100K", "pytorch"] + [
        "auto", "auto", False])  # fmt: skip
    keys = [key for key, _ in asked] if ask({"project_name": "demo"}, {}) else []
    assert "model_size" in keys and not {"init_from", "image_size"} & set(keys)


def test_a_backbone_answer_is_checked_as_it_is_typed():
    """The refusals training makes, made under the prompt: an unknown backbone, a crop below
    its output stride, a language model's family for an image."""
    known = {"project_name": "demo", "task": "image-classification"}
    refusal = questionnaire._refusal(QUESTION_BY_KEY["backbone"], "resnet_nope", known, False)
    assert refusal and "resnet_nope" in refusal
    known["backbone"] = "resnet18"
    refusal = questionnaire._refusal(QUESTION_BY_KEY["image_size"], "16", known, False)
    assert refusal and "at least 32" in refusal
    assert questionnaire._refusal(QUESTION_BY_KEY["image_size"], "64", known, False) is None


def test_one_cpu_process_says_a_distributed_strategy_adds_nothing_not_out_of_memory():
    """16 GiB CPU: DDP, FSDP2 and ZeRO fit easily; what the menu says is why they gain nothing,
    and at which micro-batch each is sized."""
    for strategy in ("ddp", "fsdp2", "zero1", "zero2", "zero3", "zero3-offload"):
        title = strategy_title(strategy, CPU_16)
        assert title.endswith(" GiB; 1 process: adds nothing"), title
        assert "memory" not in title and "fit" not in title, title
        assert re.fullmatch(rf"{strategy} +micro-batch \d+, ~[\d.]+ GiB; .*", title), title
    assert "adds nothing" not in strategy_title("single", CPU_16)
    assert "of 13.6 usable" in strategy_instruction(CPU_16)


def test_a_strategy_over_the_whole_gpu_does_not_fit_and_a_close_call_may_run_out():
    ddp = strategy_title("ddp", H100S)
    assert "micro-batch 1 + checkpointing" in ddp and ddp.endswith(" GiB; does not fit"), ddp
    smallest = plan(partial_answers({**H100S, "gpu_memory_gb": 1.0, "strategy": "ddp"}))
    peak = smallest.estimate.peak / GIB  # at micro-batch 1 with checkpointing
    close = {**H100S, "gpu_memory_gb": round(peak / 0.92, 1)}  # over 85% usable, under 100%
    title = strategy_title("ddp", close)
    assert title.endswith(" GiB; may run out of memory"), title
    (warning,) = plan(partial_answers({**close, "strategy": "ddp"})).warnings
    assert warning.startswith("strategy=ddp may run out of memory: even at micro-batch 1"), warning
    fits = strategy_title("fsdp2", H100S)
    assert "fit" not in fits and "memory" not in fits and "micro-batch" in fits, fits
    offload = strategy_title("zero3-offload", {**H100S, "gpus_per_node": 2, "host_memory_gb": 64})
    one_gpu = {**H100S, "model_size": "2B", "gpus_per_node": 1, "gpu_memory_gb": 24}
    auto = strategy_title("auto", {**one_gpu, "host_memory_gb": 128})  # offload alone fits
    assert "zero3-offload: " in auto and "adds nothing" not in auto, auto
    assert "adds nothing" in strategy_title("zero3", one_gpu)
    assert offload.endswith(" GiB; short of host memory"), offload


@pytest.mark.parametrize("strategy", ["auto", "fsdp2"])
def test_each_choice_shows_its_own_micro_batch(strategy):
    planned = plan(partial_answers({**H100S, "strategy": strategy}))
    micro = planned.settings["micro_batch_size"].value
    assert f"micro-batch {micro}" in strategy_title(strategy, H100S)


def test_a_refusal_longer_than_the_terminal_is_printed_whole(monkeypatch, capsys):
    """The line under a prompt is cut at the terminal's width, and the end of a refusal says
    what to answer: a longer one is printed whole after Enter, and the question asked again
    with what was typed; a shorter one stays under the prompt."""
    offered, shown = [], []

    def ask_text(columns: int, typed: list[str]) -> object:
        replies = iter(typed)

        class Prompt:
            def __init__(self, prompt, default, validate, instruction):
                offered.append(default)
                self.validate = validate

            def unsafe_ask(self):
                text = next(replies)
                shown.append(self.validate(text))
                return text

        monkeypatch.setattr(questionnaire.questionary, "text", Prompt)
        size = os.terminal_size((columns, 24))
        monkeypatch.setattr(questionnaire.shutil, "get_terminal_size", lambda: size)
        known = {"task": "language-model", "hardware": "cpu"}
        return questionnaire._ask_text(QUESTION_BY_KEY["model_size"], "100K", known, False)

    assert ask_text(80, ["10T", "1B"]) == "1B"
    printed = " ".join(capsys.readouterr().out.split())
    assert printed.startswith("! model_size=10T is more than the largest decoder"), printed
    assert printed.endswith("put your own model in model.py"), printed
    assert offered == ["100K", "10T"], "asked again with what was typed"
    assert shown == [True, True], "nothing cut under the prompt"
    shown.clear()
    assert ask_text(300, ["10T", "1B"]) == "1B"
    assert "more than the largest decoder" in shown[0] and shown[1] is True
