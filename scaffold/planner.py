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
from dataclasses import dataclass, field
from typing import Any

from scaffold.answer_rules import check, gains_nothing_on_one_process, no_fp16_when_sharded
from scaffold.answers import QUESTION_BY_KEY, Answers, coerce
from scaffold.backbones import BackboneShape
from scaffold.errors import AnswerError, NotAvailableYet
from scaffold.fitting import (
    MODEL_STATE_BYTES,
    SHARDED_STRATEGIES,
    USABLE_FRACTION,
    Fit,
    device_words,
    fit,
    hardware_recipe,
    host_usable,
    memory_verdict,
    model_shape,
    sequences_per_process,
    usable_bytes,
    why_not,
)
from scaffold.hub_folder import HubDecoderShape, read_hub_folder
from scaffold.memory import Estimate, estimate, gib
from scaffold.recipes import (
    SMALL_LM_RECIPE,
    Recipe,
    backbone_recipe,
    total_steps,
    within_accumulation,
)
from scaffold.renderable import framework_renders
from scaffold.shapes import DecoderShape, ModelShape


@dataclass(frozen=True)
class Setting:
    """One value the plan writes into configs/train.toml (the vocabulary: data.py's
    PLANNED_VOCABULARY), and where it came from."""

    value: int | float | bool | str
    source: str

    def as_toml(self) -> str:
        """The value as a TOML literal (`2e-3`, `32.0`, `true`, `300_000`, `"bpe"`)."""
        if isinstance(self.value, str):
            return json.dumps(self.value)
        if isinstance(self.value, bool):
            return "true" if self.value else "false"
        if isinstance(self.value, float) and self.value.is_integer() and 1 <= self.value < 1e5:
            return f"{self.value:.1f}"  # a whole scale, 32.0
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
        described = isinstance(self.shape, DecoderShape | BackboneShape)
        shape = [self.shape.provenance()] if described else []
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
        model = (
            f"backbone={a.backbone}" if a.model_family == "timm" else f"model_size={a.model_size}"
        )
        lines = [
            f"Plan for {a.task}, {model}: {self.shape.params:,} parameters as rendered "
            f"({self.shape.describe()})",
            *(f"  {reason}" for reason in self.reasons),
            *self._tokens_per_step(),
            f"Estimated memory per device ({a.precision}, {a.strategy} over {processes}, "
            f"micro-batch {settings['micro_batch_size'].value}, activation checkpointing "
            f"{checkpointing}), in GiB:",
        ]
        lines += [f"  {name:<12}{gib(count):>9}" for name, count in self.estimate.rows()]
        if self.usable:
            share = f"{USABLE_FRACTION[a.hardware]:.0%} of {device_words(a)}"
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
    shape = model_shape(answers, recipe)
    if answers.init_from and answers.task == "language-model":
        shape = read_hub_folder(answers.init_from, recipe.block_size)
        recipe = continued_training(recipe, shape)
    search = StrategySearch(answers, precision.value, shape, recipe)
    strategy, chosen, fit_warnings = _choose_strategy(search)
    if (
        precision.source == "auto"
        and precision.value == "fp16"
        and chosen.strategy in SHARDED_STRATEGIES
    ):
        precision = Decision(  # fp16's loss scaling is not rendered for sharded strategies
            "precision",
            "fp32",
            f"Volta/Turing lack bf16, and this model needs strategy={chosen.strategy}, for which "
            "fp16's loss scaling is not rendered",
            "auto",
        )
        search = StrategySearch(answers, "fp32", shape, recipe)  # other fits at fp32
        strategy, chosen, fit_warnings = _choose_strategy(search)
    warnings += fit_warnings
    refuse_what_cannot_render(answers, strategy, precision)
    if chosen.fits:  # else micro-batch 1 is no measure of the device: keep the recipe's batch
        recipe = within_accumulation(recipe, chosen.micro_batch, answers.world_size)
    settings = _settings(answers, recipe, chosen)
    if recipe.block_size:
        finetune, lora = _finetune(answers, shape, chosen, precision.value)
        settings |= finetune
        if lora is not None:  # LoRA's estimate stands; where it fits, no warning of a misfit
            fits = not usable_bytes(answers) or lora.peak <= usable_bytes(answers)
            chosen = dataclasses.replace(chosen, estimate=lora, fits=fits)
            if fits:
                warnings = [warning for warning in warnings if warning not in fit_warnings]
    settings |= _run_length(recipe, shape.params, chosen.micro_batch, settings, answers.world_size)
    resolved = dataclasses.replace(answers, precision=precision.value, strategy=strategy.value)
    finetune = settings["finetune"].value if "finetune" in settings else "full"  # as planned
    resolved = dataclasses.replace(resolved, finetune=finetune)
    usable = usable_bytes(answers)
    return Plan(
        resolved, settings, shape, chosen.estimate, usable, precision, strategy, tuple(warnings)
    )


def refuse_what_cannot_render(answers: Answers, strategy: Decision, precision: Decision) -> None:
    """Refuse the planner's own choices that the template does not render: fp16 when sharded,
    a strategy this version cannot render yet, a value the framework does not render (the
    answered values were refused by `check` already).

    Raises:
        AnswerError: fp16 with a sharded strategy (`no_fp16_when_sharded`).
        AnswerError: the chosen strategy is not in `renderable.RENDERS`.
        NotAvailableYet: the chosen strategy or precision is not rendered by the framework.
    """
    no_fp16_when_sharded({"strategy": strategy.value, "precision": precision.value})
    coerce(QUESTION_BY_KEY["strategy"], strategy.value)  # AnswerError if `RENDERS` lacks it
    framework = answers.framework
    for decision in (strategy, precision):
        if not framework_renders(framework, decision.key, decision.value):
            raise NotAvailableYet(
                f"{decision.key}=auto chose {decision.line()}; framework={framework} does not "
                f"render {decision.value} yet (it cannot be tested on CPU); answer "
                "framework=pytorch"
            )


def strategy_ladder(answers: Answers) -> tuple[str, ...]:
    """The strategies `auto` tries, least sharding first."""
    if answers.hardware != "cuda":
        return ("single",)
    return (
        ("single", "zero3-offload")
        if answers.world_size == 1
        else ("ddp", "fsdp2", "zero3-offload")
    )


@dataclass
class StrategySearch:
    """The fits of one plan's candidate strategies at one precision, each estimated once: the
    answered strategy, `auto`'s ladder and the warning that says what `auto` would choose read
    the same fits (a fit does not depend on which strategy was answered)."""

    answers: Answers
    precision: str
    shape: ModelShape
    recipe: Recipe
    fits: dict[str, Fit] = field(default_factory=dict)

    def fit(self, strategy: str) -> Fit:
        """`fitting.fit` of `strategy`, estimated on the first call."""
        if strategy not in self.fits:
            answers, precision = self.answers, self.precision
            self.fits[strategy] = fit(answers, strategy, precision, self.shape, self.recipe)
        return self.fits[strategy]

    def auto(self) -> tuple[Fit, list[str]]:
        """`auto`'s choice: the first of `strategy_ladder` that fits (the last when none does),
        and why each one tried before it, and it too when it does not fit, does not."""
        tried: list[str] = []
        for strategy in strategy_ladder(self.answers):
            chosen = self.fit(strategy)
            if chosen.fits:
                break
            tried.append(why_not(self.answers, chosen))
        return chosen, tried


def _choose_strategy(search: StrategySearch) -> tuple[Decision, Fit, list[str]]:
    """The strategy (as answered, or the first of `strategy_ladder` that fits), its fit at the
    search's precision, and warnings: a strategy that adds nothing or does not fit."""
    answers, warnings = search.answers, []
    usable = usable_bytes(answers)
    where = device_words(answers)
    if answers.strategy != "auto":
        chosen = search.fit(answers.strategy)
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
                f"checkpointing, {why_not(answers, chosen)} (usable: "
                f"{gib(usable)} GiB of {where}){_auto_would(search)}"
            )
        return as_answered("strategy", answers.strategy), chosen, warnings
    chosen, tried = search.auto()
    if not chosen.fits:
        warnings.append(
            f"no strategy fits even at micro-batch 1 with activation checkpointing "
            f"({'; '.join(tried)}); the run may run out of memory"
        )
    others = tried if chosen.fits else tried[:-1]  # the chosen one's own says why it does not
    reason = _strategy_reason(answers, chosen, search.shape, others, usable, where)
    return Decision("strategy", chosen.strategy, reason, "auto"), chosen, warnings


def _auto_would(search: StrategySearch) -> str:
    """What `strategy=auto` would choose instead, worded for a warning; '' when that choice
    would be refused too."""
    chosen, _ = search.auto()
    auto = dataclasses.replace(search.answers, strategy="auto")
    strategy = Decision("strategy", chosen.strategy, "auto's choice", "auto")
    try:
        refuse_what_cannot_render(auto, strategy, as_answered("precision", search.precision))
    except AnswerError:
        return ""
    return f"; strategy=auto would choose {chosen.strategy}"


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
    fits = fits if chosen.fits else f"it does not fit either: {why_not(answers, chosen)}"
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
    per_process = sequences_per_process(recipe, world)
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
        settings["vocab_size"] = Setting(recipe.vocab_size, recipe.note("vocab_size", vocabulary))
        family = recipe.note(
            "model_family", "as answered (model.py: gpt2 ByteGPT, llama.py: Llama)"
        )
        settings["model_family"] = Setting(answers.model_family, family)
        start = "as answered: the engines load its weights" if answers.init_from else "scratch"
        settings["init_from"] = Setting(answers.init_from, start)
    else:
        settings |= _image_model(answers)
    peak = f"~{gib(chosen.estimate.peak)} of {gib(usable)} GiB usable per device"
    if not usable:
        micro = f"the whole {per_process} {unit} per process (memory not given: not checked)"
    elif chosen.fits:
        micro = f"the largest divisor of the {per_process} {unit} per process that fits: {peak}"
    else:
        micro = f"the smallest, and still too much ({why_not(answers, chosen)}): see the warning"
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


BACKBONE_DATA_DIR = "data/photos"  # where a backbone's plan expects the prepared images


def _image_model(answers: Answers) -> dict[str, Setting]:
    """The image model's settings: the example's CNN, or a timm backbone with the weights it
    starts from, its image size and how its LR and frozen epochs follow its recipe
    (`backbone_recipe`)."""
    if answers.model_family != "timm":
        cnn = "the example's CNN (model.py), sized by model_size; backbone=NAME plans a timm one"
        return {
            "data_dir": Setting("", "the bundled digits; prepare your images and name them here"),
            "model_family": Setting("cnn", cnn),
            "image_size": Setting(
                answers.image_size, "the crop side of prepared images (the digits are 8x8)"
            ),
        }
    chosen = backbone_recipe(bool(answers.init_from), answers.world_size)
    weights = (
        f"as answered: its weights hold {int(answers.model_size):,} parameters, "
        f"{answers.backbone}'s less its classifier"
        if answers.init_from
        else "none: timm's random initialisation (answer init_from to fine-tune pretrained weights)"
    )
    prepare = f"python -m {answers.package_name}.prepare PHOTOS/ --out {BACKBONE_DATA_DIR}"
    return {
        "data_dir": Setting(
            BACKBONE_DATA_DIR, f"a backbone trains on your images, not the digits: {prepare}"
        ),
        "model_family": Setting("timm", f"as answered: backbone {answers.backbone}"),
        "backbone": Setting(answers.backbone, "as answered (backbone.py builds it with timm)"),
        "init_from": Setting(answers.init_from, weights),
        "image_size": Setting(
            answers.image_size, "the crop side the memory is estimated at (answer image_size)"
        ),
        "backbone_lr_ratio": Setting(chosen.backbone_lr_ratio, chosen.reasons["backbone_lr_ratio"]),
        "freeze_backbone_epochs": Setting(
            chosen.freeze_backbone_epochs, chosen.reasons["freeze_backbone_epochs"]
        ),
    }


# Compute-optimal training sees ~20 tokens per parameter (Hoffmann et al. 2022, "Training
# Compute-Optimal Large Language Models", Table 3).
TOKENS_PER_PARAMETER = 20


VALIDATIONS_PER_RUN = 20


# Tokens a validation pass reads: about nanoGPT's GPT-2 evaluation (eval_iters 200 x batch 12 x
# 1024 tokens = 2.5M), enough for a loss estimate whose noise is far below the differences
# early stopping and best-checkpoint selection act on.
VALIDATION_TOKENS = 2**21

# Bits per byte during training (`eval_every`, `eval_bytes`) may cost this share of a run's time:
# a forward pass over the held-out text, against forward + backward (about 3 forwards) over the
# training tokens between two measurements. Sized as if each token held one byte (the byte
# tokenizer's; a BPE's tokens hold more, so it costs less), at most EVAL_BYTES_CAP bytes.
EVAL_TIME_SHARE = 0.015
EVAL_BYTES_CAP = 2**20


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
    eval_budget = 3 * EVAL_TIME_SHARE * every * sequences * recipe.block_size
    eval_bytes = max(recipe.block_size + 1, min(EVAL_BYTES_CAP, _two_digits(eval_budget)))
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
        "eval_every": Setting(every, "bits per byte at each validation's step"),
        "eval_bytes": Setting(
            eval_bytes,
            f"the held-out text a bits-per-byte measurement reads: a forward pass over it costs "
            f"under {EVAL_TIME_SHARE:.1%} of the {every} training steps between two, counted "
            "as if each token held one byte (a BPE's tokens hold more, and cost less)",
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


# Continued training starts from a model at the end of its schedule: a peak learning rate a
# tenth of pretraining's for its size, as Llama 2 fine-tuned its 7B at 2e-5 after pretraining
# at 3e-4 (Touvron et al. 2023b, sections 2.2 and 3.1), and a short warmup that re-warms it
# (Gupta et al. 2023, "Continual Pre-Training of Large Language Models: How to (re)warm your
# model?": a re-warm of ~1% of the steps): a tenth of the recipe's own warmup here.
CONTINUED_LR_FRACTION = 0.1
CONTINUED_WARMUP_FRACTION = 0.1


def continued_training(recipe: Recipe, shape: HubDecoderShape) -> Recipe:
    """`recipe` for a model that starts from `shape.folder`'s weights: its context (at most
    the model's), vocabulary and tokenizer.json, and a tenth of the peak learning rate."""
    folder = shape.folder
    notes = (
        (
            "block_size",
            f"{recipe.note('block_size', recipe.name + ' context')}, at most {folder}'s "
            f"{shape.max_positions}",
        ),
        (
            "lr",
            f"a tenth of {recipe.name}'s peak {recipe.lr:g} for continued training (Llama 2 "
            "fine-tuned at 2e-5 after pretraining at 3e-4: Touvron et al. 2023b, §2.2, §3.1)",
        ),
        ("tokenizer", f"{folder}'s own: its ids are what the model was trained on"),
        ("model_family", f"{folder}'s config.json: {shape.model_type}"),
        ("vocab_size", f"{folder}'s config.json: its embedding's rows"),
        (
            "warmup_steps",
            f"a tenth of {recipe.name}'s warmup: a short re-warm of a trained model (Gupta "
            "et al. 2023, Continual Pre-Training of LLMs: How to (re)warm your model?)",
        ),
    )
    return dataclasses.replace(
        recipe,
        name=f"{recipe.name} (continued from {folder})",
        block_size=shape.block_size,
        tokenizer=f"{folder.rstrip('/')}/tokenizer.json",
        vocab_size=shape.vocab,
        lr=recipe.lr * CONTINUED_LR_FRACTION,
        warmup_steps=max(1, math.ceil(recipe.warmup_steps * CONTINUED_WARMUP_FRACTION)),
        notes=notes + recipe.notes,
    )


# LoRA's rank and scale: rank 16 with alpha = 2 x rank on every attention and MLP projection, the
# QLoRA recipe's setting for all linear layers (Dettmers et al. 2023, "QLoRA", §4 and Appendix
# B.2: adapters on every linear layer match full fine-tuning where attention alone does not).
LORA_RANK = 16
LORA_ALPHA = 2.0 * LORA_RANK  # a float: the setting takes any scale


def _finetune(
    answers: Answers, shape: ModelShape, chosen: Fit, precision: str
) -> tuple[dict[str, Setting], Estimate | None]:
    """How a language model trains its weights: all of them, or LoRA adapters on a Llama-family
    model started from init_from (`finetune = "lora"`), which the plan takes where fine-tuning
    every weight does not fit and the adapters do; both estimates are in its line. Returns the
    settings, and LoRA's estimate where the plan takes LoRA (else None)."""
    qlora = "QLoRA's rank for adapters on every linear layer (Dettmers et al. 2023, App. B.2)"
    rank = {
        "lora_rank": Setting(LORA_RANK, qlora),
        "lora_alpha": Setting(LORA_ALPHA, "2 x lora_rank: a scale alpha / rank of 2 (QLoRA's)"),
    }
    if not (isinstance(shape, HubDecoderShape) and shape.family == "llama"):  # full only
        scratch = "init_from's GPT-2" if answers.init_from else "a model from scratch"
        how = f"full: {scratch} trains every weight (lora: a Llama-family init_from)"
        return {"finetune": Setting("full", how)} | rank, None
    adapters = shape.lora_parameters(LORA_RANK)
    lora = estimate(
        shape,
        strategy=chosen.strategy,
        precision=precision,
        world_size=answers.world_size,
        micro_batch=chosen.micro_batch,
        checkpointing=chosen.checkpointing,
        processes_per_node=answers.gpus_per_node,
        adapters=adapters,
    )
    usable = usable_bytes(answers)
    both = (
        f"every weight ~{gib(chosen.estimate.peak)} GiB, LoRA at rank {LORA_RANK} ({adapters:,} "
        f"adapter parameters) ~{gib(lora.peak)} GiB per device"
    )
    host = host_usable(answers)
    lora_fits = not usable or (lora.peak <= usable and (not host or lora.host <= host))
    if answers.finetune == "lora":
        return {"finetune": Setting("lora", f"lora: as answered ({both})")} | rank, lora
    if answers.finetune == "full":
        return {"finetune": Setting("full", f"full: as answered ({both})")} | rank, None
    if usable and not chosen.fits and lora_fits:
        how = f"lora: fine-tuning every weight does not fit this hardware and LoRA does ({both})"
        return {"finetune": Setting("lora", how)} | rank, lora
    how = f"full: every weight trains ({both}); lora: adapters only"
    return {"finetune": Setting("full", how)} | rank, None


def _warmup(recipe: Recipe, sequences_per_step: int) -> Setting:
    """The recipe's warmup; GPT-3's (375M tokens) only while it is at most a tenth of the
    planned run (its epochs over its corpus), else a tenth of that run."""
    if "warmup_steps" in dict(recipe.notes):
        return Setting(recipe.warmup_steps, recipe.note("warmup_steps", ""))
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
