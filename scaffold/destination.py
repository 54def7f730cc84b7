"""Where `scaffold new` writes: the checks on the destination folder, the staging folder on its
file system, and the all-or-nothing move of a finished render into place."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from scaffold.errors import DestinationError, RenderError


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
        raise DestinationError(cannot_write(dest, folder))


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


def cannot_write(dest: Path, folder: Path, error: OSError | None = None) -> str:
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


def holds_files(folder: Path) -> bool:
    return folder.is_dir() and any(
        path.is_file() or path.is_symlink() for path in folder.rglob("*")
    )
