"""generated_samples/ holds exactly what the current template renders for every variant."""

from __future__ import annotations

from pathlib import Path

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
