"""Plan a run from the answers: refuse what cannot work, resolve `auto`, and choose the training
settings the memory model says fit, each decision with its reason.

Rules (seeds 000 §3, §5; 002 §4, §6): bf16 on Ampere or newer and on request on CPU, no
GradScaler; fp16 + GradScaler on Volta/Turing; fp32 on CPU by default (bf16 autocast measured
21-25% slower than fp32 on a 2-core CPU) and on MPS. The strategy is the first of single (or
DDP with several GPUs) -> FSDP2 -> ZeRO-3 with CPU offload whose estimate (`scaffold.memory`)
fits the usable share of device memory, with activation checkpointing only where nothing fits
without it; the micro-batch is the largest that fits, and gradient accumulation makes up the
batch of the model's recipe (`recipe_for`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scaffold.answers import QUESTION_BY_KEY, Answers, coerce, parse_model_size
from scaffold.errors import AnswerError, NotAvailableYet
from scaffold.memory import GIB, Estimate, estimate, gib
from scaffold.recipes import (
    GPT3_CONTEXT,
    SMALL_LM_RECIPE,
    Recipe,
    for_hardware,
    recipe_for,
    total_steps,
    within_accumulation,
)
from scaffold.renderable import FRAMEWORK_RENDERS, framework_renders
from scaffold.shapes import DecoderShape, ModelShape, cnn_for, decoder_for, largest_decoder

# Share of device memory a plan may fill: the seeds' "raise batch size until memory is ~85-90%
# used" (002 §6), the rest left to the CUDA context, the allocator's fragmentation and NCCL.
# On MPS, Metal's recommended working set is about 3/4 of unified memory
# (torch.mps.recommended_max_memory).
USABLE_FRACTION = {"cuda": 0.85, "cpu": 0.85, "mps": 0.75}
MAX_IMAGE_MODEL_PARAMS = 50_000_000  # the digits CNN beyond this only burns time
SHARDED_STRATEGIES = ("fsdp2", "zero1", "zero2", "zero3", "zero3-offload")
MODEL_STATE_BYTES = 16  # per parameter with AdamW: fp32 weights, gradients, two moments


@dataclass(frozen=True)
class Setting:
    """One value the plan writes into configs/train.toml (the vocabulary: data.py's
    NUM_CLASSES), and where it came from."""

    value: int | float | bool | str
    source: str

    def as_toml(self) -> str:
        """The value as a TOML literal (`2e-3`, `true`, `300_000`, `"bpe"`)."""
        if isinstance(self.value, str):
            return json.dumps(self.value)
        if isinstance(self.value, bool):
            return "true" if self.value else "false"
        if isinstance(self.value, float):
            mantissa, exponent = f"{self.value:.1e}".split("e")
            return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
        return f"{self.value:_}" if self.value >= 100_000 else str(self.value)

    def as_python(self) -> str:
        """The value as a Python literal (for config.py's defaults)."""
        return str(self.value) if isinstance(self.value, bool) else self.as_toml()


@dataclass(frozen=True)
class Decision:
    """How the plan resolved one answer: `key` is `value` because of `reason`. `source` is
    "answered" (the user's own value, kept) or "auto" (the planner chose it)."""

    key: str
    value: str
    reason: str
    source: str

    def line(self) -> str:
        """The decision as `scaffold plan` prints it: `key=value: reason`."""
        return f"{self.key}={self.value}: {self.reason}"


def as_answered(key: str, value: str) -> Decision:
    """The decision that keeps the user's own `value` for `key`."""
    return Decision(key, value, "as answered", "answered")


@dataclass(frozen=True)
class Plan:
    """The resolved answers, the training settings, the model's shape and the memory estimate
    of the chosen run, the decisions that resolved `precision` and `strategy`, and warnings.

    `usable` is the bytes of one device a plan may fill (0: the memory was not given).
    """

    answers: Answers
    settings: dict[str, Setting]
    shape: ModelShape
    estimate: Estimate
    usable: int
    precision: Decision
    strategy: Decision
    warnings: tuple[str, ...]

    @property
    def reasons(self) -> tuple[str, ...]:
        """One line per decision, in the order `scaffold plan` prints them: precision, the
        decoder's shape (where it follows a published one), strategy, then each setting."""
        shape = [self.shape.provenance()] if isinstance(self.shape, DecoderShape) else []
        settings = [f"{key}={s.as_toml()}: {s.source}" for key, s in self.settings.items()]
        return (self.precision.line(), *shape, self.strategy.line(), *settings)

    def copier_data(self) -> dict[str, Any]:
        """The template's data: the answers, and `plan` with each setting's TOML and Python
        literals and its source."""
        settings = {
            key: {"toml": s.as_toml(), "python": s.as_python(), "source": s.source}
            for key, s in self.settings.items()
        }
        return self.answers.to_copier_data() | {"plan": settings}

    def describe(self) -> list[str]:
        """The plan as `scaffold plan` prints it: the model as rendered, each decision with its
        reason, and the estimated bytes per device by component."""
        a, settings = self.answers, self.settings
        processes = f"{a.world_size} processes" if a.world_size > 1 else "one process"
        checkpointing = "on" if settings["activation_checkpointing"].value else "off"
        lines = [
            f"Plan for {a.task}, model_size={a.model_size}: {self.shape.params:,} parameters as "
            f"rendered ({self.shape.describe()})",
            *(f"  {reason}" for reason in self.reasons),
            *self._tokens_per_step(),
            f"Estimated memory per device ({a.precision}, {a.strategy} over {processes}, "
            f"micro-batch {settings['micro_batch_size'].value}, activation checkpointing "
            f"{checkpointing}), in GiB:",
        ]
        lines += [f"  {name:<12}{gib(count):>9}" for name, count in self.estimate.rows()]
        if self.usable:
            share = f"{USABLE_FRACTION[a.hardware]:.0%} of {_device_words(a)}"
            lines.append(f"  {'usable':<12}{gib(self.usable):>9}  ({share})")
        if self.estimate.host:
            lines.append(f"  {'host/node':<12}{gib(self.estimate.host):>9}  (offloaded state)")
        return lines

    def _tokens_per_step(self) -> list[str]:
        """For a decoder, the tokens one optimizer step trains on (the global batch times the
        context), as a line of `describe`."""
        if not isinstance(self.shape, DecoderShape):
            return []
        settings, world = self.settings, self.answers.world_size
        sequences = settings["micro_batch_size"].value * world
        sequences *= settings["grad_accum_steps"].value
        tokens = sequences * self.shape.block_size
        return [
            f"  one optimizer step: {sequences:,} sequences x {self.shape.block_size:,} tokens = "
            f"{tokens:,} tokens"
        ]

    def memory_verdict(self) -> str:
        """`memory_verdict` of this plan's estimate: '' when it fits."""
        return memory_verdict(self.answers, self.estimate)


def gains_nothing_on_one_process(answers: Answers) -> bool:
    """True for a multi-process strategy launched as one process: DDP has no peer to average
    with, and FSDP2 and ZeRO have none to shard over. ZeRO-3 with offload on a GPU still moves
    the model's state to host memory, which is what lets a model too large for one GPU train."""
    offloads = answers.strategy == "zero3-offload" and answers.hardware == "cuda"
    return answers.world_size == 1 and answers.strategy != "single" and not offloads


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


def plan(answers: Answers) -> Plan:
    """Check the answers, resolve `precision` and `strategy`, and plan the training settings.

    Raises:
        AnswerError: an impossible combination (see `check`), or a model whose state does not
            fit in all device and host memory together.
        NotAvailableYet: the planner's choice is a value this version cannot render yet, or a
            strategy or precision the chosen framework does not render (`FRAMEWORK_RENDERS`).
    """
    check(dataclasses.asdict(answers))
    warnings: list[str] = []
    precision = _precision(answers)
    if precision.value != "fp32" and answers.hardware == "mps":
        warnings.append(
            f"precision={precision.value} on MPS is untested here; start in fp32, switch once "
            "it trains"
        )
    recipe = hardware_recipe(answers)
    shape = model_shape(answers.task, answers.model_params, recipe)
    strategy, fit, fit_warnings = _choose_strategy(answers, precision.value, shape, recipe)
    if (
        precision.source == "auto"
        and precision.value == "fp16"
        and fit.strategy in SHARDED_STRATEGIES
    ):
        precision = Decision(  # fp16's loss scaling is not rendered for sharded strategies
            "precision",
            "fp32",
            f"Volta/Turing lack bf16, and this model needs strategy={fit.strategy}, for which "
            "fp16's loss scaling is not rendered",
            "auto",
        )
        strategy, fit, fit_warnings = _choose_strategy(answers, "fp32", shape, recipe)
    warnings += fit_warnings
    refuse_what_cannot_render(answers, strategy, precision)
    if fit.fits:  # else micro-batch 1 is no measure of the device: keep the recipe's batch
        recipe = within_accumulation(recipe, fit.micro_batch, answers.world_size)
    settings = _settings(answers, recipe, fit)
    settings |= _run_length(recipe, shape.params, fit.micro_batch, settings, answers.world_size)
    resolved = dataclasses.replace(answers, precision=precision.value, strategy=strategy.value)
    usable = usable_bytes(answers)
    return Plan(
        resolved, settings, shape, fit.estimate, usable, precision, strategy, tuple(warnings)
    )


def refuse_what_cannot_render(answers: Answers, strategy: Decision, precision: Decision) -> None:
    """Refuse the planner's own choices that the template does not render: fp16 when sharded,
    a strategy this version cannot render yet, a value the framework does not render (the
    answered values were refused by `check` already).

    Raises:
        AnswerError: fp16 with a sharded strategy (`_no_fp16_when_sharded`).
        AnswerError: the chosen strategy is not in `renderable.RENDERS`.
        NotAvailableYet: the chosen strategy or precision is not rendered by the framework.
    """
    _no_fp16_when_sharded({"strategy": strategy.value, "precision": precision.value})
    coerce(QUESTION_BY_KEY["strategy"], strategy.value)  # AnswerError if `RENDERS` lacks it
    framework = answers.framework
    for decision in (strategy, precision):
        if not framework_renders(framework, decision.key, decision.value):
            raise NotAvailableYet(
                f"{decision.key}=auto chose {decision.line()}; framework={framework} does not "
                f"render {decision.value} yet (it cannot be tested on CPU); answer "
                "framework=pytorch"
            )


# --- the checks that need no memory model: the questionnaire runs them on each answer ---


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


def _no_fp16_when_sharded(values: Mapping[str, Any]) -> None:
    if values["strategy"] in SHARDED_STRATEGIES and values["precision"] == "fp16":
        raise AnswerError(
            f"precision=fp16 with strategy={values['strategy']} needs sharded loss scaling, "
            "which this template does not render; answer precision=bf16 or fp32 (or strategy=ddp)"
        )


def _image_model_size(values: Mapping[str, Any]) -> None:
    size = values["model_size"]
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
    _check_capacity(answers, model_shape(answers.task, answers.model_params, recipe))


RULES: tuple[tuple[tuple[str, ...], Callable[[Mapping[str, Any]], None]], ...] = (
    (("hardware", "gpu_arch"), _cuda_needs_an_architecture),
    (("hardware", "gpu_memory_gb"), _cuda_needs_its_memory),
    (("hardware", "precision"), _no_fp16_on_cpu),
    (("gpu_arch", "precision"), _no_bf16_on_volta),
    (("hardware", "strategy"), _one_process_on_mps),
    (("hardware", "strategy", "gpus_per_node", "num_nodes"), _single_means_one_gpu),
    (("strategy", "precision"), _no_fp16_when_sharded),
    (("task", "model_size"), _image_model_size),
    (("task", "model_size"), _decoder_size),
    (("framework",), _framework_renders),
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


# --- sizes, memory and recipes ---


def model_shape(task: str, params: int, recipe: Recipe) -> ModelShape:
    """The example model of `task` that `model_size` renders (for the language model, at the
    recipe's context and vocabulary)."""
    if task == "image-classification":
        return cnn_for(params)
    return decoder_for(params, recipe.block_size, recipe.vocab_size)


def hardware_recipe(answers: Answers) -> Recipe:
    """The recipe of the answered model size (`recipe_for`), as the answered hardware can train
    it (`for_hardware`: on CPU and MPS, the example's context and batch)."""
    recipe = recipe_for(answers.task, answers.model_params)
    return for_hardware(recipe, answers.hardware, answers.model_params)


def usable_bytes(answers: Answers) -> int:
    """Bytes of one device a plan may fill: the usable share of one GPU, or of host memory on
    CPU and MPS; 0 when the memory was not given."""
    memory = answers.gpu_memory_gb if answers.hardware == "cuda" else answers.host_memory_gb
    return int(memory * GIB * USABLE_FRACTION[answers.hardware])


def _host_usable(answers: Answers) -> int:
    return int(answers.host_memory_gb * GIB * USABLE_FRACTION["cpu"])


def _check_capacity(answers: Answers, shape: ModelShape) -> None:
    """Refuse a model whose state (16 bytes per parameter) exceeds all usable device and host
    memory together: no strategy, not even offload, can train it."""
    devices = answers.world_size if answers.hardware == "cuda" else 1
    device_total = devices * usable_bytes(answers)
    host_total = answers.num_nodes * _host_usable(answers) if answers.hardware == "cuda" else 0
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


@dataclass(frozen=True)
class Fit:
    """A strategy with the micro-batch and checkpointing that fit, and their estimate."""

    strategy: str
    micro_batch: int
    checkpointing: bool
    estimate: Estimate
    fits: bool


def _per_process(recipe: Recipe, world: int) -> int:
    return recipe.sequences if recipe.per_process else math.ceil(recipe.sequences / world)


def fit(answers: Answers, strategy: str, precision: str, shape: ModelShape, recipe: Recipe) -> Fit:
    """The largest micro-batch (a divisor of the recipe's batch per process, so accumulation
    makes it up exactly) that fits `usable_bytes` with `strategy`, without activation
    checkpointing if any does, else with it; micro-batch 1 with checkpointing and `fits` False
    when nothing does. Offload must also fit each node's host memory."""
    world = answers.world_size
    per_process = _per_process(recipe, world)
    usable, host = usable_bytes(answers), _host_usable(answers)
    candidates = [size for size in range(per_process, 0, -1) if per_process % size == 0]
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


def strategy_ladder(answers: Answers) -> tuple[str, ...]:
    """The strategies `auto` tries, least sharding first."""
    if answers.hardware != "cuda":
        return ("single",)
    return (
        ("single", "zero3-offload")
        if answers.world_size == 1
        else ("ddp", "fsdp2", "zero3-offload")
    )


def _choose_strategy(
    answers: Answers, precision: str, shape: ModelShape, recipe: Recipe
) -> tuple[Decision, Fit, list[str]]:
    """The strategy (as answered, or the first of `strategy_ladder` that fits), its fit at
    `precision`, and warnings: a strategy that adds nothing or does not fit."""
    warnings: list[str] = []
    usable = usable_bytes(answers)
    where = _device_words(answers)
    if answers.strategy != "auto":
        chosen = fit(answers, answers.strategy, precision, shape, recipe)
        if gains_nothing_on_one_process(answers):
            warnings.append(
                f"strategy={answers.strategy} with one process adds nothing on its own; launch "
                "with NPROC_PER_NODE=N bash launch/torchrun.sh (on CPU it runs gloo)"
            )
        if not chosen.fits:
            verdict = memory_verdict(answers, chosen.estimate)
            verdict = verdict if verdict.startswith(("does", "may")) else f"is {verdict}"
            warnings.append(
                f"strategy={answers.strategy} {verdict}: even at micro-batch 1 with activation "
                f"checkpointing, {_why_not(answers, chosen)} (usable: "
                f"{gib(usable)} GiB of {where}){_auto_would(answers, precision, shape, recipe)}"
            )
        return as_answered("strategy", answers.strategy), chosen, warnings
    tried: list[str] = []
    for strategy in strategy_ladder(answers):
        chosen = fit(answers, strategy, precision, shape, recipe)
        if chosen.fits:
            break
        tried.append(_why_not(answers, chosen))
    else:
        warnings.append(
            f"no strategy fits even at micro-batch 1 with activation checkpointing "
            f"({'; '.join(tried)}); the run may run out of memory"
        )
    others = tried if chosen.fits else tried[:-1]  # the chosen one's own says why it does not
    reason = _strategy_reason(answers, chosen, shape, others, usable, where)
    return Decision("strategy", chosen.strategy, reason, "auto"), chosen, warnings


def _why_not(answers: Answers, chosen: Fit) -> str:
    """Why `chosen` (which does not fit) does not: its device peak, or offload's host memory."""
    peak, host = chosen.estimate.peak, chosen.estimate.host
    if peak <= usable_bytes(answers) and host > _host_usable(answers):
        return (
            f"{chosen.strategy} needs ~{gib(host)} GiB of host memory per node, more than the "
            f"{gib(_host_usable(answers))} usable of {answers.host_memory_gb:g} GiB"
        )
    return f"{chosen.strategy} needs ~{gib(peak)} GiB per device at micro-batch 1"


def _auto_would(answers: Answers, precision: str, shape: ModelShape, recipe: Recipe) -> str:
    """What `strategy=auto` would choose instead, worded for a warning; '' when that choice
    would be refused too."""
    auto = dataclasses.replace(answers, strategy="auto")
    strategy, _, _ = _choose_strategy(auto, precision, shape, recipe)
    try:
        refuse_what_cannot_render(auto, strategy, as_answered("precision", precision))
    except AnswerError:
        return ""
    return f"; strategy=auto would choose {strategy.value}"


def _device_words(answers: Answers) -> str:
    if answers.hardware == "cuda":
        return f"one {answers.gpu_memory_gb:g} GiB GPU"
    return f"{answers.host_memory_gb:g} GiB of {answers.hardware.upper()} memory"


def _strategy_reason(
    answers: Answers, chosen: Fit, shape: ModelShape, tried: list[str], usable: int, where: str
) -> str:
    state = MODEL_STATE_BYTES * shape.params
    if usable == 0:
        memory = "GPU" if answers.hardware == "cuda" else "host"
        detail = f"{memory} memory not given, so fit is not checked (answer it to plan for it)"
        many = chosen.strategy == "ddp"
        return (f"replicate over {answers.world_size} GPUs; " if many else "") + detail
    fits = f"~{gib(chosen.estimate.peak)} GiB per device fits {gib(usable)} GiB usable of {where}"
    fits = fits if chosen.fits else f"it does not fit either: {_why_not(answers, chosen)}"
    passed = f" ({'; '.join(tried)})" if tried else ""
    if chosen.strategy == "single":
        return f"one device, and the model fits on it: {fits}"
    if chosen.strategy == "ddp":
        return f"the model fits on one GPU ({fits}); replicate over {answers.world_size} GPUs"
    if chosen.strategy == "fsdp2":
        return (
            f"model state (~{gib(state)} GiB at {MODEL_STATE_BYTES} B/parameter) does not "
            f"fit one GPU{passed}; shard it over {answers.world_size} GPUs: {fits}"
        )
    gpus = "the GPU" if answers.world_size == 1 else f"{answers.world_size} GPUs, even sharded"
    return (
        f"model state (~{gib(state)} GiB) does not fit {gpus}{passed}; shard it and keep "
        f"the optimizer state and parameters in CPU memory (~{gib(chosen.estimate.host)} GiB "
        f"per node): {fits}"
    )


def _settings(answers: Answers, recipe: Recipe, chosen: Fit) -> dict[str, Setting]:
    world = answers.world_size
    per_process = _per_process(recipe, world)
    accumulation = per_process // chosen.micro_batch
    usable = usable_bytes(answers)
    unit = "sequences" if recipe.block_size else "images"

    def of_recipe(what: str) -> str:
        return f"{recipe.name}'s {what} ({recipe.citation})"

    settings: dict[str, Setting] = {}
    if recipe.block_size:
        settings["block_size"] = Setting(
            recipe.block_size, recipe.note("block_size", of_recipe("context"))
        )
        corpus = (
            "the example's corpus"
            if recipe.corpus_bytes == SMALL_LM_RECIPE.corpus_bytes
            else "all of the stdlib's source; prepare a corpus this model deserves into data_dir"
        )
        settings["corpus_bytes"] = Setting(recipe.corpus_bytes, corpus)
        tokenizer, vocabulary = _tokenizer_sources(recipe)
        settings["tokenizer"] = Setting(recipe.tokenizer, recipe.note("tokenizer", tokenizer))
        settings["vocab_size"] = Setting(recipe.vocab_size, vocabulary)
    peak = f"~{gib(chosen.estimate.peak)} of {gib(usable)} GiB usable per device"
    if not usable:
        micro = f"the whole {per_process} {unit} per process (memory not given: not checked)"
    elif chosen.fits:
        micro = f"the largest divisor of the {per_process} {unit} per process that fits: {peak}"
    else:
        micro = f"the smallest, and still too much ({_why_not(answers, chosen)}): see the warning"
    settings["micro_batch_size"] = Setting(chosen.micro_batch, micro)
    total = chosen.micro_batch * accumulation * world
    settings["grad_accum_steps"] = Setting(
        accumulation,
        f"{chosen.micro_batch} x {accumulation} x {world} process(es) = {total} {unit} per "
        f"optimizer step, {recipe.note('grad_accum_steps', recipe.batch)}",
    )
    settings["lr"] = Setting(recipe.lr, recipe.note("lr", of_recipe("peak learning rate")))
    settings["warmup_steps"] = _warmup(recipe, total)
    if not usable:
        checkpointing = "off: memory not given, so nothing says it is needed"
    elif chosen.checkpointing:
        checkpointing = "on: no micro-batch fits without it"
    else:
        checkpointing = "off: the plan fits without recomputing activations"
    settings["activation_checkpointing"] = Setting(chosen.checkpointing, checkpointing)
    return settings


# Compute-optimal training sees ~20 tokens per parameter (Hoffmann et al. 2022, "Training
# Compute-Optimal Large Language Models", Table 3).
TOKENS_PER_PARAMETER = 20
VALIDATIONS_PER_RUN = 20
# Tokens a validation pass reads: about nanoGPT's GPT-2 evaluation (eval_iters 200 x batch 12 x
# 1024 tokens = 2.5M), enough for a loss estimate whose noise is far below the differences
# early stopping and best-checkpoint selection act on.
VALIDATION_TOKENS = 2**21


def _run_length(
    recipe: Recipe, params: int, micro_batch: int, settings: dict[str, Setting], world: int
) -> dict[str, Setting]:
    """How long the run is and how often it validates: for the language model, a budget of
    TOKENS_PER_PARAMETER tokens per parameter (`max_tokens`; the run also ends after `epochs`
    passes over a corpus that holds fewer), VALIDATIONS_PER_RUN validations over it
    (`val_every`) of about VALIDATION_TOKENS each (`val_batches`); the digits CNN validates
    its whole split at each epoch's end."""
    if not recipe.block_size:
        return {
            "val_every": Setting(0, "at each epoch's end: the example's epochs are short"),
            "val_batches": Setting(0, "the whole validation split at each validation"),
        }
    sequences = micro_batch * settings["grad_accum_steps"].value * world
    tokens = _two_digits(TOKENS_PER_PARAMETER * params)
    steps = math.ceil(tokens / (sequences * recipe.block_size))
    every = max(1, _two_digits(steps / VALIDATIONS_PER_RUN))
    batches = math.ceil(VALIDATION_TOKENS / (micro_batch * recipe.block_size * world))
    return {
        "max_tokens": Setting(
            tokens,
            f"~{TOKENS_PER_PARAMETER} tokens per parameter of the {params:,} rendered, "
            f"compute-optimal (Hoffmann et al. 2022): {steps:,} optimizer steps; a smaller "
            "corpus ends the run at `epochs` passes instead",
        ),
        "val_every": Setting(
            every, f"~{VALIDATIONS_PER_RUN} validations over the {steps:,} steps of max_tokens"
        ),
        "val_batches": Setting(
            batches,
            f"~{VALIDATION_TOKENS / 2**20:g}M tokens a validation, as nanoGPT's GPT-2 "
            "evaluation (200 x 12 x 1024); a smaller validation split is read whole",
        ),
    }


def _two_digits(value: float) -> int:
    """`value` rounded to two significant digits, as a whole number (2_186_260 -> 2_200_000)."""
    return int(float(f"{value:.2g}"))


def _tokenizer_sources(recipe: Recipe) -> tuple[str, str]:
    """Where the recipe's tokenizer and vocabulary size come from, in words."""
    if recipe.tokenizer == "bytes":
        return (
            "the example's byte tokens: a decoder this small spends its parameters on blocks",
            '256 byte values and end-of-text (tokenizer = "bytes")',
        )
    return (
        f"a byte-level BPE trained on the corpus by prepare, as {recipe.name}'s was "
        "(GPT-2's tokenizer, Radford et al. 2019)",
        "GPT-2's 50,257 BPE tokens padded to a multiple of 64",
    )


def _warmup(recipe: Recipe, sequences_per_step: int) -> Setting:
    """The recipe's warmup; GPT-3's (375M tokens) only while it is at most a tenth of the
    planned run (its epochs over its corpus), else a tenth of that run."""
    if not recipe.name.startswith("GPT-3"):
        return Setting(recipe.warmup_steps, f"{recipe.name}'s warmup ({recipe.citation})")
    gpt3 = "GPT-3's warmup over 375M tokens (Brown et al. 2020, Appendix B)"
    steps = total_steps(recipe, sequences_per_step)
    if recipe.warmup_steps <= steps // 10:
        return Setting(recipe.warmup_steps, gpt3)
    return Setting(
        max(1, steps // 10),
        f"a tenth of the ~{steps} optimizer steps the planned corpus gives; {gpt3} would be "
        f"{recipe.warmup_steps} steps: set that with a corpus of your own",
    )


def _precision(answers: Answers) -> Decision:
    """The precision: as answered, or auto's choice for the hardware and framework."""
    hardware, arch, asked = answers.hardware, answers.gpu_arch, answers.precision
    if asked != "auto":
        return as_answered("precision", asked)
    if hardware == "cuda" and arch in ("ampere", "hopper"):
        value, reason = "bf16", f"{arch} GPUs run bf16 natively; no GradScaler needed"
    elif hardware == "cuda" and not framework_renders(answers.framework, "precision", "fp16"):
        value = "fp32"
        reason = f"Volta/Turing lack bf16, and framework={answers.framework} does not render fp16"
    elif hardware == "cuda":
        value, reason = "fp16", "Volta/Turing lack bf16; fp16 autocast + GradScaler"
    elif hardware == "mps":
        value, reason = "fp32", "on MPS, fp32 first (16-bit autocast is not stable on every op)"
    else:
        value, reason = "fp32", "bf16 autocast is slower than fp32 on CPU"
    return Decision("precision", value, reason, "auto")
