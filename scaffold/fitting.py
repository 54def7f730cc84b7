"""How a run fits in memory: the model a size renders, the bytes of a device a plan may fill,
and the largest micro-batch (with activation checkpointing only where nothing fits without
it) whose estimate (`scaffold.memory`) fits them, for one strategy at one precision.

Rules (seeds 002 §4, §6): fill a device to ~85-90% and leave the rest to the CUDA context, the
allocator's fragmentation and NCCL; the micro-batch divides the recipe's batch per process, so
gradient accumulation makes it up exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scaffold.answers import Answers
from scaffold.backbones import backbone_shape
from scaffold.errors import AnswerError
from scaffold.memory import GIB, Estimate, estimate, gib
from scaffold.recipes import Recipe, backbone_recipe, for_hardware, recipe_for
from scaffold.shapes import ModelShape, cnn_for, decoder_for

# Share of device memory a plan may fill: the seeds' "raise batch size until memory is ~85-90%
# used" (002 §6), the rest left to the CUDA context, the allocator's fragmentation and NCCL.
# On MPS, Metal's recommended working set is about 3/4 of unified memory
# (torch.mps.recommended_max_memory).
USABLE_FRACTION = {"cuda": 0.85, "cpu": 0.85, "mps": 0.75}


MODEL_STATE_BYTES = 16  # per parameter with AdamW: fp32 weights, gradients, two moments


SHARDED_STRATEGIES = ("fsdp2", "zero1", "zero2", "zero3", "zero3-offload")

# The classes a backbone's head is planned for: ImageNet's 1,000, more than most datasets have
# (the prepared data's decide the real head at start; it is ~2M of a ResNet-50's 25M).
PLANNED_CLASSES = 1000


def model_shape(answers: Answers, recipe: Recipe) -> ModelShape:
    """The model the answers render: a timm backbone at the answered image size (its head
    planned for PLANNED_CLASSES), or the example model of the task that `model_size` renders
    (for the language model, at the recipe's context and vocabulary)."""
    if answers.task == "image-classification" and answers.backbone:
        return backbone_shape(answers.backbone, answers.image_size, PLANNED_CLASSES)
    if answers.task == "image-classification":
        return cnn_for(answers.model_params)
    return decoder_for(answers.model_params, recipe.block_size, recipe.vocab_size)


def hardware_recipe(answers: Answers) -> Recipe:
    """The recipe of the answered model size (`recipe_for`), as the answered hardware can train
    it (`for_hardware`: on CPU and MPS, the example's context and batch)."""
    if answers.model_family == "timm":
        return backbone_recipe(bool(answers.init_from), answers.world_size).recipe
    recipe = recipe_for(answers.task, answers.model_params)
    return for_hardware(recipe, answers.hardware, answers.model_params)


def usable_bytes(answers: Answers) -> int:
    """Bytes of one device a plan may fill: the usable share of one GPU, or of host memory on
    CPU and MPS; 0 when the memory was not given."""
    memory = answers.gpu_memory_gb if answers.hardware == "cuda" else answers.host_memory_gb
    return int(memory * GIB * USABLE_FRACTION[answers.hardware])


def host_usable(answers: Answers) -> int:
    return int(answers.host_memory_gb * GIB * USABLE_FRACTION["cpu"])


def check_capacity(answers: Answers, shape: ModelShape) -> None:
    """Refuse a model whose state (16 bytes per parameter) exceeds all usable device and host
    memory together: no strategy, not even offload, can train it."""
    devices = answers.world_size if answers.hardware == "cuda" else 1
    device_total = devices * usable_bytes(answers)
    host_total = answers.num_nodes * host_usable(answers) if answers.hardware == "cuda" else 0
    if device_total == 0 or (answers.hardware == "cuda" and host_total == 0):
        return  # a memory size was not given: nothing to compare with
    needed = MODEL_STATE_BYTES * shape.params
    if needed > device_total + host_total:
        where = (
            f"{devices} x {answers.gpu_memory_gb:g} GiB GPUs and {answers.num_nodes} x "
            f"{answers.host_memory_gb:g} GiB of host memory"
            if answers.hardware == "cuda"
            else f"{answers.host_memory_gb:g} GiB of {answers.hardware.upper()} memory"
        )
        raise AnswerError(
            f"model_size={answers.model_size} needs ~{gib(needed)} GiB of model state "
            f"({MODEL_STATE_BYTES} bytes per parameter with AdamW), more than the usable "
            f"{gib(device_total + host_total)} GiB of {where}; answer a smaller model_size, "
            + ("more GPUs or more nodes" if answers.hardware == "cuda" else "or hardware=cuda")
        )


def memory_verdict(answers: Answers, estimate: Estimate) -> str:
    """'' when `estimate` fits the usable memory, or no memory was given. Else, since a plan
    that does not fit is already at micro-batch 1 with activation checkpointing: "does not
    fit" when it needs more than the device's whole memory ("short of host memory":
    offloading, the node's), and "may run out of memory" when it needs only part of the
    reserve that `usable_bytes` leaves (`USABLE_FRACTION`: the CUDA context, fragmentation,
    NCCL), a close call."""
    device = usable_bytes(answers)
    host = answers.host_memory_gb * GIB if answers.hardware == "cuda" else 0
    for needed, usable, whole, verdicts in (
        (
            estimate.peak,
            device,
            device / USABLE_FRACTION[answers.hardware],
            ("does not fit", "may run out of memory"),
        ),
        (
            estimate.host,
            host * USABLE_FRACTION["cpu"],
            host,
            ("short of host memory", "may run out of host memory"),
        ),
    ):
        if usable and needed > usable:
            return verdicts[0] if needed > whole else verdicts[1]
    return ""


@dataclass(frozen=True)
class Fit:
    """A strategy with the micro-batch and checkpointing that fit, and their estimate."""

    strategy: str
    micro_batch: int
    checkpointing: bool
    estimate: Estimate
    fits: bool


def sequences_per_process(recipe: Recipe, world: int) -> int:
    """The recipe's batch one of `world` processes takes: all of it for a per-process recipe
    (the examples'), else its share, rounded up (samples per optimizer step)."""
    return recipe.sequences if recipe.per_process else math.ceil(recipe.sequences / world)


def micro_batch_candidates(per_process: int) -> list[int]:
    """The micro-batches a plan may split `per_process` samples per optimizer step into: its
    divisors, largest first, so gradient accumulation makes the batch up exactly. A rendered
    project's resume on another world size splits the same way
    (`checkpoint/world_size.py:split_global_batch`; tests/test_shapes.py holds the two equal)."""
    return [size for size in range(per_process, 0, -1) if per_process % size == 0]


def fit(answers: Answers, strategy: str, precision: str, shape: ModelShape, recipe: Recipe) -> Fit:
    """The largest micro-batch (a divisor of the recipe's batch per process, so accumulation
    makes it up exactly) that fits `usable_bytes` with `strategy`, without activation
    checkpointing if any does, else with it; micro-batch 1 with checkpointing and `fits` False
    when nothing does. Offload must also fit each node's host memory."""
    world = answers.world_size
    per_process = sequences_per_process(recipe, world)
    usable, host = usable_bytes(answers), host_usable(answers)
    candidates = micro_batch_candidates(per_process)
    dropout = 0.0 if answers.task == "language-model" else 0.1  # the examples' dropout

    def run(micro_batch: int, checkpointing: bool) -> Estimate:
        return estimate(
            shape,
            strategy=strategy,
            precision=precision,
            world_size=world,
            micro_batch=micro_batch,
            checkpointing=checkpointing,
            dropout=dropout,
            processes_per_node=answers.gpus_per_node,
        )

    if usable == 0:
        return Fit(strategy, per_process, False, run(per_process, False), True)
    for checkpointing in (False, True):
        for micro_batch in candidates:
            result = run(micro_batch, checkpointing)
            if result.peak <= usable and (host == 0 or result.host <= host):
                return Fit(strategy, micro_batch, checkpointing, result, True)
    return Fit(strategy, 1, True, run(1, True), False)


def why_not(answers: Answers, chosen: Fit) -> str:
    """Why `chosen` (which does not fit) does not: its device peak, or offload's host memory."""
    peak, host = chosen.estimate.peak, chosen.estimate.host
    if peak <= usable_bytes(answers) and host > host_usable(answers):
        return (
            f"{chosen.strategy} needs ~{gib(host)} GiB of host memory per node, more than the "
            f"{gib(host_usable(answers))} usable of {answers.host_memory_gb:g} GiB"
        )
    return f"{chosen.strategy} needs ~{gib(peak)} GiB per device at micro-batch 1"


def device_words(answers: Answers) -> str:
    """The memory a plan fills, in words: "one 80 GiB GPU", "16 GiB of CPU memory"."""
    if answers.hardware == "cuda":
        return f"one {answers.gpu_memory_gb:g} GiB GPU"
    return f"{answers.host_memory_gb:g} GiB of {answers.hardware.upper()} memory"
