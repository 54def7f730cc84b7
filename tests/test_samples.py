"""generated_samples/ holds exactly what the current template renders for every variant."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scaffold.samples import stale_sample_files
from scaffold.variants import VARIANTS

SAMPLES = Path(__file__).resolve().parents[1] / "generated_samples"


def test_every_variant_has_a_sample():
    assert sorted(p.name for p in SAMPLES.iterdir() if p.is_dir()) == sorted(VARIANTS)


def test_samples_match_a_fresh_render():
    stale = stale_sample_files(SAMPLES)
    assert stale == [], "re-render with `scaffold samples`; stale: " + ", ".join(stale)


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
    "image-classification": ["digits", "[Ii]mage", r"\bCNN\b", "augment", "pixel"],
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
