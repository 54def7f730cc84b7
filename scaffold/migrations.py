"""What a template change needs beyond copier's merge, by scaffold version: notes for the
project owner, and the template files each version moved.

`scaffold update` prints every note of a version newer than the project's and not newer than
the installed scaffold. Add a note when a change cannot merge by itself: a renamed config key,
a checkpoint format change, a new required dependency.

Add a move when a version renders a file at a new path: the update carries the owner's edits
of the old path to the new one (`scaffold.update.carry_edits`). A file whose text the move
left unchanged is found without an entry; one the same version also edited needs it.
"""

from __future__ import annotations

from collections.abc import Mapping

from packaging.version import Version

NOTES: dict[str, str] = {}

# version → {old path: new path}, relative to the project; "{package}" is the package's name.
MOVES: dict[str, dict[str, str]] = {}


def notes_between(old: Version, new: Version, notes: dict[str, str] | None = None) -> list[str]:
    """The notes of versions v with old < v <= new, oldest first, each prefixed with `v<v>: `."""
    table = NOTES if notes is None else notes
    versions = sorted(Version(v) for v in table)
    return [f"v{v}: {table[str(v)]}" for v in versions if old < v <= new]


def moves_between(
    old: Version,
    new: Version,
    package: str,
    moves: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, str]:
    """Where the files of version `old` went by version `new`: {old path: new path} for the
    moves of versions v with old < v <= new, applied oldest first, so a file moved twice maps
    to its last path. Paths are relative to the project, with "{package}" replaced by
    `package`."""
    table = MOVES if moves is None else moves
    found: dict[str, str] = {}
    for version in sorted(Version(v) for v in table):
        if not old < version <= new:
            continue
        for source, target in table[str(version)].items():
            source, target = (p.replace("{package}", package) for p in (source, target))
            moved_here = [before for before, after in found.items() if after == source]
            for before in moved_here or [source]:
                found[before] = target
    return found
