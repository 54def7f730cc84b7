"""The only module that runs copier, ruff or git: template cache, render, format, first commit.

copier updates a project only from a template that sits at the root of a git repository with the
old version reachable by tag. The installed package has no git history, so the bundled template
is committed into a cache repository (`~/.cache/scaffold/template-repo`): one parentless commit
per scaffold version, tagged `v<version>`, never moved (DESIGN.md §4).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scaffold import __version__
from scaffold.errors import DestinationError, RenderError

CACHE_ENV = "SCAFFOLD_CACHE_DIR"
DEFAULT_CACHE = "~/.cache/scaffold"
# A fixed identity for the cache repository's commits: they are scaffold's, not the user's.
CACHE_GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "scaffold",
    "GIT_AUTHOR_EMAIL": "scaffold@localhost",
    "GIT_COMMITTER_NAME": "scaffold",
    "GIT_COMMITTER_EMAIL": "scaffold@localhost",
}
# Fixed dates make a version's cache commit the same object on every machine, so a commit
# restored from a project (see `restore_template_version`) is the one that was tagged.
CACHE_GIT_DATES = {
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}
# Where a project keeps the template commit it was rendered from: refs/scaffold/templates/<tag>.
PROJECT_TEMPLATE_REFS = "refs/scaffold/templates"


def bundled_template() -> Path:
    """The template shipped with this scaffold: `scaffold/templates` in a wheel, else the repo's."""
    for candidate in (
        Path(__file__).parent / "templates",
        Path(__file__).parent.parent / "templates",
    ):
        if (candidate / "copier.yml").is_file():
            return candidate
    raise RenderError("the scaffold template is missing from this installation; reinstall scaffold")


def template_repo_source() -> tuple[Path, str]:
    """(path of the cache repository, the `src_path` copier records for it).

    The recorded path keeps a literal `~` so the answers file is the same on every machine.
    """
    configured = os.environ.get(CACHE_ENV)
    base = configured if configured else DEFAULT_CACHE
    source = f"{base.rstrip('/')}/template-repo"
    return Path(source).expanduser(), source


def run_git(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run git with a neutral configuration (no user excludes or hooks) and return stdout."""
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
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        message = result.stderr.strip().splitlines()[-1:] or ["(no message)"]
        raise RenderError(f"git {args[0]} failed in {cwd}: {message[0]}")
    return result.stdout.strip()


def ensure_template_repo(
    version: str = __version__, template: Path | None = None, source: str | None = None
) -> tuple[str, str]:
    """Commit a template into the cache repository; return (src_path, tag) for copier.

    `template` defaults to the bundled one and `source` (the cache repository's path as copier
    records it) to `template_repo_source()`. A version already tagged with the same files is
    reused. If a development build changed the template without a version bump, the tag stays
    where it is (projects rendered from it need it to update) and the new files get the tag
    `v<version>+dev.<tree hash>`.

    Raises:
        RenderError: git is missing or fails.
    """
    repo = _open_cache_repo(source)
    source = source or template_repo_source()[1]
    tree = _tree_of(template or bundled_template(), repo)
    tag = f"v{version}"
    tagged_tree = _tagged_tree(repo, tag)
    if tagged_tree is not None and tagged_tree != tree:
        tag = f"v{version}+dev.{tree[:12]}"
        tagged_tree = _tagged_tree(repo, tag)
        warnings.warn(
            f"the template changed without a version bump; rendering it as {tag}",
            stacklevel=2,
        )
    if tagged_tree is None:
        env = {**CACHE_GIT_IDENTITY, **CACHE_GIT_DATES}
        commit = run_git("commit-tree", tree, "-m", f"scaffold template {tag}", cwd=repo, env=env)
        run_git("tag", tag, commit, cwd=repo)
    return source, tag


def _open_cache_repo(source: str | None) -> Path:
    """The cache repository at `source` (default: `template_repo_source()`), created if absent."""
    if shutil.which("git") is None:
        raise RenderError("git is not installed; install git, which copier needs to render")
    repo = Path(source).expanduser() if source else template_repo_source()[0]
    if not (repo / ".git").is_dir():
        repo.mkdir(parents=True, exist_ok=True)
        run_git("init", "--quiet", cwd=repo)
    return repo


def keep_template_in_project(project: Path, source: str, tag: str) -> None:
    """Copy the template commit `tag` into the project's git as refs/scaffold/templates/<tag>.

    A later `scaffold update` on a machine whose cache lacks that version restores it from
    there; the work tree is not touched.
    """
    repo = Path(source).expanduser()
    refspec = f"refs/tags/{tag}:{PROJECT_TEMPLATE_REFS}/{tag}"
    run_git("fetch", "--quiet", "--no-tags", str(repo), refspec, cwd=project)


def has_template_version(source: str, tag: str) -> bool:
    """True when the cache repository at `source` holds the tag `tag`."""
    return _tagged_tree(_open_cache_repo(source), tag) is not None


def restore_template_version(project: Path, source: str, tag: str) -> bool:
    """Tag `tag` in the cache from the project's kept template commit; False if it has none."""
    repo = _open_cache_repo(source)
    ref = f"{PROJECT_TEMPLATE_REFS}/{tag}"
    try:
        run_git("rev-parse", "--verify", "--quiet", ref, cwd=project)
    except RenderError:
        return False
    run_git("fetch", "--quiet", "--no-tags", str(project), f"{ref}:refs/tags/{tag}", cwd=repo)
    return True


def _tree_of(template: Path, repo: Path) -> str:
    """Hash the template's files into the cache repository's object store; return the tree id."""
    with tempfile.TemporaryDirectory() as scratch:
        env = {
            "GIT_INDEX_FILE": str(Path(scratch) / "index"),
            "GIT_WORK_TREE": str(template),
        }
        run_git(
            "add",
            "--all",
            ".",
            cwd=template,
            env={**env, "GIT_DIR": str(repo / ".git")},
        )
        return run_git("write-tree", cwd=template, env={**env, "GIT_DIR": str(repo / ".git")})


def _tagged_tree(repo: Path, tag: str) -> str | None:
    try:
        return run_git("rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{tree}}", cwd=repo)
    except RenderError:
        return None


def check_destination(dest: Path, force: bool) -> None:
    """Refuse a destination that is a file, or a non-empty folder unless `force`.

    Raises:
        DestinationError: with the way out in the message.
    """
    if dest.exists() and not dest.is_dir():
        raise DestinationError(f"destination {dest} is a file; choose a new folder")
    if dest.is_dir() and any(dest.iterdir()) and not force:
        raise DestinationError(
            f"destination {dest} is not empty; choose a new folder or pass --force to write into it"
        )


def render_project(
    data: Mapping[str, Any], dest: Path, *, force: bool = False, init_git: bool = True
) -> None:
    """Render the template with `data` (a plan's `copier_data()`) into `dest`, format it with
    ruff, make the first commit.

    The commit is made only when `dest` was new or empty: with `force` into a non-empty folder
    the rendered files are left for the user to review and commit.

    On failure everything this call wrote is removed again (the folder too, if it created it).

    Raises:
        DestinationError: see `check_destination`.
        RenderError: copier, ruff or git failed.
    """
    import copier  # deferred: importing copier takes ~0.5 s that `--help` should not pay
    from copier.errors import CopierError, CopierWarning

    check_destination(dest, force)
    existing = set(dest.iterdir()) if dest.is_dir() else None
    src_path, tag = ensure_template_repo()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CopierWarning)  # copier's notes are not the user's
            copier.run_copy(
                src_path,
                dest,
                data=dict(data),
                vcs_ref=tag,
                defaults=True,
                overwrite=force,
                quiet=True,
            )
        format_with_ruff(dest)
        if init_git and not existing:  # never commit files the user had in DEST
            initial_commit(dest, tag)
            keep_template_in_project(dest, src_path, tag)
    except BaseException as error:
        _remove_new_entries(dest, existing)
        if isinstance(error, CopierError):
            raise RenderError(f"copier failed: {error}") from error
        raise


def _remove_new_entries(dest: Path, existing: set[Path] | None) -> None:
    """Undo a failed render: remove `dest` if this call created it, else what it added there."""
    if existing is None:
        shutil.rmtree(dest, ignore_errors=True)
        return
    for entry in set(dest.iterdir()) - existing if dest.is_dir() else ():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


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
