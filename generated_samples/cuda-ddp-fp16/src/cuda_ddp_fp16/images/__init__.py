"""Real images: labelled image files found (`sources.py`), decoded and resized by Pillow in
worker processes (`decode.py`) into memory-mapped uint8 shards with their manifest
(`store.py`), by `prepare_images` (`pipeline.py`), which `python -m <package>.prepare` runs;
read back and augmented per sample with torchvision (`augment.py`, imported only where prepared
images are read: the bundled digits need torch alone)."""

from .pipeline import Options, prepare_images
from .recipe import AUGMENT_POLICIES, EVAL_CROP, sample_seed
from .store import MANIFEST, ImageManifest, StoredImages, read_manifest

__all__ = [
    "AUGMENT_POLICIES",
    "EVAL_CROP",
    "MANIFEST",
    "ImageManifest",
    "Options",
    "StoredImages",
    "prepare_images",
    "read_manifest",
    "sample_seed",
]
