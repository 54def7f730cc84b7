"""Project names that are paths, shell or Python code, non-ASCII, keywords, or the names of
modules the project needs: each is refused by the real CLI with one line that says what to
answer instead, and nothing is written."""

from __future__ import annotations

import re
import sys

import pytest
from conftest import REPO_ROOT, run_scaffold

from scaffold.answers import (
    PROJECT_DISTRIBUTIONS,
    PROJECT_IMPORTS,
    RESERVED_PACKAGE_NAMES,
    package_name_for,
)

# name -> a fragment of its one-line error.
BAD_NAMES = {
    "parent-path": ("../x", "path separator or '..'"),
    "nested-path": ("a/b", "path separator"),
    "absolute-path": ("/etc/cron.d/x", "path separator"),
    "windows-path": ("C:\\x", "path separator"),
    "dot": (".", "path separator"),
    "shell-chain": ("x; rm -rf /", "path separator"),
    "shell-chain-no-slash": ("x; rm -rf ~", "holds ';', ' ', '~'"),
    "command-substitution": ("$(touch pwned)", "holds '$', '('"),
    "backticks": ("`touch pwned`", "holds '`'"),
    "python-code": ("__import__('os')", "holds '(', \"'\", ')'"),
    "single-quote": ("it's", 'holds "\'"'),
    "double-quote": ('say"hi', "holds '\"'"),
    "newline": ("a\nb", "holds '\\n'"),
    "space": ("my net", "holds ' '"),
    "accented": ("café", "non-ASCII characters ('é')"),
    "full-width": ("ｍｙｎｅｔ", "such as mynet"),
    "full-width-torch": ("ｔｏｒｃｈ", "such as my-project"),  # Python reads it as torch
    "leading-underscore": ("_private", "starting with a letter"),
    "leading-dash": ("-rf", "starting with a letter"),
    "leading-digit": ("1net", "starting with a letter"),
    "keyword": ("import", "is a Python keyword"),
    "keyword-capitalised": ("Class", "makes package 'class', a keyword"),
    "torch": ("torch", "shadows torch, a module the project imports"),
    "numpy-any-case": ("NumPy", "shadows numpy, a module the project imports"),
    "lightning": ("lightning", "shadows lightning"),
    "conftest": ("conftest", "shadows conftest"),
    "test": ("test", "shadows the standard library's test module"),
    "tests-folder": ("tests", "shadows the project's tests/ folder"),
    "os": ("os", "shadows the standard library's os module"),
    "sys": ("sys", "shadows the standard library's sys module"),
    "json-any-case": ("Json", "standard library's json module"),
    "pip": ("pip", "shadows pip, a module every Python environment has"),
    "sitecustomize": ("sitecustomize", "every Python environment"),
    "a-requirement": ("scikit-learn", "would require itself"),
    "windows-device": ("con", "Windows reserves (CON)"),
    "too-long": ("n" * 101, "too long"),
}
WHAT_TO_DO = re.compile(r"; (answer|use only|choose)")


def _via_dest(name: str) -> bool:
    """True if `name` can also reach the CLI as DEST's folder name: one path component, and
    not an option (argparse reads `-rf` as one)."""
    return "/" not in name and name not in {".", ".."} and not name.startswith("-")


CASES = [
    pytest.param(name, fragment, via, id=f"{case}-{via}")
    for case, (name, fragment) in BAD_NAMES.items()
    for via in ("data", "dest")
    if via == "data" or _via_dest(name)
]


@pytest.mark.parametrize(("name", "fragment", "via"), CASES)
def test_a_bad_project_name_is_one_line_exit_2_and_writes_nothing(tmp_path, name, fragment, via):
    args = [name] if via == "dest" else ["proj", "--data", f"project_name={name}"]
    result = run_scaffold("new", *args, "--defaults", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("scaffold: error: project name"), lines
    assert fragment in lines[0]
    assert WHAT_TO_DO.search(lines[0]), f"says what to do: {lines[0]}"
    assert list(tmp_path.iterdir()) == [], "nothing written"


@pytest.mark.parametrize(
    "name", ["cafe", "mynet", "import-project", "torch-project", "my.net", "aux-net", "match"]
)
def test_what_the_errors_suggest_and_near_misses_are_accepted(name):
    assert package_name_for(name).isidentifier()


def _imported_modules(folder) -> set[str]:
    """Top-level modules imported anywhere in the template's Python sources."""
    statement = re.compile(r"^\s*(?:import\s+([A-Za-z_]\w*)|from\s+([A-Za-z_]\w*)[\w.]*\s+import)")
    modules = set()
    for path in folder.rglob("*"):
        if path.is_file() and (path.suffix == ".py" or path.name.endswith(".py.jinja")):
            for line in path.read_text().splitlines():
                match = statement.match(line)
                if match:
                    modules.add(match.group(1) or match.group(2))
    return modules


def test_every_module_the_template_imports_is_reserved():
    """A package named after a module the rendered project imports would shadow it: when the
    template starts importing a new one, RESERVED_PACKAGE_NAMES must learn it too."""
    imported = _imported_modules(REPO_ROOT / "templates")
    assert {"torch", "pytest", "numpy"} <= imported, "the scan finds the imports"
    third_party = imported - set(sys.stdlib_module_names) - {"__future__"}
    assert third_party <= PROJECT_IMPORTS, third_party - PROJECT_IMPORTS
    assert PROJECT_IMPORTS <= RESERVED_PACKAGE_NAMES


def test_every_requirement_of_the_template_is_a_refused_distribution_name():
    pyproject = (REPO_ROOT / "templates" / "project" / "pyproject.toml.jinja").read_text()
    required = {
        re.sub(r"[-_.]+", "-", match.lower())
        for match in re.findall(r'"([A-Za-z0-9][A-Za-z0-9._-]*)\s*[<>=~!]', pyproject)
    }
    required |= set(re.findall(r'requires = \["([A-Za-z0-9._-]+)', pyproject))
    assert {"torch", "scikit-learn", "hatchling"} <= required, "the scan finds the requirements"
    assert required <= PROJECT_DISTRIBUTIONS, required - PROJECT_DISTRIBUTIONS
