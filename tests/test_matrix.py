"""The variant matrix: render every variant, lint it, and run its own test suite on CPU, less
the tests that another variant of the session runs on the same code (tests/repeats.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import (
    REPO_ROOT,
    VISION_PYTHON,
    extensions_env,
    isolate_home,
    ruff,
    run_in_project,
    run_project_tests,
)
from filelock import FileLock
from repeats import (
    Footprint,
    assign_owners,
    footprint_from_json,
    footprint_to_json,
    footprints,
    repeats,
)

from scaffold.samples import render_variant
from scaffold.variants import VARIANTS

MATRIX_TEST = "test_variant_renders_lints_and_passes_its_own_tests"
OPS_BUILD = REPO_ROOT / "scripts" / "build_deepspeed_ops.py"
OPS_BUILD_SECONDS = 1200  # ~80 s on 2 idle cores, ~6 min beside two test workers


def loads_deepspeed_ops(variant: str) -> bool:
    """The ZeRO variants' tests load DeepSpeed's CPU ops (scripts/build_deepspeed_ops.py)."""
    return VARIANTS[variant]["strategy"].startswith("zero")


def queue_position(name: str) -> int:
    """Multi-process variants take 3-6x longer than single-process ones: queued first, they
    leave xdist's worksteal a tail of short runs to balance instead of one long run on one
    worker. ZeRO's come after the other multi-process ones: DeepSpeed's CPU ops build while
    the first ones run (`start_ops_build`)."""
    single = VARIANTS[name]["strategy"] == "single"
    return 2 if single else 1 if loads_deepspeed_ops(name) else 0


HEAVIEST_FIRST = sorted(VARIANTS, key=queue_position)
# Who runs a test that several variants share: the first of them in this order. The variants
# queued last (single-process, short) come first, so the repeats left out shorten the runs
# that start first, and the tail that worksteal balances stays short.
OWNER_ORDER = sorted(VARIANTS, key=queue_position, reverse=True)


@dataclass(frozen=True)
class Matrix:
    """The session's variants, rendered once, and each one's tests that another variant of
    the session (their owner) runs on the same code."""

    folder: Path  # a render per variant, or <variant>.error saying why it failed
    footprints: dict[str, dict[str, Footprint]]  # variant → node id → footprint
    owners: dict[str, str]  # key → variant

    def project(self, variant: str) -> Path:
        """The variant's render; fails the test with the render's traceback if there is none."""
        error = self.folder / f"{variant}.error"
        if error.is_file():
            pytest.fail(f"rendering {variant} failed:\n{error.read_text()}", pytrace=False)
        return self.folder / variant

    def skipped_as_repeats(self, variant: str) -> dict[str, str]:
        """Node id → owner, for the variant's tests its owner runs instead."""
        return repeats(variant, self.footprints[variant], self.owners)

    def deselect_arguments(self, variant: str) -> list[str]:
        prefixes = sorted(
            self.footprints[variant][node].deselect for node in self.skipped_as_repeats(variant)
        )
        return [argument for prefix in prefixes for argument in ("--deselect", prefix)]

    def to_json(self) -> str:
        footprints_as_json = {
            variant: {node: footprint_to_json(f) for node, f in tests.items()}
            for variant, tests in self.footprints.items()
        }
        return json.dumps({"footprints": footprints_as_json, "owners": self.owners}, indent=1)

    @classmethod
    def from_json(cls, folder: Path, text: str) -> Matrix:
        data = json.loads(text)
        found = {
            variant: {node: footprint_from_json(f) for node, f in tests.items()}
            for variant, tests in data["footprints"].items()
        }
        return cls(folder, found, data["owners"])


def selected_variants(session: pytest.Session) -> list[str]:
    """The variants whose matrix test this session runs (after -k, -m, ...), in OWNER_ORDER:
    a test is skipped as a repeat only of a variant that runs in the same session."""
    selected = {
        item.callspec.params["variant"]
        for item in session.items
        if getattr(item, "originalname", None) == MATRIX_TEST
    }
    return [name for name in OWNER_ORDER if name in selected]


def shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of this run that all its pytest-xdist workers see (pytest-xdist's "Making
    session-scoped fixtures execute only once"), or this process's own without xdist."""
    basetemp = tmp_path_factory.getbasetemp()
    folder = (basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp) / "matrix"
    folder.mkdir(exist_ok=True)
    return folder


def this_workers_share_first(variants: list[str]) -> list[str]:
    """`variants`, rotated to start at this worker's share: the workers render from different
    places in the list at once, and each renders what no other has started."""
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    start = len(variants) * index // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return variants[start:] + variants[:start]


def ops_python(variant: str) -> str:
    """The Python whose torch the variant's suite runs on (`project_python`): the ops are
    compiled once per torch build. Named without rendering the variant."""
    if VARIANTS[variant]["task"] == "image-classification":
        return os.environ.get("SCAFFOLD_VISION_PYTHON", str(VISION_PYTHON))
    return sys.executable


def ops_name(python: str) -> str:
    """The file names of one Python's ops build: `ops` for this one's, `ops-vision` else."""
    return "ops" if python == sys.executable else "ops-vision"


def start_ops_build(folder: Path, python: str) -> None:
    """Compile DeepSpeed's CPU ops for `python`'s torch in the background, once for all
    workers, while the matrix runs the variants queued before the ZeRO ones: a rendered test
    that loaded them first would wait on torch's build lock inside its own time limit. The
    build's output goes to `folder/<ops_name>.log`, its exit status to `.status` beside it
    (`wait_for_ops`)."""
    name = ops_name(python)
    log = folder / f"{name}.log"
    with FileLock(folder / f"{name}.lock"):
        if log.exists():
            return
        command = '"$0" "$1" >"$2" 2>&1; echo $? >"$3.part" && mv "$3.part" "$3"'
        arguments = [python, str(OPS_BUILD), str(log), str(folder / f"{name}.status")]
        log.touch()
        # torch builds with the first `ninja` on PATH: this interpreter's, as in every test
        # process (scripts/_venv.sh says why a system one beside it would rebuild the ops).
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        env = {**os.environ, "PATH": path, **extensions_env(python)}
        subprocess.Popen(["bash", "-c", command, *arguments], env=env, start_new_session=True)


def wait_for_ops(folder: Path, python: str) -> None:
    """Return once `start_ops_build`'s build for `python` has succeeded; fail the test if it
    failed."""
    name = ops_name(python)
    status, deadline = folder / f"{name}.status", time.monotonic() + OPS_BUILD_SECONDS
    while not status.is_file():
        assert time.monotonic() < deadline, f"DeepSpeed's ops not built in {OPS_BUILD_SECONDS} s"
        time.sleep(1)
    log = (folder / f"{name}.log").read_text()
    assert status.read_text().strip() == "0", f"building DeepSpeed's CPU ops failed:\n{log[-3000:]}"


def render_once(variant: str, folder: Path) -> None:
    """Render `variant` into `folder/variant` unless a worker did or is doing it; a failure is
    kept in `folder/variant.error` for that variant's test to report."""
    with FileLock(folder / f"{variant}.lock"):
        if (folder / variant).is_dir() or (folder / f"{variant}.error").is_file():
            return
        try:
            render_variant(variant, folder / variant, init_git=True)
        except Exception:
            (folder / f"{variant}.error").write_text(traceback.format_exc())


def plan_matrix(folder: Path, variants: list[str]) -> Matrix:
    """Every rendered variant's footprints, and each key's owner among them."""
    rendered = [name for name in variants if (folder / name).is_dir()]
    found = {name: footprints(folder / name) for name in rendered}
    return Matrix(folder, found, assign_owners(found, rendered))


@pytest.fixture(scope="session")
def matrix(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Matrix:
    """The session's variants, rendered once for all workers, with their owners in the JSON
    beside the renders."""
    folder = shared_folder(tmp_path_factory)
    variants = selected_variants(request.session)
    for python in {ops_python(variant) for variant in variants if loads_deepspeed_ops(variant)}:
        start_ops_build(folder, python)
    with pytest.MonkeyPatch.context() as monkeypatch:
        isolate_home(tmp_path_factory.mktemp("render-home"), monkeypatch)
        for variant in this_workers_share_first(variants):
            render_once(variant, folder)
    plan = folder / "plan.json"
    with FileLock(folder / "plan.json.lock"):
        if not plan.is_file():
            plan.write_text(plan_matrix(folder, variants).to_json())
        return Matrix.from_json(folder, plan.read_text())


def pytest_summary_line(result: subprocess.CompletedProcess) -> str:
    """pytest's closing line: `120 passed, 30 deselected in 95.1s`."""
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    return lines[-1].strip("= ") if lines else ""


@pytest.mark.slow
@pytest.mark.parametrize("variant", HEAVIEST_FIRST)
def test_variant_renders_lints_and_passes_its_own_tests(matrix, variant, record_property):
    project = matrix.project(variant)
    if loads_deepspeed_ops(variant):
        wait_for_ops(matrix.folder, ops_python(variant))
    started = time.monotonic()
    assert ruff(project, "check").returncode == 0
    assert ruff(project, "format", "--check").returncode == 0
    skipped = matrix.skipped_as_repeats(variant)
    result = run_project_tests(project, *matrix.deselect_arguments(variant))
    record_property("matrix_variant", variant)
    record_property("matrix_seconds", time.monotonic() - started)
    record_property("matrix_run", len(matrix.footprints[variant]) - len(skipped))
    record_property("matrix_repeats", dict(Counter(skipped.values()).most_common()))
    record_property("matrix_pytest_summary", pytest_summary_line(result))
    everything_was_a_repeat = result.returncode == 5 and len(skipped) == len(
        matrix.footprints[variant]
    )
    if everything_was_a_repeat:  # pytest's "no tests ran": collected, then all deselected
        assert " deselected" in result.stdout and "error" not in result.stdout, result.stdout
        return
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
