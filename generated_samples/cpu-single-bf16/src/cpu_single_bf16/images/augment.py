"""Prepared images as a dataset: decoded from the memory-mapped shards, augmented per sample
with torchvision's `transforms.v2`, read a whole batch at a time.

Training: RandomResizedCrop to `image_size` (scale 0.08-1, aspect 3/4-4/3: the Inception
recipe torchvision's ImageNet references use), a horizontal flip, optionally TrivialAugment
(Muller and Hutter 2021) or RandAugment (Cubuk et al. 2020), then float and normalised.
Evaluation: resize the shorter side to image_size / 0.875 and take the centre crop (the
ImageNet evaluation convention), deterministic.

Each training sample's random draws come from torch's generator reseeded with
`sample_seed(seed, epoch, index)` (recipe.py) around its transform, then restored: a sample is
augmented the same way whichever process, worker or batch reads it, and the training
process's own random stream (dropout) is untouched where it reads batches itself
(`num_workers=0`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset
from torchvision.transforms import v2

from .recipe import EVAL_CROP, sample_seed
from .store import StoredImages


def train_transform(
    image_size: int, policy: str, mean: tuple[float, ...], std: tuple[float, ...]
) -> v2.Compose:
    """uint8 `[3, H, W]` -> float32 `[3, image_size, image_size]`, randomly cropped, flipped
    and (a `policy` other than none: recipe.AUGMENT_POLICIES) augmented, then normalised."""
    steps = [v2.RandomResizedCrop(image_size, antialias=True), v2.RandomHorizontalFlip()]
    if policy == "trivialaugment":
        steps.append(v2.TrivialAugmentWide())
    elif policy == "randaugment":
        steps.append(v2.RandAugment())
    return v2.Compose([*steps, v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])


def eval_transform(image_size: int, mean: tuple[float, ...], std: tuple[float, ...]) -> v2.Compose:
    """uint8 `[3, H, W]` -> float32 `[3, image_size, image_size]`: resized, centre-cropped,
    normalised."""
    return v2.Compose(
        [
            v2.Resize(round(image_size / EVAL_CROP), antialias=True),
            v2.CenterCrop(image_size),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean, std),
        ]
    )


class PreparedImages(Dataset):
    """`dataset[indices]` (a list of ints) -> `(images, labels)`: float32 `[B, 3, S, S]` and
    int64 `[B]`, S the transform's output size.

    With `augment_seed` set (training), sample i of epoch e is transformed under
    `torch.manual_seed(sample_seed(augment_seed, e, i))`; `set_epoch` (called by the loader
    before each epoch, and carried into the DataLoader workers that epoch starts) sets e.
    """

    def __init__(self, images: StoredImages, transform: v2.Compose, augment_seed: int | None):
        self.images, self.transform, self.augment_seed = images, transform, augment_seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, indices: list[int]) -> tuple[Tensor, Tensor]:
        images = torch.stack([self.sample(i) for i in indices])
        return images, torch.from_numpy(self.images.labels[indices])

    def sample(self, i: int) -> Tensor:
        """Image i, transformed: float32 `[3, S, S]`."""
        pixels = torch.from_numpy(np.array(self.images.pixels(i)))  # a copy: writable
        image = pixels.permute(2, 0, 1)  # [H, W, 3] -> [3, H, W]
        if self.augment_seed is None:
            return self.transform(image)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(sample_seed(self.augment_seed, self.epoch, i))
            return self.transform(image)
