"""Check this machine before a long run on it:
`python -m cpu_single_bf16.preflight [--no-step] [--disk-limit-gib G] [key=value ...]`.

Prints one table, a verdict per check (checks.py) of what this process sees
(facts.py): plan, devices, code, config, data, run folder, disk, host memory, and a
rehearsal of one step and one checkpoint round trip at micro-batch 1 on the real model
(step.py; `--no-step` skips it). Exit status: 0 when nothing failed (warnings pass),
3 when a check failed, 1 for a set-up error, 2 for a bad flag.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..config import Config, user_errors
from ..engine.strategy import PRECISION
from ..planned import PLANNED
from ..runtime import init_runtime, resolve_device, shutdown_runtime
from .checks import (
    FAIL,
    NOT_RUN,
    SKIP,
    Line,
    agreement_lines,
    rehearsal_line,
    storage_lines,
    table,
    verdict_summary,
)
from .facts import (
    command_line,
    mark_if_starting,
    nearest_existing,
    observe,
    remove_probe,
    write_probe,
)
from .step import rehearse_or_error

PROBE = ".preflight-probe"


def checks(config: Config, resume: bool, args: Any) -> list[Line]:
    """Every check of this machine, as table lines."""
    try:
        device: torch.device | str = resolve_device(config.device)
    except ValueError as error:
        device = str(error)
    mark_if_starting(config, resume, args)
    facts = [observe(config, resume, 1, device, socket.gethostname())]
    lines = agreement_lines(PLANNED, facts, config, PRECISION)
    run_dir = Path(config.run_dir)
    errors = [write_probe(run_dir, PROBE)]
    remove_probe(run_dir, PROBE)
    lines += storage_lines(config, facts, errors, [[]], args.disk_limit_gib)
    if args.no_step:
        return [*lines, Line("step", SKIP, "--no-step")]
    if any(line.verdict == FAIL for line in lines):
        return [*lines, Line("step", SKIP, NOT_RUN)]
    runtime = init_runtime(config.device)
    folder = tempfile.mkdtemp(prefix=".preflight-", dir=nearest_existing(run_dir))
    try:
        return [*lines, rehearsal_line([rehearse_or_error(config, runtime, Path(folder))])]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutdown_runtime(runtime)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m cpu_single_bf16.preflight`: print the table and exit
    with the verdict's status."""
    with user_errors():
        config, resume, args = command_line(argv, __doc__.splitlines()[0])
    lines = checks(config, resume, args)
    sentence, status = verdict_summary(lines)
    print(f"preflight of cpu_single_bf16: 1 process, {args.config}")
    print(table(lines))
    print(sentence)
    raise SystemExit(status)
