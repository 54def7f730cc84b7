"""timm image backbones in plain Python (scaffold plans without torch or timm): each model's
sizes from a snapshot of timm, the weights an `init_from` holds, and the memory model's shape
of a `TimmClassifier` (the rendered `backbone.py`: timm's backbone with num_classes=0, Dropout
and a Linear head).

The data are shipped in `scaffold/data/` and written by `bench/backbones.py` in an environment
with timm: `timm_models.json` (every `timm.list_models()` name built on the meta device) and
`backbone_activations.json` (the bytes autograd saves per 224-pixel image, measured for a few
backbones in fp32 and under CPU autocast bf16). A backbone that was not measured borrows the
row of the measured backbone of its family nearest in size (`nearest_measured`), scaled.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from scaffold.errors import AnswerError
from scaffold.shapes import Activations, size_label

DATA = Path(__file__).resolve().parent / "data"
WEIGHTS_FILES = ("model.safetensors", "pytorch_model.bin")  # a timm folder's, in this order
MAX_HEADER = 100_000_000  # bytes: the safetensors crate's MAX_HEADER_SIZE
MEASURED_PIXELS = 224  # the activation rows' image size (a side, pixels)
MEASURED_CLASSES = 10  # the measured head's classes
SOURCE_PREFIXES = ("tf", "legacy", "gluon", "test")  # name prefixes that say where weights came
LIST_HINT = "python -c \"import timm; print(timm.list_models('resnet*'))\" lists timm's names"


@functools.cache
def timm_models() -> dict:
    """The snapshot of timm's models (`bench/backbones.py` documents its rows)."""
    return json.loads((DATA / "timm_models.json").read_text())


@functools.cache
def measured_rows() -> dict:
    """The measured activation rows: `{"rows": {name: {"params": int, "fp32": {...},
    "bf16": {...}}}, ...}`, bytes per image at MEASURED_PIXELS."""
    return json.loads((DATA / "backbone_activations.json").read_text())


def family_of(name: str) -> str:
    """A timm name's family: its first `_`-separated word, past a weights-source prefix
    ('tf', 'legacy'), less a trailing size ('resnet50' and 'resnet10t' -> 'resnet',
    'vit_base_patch16_224' -> 'vit'; a version stays: 'resnetv2_50' -> 'resnetv2')."""
    words = name.split("_")
    word = words[1] if words[0] in SOURCE_PREFIXES and len(words) > 1 else words[0]
    return re.sub(r"(?<![v\d])(\d+[a-z]{0,2})+$", "", word) or word


@dataclass(frozen=True)
class BackboneInfo:
    """One timm model as `timm.create_model(name, pretrained=False, num_classes=0)` builds it.

    `params`: its parameters (no classifier); `tensors`: its state dict's tensors (parameters
    and persistent buffers); `stride`: its output stride in pixels (the last `feature_info`
    reduction, 1 where it has none); `num_features`: the pooled features the head reads;
    `units`: the parameters of each shard unit (`TimmClassifier.shard_units()`);
    `classifier`: the key prefixes of the classifier a pretrained file adds (timm's
    `pretrained_cfg["classifier"]`); `elements`: the state dict's elements, buffers included;
    `fixed_size`: the only crop side it takes (timm's `pretrained_cfg["fixed_input_size"]`:
    a ViT's position embeddings are made for its `input_size`), 0 where any size works.
    """

    name: str
    family: str
    params: int
    tensors: int
    stride: int
    num_features: int
    units: tuple[int, ...]
    classifier: tuple[str, ...] = ()
    elements: int = 0
    fixed_size: int = 0


def timm_shard_units(backbone):
    """The rendered `TimmClassifier.shard_units()` of a bare timm backbone (an nn.Module): its
    `blocks`, `stages` or `layers` where one is an nn.Sequential or nn.ModuleList, else its
    `layer*` children, else the whole backbone (a list of modules). Needs torch."""
    from torch import nn

    for attribute in ("blocks", "stages", "layers"):
        units = getattr(backbone, attribute, None)
        if isinstance(units, nn.Sequential | nn.ModuleList):
            return list(units)
    layers = [module for name, module in backbone.named_children() if name[:5] == "layer"]
    return layers or [backbone]


def timm_row(name: str) -> list:
    """timm model `name`'s row of timm_models.json, built on the meta device with
    num_classes=0 (nothing allocated or downloaded): [params, state-dict tensors, output stride
    (the last `feature_info` reduction, 1 without one), num_features, [shard units' params],
    classifier prefix (a string or a list), state-dict elements]. Needs torch and timm
    (bench/backbones.py writes the snapshot with it).

    Raises:
        Exception: whatever `timm.create_model` raises for a model it cannot build.
    """
    import timm
    import torch

    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False, num_classes=0)
    info = getattr(model, "feature_info", None)
    state = model.state_dict()
    config = getattr(model, "pretrained_cfg", {})
    classifier = config.get("classifier") or ""
    return [
        sum(parameter.numel() for parameter in model.parameters()),
        len(state),
        int(info[-1]["reduction"]) if info else 1,
        int(model.num_features),
        [sum(p.numel() for p in unit.parameters()) for unit in timm_shard_units(model)],
        classifier if isinstance(classifier, str) else list(classifier),
        sum(tensor.numel() for tensor in state.values()),
        fixed_input_side(config),
    ]


def fixed_input_side(config: dict) -> int:
    """The only crop side a timm model takes, from its `pretrained_cfg` (`fixed_input_size`
    and the last of `input_size`), 0 where it takes any."""
    return int(config["input_size"][-1]) if config.get("fixed_input_size") else 0


@functools.cache
def installed_row(name: str) -> list | None:
    """`timm_row` of a name the snapshot lacks, where timm is importable here and knows it (a
    newer timm than the snapshot's); else None."""
    try:
        import timm
    except ImportError:
        return None
    if not timm.is_model(name):
        return None
    try:
        return timm_row(name)
    except Exception:  # noqa: BLE001 - a model timm cannot build is refused as unknown
        return None


def backbone_info(name: str) -> BackboneInfo:
    """The snapshot's row of timm model `name`, or, for a name it lacks, the row of the timm
    installed here where it has the model (`installed_row`).

    Raises:
        AnswerError: a name neither holds, with the snapshot's nearest names.
    """
    models = timm_models()["models"]
    row = models.get(name) or installed_row(name)
    if row is None:
        near = difflib.get_close_matches(name, models, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(near)}? " if near else ""
        raise AnswerError(
            f"backbone={name!r} is not a timm {timm_models()['timm']} model; {hint}{LIST_HINT}"
        )
    params, tensors, stride, features, units, classifier, elements, fixed_size = row
    prefixes = (classifier,) if isinstance(classifier, str) else tuple(classifier)
    return BackboneInfo(
        name=name,
        family=family_of(name),
        params=params,
        tensors=tensors,
        stride=stride,
        num_features=features,
        units=tuple(units),
        classifier=tuple(prefix for prefix in prefixes if prefix),
        elements=elements,
        fixed_size=fixed_size,
    )


def check_backbone_image_size(name: str, image_size: int) -> None:
    """Refuse crops of `image_size` pixels a side below backbone `name`'s output stride (the
    rendered backbone.py's `check_image_size`, which says why: its last stage would see less
    than one pixel, and CPU kernels in reduced precision blow up on such maps).

    Raises:
        AnswerError: `image_size` is below the output stride (or `name` is unknown).
    """
    info = backbone_info(name)
    if info.fixed_size and image_size != info.fixed_size:
        raise AnswerError(
            f"image_size={image_size}: {name} takes only {info.fixed_size}-pixel crops (its "
            f"position embeddings are made for that size); answer image_size={info.fixed_size}"
        )
    if image_size < info.stride:
        raise AnswerError(
            f"image_size={image_size} is below {name}'s output stride of {info.stride} pixels: "
            f"its last stage would see less than one pixel; raise image_size to at least "
            f"{info.stride}"
        )


def safetensors_header(path: Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape in a safetensors file, read from its header without torch (the
    format: an 8-byte little-endian header length, then that many bytes of JSON mapping names
    to dtype, shape and offsets, and an optional `__metadata__`).

    Raises:
        AnswerError: the file is not a readable safetensors file.
    """
    try:
        with path.open("rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            if length > MAX_HEADER:
                raise ValueError(f"a header of {length:,} bytes")
            header = json.loads(file.read(length))
        return {
            key: tuple(entry["shape"]) for key, entry in header.items() if key != "__metadata__"
        }
    except (OSError, struct.error, ValueError, KeyError, TypeError) as error:
        raise AnswerError(
            f"init_from={path} is not a readable safetensors file ({error}); point it at the "
            "weights file timm saved"
        ) from error


def torch_shapes(path: Path) -> dict[str, tuple[int, ...]] | None:
    """Each tensor's shape in a `torch.save`d state dict (unwrapped from `state_dict` or
    `model` as backbone.py does), or None where torch is not importable."""
    try:
        import torch
    except ImportError:
        return None
    try:
        state = torch.load(path, map_location="meta", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unreadable file gets the same answer
        raise AnswerError(
            f"init_from={path} is not a readable state dict ({type(error).__name__}); point it "
            "at the weights file timm saved"
        ) from error
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise AnswerError(f"init_from={path} holds no state dict; point it at a weights file")
    return {key: tuple(value.shape) for key, value in state.items() if hasattr(value, "shape")}


def weights_backbone(init_from: str, backbone: str) -> tuple[str, int]:
    """The backbone `init_from`'s weights are for, and the parameters they hold.

    `init_from`: a `.safetensors` file, a `.pth`/`.bin` state dict, or a timm folder
    (`config.json` whose `architecture` names the model, and `model.safetensors` or
    `pytorch_model.bin`). Returns the name (`backbone`, or the folder's architecture where
    `backbone` is "") and the file's elements less its classifier's (timm's
    `pretrained_cfg["classifier"]` keys) and less the buffers' (running statistics): its
    parameter count. A safetensors header is read without torch; a torch file is read (on the
    meta device) only where torch is importable, else the snapshot's count is returned and
    nothing is checked (the rendered project checks every key when it loads it).

    Raises:
        AnswerError: no such file or folder; a folder without weights; no backbone named;
            `backbone` and the folder's architecture disagree; an unknown name; a file whose
            tensor or element count (less the classifier) is not the backbone's.
    """
    path = Path(init_from)
    architecture = ""
    if path.is_dir():
        config = path / "config.json"
        if config.is_file():
            try:
                architecture = json.loads(config.read_text()).get("architecture", "") or ""
            except (ValueError, AttributeError) as error:
                raise AnswerError(
                    f"{config} is not a JSON object ({error}); fix it or point init_from at "
                    "the weights file itself"
                ) from error
        found = [path / name for name in WEIGHTS_FILES if (path / name).is_file()]
        if not found:
            raise AnswerError(
                f"init_from={init_from} holds none of {', '.join(WEIGHTS_FILES)}; point it at "
                "a folder timm saved, or at the weights file itself"
            )
        path = found[0]
    elif not path.is_file():
        raise AnswerError(f"init_from={init_from}: no such file or folder; check the path")
    if backbone and architecture and backbone != architecture:
        raise AnswerError(
            f"backbone={backbone!r} but init_from={init_from} holds {architecture!r} (its "
            f"config.json); answer backbone={architecture}, or leave it out"
        )
    name = backbone or architecture
    if not name:
        raise AnswerError(
            f"init_from={init_from} does not name its model: answer backbone=NAME (a timm "
            "model, e.g. resnet50), or use a folder whose config.json names its architecture"
        )
    info = backbone_info(name)
    shapes = safetensors_header(path) if path.suffix == ".safetensors" else torch_shapes(path)
    if shapes is None:
        return name, info.params
    prefixes = tuple(f"{prefix}." for prefix in info.classifier)
    kept = [shape for key, shape in shapes.items() if not key.startswith(prefixes)]
    elements = sum(math.prod(shape) for shape in kept)
    if len(kept) != info.tensors or elements != info.elements:
        raise AnswerError(
            f"init_from={init_from} does not hold {name}'s weights ({len(kept)} tensors of "
            f"{elements:,} elements less the classifier, not {info.tensors} of "
            f"{info.elements:,}); answer the backbone it was saved from"
        )
    return name, elements - (info.elements - info.params)


def nearest_measured(info: BackboneInfo) -> tuple[str, bool]:
    """The measured row a backbone's activations come from, and whether it is of its family:
    its own; else the measured backbone of its family nearest in parameters and pooled width
    (`measured_distance`); else the nearest measured backbone overall."""
    rows = measured_rows()["rows"]
    if info.name in rows:
        return info.name, True
    family = [name for name in rows if family_of(name) == info.family]
    pool = family or list(rows)
    nearest = min(pool, key=lambda name: measured_distance(info, name))
    return nearest, bool(family)


def measured_distance(info: BackboneInfo, measured: str) -> float:
    """How far backbone `info` is from measured backbone `measured`: the log ratio of their
    parameters plus that of their pooled features (num_features, the last stage's width).
    Width matters: ResNet-34 (21.3M parameters, 512 features, basic blocks) is nearer
    ResNet-18 (11.2M, 512) than ResNet-50 (23.5M, 2048, bottlenecks), whose activations per
    parameter are three times as many."""
    row = measured_rows()["rows"][measured]
    width = backbone_info(measured).num_features
    return abs(math.log(max(info.params, 1) / row["params"])) + abs(
        math.log(max(info.num_features, 1) / width)
    )


def resample(values: list[int], count: int, extensive: bool) -> list[float]:
    """`values` (one per measured unit) spread over `count` units by position: unit j takes
    the measured units' share between j/count and (j+1)/count of the depth. `extensive`
    (bytes saved inside units) keeps the sum; else (a unit's input) the overlap's mean."""
    measured = len(values)
    out = []
    for j in range(count):
        low, high = j * measured / count, (j + 1) * measured / count
        total = 0.0
        for i, value in enumerate(values):
            overlap = max(0.0, min(high, i + 1) - max(low, i))
            total += overlap * value
        out.append(total if extensive else total / (high - low))
    return out


@dataclass(frozen=True)
class BackboneShape:
    """A `TimmClassifier` of backbone `info` for `classes` classes on square images of
    `image_size` pixels a side, as `scaffold.memory.estimate` takes a model shape; its
    activations come from the measured row `measured` (`nearest_measured`).

    Parameters: the backbone's shard units (`info.units`), and outside them its stem, final
    norm and the like (`params - sum(units)`) and the head (num_features x classes + classes).
    """

    info: BackboneInfo
    image_size: int
    classes: int
    measured: str
    same_family: bool = True

    @property
    def unit_params(self) -> tuple[int, ...]:
        """Parameters of each shard unit."""
        return self.info.units

    @property
    def head_params(self) -> int:
        """The Linear head's weight and bias."""
        return self.info.num_features * self.classes + self.classes

    @property
    def root_params(self) -> int:
        """Parameters outside the shard units: the backbone's own and the head."""
        return self.info.params - sum(self.info.units) + self.head_params

    @property
    def matmul_params(self) -> tuple[tuple[int, ...], int]:
        """Weights autocast casts, per unit and outside: every parameter, an upper bound (a
        backbone's norms and biases are a few percent of it)."""
        return self.info.units, self.root_params

    @property
    def params(self) -> int:
        """Every parameter."""
        return self.info.params + self.head_params

    def describe(self) -> str:
        """e.g. 'timm resnet50 at 224 px (23.5M parameters in 4 shard units)'."""
        units = len(self.info.units)
        return (
            f"timm {self.info.name} at {self.image_size} px ({size_label(self.params)} "
            f"parameters in {units} shard unit{'s' if units > 1 else ''})"
        )

    @property
    def scale(self) -> float:
        """The measured row's factor for this backbone, pixels aside: 1 for its own row. Saved
        activations per image grow as depth x width, parameters as depth x width^2: so within
        a family (blocks alike, pooled width tracking the blocks' width) the parameter ratio
        over the width ratio (num_features; ResNet-18 to -34: x1.90, ViT-S to ViT-B: x2.0, both
        as measured). Across families widths are not comparable: the square root of the
        parameter ratio, the middle of depth scaling (x ratio) and width scaling (x root)."""
        if self.measured == self.info.name:
            return 1.0
        params = self.info.params / measured_rows()["rows"][self.measured]["params"]
        if not self.same_family:
            return math.sqrt(params)
        return params * backbone_info(self.measured).num_features / self.info.num_features

    @property
    def width_scale(self) -> float:
        """The measured row's factor for what lies outside the units and for the largest
        tensor: 1 for its own row; within a family the width ratio (num_features): the stem's
        and the widest layer's channels grow with width, not with depth (ResNet-34's stem and
        largest tensor are ResNet-18's, as measured); across families `scale`."""
        if self.measured == self.info.name or not self.same_family:
            return self.scale
        return self.info.num_features / backbone_info(self.measured).num_features

    def provenance(self) -> str:
        """One line: which measured row the activations are, and how it was scaled."""
        rows = measured_rows()
        where = f"timm {rows['timm']}, torch {rows['torch']}, CPU"
        pixels = f"x{(self.image_size / MEASURED_PIXELS) ** 2:.3g} for {self.image_size} px"
        if self.measured == self.info.name:
            return (
                f"activations: {self.info.name}'s own row, measured at {MEASURED_PIXELS} px "
                f"({where}), {pixels}"
            )
        rule = "over the width ratio" if self.same_family else "square root"
        whose = (
            f"the measured {self.info.family} backbone nearest in parameters and width"
            if self.same_family
            else f"no {self.info.family} backbone measured: the measured backbone nearest in "
            "parameters and width"
        )
        return (
            f"activations: estimated from {self.measured} ({whose}, measured at "
            f"{MEASURED_PIXELS} px, {where}), {pixels} and x{self.scale:.2f} for "
            f"{size_label(self.info.params)} against "
            f"{size_label(rows['rows'][self.measured]['params'])} parameters ({rule})"
        )

    def activations(
        self, micro_batch: int, residual_bytes: int, compute_bytes: int, dropout: float
    ) -> Activations:
        """What one micro-batch of `micro_batch` images saves for backward: the measured row's
        bytes per image (its fp32 figures where `compute_bytes` is 4, its bf16 ones under
        autocast otherwise; `residual_bytes` is in the measurement already) x micro_batch x
        the pixel ratio (image_size / 224)^2, the units' x `scale` and spread by position over
        this backbone's (`resample`) where it has another count. Outside the units (x
        `width_scale`): the measured stem, pooling, head (with its dropout mask) and loss, plus
        8 bytes per class beyond the measured 10 (the logits and log-softmax's fp32 output).

        `transient`, backward's largest temporaries: twice the largest saved tensor or unit
        output (x `width_scale`): a gradient of that size arriving and the gradient of its
        input leaving (with this rule, the CPU peaks of bench/README.md's image rows are
        within 7% for the measured backbones, 11% with activation checkpointing).
        """
        del residual_bytes, dropout  # measured: the rows keep fp32 where autocast does
        row = measured_rows()["rows"][self.measured]["fp32" if compute_bytes == 4 else "bf16"]
        pixels = micro_batch * (self.image_size / MEASURED_PIXELS) ** 2
        factor, wide = pixels * self.scale, pixels * self.width_scale
        count = len(self.info.units)
        per_unit = resample(row["per_unit"], count, extensive=True)
        unit_input = resample(row["unit_input"], count, extensive=False)
        head = micro_batch * 8 * (self.classes - MEASURED_CLASSES)
        outside = round(wide * row["outside"]) + max(0, head)
        largest = max(row["largest_saved"], row["largest_output"])
        return Activations(
            per_unit=tuple(round(factor * value) for value in per_unit),
            unit_input=tuple(round(factor * value) for value in unit_input),
            outside=outside,
            transient=round(2 * wide * largest),
        )


def backbone_shape(name: str, image_size: int, classes: int = 1000) -> BackboneShape:
    """The memory model's shape of a `TimmClassifier` of timm model `name` with `classes`
    classes, trained on `image_size`-pixel images.

    Raises:
        AnswerError: an unknown name, or an image smaller than its output stride.
    """
    info = backbone_info(name)
    check_backbone_image_size(name, image_size)
    measured, same_family = nearest_measured(info)
    return BackboneShape(info, image_size, classes, measured, same_family)
