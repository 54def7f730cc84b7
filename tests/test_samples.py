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
