"""The template's git repositories: the cache repository copier renders from, and the commit
of the template that each project keeps.

copier updates a project only from a template that sits at the root of a git repository with the
old version reachable by tag. The installed package has no git history, so the bundled template
is committed into a cache repository (`~/.cache/scaffold/template-repo`): one parentless commit
per scaffold version, tagged `v<version>`, never moved.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

from scaffold import __version__
from scaffold.errors import RenderError
from scaffold.tools import CACHE_GIT_IDENTITY, environment, run_git

CACHE_ENV = "SCAFFOLD_CACHE_DIR"

DEFAULT_CACHE = "~/.cache/scaffold"

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
        with environment(changes):
            yield


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
