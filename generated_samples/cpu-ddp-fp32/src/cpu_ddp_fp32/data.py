"""The example data: scikit-learn's bundled 8x8 handwritten digits, or your images prepared by
`python -m cpu_ddp_fp32.prepare` (set `data_dir`), read a batch at a time.

This file is yours: replace the data with your own; `scaffold update` leaves it alone. What the
rest of the project needs from it (`train.py` imports nothing else from here):

- `build_datasets(config) -> (train, validation)`: two map-style datasets with `len()` where
  `dataset[list_of_indices]` returns a whole batch `(inputs, targets)`: inputs as `model.py`
  takes them (here float32 `[B, *IMAGE_SHAPE]`), targets int64 class ids `[B]` in
  `[0, NUM_CLASSES)`. Random augmentation draws, per sample, from a generator seeded by the
  run's seed, the epoch and the sample's index (images.sample_seed; the loader calls
  `set_epoch`), so it repeats exactly on a resume, at any number of processes or workers.
- `input_spec(config) -> (classes, shape)`: the number of classes and one input's shape, which
  `model.py` builds for: the digits' `NUM_CLASSES` and `IMAGE_SHAPE`, or the prepared images'
  classes and `(3, image_size, image_size)`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import Tensor
from torch.utils.data import Dataset

from .config import Config
from .images import EVAL_CROP, MANIFEST, read_manifest, sample_seed

NUM_CLASSES = 10
IMAGE_SHAPE = (1, 8, 8)
# Prepared images are normalised with ImageNet's channel statistics, those of most pretrained
# backbones (torchvision's and timm's defaults).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class InMemoryImageDataset(Dataset):
    """Images and labels held in memory and read a whole batch at a time.

    `dataset[indices]` (a list of ints) returns `(images, labels)`: float32 `[B, 1, H, W]`,
    normalised with the training split's mean and std, and int64 `[B]`. Reading by batch costs
    one indexing op instead of B `__getitem__` calls and a collate.

    With `augment_seed` set, each image is shifted by up to one pixel in each direction, drawn
    from a generator seeded by (augment_seed, epoch, index): the same shift whichever process
    or worker reads the sample.
    """

    def __init__(
        self, images: Tensor, labels: Tensor, mean: float, std: float, augment_seed: int | None
    ):
        self.images = images  # [N, 1, H, W] in [0, 1]
        self.labels = labels  # [N]
        self.mean, self.std = mean, std
        self.augment_seed = augment_seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, indices: list[int]) -> tuple[Tensor, Tensor]:
        index = torch.as_tensor(indices, dtype=torch.long)
        images = self.images[index]
        if self.augment_seed is not None:
            offsets = [self.draw_shift(i) for i in indices]
            images = shift(images, torch.tensor(offsets), max_shift=1)
        return (images - self.mean) / self.std, self.labels[index]

    def draw_shift(self, i: int) -> list[int]:
        """Sample i's (dy, dx) offsets into its 1-pixel padding, each in {0, 1, 2}."""
        generator = torch.Generator().manual_seed(sample_seed(self.augment_seed, self.epoch, i))
        return torch.randint(0, 3, (2,), generator=generator).tolist()


def shift(images: Tensor, offsets: Tensor, max_shift: int) -> Tensor:
    """Shift each image of `[B, C, H, W]` by its own `offsets[b]` (int `[B, 2]`, (dy, dx) in
    [0, 2 * max_shift]: max_shift is no shift). Pixels shifted in are zero (the digits'
    background). One gather for the whole batch."""
    b, _, h, w = images.shape
    padded = torch.nn.functional.pad(images, (max_shift,) * 4)
    rows = offsets[:, 0].view(b, 1, 1) + torch.arange(h).view(1, h, 1)  # [B, H, 1]
    cols = offsets[:, 1].view(b, 1, 1) + torch.arange(w).view(1, 1, w)  # [B, 1, W]
    batch = torch.arange(b).view(b, 1, 1)
    return padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2)


def input_spec(config: Config) -> tuple[int, tuple[int, int, int]]:
    """(number of classes, one input's shape `(channels, height, width)`) of the data
    `build_datasets` returns; prepared images' from their manifest.

    Raises:
        ValueError: `data_dir` set and nothing prepared there.
    """
    if not config.data_dir:
        return NUM_CLASSES, IMAGE_SHAPE
    manifest = read_manifest(Path(config.data_dir), prepare_hint(config))
    return len(manifest.classes), (3, config.image_size, config.image_size)


def prepare_hint(config: Config) -> str:
    """How to prepare images where `data_dir` names none: into it where it is empty or new,
    else (your photos themselves, say) into a folder of their own."""
    data_dir = Path(config.data_dir)
    command = "python -m cpu_ddp_fp32.prepare"
    if data_dir.is_dir() and any(data_dir.iterdir()):
        return (
            f"it holds no {MANIFEST}: prepare it into a folder of its own, "
            f"`{command} {data_dir} --out data/{data_dir.name}-prepared`, and set data_dir to it"
        )
    return f"run `{command} YOUR_IMAGES --out {data_dir}`"


def build_datasets(config: Config) -> tuple[Dataset, Dataset]:
    """The prepared images of `config.data_dir`, or without one the digits."""
    if config.data_dir:
        return prepared_datasets(config)
    return digits_datasets(config)


def digits_datasets(config: Config) -> tuple[InMemoryImageDataset, InMemoryImageDataset]:
    """Split the 1,797 digits into train/validation with a permutation seeded by `config.seed`.

    Returns (train, validation); only the training split is augmented. Both are normalised with
    the training split's pixel mean and std, so no validation statistics leak into training.
    """
    from sklearn.datasets import load_digits  # here: DataLoader workers never need it (~2 s)

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(config.seed))
    num_val = round(len(labels) * config.val_fraction)
    val_index, train_index = order[:num_val], order[num_val:]
    mean = images[train_index].mean().item()
    std = images[train_index].std().item()
    augment_seed = config.seed if config.augment else None
    train = InMemoryImageDataset(images[train_index], labels[train_index], mean, std, augment_seed)
    val = InMemoryImageDataset(images[val_index], labels[val_index], mean, std, None)
    return train, val


def prepared_datasets(config: Config) -> tuple[Dataset, Dataset]:
    """The train and val splits prepared in `config.data_dir`, as images.augment reads them:
    training images randomly cropped to `image_size` (and `augment_policy`), validation ones
    resized and centre-cropped.

    Raises:
        ValueError: nothing prepared there.
    """
    from .images.augment import PreparedImages, eval_transform, train_transform
    from .images.store import StoredImages

    data_dir = Path(config.data_dir)
    manifest = read_manifest(data_dir, prepare_hint(config))
    if manifest.image_size < config.image_size:
        warnings.warn(
            f"{data_dir} stores images of {manifest.image_size} px (shorter side) and "
            f"image_size={config.image_size}: every crop is upscaled; prepare with --image-size "
            f"{round(config.image_size / EVAL_CROP)} or lower image_size",
            stacklevel=2,
        )
    size, stats = config.image_size, (IMAGENET_MEAN, IMAGENET_STD)
    if config.model_family == "timm":  # the statistics the backbone was trained with
        from .backbone import backbone_name, normalization

        stats = normalization(backbone_name(config.backbone, config.init_from))
    if config.augment:
        transform, augment_seed = train_transform(size, config.augment_policy, *stats), config.seed
    else:
        transform, augment_seed = eval_transform(size, *stats), None
    train = PreparedImages(StoredImages(data_dir, manifest, "train"), transform, augment_seed)
    val = PreparedImages(
        StoredImages(data_dir, manifest, "val"), eval_transform(size, *stats), None
    )
    return train, val
