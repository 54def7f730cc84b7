"""`scaffold update`: merge the installed scaffold's template into an existing project.

copier's `run_update` re-renders the project's recorded template version and the new one with
the recorded answers, and applies the difference as a 3-way merge (conflicts inline). It exits
0 even when conflict markers remain, so conflicts are read back from git afterwards. On a
machine whose template cache lacks the project's version, that version is restored from the
commit `scaffold new` kept in the project's git (refs/scaffold/templates/<tag>).

copier's line-based merge conflicts wherever an owner's edit sits next to a line the template
changed, and a new plan changes many lines of `configs/train.toml`: copier leaves that file
alone, and `scaffold.config_merge` merges it key by key (the plan's values, the owner's own).

copier also skips, without a word, a template change to a file the owner deleted (copier#1735).
`dropped_changes` finds those files by rendering both template versions; the new version's
render is kept in the project's git (refs/scaffold/rendered/<tag>) so that one command brings
such a file back with the change.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.version import InvalidVersion, Version

from scaffold import __version__
from scaffold.answers import build_answers, merge_sources
from scaffold.config_merge import LABELS, merge_config
from scaffold.copier_runs import render_files, update_files
from scaffold.errors import ProjectError, RenderError
from scaffold.migrations import moves_between, notes_between
from scaffold.planner import Plan, plan
from scaffold.template_cache import (
    CACHE_ENV,
    ensure_template_repo,
    has_template_version,
    keep_template_in_project,
    restore_template_version,
    store_folder_as_ref,
    template_found_at,
    template_repo_source,
)
from scaffold.tools import format_with_ruff, merge_texts, run_git

ANSWERS_FILE = ".copier-answers.yml"
CONFIG = "configs/train.toml"  # merged by scaffold.config_merge, not by copier
# Where an update keeps the new template's render when it could not apply some of it.
RENDERED_REFS = "refs/scaffold/rendered"


@dataclass
class UpdateResult:
    """What an update did: versions, conflicted files, migration notes, a dry run's diff (and
    the files it changes), the plan the update rendered, notes on planned values of the
    owner's that the new plan replaced, and the files whose template change was not applied
    because the project no longer has them (`dropped`; `restore_ref` holds the new render, for
    `git checkout REF -- PATH`)."""

    old_tag: str
    new_tag: str
    conflicts: list[str] = field(default_factory=list)
    changed: bool = False
    notes: list[str] = field(default_factory=list)
    diff: str = ""
    changed_files: list[str] = field(default_factory=list)
    warnings: tuple[str, ...] = ()
    project: Path | None = None
    dropped: list[str] = field(default_factory=list)
    restore_ref: str = ""
    plan: Plan | None = None
    config_notes: tuple[str, ...] = ()
    carried: dict[str, str] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)


def find_project(start: Path) -> Path:
    """The nearest folder at or above `start` that holds an answers file.

    Raises:
        ProjectError: none does, so `start` is not inside a scaffold project.
    """
    start = start.resolve()
    for folder in (start, *start.parents):
        if (folder / ANSWERS_FILE).is_file():
            return folder
    raise ProjectError(
        f"{start} is not in a scaffold project (no {ANSWERS_FILE} here or above); "
        "run scaffold update inside a project made by scaffold new"
    )


def recorded_answers(project: Path) -> dict[str, Any]:
    """The answers file's content (answers plus copier's `_commit` and `_src_path`).

    Raises:
        ProjectError: the file is not a YAML mapping.
    """
    path = project / ANSWERS_FILE
    try:
        recorded = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        line = getattr(getattr(error, "problem_mark", None), "line", -1) + 1
        raise ProjectError(
            f"{path} is not valid YAML (line {line}); "
            f"restore it with git checkout -- {ANSWERS_FILE}"
        ) from None
    if not isinstance(recorded, dict):
        raise ProjectError(f"{path} holds no answers; restore it with git checkout")
    return recorded


def check_updatable(project: Path, recorded: Mapping[str, Any], version: str) -> Version:
    """Refuse a project without git, with uncommitted changes, or from a newer scaffold.

    Returns the project's template version. Raises ProjectError with the way out.
    """
    try:
        top = run_git("rev-parse", "--show-toplevel", cwd=project)
    except RenderError:
        raise ProjectError(
            f"{project} has no git repository; commit it first (git init && git add -A && "
            "git commit -m start), then update"
        ) from None
    dirty = run_git("status", "--porcelain", "--untracked-files=all", cwd=project)
    if dirty:
        count = len(dirty.splitlines())
        raise ProjectError(
            f"{top} has {count} uncommitted or untracked file(s); commit or stash them first"
        )
    old = _version_of(str(recorded.get("_commit", "")))
    # A local tag of the same release (v0.1.0+dev.<tree>: a changed template without a version
    # bump) is not newer than the release itself.
    if Version(old.public) > Version(Version(version).public):
        raise ProjectError(
            f"{project} was made by scaffold {old}, newer than the installed {version}; "
            f"upgrade scaffold (pip install -U scaffold) instead of downgrading the project"
        )
    return old


def _version_of(tag: str) -> Version:
    try:
        return Version(tag.removeprefix("v"))
    except InvalidVersion:
        raise ProjectError(
            f"{ANSWERS_FILE} records no scaffold version (_commit: {tag!r}); "
            "re-render with scaffold update --recopy"
        ) from None


def updated_plan(recorded: Mapping[str, Any], data: Mapping[str, str]) -> Plan:
    """Recorded answers with `data` on top, validated and planned like `scaffold new`.

    Raises:
        ProjectError: `data` renames the project (the package folder would be re-created and
            the owner's edits in it left behind).
    """
    derived = ("package_name", "plan")  # scaffold computes these again from the answers
    previous = {k: v for k, v in recorded.items() if not k.startswith("_") and k not in derived}
    # An image model's family follows its backbone answer (releases before 0.7.0 recorded the
    # language model's gpt2 here), and a timm backbone's size is its own.
    images = previous.get("task", "image-classification") == "image-classification"
    if images and previous.pop("model_family", None) == "timm":
        previous.pop("model_size", None)
    if "project_name" in data and data["project_name"] != previous.get("project_name"):
        raise ProjectError(
            "an update cannot rename the project (edits in the package would be lost); "
            "rename the package by hand, with git mv, instead"
        )
    return plan(build_answers(merge_sources(data, previous)))


def update_project(
    project: Path,
    data: Mapping[str, str] | None = None,
    *,
    ask: bool = False,
    dry_run: bool = False,
    recopy: bool = False,
    template: Path | None = None,
    version: str = __version__,
) -> UpdateResult:
    """Bring `project` to the template of scaffold `version`, keeping the owner's edits.

    With `dry_run` the update runs on a clone and only its diff is returned. With `recopy` the
    project is re-rendered from scratch with the recorded answers (no merge), for review with
    `git diff`. `template` overrides the bundled template (tests build a newer one).

    Unless `recopy`, `configs/train.toml` is merged key by key (`scaffold.config_merge`), and
    `result.dropped` lists the files the new template changes that the project no longer has
    (see `dropped_changes`); the update did not apply those changes. After a real update their
    new version is kept in the project's git as `result.restore_ref`. The owner's edits of a
    file the new template moved are merged into its new path (`result.carried`), and an edited
    file it no longer has is kept (`result.kept`): see `carry_edits`. The template cache is
    this machine's (SCAFFOLD_CACHE_DIR, see `cache_source`).

    Raises:
        ProjectError: not a scaffold project, no git, a dirty tree, a downgrade, or the old
            template version is nowhere to be found (then `--recopy` is the way out).
        AnswerError: `data` holds an invalid answer.
    """
    project = find_project(project)
    recorded = recorded_answers(project)
    old_version = check_updatable(project, recorded, version)
    planned = updated_plan(recorded, data or {})
    recorded_source = str(recorded.get("_src_path") or template_repo_source()[1])
    old_tag = str(recorded["_commit"])
    source, new_tag = ensure_template_repo(version, template, cache_source(recorded_source))
    notes = notes_between(old_version, _version_of(new_tag))
    result = UpdateResult(old_tag, new_tag, notes=notes)
    result.warnings = planned.warnings
    result.project = project
    result.plan = planned
    old_answers = _render_data(recorded)
    missing = not recopy and not has_template_version(source, old_tag)
    if missing and not restore_template_version(project, source, old_tag):
        raise ProjectError(
            f"the template of {old_tag} is neither in the cache nor kept in the project; "
            "run scaffold update --recopy and review the result with git diff"
        )
    with tempfile.TemporaryDirectory() as scratch:
        renders = TemplateRenders(source, Path(scratch), project.name)
        old = (old_tag, old_answers)
        moves = moves_between(old_version, _version_of(new_tag), planned.answers.package_name)
        merge = _Merge(planned, renders, recorded_source, old, new_tag, ask, recopy, moves)
        if dry_run:
            _dry_run(project, merge, result)
            return result
        merge.run(project, result)
        result.changed = bool(run_git("status", "--porcelain", cwd=project))
        keep_template_in_project(project, source, new_tag)
        if not recopy:  # a recopy renders every file again, deleted ones too
            ref = f"{RENDERED_REFS}/{new_tag}"
            new = (new_tag, _answers_after(project, planned))
            result.dropped = dropped_changes(project, renders, old, new, keep_as=ref)
            result.restore_ref = ref if result.dropped else ""
    return result


def cache_source(recorded: str) -> str:
    """The template cache an update uses: this machine's (SCAFFOLD_CACHE_DIR, when set) for a
    project that recorded the default `~/...` one; else the one the project recorded (an
    absolute path, from a SCAFFOLD_CACHE_DIR at `scaffold new`), which copier reads."""
    if os.environ.get(CACHE_ENV) and recorded.startswith("~/"):
        return template_repo_source()[1]
    return recorded


class TemplateRenders:
    """Whole renders of template versions (copier alone, as `render_files` makes them) for one
    update, each made once: the key-by-key config merge and `dropped_changes` read the same two
    (a render costs ~0.7 s, most of it jinja compiling the template's files).

    A version is (tag, copier data) of the template repository at `source`; its render is the
    folder `scratch/<n>/<project_name>`, which the caller's `scratch` outlives.
    """

    def __init__(self, source: str, scratch: Path, project_name: str) -> None:
        self.source, self.scratch, self.project_name = source, scratch, project_name
        self._folders: dict[str, Path] = {}

    def folder(self, version: tuple[str, Mapping[str, Any]]) -> Path:
        """The render of `version`, made on the first call.

        Raises:
            RenderError: copier failed.
        """
        tag, data = version
        key = json.dumps([tag, data], sort_keys=True, default=str)
        if key not in self._folders:
            folder = self.scratch / str(len(self._folders)) / self.project_name
            render_files(self.source, tag, data, folder)
            self._folders[key] = folder
        return self._folders[key]

    def text(self, version: tuple[str, Mapping[str, Any]], path: str) -> str:
        """The file `path` (relative to the project) as `version` renders it; "" where it
        renders no such file."""
        rendered = self.folder(version) / path
        return rendered.read_text() if rendered.is_file() else ""


@dataclass(frozen=True)
class _Merge:
    """One update's inputs: the plan, the renders of the cache repository's versions and the
    template path the project recorded, the old version (tag, copier data), the new tag,
    copier's flags, and the template files moved since the old version (old path → new)."""

    planned: Plan
    renders: TemplateRenders
    recorded_source: str
    old: tuple[str, Mapping[str, Any]]
    new_tag: str
    ask: bool
    recopy: bool
    moves: Mapping[str, str] = field(default_factory=dict)

    def run(self, folder: Path, result: UpdateResult) -> None:
        """Update the project checked out at `folder`: copier, then (not for a recopy) the
        owner's edits of moved and removed files (`carry_edits`) and `configs/train.toml` key
        by key; the files it created are intended for the next commit (`intend_to_add`). Sets
        `result`'s conflicts, config notes, carried and kept files."""
        config = folder / CONFIG
        mine = config.read_text() if config.is_file() and not self.recopy else None
        skip = [CONFIG] if mine is not None else []
        edits = [] if self.recopy else owner_edits(folder, self.renders.folder(self.old))
        with template_found_at(self.recorded_source, Path(self.renders.source)):
            data = self.planned.copier_data()
            update_files(folder, data, self.new_tag, ask=self.ask, recopy=self.recopy, skip=skip)
        conflicts = conflicted_files(folder)
        new = (self.new_tag, _answers_after(folder, self.planned))
        if edits:
            old_render, new_render = self.renders.folder(self.old), self.renders.folder(new)
            carried = carry_edits(folder, edits, old_render, new_render, self.moves)
            result.carried, result.kept = carried.moved, carried.kept
            conflicts = sorted({*conflicts, *carried.conflicts})
        if mine is not None and config.is_file():
            base, theirs = (self.renders.text(version, CONFIG) for version in (self.old, new))
            merged = merge_config(mine, base, theirs, lambda *texts: merge_texts(*texts, LABELS))
            config.write_text(merged.text)
            result.config_notes = merged.notes
            if merged.conflicted:
                conflicts = sorted({*conflicts, CONFIG})
        result.conflicts = conflicts
        intend_to_add(folder, self.renders.folder(new))


@dataclass(frozen=True)
class OwnerEdit:
    """A file of the project's template version that its owner changed: the path (relative
    to the project) and the owner's text."""

    path: str
    text: str


def owner_edits(project: Path, old_render: Path) -> list[OwnerEdit]:
    """The files that `old_render` (the project's template version, as copier renders it)
    holds and `project` holds with other text, read before an update moves or removes them.
    A file the owner deleted is not an edit (`dropped_changes` covers those)."""
    edits = []
    for path in _files_under(old_render):
        mine = project / path
        if mine.is_file() and not mine.is_symlink():
            text = mine.read_text(errors="surrogateescape")
            if text != (old_render / path).read_text(errors="surrogateescape"):
                edits.append(OwnerEdit(path, text))
    return edits


@dataclass
class CarriedEdits:
    """What `carry_edits` did: old path → new path of each edited file it merged into the
    template's new path, the edited files the template no longer has that it kept, and the
    new paths left with conflict markers."""

    moved: dict[str, str] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)


def carry_edits(
    project: Path,
    edits: list[OwnerEdit],
    old_render: Path,
    new_render: Path,
    moves: Mapping[str, str],
) -> CarriedEdits:
    """After copier's update of `project`: bring back the owner's `edits` of the files that the
    new template (`new_render`) no longer has at their path. copier deletes every file that
    only the old render had, edited or not.

    A moved file (in `moves`, or rendered with the same text at a path the old version did not
    have) gets the owner's edits by a 3-way merge (the old render's file, the owner's, the new
    path as copier wrote it; conflicts inline between `LABELS` markers), and its old path goes.
    A removed file is written back as the owner left it: nothing the template renders uses it
    any more, and only its owner can say where their edits belong.

    Raises:
        RenderError: git is missing or `git merge-file` failed.
    """
    carried = CarriedEdits()
    added = {
        path: (new_render / path).read_text(errors="surrogateescape")
        for path in _files_under(new_render)
        if not (old_render / path).exists()
    }
    for edit in edits:
        if (new_render / edit.path).exists():
            continue  # still rendered there: copier merged it in place
        base = (old_render / edit.path).read_text(errors="surrogateescape")
        same_text = [path for path, text in added.items() if text == base]
        target = moves.get(edit.path) or (same_text[0] if len(same_text) == 1 else None)
        destination = project / (target or edit.path)
        if target and destination.is_file():
            theirs = destination.read_text(errors="surrogateescape")
            merged = merge_texts(edit.text, base, theirs, LABELS)
            destination.write_text(merged, errors="surrogateescape")
            (project / edit.path).unlink(missing_ok=True)
            carried.moved[edit.path] = target
            if "<<<<<<< " in merged:
                carried.conflicts.append(target)
                mark_unmerged(project, target, (base, edit.text, theirs))
        else:
            destination = project / edit.path
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_text(edit.text, errors="surrogateescape")
            carried.kept.append(edit.path)
    return carried


def mark_unmerged(project: Path, path: str, sides: tuple[str, str, str]) -> None:
    """Record `path` (relative to `project`) in git's index as unmerged, its stages 1 to 3 the
    `sides` (the old render, the owner's file, the new render), as git records a conflict of its
    own merges: `git status` shows it `UU`, `git diff --diff-filter=U` lists it, and `git add`
    marks it resolved (git-read-tree(1), "3-Way Merge").

    Raises:
        RenderError: git failed.
    """
    prefix = run_git("rev-parse", "--show-prefix", cwd=project)  # a project in a larger repo
    entries = []
    for stage, text in enumerate(sides, start=1):
        blob = run_git("hash-object", "-w", "--stdin", cwd=project, stdin=text)
        entries.append(f"100644 {blob} {stage}\t{prefix}{path}")
    run_git("update-index", "--index-info", cwd=project, stdin="\n".join(entries) + "\n")


def intend_to_add(project: Path, rendered: Path) -> None:
    """Mark the files of `rendered` (a render of the new template) that the update created in
    `project` as intended for the next commit (`git add --intent-to-add`): `git diff` shows them
    and `git commit -a` takes them with the rest, where untracked they would be left out.

    Raises:
        RenderError: git failed.
    """
    untracked = run_git("ls-files", "--others", "--exclude-standard", "-z", cwd=project)
    new = sorted(set(untracked.split("\0")) & set(_files_under(rendered)))
    if new:
        run_git("add", "--intent-to-add", "--", *new, cwd=project)


def dropped_changes(
    project: Path,
    renders: TemplateRenders,
    old: tuple[str, Mapping[str, Any]],
    new: tuple[str, Mapping[str, Any]],
    keep_as: str | None = None,
) -> list[str]:
    """Files (relative to `project`, sorted) that template version `new` renders differently
    from version `old` but that the project does not have: its owner deleted or moved them, so
    copier's update left the change out without a word.

    `old` and `new` are (tag, copier data), rendered by `renders`. A deleted file that the
    template did not change is not listed: the update lost nothing there. With `keep_as` and
    something listed, the new version's render (formatted as `scaffold new` formats it) is
    committed into the project's git as that ref, for `git checkout REF -- PATH`.

    Raises:
        RenderError: copier, ruff or git failed.
    """
    new_render = renders.folder(new)
    missing = [
        path
        for path in _files_under(new_render)
        if not (project / path).exists() and not (project / path).is_symlink()
    ]
    if not missing:
        return []
    old_render = renders.folder(old)
    dropped = [
        path
        for path in missing
        if (old_render / path).is_file()
        and not filecmp.cmp(old_render / path, new_render / path, shallow=False)
    ]
    if dropped and keep_as:
        with tempfile.TemporaryDirectory() as scratch:
            formatted = Path(scratch) / project.name  # the render stays as copier made it
            shutil.copytree(new_render, formatted, symlinks=True)
            format_with_ruff(formatted)
            message = f"scaffold template {new[0]} rendered with this project's answers"
            store_folder_as_ref(project, formatted, keep_as, message)
    return dropped


def _files_under(folder: Path) -> list[str]:
    return sorted(
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*")
        if path.is_file() or path.is_symlink()
    )


def _render_data(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """The copier data of an answers file: every answer, without copier's `_` keys."""
    return {key: value for key, value in recorded.items() if not key.startswith("_")}


def _answers_after(project: Path, planned: Plan) -> dict[str, Any]:
    """The data the update rendered with: the plan's, plus answers to questions that the new
    template added (as the updated answers file records them, when it is readable)."""
    try:
        recorded = _render_data(recorded_answers(project))
    except ProjectError:  # e.g. conflict markers in the answers file
        recorded = {}
    return {**recorded, **planned.copier_data()}


def _dry_run(project: Path, merge: _Merge, result: UpdateResult) -> None:
    """Run the update on a throw-away clone; fill `result` with `git diff` of what it changed,
    the files it changed, those left with conflicts, and the files whose change it left out
    (see `dropped_changes`)."""
    with tempfile.TemporaryDirectory() as scratch:
        clone = Path(scratch) / project.name
        run_git("clone", "--quiet", str(project), str(clone), cwd=Path(scratch))
        merge.run(clone, result)
        new = (merge.new_tag, _answers_after(clone, merge.planned))
        if not merge.recopy:
            result.dropped = dropped_changes(clone, merge.renders, merge.old, new)
        run_git("add", "--all", cwd=clone)
        result.diff = run_git("diff", "--cached", cwd=clone)
        result.changed_files = run_git("diff", "--cached", "--name-only", cwd=clone).splitlines()
        result.changed = bool(result.changed_files)


def conflicted_files(project: Path) -> list[str]:
    """Files git records as unmerged, and `*.rej` leftovers, relative to the project."""
    unmerged = run_git("diff", "--name-only", "--diff-filter=U", cwd=project).splitlines()
    rejects = [str(p.relative_to(project)) for p in project.rglob("*.rej") if ".git" not in p.parts]
    return sorted(set(unmerged) | set(rejects))
