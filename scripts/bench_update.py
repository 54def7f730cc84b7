"""Wall time of `scaffold new` / `scaffold update` beside raw copier's copy / update (median of 5).

Run: .venv/bin/python scripts/bench_update.py. Uses a temporary HOME (fresh template cache)
and a newer template built by copying templates/ and changing one line of the loop.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = 5


def timed(command: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        os.environ["HOME"] = str(scratch / "home")
        os.environ.pop("SCAFFOLD_CACHE_DIR", None)
        (scratch / "home").mkdir()
        subprocess.run(["git", "config", "--global", "user.name", "bench"], check=True)
        subprocess.run(["git", "config", "--global", "user.email", "b@example.invalid"], check=True)
        v2 = scratch / "templates"
        shutil.copytree(ROOT / "templates", v2)
        train = v2 / "project" / "src" / "{{package_name}}" / "train.py.jinja"
        train.write_text(train.read_text().replace("# dropout off", "# dropout off (v0.2.0)"))
        scaffold = [sys.executable, "-m", "scaffold"]
        copier_cli = [sys.executable, "-m", "copier"]
        subprocess.run([*scaffold, "new", "warmup", "--defaults"], cwd=scratch, check=True)
        times: dict[str, list[float]] = {k: [] for k in ("new", "copy", "update", "raw update")}
        answers = (scratch / "warmup" / ".copier-answers.yml").read_text()
        data = [
            f"--data={line.replace(': ', '=', 1)}"
            for line in answers.splitlines()
            if line and not line.startswith(("#", "_", "project_name", "package_name"))
        ]
        for run in range(RUNS):
            times["new"].append(timed([*scaffold, "new", f"n{run}", "--defaults"], scratch))
            raw = [*copier_cli, "copy", "--defaults", "--quiet", "--vcs-ref", "v0.1.0", *data]
            raw += ["--data", f"project_name=c{run}", "--data", f"package_name=c{run}"]
            raw += ["~/.cache/scaffold/template-repo", f"c{run}"]
            times["copy"].append(timed(raw, scratch))
            update = [*scaffold, "update", f"n{run}", "--template", str(v2)]
            times["update"].append(timed([*update, "--template-version", "0.2.0"], scratch))
            project = scratch / f"u{run}"
            subprocess.run([*scaffold, "new", project.name, "--defaults"], cwd=scratch, check=True)
            raw_update = [*copier_cli, "update", "--defaults", "--quiet", "--vcs-ref", "v0.2.0"]
            times["raw update"].append(timed([*raw_update, "--conflict", "inline"], project))
        print(f"{'operation':<28}{'median s':>10}{'min s':>8}{'max s':>8}")
        labels = {
            "new": "scaffold new --defaults",
            "copy": "copier copy (same template)",
            "update": "scaffold update",
            "raw update": "copier update (same)",
        }
        for key, label in labels.items():
            values = times[key]
            print(
                f"{label:<28}{statistics.median(values):>10.2f}{min(values):>8.2f}{max(values):>8.2f}"
            )


if __name__ == "__main__":
    main()
