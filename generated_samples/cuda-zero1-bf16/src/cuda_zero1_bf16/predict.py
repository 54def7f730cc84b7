"""Classify images: `python -m cuda_zero1_bf16.predict IMAGES... [--top K]`.

Loads the run's config (`config.json` in its folder), its best weights (`model.safetensors`;
`--weights` names another file) and the class names it trained on (its copy of the prepared
images' manifest), then decodes each image as prepare did (EXIF orientation, RGB, the stored
shorter side), resizes and centre-crops it as validation does, and prints its `--top` classes
with their probabilities, one line per image. An image that cannot be read gets a line saying
why; the command then exits with 1.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from .checkpoint import WEIGHTS_FILE
from .config import Config, command_parser, load_config, user_errors
from .data import IMAGENET_MEAN, IMAGENET_STD
from .images.augment import eval_transform
from .images.decode import BadImage, decode_image
from .images.store import manifest_at
from .inference import load_trained
from .task_config import RUN_MANIFEST


@torch.no_grad()
def classify(model: nn.Module, images: Tensor, top: int) -> tuple[Tensor, Tensor]:
    """The `top` likeliest classes of each image of `images` (float32 `[B, 3, S, S]`, as the
    validation transform gives them): (probabilities float32 `[B, top]`, class ids int64
    `[B, top]`), most likely first."""
    model.eval()
    probabilities = torch.softmax(model(images).float(), dim=-1)
    return torch.topk(probabilities, min(top, probabilities.shape[-1]), dim=-1)


def run_classes(run_dir: Path, config: Config) -> tuple[tuple[str, ...], int]:
    """The class names (in class-id order) and stored shorter side of the images the run
    trained on, from its copy of their manifest.

    Raises:
        ValueError: the run trained on the bundled digits (no images to resize like them) or
            kept no manifest.
    """
    if not config.data_dir:
        raise ValueError(
            f"the run in {run_dir} trained on the bundled 8x8 digits; name a run on prepared "
            "images with --run-dir"
        )
    manifest = manifest_at(run_dir / RUN_MANIFEST)
    if manifest is None:
        raise ValueError(f"{run_dir / RUN_MANIFEST} not found: train on prepared images first")
    return manifest.classes, manifest.image_size


def normalization(config: Config) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The channel statistics training normalised with (data.py's, or the backbone's)."""
    if config.model_family == "timm":
        from . import backbone

        return backbone.normalization(backbone.backbone_name(config.backbone, config.init_from))
    return IMAGENET_MEAN, IMAGENET_STD


def main(argv: list[str] | None = None) -> list[list[tuple[str, float]]]:
    """Entry point; prints `IMAGE: class probability, ...` per image and returns the
    (class, probability) lists of the images it read."""
    parser = command_parser(__doc__.splitlines()[0])
    parser.add_argument("images", nargs="+", metavar="IMAGES", help="image files")
    parser.add_argument("--run-dir", help="the trained run (default: configs/train.toml's)")
    parser.add_argument("--weights", default=WEIGHTS_FILE, help="a weights file of the run")
    parser.add_argument("--top", type=int, default=5, help="classes shown per image")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, mps")
    args = parser.parse_args(argv)
    with user_errors():
        if args.top < 1:
            raise ValueError(f"--top must be at least 1, got {args.top}")
        run_dir = Path(args.run_dir or load_config("configs/train.toml").run_dir)
        auto = "cuda" if torch.cuda.is_available() else "cpu"
        device = torch.device(auto if args.device == "auto" else args.device)
        model, config = load_trained(run_dir, args.weights, device)
        classes, stored = run_classes(run_dir, config)
        missing = [path for path in args.images if not Path(path).is_file()]
        if missing:
            raise ValueError(f"no such image file: {', '.join(missing)}")
    transform = eval_transform(config.image_size, *normalization(config))
    results, failed = [], False
    for path in args.images:
        try:
            pixels = decode_image(Path(path), stored)
        except BadImage as error:
            print(f"{path}: unreadable ({error})")
            failed = True
            continue
        image = transform(torch.from_numpy(pixels).permute(2, 0, 1)).unsqueeze(0).to(device)
        probabilities, ids = classify(model, image, args.top)
        pairs = zip(ids[0].tolist(), probabilities[0].tolist(), strict=True)
        ranked = [(classes[i], p) for i, p in pairs]
        print(f"{path}: " + ", ".join(f"{name} {p:.3f}" for name, p in ranked))
        results.append(ranked)
    if failed:
        raise SystemExit(1)
    return results


if __name__ == "__main__":
    main()
