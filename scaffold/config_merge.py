"""Merge a project's `configs/train.toml` with a new render of it, key by key.

A line-based 3-way merge (copier's) conflicts wherever the user's edit sits next to a line the
template changed: a new plan changes `corpus_bytes` and its `# plan:` comment, and the user's
`text_path` is the line above. Here each `key = value` line (with the `# plan:` comment above
it, if any) is merged as one unit, by its value:

- a key the user left as rendered takes the new render's line;
- a key the user changed keeps the user's line, unless the new render changed its value too:
  then a planned key (one under a `# plan:` comment) takes the new plan's value, with a note,
  and any other key is a conflict, between markers;
- the lines around the keys (comments, blank lines, tables) merge line by line, as before;
  keys the user and the template both added at the same place are both kept.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PLAN_COMMENT = "# plan:"
TABLE = re.compile(r"\s*\[+\s*([^\]]+?)\s*\]+\s*(#.*)?$")
LABELS = ("before updating", "last update", "after updating")  # copier's conflict labels
# Each key's lines are replaced by one placeholder line while the rest merges line by line.
PLACEHOLDER = "@@scaffold key {}@@\n"
PLACEHOLDER_LINE = re.compile(r"@@scaffold key (.+)@@\n")


@dataclass(frozen=True)
class Entry:
    """One key of the file: its lines (the `# plan:` comment, if any, then `key = value`) and
    its parsed value."""

    lines: tuple[str, ...]
    value: Any

    @property
    def planned(self) -> bool:
        """True when the planner wrote this value (a `# plan:` comment stands above it)."""
        return self.lines[0].lstrip().startswith(PLAN_COMMENT)


@dataclass(frozen=True)
class Merged:
    """The merged text, whether it holds conflict markers, and one note per planned value of
    the user's that the new plan replaced."""

    text: str
    conflicted: bool
    notes: tuple[str, ...]


def split_entries(text: str) -> tuple[str, dict[str, Entry]]:
    """`text` with each key's lines replaced by a placeholder line, and the entries by key
    (`table.key` inside a table). A line that is not one whole `key = value` (a value over
    several lines, say) stays a plain line."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    skeleton: list[str] = []
    entries: dict[str, Entry] = {}
    table = ""
    plan_comment = None  # the `# plan:` line just added to the skeleton, if the last was one
    for line in lines:
        header = TABLE.match(line)
        if header:
            table = header.group(1) + "."
        parsed = _key_value(line)
        name = f"{table}{parsed[0]}" if parsed else ""
        if parsed is None or name in entries:  # a duplicate key (invalid TOML): a plain line
            skeleton.append(line)
            plan_comment = line if line.lstrip().startswith(PLAN_COMMENT) else None
            continue
        unit = (line,)
        if plan_comment is not None:
            skeleton.pop()
            unit = (plan_comment, line)
        plan_comment = None
        entries[name] = Entry(unit, parsed[1])
        skeleton.append(PLACEHOLDER.format(name))
    return "".join(skeleton), entries


def _key_value(line: str) -> tuple[str, Any] | None:
    if "=" not in line or line.lstrip().startswith(("#", "[")):
        return None
    try:
        parsed = tomllib.loads(line)
    except tomllib.TOMLDecodeError:
        return None
    if len(parsed) != 1:
        return None
    ((key, value),) = parsed.items()
    return key, value


def merge_config(
    mine: str, base: str, theirs: str, merge_lines: Callable[[str, str, str], str]
) -> Merged:
    """Merge the change from `base` (the old render) to `theirs` (the new render) into `mine`
    (the project's file), key by key as the module's docstring says.

    `merge_lines(mine, base, theirs)` is the line-based 3-way merge of the rest, leaving
    conflicts between markers labelled as `LABELS` says (`render.merge_texts`)."""
    skeletons, parsed = zip(*(split_entries(text) for text in (mine, base, theirs)), strict=True)
    merged = _keep_both_sides_keys(merge_lines(*skeletons))
    notes: list[str] = []
    conflicted = "<<<<<<< " in merged
    out: list[str] = []
    for line in merged.splitlines(keepends=True):
        placeholder = PLACEHOLDER_LINE.fullmatch(line)
        if not placeholder:
            out.append(line)
            continue
        key = placeholder.group(1)
        lines, conflict, note = _merge_key(key, *(entries.get(key) for entries in parsed))
        out.extend(lines)
        conflicted = conflicted or conflict
        notes += [note] if note else []
    return Merged("".join(out), conflicted, tuple(notes))


def _keep_both_sides_keys(merged: str) -> str:
    """Resolve each conflict where both sides only added keys, different ones (the owner's
    key and the template's new one at the same place): the owner's first, then the template's."""
    conflict = re.compile(
        rf"<<<<<<< {LABELS[0]}\n((?:@@.*\n)*)=======\n((?:@@.*\n)*)>>>>>>> {LABELS[2]}\n"
    )

    def resolve(match: re.Match[str]) -> str:
        mine, theirs = match.group(1), match.group(2)
        keys = [PLACEHOLDER_LINE.fullmatch(line) for line in (mine + theirs).splitlines(True)]
        if all(keys) and len({key.group(1) for key in keys if key}) == len(keys):
            return mine + theirs
        return match.group(0)

    return conflict.sub(resolve, merged)


def _merge_key(
    key: str, mine: Entry | None, base: Entry | None, theirs: Entry | None
) -> tuple[tuple[str, ...], bool, str]:
    """(the lines for `key`, whether they are a conflict, a note or "")."""
    if mine is None or theirs is None:
        kept = mine or theirs
        assert kept is not None  # the placeholder came from one of them
        return kept.lines, False, ""
    if base is not None and mine.lines == base.lines:
        return theirs.lines, False, ""
    if mine.value == theirs.value or (base is not None and theirs.value == base.value):
        return mine.lines, False, ""
    if theirs.planned:
        note = (
            f"{key}: the new plan's {_toml(theirs)} replaces your {_toml(mine)} "
            "(the old plan's value changed too)"
        )
        return theirs.lines, False, note
    conflict = (
        f"<<<<<<< {LABELS[0]}\n",
        *mine.lines,
        "=======\n",
        *theirs.lines,
        f">>>>>>> {LABELS[2]}\n",
    )
    return conflict, True, ""


def _toml(entry: Entry) -> str:
    """The value as its line writes it."""
    return entry.lines[-1].split("=", 1)[1].split("#", 1)[0].strip()
