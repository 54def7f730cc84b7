"""The augmentation recipe's constants, torch-free (prepare and its workers import them): the
policies of prepared images, the evaluation crop, and the seed of one sample's draws, a
function of the run's seed, the epoch and the sample's index alone. Not of the rank, the
DataLoader worker or the batch that reads it, so a sample is augmented the same way at any
number of processes or workers, and a resume (on any world size) draws what the straight run
drew."""

from __future__ import annotations

import hashlib

# The augmentations `augment_policy` names beyond the crop and flip (augment.py applies them).
AUGMENT_POLICIES = ("none", "trivialaugment", "randaugment")
EVAL_CROP = 0.875  # the centre crop's share of the resized shorter side (ImageNet's convention)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed for `torch.manual_seed` or `torch.Generator.manual_seed`: BLAKE2b of the
    three numbers, so that neighbouring indices or epochs give unrelated streams (adding them
    would not: seed + epoch + index repeats along diagonals)."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
