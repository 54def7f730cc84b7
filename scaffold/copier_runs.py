"""The only module that imports copier: a render of one template version into a new folder, and
an update (or recopy) of a project in place. copier's own warnings are not the user's and are
silenced; its errors become `RenderError`. Plain-text template strings compile once per process
(`scaffold.literal_templates`)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from scaffold.errors import RenderError
from scaffold.literal_templates import literal_templates_compiled_once


@contextlib.contextmanager
def _copier() -> Iterator[Any]:
    import copier  # deferred: importing copier takes ~0.5 s that `--help` should not pay
    from copier.errors import CopierError, CopierWarning

    with warnings.catch_warnings(), literal_templates_compiled_once():
        warnings.simplefilter("ignore", CopierWarning)
        try:
            yield copier
        except CopierError as error:
            raise RenderError(f"copier failed: {error}") from error


def render_files(src_path: str, tag: str, data: Mapping[str, Any], dest: Path) -> None:
    """Render template version `tag` of the repository at `src_path` with `data` into the new
    folder `dest`: copier alone (no ruff, no git), as `scaffold new` renders a project and
    `scaffold update` each side of its merge.

    Raises:
        RenderError: copier failed.
    """
    with _copier() as copier:
        copier.run_copy(src_path, dest, data=dict(data), vcs_ref=tag, defaults=True, quiet=True)


def update_files(
    project: Path, data: Mapping[str, Any], tag: str, *, ask: bool, recopy: bool, skip: list[str]
) -> None:
    """copier's update of `project` to template version `tag` with `data` (its three-way merge,
    conflicts inline; asking the new questions when `ask`), or its recopy (`recopy`: a fresh
    render over the project), leaving the files in `skip` as they are.

    Raises:
        RenderError: copier failed.
    """
    options = dict(data=dict(data), vcs_ref=tag, overwrite=True, quiet=True)
    with _copier() as copier:
        if recopy:
            copier.run_recopy(project, defaults=True, **options)
        else:
            copier.run_update(
                project, defaults=not ask, conflict="inline", skip_if_exists=skip, **options
            )
