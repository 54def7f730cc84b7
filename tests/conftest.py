"""Fixtures: every test gets an empty HOME (so a fresh template cache) and its own git identity."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


# Test files whose every test takes seconds (each runs `scaffold update` in a subprocess, or a
# benchmark's smoke run, the longest ~2 minutes).
SECONDS_EACH = ("tests/test_bench.py", "tests/test_update.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files whose every test takes seconds first, the collection's order kept otherwise:
    xdist's worksteal splits the collection in two halves and balances their tails, which a
    file of long tests collected last would leave on one worker. The matrix orders its own
    variants (tests/test_matrix.py)."""
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in SECONDS_EACH)


# The matrix's rows (tests/test_matrix.py records them as user properties), as this process
# receives them: under pytest-xdist the controller gets every worker's reports.
MATRIX_ROWS: list[dict[str, object]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    properties = dict(report.user_properties)
    if report.when == "call" and "matrix_variant" in properties:
        MATRIX_ROWS.append(properties)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The matrix's table, when matrix tests ran: per variant, its time, the test functions
    it ran and those it skipped because another variant runs the same code (tests/repeats.py)."""
    if MATRIX_ROWS:
        terminalreporter.section("matrix: tests run, and skipped as repeats of another variant")
        for line in matrix_table(MATRIX_ROWS):
            terminalreporter.write_line(line)


def matrix_table(rows: list[dict[str, object]]) -> list[str]:
    """The rows as aligned text, the slowest variant first."""
    header = ["variant", "seconds", "run", "skipped as repeats (of: owner x count, ...)", "pytest"]
    cells = [header] + [
        [
            str(row["matrix_variant"]),
            f"{row['matrix_seconds']:.0f}",
            str(row["matrix_run"]),
            describe_repeats(row["matrix_repeats"]),
            str(row["matrix_pytest_summary"]),
        ]
        for row in sorted(rows, key=lambda row: -row["matrix_seconds"])
    ]
    widths = [max(len(line[column]) for line in cells) for column in range(len(header) - 1)]
    return [
        " | ".join(
            [*(cell.ljust(width) for cell, width in zip(line[:-1], widths, strict=True)), line[-1]]
        )
        for line in cells
    ]


def describe_repeats(owners: dict[str, int]) -> str:
    """`12 (of: cpu-single-fp32 x 9, cuda-ddp-bf16 x 3)`, or `0`."""
    if not owners:
        return "0"
    counts = ", ".join(f"{owner} x {count}" for owner, count in owners.items())
    return f"{sum(owners.values())} (of: {counts})"


@pytest.fixture(autouse=True)
def isolated_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """A fresh HOME and global git config per test; the user's own are never read or written."""
    return isolate_home(tmp_path_factory.mktemp("home"), monkeypatch)


def isolate_home(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make the empty folder `home` HOME, with a global git config of its own (also for a
    session-scoped fixture, which runs before `isolated_home`)."""
    gitconfig = home / ".gitconfig"
    gitconfig.write_text("[user]\n\tname = Test User\n\temail = test@example.invalid\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(gitconfig))
    monkeypatch.delenv("SCAFFOLD_CACHE_DIR", raising=False)
    return home


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (its .git excluded), by relative path, with its bytes."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in folder.rglob("*")
        if path.is_file() and ".git" not in path.relative_to(folder).parts
    }


def run_scaffold(
    *args: str, cwd: Path, stdin: str | None = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python -m scaffold ARGS` in a child process (no terminal on stdin unless given one),
    with `env` on top of this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "scaffold", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
    )


def project_python(project: Path) -> str:
    """The Python that runs a rendered project: this one, or for an image project the one of
    .venv-vision (scripts/_venv.sh: torchvision loads only beside the torch build it was
    compiled for, and this environment's is PyTorch's CPU build)."""
    answers = (project / ".copier-answers.yml").read_text()
    if "task: image-classification" not in answers.splitlines():
        return sys.executable
    vision = os.environ.get("SCAFFOLD_VISION_PYTHON", str(VISION_PYTHON))
    if not Path(vision).is_file():
        pytest.fail(f"{vision} not found: run scripts/test.sh once, which sets it up")
    return vision


VISION_PYTHON = REPO_ROOT / ".venv-vision" / "bin" / "python"


def extensions_env(python: str) -> dict[str, str]:
    """Where `python`'s torch keeps compiled extensions (DeepSpeed's CPU ops): a folder of its
    own for .venv-vision's torch. TORCH_EXTENSIONS_DIR holds the ops under their names alone,
    so two torch builds sharing it would overwrite each other's builds (and wait on each
    other's locks)."""
    if python == sys.executable:
        return {}
    default = Path.home() / ".cache" / "torch_extensions"
    return {"TORCH_EXTENSIONS_DIR": f"{os.environ.get('TORCH_EXTENSIONS_DIR', default)}-vision"}


def run_in_project(project: Path, *command: str) -> subprocess.CompletedProcess:
    """Run `python COMMAND...` inside a rendered project with its `src/` importable."""
    # One torch thread per process: pytest-xdist already runs one variant per core.
    env = {**os.environ, "PYTHONPATH": str(project / "src"), "OMP_NUM_THREADS": "1"}
    python = project_python(project)
    # Its commands (torchrun, accelerate) first on PATH: they run with its Python.
    env["PATH"] = os.pathsep.join([str(Path(python).parent), env.get("PATH", "")])
    env |= extensions_env(python)
    return subprocess.run([python, *command], cwd=project, env=env, capture_output=True, text=True)


# Plugins that this environment installs for scaffold's tests (hypothesis, anyio) are not in a
# rendered project's dependencies: left on, they would cost every such pytest ~2.3 s of its
# ~5.3 s start-up.
NOT_A_PROJECTS_PLUGINS = ("-p", "no:hypothesispytest", "-p", "no:anyio")


def run_project_tests(project: Path, *args: str) -> subprocess.CompletedProcess:
    """A rendered project's own test suite (pytest ARGS), as its user runs it."""
    pytest_args = ("-q", "-p", "no:cacheprovider", *NOT_A_PROJECTS_PLUGINS, *args)
    return run_in_project(project, "-m", "pytest", *pytest_args)


def ruff(project: Path, *args: str) -> subprocess.CompletedProcess:
    """`ruff ARGS` inside `project` (its own pyproject.toml configures it)."""
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--no-cache", "."],
        cwd=project,
        capture_output=True,
        text=True,
    )
