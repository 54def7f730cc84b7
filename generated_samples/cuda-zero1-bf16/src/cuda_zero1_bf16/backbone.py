"""A pretrained image backbone from timm with a new classification head: `model_family =
"timm"` and `backbone = "<timm model name>"` in configs/train.toml.

The backbone is built by `timm.create_model(backbone, pretrained=False, num_classes=0)` (its
pooled features; nothing is downloaded) and its weights come from `init_from`: a weights file
(`.safetensors`, or a `.pth`/`.bin` state dict, read with `weights_only=True`) or a folder in
the Hugging Face layout timm saves (`model.safetensors` or `pytorch_model.bin`, and
`config.json`, whose `architecture` names the backbone where `backbone` is empty). Its keys
must be the backbone's exactly, less the original classifier (timm's `pretrained_cfg`
names it): a file of another model is refused by name, not half-loaded. Without `init_from`
the backbone starts from timm's own initialisation, drawn from the run's seed.

The head, `Dropout` and `Linear(num_features, classes)`, starts at N(0, 1e-3) with a zero bias:
near-zero logits, an initial loss of ln(classes). BatchNorm layers stay in eval mode (their
pretrained running statistics, updated never): a batch's statistics would couple its samples
and make K accumulated micro-batches differ from one batch of K times the size (the same rule
as model.py's, kept for backbones that were trained with BatchNorm; Wu and Johnson, "Rethinking
'Batch' in BatchNorm", 2021, on frozen BN for fine-tuning).
"""

from __future__ import annotations

import functools
import json
import warnings
from pathlib import Path

import timm
import torch
from torch import Tensor, nn

WEIGHTS_FILES = ("model.safetensors", "pytorch_model.bin")
SHOWN = 3  # keys named in an error


def backbone_name(backbone: str, init_from: str) -> str:
    """The timm model name: `backbone`, or the `architecture` of init_from's config.json.

    Raises:
        ValueError: neither names one, or the name is not a timm model.
    """
    config = Path(init_from) / "config.json"
    if not backbone and init_from and config.is_file():
        backbone = json.loads(config.read_text()).get("architecture", "")
    if backbone and not timm.is_model(backbone):
        raise ValueError(
            f'backbone={backbone!r} is not a timm model; python -c "import timm; '
            "print(timm.list_models('resnet*'))\" lists the names"
        )
    if backbone:
        return backbone
    raise ValueError(
        'model_family = "timm" needs backbone = "<a timm model name>" (e.g. resnet50), or an '
        "init_from folder whose config.json names its architecture"
    )


def check_image_size(name: str, image_size: int) -> None:
    """Refuse crops of `image_size` pixels a side smaller than backbone `name`'s output stride
    (timm's `feature_info` reduction of its last stage: 32 for a ResNet, 16 for a ViT of
    16-pixel patches). Its last stage would see less than one pixel of the image, all padding,
    and CPU convolution kernels in reduced precision gave weight gradients of ~1e27 in ~5% of
    steps on such 1 x 1 maps here (torch 2.13 and 2.14; pytorch/pytorch#169688 is a kin of it).

    A backbone timm builds for one input size only (`pretrained_cfg["fixed_input_size"]`: a
    ViT's position embeddings are made for its `input_size`) takes crops of that size alone.

    Raises:
        ValueError: `image_size` is below the output stride, or not a fixed-size backbone's.
    """
    config = meta_backbone(name).pretrained_cfg
    fixed = config["input_size"][-1] if config.get("fixed_input_size") else 0
    if fixed and image_size != fixed:
        raise ValueError(
            f"image_size={image_size}: {name} takes only {fixed}-pixel crops (its position "
            f"embeddings are made for that size); set image_size = {fixed}"
        )
    info = getattr(meta_backbone(name), "feature_info", None)
    stride = info[-1]["reduction"] if info else 1
    if image_size < stride:
        raise ValueError(
            f"image_size={image_size} is below {name}'s output stride of {stride} pixels: its "
            f"last stage would see less than one pixel; raise image_size to at least {stride}"
        )


def weights_file(init_from: str) -> Path:
    """The weights file init_from names (itself, or the one in its folder).

    Raises:
        ValueError: no such file, or a folder without one.
    """
    path = Path(init_from)
    if path.is_dir():
        found = [path / name for name in WEIGHTS_FILES if (path / name).is_file()]
        if not found:
            raise ValueError(f"init_from={init_from} holds none of {', '.join(WEIGHTS_FILES)}")
        return found[0]
    if not path.is_file():
        raise ValueError(f"init_from={init_from}: no such file or folder")
    return path


def read_weights(path: Path) -> dict[str, Tensor]:
    """A state dict from a safetensors file or a `torch.save`d one (`weights_only=True`; a
    checkpoint that nests it under `state_dict` or `model` is unwrapped)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(path)
    state = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model"):
        if isinstance(state.get(key), dict):
            state = state[key]
    return state


def classifier_prefixes(model: nn.Module) -> tuple[str, ...]:
    """The key prefixes of the original classifier in a pretrained file of `model`'s
    architecture (timm's `pretrained_cfg["classifier"]`: "fc", "head.fc", "head" ...)."""
    named = getattr(model, "pretrained_cfg", {}).get("classifier") or ()
    return tuple(f"{name}." for name in ((named,) if isinstance(named, str) else named))


def matching_weights(
    model: nn.Module, name: str, state: dict[str, Tensor], source: Path
) -> dict[str, Tensor]:
    """`state` less its original classifier, checked against the backbone `model` (timm's
    `name`)'s own
    parameters and buffers: the same keys with the same shapes.

    Raises:
        ValueError: a key missing, unexpected or of another shape, the first ones named.
    """
    classifier = classifier_prefixes(model)
    state = {key: value for key, value in state.items() if not key.startswith(classifier)}
    own = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    problems = [
        f"{what}: {', '.join(keys[:SHOWN])}{' ...' if len(keys) > SHOWN else ''}"
        for what, keys in (("missing", missing), ("unexpected", unexpected), ("shape", shapes))
        if keys
    ]
    if problems:
        raise ValueError(
            f"{source} does not hold {name}'s weights ({'; '.join(problems)}); set backbone to "
            "the model it was saved from"
        )
    return state


class TimmClassifier(nn.Module):
    """A timm backbone's pooled features and a linear head: float `[B, 3, H, W]` -> logits
    `[B, classes]` (module docstring). `shard_units` and `init_tensor` as model.py's contract
    asks."""

    def __init__(self, name: str, num_classes: int, dropout: float, init_from: str = ""):
        super().__init__()
        self.name = name
        self.backbone = timm.create_model(name, pretrained=False, num_classes=0)
        self.head = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(self.backbone.num_features, num_classes)
        )
        self.source = weights_file(init_from) if init_from else None
        if self.source is None:
            warnings.warn(
                f"no init_from: {name} starts from timm's random initialisation, not from "
                "pretrained weights",
                stacklevel=2,
            )
        self._weights: dict[str, Tensor] | None = None
        if self.source is not None:  # refused now, before any engine places the model
            state = read_weights(self.source)
            self._weights = matching_weights(self.backbone, name, state, self.source)
        self.train()  # BatchNorm in eval mode from the start

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.backbone(images))

    def train(self, mode: bool = True) -> TimmClassifier:
        super().train(mode)
        for module in self.modules():  # BatchNorm keeps its running statistics (docstring)
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()
        return self

    def shard_units(self) -> list[nn.Module]:
        """The backbone's blocks or stages (ViTs' `blocks`, ConvNeXts' `stages`, ResNets'
        `layer1`-`layer4`), or the whole backbone where it has neither."""
        for attribute in ("blocks", "stages", "layers"):
            units = getattr(self.backbone, attribute, None)
            if isinstance(units, nn.Sequential | nn.ModuleList):
                return list(units)
        layers = [module for name, module in self.backbone.named_children() if name[:5] == "layer"]
        return layers or [self.backbone]

    def init_tensor(
        self, name: str, tensor: Tensor, generator: torch.Generator | None = None
    ) -> None:
        """Fill `tensor` (parameter or buffer `name`'s full shape): the backbone's from
        init_from's weights, or without them from timm's initialisation of a model built on
        the CPU from a seed drawn from `generator`; the head's N(0, 1e-3) weight and zero
        bias."""
        if name.startswith("head."):
            if name.endswith("bias"):
                nn.init.zeros_(tensor)
            else:
                nn.init.normal_(tensor, std=1e-3, generator=generator)
            return
        if self._weights is None:
            self._weights = self.initial_backbone(generator)
        tensor.copy_(self._weights[name.removeprefix("backbone.")])

    def initial_backbone(self, generator: torch.Generator | None) -> dict[str, Tensor]:
        """timm's own initial weights of the backbone, from a seed `generator` draws."""
        seed = int(torch.randint(2**62, (1,), generator=generator))
        with torch.random.fork_rng(devices=[]), torch.device("cpu"):
            torch.manual_seed(seed)
            fresh = timm.create_model(self.name, pretrained=False, num_classes=0)
        return fresh.state_dict()


@functools.cache
def meta_backbone(name: str) -> nn.Module:
    """timm's model `name` without its classifier, on the meta device (no memory, nothing
    downloaded), built once per process: its `pretrained_cfg` and `feature_info` describe it."""
    with torch.device("meta"):
        return timm.create_model(name, pretrained=False, num_classes=0)


def normalization(name: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The channel mean and std the backbone was trained with (its `pretrained_cfg`)."""
    config = meta_backbone(name).pretrained_cfg
    return tuple(config["mean"]), tuple(config["std"])
