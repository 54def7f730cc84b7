"""Host memory for training on a CPU: keep the memory a step frees for the next step.

A CPU step allocates its activations and gradients (tens of MB) and frees them all at its end.
glibc's malloc hands such memory back to the kernel: blocks above its mmap threshold are
unmapped, and the top of the heap is trimmed once more than its trim threshold is free. The
next step then faults every page in again, zero-filled by the kernel: in the 100K-parameter
decoder's loop, ~3,400 page faults a step (1.41M minor faults in 393 steps; 89K with the
thresholds below) and a quarter of its steps/s (bench/README.md, "Loop overhead").
Setting both thresholds (mallopt(3): M_MMAP_THRESHOLD at its 32 MiB maximum on 64-bit
systems, M_TRIM_THRESHOLD at 1 GiB) keeps the memory mapped, as PyTorch's CPU performance
guide gets by preloading jemalloc or tcmalloc instead
(pytorch.org/tutorials/recipes/recipes/tuning_guide.html). Setting one of them alone is worse
than neither: it turns off glibc's dynamic threshold.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD = -1  # glibc's <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 2**20  # glibc's largest on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD_BYTES = 2**30
# Settings a user or a launcher made already: an allocator preloaded, or glibc's own tunables.
USER_SETTINGS = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "GLIBC_TUNABLES",
)


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds (see the module docstring) for this process and
    the DataLoader workers it forks. Does nothing, and returns False, off glibc (macOS, musl),
    or where the environment already chose (an LD_PRELOAD allocator, a MALLOC_*_ variable,
    GLIBC_TUNABLES). Returns True when both thresholds were set."""
    if platform.libc_ver()[0] != "glibc" or "malloc" in os.environ.get("LD_PRELOAD", ""):
        return False
    if any(name in os.environ for name in USER_SETTINGS):
        return False
    mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mmap first: setting either one ends the dynamic threshold, and trim alone maps more
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
