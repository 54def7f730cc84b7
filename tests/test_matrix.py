"""The variant matrix: render every variant, lint it, and run its own test suite on CPU."""

from __future__ import annotations

import json

import pytest
from conftest import ruff, run_in_project

from scaffold.samples import render_variant
from scaffold.variants import VARIANTS


def queue_position(name: str) -> int:
    """Multi-process variants take 3-6x longer than single-process ones: queued first, they
    leave xdist's worksteal a tail of short runs to balance instead of one long run on one
    worker. ZeRO's come after the other multi-process ones: scripts/test.sh builds DeepSpeed's
    CPU ops while the first tests run."""
    strategy = VARIANTS[name]["strategy"]
    return 2 if strategy == "single" else 1 if strategy.startswith("zero") else 0


def as_param(name: str) -> pytest.param:
    """A variant as a test parameter, marked `deepspeed_ops` when its tests load DeepSpeed's CPU
    ops (the ZeRO variants): scripts/test.sh builds them only for a run that selects one."""
    zero = VARIANTS[name]["strategy"].startswith("zero")
    return pytest.param(name, id=name, marks=[pytest.mark.deepspeed_ops] if zero else [])


HEAVIEST_FIRST = sorted(VARIANTS, key=queue_position)


@pytest.mark.slow
@pytest.mark.parametrize("variant", [as_param(name) for name in HEAVIEST_FIRST])
def test_variant_renders_lints_and_passes_its_own_tests(tmp_path, variant):
    project = tmp_path / variant
    render_variant(variant, project, init_git=True)
    assert ruff(project, "check").returncode == 0
    assert ruff(project, "format", "--check").returncode == 0
    result = run_in_project(project, "-m", "pytest", "-q", "-p", "no:cacheprovider")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "failed" not in result.stdout


@pytest.mark.slow
def test_default_project_reaches_95_percent_on_digits(tmp_path):
    project = tmp_path / "demo"
    render_variant("cpu-single-fp32", project)
    result = run_in_project(project, "-m", "demo.train")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((project / "runs" / "digits" / "summary.json").read_text())
    assert summary["val_accuracy"] >= 0.95, summary["val_accuracy"]
    assert "**Results:**" in result.stdout
