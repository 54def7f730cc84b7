"""Rendering: the template cache, raw copier output already ruff-clean, no Jinja left behind."""

from __future__ import annotations

import re
import shutil
import subprocess
import warnings
from pathlib import Path

import copier
import pytest
import yaml
from conftest import ruff

from scaffold.answers import FRAMEWORK_RENDERS, build_answers
from scaffold.planner import plan
from scaffold.render import ensure_template_repo, template_repo_source
from scaffold.variants import VARIANTS

TEMPLATE = Path(__file__).resolve().parents[1] / "templates"


# Framework renders the matrix does not run: Fabric's fp16 and the other precisions of each
# strategy (the planner refuses fp16 with FSDP2 and with Accelerate).
FRAMEWORK_RENDERS = {
    f"{framework}-{strategy}-{precision}": {
        **VARIANTS["cuda-single-fp16" if precision == "fp16" else "cuda-ddp-bf16"],
        "framework": framework,
        "strategy": strategy,
        "precision": precision,
        "gpus_per_node": 1 if strategy == "single" else 4,
    }
    for framework, renders in FRAMEWORK_RENDERS.items()
    for strategy in renders["strategy"]
    for precision in renders.get("precision", ("fp32", "bf16", "fp16"))
    if (strategy, precision) != ("fsdp2", "fp16")
}


def render_raw(variant: str, dest: Path, answers: dict | None = None) -> None:
    """copier alone (no ruff format, no git): what `scaffold update` will re-render and merge."""
    src, tag = ensure_template_repo()
    chosen = {**(answers or VARIANTS[variant]), "project_name": dest.name}
    data = plan(build_answers(chosen)).copier_data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        copier.run_copy(src, dest, data=data, vcs_ref=tag, defaults=True, quiet=True)


def assert_clean(project: Path) -> None:
    assert ruff(project, "check").returncode == 0, ruff(project, "check").stdout
    formatted = ruff(project, "format", "--check")
    assert formatted.returncode == 0, f"format would change files: {formatted.stdout}"
    for path in project.rglob("*"):
        if path.is_file() and path.suffix != ".png":  # the README's plot of the default run
            text = path.read_text()
            assert "{{" not in text and "{%" not in text, path


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_raw_render_is_lint_and_format_clean_with_no_jinja_left(tmp_path, variant):
    project = tmp_path / "proj"
    render_raw(variant, project)
    assert_clean(project)


@pytest.mark.parametrize("name", list(FRAMEWORK_RENDERS))
def test_every_framework_strategy_and_precision_renders_clean(tmp_path, name):
    """Also under a name that sorts before `conftest`: the tests' imports stay sorted."""
    project = tmp_path / f"aa-{name}"
    render_raw(name, project, FRAMEWORK_RENDERS[name])
    assert_clean(project)
    engine = (project / "src" / project.name.replace("-", "_") / "engine.py").read_text()
    framework, precision = (FRAMEWORK_RENDERS[name][key] for key in ("framework", "precision"))
    assert ("Fabric(" if framework == "fabric" else "Accelerator(") in engine
    step = engine[engine.index("def clip_and_step") :]
    clip = step.index("clip_gradients(" if framework == "fabric" else "clip_grad_norm_(")
    assert clip < step.index("self.optimizer.step()")  # the frameworks unscale inside clipping
    launch_config = project / "launch" / "accelerate_config.yaml"
    if launch_config.exists():  # YAML reads a bare `no` as False, which accelerate launch rejects
        settings = yaml.safe_load(launch_config.read_text())
        assert settings["mixed_precision"] == {"fp32": "no", "bf16": "bf16"}[precision]


def test_fabric_fp16_hands_fabric_its_own_loss_scaler(tmp_path):
    """Fabric turns "16-mixed" on a CPU into another precision unless handed a scaler."""
    project = tmp_path / "fabric-fp16"
    render_raw("", project, FRAMEWORK_RENDERS["fabric-single-fp16"])
    engine = (project / "src" / "fabric_fp16" / "engine.py").read_text()
    assert 'COMPUTE_DTYPE: "16-mixed"' in engine and "GradScaler(device.type, enabled=" in engine
    assert "plugins=[plugin]" in engine and "precision=" not in engine.split("Fabric(")[1][:300]


def test_precision_is_data_in_one_engine_text(tmp_path):
    """bf16 and fp16 render the same engine but for three constants; the fp16 step unscales
    before it clips."""
    engines = {}
    for variant in ("cuda-single-bf16", "cuda-single-fp16"):
        package = variant.replace("-", "_")
        render_raw(variant, tmp_path / package)
        engines[variant] = (tmp_path / package / "src" / package / "engine.py").read_text()
    bf16, fp16 = engines["cuda-single-bf16"], engines["cuda-single-fp16"]
    assert "COMPUTE_DTYPE = torch.bfloat16" in bf16 and "GRAD_SCALER = False" in bf16
    assert "COMPUTE_DTYPE = torch.float16" in fp16 and "GRAD_SCALER = True" in fp16
    constants = re.compile(r"^(STRATEGY|PRECISION|COMPUTE_DTYPE|GRAD_SCALER) = .*$", re.M)
    assert constants.sub("", bf16) == constants.sub("", fp16)
    step = fp16[fp16.index("def clip_and_step") :]
    unscale, clip = step.index("unscale_(self.optimizer)"), step.index("clip_grad_norm_")
    assert unscale < clip < step.index("scaler.step(self.optimizer)")


def tags(repo: Path) -> list[str]:
    return subprocess.run(["git", "tag"], cwd=repo, capture_output=True, text=True).stdout.split()


def test_template_cache_tags_once_and_never_moves_a_tag(tmp_path, monkeypatch):
    repo, source = template_repo_source()
    assert source == "~/.cache/scaffold/template-repo"
    assert ensure_template_repo() == (source, "v0.1.0")
    assert ensure_template_repo() == (source, "v0.1.0")
    assert tags(repo) == ["v0.1.0"]
    first_commit = subprocess.run(
        ["git", "rev-parse", "v0.1.0"], cwd=repo, capture_output=True, text=True
    ).stdout
    changed = tmp_path / "templates"
    shutil.copytree(TEMPLATE, changed)
    (changed / "project" / "configs" / "train.toml.jinja").write_text("seed = 1\n")
    monkeypatch.setattr("scaffold.render.bundled_template", lambda: changed)
    with pytest.warns(UserWarning, match="without a version bump"):
        _, dev_tag = ensure_template_repo()
    assert dev_tag.startswith("v0.1.0+dev.")
    assert (
        subprocess.run(
            ["git", "rev-parse", "v0.1.0"], cwd=repo, capture_output=True, text=True
        ).stdout
        == first_commit
    )


@pytest.mark.parametrize("dest_exists", [False, True])
def test_a_failed_render_leaves_nothing_behind(tmp_path, monkeypatch, dest_exists):
    from scaffold.errors import RenderError
    from scaffold.samples import render_variant

    dest = tmp_path / "proj"
    if dest_exists:
        dest.mkdir()

    def broken_ruff(project):
        raise RenderError("ruff format failed")

    monkeypatch.setattr("scaffold.render.format_with_ruff", broken_ruff)
    with pytest.raises(RenderError):
        render_variant("cpu-single-fp32", dest)
    assert dest.exists() == dest_exists
    assert not dest_exists or list(dest.iterdir()) == []
