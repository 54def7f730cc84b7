"""Every answer of the questionnaire: allowed values, validation, and conversion to copier data.

Answer sources are merged once, in priority order (`merge_sources`): `--data` pairs, then a
named variant, then interactive answers, then defaults from the hardware probe, then the static
defaults below. `Answers` is the validated, frozen result.
"""

from __future__ import annotations

import dataclasses
import decimal
import keyword
import math
import re
import sys
import unicodedata
from collections import ChainMap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaffold.backbones import backbone_info, check_backbone_image_size, weights_backbone
from scaffold.errors import AnswerError
from scaffold.hub_folder import read_hub_folder
from scaffold.renderable import RENDERS


@dataclass(frozen=True)
class Question:
    """One answer key: its prompt, type and allowed values."""

    key: str
    prompt: str
    kind: type  # str, int, float or bool
    default: Any
    choices: tuple[str, ...] = ()  # what renders (`renderable.RENDERS`); () for a free answer
    only_for_cuda: bool = False
    only_for_language_model: bool = False
    derived_from_init_from: bool = False  # a model folder's config.json answers it
    derived_from_backbone: bool = False  # an image model's timm backbone answers it
    only_with_init_from: bool = False  # asked only of a model started from a folder
    maximum: float | None = None  # the largest number accepted
    positive: bool = False  # 0 cannot be the answer where the question is asked
    beyond: str = ""  # why a larger number cannot be right, for the refusal
    example: str = ""  # a valid answer for hints, where the default is not one everywhere
    takes: str = ""  # the values a text answer takes, in words
    only_for_images: bool = False
    only_with_backbone: bool = False  # asked only of an image model that is a timm backbone
    image_prompt: str = ""  # the prompt for the image task, where it differs
    when: Callable[[Mapping[str, Any]], bool] | None = None  # asked only where this holds

    def accepted(self) -> str:
        """The values this key accepts, in words (for `--help` and refusals)."""
        if self.choices:
            return " | ".join(self.choices)
        if self.kind is bool:
            return "true | false"
        if self.takes:
            return self.takes
        if self.positive and self.maximum:
            return f"more than 0 and at most {self.maximum:,g}"
        low = "1" if self.kind is int else "0"
        return f"{low} to {self.maximum:,g}" if self.maximum else KIND_NAMES[self.kind]

    def asked(self, known: Mapping[str, Any]) -> bool:
        """Whether the questionnaire asks this question after the answers `known`: a GPU's
        only for CUDA, the language model's only for it, and none that `init_from`'s folder
        answers."""
        if self.only_for_cuda and known.get("hardware") != "cuda":
            return False
        if self.only_for_language_model and known.get("task") != "language-model":
            return False
        if self.only_with_init_from and not known.get("init_from"):
            return False
        images = known.get("task", "image-classification") == "image-classification"
        if self.only_for_images and not images:
            return False
        if self.only_with_backbone and images and not known.get("backbone"):
            return False
        if self.when is not None and not self.when(known):
            return False
        derived = self.derived_from_init_from and known.get("init_from")
        return not (derived or (self.derived_from_backbone and images and known.get("backbone")))

    def choices_for(self, known: Mapping[str, Any]) -> tuple[str, ...]:
        """The choices offered after the answers `known`: a task's own model families."""
        if self.key != "model_family":
            return self.choices
        return MODEL_FAMILIES[known.get("task", "image-classification")]

    def prompt_for(self, known: Mapping[str, Any]) -> str:
        """The prompt after the answers `known` (the image task's own, where it has one)."""
        images = known.get("task") == "image-classification"
        return self.image_prompt if images and self.image_prompt else self.prompt

    def hint(self) -> str:
        """A valid answer, as `--data KEY=VALUE` takes it."""
        return f"{self.key}={self.example or str(self.default).lower()}"


QUESTIONS: tuple[Question, ...] = (
    Question(
        "project_name",
        "Project name",
        str,
        None,
        takes="letters, digits, '-', '_' and '.', from a letter to a letter or digit",
    ),
    Question(
        "task",
        "Example task",
        str,
        "image-classification",
        RENDERS["task"],
    ),
    Question(
        "backbone",
        "Image model: a timm backbone, e.g. resnet50 (empty: the example's CNN)",
        str,
        "",
        takes='a timm model name (python -c "import timm; print(timm.list_models())"), or nothing',
        example="resnet50",
        only_for_images=True,
    ),
    Question(
        "init_from",
        "Start from: a Hugging Face model folder (empty: from scratch)",
        str,
        "",
        takes=(
            "a folder holding config.json, safetensors weights and tokenizer.json (a language "
            "model), or the backbone's weights: a .safetensors/.pth file or a timm folder"
        ),
        example="/models/SmolLM2-135M",
        image_prompt="The backbone's weights: a .safetensors/.pth file or a timm folder (empty: "
        "timm's random initialisation)",
        when=lambda known: known.get("task") == "language-model" or bool(known.get("backbone")),
    ),
    Question(
        "image_size",
        "Image size: the side of the square crop the backbone sees, in pixels",
        int,
        224,
        only_for_images=True,
        only_with_backbone=True,
        maximum=8192,
        beyond="more pixels a side than any backbone is trained at (the largest: ~1,000)",
    ),
    Question("hardware", "Hardware", str, "cpu", RENDERS["hardware"]),
    Question(
        "gpu_arch",
        "GPU architecture",
        str,
        "none",
        RENDERS["gpu_arch"],
        only_for_cuda=True,
    ),
    # The caps refuse typing slips (1e9 GiB), not real machines: each is at least twice the
    # largest there is today.
    Question(
        "gpus_per_node",
        "GPUs per node",
        int,
        1,
        only_for_cuda=True,
        maximum=64,
        beyond="more than any node holds (the largest: 16)",
    ),
    Question(
        "num_nodes",
        "Number of nodes",
        int,
        1,
        only_for_cuda=True,
        maximum=100_000,
        beyond="more than the largest clusters have (~25,000)",
    ),
    Question(
        "gpu_memory_gb",
        "Memory per GPU (GiB)",
        float,
        0.0,
        only_for_cuda=True,
        maximum=1024,
        positive=True,
        beyond="more than any GPU has (the largest, NVIDIA's B300 and AMD's MI355X: 268 GiB)",
        example="79.6",
    ),
    Question(
        "host_memory_gb",
        "Host memory per node (GiB)",
        float,
        0.0,
        maximum=65_536,
        beyond="more than any server holds (the largest: 32 TiB)",
        example="64",
    ),
    Question(
        "model_size",
        "Model size in parameters (e.g. 100K, 10M)",
        str,
        "100K",
        takes="a parameter count: a number with an optional K, M, B or T, e.g. 100K, 2.5M, 7B, 1e6",
        derived_from_init_from=True,
        derived_from_backbone=True,  # a timm backbone's size is its own
    ),
    Question(
        "model_family",
        "Model family (language model): GPT-2-style or Llama-style decoder",
        str,
        "auto",
        RENDERS["model_family"],
        only_for_language_model=True,  # an image model's is its backbone answer's
        derived_from_init_from=True,
    ),
    Question(
        "finetune",
        "Fine-tuning: every weight (full) or LoRA adapters on frozen weights (lora)",
        str,
        "auto",
        RENDERS["finetune"],
        only_for_language_model=True,
        only_with_init_from=True,
    ),
    Question(
        "framework",
        "Training framework",
        str,
        "pytorch",
        RENDERS["framework"],
    ),
    Question(
        "precision",
        "Precision",
        str,
        "auto",
        RENDERS["precision"],
    ),
    Question(
        "strategy",
        "Parallelism strategy",
        str,
        "auto",
        RENDERS["strategy"],
    ),
    Question("compile", "torch.compile the model", bool, False),
)
QUESTION_BY_KEY = {question.key: question for question in QUESTIONS}
# The model families of each task (`auto`: the first, or timm where a backbone is answered).
MODEL_FAMILIES = {"language-model": ("gpt2", "llama"), "image-classification": ("cnn", "timm")}

# Top-level modules the rendered project, its tests or its tools import (a test checks the
# template's imports against this list); a package of the same name would shadow one of them.
PROJECT_IMPORTS = frozenset(
    {
        "torch",
        "numpy",
        "sklearn",
        "torchvision",  # the image projects' transforms
        "PIL",  # Pillow: the image projects' decoder
        "timm",  # the image projects' pretrained backbones
        "tqdm",
        "safetensors",
        "tensorboard",
        "matplotlib",
        "lightning",
        "accelerate",
        "deepspeed",
        "wandb",
        "tokenizers",
        "transformers",  # the language model's tests: the reference loader
        "pyarrow",
        "jinja2",  # the language model's chat templates
        "peft",  # the language model's LoRA adapters
        "lm_eval",  # the language model's evaluate --tasks
        "zstandard",
        "pytest",
        "conftest",  # the project's tests/conftest.py
        "launcher",  # tests/launcher.py
        "rank_probe",  # tests/rank_probe.py
        "ruff",
        "hatchling",
    }
)
# Modules every environment has or runs at start-up (site imports sitecustomize from sys.path).
ENVIRONMENT_MODULES = frozenset(
    {"pip", "setuptools", "pkg_resources", "wheel", "sitecustomize", "usercustomize"}
)
# Folders of the rendered project whose names a package must not take.
PROJECT_FOLDERS = frozenset({"tests", "src"})
# The standard library, with CPython's own `test` package (left out of stdlib_module_names).
STDLIB_MODULES = frozenset(sys.stdlib_module_names) | {"test"}
RESERVED_PACKAGE_NAMES = STDLIB_MODULES | PROJECT_IMPORTS | ENVIRONMENT_MODULES | PROJECT_FOLDERS
# Distribution names (PEP 503 normalised) of the rendered project's requirements: a project of
# the same name would require itself.
TEST_HELPERS = frozenset({"conftest", "launcher", "rank_probe"})  # tests/, not installed
PROJECT_DISTRIBUTIONS = (PROJECT_IMPORTS - {"sklearn", "PIL"} - TEST_HELPERS) | {
    "scikit-learn",
    "pillow",
}
# File names Windows reserves in every folder (with any extension), case-insensitively.
WINDOWS_DEVICE_NAMES = frozenset(
    {"con", "prn", "aux", "nul"} | {f"{port}{n}" for port in ("com", "lpt") for n in range(1, 10)}
)
PROJECT_NAME_MAX = 100  # the package folder and its .dist-info must fit a 255-byte file name
PROJECT_NAME = re.compile(r"[A-Za-z]([A-Za-z0-9._-]*[A-Za-z0-9])?")
KIND_NAMES = {str: "text", int: "a whole number", float: "a number", bool: "true or false"}
MODEL_SIZE = re.compile(r"(\d+(?:\.\d+)?(?:E\d{1,2})?)([KMBT]?)")
MODEL_SIZE_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}
# Read only to refuse as too large, with the largest model the examples render: the rendered
# project's config knows K, M, B and T (`_refuse_petascale`).
MODEL_SIZE_TOO_LARGE = re.compile(r"(\d+(?:\.\d+)?(?:E\d{1,2})?)P")


@dataclass(frozen=True)
class Answers:
    """The validated answers; `precision` and `strategy` may still be `auto` until planned.

    Memory sizes are GiB (2^30 bytes, as nvidia-smi's MiB / 1024); 0 means not given.
    """

    project_name: str
    package_name: str
    task: str
    hardware: str
    gpu_arch: str
    gpus_per_node: int
    num_nodes: int
    gpu_memory_gb: float
    host_memory_gb: float
    model_size: str
    model_family: str
    init_from: str
    backbone: str
    image_size: int
    finetune: str
    framework: str
    strategy: str
    precision: str
    compile: bool

    @property
    def world_size(self) -> int:
        """Processes in a run: GPUs per node x nodes (1 on CPU)."""
        return self.gpus_per_node * self.num_nodes

    @property
    def model_params(self) -> int:
        """`model_size` as a parameter count."""
        return parse_model_size(self.model_size)

    def to_copier_data(self) -> dict[str, Any]:
        """The template's data: every answer, as plain values."""
        return dataclasses.asdict(self)


def package_name_for(project_name: str) -> str:
    """The import name of a project: lower case, `-` and `.` runs replaced by `_`.

    A project name is ASCII letters, digits, `-`, `_` and `.`, starts with a letter and ends
    with a letter or digit, so it is safe as a folder name, a distribution name, a TOML string
    and a shell word. Non-ASCII letters are refused rather than transliterated: the distribution
    name must be ASCII, and Python folds look-alike letters (full-width `ｔｏｒｃｈ` imports
    `torch`).

    Raises:
        AnswerError: the name is a path, holds another character, is longer than
            PROJECT_NAME_MAX, does not start with a letter or end with a letter or digit,
            makes a package that is a Python keyword or shadows a module (RESERVED_PACKAGE_NAMES),
            is the distribution name of a requirement, or is a name Windows reserves. Each
            message says what to answer instead.
    """
    name = project_name
    if "/" in name or "\\" in name or ".." in name or name in {".", "~"}:
        raise AnswerError(
            f"project name {name!r} holds a path separator or '..'; answer a plain name "
            "such as my-project, and give the folder as DEST"
        )
    if not name.isascii():
        foreign = [repr(c) for c in dict.fromkeys(c for c in name if not c.isascii())]
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise AnswerError(
            f"project name {name!r} has non-ASCII characters ({shown}), which a distribution "
            f"name cannot hold; answer an ASCII name such as {_ascii_suggestion(name)}"
        )
    others = [c for c in dict.fromkeys(name) if not (c.isalnum() or c in "-_.")]
    if others:
        raise AnswerError(
            f"project name {name!r} holds {', '.join(repr(c) for c in others)}; use only "
            "letters, digits, '-', '_' or '.', e.g. my-project"
        )
    if len(name) > PROJECT_NAME_MAX:
        raise AnswerError(
            f"project name {name[:20]!r}... is {len(name)} characters, too long; "
            f"answer at most {PROJECT_NAME_MAX}"
        )
    package = re.sub(r"[-.]+", "_", name).lower()
    if not PROJECT_NAME.fullmatch(name) or not package.isidentifier():
        raise AnswerError(
            f"project name {name!r} is not a name starting with a letter and ending with a "
            "letter or digit (so that its package is a Python identifier); answer e.g. my-project"
        )
    instead = f"choose another name, such as {name}-project"
    makes = "is a Python keyword" if package == name else f"makes package {package!r}, a keyword"
    if keyword.iskeyword(package):
        raise AnswerError(f"project name {name!r} {makes}; {instead}")
    if package in RESERVED_PACKAGE_NAMES:
        if package in STDLIB_MODULES:
            shadowed = f"the standard library's {package} module"
        elif package in PROJECT_IMPORTS:
            shadowed = f"{package}, a module the project imports"
        elif package in PROJECT_FOLDERS:
            shadowed = f"the project's {package}/ folder"
        else:
            shadowed = f"{package}, a module every Python environment has"
        raise AnswerError(
            f"project name {name!r} would make package {package!r}, which shadows {shadowed}; "
            f"{instead}"
        )
    if re.sub(r"[-_.]+", "-", name).lower() in PROJECT_DISTRIBUTIONS:
        raise AnswerError(
            f"project name {name!r} is the name of a package the project requires, so it would "
            f"require itself; {instead}"
        )
    if package in WINDOWS_DEVICE_NAMES:  # src/<package> could not be checked out there
        raise AnswerError(
            f"project name {name!r} is a file name Windows reserves ({package.upper()}); {instead}"
        )
    return package


def _ascii_suggestion(name: str) -> str:
    """An ASCII spelling of `name` (café -> cafe, full-width ｎｅｔ -> net) that is a valid
    project name, else my-project."""
    folded = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", name))
    candidate = folded.encode("ascii", "ignore").decode()
    try:
        package_name_for(candidate)
    except AnswerError:
        return "my-project"
    return candidate


def parse_model_size(text: str) -> int:
    """'100K' -> 100_000, '1.5M' -> 1_500_000, '7B' -> 7_000_000_000, '1e6' -> 1_000_000.

    The rendered project's `config.parse_param_count` applies the same rule with the same
    message (`tests/test_answers.py` checks the two agree over a table of inputs), so what
    scaffold accepts, the project's own config accepts.

    Raises:
        AnswerError: not a whole number of parameters of at least 1, written as a number with
            an optional exponent and an optional K, M, B or T suffix; a P suffix is refused
            as too large, with the largest model the examples render.
    """
    larger = MODEL_SIZE_TOO_LARGE.fullmatch(text.strip().upper())
    if larger:
        _refuse_petascale(text)
    match = MODEL_SIZE.fullmatch(text.strip().upper())
    count = decimal.Decimal(match.group(1)) * MODEL_SIZE_SUFFIXES[match.group(2)] if match else 0
    if count < 1 or count != count.to_integral_value():
        raise AnswerError(
            f"model_size {text!r} is not a whole number of parameters of at least 1; "
            "use e.g. 100K, 2.5M, 7B or 1e6"
        )
    return int(count)


def _refuse_petascale(text: str) -> None:
    """Refuse a P model size as too large, naming the largest model the examples render."""
    from scaffold.recipes import GPT3_CONTEXT
    from scaffold.shapes import largest_decoder

    largest = largest_decoder(GPT3_CONTEXT).params
    raise AnswerError(
        f"model_size {text!r} is too large: the largest model the examples render has "
        f"{largest:,} parameters (the language model; the digits CNN: 50M); answer at most "
        f"{largest // 10**9}B"
    )


def parse_data_pairs(pairs: list[str]) -> dict[str, str]:
    """`["KEY=VALUE", ...]` from `--data` -> `{KEY: VALUE}` (values still text).

    Raises:
        AnswerError: a pair without `=`, or a key that is not a question.
    """
    parsed = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise AnswerError(f"--data {pair!r} is not KEY=VALUE; e.g. --data precision=bf16")
        parsed[check_key(key.strip())] = value.strip()
    return parsed


def check_key(key: str) -> str:
    """Return `key` if it names a question.

    Raises:
        AnswerError: unknown key; the message lists the known ones.
    """
    if key not in QUESTION_BY_KEY:
        raise AnswerError(f"unknown answer key {key!r}; known keys: {', '.join(QUESTION_BY_KEY)}")
    return key


def coerce(question: Question, value: Any) -> Any:
    """Convert a text or typed value to the question's type and check it against the choices.

    Raises:
        AnswerError: wrong type, a value outside the choices, a count below 1, a negative or
            non-finite number, or a number above the question's `maximum`.
    """
    key = question.key
    try:
        if question.kind is bool:
            typed = _to_bool(value)
        elif question.kind is int and isinstance(value, float):
            raise ValueError
        else:
            typed = question.kind(value)
    except (TypeError, ValueError):
        raise AnswerError(
            f"{key}={value!r} is not {KIND_NAMES[question.kind]}; answer e.g. {question.hint()}"
        ) from None
    if question.choices and typed not in question.choices:
        raise AnswerError(
            f"{key}={typed!r} is not known; answer one of: {', '.join(question.choices)}"
        )
    if question.kind is float and not math.isfinite(typed):
        raise AnswerError(f"{key}={value!r} is not a finite number; answer e.g. {question.hint()}")
    if question.kind is int and typed < 1:
        raise AnswerError(f"{key}={typed} must be at least 1")
    if question.kind is float and typed < 0:
        raise AnswerError(f"{key}={typed} must not be negative")
    if question.maximum is not None and typed > question.maximum:
        raise AnswerError(f"{key}={value} is {question.beyond}; answer {question.accepted()}")
    return typed


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in {"true", "yes", "y", "1", "on"}:
        return True
    if text in {"false", "no", "n", "0", "off"}:
        return False
    raise ValueError(value)


def merge_sources(*sources: Mapping[str, Any]) -> ChainMap:
    """Answer sources in priority order, first wins (e.g. `--data`, variant, prompts, probe)."""
    static = {q.key: q.default for q in QUESTIONS if q.default is not None}
    return ChainMap(*sources, static)


def build_answers(values: Mapping[str, Any]) -> Answers:
    """Validate merged answer values into `Answers`.

    Raises:
        AnswerError: an unknown key, a missing project name, or any invalid value.
    """
    for key in values:
        check_key(key)
    if not values.get("project_name"):
        raise AnswerError("project name is empty; pass --data project_name=NAME")
    typed = {q.key: coerce(q, values[q.key]) for q in QUESTIONS}
    typed["package_name"] = package_name_for(typed["project_name"])
    parse_model_size(typed["model_size"])
    if typed["task"] == "image-classification":
        typed.update(image_model_answers(typed))
    else:
        check_language_family(typed["model_family"], typed["backbone"])
        if typed["init_from"]:
            typed.update(pretrained_answers(typed, values))
    if typed["model_family"] == "auto":
        typed["model_family"] = MODEL_FAMILIES[typed["task"]][0]
    if typed["hardware"] != "cuda":  # GPU answers mean nothing without a GPU
        typed.update(gpu_arch="none", gpus_per_node=1, num_nodes=1, gpu_memory_gb=0.0)
    return Answers(**typed)


def image_model_answers(typed: dict[str, Any]) -> dict[str, Any]:
    """The image model's answers resolved: a timm backbone (`backbone`, or the architecture an
    `init_from` folder names) makes `model_family` timm, `model_size` the backbone's parameter
    count (read from init_from's weights where given) and `init_from` an absolute path; the
    example's CNN keeps `model_size`.

    Raises:
        AnswerError: a language model's family, a backbone or weights with model_family=cnn,
            model_family=timm without a backbone, an unknown backbone, weights that do not hold
            it, or an image size below its output stride (`scaffold.backbones`).
    """
    family, backbone, init_from = typed["model_family"], typed["backbone"], typed["init_from"]
    check_image_family(family, backbone, init_from)
    if not (backbone or init_from):
        return {"model_family": "cnn"}
    params = backbone_info(backbone).params if backbone else 0
    if init_from:
        init_from = str(Path(init_from).expanduser().resolve())
        backbone, params = weights_backbone(init_from, backbone)
    check_backbone_image_size(backbone, typed["image_size"])
    return {
        "model_family": "timm",
        "backbone": backbone,
        "init_from": init_from,
        "model_size": str(params),
    }


def check_image_family(family: str, backbone: str, init_from: str) -> None:
    """Refuse an image model whose answers disagree: a language model's family, a backbone or
    weights for the example's CNN, or model_family=timm with neither.

    Raises:
        AnswerError: what to answer instead.
    """
    if family not in ("auto", *MODEL_FAMILIES["image-classification"]):
        raise AnswerError(
            f"model_family={family} is a language model's; an image model is cnn (the "
            "example's) or timm (answer backbone=NAME, e.g. resnet50)"
        )
    if family == "cnn" and (backbone or init_from):
        given = "backbone" if backbone else "init_from"
        raise AnswerError(
            f"{given} is a timm backbone's, and model_family=cnn is the example's CNN; answer "
            f"model_family=timm, or leave {given} out"
        )
    if family == "timm" and not (backbone or init_from):
        raise AnswerError(
            "model_family=timm needs backbone=NAME (a timm model, e.g. resnet50), or init_from "
            "a timm folder whose config.json names it"
        )


def check_language_family(family: str, backbone: str) -> None:
    """Refuse an image model's answers for a language model.

    Raises:
        AnswerError: a backbone, or model_family cnn or timm.
    """
    if backbone or family in MODEL_FAMILIES["image-classification"]:
        what = f"backbone={backbone}" if backbone else f"model_family={family}"
        raise AnswerError(
            f"{what} is an image model's; a language model is gpt2 or llama (answer "
            "task=image-classification for a backbone)"
        )


def pretrained_answers(typed: dict[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """`init_from` as an absolute path (the project trains elsewhere), and `model_size` and
    `model_family` as its config.json gives them: its parameter count and family.

    Raises:
        AnswerError: a folder `read_hub_folder` refuses; a
            `model_size` or `model_family` answered beside it that contradicts it (a size more
            than 10% off its count).
    """
    typed["init_from"] = str(Path(typed["init_from"]).expanduser().resolve())
    shape = read_hub_folder(typed["init_from"], 1)
    answered = values.maps[:-1] if isinstance(values, ChainMap) else [values]
    if any("model_size" in source for source in answered):
        asked = parse_model_size(typed["model_size"])
        if abs(asked - shape.params) > shape.params / 10:
            raise AnswerError(
                f"model_size {typed['model_size']} contradicts init_from {typed['init_from']}, "
                f"a model of {shape.params:,} parameters; leave model_size out"
            )
    if any("model_family" in source for source in answered) and typed["model_family"] not in (
        "auto",
        shape.family,
    ):
        raise AnswerError(
            f"model_family {typed['model_family']} contradicts init_from {typed['init_from']}, "
            f"a {shape.model_type} model ({shape.family} family); leave model_family out"
        )
    folder, size, family = typed["init_from"], str(shape.params), shape.family
    return {"init_from": folder, "model_size": size, "model_family": family}
