"""The memory model: bytes per device of a training run of the rendered model, by component.

Model state per parameter, as the rendered engines keep it (fp32 parameters; bf16 and fp16 are
compute dtypes, by autocast or by FSDP's `MixedPrecisionPolicy`): fp32 weights 4, fp32
gradients 4, AdamW's two fp32 moments 8, 16 bytes in all. This is the ZeRO paper's 2 + 2 + 12
for mixed-precision Adam (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models", §3.1) with the fp32 master copy standing in for the weights;
DeepSpeed's ZeRO optimizer keeps an fp32 partition of its own beside fp32 weights, so there the
optimizer holds the paper's K = 12. Each strategy divides some of it over the N processes
(§5: ZeRO-1 the optimizer state, ZeRO-2 also gradients, ZeRO-3 and FSDP2 also weights), and the
offload strategy keeps the partitions in host memory.

On top: the activations one micro-batch saves for backward (`scaffold.shapes`), with or without
activation checkpointing, and the temporaries: autocast's low-precision weight copies, FSDP2's
all-gathered units and unsharded gradients, ZeRO-3's gathered parameters, DeepSpeed's reduce
bucket (`reduce_bucket_size`, 5e8 elements by default, allocated whole; deepspeed.ai/docs/
config-json), backward's gradient temporaries. `estimate` walks one step (forward, then backward
unit by unit, then the optimizer step) and keeps the peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scaffold.shapes import ModelShape

GIB = 2**30
WEIGHT_BYTES = 4  # fp32 parameters (the master copy under mixed precision)
GRADIENT_BYTES = 4  # fp32 gradients
ADAMW_BYTES = 8  # exp_avg and exp_avg_sq, fp32
DEEPSPEED_PARTITION_BYTES = 4  # ZeRO's fp32 partition of the parameters, kept beside them
DEEPSPEED_REDUCE_BUCKET = 500_000_000  # elements: DeepSpeed's default `reduce_bucket_size`


@dataclass(frozen=True)
class Layout:
    """Where a strategy keeps the model state and what it adds.

    `sharded`: of weights, gradients and optimizer state, which are divided over the processes;
    `offload`: the partitions live in host memory; `persistent_gradients`: gradients stay
    allocated between steps (DDP's buckets); `gathers`: units are all-gathered for compute, in
    `gather_bytes` per element (0: the compute dtype); `autocast`: precision comes from autocast
    (else from the parameters' own dtype); `deepspeed`: DeepSpeed's partition and reduce bucket.
    """

    sharded: frozenset[str] = frozenset()
    offload: bool = False
    persistent_gradients: bool = False
    gathers: bool = False
    gather_bytes: int = 0
    autocast: bool = True
    deepspeed: bool = False


_ALL = frozenset({"weights", "gradients", "optimizer"})
LAYOUTS: dict[str, Layout] = {
    "single": Layout(),
    "ddp": Layout(persistent_gradients=True),  # gradient_as_bucket_view: grads are the buckets
    "zero1": Layout(sharded=frozenset({"optimizer"}), deepspeed=True),
    "zero2": Layout(sharded=frozenset({"optimizer", "gradients"}), deepspeed=True),
    "fsdp2": Layout(sharded=_ALL, gathers=True, autocast=False),
    "zero3": Layout(sharded=_ALL, gathers=True, gather_bytes=4, deepspeed=True),
    "zero3-offload": Layout(
        sharded=_ALL, offload=True, gathers=True, gather_bytes=4, deepspeed=True
    ),
}
COMPONENTS = ("weights", "gradients", "optimizer", "activations", "buffers")


@dataclass(frozen=True)
class Estimate:
    """Bytes per device of one training step, and bytes of host memory per node.

    `weights`, `gradients` and `optimizer` are the model state a device keeps; `activations`
    what one micro-batch saves for backward; `buffers` the largest sum of temporaries at any
    point of the step; `peak` the most allocated at once, from a walk through the step (less
    than the sum: gradients grow as activations are freed); `host` what offload keeps in each
    node's memory.
    """

    weights: int
    gradients: int
    optimizer: int
    activations: int
    buffers: int
    peak: int
    host: int = 0

    def rows(self) -> list[tuple[str, int]]:
        """(component, bytes) in display order, the peak last."""
        return [(name, getattr(self, name)) for name in (*COMPONENTS, "peak")]


def estimate(
    shape: ModelShape,
    *,
    strategy: str,
    precision: str,
    world_size: int,
    micro_batch: int,
    checkpointing: bool,
    dropout: float = 0.0,
    processes_per_node: int = 1,
) -> Estimate:
    """Bytes per device of a step of `shape` trained with `strategy` over `world_size`
    processes in `precision` ('fp32', 'bf16' or 'fp16'), `micro_batch` samples per micro-step.

    Raises:
        KeyError: an unknown strategy.
    """
    layout = LAYOUTS[strategy]
    compute = 4 if precision == "fp32" else 2
    autocast = layout.autocast and precision != "fp32"
    residual = 4 if precision == "fp32" or layout.autocast else compute
    divisor = world_size if layout.sharded else 1

    def state(params: int, part: str, bytes_each: int) -> int:
        shards = divisor if part in layout.sharded else 1
        return 0 if layout.offload else bytes_each * math.ceil(params / shards)

    params = shape.params
    weights = state(params, "weights", WEIGHT_BYTES)
    gradients = state(params, "gradients", GRADIENT_BYTES)
    optimizer = state(params, "optimizer", ADAMW_BYTES)
    if layout.deepspeed:
        optimizer += state(params, "optimizer", DEEPSPEED_PARTITION_BYTES)
    acts = shape.activations(micro_batch, residual, compute, dropout)
    unit_casts, root_cast = shape.matmul_params
    cast = compute if autocast else 0
    units = shape.unit_params

    gather = layout.gather_bytes or compute
    gathered_root = gather * shape.root_params if layout.gathers else 0
    gathered_units = gather * 2 * max(units) if layout.gathers else 0  # this one, the next
    bucket = 4 * DEEPSPEED_REDUCE_BUCKET if layout.deepspeed else 0
    persistent = weights + optimizer + bucket + gathered_root
    persistent += gradients if layout.persistent_gradients else 0

    saved = acts.saved(checkpointing)
    all_casts = cast * (sum(unit_casts) + root_cast)
    peak = persistent + saved + all_casts + gathered_units  # the end of forward
    # Backward: checkpointed units dropped their weight casts at autocast's exit; the loss and
    # head go first, then their activations are freed.
    live = persistent + saved + (cast * root_cast if checkpointing else all_casts)
    if not layout.persistent_gradients:
        live += state(shape.root_params, "gradients", GRADIENT_BYTES)
    peak = max(peak, live + acts.transient)
    live -= acts.outside
    largest_temporary = max(all_casts + gathered_units, acts.transient)
    for index in reversed(range(len(units))):
        if checkpointing:  # recompute the unit's forward: its activations and casts again
            live += acts.per_unit[index] - acts.unit_input[index] + cast * unit_casts[index]
        if not layout.persistent_gradients:
            live += state(units[index], "gradients", GRADIENT_BYTES)
        unsharded = (compute + GRADIENT_BYTES) * units[index] if layout.gathers else 0
        temporaries = gathered_units + unsharded + acts.transient
        peak = max(peak, live + temporaries)
        largest_temporary = max(largest_temporary, temporaries)
        live -= acts.per_unit[index] + cast * unit_casts[index]
    step = persistent + (0 if layout.persistent_gradients else gradients)
    peak = max(peak, step)
    host = 0
    if layout.offload:  # each node keeps its processes' partitions of all three
        per_process = (WEIGHT_BYTES + GRADIENT_BYTES + ADAMW_BYTES) * math.ceil(params / divisor)
        host = per_process * processes_per_node
    return Estimate(
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        activations=saved,
        buffers=largest_temporary + bucket + gathered_root,
        peak=peak,
        host=host,
    )


def gib(count: int) -> str:
    """Bytes as GiB with one decimal (two below 10 GiB, three below 0.1 GiB), e.g. '68.0'."""
    value = count / GIB
    return f"{value:.3f}" if value < 0.1 else f"{value:.2f}" if value < 10 else f"{value:.1f}"
