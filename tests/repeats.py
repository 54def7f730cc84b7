"""Which tests of a rendered project repeat, in another variant, a run of the same code.

The matrix (tests/test_matrix.py) runs every variant's own test suite, yet most of a variant's
modules are, once its package and project names are taken out, the same text in the other
variants. A test that reaches only such modules runs the same code in every one of them.

The rule: every test function of a rendered project gets a *key*, a hash of everything its
outcome can depend on; two variants whose test has the same key run the same code the same
way, and the matrix runs it in one of them only. The key of `tests/test_x.py::test_f` (all
parameter cases of a function share it) hashes, with the package and project names replaced
by placeholders:

- its node id, its own source (decorators and default values included) and the source of every
  definition it reaches in tests/: starting from the function, each name it references that
  its module or a helper it imports (`from conftest import X`, `import launcher` then
  `launcher.X`) defines at the top level, recursively; each fixture parameter, to the fixture
  of that name in its module or conftest.py (one pytest provides, `tmp_path` say, reaches
  nothing: it is the same code in every variant); every test's seeds: autouse fixtures,
  conftest's hooks (`pytest_*`), `pytestmark` and the statements a test-side module runs on
  import besides defining names;
- the text of every project module it reaches: the modules its definitions import
  (`from <pkg>.X import`, `from <pkg> import X`, `import <pkg>.X`, at the top of a test-side
  file or in a function) with their imports of the package (at the top or in a function,
  relative or absolute), transitively; a module's text includes its comments, so any edit
  counts;
- the project's settings: configs/ (a TOML file by its values, so comments do not count) and
  the `[tool]` table of pyproject.toml (pytest's and ruff's settings);
- for a test that starts a process (a reached definition calls `subprocess`, `sys.executable`,
  `runpy`, `os.fork`/`exec*`/`spawn*`/`system`, `Popen`, a `Process`, `Pool` or `spawn` such as
  multiprocessing's, or names `rank_probe`): every file under src/, launch/, configs/ and
  tests/, since what runs there is only partly visible from here.

Over the variants of one session, a key's *owner* is the first variant, in a given order, with
a test of that key; every other variant deselects that test (`assign_owners`, `repeats`).
pytest's `--deselect` takes node id prefixes: a parametrized function's is `<id>[`, a plain
one's its id, unless that id begins another test's id: then the function always runs. Tests this
module does not key (methods of test classes, modules in subfolders of tests/) always run.

What the rule leaves out, on purpose: the import-time effects of a module that nothing the
test reaches imports (pytest still imports a deselected test's module, so an import that fails
still fails the run), the order of the tests within one process, and what pytest and the
installed libraries do (the same for every variant). A process is recognised by the calls that
start one, not by any mention of `multiprocessing` or of `<pkg>.train`: the rendered conftest
configures a forkserver at import (`multiprocessing.get_context`, `set_forkserver_preload`
with `<pkg>.train` among the modules), for every test, and what forks from it runs out of
sight only when a test starts a run (`launcher.start`, a `Process`). DataLoader workers forked
from it run the data code that the test reaches anyway.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import re
import tomllib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

PACKAGE_PLACEHOLDER = "{package}"
PROJECT_PLACEHOLDER = "{project}"
# Every file under these folders is a dependency of a test that starts a process.
WHOLE_PROJECT_FOLDERS = ("src", "launch", "configs", "tests")
GENERATED_PARTS = frozenset({"__pycache__", ".pytest_cache"})

# Modules whose every use starts, or waits on, another process.
PROCESS_MODULES = frozenset({"subprocess", "runpy", "pexpect", "pty"})
# Names that start a process whatever module they come from: multiprocessing's (and
# torch.multiprocessing's) processes, pools and spawners, os's fork/exec/spawn family, asyncio's
# and concurrent.futures' process starters.
PROCESS_STARTERS = frozenset(
    {"Popen", "Process", "Pool", "ProcessPoolExecutor", "spawn", "start_processes", "system"}
    | {"fork", "forkpty", "popen", "posix_spawn", "posix_spawnp"}
    | {"create_subprocess_exec", "create_subprocess_shell"}
    | {f"exec{suffix}" for suffix in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}
    | {f"spawn{suffix}" for suffix in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}
)
# Top-level statements that only give names values: reached through those names. (`X += [...]`
# changes what X holds, which matters to those who read X.)
BINDING_STATEMENTS = (ast.Assign, ast.AnnAssign, ast.AugAssign)
# A string naming one of these is a script another process runs.
PROCESS_SCRIPTS = ("rank_probe",)


@dataclass(frozen=True)
class Names:
    """The two names a rendered project's text carries: `cpu_ddp_fp32` and `cpu-ddp-fp32`."""

    package: str
    project: str

    @classmethod
    def of(cls, project: Path) -> Names:
        """The names of the rendered project at `project`: its one package under src/, and
        pyproject's project name."""
        packages = [p.name for p in (project / "src").iterdir() if (p / "__init__.py").is_file()]
        if len(packages) != 1:
            raise ValueError(f"{project}: expected one package under src/, found {packages}")
        name = read_pyproject(project).get("project", {}).get("name", project.name)
        return cls(packages[0], name)

    @functools.cache  # noqa: B019 (a definition reached by many tests is normalized once)
    def normalize(self, text: str) -> str:
        """`text` with both names replaced by placeholders, so equal code in two variants reads
        the same (`from cpu_ddp_fp32.train import`, `wandb_project = "cpu-ddp-fp32"`)."""
        text = re.sub(rf"(?<!\w){re.escape(self.package)}(?!\w)", PACKAGE_PLACEHOLDER, text)
        return re.sub(rf"(?<![\w-]){re.escape(self.project)}(?![\w-])", PROJECT_PLACEHOLDER, text)


@dataclass(frozen=True)
class Footprint:
    """One test function of a rendered project: its key and what went into it."""

    node_id: str  # tests/test_x.py::test_f
    # The `--deselect` prefix that selects this function's cases and no other test's; None
    # where there is none (another function's name starts with this one's): it always runs.
    deselect: str | None
    reached_modules: tuple[str, ...]  # src files reached in this process, names normalized
    starts_process: bool  # if so, the key hashes the whole project, not just those modules
    key: str

    def depends_on(self, normalized_path: str) -> bool:
        """Whether the key hashes the file at `normalized_path` (relative to the project)."""
        if self.starts_process:
            return normalized_path.split("/")[0] in WHOLE_PROJECT_FOLDERS
        return normalized_path in self.reached_modules


class ImportedName(NamedTuple):
    """A name an import binds: `import a.b` → ("a.b", None), `from a import b` → ("a", "b")."""

    module: str
    attribute: str | None


def statement_bindings(statement: ast.stmt) -> set[str]:
    """The names a top-level statement binds (compound statements: anywhere inside)."""
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {statement.name}
    names = set()
    for node in ast.walk(statement):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
    return names


def imported_names(node: ast.Import | ast.ImportFrom) -> Iterator[tuple[str, ImportedName]]:
    """(bound name, what it names) for each name an absolute import binds."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            bound = alias.asname or alias.name.split(".")[0]
            yield bound, ImportedName(alias.name, None)
    elif node.level == 0 and node.module:
        for alias in node.names:
            yield alias.asname or alias.name, ImportedName(node.module, alias.name)


def fixture_name(function: ast.stmt) -> str | None:
    """The fixture name a top-level function defines (`@pytest.fixture`, `name=` honoured)."""
    if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    for decorator in function.decorator_list:
        call = decorator if isinstance(decorator, ast.Call) else None
        target = call.func if call else decorator
        if ast.unparse(target).split(".")[-1] != "fixture":
            continue
        for keyword in call.keywords if call else ():
            if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                return str(keyword.value.value)
        return function.name
    return None


def is_autouse(function: ast.stmt) -> bool:
    """Whether a fixture is `autouse=True`: it runs for every test that can see it."""
    return any(
        isinstance(decorator, ast.Call)
        and any(k.arg == "autouse" and ast.unparse(k.value) != "False" for k in decorator.keywords)
        for decorator in getattr(function, "decorator_list", ())
    )


def fixture_arguments(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """The parameters pytest fills with fixtures: those without a default value."""
    arguments = function.args
    positional = [*arguments.posonlyargs, *arguments.args]
    without_default = positional[: len(positional) - len(arguments.defaults)]
    keyword_only = [
        a for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True) if d is None
    ]
    return [a.arg for a in [*without_default, *keyword_only] if a.arg not in ("self", "cls")]


def names_a_process_starter(module: str, member: str | None) -> bool:
    """Whether `module.member` (an external module's) starts a process."""
    return (
        module.split(".")[0] in PROCESS_MODULES
        or member in PROCESS_STARTERS
        or (module, member) == ("sys", "executable")
    )


def nested_statements(node: ast.AST) -> Iterator[ast.stmt]:
    """Every statement under `node`, in functions, classes, branches and handlers too (faster
    than `ast.walk`, which visits every expression, for finding import statements)."""
    for field_name in ("body", "orelse", "finalbody", "handlers", "cases"):
        for child in getattr(node, field_name, ()):
            if isinstance(child, ast.stmt):
                yield child
            yield from nested_statements(child)


def is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)


@dataclass(frozen=True)
class References:
    """What one definition refers to, read once from its syntax tree."""

    names: frozenset[str]  # bare names (not the `x` of an `x.attribute`)
    attributes: frozenset[tuple[str, str]]  # `name.attribute`
    calls_a_starter: bool  # `anything.Popen`, `context.Process`, `os.fork`, ...
    imports: tuple[ImportedName, ...]  # import statements inside it
    strings: frozenset[str]

    @classmethod
    def of(cls, node: ast.AST) -> References:
        children = list(ast.walk(node))
        # `launcher.start` reaches `start` in tests/launcher.py, not all of that file.
        attributes = [
            child
            for child in children
            if isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name)
        ]
        bases = {id(attribute.value) for attribute in attributes}
        return cls(
            names=frozenset(
                c.id for c in children if isinstance(c, ast.Name) and id(c) not in bases
            ),
            attributes=frozenset((a.value.id, a.attr) for a in attributes),
            calls_a_starter=any(
                isinstance(c, ast.Attribute) and c.attr in PROCESS_STARTERS for c in children
            ),
            imports=tuple(
                imported
                for c in children
                if isinstance(c, ast.Import | ast.ImportFrom)
                for _, imported in imported_names(c)
            ),
            strings=frozenset(
                c.value
                for c in children
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            ),
        )


@dataclass
class Scope:
    """One Python file of tests/, by what its top level binds, imports and runs on import."""

    path: str  # relative to the project, e.g. tests/conftest.py
    lines: list[str]
    bindings: dict[str, list[ast.stmt]] = field(default_factory=dict)
    imports: dict[str, list[ImportedName]] = field(default_factory=dict)
    fixtures: dict[str, list[ast.stmt]] = field(default_factory=dict)
    # What runs for every test that imports or sees this file: statements that do more than
    # bind names, autouse fixtures, hooks, `pytestmark`.
    seeds: list[ast.stmt] = field(default_factory=list)
    tests: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    _references: dict[int, References] = field(default_factory=dict)

    @classmethod
    def parse(cls, project: Path, file: Path) -> Scope:
        text = file.read_text()
        scope = cls(str(file.relative_to(project)), text.splitlines())
        is_test_module = file.name.startswith("test_") or file.stem.endswith("_test")
        for statement in ast.parse(text).body:
            scope.add(statement, is_test_module, is_conftest=file.name == "conftest.py")
        return scope

    def add(self, statement: ast.stmt, is_test_module: bool, is_conftest: bool) -> None:
        if isinstance(statement, ast.Import | ast.ImportFrom):
            for bound, imported in imported_names(statement):
                self.imports.setdefault(bound, []).append(imported)
            return
        for name in statement_bindings(statement):
            self.bindings.setdefault(name, []).append(statement)
        defines = isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        name = getattr(statement, "name", "")
        if fixture := fixture_name(statement):
            self.fixtures.setdefault(fixture, []).append(statement)
            if is_autouse(statement):
                self.seeds.append(statement)
        elif is_test_module and name.startswith("test") and not isinstance(statement, ast.ClassDef):
            self.tests[name] = statement  # a later definition replaces an earlier one
        elif is_conftest and name.startswith("pytest_"):
            self.seeds.append(statement)
        elif "pytestmark" in statement_bindings(statement) or not (
            defines or is_docstring(statement) or isinstance(statement, BINDING_STATEMENTS)
        ):
            self.seeds.append(statement)  # it does more than bind names: it runs on import

    def references(self, node: ast.stmt) -> References:
        """`References.of(node)`, read once however many tests reach the node."""
        if id(node) not in self._references:
            self._references[id(node)] = References.of(node)
        return self._references[id(node)]

    def takes_fixtures(self, node: ast.stmt) -> bool:
        """Whether pytest fills `node`'s parameters with fixtures: a test's or a fixture's."""
        return node in self.tests.values() or any(node in f for f in self.fixtures.values())

    def source(self, node: ast.stmt) -> str:
        """The statement's lines, decorators included."""
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
        return "\n".join(self.lines[first - 1 : node.end_lineno])

    @property
    def top_level(self) -> list[ast.stmt]:
        return [s for statements in self.bindings.values() for s in statements] + self.seeds


class RenderedProject:
    """A rendered project on disk: its names, its test-side files and its package's imports.
    Its methods cache what they read (B019's leak is moot: a project lives as long as the
    footprints of its tests take to make)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.src = root / "src"
        self.names = Names.of(root)
        self.pyproject_tool = read_pyproject(root).get("tool", {})
        self.scopes = {f.stem: Scope.parse(root, f) for f in sorted((root / "tests").glob("*.py"))}

    @functools.cache  # noqa: B019
    def module_files(self, dotted: str) -> tuple[str, ...]:
        """The src files importing module `dotted` runs (its packages' __init__.py files
        first), relative to the project; () when `dotted` is not a module under src/."""
        files, folder = [], self.src
        parts = dotted.split(".")
        for index, part in enumerate(parts):
            folder = folder / part
            if (folder / "__init__.py").is_file():
                files.append(folder / "__init__.py")
            elif index == len(parts) - 1 and folder.with_suffix(".py").is_file():
                files.append(folder.with_suffix(".py"))
            elif not folder.is_dir():
                return ()
        return tuple(str(f.relative_to(self.root)) for f in files)

    def modules_named(self, module: str, attribute: str | None = None) -> tuple[str, ...]:
        """The files behind `from module import attribute` (attribute a submodule or not)."""
        files = self.module_files(module)
        if attribute and files:
            files += self.module_files(f"{module}.{attribute}")
        return files

    def closure(self, files: Iterable[str]) -> set[str]:
        """`files` and every src file they import, at any depth."""
        return set().union(*(self.file_closure(file) for file in files))

    @functools.cache  # noqa: B019
    def file_closure(self, file: str) -> frozenset[str]:
        """`file` and every src file it imports, at any depth."""
        reached, pending = set(), [file]
        while pending:
            file = pending.pop()
            if file not in reached:
                reached.add(file)
                pending += self.package_imports(file)
        return frozenset(reached)

    @functools.cache  # noqa: B019
    def package_imports(self, file: str) -> frozenset[str]:
        """The src files a src file imports anywhere in it: at the top, in a function,
        relatively or by the package's name."""
        path = self.root / file
        package = list(path.relative_to(self.src).with_suffix("").parts[:-1])
        imported: set[str] = set()
        for node in nested_statements(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    imported.update(self.module_files(alias.name))
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                for alias in node.names:
                    imported.update(self.modules_named(module, alias.name))
        return frozenset(imported)

    @functools.cache  # noqa: B019
    def file_digest(self, file: str) -> tuple[str, str]:
        """(path, hash of the text) of a project file, both with the names normalized."""
        text = self.names.normalize(read_text(self.root / file))
        return self.names.normalize(file), hashlib.sha256(text.encode()).hexdigest()

    @functools.cache  # noqa: B019
    def settings(self) -> str:
        """configs/ (TOML by its values) and pyproject's [tool] table, names normalized."""
        configs = {}
        for file in sorted(p for p in (self.root / "configs").rglob("*") if p.is_file()):
            relative = str(file.relative_to(self.root))
            is_toml = file.suffix == ".toml"
            configs[relative] = tomllib.loads(file.read_text()) if is_toml else read_text(file)
        settings = {"configs": configs, "tool": self.pyproject_tool}
        return self.names.normalize(json.dumps(settings, sort_keys=True, default=str))

    def whole_project_files(self) -> list[str]:
        """Every file a process may run or read: under src/, launch/, configs/, tests/."""
        return sorted(
            str(path.relative_to(self.root))
            for folder in WHOLE_PROJECT_FOLDERS
            for path in (self.root / folder).rglob("*")
            if path.is_file() and not GENERATED_PARTS & set(path.parts) and path.suffix != ".pyc"
        )


def read_pyproject(project: Path) -> dict:
    return tomllib.loads((project / "pyproject.toml").read_text())


def read_text(file: Path) -> str:
    """A file's text, or the hash of its bytes where they are not UTF-8."""
    data = file.read_bytes()
    try:
        return data.decode()
    except UnicodeDecodeError:
        return "sha256:" + hashlib.sha256(data).hexdigest()


class Reach:
    """Everything one test function reaches: the walk of the module docstring's rule."""

    def __init__(self, project: RenderedProject, module: Scope) -> None:
        self.project = project
        conftest = project.scopes.get("conftest")
        self.fixture_scopes = [module, *([conftest] if conftest and conftest is not module else [])]
        self.sources: dict[tuple[str, int, int], str] = {}
        self.modules: set[str] = set()
        self.starts_process = False
        self.entered: set[str] = set()
        for scope in reversed(self.fixture_scopes):
            self.enter(scope)

    def enter(self, scope: Scope) -> None:
        """What importing `scope` runs: its seeds, and the helpers it imports at the top."""
        if scope.path in self.entered:
            return
        self.entered.add(scope.path)
        for statement in scope.seeds:
            self.visit(scope, statement)
        for imported in (i for names in scope.imports.values() for i in names):
            if helper := self.helper(imported.module):
                self.enter(helper)

    def helper(self, module: str) -> Scope | None:
        """The file of tests/ that `module` names (`conftest`, `launcher`), if any."""
        return self.project.scopes.get(module) if "." not in module else None

    def visit(self, scope: Scope, node: ast.stmt) -> None:
        """Take in one definition: its source, and whatever it references."""
        identity = (scope.path, node.lineno, node.col_offset)
        if identity in self.sources:
            return
        self.sources[identity] = scope.source(node)
        references = scope.references(node)
        self.starts_process |= references.calls_a_starter
        for name in references.names:
            self.resolve(scope, name)
        for name, attribute in references.attributes:
            self.resolve(scope, name, attribute)
        for imported in references.imports:  # a function's `from <pkg>.engine import Engine`
            self.follow_import(imported, None)
        for text in references.strings:
            self.follow_string(text)
        if scope.takes_fixtures(node):
            for name in fixture_arguments(node):
                self.resolve_fixture(name)

    def resolve(self, scope: Scope, name: str, used_attribute: str | None = None) -> None:
        """A name `scope` references (as `name.used_attribute` where given)."""
        for statement in scope.bindings.get(name, ()):
            self.visit(scope, statement)
        for imported in scope.imports.get(name, ()):
            self.follow_import(imported, used_attribute)

    def follow_import(self, imported: ImportedName, used_attribute: str | None) -> None:
        module, attribute = imported
        members = [member for member in (attribute, used_attribute) if member]
        if files := self.project.module_files(module):
            dotted = module
            for member in members:  # `from <pkg> import engine`, then `engine.X`
                dotted = f"{dotted}.{member}"
                files += self.project.module_files(dotted)
            self.modules |= self.project.closure(files)
        elif helper := self.helper(module):
            self.enter(helper)
            if members:
                self.resolve(helper, members[0])
            else:  # the module object itself: it may use any of it
                for statement in helper.top_level:
                    self.visit(helper, statement)
        elif any(names_a_process_starter(module, member) for member in members or [None]):
            self.starts_process = True

    def follow_string(self, text: str) -> None:
        """A string can name a fixture (`usefixtures`, `getfixturevalue`) or a script that
        another process runs."""
        if any(script in text for script in PROCESS_SCRIPTS):
            self.starts_process = True
        if any(text in scope.fixtures for scope in self.fixture_scopes):
            self.resolve_fixture(text)

    def resolve_fixture(self, name: str) -> None:
        for scope in self.fixture_scopes:
            for fixture in scope.fixtures.get(name, ()):
                self.visit(scope, fixture)


def deselect_prefix(module: Scope, name: str) -> str | None:
    """The `--deselect` argument for test `name` of `module`: pytest deselects every node id
    that starts with it, so a parametrized function's is `id[`, a plain one's its id, unless
    another test's name starts with that name (then None: it cannot be deselected alone)."""
    node_id = f"{module.path}::{name}"
    test = module.tests[name]
    if any("parametrize" in ast.unparse(d) for d in test.decorator_list):
        return node_id + "["
    if any(other != name and other.startswith(name) for other in module.tests):
        return None
    return node_id


def footprints(root: Path) -> dict[str, Footprint]:
    """Every test function of the rendered project at `root`, by node id."""
    project = RenderedProject(root)
    return {
        footprint.node_id: footprint
        for scope in project.scopes.values()
        for footprint in (footprint_of(project, scope, name) for name in scope.tests)
    }


def footprint_of(project: RenderedProject, module: Scope, name: str) -> Footprint:
    """Test function `name` of test module `module`: what it reaches, and its key."""
    reach = Reach(project, module)
    reach.visit(module, module.tests[name])
    hashed = project.whole_project_files() if reach.starts_process else reach.modules
    node_id = f"{module.path}::{name}"
    content = {
        "test": node_id,
        "settings": project.settings(),
        "definitions": sorted(project.names.normalize(s) for s in reach.sources.values()),
        "files": dict(project.file_digest(file) for file in hashed),
    }
    return Footprint(
        node_id=node_id,
        deselect=deselect_prefix(module, name),
        reached_modules=tuple(sorted(project.names.normalize(f) for f in reach.modules)),
        starts_process=reach.starts_process,
        key=hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest(),
    )


def assign_owners(
    footprints_by_variant: Mapping[str, Mapping[str, Footprint]], order: Sequence[str]
) -> dict[str, str]:
    """Each key's owner: the first variant of `order` that has a test with that key."""
    owners: dict[str, str] = {}
    for variant in order:
        for footprint in footprints_by_variant[variant].values():
            owners.setdefault(footprint.key, variant)
    return owners


def repeats(
    variant: str, variant_footprints: Mapping[str, Footprint], owners: Mapping[str, str]
) -> dict[str, str]:
    """The tests of `variant` that another variant runs on the same code, each with that
    variant (its owner); a test that cannot be deselected alone is not among them."""
    return {
        node_id: owners[footprint.key]
        for node_id, footprint in variant_footprints.items()
        if owners[footprint.key] != variant and footprint.deselect
    }


def footprint_to_json(footprint: Footprint) -> dict:
    return asdict(footprint)


def footprint_from_json(data: Mapping) -> Footprint:
    return Footprint(**{**data, "reached_modules": tuple(data["reached_modules"])})
