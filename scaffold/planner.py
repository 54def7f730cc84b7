"""Resolve `auto` answers and refuse impossible combinations, each decision with its reason.

Rules (seeds 000 §3, §5; 002 §4): bf16 on Ampere or newer and on request on CPU, no GradScaler;
fp16 + GradScaler on Volta/Turing; fp32 on CPU by default (bf16 autocast measured 21-25% slower
than fp32 on a 2-core CPU) and on MPS. Fits on one device -> single (or DDP with more GPUs);
does not fit -> FSDP2; does not fit even sharded over every GPU -> ZeRO-3 with CPU offload.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from scaffold.answers import (
    FRAMEWORK_RENDERS,
    QUESTION_BY_KEY,
    Answers,
    coerce,
    framework_renders,
)
from scaffold.errors import AnswerError, NotAvailableYet

# Training memory per parameter with AdamW and fp32 master weights: 4 (weights) + 4 (grads)
# + 8 (two moments) bytes; activations come on top (ZeRO paper, Rajbhandari et al. 2020, §3).
BYTES_PER_PARAM = 16
USABLE_GPU_FRACTION = 0.6  # room left for activations, the CUDA context and fragmentation
MAX_IMAGE_MODEL_PARAMS = 50_000_000  # the digits CNN beyond this only burns time
SHARDED_STRATEGIES = ("fsdp2", "zero1", "zero2", "zero3", "zero3-offload")


@dataclass(frozen=True)
class Plan:
    """Resolved answers and one line per decision or warning."""

    answers: Answers
    reasons: tuple[str, ...]
    warnings: tuple[str, ...]


def plan(answers: Answers) -> Plan:
    """Resolve `precision` and `strategy` from the hardware and model size.

    Raises:
        AnswerError: an impossible combination (fp16 on CPU, bf16 on Volta/Turing, a CUDA
            project without its GPU architecture, a model too large for the example task).
        NotAvailableYet: the planner's choice is a value this version cannot render yet, or a
            strategy or precision the chosen framework does not render (`FRAMEWORK_RENDERS`).
    """
    reasons: list[str] = []
    warnings: list[str] = []
    _check_model_size(answers)
    precision = _precision(answers, reasons)
    strategy = _strategy(answers, reasons, warnings)
    if strategy in SHARDED_STRATEGIES and precision == "fp16":
        raise AnswerError(
            f"precision=fp16 with strategy={strategy} needs sharded loss scaling, which this "
            "template does not render; answer precision=bf16 or fp32 (or strategy=ddp)"
        )
    coerce(QUESTION_BY_KEY["strategy"], strategy)  # NotAvailableYet if not rendered yet
    _check_framework(answers, strategy, precision, reasons)
    resolved = dataclasses.replace(answers, precision=precision, strategy=strategy)
    return Plan(resolved, tuple(reasons), tuple(warnings))


def _check_framework(answers: Answers, strategy: str, precision: str, reasons: list[str]) -> None:
    framework = answers.framework
    for key, value in (("strategy", strategy), ("precision", precision)):
        if framework_renders(framework, key, value):
            continue
        rendered = " or ".join(FRAMEWORK_RENDERS[framework][key])
        if getattr(answers, key) == "auto":  # the planner's choice: say why, and what would fit
            why = next(reason for reason in reasons if reason.startswith(f"{key}={value}:"))
            raise NotAvailableYet(
                f"{key}=auto chose {why}; framework={framework} does not render {value} yet "
                f"(it cannot be tested on CPU); answer framework=pytorch"
            )
        raise NotAvailableYet(
            f"framework={framework} with {key}={value} is not available yet (it cannot be "
            f"tested on CPU); answer {key}={rendered}, or framework=pytorch for {value}"
        )


def _check_model_size(answers: Answers) -> None:
    if answers.task == "image-classification" and answers.model_params > MAX_IMAGE_MODEL_PARAMS:
        raise AnswerError(
            f"model_size={answers.model_size} is too large for the 8x8-digits example model; "
            "answer at most 50M, or task=language-model"
        )


def _precision(answers: Answers, reasons: list[str]) -> str:
    hardware, arch, asked = answers.hardware, answers.gpu_arch, answers.precision
    if hardware == "cuda" and arch == "none":
        raise AnswerError(
            "hardware=cuda needs the GPU architecture; "
            "answer gpu_arch=hopper, ampere or volta-turing"
        )
    if asked == "fp16" and hardware == "cpu":
        raise AnswerError(
            "precision=fp16 on CPU gains nothing and needs loss scaling; answer bf16 or fp32"
        )
    if asked == "bf16" and arch == "volta-turing":
        fp16_renders = framework_renders(answers.framework, "precision", "fp16")
        others = "fp16 or fp32" if fp16_renders else "fp32"
        raise AnswerError(
            f"precision=bf16 is not supported in hardware on Volta/Turing GPUs; answer {others}"
        )
    if asked != "auto":
        reasons.append(f"precision={asked}: as answered")
        return asked
    if hardware == "cuda" and arch in ("ampere", "hopper"):
        reasons.append(f"precision=bf16: {arch} GPUs run bf16 natively; no GradScaler needed")
        return "bf16"
    if hardware == "cuda" and not framework_renders(answers.framework, "precision", "fp16"):
        reasons.append(
            f"precision=fp32: Volta/Turing lack bf16, and framework={answers.framework} does "
            "not render fp16"
        )
        return "fp32"
    if hardware == "cuda":
        reasons.append("precision=fp16: Volta/Turing lack bf16; fp16 autocast + GradScaler")
        return "fp16"
    reasons.append(f"precision=fp32: bf16 autocast is slower than fp32 on {hardware.upper()}")
    return "fp32"


def _strategy(answers: Answers, reasons: list[str], warnings: list[str]) -> str:
    world = answers.world_size
    needed_gb = answers.model_params * BYTES_PER_PARAM / 2**30
    fits = (
        answers.hardware != "cuda"
        or answers.gpu_memory_gb == 0
        or (needed_gb <= USABLE_GPU_FRACTION * answers.gpu_memory_gb)
    )
    if answers.strategy != "auto":
        if answers.strategy == "single" and world > 1:
            raise AnswerError(
                f"strategy=single uses one device but {world} GPUs were answered; "
                "answer gpus_per_node=1 and num_nodes=1, or strategy=ddp"
            )
        if answers.strategy != "single" and world == 1:
            warnings.append(
                f"strategy={answers.strategy} with one process adds nothing on its own; launch "
                "with NPROC_PER_NODE=N bash launch/torchrun.sh (on CPU it runs gloo)"
            )
        if not fits:
            warnings.append(
                f"model state needs ~{needed_gb:.1f} GB with AdamW; one "
                f"{answers.gpu_memory_gb:g} GB GPU may run out of memory"
            )
        reasons.append(f"strategy={answers.strategy}: as answered")
        return answers.strategy
    if world == 1 and fits:
        reasons.append("strategy=single: one device, and the model state fits on it")
        return "single"
    if fits:
        reasons.append(f"strategy=ddp: the model fits on one GPU; replicate over {world} GPUs")
        return "ddp"
    if needed_gb > USABLE_GPU_FRACTION * answers.gpu_memory_gb * world:
        reasons.append(
            f"strategy=zero3-offload: model state (~{needed_gb:.1f} GB) exceeds "
            f"{USABLE_GPU_FRACTION:.0%} of all {world} GPUs together; shard it and keep the "
            "optimizer state and parameters in CPU memory"
        )
        return "zero3-offload"
    reasons.append(
        f"strategy=fsdp2: model state (~{needed_gb:.1f} GB) exceeds "
        f"{USABLE_GPU_FRACTION:.0%} of one {answers.gpu_memory_gb:g} GB GPU; shard it"
    )
    return "fsdp2"
