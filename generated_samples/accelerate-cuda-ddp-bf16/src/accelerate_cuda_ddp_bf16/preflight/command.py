"""Check an allocation before a long run on it, under the run's own launcher:
`bash launch/preflight.sh [--no-step] [--timeout S] [--disk-limit-gib G] [key=value ...]` starts
`python -m accelerate_cuda_ddp_bf16.preflight` on every rank (`launch/slurm.sbatch` runs it first).

Every rank reports what it sees (facts.py) through the launcher's TCP store, each wait
bounded by `--timeout` seconds; the first rank that answered prints one table, a verdict per
check (checks.py): ranks, launcher, plan, devices, code, config, data, run folder,
disk, host memory, the collective's bus bandwidth, and a rehearsal of one step and one
checkpoint round trip at micro-batch 1 on the real model (step.py; `--no-step`
skips it). Exit status: 0 when nothing failed (warnings pass), 3 when a check failed, 4 when
ranks did not answer in time, 1 for a set-up error, 2 for a bad flag.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..config import Config, user_errors
from ..engine.strategy import PRECISION
from ..planned import PLANNED
from ..runtime import Runtime, init_runtime, resolve_device, shutdown_runtime
from .checks import (
    FAIL,
    NOT_RUN,
    PASS,
    SKIP,
    Line,
    agreement_lines,
    bus_bandwidth,
    joined_line,
    launcher_line,
    nodes_of,
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
    probes_missing,
    remove_probe,
    write_probe,
)
from .step import rehearse_or_error

# The all-reduce timed for the bus bandwidth: a few hundred MB on GPUs (large enough for NCCL's
# full rate), a few MB over gloo on CPUs.
ALL_REDUCE_BYTES = {"cuda": 256 * 2**20, "cpu": 4 * 2**20}
TIMED_ALL_REDUCES = 5
# The checks after which a collective could hang or mislead if one failed: the ranks must be
# the launch's, run the same code and config on working devices.
PREREQUISITES = ("ranks", "launcher", "devices", "code", "config")


class RanksMissing(Exception):
    """Ranks that did not answer in a phase of the exchange within the timeout."""

    def __init__(self, missing: list[int], phase: str, seconds: float):
        super().__init__(f"ranks {missing} missing in {phase}")
        self.missing, self.phase, self.seconds = missing, phase, seconds


class RankExchange:
    """Each rank's value of a phase, for every rank, through the TCP store the launcher set up
    (MASTER_ADDR:MASTER_PORT: torchrun's agent store, or rank 0's), never waiting longer than
    `timeout` seconds for a phase. Works before any process group exists, so a rank that never
    arrives is named, not waited for."""

    def __init__(self, rank: int, world_size: int, timeout: float):
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.prefix = f"preflight/{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}/{restart}"
        self.hosts_store = False
        if "MASTER_ADDR" not in os.environ:  # `python -m` alone: one process, no launcher
            self.store: dist.Store = dist.HashStore()
            return
        address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        self.hosts_store = rank == 0 and not agent_store
        try:
            self.store = dist.TCPStore(
                address,
                port,
                is_master=self.hosts_store,
                timeout=timedelta(seconds=timeout),
                wait_for_workers=False,
            )
        except (RuntimeError, dist.DistError) as error:  # the store's host never answered
            raise RanksMissing([0], f"the store at {address}:{port}", timeout) from error

    def share(self, phase: str, value: Any) -> list[Any]:
        """Publish this rank's `value` (JSON-serialisable) for `phase`; return every rank's,
        indexed by rank.

        Raises:
            RanksMissing: ranks that had not published theirs within the timeout, or rank 0
                when the store it hosts went away.
        """
        keys = [f"{self.prefix}/{phase}/{rank}" for rank in range(self.world_size)]
        deadline = time.monotonic() + self.timeout
        try:
            self.store.set(keys[self.rank], json.dumps(value))
            while missing := [rank for rank, key in enumerate(keys) if not self.store.check([key])]:
                if time.monotonic() > deadline:
                    raise RanksMissing(missing, phase, self.timeout)
                time.sleep(0.05)
            return [json.loads(self.store.get(key)) for key in keys]
        except dist.DistError as error:  # the host of the store ended
            raise RanksMissing([0], f"{phase}: the store closed", self.timeout) from error

    def leave(self, missing: list[int]) -> None:
        """Say this rank is done with the store; the rank that hosts it (rank 0 when no
        launcher agent does) waits, up to the timeout, until every rank not `missing` has said
        so: the store ends with its host, and a rank still reading from it would fail."""
        with contextlib.suppress(dist.DistError):
            self.store.set(f"{self.prefix}/left/{self.rank}", "1")
            if not self.hosts_store:
                return
            keys = [f"{self.prefix}/left/{rank}" for rank in range(self.world_size)]
            keys = [key for rank, key in enumerate(keys) if rank not in missing]
            deadline = time.monotonic() + self.timeout
            while not self.store.check(keys) and time.monotonic() < deadline:
                time.sleep(0.05)

    def process_group_store(self) -> dist.Store:
        """The store, under a prefix of its own, for the process group of the later checks."""
        return dist.PrefixStore(f"{self.prefix}/group", self.store)


def local_facts(config: Config, resume: bool) -> dict[str, Any]:
    """This rank's facts (`facts.observe`) on the device the run resolves to."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    try:
        device: torch.device | str = resolve_device(config.device, local_rank)
    except ValueError as error:
        device = str(error)
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    node = os.environ.get("GROUP_RANK") or socket.gethostname()
    return observe(config, resume, world_size, device, node)


def folder_lines(
    exchange: RankExchange,
    config: Config,
    facts: list[dict[str, Any]],
    disk_limit_gib: float | None,
) -> list[Line]:
    """The run folder (written by every rank, each rank's file seen by all), the disk and the
    host memory."""
    run_dir = Path(config.run_dir)
    names = exchange.share("probe names", f".preflight-rank{exchange.rank}-{os.getpid()}")
    errors = exchange.share("probe written", write_probe(run_dir, names[exchange.rank]))
    unseen = exchange.share("probes seen", probes_missing(run_dir, names))
    remove_probe(run_dir, names[exchange.rank])
    return storage_lines(config, facts, errors, unseen, disk_limit_gib)


def collective_line(runtime: Runtime, facts: list[dict[str, Any]], timeout: float) -> Line:
    """Every rank passes a monitored barrier (gloo; it names the ranks that do not), then the
    bus bandwidth of an all-reduce over all ranks and, on several nodes, within each node and
    between nodes (same local rank)."""
    if runtime.world_size == 1:
        return Line("collective", SKIP, "one process: nothing to communicate")
    try:
        dist.monitored_barrier(runtime.control_group, timedelta(seconds=timeout), True)
    except RuntimeError as error:
        return Line("collective", FAIL, str(error).strip().splitlines()[0][:300])
    size = ALL_REDUCE_BYTES.get(runtime.device.type, ALL_REDUCE_BYTES["cpu"])
    figures = [f"all-reduce of {size // 2**20} MiB: {gbps(size, runtime, None):.2f} GB/s"]
    nodes = list(nodes_of(facts).values())
    if len(nodes) > 1 and len({len(ranks) for ranks in nodes}) == 1:
        within, _ = dist.new_subgroups_by_enumeration(nodes)
        across, _ = dist.new_subgroups_by_enumeration([list(r) for r in zip(*nodes, strict=True)])
        if len(nodes[0]) > 1:  # one process a node: nothing within a node
            figures.append(f"within a node {gbps(size, runtime, within):.2f} GB/s")
        figures.append(f"between nodes {gbps(size, runtime, across):.2f} GB/s")
    return Line("collective", PASS, f"{'; '.join(figures)} bus bandwidth ({dist.get_backend()})")


def gbps(size: int, runtime: Runtime, group: dist.ProcessGroup | None) -> float:
    """The all-reduce bus bandwidth of `size` bytes over `group` (None: all ranks), in GB/s,
    timed over TIMED_ALL_REDUCES after one warm-up."""
    tensor = torch.ones(size // 4, device=runtime.device)
    members = dist.get_world_size(group)
    dist.all_reduce(tensor, group=group)
    if runtime.device.type == "cuda":
        torch.cuda.synchronize(runtime.device)
    start = time.perf_counter()
    for _ in range(TIMED_ALL_REDUCES):
        dist.all_reduce(tensor, group=group)
    if runtime.device.type == "cuda":
        torch.cuda.synchronize(runtime.device)
    seconds = (time.perf_counter() - start) / TIMED_ALL_REDUCES
    return bus_bandwidth(size, members, seconds) / 1e9


def step_line(exchange: RankExchange, config: Config, runtime: Runtime) -> Line:
    """The rehearsal (step.py) in a hidden folder beside the run folder, removed
    after, judged over every rank's figures."""
    folder = None
    if runtime.is_main:
        folder = tempfile.mkdtemp(prefix=".preflight-", dir=nearest_existing(Path(config.run_dir)))
    try:
        folder = exchange.share("rehearsal folder", folder)[0]
        results = exchange.share("rehearsal", rehearse_or_error(config, runtime, Path(folder)))
    finally:  # also when a rank did not answer, or on Ctrl-C
        if runtime.is_main:
            shutil.rmtree(folder, ignore_errors=True)
    return rehearsal_line(results)


def checks(config: Config, resume: bool, args: Any) -> tuple[list[Line], bool]:
    """Every check of this launch, as table lines, and whether this rank prints them (rank 0,
    or the first rank that answered when some did not)."""
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    lines: list[Line] = []
    try:
        exchange = RankExchange(rank, world_size, args.timeout)
    except RanksMissing as missing:  # the store's host never answered: the next rank reports
        line = joined_line(world_size, missing.missing, missing.seconds, missing.phase)
        return [line], rank == min(set(range(world_size)) - set(missing.missing))
    try:
        _run_checks(exchange, config, resume, args, lines)
    except RanksMissing as missing:
        exchange.leave(missing.missing)
        ranks = joined_line(world_size, missing.missing, missing.seconds, missing.phase)
        lines = [ranks, *(line for line in lines if line.check != "ranks")]
        return lines, rank == min(set(range(world_size)) - set(missing.missing))
    exchange.leave([])
    return lines, rank == 0


def _run_checks(
    exchange: RankExchange, config: Config, resume: bool, args: Any, lines: list[Line]
) -> None:
    """`checks`' lines, appended to `lines` as they are reached.

    Raises:
        RanksMissing: ranks did not answer a phase in time.
    """
    rank, world_size = exchange.rank, exchange.world_size
    if rank == 0:
        mark_if_starting(config, resume, args)
    start = time.monotonic()
    facts = exchange.share("facts", local_facts(config, resume))
    lines.append(joined_line(world_size, [], time.monotonic() - start, "facts"))
    lines.append(launcher_line(facts))
    lines += agreement_lines(PLANNED, facts, config, PRECISION)
    lines += folder_lines(exchange, config, facts, args.disk_limit_gib)
    if any(line.verdict == FAIL and line.check in PREREQUISITES for line in lines):
        lines += [Line("collective", SKIP, NOT_RUN), Line("step", SKIP, NOT_RUN)]
        return
    exchange.share("process group", True)  # names a rank that hangs before the group forms
    if world_size > 1:  # one process: init_runtime makes its own group
        try:
            dist.init_process_group(
                "nccl" if facts[rank]["device"]["type"] == "cuda" else "gloo",
                store=exchange.process_group_store(),
                rank=rank,
                world_size=world_size,
                timeout=timedelta(seconds=args.timeout),
            )
        except dist.DistError as error:
            reason = str(error).strip().splitlines()[0][:200]
            lines.append(Line("collective", FAIL, f"the process group did not form: {reason}"))
            lines.append(Line("step", SKIP, NOT_RUN))
            return
    runtime = init_runtime(config.device)
    try:
        lines.append(collective_line(runtime, facts, args.timeout))
        if args.no_step:
            lines.append(Line("step", SKIP, "--no-step"))
        elif any(line.verdict == FAIL for line in lines):
            lines.append(Line("step", SKIP, NOT_RUN))
        else:
            lines.append(step_line(exchange, config, runtime))
    finally:
        shutdown_runtime(runtime)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m accelerate_cuda_ddp_bf16.preflight`: print the table (one rank) and
    exit with the verdict's status (every rank)."""
    with user_errors():
        config, resume, args = command_line(argv, __doc__.splitlines()[0])
    lines, reports = checks(config, resume, args)
    sentence, status = verdict_summary(lines)
    if reports:
        world_size = os.environ.get("WORLD_SIZE", "1")
        print(f"preflight of accelerate_cuda_ddp_bf16: {world_size} process(es), {args.config}")
        print(table(lines))
        print(sentence)
        sys.stdout.flush()
    raise SystemExit(status)
