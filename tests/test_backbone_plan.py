"""A timm backbone answered to `scaffold new`: the plan reads a real timm weights file (written
by timm in .venv-vision), estimates the memory from the measured table, takes the fine-tuning
recipe, and renders it into configs/train.toml; the rendered project's backbone.py loads the
file scaffold accepted, and scaffold refuses the file of another backbone, as training does.
One render serves every check."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest
from conftest import run_scaffold

from scaffold.recipes import FINETUNE_BASE_LR

pytestmark = pytest.mark.slow

BACKBONE = "resnet10t"  # timm's smallest ResNet: 4.9M parameters, built in a second on a CPU
WRITE_WEIGHTS = """
import sys, timm
from safetensors.torch import save_file
for name, path in zip(sys.argv[1::2], sys.argv[2::2]):
    # a pretrained file as timm saves one: with its own 5-class classifier, which scaffold
    # and the project both leave out
    save_file(timm.create_model(name, pretrained=False, num_classes=5).state_dict(), path)
"""


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> dict[str, Path]:
    """resnet10t's and resnet18's weights files, written by timm."""
    from conftest import VISION_PYTHON

    folder = tmp_path_factory.mktemp("weights")
    files = {name: folder / f"{name}.safetensors" for name in (BACKBONE, "resnet18")}
    pairs = [str(part) for name, path in files.items() for part in (name, path)]
    subprocess.run([str(VISION_PYTHON), "-c", WRITE_WEIGHTS, *pairs], check=True)
    return files


@pytest.fixture(scope="module")
def rendered(tmp_path_factory, weights) -> tuple[Path, str]:
    """`scaffold new img` with the backbone, its weights and a 64-pixel crop: the project, and
    what the command printed."""
    where = tmp_path_factory.mktemp("new")
    data = ["model_family=timm", f"backbone={BACKBONE}", f"init_from={weights[BACKBONE]}"]
    data += ["image_size=64", "host_memory_gb=16"]
    result = run_scaffold(
        "new", "img", "--defaults", *(part for pair in data for part in ("--data", pair)),
        cwd=where,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return where / "img", result.stdout


def test_the_plan_reads_the_weights_and_the_measured_table(rendered):
    project, printed = rendered
    assert f"backbone={BACKBONE}:" in printed and printed.count("Estimated memory") == 1
    assert f"activations: {BACKBONE}'s own row, measured at 224 px" in printed
    assert "x0.0816 for 64 px" in printed, "the measured row scaled by the pixel count"
    settings = tomllib.loads((project / "configs" / "train.toml").read_text())
    assert (settings["model_family"], settings["backbone"]) == ("timm", BACKBONE)
    assert (settings["image_size"], settings["backbone_lr_ratio"]) == (64, 0.1)
    assert settings["freeze_backbone_epochs"] == 1
    assert settings["lr"] == pytest.approx(FINETUNE_BASE_LR * 64 / 256, rel=0.05)  # 2 digits
    toml = (project / "configs" / "train.toml").read_text()
    assert "# plan: as answered: its weights hold 4,9" in toml, "the file's own count"
    assert "MAE" in toml and "LP-FT" in toml, "the recipe names its sources"


def test_next_names_the_commands_and_the_backbone_file(rendered):
    project, printed = rendered
    next_steps = printed.split("Next:")[1]
    for command in ("python -m img.prepare", "python -m img.predict", "src/img/backbone.py"):
        assert command in next_steps
    readme = (project / "README.md").read_text()
    assert "`backbone.py`, `data.py`" in readme, "the README's table: backbone.py is yours"
    assert f"The plan trains timm's `{BACKBONE}`" in readme
    quick_start = readme.split("## Quick start")[1].split("```")[1]
    assert quick_start.index("img.prepare PHOTOS/") < quick_start.index("img.train")


def test_the_project_loads_the_file_scaffold_accepted(rendered, weights):
    """The rendered backbone.py checks every key against timm's model: the same file passes."""
    from conftest import VISION_PYTHON

    project, _ = rendered
    load = (
        "import sys; sys.path.insert(0, 'src'); from img.backbone import TimmClassifier; "
        f"model = TimmClassifier({BACKBONE!r}, 3, 0.1, {str(weights[BACKBONE])!r}); "
        "print(sum(p.numel() for p in model.backbone.parameters()))"
    )
    loaded = subprocess.run(
        [str(VISION_PYTHON), "-c", load], cwd=project, capture_output=True, text=True
    )
    assert loaded.returncode == 0, loaded.stderr
    settings = (project / ".copier-answers.yml").read_text()
    assert f"model_size: '{loaded.stdout.strip()}'" in settings, "scaffold's count is timm's"


def test_the_weights_of_another_backbone_are_refused_and_nothing_is_written(tmp_path, weights):
    result = run_scaffold(
        "new", "img", "--defaults", "--data", f"backbone={BACKBONE}",
        "--data", f"init_from={weights['resnet18']}", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2 and not (tmp_path / "img").exists()
    assert f"does not hold {BACKBONE}'s weights" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
