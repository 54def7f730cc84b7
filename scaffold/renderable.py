"""What this template version renders: the one table that the questionnaire (`answers.py`), the
planner, the test of `copier.yml`'s choices and the variant matrix's coverage test all read.

A value joins a tuple here when a variant that uses it renders, runs and passes its own suite
(`variants.VARIANTS` must then name it: a test checks every value below appears in a variant,
`gpu_arch` aside: hopper renders the files ampere does).
"""

from __future__ import annotations

# The answer keys with a fixed set of values. `auto` is the planner's to resolve; copier.yml
# lists the rest (a test keeps them equal).
RENDERS: dict[str, tuple[str, ...]] = {
    "task": ("image-classification", "language-model"),
    "hardware": ("cpu", "cuda", "mps"),
    "gpu_arch": ("hopper", "ampere", "volta-turing", "none"),
    "model_family": ("auto", "gpt2", "llama", "cnn", "timm"),
    "finetune": ("auto", "full", "lora"),
    "framework": ("pytorch", "fabric", "accelerate"),
    "precision": ("auto", "fp32", "bf16", "fp16"),
    "strategy": ("auto", "single", "ddp", "fsdp2", "zero1", "zero2", "zero3", "zero3-offload"),
}

# What each framework renders, by answer key, where it is less than `RENDERS`. Every variant is
# tested by running it on CPU, and these framework paths refuse CPUs or fall back there without
# a word: Fabric's DeepSpeedStrategy refuses CPUs; on a CPU, Accelerate ignores its FSDP plugin
# (plain DDP instead), DeepSpeed (with cpu=True) and fp16 (it trains in fp32). Their MPS
# accelerators are code of their own that no CPU runs.
FRAMEWORK_RENDERS: dict[str, dict[str, tuple[str, ...]]] = {
    "fabric": {"hardware": ("cpu", "cuda"), "strategy": ("single", "ddp", "fsdp2")},
    "accelerate": {
        "hardware": ("cpu", "cuda"),
        "strategy": ("single", "ddp"),
        "precision": ("fp32", "bf16"),
    },
}


def framework_renders(framework: str, key: str, value: str) -> bool:
    """True if `framework` renders `value` for `key` (`auto` always: the planner checks what
    it picks)."""
    rendered = FRAMEWORK_RENDERS.get(framework, {}).get(key)
    return value == "auto" or rendered is None or value in rendered
