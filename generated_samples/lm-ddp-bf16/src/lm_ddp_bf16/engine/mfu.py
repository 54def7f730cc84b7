"""Model FLOPs utilisation: the model FLOP/s the task counts (task.py's `throughput`) over the
GPU's peak (PaLM, Chowdhery et al. 2022, appendix B). The peaks live here, in the machinery, so
that a new GPU is a template fix `scaffold update` brings, not an edit of the task's file."""

from __future__ import annotations

import torch

# Dense 16-bit tensor-core peaks (FLOP/s) from NVIDIA's data sheets (half their with-sparsity
# figures), matched in this order against the device name: the H100 PCIe and NVL boards run
# lower clocks than the SXM module, which reports itself as plain "H100 80GB HBM3".
PEAK_FLOPS = {"H200": 989e12, "H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12}
PEAK_FLOPS |= {"A100": 312e12, "L40S": 362e12, "L4": 121e12, "A10G": 70e12, "A10": 125e12}
PEAK_FLOPS |= {"V100": 125e12, "T4": 65e12, "RTX 4090": 165e12}


def model_flops_utilization(flops_per_second: float, device: str) -> float | None:
    """`flops_per_second` over the peak of `device` ("cuda:N", as a run summary names it): a
    fraction, None on a CPU or MPS or on a GPU missing from `PEAK_FLOPS`."""
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(torch.device(device))
    peak = next((value for key, value in PEAK_FLOPS.items() if key in name), None)
    return None if peak is None else flops_per_second / peak
