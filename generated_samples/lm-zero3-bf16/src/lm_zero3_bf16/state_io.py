"""Durable writes and trusted loads: what checkpoints and exported weights build on.

A file is written to a temporary sibling, fsynced, then renamed over its name with
`os.replace`, so a job killed mid-write leaves the previous file intact. Every saved value is a
tensor, number, string, list or dict, so `torch.load(path, weights_only=True)` loads it: no
pickled code runs on load.

torch is imported where a tensor is saved or loaded, not with this module: a process that only
writes text with `atomic_write_text` (a data preparation's worker) runs without it.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def host_copy(value: Any) -> Any:
    """`value` (dicts, lists and tuples of tensors and plain values, as state dicts are) with
    every tensor copied into host memory of its own: a snapshot training may go on changing
    the original of. A CPU tensor is copied too (`.cpu()` would return the tensor itself)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: host_copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(host_copy(item) for item in value)
    return value


def atomic_save(obj: Any, path: Path) -> None:
    """`torch.save` to a temporary sibling, fsync it, rename it over `path`, fsync the folder."""
    import torch

    atomic_write(path, lambda tmp: torch.save(obj, tmp))


def atomic_write_text(text: str, path: Path) -> None:
    """Replace `path` with `text` (UTF-8) the same way as `atomic_save`."""
    atomic_write(path, lambda tmp: tmp.write_bytes(text.encode()))


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Call `write(tmp)` to fill a temporary sibling of `path`, then fsync it and rename it over
    `path` (the way `atomic_save` does) for writers that take a file name (safetensors,
    matplotlib)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        descriptor = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Make a rename or new entry in `directory` survive a power loss."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def load_trusted(path: Path, keys: tuple[str, ...]) -> dict[str, Any] | None:
    """`path` loaded onto the CPU with `weights_only=True` if it loads and holds every key of
    `keys`, else None (a truncated, foreign or missing file).

    Always the CPU: RNG states must come back as CPU byte tensors (a CUDA copy is refused on
    resume), and `load_state_dict` copies weights and moments onto their parameters' devices.
    """
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # a torn write or a foreign file: the caller tries the next candidate
        return None
    return state if isinstance(state, dict) and all(key in state for key in keys) else None


FULL_DISK = (errno.ENOSPC, errno.EDQUOT)  # no space left on the device, or the user's quota


@contextlib.contextmanager
def full_disk_exits() -> Iterator[None]:
    """Raise an OSError of a full disk (or quota) from inside as `SystemExit("error: ...")`:
    one line, where the writer's message says what filled up and what to free (a checkpoint's
    does: `CheckpointManager.save`), not a traceback."""
    try:
        yield
    except OSError as error:
        if error.errno not in FULL_DISK:
            raise
        raise SystemExit(f"error: {error.strerror or error}") from None
