"""The named variants of the template matrix: the single source for `generated_samples/`, the
matrix tests and CI. Each is a complete set of answers except the project name, which is the
destination folder's name (so `scaffold new NAME --variant NAME` matches its sample)."""

from __future__ import annotations

from typing import Any

CPU = {"hardware": "cpu", "gpu_arch": "none", "gpus_per_node": 1, "num_nodes": 1}
CPU |= {"gpu_memory_gb": 0.0}
COMMON = {"task": "image-classification", "framework": "pytorch", "strategy": "single"}
COMMON |= {"model_size": "100K", "compile": False}

VARIANTS: dict[str, dict[str, Any]] = {
    "cpu-single-fp32": {**COMMON, **CPU, "precision": "fp32"},
    "cpu-single-bf16": {**COMMON, **CPU, "precision": "bf16"},
    "cuda-single-bf16": {
        **COMMON,
        "hardware": "cuda",
        "gpu_arch": "ampere",
        "gpus_per_node": 1,
        "num_nodes": 1,
        "gpu_memory_gb": 80.0,
        "precision": "bf16",
    },
    "cuda-single-fp16": {
        **COMMON,
        "hardware": "cuda",
        "gpu_arch": "volta-turing",
        "gpus_per_node": 1,
        "num_nodes": 1,
        "gpu_memory_gb": 16.0,
        "precision": "fp16",
    },
}
VARIANTS["cuda-ddp-bf16"] = {
    **VARIANTS["cuda-single-bf16"],
    "strategy": "ddp",
    "gpus_per_node": 8,
}
VARIANTS["multinode-ddp-bf16"] = {**VARIANTS["cuda-ddp-bf16"], "num_nodes": 2}
VARIANTS["lm-cpu-single-fp32"] = {**VARIANTS["cpu-single-fp32"], "task": "language-model"}
VARIANTS["lm-ddp-bf16"] = {**VARIANTS["cuda-ddp-bf16"], "task": "language-model"}
DEFAULT_VARIANT = "cpu-single-fp32"
