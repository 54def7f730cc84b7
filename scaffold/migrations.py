"""Notes for template changes that need the project owner's action, by scaffold version.

`scaffold update` prints every note of a version newer than the project's and not newer than
the installed scaffold. Add a note when a change cannot merge by itself: a renamed config key,
a checkpoint format change, a new required dependency.
"""

from __future__ import annotations

from packaging.version import Version

NOTES: dict[str, str] = {}


def notes_between(old: Version, new: Version, notes: dict[str, str] | None = None) -> list[str]:
    """The notes of versions v with old < v <= new, oldest first, each prefixed with `v<v>: `."""
    table = NOTES if notes is None else notes
    versions = sorted(Version(v) for v in table)
    return [f"v{v}: {table[str(v)]}" for v in versions if old < v <= new]
