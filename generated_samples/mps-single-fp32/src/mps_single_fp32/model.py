"""The example model: a small CNN for 8x8 digits, sized from a target parameter count.

This file is yours: replace the model with your own; `scaffold update` leaves it alone. What the
rest of the project needs from it (`train.py` imports nothing else from here):

- `build_model(config) -> nn.Module`, whose `forward(inputs)` maps a batch of `data.py`
  (float32 `[B, *IMAGE_SHAPE]`) to raw logits, float `[B, NUM_CLASSES]` (no softmax: the loss
  applies log-softmax itself). Start the logits near zero, so the initial loss is
  ln(NUM_CLASSES), the sanity ladder's rung 2.
- `model.shard_units() -> list[nn.Module]`: the submodules a strategy that shards the model
  wraps one at a time (each is gathered whole only while it runs) and activation checkpointing
  recomputes one at a time; the blocks of the network.
- `model.init_tensor(name, tensor, generator)`: fill `tensor`, a CPU tensor of the full shape
  of parameter (or buffer) `name`, with its initial value, drawing only from `generator`. The
  project builds the model on the meta device and initialises it one parameter at a time with
  this (engine/build.py), so a model sharded over N processes starts from the same weights as on one
  and no process ever holds the whole model. `__init__` calls it too: a model built directly
  is initialised.
- No BatchNorm: batch statistics would make K accumulated micro-batches differ from one batch
  of K times the size, and couple the samples of a batch.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .config import Config, parse_param_count
from .data import IMAGE_SHAPE, NUM_CLASSES, input_spec

POOLED = 4  # the side of the feature map the head reads


class DigitsCNN(nn.Module):
    """Three 3x3 conv blocks and a linear head: `[B, *IMAGE_SHAPE]` float -> logits
    `[B, classes]`. The digits' 8x8 come to 4x4 after the max-pooling; larger images are
    averaged down to 4x4 before the head (`AdaptiveAvgPool2d`), so the head's size does not
    grow with the image.

    GroupNorm rather than BatchNorm (see the contract above).
    """

    def __init__(
        self,
        width: int,
        num_classes: int = NUM_CLASSES,
        dropout: float = 0.1,
        image_shape: tuple[int, int, int] = IMAGE_SHAPE,
    ):
        super().__init__()
        channels, height, width_px = image_shape
        larger = min(height, width_px) // 2 > POOLED
        self.features = nn.Sequential(
            _conv_block(channels, width),
            _conv_block(width, 2 * width),
            nn.MaxPool2d(2),  # 8x8 -> 4x4
            _conv_block(2 * width, 2 * width),
            nn.AdaptiveAvgPool2d(POOLED) if larger else nn.Identity(),
            nn.Flatten(),
        )
        self.head = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(2 * width * POOLED * POOLED, num_classes)
        )
        for name, parameter in self.named_parameters():  # nothing to fill on the meta device
            self.init_tensor(name, parameter.data)

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.features(images))

    def shard_units(self) -> list[nn.Module]:
        """The conv blocks: the units a sharding strategy wraps one by one."""
        return [module for module in self.features if isinstance(module, nn.Sequential)]

    def init_tensor(
        self, name: str, tensor: Tensor, generator: torch.Generator | None = None
    ) -> None:
        """Fill `tensor` (parameter `name`'s full shape) in place: convolutions as PyTorch
        initialises them (weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)), the bound of
        `kaiming_uniform_` with a = sqrt(5)), GroupNorm weights 1 and biases 0, and the head
        N(0, 1e-3) with a zero bias: near-zero logits, an initial loss of ln(10) (rung 2)."""
        owner = self.get_submodule(name.rpartition(".")[0])
        if isinstance(owner, nn.GroupNorm):
            nn.init.constant_(tensor, 1.0 if name.endswith("weight") else 0.0)
        elif owner is self.head[1]:
            if name.endswith("bias"):
                nn.init.zeros_(tensor)
            else:
                nn.init.normal_(tensor, std=1e-3, generator=generator)
        else:
            bound = 1 / math.sqrt(math.prod(owner.weight.shape[1:]))
            nn.init.uniform_(tensor, -bound, bound, generator=generator)


def _conv_block(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1),
        nn.GroupNorm(8, out_channels),
        nn.GELU(),
    )


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters in `model`."""
    return sum(parameter.numel() for parameter in model.parameters())


def width_for_param_count(target: int) -> int:
    """Smallest base width (a multiple of 8, for GroupNorm's 8 groups) reaching `target` params.

    Models are built on the meta device, so sizing allocates no memory.
    """
    low, high = 1, 1024  # in units of 8 channels
    while low < high:
        middle = (low + high) // 2
        with torch.device("meta"):
            params = count_parameters(DigitsCNN(8 * middle))
        low, high = (middle + 1, high) if params < target else (low, middle)
    return 8 * low


def build_model(config: Config) -> nn.Module:
    """The example model at the width whose parameter count best reaches `config.model_size`,
    for the classes and input shape of the data (`data.input_spec`); or with `model_family =
    "timm"` the `backbone` from timm with a new head (backbone.py; `model_size` unused)."""
    num_classes, image_shape = input_spec(config)
    if config.model_family == "timm":
        from .backbone import TimmClassifier, backbone_name, check_image_size

        name = backbone_name(config.backbone, config.init_from)
        check_image_size(name, config.image_size)
        return TimmClassifier(name, num_classes, config.dropout, config.init_from)
    width = width_for_param_count(parse_param_count(config.model_size))
    return DigitsCNN(width, num_classes, dropout=config.dropout, image_shape=image_shape)
