"""Started on each rank by test_distributed.py (by hand: `torchrun --nproc-per-node=2
tests/rank_probe.py CONFIG RUN_DIR KEY=VALUE... [--resume]`): train with the key=value settings
given, then save this rank's flattened parameters (the test compares the ranks bitwise) and what
ran, as seen from inside the run: the world size, the wrappers around the model, the share of
each parameter this rank stores, the dtypes the layers computed in, the training samples read
(batch by batch) and, on a resume, the optimizer state it restored.

With `--setup-only` first, it builds the run without training and records how much this
rank's peak resident memory grew while it did (a sharded model is built on the meta device:
each rank should allocate its shards, never the whole model),
and, with `init_from`, which parameters differ from the model folder's."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from lm_zero3_bf16 import train
from lm_zero3_bf16.config import load_config
from lm_zero3_bf16.preflight import command as preflight
from lm_zero3_bf16.preflight import facts as preflight_facts
from lm_zero3_bf16.runtime import Runtime, init_runtime, shutdown_runtime
from lm_zero3_bf16.task import IGNORE_INDEX, micro_batch_weights
from lm_zero3_bf16.train import Trainer

WRAPPER_ATTRIBUTES = ("_forward_module", "_orig_mod", "module")  # where wrappers keep the wrapped


def wrapper_names(module: nn.Module) -> list[str]:
    """Class names from the outermost wrapper in to the model, e.g. [OptimizedModule, Model]."""
    names = []
    while module is not None:
        names.append(type(module).__name__)
        inner = (getattr(module, name, None) for name in WRAPPER_ATTRIBUTES)
        module = next((m for m in inner if isinstance(m, nn.Module)), None)
    return names


def stored_fraction(model: nn.Module) -> float:
    """Elements this rank stores over elements in the whole model (1.0 when replicated)."""
    local = full = 0
    for parameter in model.parameters():
        stored, whole = parameter.numel(), parameter.numel()
        if isinstance(parameter, DTensor):
            stored = parameter.to_local().numel()
        elif hasattr(parameter, "ds_numel"):  # ZeRO-3 keeps this rank's partition aside
            stored, whole = parameter.ds_tensor.numel(), parameter.ds_numel
        local, full = local + stored, full + whole
    return local / full


class RecordedReads:
    """A training split that records the indices of every batch read from it, in order: with
    no loader workers, the batches the run trained on (a replay's skipped batches too)."""

    def __init__(self, dataset):
        self.dataset, self.reads = dataset, []

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: list[int]):
        self.reads.append([int(index) for index in indices])
        return self.dataset[indices]


def record_reads(recorders: list[RecordedReads]):
    """A stand-in for `train.build_datasets` whose training split is a `RecordedReads`,
    appended to `recorders` when the Trainer builds it."""
    build = train.build_datasets

    def build_recorded(config):
        train_set, val_set = build(config)
        recorders.append(RecordedReads(train_set))
        return recorders[-1], val_set

    return build_recorded


def stepping_optimizer(engine) -> torch.optim.Optimizer:
    """The torch optimizer that holds the state the engine steps with: DeepSpeed's, over
    this rank's flat fp32 partitions."""
    return engine.module.optimizer.optimizer


def adam_moments(optimizer: torch.optim.Optimizer) -> dict[str, list]:
    """Per parameter, in the optimizer's order: the `step` its state holds (None: no state)
    and whether its second moment is non-zero over the whole parameter (gathered across ranks
    where it is sharded; a collective then). A restore that left moments empty shows here."""
    steps, filled = [], []
    parameters = [parameter for group in optimizer.param_groups for parameter in group["params"]]
    parameters = parameters or list(optimizer.state)  # ZeRO-3 empties the groups between steps
    for parameter in parameters:
        state = optimizer.state.get(parameter, {})
        moment = state.get("exp_avg_sq")
        if isinstance(moment, DTensor):
            moment = moment.full_tensor()
        steps.append(None if "step" not in state else int(state["step"]))
        filled.append(moment is not None and bool(moment.abs().sum() > 0))
    return {"steps": steps, "filled": filled}


def record_compute_dtypes(model: nn.Module) -> set[str]:
    """Collects the output dtype of every linear and convolution layer as training runs."""
    seen: set[str] = set()
    for module in model.modules():
        if isinstance(module, nn.Linear | nn.Conv2d):
            module.register_forward_hook(lambda _module, _inputs, out: seen.add(str(out.dtype)))
    return seen


def unequal_step_weights(runtime: Runtime) -> list[float]:
    """`micro_batch_weights` of a step of two micro-batches of 8 targets, of which rank r
    counts r + 1 and 8 (the rest is padding): the counts differ across micro-batches and ranks."""
    counted = [runtime.rank + 1, 8]
    targets = [torch.tensor([0] * n + [IGNORE_INDEX] * (8 - n)) for n in counted]
    return [weight.item() for weight in micro_batch_weights(targets, runtime)]


def main(config_path: str, run_dir: str, *overrides: str) -> None:
    resume = "--resume" in overrides
    config = load_config(config_path, ["device=cpu", *(o for o in overrides if o != "--resume")])
    runtime = init_runtime("cpu")
    recorders: list[RecordedReads] = []
    train.build_datasets = record_reads(recorders)
    trainer = Trainer(dataclasses.replace(config, run_dir=run_dir), runtime, resume=resume)
    restored = adam_moments(stepping_optimizer(trainer.engine)) if resume else None
    compute_dtypes = record_compute_dtypes(trainer.engine.model)
    trainer.fit()
    facts = {
        "world_size": dist.get_world_size(),
        "runtime_world_size": runtime.world_size,
        "wrappers": wrapper_names(trainer.engine.module),
        "stored_fraction": stored_fraction(trainer.engine.model),
        "compute_dtypes": sorted(compute_dtypes),
        "reads": recorders[0].reads,
        "restored_moments": restored,
        "unequal_step_weights": unequal_step_weights(runtime),
    }
    with open(f"{run_dir}/ran-rank{runtime.rank}.json", "w") as file:
        json.dump(facts, file)
    # The whole parameters as this rank sees them (gathered where the strategy shards them).
    state = trainer.engine.full_state_dict()
    flat = torch.cat([state[name].flatten() for name, _ in trainer.engine.model.named_parameters()])
    torch.save(flat, f"{run_dir}/params-rank{runtime.rank}.pt")
    del trainer
    shutdown_runtime(runtime)


def resident_bytes(field: str) -> int:
    """`VmRSS` (resident now) or `VmHWM` (peak resident) of this process, in bytes (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no {field} in /proc/self/status")


def setup_memory(config_path: str, run_dir: str, *overrides: str) -> None:
    """Build the run (model, engine, optimizer) and record this rank's peak resident-memory
    growth over it and the model's whole fp32 size, in bytes."""
    config = load_config(config_path, ["device=cpu", *overrides])
    runtime = init_runtime("cpu")
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident size starts again here
    before = resident_bytes("VmRSS")
    trainer = Trainer(dataclasses.replace(config, run_dir=run_dir), runtime)
    facts = {
        "growth": resident_bytes("VmHWM") - before,
        "whole_fp32": 4 * sum(p.numel() for p in trainer.engine.model.parameters()),
        "stored_fraction": stored_fraction(trainer.engine.model),
    }
    if config.init_from:  # the gathered weights are the folder's, each read by init_tensor
        state, model = trainer.engine.full_state_dict(), trainer.engine.model
        facts["largest_fp32"] = 4 * max(tensor.numel() for tensor in state.values())
        facts["mismatched"] = []
        for name, _ in model.named_parameters():
            expected = torch.empty(state[name].shape)  # whole: a sharded one holds a part
            model.init_tensor(name, expected)
            if not torch.equal(state[name].float(), expected):
                facts["mismatched"].append(name)
    with open(f"{run_dir}/setup-rank{runtime.rank}.json", "w") as file:
        json.dump(facts, file)
    del trainer
    shutdown_runtime(runtime)


def run_from_command_line() -> None:
    """`rank_probe.py [--setup-only] CONFIG RUN_DIR KEY=VALUE...`, the arguments in sys.argv."""
    if sys.argv[1] == "--setup-only":
        setup_memory(*sys.argv[2:])
    else:
        main(*sys.argv[1:])


def preflight_of_a_copy() -> None:
    """The preflight (`preflight.main`) on a rank whose package source is another copy, the
    folder given first in sys.argv: the code the preflight fingerprints."""
    preflight_facts.PACKAGE_DIR = Path(sys.argv.pop(1))
    preflight.main()


if __name__ == "__main__":
    run_from_command_line()
