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

LoRA (`adapters` > 0: low-rank adapters trained, every other weight frozen) keeps the frozen
weights as the engines keep every parameter (fp32) and the adapters beside them, and gradients
and optimizer state for the adapters alone; activations are those of the full model (backward
still runs through every frozen layer to reach the adapters below it).

On top: the activations one micro-batch saves for backward (`scaffold.shapes`), with or without
activation checkpointing, and the temporaries: autocast's low-precision weight copies, FSDP2's
all-gathered units and unsharded gradients, ZeRO-3's gathered parameters, DeepSpeed's reduce
bucket (`reduce_bucket_size`, 5e8 elements by default, allocated whole; deepspeed.ai/docs/
config-json), backward's gradient temporaries. `estimate` walks one step in three phases
(`persistent_state`, then `forward_peak`, `backward_peak` unit by unit, and the optimizer step)
and keeps the peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scaffold.shapes import Activations, ModelShape

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


@dataclass(frozen=True)
class StepShape:
    """What the three phases of a step share: the strategy's `layout`, the model `shape`, its
    saved activations `acts` for one micro-batch, bytes per element of compute (`compute`) and
    of autocast's weight casts (`cast`, 0 without autocast), the processes sharded state is
    divided over (`divisor`), and whether activation checkpointing is on."""

    layout: Layout
    shape: ModelShape
    acts: Activations
    compute: int
    cast: int
    divisor: int
    checkpointing: bool
    trained: float = 1.0  # the share of the parameters that train and so have gradients

    def state(self, params: int, part: str, bytes_each: int) -> int:
        """Device bytes of `part` (weights, gradients, optimizer) of `params` parameters at
        `bytes_each`: divided over the processes where the layout shards it, none offloaded."""
        shards = self.divisor if part in self.layout.sharded else 1
        return 0 if self.layout.offload else bytes_each * math.ceil(params / shards)

    @property
    def all_casts(self) -> int:
        """autocast's weight copies of every unit and the root, alive at the end of forward."""
        unit_casts, root_cast = self.shape.matmul_params
        return self.cast * (sum(unit_casts) + root_cast)

    @property
    def gathered_units(self) -> int:
        """The all-gathered units a gathering strategy holds at once: this one and the next."""
        gather = self.layout.gather_bytes or self.compute
        return gather * 2 * max(self.shape.unit_params) if self.layout.gathers else 0


@dataclass(frozen=True)
class PersistentState:
    """What stays allocated through the whole step, bytes per device: the model state, the
    DeepSpeed reduce bucket and the gathered root (`total` sums what is alive)."""

    weights: int
    gradients: int
    optimizer: int
    bucket: int
    gathered_root: int
    total: int


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
    adapters: int = 0,
) -> Estimate:
    """Bytes per device of a step of `shape` trained with `strategy` over `world_size`
    processes in `precision` ('fp32', 'bf16' or 'fp16'), `micro_batch` samples per micro-step:
    the persistent state, then the peaks of forward, of backward and of the optimizer step.
    `adapters` > 0: LoRA's parameters, the only ones that train (module docstring).

    Raises:
        KeyError: an unknown strategy.
    """
    layout = LAYOUTS[strategy]
    compute = 4 if precision == "fp32" else 2
    autocast = layout.autocast and precision != "fp32"
    residual = 4 if precision == "fp32" or layout.autocast else compute
    step = StepShape(
        layout=layout,
        shape=shape,
        acts=shape.activations(micro_batch, residual, compute, dropout),
        compute=compute,
        cast=compute if autocast else 0,
        divisor=world_size if layout.sharded else 1,
        checkpointing=checkpointing,
        trained=adapters / shape.params if adapters else 1.0,
    )
    state = persistent_state(step, adapters)
    backward, largest_temporary = backward_peak(step, state)
    optimizer_step = state.total + (0 if layout.persistent_gradients else state.gradients)
    host = 0
    if layout.offload:  # each node keeps its processes' partitions of all three
        trained = adapters or shape.params
        per_process = WEIGHT_BYTES * math.ceil((shape.params + adapters) / step.divisor)
        per_process += (GRADIENT_BYTES + ADAMW_BYTES) * math.ceil(trained / step.divisor)
        host = per_process * processes_per_node
    return Estimate(
        weights=state.weights,
        gradients=state.gradients,
        optimizer=state.optimizer,
        activations=step.acts.saved(checkpointing),
        buffers=largest_temporary + state.bucket + state.gathered_root,
        peak=max(forward_peak(step, state), backward, optimizer_step),
        host=host,
    )


def persistent_state(step: StepShape, adapters: int = 0) -> PersistentState:
    """The model state a device keeps (fp32 weights, gradients, AdamW moments and DeepSpeed's
    partition, each divided where the layout shards it; with LoRA `adapters`, gradients and
    optimizer state of those alone), DeepSpeed's reduce bucket and the gathered root;
    gradients count as alive throughout only where they persist (DDP)."""
    layout, params = step.layout, step.shape.params
    trained = adapters or params
    weights = step.state(params + adapters, "weights", WEIGHT_BYTES)
    gradients = step.state(trained, "gradients", GRADIENT_BYTES)
    optimizer = step.state(trained, "optimizer", ADAMW_BYTES)
    if layout.deepspeed:
        optimizer += step.state(trained, "optimizer", DEEPSPEED_PARTITION_BYTES)
    bucket = 4 * DEEPSPEED_REDUCE_BUCKET if layout.deepspeed else 0
    gather = layout.gather_bytes or step.compute
    gathered_root = gather * step.shape.root_params if layout.gathers else 0
    total = weights + optimizer + bucket + gathered_root
    total += gradients if layout.persistent_gradients else 0
    return PersistentState(weights, gradients, optimizer, bucket, gathered_root, total)


def forward_peak(step: StepShape, state: PersistentState) -> int:
    """Bytes allocated at the end of forward: the persistent state, the saved activations,
    every weight cast and the gathered units."""
    saved = step.acts.saved(step.checkpointing)
    return state.total + saved + step.all_casts + step.gathered_units


def backward_peak(step: StepShape, state: PersistentState) -> tuple[int, int]:
    """The peak of backward, walked unit by unit from the loss and head, and the largest sum
    of temporaries met on the way (forward's casts and gathered units included).

    Checkpointed units dropped their weight casts at autocast's exit and recompute their
    forward here; gradients that do not persist grow as each unit's activations are freed.
    """
    layout, acts, cast = step.layout, step.acts, step.cast
    unit_casts, root_cast = step.shape.matmul_params
    units = step.shape.unit_params
    live = state.total + acts.saved(step.checkpointing)
    live += cast * root_cast if step.checkpointing else step.all_casts
    if not layout.persistent_gradients:
        root = math.ceil(step.shape.root_params * step.trained)
        live += step.state(root, "gradients", GRADIENT_BYTES)
    peak = live + acts.transient
    live -= acts.outside
    largest_temporary = max(step.all_casts + step.gathered_units, acts.transient)
    for index in reversed(range(len(units))):
        if step.checkpointing:  # recompute the unit's forward: its activations and casts again
            live += acts.per_unit[index] - acts.unit_input[index] + cast * unit_casts[index]
        if not layout.persistent_gradients:
            live += step.state(math.ceil(units[index] * step.trained), "gradients", GRADIENT_BYTES)
        gathered = (step.compute + GRADIENT_BYTES * step.trained) * units[index]
        unsharded = math.ceil(gathered) if layout.gathers else 0
        temporaries = step.gathered_units + unsharded + acts.transient
        peak = max(peak, live + temporaries)
        largest_temporary = max(largest_temporary, temporaries)
        live -= acts.per_unit[index] + cast * unit_casts[index]
    return peak, largest_temporary


def gib(count: int) -> str:
    """Bytes as GiB with one decimal (two below 10 GiB, three below 0.1 GiB), e.g. '68.0'."""
    value = count / GIB
    return f"{value:.3f}" if value < 0.1 else f"{value:.2f}" if value < 10 else f"{value:.1f}"
