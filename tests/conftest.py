"""Fixtures: every test gets an empty HOME (so a fresh template cache) and its own git identity."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
NEEDS_OPS = "needs DeepSpeed's CPU ops"  # printed by --report-deepspeed-ops


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--report-deepspeed-ops",
        action="store_true",
        help=f"with --collect-only: print '{NEEDS_OPS}' if a selected test is marked "
        "deepspeed_ops (scripts/test.sh builds the ops only then)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "deepspeed_ops: loads DeepSpeed's CPU ops, which scripts/test.sh builds first"
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    """After `-m`, `-k` and the paths selected the tests: say whether any needs the ops."""
    if session.config.getoption("report_deepspeed_ops") and any(
        item.get_closest_marker("deepspeed_ops") for item in session.items
    ):
        print(NEEDS_OPS)


@pytest.fixture(autouse=True)
def isolated_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """A fresh HOME and global git config per test; the user's own are never read or written."""
    home = tmp_path_factory.mktemp("home")
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


def run_in_project(project: Path, *command: str) -> subprocess.CompletedProcess:
    """Run `python COMMAND...` inside a rendered project with its `src/` importable."""
    # One torch thread per process: pytest-xdist already runs one variant per core.
    env = {**os.environ, "PYTHONPATH": str(project / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, *command], cwd=project, env=env, capture_output=True, text=True
    )


def ruff(project: Path, *args: str) -> subprocess.CompletedProcess:
    """`ruff ARGS` inside `project` (its own pyproject.toml configures it)."""
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--no-cache", "."],
        cwd=project,
        capture_output=True,
        text=True,
    )
