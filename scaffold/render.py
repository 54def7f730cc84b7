"""`scaffold new`'s render: copier into a staging folder, ruff, the first commit, then the
whole project moved into place, or nothing written."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scaffold.copier_runs import render_files
from scaffold.destination import (
    cannot_write,
    check_destination,
    holds_files,
    move_into_place,
    staging_folder,
)
from scaffold.errors import DestinationError
from scaffold.template_cache import ensure_template_repo, keep_template_in_project
from scaffold.tools import format_with_ruff, initial_commit


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
    check_destination(dest, force)
    target = dest.resolve()
    was_empty = not target.is_dir() or not any(target.iterdir())
    src_path, tag = ensure_template_repo()
    folder = staging_folder(target)
    try:
        workspace = Path(tempfile.mkdtemp(prefix=".scaffold-new-", dir=folder))
    except OSError as error:
        raise DestinationError(cannot_write(dest, folder, error)) from error
    replaced = workspace / "replaced"
    moved = False
    try:
        staged = workspace / target.name
        staged.mkdir()
        render_files(src_path, tag, data, staged)
        format_with_ruff(staged)
        if init_git and was_empty:  # never commit files the user had in DEST
            initial_commit(staged, tag)
            keep_template_in_project(staged, src_path, tag)
        move_into_place(staged, target, replaced)
        moved = True
    finally:
        if moved or not holds_files(replaced):  # else the user's files wait there
            shutil.rmtree(workspace, ignore_errors=True)
