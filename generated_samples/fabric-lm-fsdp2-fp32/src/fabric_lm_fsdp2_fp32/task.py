"""The task: next-token prediction. The loss and validation metrics of a batch of logits, and
the throughput line of the run summary (tokens/s and model FLOPs utilisation)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .data import NUM_CLASSES

EXPECTED_INITIAL_LOSS = math.log(NUM_CLASSES)  # a uniform prediction's cross-entropy

# Dense 16-bit tensor-core peaks (FLOP/s) from NVIDIA's data sheets (half their with-sparsity
# figures), matched in this order against the device name: the H100 PCIe and NVL boards run
# lower clocks than the SXM module, which reports itself as plain "H100 80GB HBM3".
PEAK_FLOPS = {"H200": 989e12, "H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12}
PEAK_FLOPS |= {"A100": 312e12, "L40S": 362e12, "L4": 121e12, "A10G": 70e12, "A10": 125e12}
PEAK_FLOPS |= {"V100": 125e12, "T4": 65e12, "RTX 4090": 165e12}


def loss_fn(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy over every position: logits `[B, T, V]`, int64 targets `[B, T]`
    (a 0-dim tensor, computed in fp32 whatever the logits' dtype)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def eval_sums(logits: Tensor, targets: Tensor) -> Tensor:
    """Per-batch sums `[loss_sum, correct, count]` over tokens (float64), to be summed over ranks.

    Accuracy is next-token accuracy. Sums, not means, so batches of any size weigh by tokens.
    """
    flat_logits, flat_targets = logits.float().flatten(0, 1), targets.flatten()
    loss_sum = F.cross_entropy(flat_logits, flat_targets, reduction="sum")
    correct = (flat_logits.argmax(dim=-1) == flat_targets).sum()
    count = torch.tensor(float(flat_targets.numel()), device=logits.device)
    return torch.stack([loss_sum.double(), correct.double(), count.double()])


def model_flops_utilization(flops_per_second: float, device: str) -> float | None:
    """Achieved model FLOP/s over the GPU's peak (PaLM, Chowdhery et al. 2022, appendix B).

    None on CPU or on a GPU missing from `PEAK_FLOPS`.
    """
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(torch.device(device))
    peak = next((value for key, value in PEAK_FLOPS.items() if key in name), None)
    return None if peak is None else flops_per_second / peak


def throughput(summary: dict[str, Any]) -> dict[str, float | None]:
    """The summary's rates per second of training time (validation excluded): sequences,
    tokens, model FLOPs (6 N per token for forward + backward, N parameters; Kaplan et al.
    2020, "Scaling Laws for Neural Language Models", §2.1) and their share of the GPU's peak."""
    samples_per_second = summary["samples"] / max(summary["train_seconds"], 1e-9)
    tokens_per_second = samples_per_second * summary["config"]["block_size"]
    flops_per_second = 6 * summary["parameters"] * tokens_per_second
    return {
        "samples_per_second": samples_per_second,
        "tokens_per_second": tokens_per_second,
        "model_flops_per_second": flops_per_second,
        "mfu": model_flops_utilization(flops_per_second, summary["device"]),
    }


def describe_throughput(summary: dict[str, Any]) -> str:
    """The rates of `throughput` as the summary's Throughput line shows them."""
    mfu = summary["mfu"]
    mfu_text = "n/a (no GPU peak known)" if mfu is None else f"{mfu:.1%}"
    return (
        f"{summary['samples_per_second']:,.0f} sequences/s, "
        f"{summary['tokens_per_second']:,.0f} tokens/s, MFU {mfu_text}"
    )
