"""The tools scaffold runs besides copier: git (the cache repository, the project's history,
three-way merges of text) and ruff (the rendered project's format)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from scaffold.errors import RenderError

# A fixed identity for the cache repository's commits: they are scaffold's, not the user's.
CACHE_GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "scaffold",
    "GIT_AUTHOR_EMAIL": "scaffold@localhost",
    "GIT_COMMITTER_NAME": "scaffold",
    "GIT_COMMITTER_EMAIL": "scaffold@localhost",
}


def run_git(
    *args: str, cwd: Path, env: dict[str, str] | None = None, stdin: str | None = None
) -> str:
    """Run git with a neutral configuration (no user excludes or hooks), `stdin` on its stdin,
    and return stdout. Bytes that are not UTF-8 pass through as surrogate escapes."""
    command = [
        "git",
        "-c",
        "core.excludesFile=",
        "-c",
        "core.hooksPath=/dev/null",
        *args,
    ]
    result = subprocess.run(
        command,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        input=stdin,
        capture_output=True,
        encoding="utf-8",
        errors="surrogateescape",
    )
    if result.returncode != 0:
        message = result.stderr.strip().splitlines()[-1:] or ["(no message)"]
        raise RenderError(f"git {args[0]} failed in {cwd}: {message[0]}")
    return result.stdout.strip()


def merge_texts(mine: str, base: str, theirs: str, labels: tuple[str, str, str]) -> str:
    """`mine` with the change from `base` to `theirs` merged in (git merge-file); a conflict is
    left inline between markers that carry `labels` (mine, base, theirs).

    Raises:
        RenderError: git is missing or failed.
    """
    if shutil.which("git") is None:
        raise RenderError("git is not installed; install git, which scaffold update needs")
    with tempfile.TemporaryDirectory() as scratch:
        paths = []
        for name, text in (("mine", mine), ("base", base), ("theirs", theirs)):
            path = Path(scratch) / name
            path.write_text(text)
            paths.append(str(path))
        flags = [option for label in labels for option in ("-L", label)]
        # Not run_git: merge-file's exit status is its count of conflicts, not a failure.
        result = subprocess.run(
            ["git", "merge-file", "-p", *flags, *paths], capture_output=True, text=True
        )
    if result.returncode < 0 or result.returncode > 127:  # else: the number of conflicts
        raise RenderError(f"git merge-file failed: {result.stderr.strip()}")
    return result.stdout


def format_with_ruff(dest: Path) -> None:
    """`ruff format` the rendered project (its own pyproject.toml configures ruff)."""
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--no-cache", "--quiet", "."],
        cwd=dest,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RenderError(f"ruff format failed in {dest}: {result.stderr.strip()}")


def initial_commit(dest: Path, tag: str) -> None:
    """`git init` and commit the rendered project (scaffold update needs a clean history).

    Skipped when git is missing. Uses the user's git identity, or scaffold's if none is set.
    """
    if shutil.which("git") is None:
        return
    run_git("init", "--quiet", cwd=dest)
    run_git("add", "--all", cwd=dest)
    identity = {} if _has_git_identity(dest) else CACHE_GIT_IDENTITY
    run_git(
        "commit",
        "--quiet",
        "-m",
        f"Render project with scaffold {tag}",
        cwd=dest,
        env=identity,
    )


def _has_git_identity(repo: Path) -> bool:
    try:
        return bool(run_git("config", "user.email", cwd=repo))
    except RenderError:
        return False


@contextlib.contextmanager
def environment(changes: Mapping[str, str | None]) -> Iterator[None]:
    """Set the process environment's variables in `changes` (None: unset) while inside; put
    back what they were on the way out."""
    saved = {key: os.environ.get(key) for key in changes}
    _apply(changes)
    try:
        yield
    finally:
        _apply(saved)


def _apply(values: Mapping[str, str | None]) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
