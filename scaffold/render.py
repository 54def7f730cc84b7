"""The only module that runs copier, ruff or git: template cache, render, format, first commit.

copier updates a project only from a template that sits at the root of a git repository with the
old version reachable by tag. The installed package has no git history, so the bundled template
is committed into a cache repository (`~/.cache/scaffold/template-repo`): one parentless commit
per scaffold version, tagged `v<version>`, never moved (DESIGN.md §4).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping
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


def render_files(src_path: str, tag: str, data: Mapping[str, Any], dest: Path) -> None:
    """Render template version `tag` of the repository at `src_path` with `data` into the new
    folder `dest`: copier alone (no ruff, no git), as `scaffold update` renders each side of its
    merge.

    Raises:
        RenderError: copier failed.
    """
    import copier
    from copier.errors import CopierError, CopierWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CopierWarning)
        try:
            copier.run_copy(src_path, dest, data=dict(data), vcs_ref=tag, defaults=True, quiet=True)
        except CopierError as error:
            raise RenderError(f"copier failed: {error}") from error


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


@contextlib.contextmanager
def template_found_at(recorded: str, repo: Path) -> Iterator[None]:
    """While copier runs, make the template path a project's answers file recorded, when it is
    `~/...`, lead to the cache repository `repo`.

    copier reads the project's old template version from that recorded path (no option of its
    own says otherwise), while SCAFFOLD_CACHE_DIR may keep this machine's cache elsewhere. So
    HOME points at a temporary folder with a symbolic link at the recorded place; git still
    reads the user's own configuration. A recorded absolute path, or one that already leads to
    `repo`, is left as it is.
    """
    if not recorded.startswith("~/") or Path(recorded).expanduser() == repo.expanduser():
        yield
        return
    real = Path.home()
    with tempfile.TemporaryDirectory() as home:
        link = Path(home) / recorded.removeprefix("~/")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(repo.expanduser().resolve(), target_is_directory=True)
        changes = {"HOME": home}
        if "GIT_CONFIG_GLOBAL" not in os.environ and (real / ".gitconfig").is_file():
            changes["GIT_CONFIG_GLOBAL"] = str(real / ".gitconfig")
        if "XDG_CONFIG_HOME" not in os.environ:  # where git reads ~/.config/git/config
            changes["XDG_CONFIG_HOME"] = str(real / ".config")
        saved = {key: os.environ.get(key) for key in changes}
        os.environ.update(changes)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def store_folder_as_ref(project: Path, folder: Path, ref: str, message: str) -> None:
    """Commit every file under `folder` into the git repository of `project` as `ref`, without
    touching its work tree, index or branches.

    The files sit at the project's path inside its repository, so that `git checkout REF --
    PATH` run in `project` restores `folder/PATH` as `PATH`. The commit has scaffold's identity.

    Raises:
        RenderError: git failed.
    """
    git_dir = run_git("rev-parse", "--absolute-git-dir", cwd=project)
    prefix = run_git("rev-parse", "--show-prefix", cwd=project)
    with tempfile.TemporaryDirectory() as scratch:
        env = {"GIT_DIR": git_dir, "GIT_INDEX_FILE": str(Path(scratch) / "index")}
        files = {**env, "GIT_WORK_TREE": str(folder)}
        run_git("add", "--all", "--force", ".", cwd=folder, env=files)
        tree = run_git("write-tree", cwd=folder, env=files)
        if prefix:  # the project is a folder inside a larger repository
            env["GIT_INDEX_FILE"] = str(Path(scratch) / "prefixed")
            run_git("read-tree", f"--prefix={prefix}", tree, cwd=folder, env=env)
            tree = run_git("write-tree", cwd=folder, env=env)
        commit = run_git(
            "commit-tree", tree, "-m", message, cwd=folder, env={**env, **CACHE_GIT_IDENTITY}
        )
    run_git("update-ref", ref, commit, cwd=project)


def check_destination(dest: Path, force: bool) -> None:
    """Refuse a destination that is a file, a non-empty folder unless `force`, or a place this
    user cannot write to (a folder without write permission, a read-only file system).

    Raises:
        DestinationError: with the way out in the message.
    """
    try:
        is_file = dest.exists() and not dest.is_dir()
        non_empty = dest.is_dir() and any(dest.iterdir())
    except OSError as error:
        if error.errno == errno.ENAMETOOLONG:
            shown = dest.name if len(dest.name) <= 40 else dest.name[:20] + "..."
            raise DestinationError(
                f"destination {shown} has a name too long for the file system; "
                "choose a shorter folder name"
            ) from None
        raise DestinationError(
            f"cannot use destination {dest}: {error.strerror or error}; choose another folder"
        ) from None
    if is_file:
        raise DestinationError(f"destination {dest} is a file; choose a new folder")
    if non_empty and not force:
        raise DestinationError(
            f"destination {dest} is not empty; choose a new folder or pass --force to write into it"
        )
    folder = staging_folder(dest)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise DestinationError(_cannot_write(dest, folder))


def staging_folder(dest: Path) -> Path:
    """Where `render_project` stages a render of `dest`: inside `dest` when it is a folder,
    else in the nearest folder above it that exists (the same file system either way, so the
    result moves into place by renaming).

    Raises:
        DestinationError: the nearest existing path above `dest` is a file.
    """
    dest = dest.resolve()
    if dest.is_dir():
        return dest
    folder = next(parent for parent in dest.parents if parent.exists())
    if not folder.is_dir():
        raise DestinationError(
            f"{folder} is a file, so {dest} cannot be created; choose a new folder"
        )
    return folder


def _cannot_write(dest: Path, folder: Path, error: OSError | None = None) -> str:
    """The one-line refusal of a `dest` whose staging `folder` cannot be written."""
    if error is not None and error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"cannot write {dest}: {error.strerror or error} in {folder}; choose another folder"
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    read_only = read_only or (error is not None and error.errno == errno.EROFS)
    if read_only:
        return (
            f"cannot write {dest}: {folder} is on a read-only file system; "
            "choose a folder on a writable one"
        )
    return (
        f"cannot write {dest}: {folder} is not writable by you; "
        "choose a folder you can write to, or fix its permissions"
    )


def render_project(
    data: Mapping[str, Any], dest: Path, *, force: bool = False, init_git: bool = True
) -> None:
    """Render the template with `data` (a plan's `copier_data()`) into `dest`, format it with
    ruff, make the first commit.

    Everything happens in a staging folder on `dest`'s file system (see `staging_folder`); only
    when copier, ruff and git have all succeeded does the project move into `dest`, by renames.
    A new `dest` arrives whole, in one rename. Into an existing folder (`force`) the files move
    one by one, each file they replace set aside until the last is in; if a move fails, every
    move is undone. So a failure leaves `dest` as it was: not created, or with the same files
    and the same bytes. With `force`, rendered files replace the user's files of the same name
    and only the rendered files are formatted.

    The commit is made only when `dest` was new or empty: with `force` into a non-empty folder
    the rendered files are left for the user to review and commit.

    Raises:
        DestinationError: see `check_destination`; or a rendered file would replace a folder
            (or a rendered folder a file) in `dest`; or the staging folder cannot be created.
        RenderError: copier, ruff or git failed, or a file replaced in `dest` could not be put
            back after a failed move (the message says where it was kept).
    """
    import copier  # deferred: importing copier takes ~0.5 s that `--help` should not pay
    from copier.errors import CopierError, CopierWarning

    check_destination(dest, force)
    target = dest.resolve()
    was_empty = not target.is_dir() or not any(target.iterdir())
    src_path, tag = ensure_template_repo()
    folder = staging_folder(target)
    try:
        workspace = Path(tempfile.mkdtemp(prefix=".scaffold-new-", dir=folder))
    except OSError as error:
        raise DestinationError(_cannot_write(dest, folder, error)) from error
    replaced = workspace / "replaced"
    moved = False
    try:
        staged = workspace / target.name
        staged.mkdir()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CopierWarning)  # copier's notes are not the user's
            copier.run_copy(
                src_path,
                staged,
                data=dict(data),
                vcs_ref=tag,
                defaults=True,
                overwrite=True,
                quiet=True,
            )
        format_with_ruff(staged)
        if init_git and was_empty:  # never commit files the user had in DEST
            initial_commit(staged, tag)
            keep_template_in_project(staged, src_path, tag)
        move_into_place(staged, target, replaced)
        moved = True
    except CopierError as error:
        raise RenderError(f"copier failed: {error}") from error
    finally:
        if moved or not _holds_files(replaced):  # else the user's files wait there
            shutil.rmtree(workspace, ignore_errors=True)


def move_into_place(staged: Path, target: Path, replaced: Path) -> None:
    """Move the folder `staged` to `target` by renames on one file system, all or nothing.

    A missing `target` (and any missing folder above it) is created by one rename. Into an
    existing folder, each staged file (or folder `target` lacks) is renamed in, and each file
    or symbolic link it replaces is first renamed into `replaced`, under its relative path. On
    any failure every rename is undone in reverse order and the error re-raised.

    Raises:
        DestinationError: a staged file would replace a folder, or a staged folder a file;
            checked before anything moves.
        RenderError: undoing failed; the message names where the user's files were kept.
        OSError: a rename failed (and was undone).
    """
    moves: list[tuple[Path, Path]] = []  # renames done, (from, to), in order
    created: list[Path] = []  # folders made above a new target, outermost first
    placements = None if not target.exists() else list(_placements(staged, target))
    try:
        if placements is None:
            for folder in reversed(target.parents):
                if not folder.exists():
                    folder.mkdir()
                    created.append(folder)
            _rename(staged, target, moves)
            return
        for source, goal in placements:
            if goal.exists() or goal.is_symlink():
                kept = replaced / goal.relative_to(target)
                kept.parent.mkdir(parents=True, exist_ok=True)
                _rename(goal, kept, moves)
            _rename(source, goal, moves)
    except BaseException:
        stuck = _undo(moves, created)
        if stuck:
            source, goal = stuck[0]
            raise RenderError(
                f"moving the project into {target} failed and {len(stuck)} move(s) could not be "
                f"undone, e.g. {goal} back to {source}; the files it replaced are kept in "
                f"{replaced}"
            ) from None
        raise


def _rename(source: Path, goal: Path, moves: list[tuple[Path, Path]]) -> None:
    os.rename(source, goal)
    moves.append((source, goal))


def _placements(staged: Path, target: Path) -> Iterator[tuple[Path, Path]]:
    """(staged path, path in target) for each rename that merges `staged` into `target`:
    folders that exist in both are entered, everything else is moved whole."""
    for entry in sorted(staged.iterdir()):
        goal = target / entry.name
        entry_is_folder = entry.is_dir() and not entry.is_symlink()
        goal_is_folder = goal.is_dir() and not goal.is_symlink()
        if entry_is_folder and goal_is_folder:
            yield from _placements(entry, goal)
        elif goal_is_folder:
            raise DestinationError(
                f"{goal} is a folder where the project has a file; "
                "move it away or choose another destination"
            )
        elif entry_is_folder and goal.exists() and not goal.is_symlink():
            raise DestinationError(
                f"{goal} is a file where the project has a folder; "
                "move it away or choose another destination"
            )
        else:
            yield entry, goal


def _undo(moves: list[tuple[Path, Path]], created: list[Path]) -> list[tuple[Path, Path]]:
    """Reverse `moves`, then remove the folders in `created`; return the moves not undone."""
    stuck = []
    for source, goal in reversed(moves):
        try:
            os.rename(goal, source)
        except OSError:
            stuck.append((source, goal))
    for folder in reversed(created):
        with contextlib.suppress(OSError):
            folder.rmdir()
    return stuck


def _holds_files(folder: Path) -> bool:
    return folder.is_dir() and any(
        path.is_file() or path.is_symlink() for path in folder.rglob("*")
    )


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
