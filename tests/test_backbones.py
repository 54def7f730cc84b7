"""scaffold.backbones: the timm snapshot, init_from's weights and the backbones' memory shapes,
in plain Python (no torch, no timm: the shipped tables and hand-written safetensors headers)."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from scaffold import backbones
from scaffold.backbones import (
    backbone_info,
    backbone_shape,
    check_backbone_image_size,
    family_of,
    safetensors_header,
    weights_backbone,
)
from scaffold.errors import AnswerError
from scaffold.memory import estimate

TINY = "test_convnext"  # timm's test model: 99 tensors, 207,128 parameters, no buffers


def write_safetensors(path: Path, shapes: dict[str, tuple[int, ...]]) -> Path:
    """A safetensors file of zero fp32 tensors of `shapes`, written by hand (the format: an
    8-byte little-endian header length, the JSON header, the data)."""
    header, offset = {}, 0
    for key, shape in shapes.items():
        size = 4
        for dim in shape:
            size *= dim
        header[key] = {
            "dtype": "F32",
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(offset))
    return path


def shapes_of(name: str, classifier: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Stand-in tensors with `name`'s tensor and element counts (one long, the rest of one
    element), and a classifier's."""
    info = backbone_info(name)
    shapes = {f"t{index}": (1,) for index in range(info.tensors - 1)}
    shapes["big"] = (info.elements - (info.tensors - 1),)
    return {**shapes, **classifier}


def test_unknown_name_refused_with_the_nearest_names() -> None:
    with pytest.raises(AnswerError, match="resnet18") as error:
        backbone_info("resnet19")
    assert "\n" not in str(error.value)
    assert "timm.list_models" in str(error.value)


def test_a_name_the_snapshot_lacks_is_built_by_the_installed_timm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("timm")  # skipped where timm is not installed (CI's .venv)
    snapshot = backbones.timm_models()
    models = {name: row for name, row in snapshot["models"].items() if name != "resnet18"}
    monkeypatch.setattr(backbones, "timm_models", lambda: {**snapshot, "models": models})
    assert backbone_info("resnet18").params == 11_176_512


def test_resnet18_info() -> None:
    info = backbone_info("resnet18")
    assert (info.params, info.tensors, info.stride, info.num_features) == (11_176_512, 120, 32, 512)
    assert len(info.units) == 4 and sum(info.units) < info.params
    assert info.family == "resnet" and info.classifier == ("fc",)


def test_families() -> None:
    assert family_of("resnet10t") == family_of("resnet50") == "resnet"
    assert family_of("vit_base_patch16_224") == "vit"
    assert family_of("tf_efficientnet_b0") == "efficientnet"
    assert family_of("resnetv2_50") == "resnetv2"


def test_header_parameter_count_read(tmp_path: Path) -> None:
    classifier = {"head.fc.weight": (1000, 64), "head.fc.bias": (1000,)}
    path = write_safetensors(tmp_path / "tiny.safetensors", shapes_of(TINY, classifier))
    assert len(safetensors_header(path)) == backbone_info(TINY).tensors + 2
    assert weights_backbone(str(path), TINY) == (TINY, 207_128)


def test_weights_of_another_backbone_refused(tmp_path: Path) -> None:
    path = write_safetensors(tmp_path / "other.safetensors", shapes_of("test_nfnet", {}))
    with pytest.raises(AnswerError, match=f"does not hold {TINY}'s weights"):
        weights_backbone(str(path), TINY)


def test_timm_folder_names_its_architecture(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "model.safetensors", shapes_of(TINY, {}))
    (tmp_path / "config.json").write_text(json.dumps({"architecture": TINY}))
    assert weights_backbone(str(tmp_path), "") == (TINY, 207_128)
    with pytest.raises(AnswerError, match=f"answer backbone={TINY}"):
        weights_backbone(str(tmp_path), "resnet18")


def test_init_from_refusals(tmp_path: Path) -> None:
    with pytest.raises(AnswerError, match="no such file"):
        weights_backbone(str(tmp_path / "missing.safetensors"), TINY)
    with pytest.raises(AnswerError, match="holds none of"):
        weights_backbone(str(tmp_path), TINY)
    path = write_safetensors(tmp_path / "tiny.safetensors", shapes_of(TINY, {}))
    with pytest.raises(AnswerError, match="does not name its model"):
        weights_backbone(str(path), "")
    (tmp_path / "broken.safetensors").write_bytes(struct.pack("<Q", 2**40) + b"{}")
    with pytest.raises(AnswerError, match="not a readable safetensors file"):
        weights_backbone(str(tmp_path / "broken.safetensors"), TINY)
    (tmp_path / "config.json").write_text("[")
    with pytest.raises(AnswerError, match="is not a JSON object"):
        weights_backbone(str(tmp_path), TINY)


def test_torch_file_without_torch_is_not_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    path = tmp_path / "resnet18.pth"
    path.write_bytes(b"not read")
    assert weights_backbone(str(path), "resnet18") == ("resnet18", 11_176_512)


def test_activations_scale_with_pixels_and_micro_batch() -> None:
    small, large = backbone_shape("resnet50", 224), backbone_shape("resnet50", 448)
    base = small.activations(2, 4, 4, 0.0)
    assert sum(large.activations(2, 4, 4, 0.0).per_unit) == pytest.approx(4 * sum(base.per_unit))
    assert sum(small.activations(8, 4, 4, 0.0).per_unit) == pytest.approx(4 * sum(base.per_unit))
    assert small.activations(2, 4, 2, 0.0).saved(False) < base.saved(False)  # the bf16 row
    assert "resnet50's own row" in small.provenance()


def test_unmeasured_backbone_borrows_its_family() -> None:
    shape = backbone_shape("resnet34", 224, classes=10)
    # nearest in parameters and width: ResNet-18's basic blocks, not ResNet-50's bottlenecks
    assert shape.measured == "resnet18" and shape.same_family
    assert "estimated from resnet18 (the measured resnet backbone" in shape.provenance()
    own = backbone_shape("resnet18", 224, classes=10).activations(1, 4, 4, 0.0)
    borrowed = shape.activations(1, 4, 4, 0.0)
    assert len(borrowed.per_unit) == len(shape.unit_params) == 4
    assert sum(borrowed.per_unit) == pytest.approx(shape.scale * sum(own.per_unit), rel=1e-6)
    assert shape.scale == pytest.approx(21_284_672 / 11_176_512)  # the same pooled width
    assert (borrowed.outside, borrowed.transient) == (own.outside, own.transient)  # one stem
    assert shape.params == 21_284_672 + 512 * 10 + 10
    peak = estimate(
        shape, strategy="single", precision="fp32", world_size=1, micro_batch=8, checkpointing=False
    ).peak
    assert peak > 16 * shape.params


def test_unmeasured_family_borrows_the_nearest_overall() -> None:
    shape = backbone_shape("swin_tiny_patch4_window7_224", 224)
    assert not shape.same_family
    assert "no swin backbone measured" in shape.provenance()
    units = len(shape.unit_params)
    assert len(shape.activations(2, 4, 2, 0.0).unit_input) == units


def test_stride_check() -> None:
    check_backbone_image_size("resnet18", 32)
    with pytest.raises(AnswerError, match="raise image_size to at least 32"):
        check_backbone_image_size("resnet18", 16)
    with pytest.raises(AnswerError, match="answer image_size=224"):  # ViTs: one size only
        backbone_shape("vit_small_patch16_224", 160)
    check_backbone_image_size("vit_small_patch16_224", 224)
    with pytest.raises(AnswerError, match="takes only 448-pixel crops"):
        check_backbone_image_size("eva02_large_patch14_448", 224)
