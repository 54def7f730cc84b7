"""The preflight's verdicts: each check reads every rank's facts (facts.py, a list
indexed by rank) and the plan (planned.py) and returns one `Line` of the table. Pure functions
of their arguments, so every rank reaches the same verdicts and tests can call them directly."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..config import Config
from ..planned import MIN_CAPABILITY, Allocation

PASS, WARN, FAIL, SKIP = "ok", "warn", "FAIL", "skip"
GIB = 2**30
# A checkpoint holds fp32 weights and AdamW's two fp32 moments: 12 bytes per parameter
# (Kingma & Ba 2015; the planner's 16 bytes of training state less the gradients).
CHECKPOINT_BYTES_PER_PARAMETER = 12
# Training state per parameter: fp32 weights (4), gradients (4) and AdamW's moments (8), of which
# every process holds all: the state is replicated.
STATE_BYTES_PER_PARAMETER, SHARDED_BYTES_PER_PARAMETER = 16, 0
# Whether the state lives in host memory on a GPU run (only a CPU run's does here).
STATE_ON_HOST = False
# A GPU whose memory is this much below the plan's still fits it: vendors quote 80 GB cards that
# report 79.1 GiB usable.
MEMORY_TOLERANCE = 0.9
# Loss probes before and after a checkpoint's round trip agree to this relative difference: the
# same weights and batch give the same loss up to the order of a GPU's reductions.
LOSS_TOLERANCE = 1e-5
EVERY_RANK = " on every rank"
NOT_RUN = "not run: a check above failed"
# Exit statuses: a check failed; ranks did not answer in time (set-up errors exit 1, bad
# flags 2).
CHECK_FAILED, RANKS_MISSING = 3, 4


@dataclass(frozen=True)
class Line:
    """One row of the table: the check's name, its verdict (PASS, WARN, FAIL or SKIP) and
    what was measured or what to do."""

    check: str
    verdict: str
    detail: str


def ranks_text(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> 'ranks 0-2, 5' ('rank 3' for one)."""
    spans: list[list[int]] = []
    for rank in sorted(ranks):
        if spans and rank == spans[-1][-1] + 1:
            spans[-1].append(rank)
        else:
            spans.append([rank])
    parts = [f"{s[0]}-{s[-1]}" if len(s) > 1 else str(s[0]) for s in spans]
    return ("ranks " if len(ranks) > 1 else "rank ") + ", ".join(parts)


def nodes_of(facts: list[dict[str, Any]]) -> dict[str, list[int]]:
    """The ranks on each node, by the node's name, in rank order."""
    nodes: dict[str, list[int]] = {}
    for rank, fact in enumerate(facts):
        nodes.setdefault(fact["node"], []).append(rank)
    return nodes


def plan_line(planned: Allocation, facts: list[dict[str, Any]], global_batch: int) -> Line:
    """WARN when the launch has another process count than the plan: the global batch
    (`global_batch` samples here) is micro_batch_size x processes x grad_accum_steps, so the
    learning rate and schedule were tuned for another one."""
    world_size, nodes = len(facts), len(nodes_of(facts))
    shape = f"{nodes} node(s) x {world_size // nodes} process(es)"
    want = f"{planned.nodes} node(s) x {planned.processes_per_node} process(es)"
    if world_size != planned.world_size:
        return Line(
            "plan",
            WARN,
            f"{shape}, planned {want}: the global batch is {global_batch} samples, not the "
            f"planned {global_batch // world_size * planned.world_size}",
        )
    return Line("plan", PASS, f"{shape}, as planned; global batch {global_batch} samples")


def devices_line(
    planned: Allocation, facts: list[dict[str, Any]], device_setting: str, precision: str
) -> Line:
    """Every rank's device against the plan: the type (`device=auto` must find the planned
    one), and on CUDA a GPU per local process, each with the planned memory, at least the
    planned architecture's compute capability, and support for `precision` (the engine's)."""
    errors = {rank: fact["device"].get("error") for rank, fact in enumerate(facts)}
    if failed := [rank for rank, error in errors.items() if error]:
        return Line("devices", FAIL, f"{ranks_text(failed)}: {errors[failed[0]]}")
    devices = [fact["device"] for fact in facts]
    types = Counter(device["type"] for device in devices)
    if len(types) > 1:
        return Line("devices", FAIL, f"ranks differ: {dict(types)}; set device= explicitly")
    kind = devices[0]["type"]
    if kind != planned.device:
        what = f"{kind}{EVERY_RANK * (len(facts) > 1)}; the plan is {planned_devices(planned)}"
        if device_setting == "auto":
            fix = f"run on the planned machines, or pass device={kind} to check a {kind} run"
            return Line("devices", FAIL, f"{what}: {fix}")
        return Line("devices", WARN, f"{what} (device={device_setting} asks for {kind})")
    if kind != "cuda":
        cores = f"{devices[0]['cpus']} cores per node"
        return Line("devices", PASS, f"{kind}{EVERY_RANK * (len(facts) > 1)}, {cores}")
    return _gpus_line(planned, facts, precision)


def planned_devices(planned: Allocation) -> str:
    """'8 x 80.0 GiB CUDA GPUs (hopper) per node', or 'cpu'."""
    if planned.device != "cuda":
        return planned.device
    gpus = f"{planned.processes_per_node} x {planned.gpu_memory_gib} GiB CUDA GPUs"
    return f"{gpus} ({planned.gpu_arch}) per node"


def _gpus_line(planned: Allocation, facts: list[dict[str, Any]], precision: str) -> Line:
    devices = [fact["device"] for fact in facts]
    problems = []
    for node, ranks in nodes_of(facts).items():
        if (seen := devices[ranks[0]]["count"]) < len(ranks):
            problems.append(f"node {node} has {seen} GPU(s) for {len(ranks)} processes")
    need = planned.gpu_memory_gib * MEMORY_TOLERANCE * GIB
    if small := [rank for rank, device in enumerate(devices) if device["memory"] < need]:
        got = devices[small[0]]["memory"] / GIB
        problems.append(
            f"{ranks_text(small)}: {got:.1f} GiB GPUs, planned {planned.gpu_memory_gib} GiB "
            "(the micro-batch may not fit: re-plan it with `scaffold plan`)"
        )
    floor = MIN_CAPABILITY.get(planned.gpu_arch, (0, 0))
    if old := [rank for rank, device in enumerate(devices) if tuple(device["capability"]) < floor]:
        got = ".".join(map(str, devices[old[0]]["capability"]))
        want = ".".join(map(str, floor))
        problems.append(f"{ranks_text(old)}: compute capability {got}, planned {want}+")
    if unsupported := [r for r, d in enumerate(devices) if not d["precision_supported"]]:
        problems.append(f"{ranks_text(unsupported)}: no {precision} on this GPU")
    names = Counter(device["name"] for device in devices)
    first = devices[0]
    seen = ", ".join(f"{count} x {name}" for name, count in names.items())
    detail = f"{seen}; {first['memory'] / GIB:.1f} GiB, capability "
    detail += ".".join(map(str, first["capability"])) + f", {precision} supported"
    if problems:
        return Line("devices", FAIL, "; ".join(problems))
    return Line("devices", PASS, detail)


def same_everywhere(check: str, facts: list[dict[str, Any]], key: str, what: str) -> Line:
    """PASS when every rank's `key` fact is the same; FAIL naming the ranks that differ from
    rank 0 (and their hosts)."""
    differ = [rank for rank, fact in enumerate(facts) if fact[key] != facts[0][key]]
    if differ:
        hosts = sorted({facts[rank]["host"] for rank in differ})
        detail = f"{ranks_text(differ)} (on {', '.join(hosts)}) {what} than rank 0"
        return Line(check, FAIL, f"{detail}; {FIXES[check]}")
    where = ", the same on every rank" if len(facts) > 1 else ""
    return Line(check, PASS, f"sha256 {facts[0][key][:12]}{where}")


FIXES = {
    "code": "install the same commit of the project on every node",
    "config": "give every node the same configs/train.toml and overrides",
    "data": "prepare the data once on shared storage, or copy the same files to every node",
}


def code_line(facts: list[dict[str, Any]]) -> Line:
    """The package's source hash is the same on every rank; PASS names the git commit."""
    line = same_everywhere("code", facts, "code", "run other source files")
    if line.verdict == PASS and facts[0]["git"]:
        return Line("code", PASS, f"{line.detail} (git {facts[0]['git']})")
    return line


def agreement_lines(
    planned: Allocation, facts: list[dict[str, Any]], config: Config, precision: str
) -> list[Line]:
    """The lines judged from every rank's facts alone: the plan's process count, the devices,
    and the same code, config and data everywhere."""
    global_batch = config.global_batch_size(len(facts))
    lines = [plan_line(planned, facts, global_batch)]
    lines.append(devices_line(planned, facts, config.device, precision))
    lines.append(code_line(facts))
    lines.append(same_everywhere("config", facts, "config", "resolved another config"))
    return [*lines, data_line(facts)]


def data_line(facts: list[dict[str, Any]]) -> Line:
    """The data loads on every rank, with the same fingerprint."""
    if failed := [rank for rank, fact in enumerate(facts) if fact["data"].startswith("error:")]:
        return Line("data", FAIL, f"rank {failed[0]}: {facts[failed[0]]['data'][7:]}")
    return same_everywhere("data", facts, "data", "read other data")


def run_folder_line(
    facts: list[dict[str, Any]], run_dir: str, write_errors: list[str], unseen: list[list[str]]
) -> Line:
    """Every rank wrote its probe file in the run folder, and every rank sees every other's
    (a folder that is not shared between nodes would split the checkpoints), and the run
    would not refuse the folder (`run_conflict`)."""
    if facts[0]["run_conflict"]:
        return Line("run folder", FAIL, facts[0]["run_conflict"])
    if failed := [rank for rank, error in enumerate(write_errors) if error]:
        what = write_errors[failed[0]]
        return Line("run folder", FAIL, f"{ranks_text(failed)} cannot write {run_dir}: {what}")
    if blind := [rank for rank, names in enumerate(unseen) if names]:
        detail = f"{ranks_text(blind)} cannot see the other ranks' files in {run_dir}"
        return Line("run folder", FAIL, f"{detail}: put run_dir on storage every node shares")
    if len(facts) == 1:
        return Line("run folder", PASS, f"{run_dir}: writable")
    return Line("run folder", PASS, f"{run_dir}: every rank writes there and sees the others")


def storage_lines(
    config: Config,
    facts: list[dict[str, Any]],
    write_errors: list[str],
    unseen: list[list[str]],
    disk_limit_gib: float | None,
) -> list[Line]:
    """The run folder, disk and host memory lines of the model the facts counted, with
    `disk_limit_gib` GiB a quota allows (None: none)."""
    parameters = facts[0]["parameters"]
    folder = run_folder_line(facts, config.run_dir, write_errors, unseen)
    one = CHECKPOINT_BYTES_PER_PARAMETER * parameters
    limit = None if disk_limit_gib is None else int(disk_limit_gib * GIB)
    disk = disk_line(facts, config.run_dir, config.keep_last, one, 4 * parameters, limit)
    return [folder, disk, host_memory_line(facts, config.num_workers, parameters)]


def disk_line(
    facts: list[dict[str, Any]],
    run_dir: str,
    keep_last: int,
    one_checkpoint: int,
    weights: int,
    limit: int | None,
) -> Line:
    """Free disk at the run folder on every rank for `keep_last` + 2 checkpoints (those kept
    and the ones `last` and `best` name) of `one_checkpoint` bytes and the two exported
    weight files (`weights` bytes each), less what the folder holds already; `limit` (bytes,
    a quota below the free space) caps the free space."""
    need = (keep_last + 2) * one_checkpoint + 2 * weights - facts[0]["run_bytes"]
    free = min(fact["disk_free"] for fact in facts)
    if limit is not None:
        free = min(free, limit)
    detail = f"{size_text(free)} free at {run_dir}, {size_text(max(need, 0))} needed "
    detail += f"({keep_last} + 2 checkpoints of {size_text(one_checkpoint)} and the weights)"
    if need > free:
        return Line("disk", FAIL, f"{detail}: free space, lower keep_last or move run_dir")
    return Line("disk", PASS, detail)


def state_bytes_per_process(parameters: int, world_size: int) -> int:
    """Bytes of training state one of `world_size` processes holds: the replicated part of
    STATE_BYTES_PER_PARAMETER whole, SHARDED_BYTES_PER_PARAMETER divided among them."""
    replicated = STATE_BYTES_PER_PARAMETER - SHARDED_BYTES_PER_PARAMETER
    return parameters * replicated + parameters * SHARDED_BYTES_PER_PARAMETER // world_size


def host_memory_line(facts: list[dict[str, Any]], num_workers: int, parameters: int) -> Line:
    """Each node's available memory against what its processes will add: per process,
    `num_workers` loader workers (each counted at this process's resident size now, an
    upper bound: a worker shares the pages its server imported), and the training state where
    it lives in host memory (a CPU run, or STATE_ON_HOST)."""
    world_size = len(facts)
    state = state_bytes_per_process(parameters, world_size)
    worst = None
    for node, ranks in nodes_of(facts).items():
        workers = sum(num_workers * facts[rank]["rss"] for rank in ranks)
        on_host = facts[ranks[0]]["device"].get("type") == "cpu" or STATE_ON_HOST
        need = workers + (state * len(ranks) if on_host else 0)
        available = facts[ranks[0]]["host_available"]
        if worst is None or available - need < worst[0]:
            worst = (available - need, node, need, available)
    margin, node, need, available = worst
    if not available:
        return Line("host memory", SKIP, "no /proc/meminfo here to read the available memory")
    detail = f"node {node}: {size_text(available)} available, {size_text(need)} needed"
    detail += f" ({num_workers} loader worker(s) a process"
    detail += ", the training state)" if need > num_workers * facts[0]["rss"] else ")"
    if margin < 0:
        return Line("host memory", FAIL, f"{detail}: fewer num_workers, or more memory")
    return Line("host memory", PASS, detail)


def rehearsal_line(results: list[dict[str, Any]]) -> Line:
    """The rehearsal's verdict over every rank's figures (step.rehearse): FAIL names
    a rank whose step, save or load raised, or whose loaded weights did not give back the
    saved loss (after later steps had moved it)."""
    if failed := [rank for rank, result in enumerate(results) if "error" in result]:
        return Line("step", FAIL, f"rank {failed[0]}: {results[failed[0]]['error']}")
    first = results[0]
    detail = f"1 step at micro-batch 1 in {max(r['step_seconds'] for r in results):.2f} s"
    if peak := max(result["peak_bytes"] for result in results):
        detail += f" (peak {size_text(peak)} allocated)"
    detail += f"; checkpoint saved in {first['save_seconds']:.2f} s"
    detail += f", loaded in {first['load_seconds']:.2f} s"
    if wrong := [rank for rank, result in enumerate(results) if not restored(result)]:
        result = results[wrong[0]]
        got = f"loss {result['loaded']:.6g} after the load, {result['saved']:.6g} saved"
        return Line("step", FAIL, f"rank {wrong[0]}: {got}; {detail}")
    return Line("step", PASS, f"{detail}: the saved loss back after the load")


def restored(figures: dict[str, Any]) -> bool:
    """True when the loaded weights give the saved loss, to LOSS_TOLERANCE, and the steps after
    the save had moved it (otherwise the check could not tell a load from none)."""
    scale = max(abs(figures["saved"]), 1.0)
    same = abs(figures["loaded"] - figures["saved"]) <= LOSS_TOLERANCE * scale
    return same and figures["moved"] != figures["saved"]


def bus_bandwidth(size_bytes: int, world_size: int, seconds: float) -> float:
    """All-reduce bus bandwidth in bytes/s: the data size over the time, times 2(n-1)/n, the
    bytes each rank sends in a ring (nccl-tests, doc/PERFORMANCE.md, "AllReduce")."""
    return size_bytes / seconds * 2 * (world_size - 1) / world_size


def size_text(size: float) -> str:
    """Bytes for the table: '512.0 MiB', '3.42 GiB' (binary units)."""
    return f"{size / 2**20:.1f} MiB" if size < GIB else f"{size / GIB:.2f} GiB"


def table(lines: list[Line]) -> str:
    """The lines as a plain-text table, one row per check."""
    width = max(len(line.check) for line in lines)
    rows = [f"{'check'.ljust(width)}  verdict  detail"]
    rows += [f"{line.check.ljust(width)}  {line.verdict.ljust(7)}  {line.detail}" for line in lines]
    return "\n".join(rows)


def verdict_summary(lines: list[Line]) -> tuple[str, int]:
    """The closing sentence and the exit status: 0 when no line failed (warnings pass),
    RANKS_MISSING when ranks did not answer, else CHECK_FAILED."""
    counts = Counter(line.verdict for line in lines)
    failed = [line.check for line in lines if line.verdict == FAIL]
    sentence = f"{counts[PASS]} ok, {counts[WARN]} warning(s), {counts[FAIL]} failed"
    sentence += f", {counts[SKIP]} skipped" if counts[SKIP] else ""
    if not failed:
        return f"preflight: {sentence}: ready to launch", 0
    status = RANKS_MISSING if "ranks" in failed else CHECK_FAILED
    return f"preflight: {sentence} ({', '.join(failed)}): fix these before launching", status
