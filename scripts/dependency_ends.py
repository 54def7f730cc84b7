"""Run one generated project per engine at both ends of its dependency ranges.

    python3 scripts/dependency_ends.py                      # both ends, every engine family
    python3 scripts/dependency_ends.py --end lowest --family zero
    python3 scripts/dependency_ends.py --torch-index https://download.pytorch.org/whl/cpu

`lowest` installs every dependency a project declares at exactly its lower bound
(`constraints/lowest*.txt`, kept equal to the templates by tests/test_dependency_ends.py; what
those pull in resolves as pip resolves it); `newest` installs the newest releases the package
registry serves. The families of one end share a virtual environment under `.venv-ends/` (at the
lowest end one per constraints file, reused while it is unchanged; `newest` is upgraded on every
run), so a package one project does not declare may be present there: `--family` alone, as the
workflow's jobs run it, sees one project's declarations by themselves. Each family gets a fresh
copy of its sample from `generated_samples/` and runs what the project's own CI runs: `ruff
check`, `ruff format --check` and `pytest`, with the Python that runs this script (3.11 here and
in the workflow). A table at the end gives, per family and end, the versions installed, the lint
and test results and the seconds taken; the exit status is 1 if any of them failed. The full
output is in `.venv-ends/log.txt`.

PyPI's Linux torch is the CUDA build, several GB per environment; `--torch-index` points pip at
PyTorch's CPU wheels where that index is reachable. Without a CUDA device the environments drop
the CUDA build's triton, which the CPU build does not have: triton 3.2 (torch 2.6) fails at import
on a machine without a GPU, and DeepSpeed imports it (triton-lang/triton#6150).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".venv-ends"
CONSTRAINTS = ROOT / "constraints"

# One generated sample per engine family: (framework, engine) pairs, checked against every
# sample by tests/test_dependency_ends.py so a new engine cannot go untested.
FAMILIES = {
    "plain": "cpu-ddp-fp32",
    "fsdp2": "lm-fsdp2-bf16",
    "zero": "lm-zero3-bf16",
    "fabric": "fabric-cpu-ddp-fp32",
    "fabric-fsdp2": "fabric-lm-fsdp2-fp32",
    "accelerate": "accelerate-cuda-ddp-bf16",
}
COMMAND_TIMEOUT_S = 45 * 60  # the slowest suite takes ~6 minutes on 2 cores
TIMED_OUT = 124
REPORTED = ("torch", "numpy", "lightning", "accelerate", "deepspeed", "ruff", "pytest")


def lowest_constraints(strategy: str) -> Path:
    """The constraints file of the lower bounds a project with `strategy` declares."""
    return CONSTRAINTS / ("lowest-fsdp2.txt" if strategy == "fsdp2" else "lowest.txt")


def sample_strategy(variant: str) -> str:
    """The `strategy` answer recorded in a generated sample (read without a YAML parser)."""
    answers = (ROOT / "generated_samples" / variant / ".copier-answers.yml").read_text()
    return re.search(r"^strategy: (\S+)$", answers, re.MULTILINE).group(1)


def summary_counts(output: str) -> dict[str, int]:
    """pytest's last summary line as counts, e.g. {"passed": 111, "failed": 3}."""
    lines = [line for line in output.splitlines() if re.search(r" in [\d.]+s", line)]
    if not lines:
        return {}
    found = re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", lines[-1])
    return {("error" if kind == "errors" else kind): int(count) for count, kind in found}


@dataclass
class Outcome:
    family: str
    variant: str
    end: str
    versions: dict[str, str]
    lint_ok: bool
    counts: dict[str, int]
    tests_ok: bool
    seconds: float
    problem: str = ""

    @classmethod
    def unbuilt(cls, family: str, end: str, problem: str) -> Outcome:
        """A family whose environment could not be built."""
        return cls(family, FAMILIES[family], end, {}, False, {}, False, 0.0, problem)

    @property
    def ok(self) -> bool:
        return self.lint_ok and self.tests_ok

    def row(self) -> str:
        versions = ", ".join(f"{name} {version}" for name, version in self.versions.items())
        tests = ", ".join(f"{count} {kind}" for kind, count in self.counts.items())
        tests = self.problem or tests or "no summary"
        verdict = "passed" if self.ok else "FAILED"
        lint = "ok" if self.lint_ok else "FAILED"
        return (
            f"| {self.family} | {self.variant} | {self.end} | {verdict} | {versions} | {lint} "
            f"| {tests} | {self.seconds:.0f} |"
        )


def run(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[int, str]:
    """Run `command` with its output appended to `log` as it comes; return (exit status, output).

    A command still running after COMMAND_TIMEOUT_S seconds is killed with its children (a hung
    collective, say) and returns TIMED_OUT.
    """
    with open(log, "a") as file:
        file.write(f"$ {' '.join(command)}  (in {cwd})\n")
        file.flush()
        start = file.tell()
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=file, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            status = process.wait(timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            status = TIMED_OUT
            file.write(f"\nkilled after {COMMAND_TIMEOUT_S} s\n")
    with open(log) as file:
        file.seek(start)
        return status, file.read()


def pip_environment() -> dict[str, str]:
    # Machine-wide pip settings (a cap on torch, another index) must not move either end.
    kept = {name: value for name, value in os.environ.items() if not name.startswith("PIP_")}
    return {**kept, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def build_environment(
    name: str, projects: list[Path], constraints: Path | None, torch_index: str | None, log: Path
) -> Path:
    """Create or refresh `.venv-ends/<name>` with `projects` installed editable with `[dev]`.

    Raises:
        RuntimeError: pip could not install them (the log file says why).
    """
    venv = WORK / name
    python = venv / "bin" / "python"
    wanted = json.dumps(
        [constraints.read_text() if constraints else "newest", sorted(map(str, projects))]
    )
    stamp = venv / ".installed"
    if constraints and stamp.exists() and stamp.read_text() == wanted:
        return python
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    command = [str(python), "-m", "pip", "install", "--quiet"]
    command += ["--upgrade", "--upgrade-strategy", "eager"] if constraints is None else []
    command += ["--constraint", str(constraints)] if constraints else []
    command += ["--extra-index-url", torch_index] if torch_index else []
    for project in projects:
        command += ["--editable", f"{project}[dev]"]
    status, _ = run(command, ROOT, pip_environment(), log)
    if status != 0:
        raise RuntimeError(f"pip failed for {name}: see {log}")
    probe = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
    if subprocess.run([str(python), "-c", probe], capture_output=True).returncode != 0:
        run(
            [str(python), "-m", "pip", "uninstall", "--yes", "triton"], ROOT, pip_environment(), log
        )
    stamp.write_text(wanted)
    return python


def declared(project: Path) -> set[str]:
    """The distributions `project`'s pyproject.toml names, its extras' included."""
    text = (project / "pyproject.toml").read_text()
    return set(re.findall(r'"([A-Za-z0-9._-]+)>=', text))


def installed_versions(python: Path) -> dict[str, str]:
    probe = (
        "import importlib.metadata as m, json\n"
        "found = {}\n"
        f"for name in {REPORTED!r}:\n"
        "    try: found[name] = m.version(name)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(found))"
    )
    output = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(output.stdout)


def run_family(
    family: str, end: str, project: Path, python: Path, versions: dict[str, str], log: Path
) -> Outcome:
    """Lint and test one copied project with `python`'s environment."""
    bin_dir = python.parent
    env = {
        **os.environ,
        # The environment's own tools first: torch builds DeepSpeed's ops with the first ninja.
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "TORCH_EXTENSIONS_DIR": str(bin_dir.parent / "torch_extensions"),
        "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    started = time.monotonic()
    check, _ = run([str(python), "-m", "ruff", "check", "--no-cache", "."], project, env, log)
    form, _ = run(
        [str(python), "-m", "ruff", "format", "--check", "--no-cache", "."], project, env, log
    )
    status, output = run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"], project, env, log
    )
    counts = summary_counts(output)
    return Outcome(
        family=family,
        variant=project.name,
        end=end,
        versions={name: v for name, v in versions.items() if name in declared(project)},
        lint_ok=check == 0 and form == 0,
        counts=counts,
        tests_ok=status == 0 and counts.get("passed", 0) > 0,
        seconds=time.monotonic() - started,
    )


def fresh_copy(variant: str) -> Path:
    """A fresh copy of the generated sample, where its tests may write what they like."""
    copy = WORK / "projects" / variant
    shutil.rmtree(copy, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", ".pytest_cache", ".ruff_cache", "runs")
    shutil.copytree(ROOT / "generated_samples" / variant, copy, ignore=ignore)
    return copy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--end", action="append", choices=["lowest", "newest"], help="repeatable; default: both"
    )
    parser.add_argument(
        "--family", action="append", choices=list(FAMILIES), help="repeatable; default: all"
    )
    parser.add_argument("--torch-index", help="an extra pip index for torch (its CPU wheels)")
    args = parser.parse_args(argv)
    ends = args.end or ["lowest", "newest"]
    families = args.family or list(FAMILIES)
    WORK.mkdir(exist_ok=True)
    log = WORK / "log.txt"
    log.write_text("")
    projects = {family: fresh_copy(FAMILIES[family]) for family in families}
    outcomes = []
    for end in ends:
        if end == "lowest":
            groups: dict[Path, list[str]] = {}
            for family in families:
                groups.setdefault(lowest_constraints(sample_strategy(FAMILIES[family])), []).append(
                    family
                )
            plans = [
                (constraints.stem, constraints, group) for constraints, group in groups.items()
            ]
        else:
            plans = [("newest", None, families)]
        for name, constraints, group in plans:
            print(f"{end}: installing {', '.join(group)} into .venv-ends/{name}", flush=True)
            try:
                python = build_environment(
                    name, [projects[f] for f in group], constraints, args.torch_index, log
                )
                versions = installed_versions(python)
            except (RuntimeError, OSError, subprocess.CalledProcessError) as error:
                results = [Outcome.unbuilt(family, end, str(error)) for family in group]
            else:
                results = (run_family(f, end, projects[f], python, versions, log) for f in group)
            for outcome in results:
                print(outcome.row(), flush=True)
                outcomes.append(outcome)
    print("\n| family | sample | end | verdict | versions | lint | tests | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for outcome in outcomes:
        print(outcome.row())
    print(f"\nfull output: {log}")
    return 0 if all(outcome.ok for outcome in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
