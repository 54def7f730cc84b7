"""The lower bounds rendered projects declare equal the constraints scripts/dependency_ends.py
tests them at, and its engine families cover every engine a sample has."""

import importlib.util
import re
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from scaffold.variants import VARIANTS

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "generated_samples"


def load_script():
    spec = importlib.util.spec_from_file_location(
        "dependency_ends", ROOT / "scripts/dependency_ends.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


ends = load_script()


def answers(variant: str) -> dict:
    return yaml.safe_load((SAMPLES / variant / ".copier-answers.yml").read_text())


def declared_lower_bounds(variant: str) -> dict[str, Version]:
    """Every requirement of the sample's pyproject, optional extras included, by name."""
    project = tomllib.loads((SAMPLES / variant / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        lines += extra
    bounds = {}
    for line in lines:
        requirement = Requirement(line)
        (floor,) = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        bounds[requirement.name] = Version(floor)
    return bounds


def pins(constraints: Path) -> dict[str, Version]:
    found = {}
    for line in constraints.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            found[name] = Version(version)
    return found


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_lower_bound_a_sample_declares_is_the_version_its_constraints_pin(variant):
    constraints = ends.lowest_constraints(answers(variant)["strategy"])
    pinned = pins(constraints)
    for name, floor in declared_lower_bounds(variant).items():
        assert pinned.get(name) == floor, (
            f"{variant}: {name}>={floor}, {constraints.name} pins {pinned.get(name)}"
        )


def test_every_pin_is_a_lower_bound_some_sample_declares():
    used: dict[Path, dict[str, set[Version]]] = {}
    for variant in VARIANTS:
        constraints = ends.lowest_constraints(answers(variant)["strategy"])
        for name, floor in declared_lower_bounds(variant).items():
            used.setdefault(constraints, {}).setdefault(name, set()).add(floor)
    assert sorted(used) == sorted(ends.CONSTRAINTS.glob("lowest*.txt"))
    for constraints, names in used.items():
        assert set(pins(constraints)) == set(names), constraints.name


def test_the_families_cover_every_engine_of_every_sample_once():
    def engine(variant: str) -> tuple[str, str]:
        recorded = answers(variant)
        strategy = recorded["strategy"]
        kind = (
            "zero"
            if strategy.startswith("zero")
            else "fsdp2"
            if strategy == "fsdp2"
            else "replicated"
        )
        return recorded["framework"], kind

    covered = [engine(variant) for variant in ends.FAMILIES.values()]
    assert len(covered) == len(set(covered))
    assert set(covered) == {engine(variant) for variant in VARIANTS}
    for variant in ends.FAMILIES.values():
        assert ends.sample_strategy(variant) == answers(variant)["strategy"]


def test_the_development_pins_a_readme_names_are_scaffolds_own():
    """The image projects' torch is .venv-vision's (scripts/vision-requirements.txt), the
    others' scaffold's dev extra's."""
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    exact = {Requirement(line).name: Requirement(line).specifier for line in dev["dev"]}
    vision_lines = (ROOT / "scripts" / "vision-requirements.txt").read_text().splitlines()
    vision = {
        Requirement(line).name: Requirement(line).specifier
        for line in vision_lines
        if line and not line.startswith("#")
    }
    for variant in ["fabric-lm-fsdp2-fp32", "lm-zero3-bf16", "accelerate-cuda-ddp-bf16"]:
        readme = (SAMPLES / variant / "README.md").read_text().replace("\n", " ")
        named = re.search(r"development pins \(([^)]*)\)", readme).group(1)
        assert len(named.split(", ")) == 2, named  # torch and the engine's library
        pins = {**exact, **(vision if answers(variant)["task"] == "image-classification" else {})}
        for item in named.split(", "):
            name, version = item.lower().split(" ")
            assert str(pins[name]) == f"=={version}", f"{variant}: {item}"


def test_the_summary_line_of_pytest_becomes_counts():
    output = "....F\nFAILED tests/x.py::y\n3 failed, 111 passed, 2 errors in 207.12s (0:03:27)\n"
    assert ends.summary_counts(output) == {"failed": 3, "passed": 111, "error": 2}
    assert ends.summary_counts("ImportError while loading conftest\n") == {}


def test_the_workflow_runs_every_family_at_both_ends():
    workflow = ROOT / ".github" / "workflows" / "variants.yml"
    matrix = yaml.safe_load(workflow.read_text())["jobs"]["dependency-ends"]["strategy"]["matrix"]
    assert matrix["family"] == list(ends.FAMILIES)
    assert matrix["end"] == ["lowest", "newest"]


def test_a_command_keeps_its_output_and_one_that_hangs_is_killed(tmp_path, monkeypatch):
    log = tmp_path / "log.txt"
    status, output = ends.run(["python3", "-c", "print('hello')"], tmp_path, {}, log)
    assert (status, output) == (0, "hello\n")
    monkeypatch.setattr(ends, "COMMAND_TIMEOUT_S", 0.5)
    status, output = ends.run(["sleep", "30"], tmp_path, {"PATH": "/usr/bin:/bin"}, log)
    assert status == ends.TIMED_OUT and "killed after" in output
    assert log.read_text().count("$ ") == 2


def test_a_family_without_an_environment_is_a_failed_row_and_pip_settings_stay_out(monkeypatch):
    row = ends.Outcome.unbuilt("zero", "lowest", "pip failed for lowest").row()
    assert "| FAILED |" in row and "pip failed for lowest" in row
    monkeypatch.setenv("PIP_CONSTRAINT", "/etc/xdg/pip/constraints.txt")
    environment = ends.pip_environment()
    assert "PIP_CONSTRAINT" not in environment and environment["PIP_CONFIG_FILE"] == "/dev/null"
