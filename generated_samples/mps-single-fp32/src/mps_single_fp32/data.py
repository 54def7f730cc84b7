"""The example data: scikit-learn's bundled 8x8 handwritten digits, read a batch at a time.

This file is yours: replace the data with your own; `scaffold update` leaves it alone. What the
rest of the project needs from it (`train.py` imports nothing else from here):

- `build_datasets(config) -> (train, validation)`: two map-style datasets with `len()` where
  `dataset[list_of_indices]` returns a whole batch `(inputs, targets)`: inputs as `model.py`
  takes them (here float32 `[B, *IMAGE_SHAPE]`), targets int64 class ids `[B]` in
  `[0, NUM_CLASSES)`. Random augmentation draws from torch's global RNG (seeded per DataLoader
  worker), so it repeats exactly on a resume.
- `NUM_CLASSES`: the number of classes (the initial loss is ln of it).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.data import Dataset

from .config import Config

NUM_CLASSES = 10
IMAGE_SHAPE = (1, 8, 8)


class InMemoryImageDataset(Dataset):
    """Images and labels held in memory and read a whole batch at a time.

    `dataset[indices]` (a list of ints) returns `(images, labels)`: float32 `[B, 1, H, W]`,
    normalised with the training split's mean and std, and int64 `[B]`. Reading by batch costs
    one indexing op instead of B `__getitem__` calls and a collate (~21 us vs ~450 us for
    64 digits).

    With `augment=True` each image is shifted by up to one pixel in each direction, drawn from
    torch's RNG of the process that reads the batch (a DataLoader worker's own seeded RNG).
    """

    def __init__(self, images: Tensor, labels: Tensor, mean: float, std: float, augment: bool):
        self.images = images  # [N, 1, H, W] in [0, 1]
        self.labels = labels  # [N]
        self.mean, self.std = mean, std
        self.augment = augment

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, indices: list[int]) -> tuple[Tensor, Tensor]:
        index = torch.as_tensor(indices, dtype=torch.long)
        images = self.images[index]
        if self.augment:
            images = random_shift(images, max_shift=1)
        return (images - self.mean) / self.std, self.labels[index]


def random_shift(images: Tensor, max_shift: int) -> Tensor:
    """Shift each image of `[B, C, H, W]` by its own random offset in [-max_shift, max_shift]^2.

    Pixels shifted in are zero (the digits' background). One gather for the whole batch.
    """
    b, _, h, w = images.shape
    padded = torch.nn.functional.pad(images, (max_shift,) * 4)
    dy = torch.randint(0, 2 * max_shift + 1, (b, 1, 1))
    dx = torch.randint(0, 2 * max_shift + 1, (b, 1, 1))
    rows = dy + torch.arange(h).view(1, h, 1)  # [B, H, 1]
    cols = dx + torch.arange(w).view(1, 1, w)  # [B, 1, W]
    batch = torch.arange(b).view(b, 1, 1)
    return padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2)


def build_datasets(config: Config) -> tuple[InMemoryImageDataset, InMemoryImageDataset]:
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
    train = InMemoryImageDataset(
        images[train_index], labels[train_index], mean, std, config.augment
    )
    val = InMemoryImageDataset(images[val_index], labels[val_index], mean, std, augment=False)
    return train, val
