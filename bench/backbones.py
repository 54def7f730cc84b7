"""The image backbones' tables that scaffold ships as data (it needs neither torch nor timm to
plan): `python bench/backbones.py [--models] [--activations] [--only NAME ...] [--smoke]` in
an environment with torch and timm (.venv-vision). Without flags both tables are written.
`--smoke` writes both for SMOKE_NAMES into a temporary folder and prints them: a check that the
script still runs, the shipped tables untouched.

- scaffold/data/timm_models.json (`--models`): every name in `timm.list_models()`, built on the
  meta device with num_classes=0 as the rendered `backbone.py` builds it (`TimmClassifier`):
  `{"timm": version, "skipped": {name: error}, "models": {name: [params, tensors, stride,
  num_features, [unit params...], classifier, state elements, fixed side]}}`. `params`: the
  backbone's parameters (no classifier); `tensors` and `state elements`: its state dict's
  tensors and their elements (parameters and persistent buffers), what a weights file of it
  holds less the classifier; `stride`: the last `feature_info` reduction (1 where it has none);
  `classifier`: timm's `pretrained_cfg["classifier"]` (a key prefix, or a list of them, or "");
  `fixed side`: the only crop side the model takes (`pretrained_cfg["fixed_input_size"]`, a
  ViT's), 0 for any; the unit params: each shard unit's parameters, the units
  `TimmClassifier.shard_units()` picks (`blocks`, `stages` or `layers` when a
  Sequential/ModuleList, else the `layer*` children, else the whole backbone).
- scaffold/data/backbone_activations.json (`--activations`): for MEASURED backbones, the bytes
  per 224-pixel image that autograd saves for backward (module `measure_row`), in fp32 and
  under CPU autocast bf16.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import timm
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # scaffold from this checkout
from scaffold.backbones import timm_row, timm_shard_units  # noqa: E402

DATA = ROOT / "scaffold" / "data"
MEASURED = (
    "resnet10t",
    "resnet18",
    "resnet50",
    "convnext_tiny",
    "efficientnet_b0",
    "vit_tiny_patch16_224",
    "vit_small_patch16_224",
    "vit_base_patch16_224",
    "vit_large_patch16_224",
)
SMOKE_NAMES = ("resnet10t", "test_convnext")
IMAGE_SIZE = 224
BATCHES = (2, 4)  # the per-image figures are the slope between these two batch sizes
CLASSES = 10  # the head measured; scaffold adds the class count's own part
DROPOUT = 0.1  # the head's dropout (TimmClassifier's), so its mask is counted


def count(module: nn.Module) -> int:
    """Parameters of `module`, shared ones once."""
    return sum(parameter.numel() for parameter in module.parameters())


def write_models(names: list[str], data: Path = DATA) -> Path:
    """Build every model on meta; write timm_models.json into `data` (a model that fails is
    skipped); its path."""
    models, skipped = {}, {}
    start = time.time()
    for index, name in enumerate(names):
        try:
            models[name] = timm_row(name)
        except Exception as error:  # noqa: BLE001 - any failure to build skips the model
            skipped[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        if index % 100 == 0:
            print(f"{index}/{len(names)} {time.time() - start:.0f} s", file=sys.stderr, flush=True)
    path = data / "timm_models.json"
    text = json.dumps(
        {"timm": timm.__version__, "skipped": skipped, "models": models}, separators=(",", ":")
    )
    path.write_text(text + "\n")
    print(f"{path}: {len(models)} models, {len(skipped)} skipped, {len(text):,} bytes")
    return path


class Saved:
    """Storages autograd saves in one forward pass, by where they were saved: shard unit i,
    or outside the units (None). A storage is counted once, where it was first saved;
    parameters' storages (and autocast's weight casts, which do not grow with the batch) are
    model state, not activations."""

    def __init__(self, model: nn.Module, units: list[nn.Module]):
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.seen: dict[int, tuple[int | None, int]] = {}
        self.current: int | None = None
        self.inputs: list[int] = [0] * len(units)
        self.outputs: list[int] = [0] * len(units)
        self.hooks = []
        for index, unit in enumerate(units):
            self.hooks.append(unit.register_forward_pre_hook(self.enter(index)))
            self.hooks.append(unit.register_forward_hook(self.leave(index)))

    def enter(self, index: int):
        def hook(module, args):
            self.current = index
            self.inputs[index] = sum(a.nbytes for a in args if isinstance(a, torch.Tensor))

        return hook

    def leave(self, index: int):
        def hook(module, args, output):
            self.current = None
            if isinstance(output, torch.Tensor):
                self.outputs[index] = output.nbytes

        return hook

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer not in self.params and pointer not in self.seen:
            self.seen[pointer] = (self.current, storage.nbytes())
        return tensor

    def figures(self, units: int) -> dict:
        """Bytes saved in each unit and outside, and the largest saved storage."""
        per_unit = [0] * units
        outside = 0
        for where, size in self.seen.values():
            if where is None:
                outside += size
            else:
                per_unit[where] += size
        largest = max(size for _, size in self.seen.values())
        return {
            "per_unit": per_unit,
            "unit_input": list(self.inputs),
            "outside": outside,
            "largest_saved": largest,
            "largest_output": max(self.outputs),
        }


def saved_at(name: str, batch: int, precision: str) -> dict:
    """What one forward pass of `batch` images (and the loss) saves, by place (`Saved`)."""
    torch.manual_seed(0)
    backbone = timm.create_model(name, pretrained=False, num_classes=0)
    model = nn.Sequential(
        backbone, nn.Dropout(DROPOUT), nn.Linear(backbone.num_features, CLASSES)
    ).train()
    for module in model.modules():  # TimmClassifier keeps BatchNorm in eval mode
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.eval()
    units = timm_shard_units(backbone)
    saved = Saved(model, units)
    images = torch.randn(batch, 3, IMAGE_SIZE, IMAGE_SIZE)
    labels = torch.randint(0, CLASSES, (batch,))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda tensor: tensor), autocast:
        loss = nn.functional.cross_entropy(model(images).float(), labels)
    figures = saved.figures(len(units))
    del loss
    return figures


def measure_row(name: str) -> dict:
    """Per-image bytes of backbone `name` at IMAGE_SIZE, fp32 and bf16: the slope of each
    figure of `saved_at` between the two BATCHES (batch-independent parts drop out), and the
    largest saved storage and unit output per image (at the larger batch, divided by it)."""
    row: dict = {"params": count(timm.create_model(name, pretrained=False, num_classes=0))}
    low, high = BATCHES
    for precision in ("fp32", "bf16"):
        start = time.time()
        small, large = saved_at(name, low, precision), saved_at(name, high, precision)

        def slope(a, b):
            return round((b - a) / (high - low))

        pairs = {
            key: zip(small[key], large[key], strict=True) for key in ("per_unit", "unit_input")
        }
        row[precision] = {
            "per_unit": [slope(a, b) for a, b in pairs["per_unit"]],
            "unit_input": [slope(a, b) for a, b in pairs["unit_input"]],
            "outside": slope(small["outside"], large["outside"]),
            "largest_saved": large["largest_saved"] // high,
            "largest_output": large["largest_output"] // high,
        }
        print(f"{name} {precision}: {time.time() - start:.0f} s", file=sys.stderr, flush=True)
    return row


def write_activations(names: list[str], data: Path = DATA) -> Path:
    """Measure `names` and write backbone_activations.json into `data` (rows already there are
    kept); its path."""
    path = data / "backbone_activations.json"
    table = json.loads(path.read_text()) if path.is_file() else {"rows": {}}
    table.update(
        timm=timm.__version__,
        torch=torch.__version__,
        image_size=IMAGE_SIZE,
        classes=CLASSES,
        dropout=DROPOUT,
        batches=list(BATCHES),
    )
    for name in names:
        table["rows"][name] = measure_row(name)
        path.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{path}: {len(table['rows'])} rows")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", action="store_true", help="write timm_models.json")
    parser.add_argument("--activations", action="store_true", help="measure the MEASURED rows")
    parser.add_argument("--only", nargs="+", help="these names only")
    parser.add_argument("--smoke", action="store_true", help="SMOKE_NAMES into a temporary folder")
    args = parser.parse_args()
    if args.smoke:
        with tempfile.TemporaryDirectory() as folder:
            for path in (
                write_models(list(SMOKE_NAMES), Path(folder)),
                write_activations(list(SMOKE_NAMES[:1]), Path(folder)),
            ):
                print(path.read_text())
        return
    both = not (args.models or args.activations)
    DATA.mkdir(exist_ok=True)
    if args.models or both:
        write_models(args.only or timm.list_models())
    if args.activations or both:
        write_activations(args.only or list(MEASURED))


if __name__ == "__main__":
    main()
