"""generated_samples/ holds exactly what the current template renders for every variant."""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
import yaml
from shared_renders import raw_render

import scaffold.samples
from scaffold.samples import stale_sample_files
from scaffold.tools import format_with_ruff
from scaffold.variants import VARIANTS

SAMPLES = Path(__file__).resolve().parents[1] / "generated_samples"


def test_every_variant_has_a_sample():
    assert sorted(p.name for p in SAMPLES.iterdir() if p.is_dir()) == sorted(VARIANTS)


def fresh_render(factory: pytest.TempPathFactory, variant: str, dest: Path) -> Path:
    """What `scaffold samples` renders for `variant` at `dest` (named `variant`): copier's
    output in a fresh template cache (shared with test_render, which reads the same render),
    formatted by scaffold's own ruff step. render_project does no more for a sample."""
    shutil.copytree(raw_render(factory, variant), dest)
    format_with_ruff(dest)
    return dest


def differing_files(left: Path, right: Path) -> list[str]:
    """Paths under either folder that the other lacks or holds with other bytes."""

    def files(folder: Path) -> dict[str, bytes]:
        found = folder.rglob("*") if folder.is_dir() else ()
        return {str(p.relative_to(folder)): p.read_bytes() for p in found if p.is_file()}

    left_files, right_files = files(left), files(right)
    paths = left_files.keys() | right_files.keys()
    return sorted(path for path in paths if left_files.get(path) != right_files.get(path))


def test_samples_match_a_fresh_render(tmp_path_factory, tmp_path):
    stale = [
        f"{variant}/{path}"
        for variant in VARIANTS
        for path in differing_files(
            fresh_render(tmp_path_factory, variant, tmp_path / variant), SAMPLES / variant
        )
    ]
    assert stale == [], "re-render with `scaffold samples`; stale: " + ", ".join(stale)


def test_the_samples_check_lists_each_file_that_differs_from_a_fresh_render(
    tmp_path_factory, tmp_path, monkeypatch
):
    """`scaffold samples --check`'s comparison (one variant here: it renders each one): a
    changed file, a missing one and an extra one are listed, and nothing else."""
    variant = "cpu-single-fp32"
    monkeypatch.setattr(scaffold.samples, "VARIANTS", {variant: VARIANTS[variant]})
    sample = fresh_render(tmp_path_factory, variant, tmp_path / variant)
    readme = sample / "README.md"
    readme.write_text(readme.read_text() + "\nAn edit.\n")
    (sample / "configs" / "train.toml").unlink()
    (sample / "notes.txt").write_text("not rendered")
    assert sorted(stale_sample_files(tmp_path)) == [
        f"{variant}/{path}" for path in ("README.md", "configs/train.toml", "notes.txt")
    ]


def test_new_with_a_variant_into_a_folder_of_its_name_equals_its_sample(tmp_path):
    from conftest import run_scaffold, snapshot

    name = "cuda-ddp-bf16"
    result = run_scaffold("new", name, "--variant", name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rendered, sample = snapshot(tmp_path / name), snapshot(SAMPLES / name)
    assert rendered == sample


def test_the_github_matrix_lists_exactly_the_variants():
    import yaml

    workflow = Path(__file__).resolve().parents[1] / ".github" / "workflows" / "variants.yml"
    jobs = yaml.safe_load(workflow.read_text())["jobs"]
    assert jobs["variant"]["strategy"]["matrix"]["variant"] == list(VARIANTS)


# What a rendered file may name only where its variant uses it (comments and messages
# included): each answer value's own words, searched case-sensitively as regular expressions.
STRATEGY_WORDS = {
    "ddp": [r"\bDDP\b", "DistributedDataParallel", "no_sync"],
    "fsdp2": ["FSDP", "fully_shard", r"torch\.distributed\.checkpoint"],
    "zero": ["DeepSpeed", "deepspeed", r"\bZeRO\b", "ds_config", "[Oo]ffload", "CPU Adam"],
    "multi-process": ["torchrun", r"\bgloo\b", r"\bNCCL\b"],
}
FRAMEWORK_WORDS = {
    "fabric": ["Fabric", r"\blightning\b"],
    "accelerate": ["Accelerate", r"\baccelerate\b", "Accelerator"],
}
PRECISION_WORDS = {"bf16": ["bf16", "bfloat16"], "fp16": [r"\bfp16", r"\bfloat16"]}
TASK_WORDS = {
    # `image:` is the container's, in a Kubernetes manifest (launch/trainjob.yaml).
    "image-classification": ["digits", "[Ii]mage(?!:)", r"\bCNN\b", "augment", "pixel"],
    "language-model": ["[Tt]oken", r"\bMFU\b", "language model", "corpus", "block_size"],
}


def words_a_variant_must_not_name(answers: dict) -> list[str]:
    strategy = answers["strategy"]
    used = {strategy, "zero" if strategy.startswith("zero") else strategy}
    used |= {"multi-process"} if strategy != "single" else set()
    banned = [word for key, words in STRATEGY_WORDS.items() if key not in used for word in words]
    banned += [
        w for key, words in PRECISION_WORDS.items() if key != answers["precision"] for w in words
    ]
    banned += [w for key, words in TASK_WORDS.items() if key != answers["task"] for w in words]
    framework = answers["framework"]
    banned += [w for key, words in FRAMEWORK_WORDS.items() if key != framework for w in words]
    return banned


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_no_rendered_file_names_a_strategy_precision_task_or_framework_it_does_not_use(variant):
    banned = re.compile("|".join(words_a_variant_must_not_name(VARIANTS[variant])))
    found = []
    for path in sorted((SAMPLES / variant).rglob("*")):
        if path.is_file() and path.name != ".copier-answers.yml" and path.suffix != ".png":
            lines = enumerate(path.read_text().splitlines(), 1)
            where = path.relative_to(SAMPLES)
            found += [f"{where}:{n}: {line.strip()}" for n, line in lines if banned.search(line)]
    assert not found, "\n".join(found)


def test_every_train_py_is_one_text_of_at_most_150_lines():
    """DESIGN's table of contents: at most 150 lines, the stop signal and non-finite checks of
    the loop's own order (skipped updates, padded validation, checkpoint on a stop) included."""
    texts = {}
    for variant in VARIANTS:
        (path,) = (SAMPLES / variant / "src").glob("*/train.py")
        text = path.read_text().replace(path.parent.name, "PACKAGE")
        assert len(text.splitlines()) <= 150, f"{variant}: {len(text.splitlines())} lines"
        texts[variant] = text
    assert len(set(texts.values())) == 1, "train.py differs between variants"


@pytest.mark.parametrize("variant", ["cpu-single-fp32", "lm-fsdp2-bf16"])
def test_config_defaults_equal_the_rendered_train_toml(variant):
    """One set of defaults per task: `Config()` and configs/train.toml agree key by key."""
    project = SAMPLES / variant
    package = next((project / "src").glob("*/config.py")).parent.name
    script = (
        f"import json, sys; from {package}.config import Config, load_config; "
        "print(json.dumps([Config().to_dict(), load_config(sys.argv[1]).to_dict()]))"
    )
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    result = subprocess.run(
        [sys.executable, "-c", script, "configs/train.toml"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    defaults, from_toml = json.loads(result.stdout)
    assert defaults == from_toml


def test_the_mps_project_differs_from_the_cpu_one_only_in_its_device():
    """hardware=mps renders the CPU project with `device = "mps"`: the configured device, the
    README's word for the hardware and its MPS section (and no container section), the planned
    allocation's device (planned.py), the MPS tests
    (one of them the CPU twin of the device's resolution), and the plan's note of usable memory
    (3/4 of unified memory on MPS); no other line changes, and no container files (a container
    reaches no Apple GPU)."""

    def lines(variant: str) -> dict[str, list[str]]:
        root = SAMPLES / variant
        return {
            str(path.relative_to(root)).replace(variant.replace("-", "_"), "PACKAGE"): [
                line.replace(variant.replace("-", "_"), "PACKAGE").replace(variant, "PROJECT")
                for line in path.read_text().splitlines()
            ]
            for path in root.rglob("*")
            if path.is_file() and path.suffix != ".png"
        }

    cpu, mps = lines("cpu-single-fp32"), lines("mps-single-fp32")
    assert cpu.keys() - mps.keys() == {"Dockerfile", ".dockerignore"}, "a container has no MPS"
    assert mps.keys() <= cpu.keys()
    changed = {path for path in mps if cpu[path] != mps[path]}
    assert changed == {
        ".copier-answers.yml",
        "README.md",
        "configs/train.toml",
        "src/PACKAGE/config.py",
        "src/PACKAGE/planned.py",
        "tests/test_loop.py",
    }
    cpu_planned, mps_planned = (found["src/PACKAGE/planned.py"] for found in (cpu, mps))
    assert [line for line in mps_planned if line not in cpu_planned] == ['    device="mps",']
    for path in ("configs/train.toml", "src/PACKAGE/config.py"):
        removed = [line for line in cpu[path] if line not in mps[path]]
        added = [line for line in mps[path] if line not in cpu[path]]
        removed, added = (
            [x for x in found if not x.startswith("# plan:")] for found in (removed, added)
        )
        assert len(removed) == len(added) == 1 and "device" in added[0] and "mps" in added[0]
    added = [line for line in mps["tests/test_loop.py"] if line not in cpu["tests/test_loop.py"]]
    assert any("def test_a_training_step_on_mps" in line for line in added)


@pytest.mark.slow
def test_a_7b_plan_renders_a_project_whose_config_a_user_could_launch(tmp_path):
    """7B on 8 x 80 GB H100s: FSDP2 over the 8, the planned micro-batch, accumulation, context,
    learning rate and tokenizer in train.toml, each under its `# plan:` source, and the BPE's
    vocabulary in data.py; the project lints, builds its 7B model on the meta device in no
    memory, and its sanity ladder passes at test size."""
    from conftest import ruff, run_in_project, run_project_tests

    from scaffold.answers import build_answers, merge_sources
    from scaffold.planner import plan
    from scaffold.render import render_project

    answers = {"task": "language-model", "model_size": "7B", "hardware": "cuda"}
    answers |= {"gpu_arch": "hopper", "gpus_per_node": 8, "gpu_memory_gb": 80.0}
    answers |= {"host_memory_gb": 1024.0, "project_name": "llm"}
    planned = plan(build_answers(merge_sources(answers)))
    project = tmp_path / "llm"
    render_project(planned.copier_data(), project, init_git=False)
    assert (
        ruff(project, "check").returncode == 0
        and ruff(project, "format", "--check").returncode == 0
    )
    toml = (project / "configs" / "train.toml").read_text()
    vocabulary = planned.settings.pop("vocab_size")  # data.py's PLANNED_VOCABULARY, no config key
    for key, setting in planned.settings.items():
        assert f"# plan: {setting.source}\n{key} = {setting.as_toml()}" in toml, key
    data_py = (project / "src" / "llm" / "data.py").read_text()
    assert f"# {vocabulary.source}.\nPLANNED_VOCABULARY = {vocabulary.value}\n" in data_py
    script = (
        "import json; import torch; from llm.config import load_config; "
        "from llm.engine import build_on_meta; config = load_config('configs/train.toml'); "
        "model = build_on_meta(config); "
        "print(json.dumps([sum(p.numel() for p in model.parameters()), "
        "all(p.is_meta for p in model.parameters()), config.block_size, config.lr, "
        "config.micro_batch_size * config.grad_accum_steps]))"
    )
    built = run_in_project(project, "-c", script)
    assert built.returncode == 0, built.stderr[-2000:]
    assert json.loads(built.stdout) == [6_864_642_048, True, 2048, 1.2e-4, 128]
    ladder = ["tests/test_model.py", "tests/test_build.py", "tests/test_loop.py"]
    tests = run_project_tests(project, *ladder)
    assert tests.returncode == 0, tests.stdout[-3000:]


TEMPLATES = Path(__file__).resolve().parents[1] / "templates"
WRAPPER = re.compile(r"\A\{% include [^%]+ %\}\n?\Z")
# Files that still include a piece of another: the task's settings in the config, its fields
# in config.py and its test settings (until the task has a config file of its own).
TASK_SNIPPETS = {"train.toml.jinja", "config.py.jinja", "conftest.py.jinja"}


def test_every_rendered_file_has_exactly_one_source_in_the_template():
    """No Jinja inheritance or snippets: no template file extends another or fills blocks; a
    file under `project/` is either whole or a one-line include of one whole file; an engine
    file's only template values are rendered constants (`{{ }}`, never `{%`); and each file of
    every sample is the render of exactly one template file."""
    sources = [p for p in (TEMPLATES / "project").rglob("*") if p.is_file()]
    for path in [*sources, *(TEMPLATES / "_variants").rglob("*.jinja")]:
        text = path.read_text(errors="replace")
        assert "{% extends" not in text and "{% block" not in text, path
    for path in sources:
        text = path.read_text(errors="replace")
        if "{% include" in text and path.name not in {"README.md.jinja", *TASK_SNIPPETS}:
            assert WRAPPER.match(text), f"{path}: an include must be the whole file"
    for path in (TEMPLATES / "_variants" / "engine").rglob("*"):
        if path.is_file():
            assert "{%" not in path.read_text(), f"{path}: an engine renders constants only"

    environment = jinja2.Environment(undefined=jinja2.StrictUndefined)
    for sample in sorted(p for p in SAMPLES.iterdir() if p.is_dir()):
        answers = yaml.safe_load((sample / ".copier-answers.yml").read_text())
        answers["_copier_conf"] = {"answers_file": ".copier-answers.yml"}
        rendered = collections.Counter()
        for source in sources:
            relative = source.relative_to(TEMPLATES / "project").as_posix()
            target = environment.from_string(relative).render(answers).removesuffix(".jinja")
            if all(target.split("/")):  # copier skips a path with an empty part
                rendered[target] += 1
        for path in sample.rglob("*"):
            if path.is_file() and not {"__pycache__", ".ruff_cache"} & set(path.parts):
                relative = path.relative_to(sample).as_posix()
                assert rendered[relative] == 1, (sample.name, relative, rendered[relative])


def test_the_top_of_a_language_models_package_holds_at_most_16_modules():
    """DESIGN 3e: the user's files, the commands and what they import at the top; machinery,
    the model families and the evaluation in folders (lm-ddp-bf16 has every command)."""
    (package,) = (SAMPLES / "lm-ddp-bf16" / "src").iterdir()
    modules = sorted(path.name for path in package.glob("*.py"))
    assert len(modules) <= 16, modules
    assert {"chat.py", "generate.py", "export.py", "model.py"} <= set(modules)
