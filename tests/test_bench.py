"""The benchmarks still run: each script's `--smoke` (its smallest sizes, seconds) prints every
row it measures, so a template change that breaks a benchmark fails here, not on the day
someone measures. Figures are not checked: benchmarks measure, tests do not (bench/README.md).

scripts/gpu_check.py's smoke run also runs bench/gpu_throughput.py's and bench/memory.py's,
which are its last rows."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import REPO_ROOT, VISION_PYTHON, extensions_env

BENCH = REPO_ROOT / "bench"


def smoke(script: Path, python: str = sys.executable, *args: str) -> str:
    """`python SCRIPT --smoke ARGS` from the repository's root; its standard output. Fails the
    test, with the end of its standard error, where the script fails.

    No bytecode is written: several scripts import the committed samples in place, and a
    __pycache__ there would read as a stale sample (test_samples)."""
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(python).parent), os.environ["PATH"]])}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env |= extensions_env(python)
    result = subprocess.run(
        [python, str(script), "--smoke", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, f"{script.name} --smoke failed:\n{result.stderr[-4000:]}"
    return result.stdout


def script_module(script: Path) -> ModuleType:
    """`script`'s module, imported without running its main."""
    spec = importlib.util.spec_from_file_location(f"bench_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def table_rows(text: str, first_cell: str) -> list[list[str]]:
    """The cells of every markdown table row of `text` whose first cell starts `first_cell`."""
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|")
    ]
    return [row for row in rows if row[0].startswith(first_cell)]


def test_run_prints_every_loop_of_both_projects_and_their_headroom():
    run = script_module(BENCH / "run.py")
    out = smoke(BENCH / "run.py")
    for variant in run.PROJECTS:
        loops = [row[1] for row in table_rows(out, variant) if len(row) == 5]
        assert loops == list(run.LOOPS), (variant, out)
        rates = [float(row[2]) for row in table_rows(out, variant) if len(row) == 5]
        assert all(rate > 0 for rate in rates), out
        (headroom,) = [row for row in table_rows(out, variant) if len(row) == 4]
        assert headroom[3].endswith("x"), out


def test_gpu_check_prints_every_check_and_both_bench_tables():
    gpu_check = REPO_ROOT / "scripts" / "gpu_check.py"
    out = smoke(gpu_check)
    table = out[out.index("check   ") :]
    for label, variant, *_ in script_module(gpu_check).CHECKS:
        line = next(line for line in table.splitlines() if line.startswith(label))
        assert re.search(rf"{re.escape(variant)}\s+ok\s", line), line
    assert re.search(r"resume diff.*\n(.*\n)*.*\d\.\de[+-]\d\d", table), "no resume ran"
    throughput = table_rows(out, "false") + table_rows(out, "true")
    assert [row[1] for row in throughput] == ["bare", "rendered"] * 2, out
    memory = table_rows(out, "single") + table_rows(out, "fsdp2")
    assert [(row[0], row[6]) for row in memory] == [("single", "off"), ("fsdp2", "on")], out


def test_checkpoint_stall_prints_both_formats():
    out = smoke(BENCH / "checkpoint_stall.py")
    rows = table_rows(out, "single file") + table_rows(out, "sharded")
    assert len(rows) == 2, out
    assert all(float(row[1]) > 0 and float(row[2]) > 0 for row in rows), out


def test_data_prints_its_four_tables():
    out = smoke(BENCH / "data.py")
    measured = [row[0] for row in table_rows(out, "`")]
    assert measured[0] == "`encode_batch`, one process" and len(measured) == 3, out
    assert len(table_rows(out, "one ") + table_rows(out, "1,000 records")) == 2, out
    stops = table_rows(out, "SIGINT") + table_rows(out, "SIGTERM")
    assert [row[4] for row in stops] == ["0", "0"], out  # no process of prepare's left
    assert len(table_rows(out, "~")) == 2, out


def test_finetune_prints_lora_against_full_and_packed_against_padded():
    out = smoke(BENCH / "finetune.py")
    assert [row[0] for row in table_rows(out, "full") + table_rows(out, "lora")] == ["full", "lora"]
    packing = table_rows(out, "one example a row") + table_rows(out, "packed")
    assert len(packing) == 2, out


def test_hub_io_prints_imports_and_the_export():
    out = smoke(BENCH / "hub_io.py")
    rows = table_rows(out, "one file") + table_rows(out, "sharded")
    assert [(row[0].split()[0], row[1]) for row in rows] == [
        ("one", "import"),
        ("one", "export"),
        ("sharded", "import"),
    ], out


def vision_python() -> str:
    """.venv-vision's Python (timm, torchvision), where the image benchmarks run."""
    vision = os.environ.get("SCAFFOLD_VISION_PYTHON", str(VISION_PYTHON))
    if not Path(vision).is_file():
        pytest.fail(f"{vision} not found: run scripts/test.sh once, which sets it up")
    return vision


def test_backbones_write_both_tables_and_memory_prints_a_backbone_row():
    """bench/backbones.py snapshots timm models and measures their activations; memory.py
    --images sets scaffold's estimate of a backbone against its measured peak."""
    tables = smoke(BENCH / "backbones.py", vision_python())
    assert "2 models, 0 skipped" in tables and '"bf16"' in tables, tables
    rows = table_rows(smoke(BENCH / "memory.py", vision_python(), "--images"), "resnet10t")
    assert len(rows) == 1 and float(rows[0][-3]) > 0 and float(rows[0][-2]) > 0, rows


def test_images_prints_prepare_memory_and_headroom():
    out = smoke(BENCH / "images.py", vision_python())
    for start in ("prepare: ", "peak resident memory, ", "headroom: loader "):
        assert any(line.startswith(start) for line in out.splitlines()), (start, out)


def test_generate_prints_both_families_at_both_contexts():
    out = smoke(BENCH / "generate.py")
    rows = table_rows(out, "llama") + table_rows(out, "gpt2")
    assert [(row[0], row[1]) for row in rows] == [
        ("llama", "64"),
        ("llama", "512"),
        ("gpt2", "64"),
        ("gpt2", "512"),
    ], out
    assert all(float(row[2]) > 0 and float(row[3]) > 0 for row in rows), out
    assert all(row[5] != "NO" for row in rows), "the project's greedy tokens are transformers'"
