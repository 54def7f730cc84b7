"""Durable writes and trusted loads: what checkpoints and exported weights build on.

A file is written to a temporary sibling, fsynced, then renamed over its name with
`os.replace`, so a job killed mid-write leaves the previous file intact. Every saved value is a
tensor, number, string, list or dict, so `torch.load(path, weights_only=True)` loads it: no
pickled code runs on load.

torch is imported where a tensor is saved or loaded, not with this module: a process that only
writes text with `atomic_write_text` (a data preparation's worker) runs without it. A prepared
data folder is written whole in a scratch folder beside it and renamed into place
(`scratch_folder`, `replace_folder`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
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


# --- a prepared data folder, replaced whole ---


@contextlib.contextmanager
def scratch_folder(out: Path) -> Iterator[Path]:
    """A hidden temporary folder beside `out` (`.<name>.partial-*`), locked while this process
    uses it (`remove_stale_scratch` tells it from one an interrupted prepare left, and removes
    those first) and removed on the way out, whatever happens. Setting it up holds a lock on
    the parent folder: every rank of a first run may prepare the same data at once."""
    with contextlib.ExitStack() as stack:
        with locked(out.parent, wait=True):
            remove_stale_scratch(out)
            scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
            umask = os.umask(0)
            os.umask(umask)
            scratch.chmod(0o777 & ~umask)  # mkdtemp's 0700 would hide the data from others
            stack.enter_context(locked(scratch, wait=True))
        try:
            yield scratch
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def remove_stale_scratch(out: Path) -> list[Path]:
    """Remove the temporary folders of `out` that no live prepare holds (what a killed or
    interrupted one left); return them. One whose lock cannot be tested (a file system
    without locks) is kept."""
    removed = []
    for folder in out.parent.glob(f".{out.name}.partial-*"):
        with locked(folder, wait=False) as free:
            if free:
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    return removed


@contextlib.contextmanager
def locked(folder: Path, wait: bool) -> Iterator[bool]:
    """Hold an exclusive `flock` on `folder` inside; yields whether it is held: False where
    another process holds it (and not `wait`), where the folder is gone, or where its file
    system cannot lock."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        yield False
        return
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        held = True
    except OSError:  # BlockingIOError: another holds it; others: no locks here
        held = False
    try:
        yield held
    finally:
        os.close(descriptor)  # drops the lock


def check_replaceable(out: Path, marker: str, sources: list[Path]) -> None:
    """Refuse to prepare into `out` where `replace_folder` would destroy what is not prepared
    data: a file, a folder that is not empty and holds no `marker` (a prepared folder's file
    written last), or a folder that is, holds or lies inside one of `sources`.

    Raises:
        ValueError: naming the folder and what to pass instead.
    """
    out = out.resolve()
    for source in sources:
        source = source.resolve()
        if source == out or out in source.parents or source in out.parents:
            raise ValueError(
                f"--out {out} would hold or replace the sources ({source}); prepare writes a "
                "folder of its own: name another, e.g. data/<name>"
            )
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; name a folder for the prepared data")
    if out.is_dir() and not (out / marker).is_file() and any(out.iterdir()):
        raise ValueError(
            f"--out {out} already holds files that are not prepared data (no {marker}), and "
            "prepare replaces the whole folder: name a new or empty folder"
        )


def replace_folder(scratch: Path, out: Path, marker: str) -> None:
    """Put the complete folder `scratch` at `out`: renamed into place, the folder it replaces
    (if any) removed after. A process that prepared the same data at the same time (every rank
    of a first run) may have put it there first (`out/marker`, the file written last, exists):
    then `out` is kept."""
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        with contextlib.suppress(FileNotFoundError):  # another process moved it a moment ago
            out.rename(old / out.name)
    try:
        scratch.rename(out)
    except OSError:
        if not (out / marker).is_file():
            raise
    if out.exists():
        for old in out.parent.glob(f".{out.name}.old-*"):
            shutil.rmtree(old, ignore_errors=True)
