"""Real images: prepare (every kind of file a folder of photographs holds, bad input refused
with nothing written), augmentation that is a function of (seed, epoch, index) alone, and a
run on prepared images that resumes bitwise. The tests make their own images."""

from __future__ import annotations

import csv
import dataclasses
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import BatchSampler

from accelerate_cuda_ddp_bf16.config import Config
from accelerate_cuda_ddp_bf16.data import build_datasets, input_spec
from accelerate_cuda_ddp_bf16.images import MANIFEST, Options, prepare_images
from accelerate_cuda_ddp_bf16.images.store import StoredImages, read_manifest
from accelerate_cuda_ddp_bf16.loader import epoch_iterator, make_train_loader
from accelerate_cuda_ddp_bf16.loader.samplers import train_sampler
from accelerate_cuda_ddp_bf16.model import build_model
from accelerate_cuda_ddp_bf16.runtime import init_runtime
from accelerate_cuda_ddp_bf16.task import SUMS, eval_sums, loss_fn, validation_metrics
from accelerate_cuda_ddp_bf16.train import Trainer

from conftest import config_for_tests, exported_weights

STORED = 32  # the prepared shorter side; the example model sees 16 x 16 crops, timm 32 x 32
CLASSES = ("bird", "cat", "dog")
EXIF_ORIENTATION = 0x0112  # 6: the camera was turned; rotate 90 degrees clockwise to view


def save(path: Path, image: Image.Image, **options) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, **options)
    return path


def make_images(root: Path) -> dict[str, Path]:
    """train/<class>/ of 8 images each in every mode and format, the odd ones named."""
    generator = np.random.default_rng(0)
    for number, label in enumerate(CLASSES):
        for i in range(8):
            size = (24 + 4 * i, 20 + 2 * (i % 3))  # (width, height): several sizes
            noise = generator.integers(0, 60, (size[1], size[0], 3), dtype=np.uint8)
            pixels = noise + np.array([80 * number, 40, 200 - 80 * number], dtype=np.uint8)
            image = Image.fromarray(pixels)
            formats = ("jpg", "png", "webp")
            save(root / "train" / label / f"{i}.{formats[i % 3]}", image)
    odd = {
        "cmyk": save(root / "train/cat/cmyk.jpg", Image.new("CMYK", (30, 20), (0, 255, 255, 0))),
        "gray": save(root / "train/dog/gray.png", Image.new("L", (20, 26), 128)),
        "alpha": save(root / "train/bird/alpha.png", Image.new("RGBA", (22, 22), (0, 0, 0, 0))),
    }
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = 6
    odd["rotated"] = save(root / "train/cat/rotated.jpg", Image.new("RGB", (40, 20)), exif=exif)
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (9, 9, 9)).save(buffer, "JPEG")
    odd["truncated"] = root / "train/dog/truncated.jpg"
    odd["truncated"].write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    (root / "train" / "dog" / "notes.txt").write_text("not an image")
    return odd


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    """Images made and prepared once for the module (in one worker process): (folder, odd)."""
    root = tmp_path_factory.mktemp("images")
    odd = make_images(root / "photos")
    prepare_images([str(root / "photos")], root / "prepared", Options(image_size=STORED), workers=1)
    return root / "prepared", odd


def images_config(run_dir: Path, data_dir: Path, **settings) -> Config:
    """The tests' config on prepared images: 16 x 16 crops, batches of 4, one epoch."""
    values = {"data_dir": str(data_dir), "image_size": 16, "micro_batch_size": 4, "epochs": 1}
    values |= {"warmup_steps": 2, "checkpoint_every": 2, "val_every": 0, "num_workers": 0}
    return dataclasses.replace(config_for_tests(run_dir), **(values | settings))


def test_prepare_decodes_every_kind_of_image_and_lists_what_it_skipped(prepared):
    data_dir, odd = prepared
    manifest = read_manifest(data_dir, "prepare first")
    assert manifest.classes == CLASSES
    assert [entry["path"] for entry in manifest.skipped] == [str(odd["truncated"])]
    train, val = (StoredImages(data_dir, manifest, split) for split in ("train", "val"))
    shapes = [train.pixels(i).shape for i in range(len(train))]
    shapes += [val.pixels(i).shape for i in range(len(val))]
    assert all(min(h, w) == STORED and channels == 3 for h, w, channels in shapes)
    # 8 + the alpha image of birds, 8 + cmyk + rotated cats, 8 + gray dogs (truncated skipped)
    assert {
        label: manifest.counts["train"][label] + manifest.counts["val"][label] for label in CLASSES
    } == {"bird": 9, "cat": 10, "dog": 9}
    assert all(count >= 1 for count in manifest.counts["val"].values())  # held out per class
    pixels = {tuple(map(int, train.pixels(i)[STORED // 2, STORED // 2])) for i in range(len(train))}
    pixels |= {tuple(map(int, val.pixels(i)[STORED // 2, STORED // 2])) for i in range(len(val))}
    assert (255, 255, 255) in pixels  # the transparent image, composited over white
    assert any(abs(r - 255) < 8 and g < 8 and b < 8 for r, g, b in pixels)  # CMYK (0,1,1,0): red
    # The rotated photo (stored 40 wide, 20 high, orientation 6) comes out upright: portrait.
    portrait = [s for s in shapes if s[0] > s[1]]
    assert (2 * STORED, STORED, 3) in portrait
    assert len(portrait) == 1 + 1  # and the 20 x 26 gray one


def test_prepare_refuses_bad_sources_in_one_line_and_writes_nothing(tmp_path, prepared):
    photos = tmp_path / "photos"
    make_images(photos)
    out = tmp_path / "out"
    (photos / "train" / "horse").mkdir()
    with pytest.raises(ValueError, match="class 'horse' .* has no images"):
        prepare_images([str(photos)], out, Options(image_size=STORED))
    (photos / "train" / "horse").rmdir()
    save(photos / "val" / "zebra" / "0.png", Image.new("RGB", (20, 20)))
    with pytest.raises(ValueError, match="zebra are not classes of the training images"):
        prepare_images([str(photos)], out, Options(image_size=STORED))
    (photos / "val" / "zebra" / "0.png").unlink()
    (photos / "val" / "zebra").rmdir()
    (photos / "val").rmdir()
    with pytest.raises(ValueError, match="more than 0 images could not be read.*truncated"):
        prepare_images([str(photos)], out, Options(image_size=STORED, max_bad=0))
    with pytest.raises(ValueError, match="no such file or folder"):
        prepare_images([str(tmp_path / "missing")], out)
    assert not out.exists() and not list(tmp_path.glob(".out.partial-*"))
    # The folder prepare would replace holds your photos, or other files: refused, kept.
    photo_count = len(list(photos.rglob("*.*")))
    with pytest.raises(ValueError, match="would hold or replace the sources"):
        prepare_images([str(photos)], photos, Options(image_size=STORED))
    with pytest.raises(ValueError, match="would hold or replace the sources"):
        prepare_images([str(photos)], photos / "prepared", Options(image_size=STORED))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds files that are not prepared data"):
        prepare_images([str(photos)], tmp_path / "notes", Options(image_size=STORED))
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"
    assert len(list(photos.rglob("*.*"))) == photo_count


def test_prepare_again_on_the_same_sources_does_nothing_and_a_table_reads_the_same(
    tmp_path, prepared
):
    data_dir, _ = prepared
    photos = data_dir.parent / "photos"
    lines = []
    before = {path.name: path.stat().st_mtime_ns for path in data_dir.iterdir()}
    manifest = prepare_images([str(photos)], data_dir, Options(image_size=STORED), log=lines.append)
    assert any("up to date" in line for line in lines)
    assert {path.name: path.stat().st_mtime_ns for path in data_dir.iterdir()} == before
    table = photos / "images.csv"
    rows = [
        {"path": str(path.relative_to(photos)), "label": path.parent.name}
        for path in sorted((photos / "train").rglob("*.png"))
    ]
    with table.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=["path", "label"])
        writer.writeheader()
        writer.writerows(rows)
    from_table = prepare_images([str(table)], tmp_path / "table", Options(image_size=STORED))
    assert from_table.classes == manifest.classes
    assert from_table.images("train") + from_table.images("val") == len(rows)


def test_a_sample_is_augmented_by_the_seed_epoch_and_index_alone(prepared, tmp_path):
    data_dir, _ = prepared
    config = images_config(tmp_path / "run", data_dir, augment_policy="trivialaugment")
    train, val = build_datasets(config)
    images, labels = train[[3, 0, 5]]
    assert images.shape == (3, *input_spec(config)[1]) and images.dtype == torch.float32
    assert labels.dtype == torch.int64
    # The same sample, read alone or in another batch, is the same tensor.
    assert torch.equal(train[[5]][0][0], images[2])
    assert torch.equal(train[[0, 7]][0][0], images[1])
    # The global batch of one process = the samples two processes read, whichever rank.
    order = list(BatchSampler(train_sampler(train, config.seed, init_runtime("cpu")), 8, True))[0]
    ranks = [order[rank::2] for rank in range(2)]
    assert torch.equal(train[order][0][0::2], train[ranks[0]][0])
    assert torch.equal(train[order][0][1::2], train[ranks[1]][0])
    # Another epoch draws other crops; validation is deterministic.
    train.set_epoch(1)
    assert not torch.equal(train[[3]][0][0], images[0])
    assert torch.equal(val[[0, 1]][0], val[[0, 1]][0])
    # DataLoader workers read the very batches the training process reads itself.
    batches = {}
    for workers in (0, 2):
        loader = make_train_loader(
            train, dataclasses.replace(config, num_workers=workers), init_runtime("cpu")
        )
        iterator = epoch_iterator(loader, 1, loader.generator.get_state(), skip=0)
        batches[workers] = [images for images, _ in iterator]
    assert all(torch.equal(a, b) for a, b in zip(batches[0], batches[2], strict=True))


def test_a_run_on_prepared_images_resumes_bitwise_with_augmentation_on(prepared, tmp_path):
    data_dir, _ = prepared
    settings = {"augment_policy": "trivialaugment", "epochs": 2}
    straight = images_config(tmp_path / "straight", data_dir, **settings)
    summary = Trainer(straight, init_runtime("cpu")).fit()
    model = build_model(straight)
    assert model.head[1].out_features == len(CLASSES)
    stopped = images_config(tmp_path / "resumed", data_dir, stop_after_steps=3, **settings)
    Trainer(stopped, init_runtime("cpu")).fit()
    resumed = dataclasses.replace(stopped, stop_after_steps=0)
    resumed_summary = Trainer(resumed, init_runtime("cpu"), resume=True).fit()
    assert resumed_summary["steps"] == summary["steps"] > 3
    assert summary["expected_initial_loss"] == pytest.approx(np.log(len(CLASSES)))
    # What a classifier's user looks at: each class's accuracy by name, the confusion matrix.
    assert (Path(straight.run_dir) / "confusion.png").stat().st_size > 0
    report = (Path(straight.run_dir) / "summary.md").read_text()
    assert all(f"{name} " in report.split("**Per class**")[1] for name in CLASSES)
    expected, actual = (exported_weights(Path(c.run_dir)) for c in (straight, resumed))
    assert all(torch.equal(actual[name], value) for name, value in expected.items())
    assert (data_dir / MANIFEST).is_file()


def timm_weights(folder: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """A resnet10t with random weights and another classifier (7 classes), saved as a
    safetensors file: what a user downloads from the Hub, made here."""
    import timm
    from safetensors.torch import save_file

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        saved = timm.create_model("resnet10t", pretrained=False, num_classes=7).state_dict()
    save_file(saved, folder / "resnet10t.safetensors")
    return folder / "resnet10t.safetensors", saved


def timm_config(run_dir: Path, data_dir: Path, weights: Path, **settings) -> Config:
    """32 x 32 crops: resnet10t's output stride (check_image_size)."""
    backbone = {"model_family": "timm", "backbone": "resnet10t", "init_from": str(weights)}
    values = {"dropout": 0.0, "image_size": STORED} | backbone
    return images_config(run_dir, data_dir, **(values | settings))


def test_a_timm_backbone_fine_tunes_under_this_engine_and_predict_names_the_classes(
    prepared, tmp_path, capsys
):
    """Three steps from the file's weights with a new head of 3 classes, on this variant's
    engine; BatchNorm's statistics stay the file's; predict reads the best weights."""
    from accelerate_cuda_ddp_bf16.predict import main as predict_main

    data_dir, odd = prepared
    weights, saved = timm_weights(tmp_path)
    config = timm_config(tmp_path / "run", data_dir, weights, max_steps=3)
    Trainer(config, init_runtime("cpu")).fit()
    trained = exported_weights(Path(config.run_dir))
    assert not torch.equal(trained["backbone.conv1.0.weight"], saved["conv1.0.weight"])
    assert torch.equal(trained["backbone.bn1.running_mean"], saved["bn1.running_mean"])
    photos = sorted((data_dir.parent / "photos" / "train" / "cat").glob("*.png"))[:2]
    ranked = predict_main([*map(str, photos), "--run-dir", config.run_dir, "--top", "2"])
    assert [len(classes) for classes in ranked] == [2, 2]
    assert all(name in CLASSES and 0 <= p <= 1 for classes in ranked for name, p in classes)
    assert capsys.readouterr().out.count(": ") >= 2
    with pytest.raises(SystemExit) as stopped:  # the truncated file: its own line, then 1
        predict_main([str(odd["truncated"]), "--run-dir", config.run_dir])
    assert stopped.value.code == 1 and "unreadable" in capsys.readouterr().out


def test_a_timm_backbone_loads_strictly_starts_at_ln_classes_and_overfits_one_batch(
    prepared, tmp_path
):
    from safetensors.torch import save_file

    from accelerate_cuda_ddp_bf16.engine import build_on_meta
    from accelerate_cuda_ddp_bf16.engine.build import materialize

    data_dir, _ = prepared
    weights, saved = timm_weights(tmp_path)
    config = timm_config(tmp_path / "run", data_dir, weights)
    model = materialize(build_on_meta(config), torch.device("cpu"), config.seed)
    assert model.head[1].out_features == len(CLASSES)
    with pytest.raises(ValueError, match="output stride of 32"):  # its last stage: < 1 pixel
        build_on_meta(dataclasses.replace(config, image_size=16))
    vit = {"backbone": "vit_tiny_patch16_224", "init_from": "", "image_size": 64}
    with pytest.raises(ValueError, match="takes only 224-pixel crops"):  # position embeddings
        build_on_meta(dataclasses.replace(config, **vit))
    assert torch.equal(model.state_dict()["backbone.conv1.0.weight"], saved["conv1.0.weight"])
    plain = dataclasses.replace(config, augment=False)
    images, labels = build_datasets(plain)[0][[0, 1, 2, 3]]
    model.train()
    assert abs(loss_fn(model(images), labels).item() - np.log(len(CLASSES))) < 0.15
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(30):
        optimizer.zero_grad()
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05, loss.item()
    # The backbone at a tenth of the head's rate, and still for its first epoch (2 steps here).
    from accelerate_cuda_ddp_bf16.training import build_optimizer, build_scheduler

    slow = dataclasses.replace(config, backbone_lr_ratio=0.1, freeze_backbone_epochs=1)
    optimizer = build_optimizer(model, slow)
    scheduler = build_scheduler(optimizer, slow, total_steps=10, steps_per_epoch=2)
    backbone = [g for g in optimizer.param_groups if g.get("frozen_epochs") == 1]
    head = [g for g in optimizer.param_groups if "frozen_epochs" not in g]
    assert backbone and head and all(g["initial_lr"] == 0.1 * slow.lr for g in backbone)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    for step in range(3):
        assert all(g["lr"] == 0 for g in backbone) == (step < 2)
        assert all(g["lr"] > 0 for g in head)
        optimizer.zero_grad()
        loss_fn(model(images), labels).backward()
        optimizer.step()
        scheduler.step()
        if step == 0:
            moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
            assert "head.1.weight" in moved and not any(n.startswith("backbone.") for n in moved)
    # A file of another model is refused by name, before anything is built.
    save_file({**saved, "extra.weight": torch.zeros(1)}, weights)
    with pytest.raises(ValueError, match="does not hold resnet10t's weights .*unexpected: extra"):
        build_model(config)
    with pytest.raises(ValueError, match="'resnet1ot' is not a timm model"):
        build_model(dataclasses.replace(config, backbone="resnet1ot"))


def test_validation_sums_count_each_class_and_the_top_5():
    """7 classes (so a top-5 accuracy): the confusion matrix's rows are the true classes."""
    logits = (-5.0 - 0.01 * torch.arange(7.0)).repeat(4, 1)  # no ties: class 0 first, then 1...
    logits[0, 2] = logits[1, 3] = logits[2, 2] = 5.0  # predicted: 2, 3, 2
    for rank in range(6):  # sample 3's likeliest six: 6, 5, 4, 3, 2, 1 (its class is 0)
        logits[3, 6 - rank] = 6.0 - rank
    targets = torch.tensor([2, 2, 4, 0])
    sums = eval_sums(logits[:2], targets[:2]) + eval_sums(logits[2:], targets[2:])  # 2 ranks
    totals = dict(zip(SUMS, sums.tolist(), strict=False)) | {"extra": sums[len(SUMS) :].tolist()}
    metrics = validation_metrics(totals)
    assert metrics["val_accuracy"] == 0.25
    assert metrics["val_top5_accuracy"] == 0.75  # only sample 3's class is outside its top 5
    assert metrics["val_confusion"][2] == [0, 0, 1, 1, 0, 0, 0]
    assert metrics["val_class_accuracy"][2] == 0.5 and metrics["val_class_accuracy"][4] == 0.0
    assert np.isnan(metrics["val_class_accuracy"][1])  # no sample of class 1
