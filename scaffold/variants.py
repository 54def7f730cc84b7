"""The named variants of the template matrix: the single source for `generated_samples/`, the
matrix tests and CI. Each is a complete set of answers except the project name, which is the
destination folder's name (so `scaffold new NAME --variant NAME` matches its sample)."""

from __future__ import annotations

from typing import Any

CPU = {"hardware": "cpu", "gpu_arch": "none", "gpus_per_node": 1, "num_nodes": 1}
CPU |= {"gpu_memory_gb": 0.0, "host_memory_gb": 16.0}
MPS = {**CPU, "hardware": "mps"}
COMMON = {"task": "image-classification", "framework": "pytorch", "strategy": "single"}
COMMON |= {"model_size": "100K", "model_family": "auto", "init_from": "", "compile": False}
COMMON |= {"backbone": "", "image_size": 224}
COMMON |= {"finetune": "auto"}

CUDA_AMPERE = {"hardware": "cuda", "gpu_arch": "ampere", "gpus_per_node": 1, "num_nodes": 1}
CUDA_AMPERE |= {"gpu_memory_gb": 80.0, "host_memory_gb": 512.0}
CUDA_TURING = {**CUDA_AMPERE, "gpu_arch": "volta-turing", "gpu_memory_gb": 16.0}

# Most-picked combinations first; every renderable value of every key appears at least once
# (a test checks it). Values that become renderable later join this list when they arrive.
VARIANTS: dict[str, dict[str, Any]] = {
    "cpu-single-fp32": {**COMMON, **CPU, "precision": "fp32"},
    "cuda-single-bf16": {**COMMON, **CUDA_AMPERE, "precision": "bf16"},
    "cuda-single-fp16": {**COMMON, **CUDA_TURING, "precision": "fp16"},
    "cuda-ddp-bf16": {
        **COMMON,
        **CUDA_AMPERE,
        "strategy": "ddp",
        "gpus_per_node": 8,
        "precision": "bf16",
    },
    "multinode-ddp-bf16": {
        **COMMON,
        **CUDA_AMPERE,
        "strategy": "ddp",
        "gpus_per_node": 8,
        "num_nodes": 2,
        "precision": "bf16",
    },
    "cuda-ddp-fp16": {
        **COMMON,
        **CUDA_TURING,
        "strategy": "ddp",
        "gpus_per_node": 4,
        "precision": "fp16",
    },
    "cpu-single-bf16": {**COMMON, **CPU, "precision": "bf16"},
    "cpu-ddp-fp32": {**COMMON, **CPU, "strategy": "ddp", "precision": "fp32"},
    "lm-cpu-single-fp32": {**COMMON, **CPU, "task": "language-model", "precision": "fp32"},
    "mps-single-fp32": {**COMMON, **MPS, "precision": "fp32"},
    "lm-ddp-bf16": {
        **COMMON,
        **CUDA_AMPERE,
        "task": "language-model",
        "strategy": "ddp",
        "gpus_per_node": 8,
        "precision": "bf16",
        "model_size": "1M",
    },
    "cuda-zero1-bf16": {
        **COMMON,
        **CUDA_AMPERE,
        "strategy": "zero1",
        "gpus_per_node": 8,
        "precision": "bf16",
    },
    "cuda-zero2-bf16": {
        **COMMON,
        **CUDA_AMPERE,
        "strategy": "zero2",
        "gpus_per_node": 8,
        "precision": "bf16",
    },
    "cuda-zero3-offload-fp32": {
        **COMMON,
        **CUDA_AMPERE,
        "strategy": "zero3-offload",
        "gpus_per_node": 8,
        "precision": "fp32",
    },
    "lm-zero3-bf16": {
        **COMMON,
        **CUDA_AMPERE,
        "task": "language-model",
        "strategy": "zero3",
        "gpus_per_node": 8,
        "precision": "bf16",
        "model_size": "1M",
        "model_family": "llama",  # the Llama-style decoder, sharded
    },
    "lm-fsdp2-bf16": {
        **COMMON,
        **CUDA_AMPERE,
        "task": "language-model",
        "strategy": "fsdp2",
        "gpus_per_node": 8,
        "precision": "bf16",
        "model_size": "1M",
        "model_family": "llama",  # the Llama-style decoder, sharded
    },
    # The frameworks: each strategy it renders, tested on CPU in fp32 or bf16 (bf16 and fp16
    # on CPU cost 5-100x fp32 per matmul here; fp16's mapping is checked at render time).
    "fabric-cpu-single-bf16": {**COMMON, **CPU, "framework": "fabric", "precision": "bf16"},
    "fabric-cpu-ddp-fp32": {
        **COMMON,
        **CPU,
        "framework": "fabric",
        "strategy": "ddp",
        "precision": "fp32",
    },
    "fabric-lm-fsdp2-fp32": {
        **COMMON,
        **CUDA_AMPERE,
        "task": "language-model",
        "framework": "fabric",
        "strategy": "fsdp2",
        "gpus_per_node": 8,
        "precision": "fp32",
        "model_size": "1M",
    },
    "accelerate-cpu-single-fp32": {**COMMON, **CPU, "framework": "accelerate", "precision": "fp32"},
    "accelerate-cuda-ddp-bf16": {
        **COMMON,
        **CUDA_AMPERE,
        "framework": "accelerate",
        "strategy": "ddp",
        "gpus_per_node": 4,
        "precision": "bf16",
    },
}
DEFAULT_VARIANT = "cpu-single-fp32"
