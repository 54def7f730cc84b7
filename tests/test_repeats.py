"""tests/repeats.py on the committed samples: which tests share a key across variants, and what
an edit changes. Each test copies what it edits; the samples themselves are only read."""

from __future__ import annotations

import functools
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest
from repeats import Footprint, Names, RenderedProject, assign_owners, footprints, repeats
from test_matrix import OWNER_ORDER

from scaffold.variants import VARIANTS

SAMPLES = Path(__file__).resolve().parents[1] / "generated_samples"
KEYED_PARTS = ("src", "tests", "configs", "launch", "pyproject.toml")  # all that keys read
ENGINE = "src/{package}/engine/strategy.py"

Footprints = Mapping[str, Mapping[str, Footprint]]  # variant → node id → footprint


def copy_sample(variant: str, folder: Path) -> Path:
    """The parts of generated_samples/<variant> that keys read, copied to folder/<variant>."""
    project = folder / variant
    project.mkdir(parents=True)
    for part in KEYED_PARTS:
        source = SAMPLES / variant / part
        if source.is_dir():
            shutil.copytree(source, project / part, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.is_file():
            shutil.copy(source, project / part)
    return project


@functools.cache
def names_of(project: Path) -> Names:
    return Names.of(project)


def real_path(project: Path, normalized_path: str) -> Path:
    """`src/{package}/engine/strategy.py` of `project`, under its package's own name."""
    return project / normalized_path.replace("{package}", names_of(project).package)


def normalized_text(project: Path, normalized_path: str) -> str:
    return names_of(project).normalize(real_path(project, normalized_path).read_text())


def append_comment(project: Path, normalized_path: str) -> None:
    """An edit that changes a file's text and nothing it does."""
    with real_path(project, normalized_path).open("a") as file:
        file.write("# an edit of the text alone\n")


def keys_of(found: Footprints) -> dict[tuple[str, str], str]:
    """(variant, node id) → key."""
    return {(variant, node): f.key for variant, tests in found.items() for node, f in tests.items()}


def helper_files(project: Path) -> list[str]:
    """The test-side files that are not test modules: conftest.py, launcher.py, ..."""
    tests = (project / "tests").glob("*.py")
    return sorted(f"tests/{p.name}" for p in tests if not p.name.startswith("test_"))


def engine_twins() -> list[str]:
    """The variants whose engine.py reads as cpu-single-fp32's, names normalized."""
    engine = normalized_text(SAMPLES / "cpu-single-fp32", ENGINE)
    return [v for v in OWNER_ORDER if normalized_text(SAMPLES / v, ENGINE) == engine]


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed samples the tests read, copied once: cpu-single-fp32's engine twins, the
    single-process variants (the owners of most repeats) and cpu-ddp-fp32."""
    folder = tmp_path_factory.mktemp("samples")
    wanted = {*engine_twins(), "cpu-ddp-fp32"}
    for variant in OWNER_ORDER:
        if variant in wanted or VARIANTS[variant]["strategy"] == "single":
            copy_sample(variant, folder)
    return folder


@pytest.fixture(scope="module")
def sample_footprints(samples: Path) -> dict[str, dict[str, Footprint]]:
    """Node id → footprint, by variant, in OWNER_ORDER."""
    return {v: footprints(samples / v) for v in OWNER_ORDER if (samples / v).is_dir()}


def test_equal_modules_give_equal_keys_and_a_differing_module_differing_ones(
    samples, sample_footprints
):
    """cpu-single-fp32 and cpu-ddp-fp32 share their helpers, the settings and most modules
    (data.py and loader.py among them, not runtime.py or engine.py): among the tests of the
    test modules they share, a key is the same in both exactly when every module the test
    reaches is."""
    single, ddp = samples / "cpu-single-fp32", samples / "cpu-ddp-fp32"
    assert RenderedProject(single).settings() == RenderedProject(ddp).settings()
    for helper in (h for h in helper_files(single) if (ddp / h).is_file()):
        assert normalized_text(single, helper) == normalized_text(ddp, helper), helper
    same_code_tests, different_code_tests = [], []
    for node, in_single in sample_footprints["cpu-single-fp32"].items():
        in_ddp, module = sample_footprints["cpu-ddp-fp32"].get(node), node.split("::")[0]
        if in_ddp is None or normalized_text(single, module) != normalized_text(ddp, module):
            continue
        same_code = not in_single.starts_process and (
            in_single.reached_modules == in_ddp.reached_modules
            and all(
                normalized_text(single, m) == normalized_text(ddp, m)
                for m in in_ddp.reached_modules
            )
        )
        assert (in_single.key == in_ddp.key) == same_code, node
        (same_code_tests if same_code else different_code_tests).append(node)
    compared = same_code_tests + different_code_tests
    assert any(node.startswith("tests/test_loader.py") for node in compared), compared
    assert same_code_tests and different_code_tests, (same_code_tests, different_code_tests)


def test_a_test_reaches_every_module_that_a_module_it_reaches_imports(samples, sample_footprints):
    """The modules a test reaches are closed under the package's imports (read here with a
    plain pattern), and some test reaches the engine through another module alone."""
    project = samples / "cpu-single-fp32"
    package = names_of(project).package
    src = project / "src"

    def files_of(dotted: str) -> set[str]:  # a module's file and its packages' __init__.py
        files, folder = set(), src
        for part in dotted.split("."):
            folder = folder / part
            found = folder / "__init__.py" if folder.is_dir() else folder.with_suffix(".py")
            files |= {str(found.relative_to(src)).replace(package, "{package}", 1)} - {"."}
        return {f"src/{file}" for file in files}

    imports = {}
    for module in (src / package).rglob("*.py"):
        here = module.relative_to(src).parts[:-1]  # the package it is in
        pattern = rf"^\s*from (\.+|{package}\.)([\w.]*) import"
        imported = set()
        for dots, name in re.findall(pattern, module.read_text(), re.MULTILINE):
            base = here[: len(here) - len(dots) + 1] if dots.startswith(".") else (package,)
            imported |= files_of(".".join([*base, name] if name else base))
        imports[f"src/{module.relative_to(src)}".replace(package, "{package}", 1)] = imported
    engine_through_another_module = []
    for node, footprint in sample_footprints["cpu-single-fp32"].items():
        reached = set(footprint.reached_modules)
        for module in reached:
            assert imports[module] <= reached, (node, module, imports[module] - reached)
        test_module = (project / node.split("::")[0]).read_text()
        if ENGINE in reached and f"{package}.engine" not in test_module:
            engine_through_another_module.append(node)
    assert engine_through_another_module


def test_an_edited_engine_changes_the_keys_of_exactly_the_tests_that_reach_it(
    samples, sample_footprints, tmp_path
):
    """The variants that share cpu-single-fp32's engine.py get the same edit to it: in those
    variants the keys of the tests that reach the engine change, no other key does, and the
    changed tests run in those variants rather than as repeats of another variant's run."""
    twins = engine_twins()
    assert len(twins) >= 2, f"no variant shares cpu-single-fp32's engine: {twins}"
    order = list(sample_footprints)
    edited = dict(sample_footprints)
    for variant in twins:
        append_comment(copy_sample(variant, tmp_path), ENGINE)
        edited[variant] = footprints(tmp_path / variant)

    before, after = keys_of(sample_footprints), keys_of(edited)
    assert before.keys() == after.keys()
    changed = {test for test in before if before[test] != after[test]}
    reaching = {
        (variant, node)
        for variant in twins
        for node, footprint in sample_footprints[variant].items()
        if footprint.depends_on(ENGINE)
    }
    assert changed == reaching
    assert reaching and len(reaching) < sum(len(sample_footprints[v]) for v in twins)

    owners_before = assign_owners(sample_footprints, order)
    owners_after = assign_owners(edited, order)
    for variant, node in reaching:
        key = after[variant, node]
        assert key not in owners_before, (variant, node)  # no earlier run stands for it
        assert owners_after[key] in twins, (variant, node, owners_after[key])
    skipped_before, skipped_after = {}, {}
    for variant in order:  # every other test is skipped, or run, as before
        for node, owner in repeats(variant, sample_footprints[variant], owners_before).items():
            skipped_before[variant, node] = owner
        for node, owner in repeats(variant, edited[variant], owners_after).items():
            skipped_after[variant, node] = owner
    assert skipped_before, "no test is a repeat: the check below checks nothing"
    assert {t: o for t, o in skipped_before.items() if t not in reaching} == {
        t: o for t, o in skipped_after.items() if t not in reaching
    }


def test_a_test_that_starts_a_process_depends_on_every_file_of_src(sample_footprints, tmp_path):
    """An edit of a module that a launching test does not import changes its key (the process
    may run that module), and not the key of a test that runs in-process without it."""
    project = copy_sample("cpu-single-fp32", tmp_path)
    found = sample_footprints["cpu-single-fp32"]
    launching = min(
        (f for f in found.values() if f.starts_process), key=lambda f: len(f.reached_modules)
    )
    src_files = {
        names_of(project).normalize(path.relative_to(project).as_posix())
        for path in (project / "src").rglob("*.py")
    }
    untouched, in_process = next(
        (module, f)
        for module in sorted(src_files - set(launching.reached_modules))
        for f in found.values()
        if not f.depends_on(module)
    )
    append_comment(project, untouched)
    edited = footprints(project)
    assert edited[launching.node_id].key != launching.key, untouched
    assert edited[in_process.node_id].key == in_process.key, in_process.node_id


def test_the_package_and_project_names_do_not_change_a_key(samples, sample_footprints, tmp_path):
    """cpu-ddp-fp32 renamed throughout (folder, package, project name, every mention): the
    same keys."""
    renamed = tmp_path / "renamed-sample"
    shutil.copytree(samples / "cpu-ddp-fp32", renamed)
    (renamed / "src" / "cpu_ddp_fp32").rename(renamed / "src" / "renamed_sample")
    for file in (f for f in renamed.rglob("*") if f.is_file()):
        text = file.read_text()
        text = text.replace("cpu_ddp_fp32", "renamed_sample").replace(
            "cpu-ddp-fp32", "renamed-sample"
        )
        file.write_text(text)
    assert names_of(renamed).package == "renamed_sample"
    assert {node: f.key for node, f in footprints(renamed).items()} == {
        node: f.key for node, f in sample_footprints["cpu-ddp-fp32"].items()
    }


def tiny_project(folder: Path, files: Mapping[str, str]) -> Path:
    """A project named `tiny` of `files` (path → text) besides its pyproject and package."""
    project = folder / "tiny"
    files = {"pyproject.toml": '[project]\nname = "tiny"\n', "src/tiny/__init__.py": ""} | files
    for path, text in files.items():
        (project / path).parent.mkdir(parents=True, exist_ok=True)
        (project / path).write_text(text)
    return project


def test_a_fixture_parameter_reaches_the_fixture_and_what_it_imports(tmp_path):
    """A test reaches a fixture of conftest by its parameter, and through it the module the
    fixture imports; an edit of the fixture changes that test's key alone."""
    fixture = "@pytest.fixture\ndef thing():\n    return make()\n"
    project = tiny_project(
        tmp_path,
        {
            "src/tiny/made.py": "def make():\n    return 1\n",
            "tests/conftest.py": f"import pytest\nfrom tiny.made import make\n\n{fixture}",
            "tests/test_tiny.py": "def test_with(thing):\n    pass\n\n"
            "def test_without():\n    pass\n",
        },
    )
    before = footprints(project)
    assert before["tests/test_tiny.py::test_with"].reached_modules == (
        "src/{package}/__init__.py",
        "src/{package}/made.py",
    )
    assert before["tests/test_tiny.py::test_without"].reached_modules == ()
    conftest = project / "tests" / "conftest.py"
    conftest.write_text(conftest.read_text().replace("make()", "make() + 0"))
    after = footprints(project)
    assert after["tests/test_tiny.py::test_with"].key != before["tests/test_tiny.py::test_with"].key
    assert after["tests/test_tiny.py::test_without"] == before["tests/test_tiny.py::test_without"]


def test_a_deselect_prefix_selects_its_own_function_alone(tmp_path):
    """pytest deselects by prefix: a parametrized function's prefix ends in `[`, and a plain
    function another test's name starts with has none (it always runs)."""
    tests = (
        "import pytest\n\n"
        "def test_a():\n    pass\n\n"
        "def test_a_too():\n    pass\n\n"
        '@pytest.mark.parametrize("x", [1, 2])\ndef test_b(x):\n    pass\n'
    )
    project = tiny_project(tmp_path, {"tests/test_tiny.py": tests})
    prefixes = {node: f.deselect for node, f in footprints(project).items()}
    assert prefixes == {
        "tests/test_tiny.py::test_a": None,
        "tests/test_tiny.py::test_a_too": "tests/test_tiny.py::test_a_too",
        "tests/test_tiny.py::test_b": "tests/test_tiny.py::test_b[",
    }
