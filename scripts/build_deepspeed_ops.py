"""Compile DeepSpeed's CPU ops once, before the tests: the shared-memory collectives every
ZeRO run on CPU loads (~40 s to build) and CPU Adam for ZeRO-Offload (~55 s). They land in
TORCH_EXTENSIONS_DIR, where every later process finds them; without this, the first test
processes to need them would all wait on one build inside their own time limits."""

from __future__ import annotations

import time

from deepspeed.accelerator import get_accelerator

if __name__ == "__main__":
    accelerator = get_accelerator()
    for name in ("ShareMemCommBuilder", "CPUAdamBuilder"):
        start = time.perf_counter()
        accelerator.create_op_builder(name).load(verbose=False)
        print(f"deepspeed op {name}: ready in {time.perf_counter() - start:.1f} s")
