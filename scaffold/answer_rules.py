"""The checks that need no plan: answers that cannot work together are refused, each rule
on the keys it reads, so the questionnaire checks every answer as it is given (`check`), and
`scaffold new` once more before it plans (`scaffold.planner.plan`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from scaffold.answers import (
    QUESTION_BY_KEY,
    Answers,
    check_image_family,
    check_language_family,
    parse_model_size,
)
from scaffold.backbones import backbone_info, check_backbone_image_size, weights_backbone
from scaffold.errors import AnswerError, NotAvailableYet
from scaffold.fitting import SHARDED_STRATEGIES, check_capacity, hardware_recipe, model_shape
from scaffold.hub_folder import read_hub_folder
from scaffold.recipes import GPT3_CONTEXT
from scaffold.renderable import FRAMEWORK_RENDERS, framework_renders
from scaffold.shapes import largest_decoder

MAX_IMAGE_MODEL_PARAMS = 50_000_000  # the digits CNN beyond this only burns time


def check(values: Mapping[str, Any]) -> None:
    """Refuse answers that cannot work together. Only the keys present are checked, so the
    questionnaire can check each answer as it is given (values typed, as `coerce` makes them).

    Raises:
        AnswerError: fp16 on CPU, bf16 on Volta/Turing, CUDA without its architecture, several
            processes on MPS, one device for several GPUs, fp16 with a sharded strategy, a model
            too large for the example task or for all memory, or a value the framework does not
            render (NotAvailableYet).
    """
    for keys, rule in RULES:
        if all(key in values for key in keys):
            rule(values)


def _cuda_needs_an_architecture(values: Mapping[str, Any]) -> None:
    if values["hardware"] == "cuda" and values["gpu_arch"] == "none":
        raise AnswerError(
            "hardware=cuda needs the GPU architecture; "
            "answer gpu_arch=hopper, ampere or volta-turing"
        )


def _cuda_needs_its_memory(values: Mapping[str, Any]) -> None:
    if values["hardware"] == "cuda" and not values["gpu_memory_gb"]:
        raise AnswerError(
            "hardware=cuda needs the memory of one GPU to plan the run; answer gpu_memory_gb "
            "in GiB (nvidia-smi's MiB / 1024: 79.6 for an 80 GB H100, 39.4 for a 40 GB A100)"
        )


def _no_fp16_on_cpu(values: Mapping[str, Any]) -> None:
    if values["hardware"] == "cpu" and values["precision"] == "fp16":
        raise AnswerError(
            "precision=fp16 on CPU gains nothing and needs loss scaling; answer bf16 or fp32"
        )


def _no_bf16_on_volta(values: Mapping[str, Any]) -> None:
    if values["gpu_arch"] == "volta-turing" and values["precision"] == "bf16":
        fp16_renders = framework_renders(values.get("framework", "pytorch"), "precision", "fp16")
        others = "fp16 or fp32" if fp16_renders else "fp32"
        raise AnswerError(
            f"precision=bf16 is not supported in hardware on Volta/Turing GPUs; answer {others}"
        )


def _one_process_on_mps(values: Mapping[str, Any]) -> None:
    if values["hardware"] == "mps" and values["strategy"] not in ("auto", "single"):
        raise AnswerError(
            f"strategy={values['strategy']} needs several processes with a collective backend, "
            "which MPS does not have (one Apple GPU per machine); answer strategy=single"
        )


def _single_means_one_gpu(values: Mapping[str, Any]) -> None:
    world = values["gpus_per_node"] * values["num_nodes"]
    if values["hardware"] == "cuda" and values["strategy"] == "single" and world > 1:
        raise AnswerError(
            f"strategy=single uses one device but {world} GPUs were answered; "
            "answer gpus_per_node=1 and num_nodes=1, or strategy=ddp"
        )


def no_fp16_when_sharded(values: Mapping[str, Any]) -> None:
    if values["strategy"] in SHARDED_STRATEGIES and values["precision"] == "fp16":
        raise AnswerError(
            f"precision=fp16 with strategy={values['strategy']} needs sharded loss scaling, "
            "which this template does not render; answer precision=bf16 or fp32 (or strategy=ddp)"
        )


def _image_model_size(values: Mapping[str, Any]) -> None:
    size = values["model_size"]
    if values.get("backbone") or values.get("model_family") == "timm":
        return  # a backbone's size is its own
    if values["task"] == "image-classification" and parse_model_size(size) > MAX_IMAGE_MODEL_PARAMS:
        raise AnswerError(
            f"model_size={size} is too large for the 8x8-digits example model; "
            "answer at most 50M, or task=language-model"
        )


def _decoder_size(values: Mapping[str, Any]) -> None:
    size = values["model_size"]
    largest = largest_decoder(GPT3_CONTEXT)
    if values["task"] == "language-model" and parse_model_size(size) > largest.params:
        raise AnswerError(
            f"model_size={size} is more than the largest decoder the example renders "
            f"({largest.params:,} parameters: {largest.depth} blocks of width {largest.width:,}); "
            "answer a smaller model_size, or render one and put your own model in model.py"
        )


def _framework_renders(values: Mapping[str, Any]) -> None:
    framework = values["framework"]
    for key, rendered in FRAMEWORK_RENDERS.get(framework, {}).items():
        value = values.get(key, "auto")
        if not framework_renders(framework, key, value):
            raise NotAvailableYet(
                f"framework={framework} with {key}={value} is not available yet (it cannot be "
                f"tested on CPU); answer {key}={' or '.join(rendered)}, or framework=pytorch "
                f"for {value}"
            )


def _fits_somewhere(values: Mapping[str, Any]) -> None:
    answers = partial_answers(values)
    recipe = hardware_recipe(answers)
    if answers.model_family == "timm" and not answers.backbone:
        return  # named by init_from's folder: build_answers reads it, then the plan checks
    check_capacity(answers, model_shape(answers, recipe))


def _model_of_the_task(values: Mapping[str, Any]) -> None:
    family, backbone = values.get("model_family", "auto"), values.get("backbone", "")
    if values["task"] == "language-model":
        check_language_family(family, backbone)
    else:
        check_image_family(family, backbone, values.get("init_from", ""))


def _backbone_is_known(values: Mapping[str, Any]) -> None:
    if values["backbone"] and values["task"] == "image-classification":
        backbone_info(values["backbone"])


def _image_size_holds_the_stride(values: Mapping[str, Any]) -> None:
    if values["backbone"] and values["task"] == "image-classification":
        check_backbone_image_size(values["backbone"], values["image_size"])


def _init_from_holds_the_model(values: Mapping[str, Any]) -> None:
    if not values["init_from"]:
        return
    if values["task"] == "language-model":
        read_hub_folder(values["init_from"], 1)
        return
    if values.get("model_family") != "cnn":  # the family's rule refuses weights for the CNN
        weights_backbone(values["init_from"], values.get("backbone", ""))


def _lora_adapts_a_llama_folder(values: Mapping[str, Any]) -> None:
    if values["finetune"] == "auto" or values.get("task") == "image-classification":
        return
    if not values["init_from"] and values["finetune"] == "lora":
        raise AnswerError(
            "finetune=lora trains adapters on a model started from init_from; answer init_from "
            "(a Hugging Face model folder), or finetune=full"
        )
    if values["finetune"] == "lora" and read_hub_folder(values["init_from"], 1).family != "llama":
        raise AnswerError(
            "finetune=lora adapts a Llama-family model (Llama, Mistral, Qwen2, SmolLM), and "
            f"{values['init_from']} holds a GPT-2; answer finetune=full"
        )


RULES: tuple[tuple[tuple[str, ...], Callable[[Mapping[str, Any]], None]], ...] = (
    (("hardware", "gpu_arch"), _cuda_needs_an_architecture),
    (("hardware", "gpu_memory_gb"), _cuda_needs_its_memory),
    (("hardware", "precision"), _no_fp16_on_cpu),
    (("gpu_arch", "precision"), _no_bf16_on_volta),
    (("hardware", "strategy"), _one_process_on_mps),
    (("hardware", "strategy", "gpus_per_node", "num_nodes"), _single_means_one_gpu),
    (("strategy", "precision"), no_fp16_when_sharded),
    (("task", "model_size"), _image_model_size),
    (("task", "model_size"), _decoder_size),
    (("framework",), _framework_renders),
    (("task",), _model_of_the_task),
    (("task", "backbone"), _backbone_is_known),
    (("task", "backbone", "image_size"), _image_size_holds_the_stride),
    (("task", "init_from"), _init_from_holds_the_model),
    (("finetune", "init_from"), _lora_adapts_a_llama_folder),
    (("task", "model_size", "hardware", "host_memory_gb"), _fits_somewhere),
)


def partial_answers(values: Mapping[str, Any]) -> Answers:
    """An Answers record from typed values, the missing ones at their static defaults (the
    questionnaire plans with what has been answered so far)."""
    fields = {q.key: values.get(q.key, q.default) for q in QUESTION_BY_KEY.values()}
    fields["project_name"] = fields["project_name"] or "x"
    if fields["hardware"] != "cuda":
        fields.update(gpu_arch="none", gpus_per_node=1, num_nodes=1, gpu_memory_gb=0.0)
    return Answers(package_name="x", **fields)


def gains_nothing_on_one_process(answers: Answers) -> bool:
    """True for a multi-process strategy launched as one process: DDP has no peer to average
    with, and FSDP2 and ZeRO have none to shard over. ZeRO-3 with offload on a GPU still moves
    the model's state to host memory, which is what lets a model too large for one GPU train."""
    offloads = answers.strategy == "zero3-offload" and answers.hardware == "cuda"
    return answers.world_size == 1 and answers.strategy != "single" and not offloads
