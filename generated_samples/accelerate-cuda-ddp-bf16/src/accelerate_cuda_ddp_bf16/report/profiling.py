"""A profiler window: `profile_steps = "START:STOP"` records optimizer steps START to STOP - 1
with `torch.profiler` (CPU activity, and CUDA's on a GPU; shapes not recorded) into
`<run_dir>/profile/rank<R>.pt.trace.json`, one Chrome trace per process. Perfetto
(ui.perfetto.dev) and chrome://tracing open it; TensorBoard's profiler plugin reads the folder.

Following PyTorch's recipe (pytorch.org/docs/stable/profiler.html: a `schedule` moved on by
`profiler.step()` once per optimizer step), the trace shows each step as a `ProfilerStep#N`
span; N counts the window's steps, 0 being the unrecorded warm-up.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from ..config import Config
from ..runtime import Runtime


class ProfileWindow:
    """Profiles optimizer steps START to STOP - 1 and writes their trace.

    `at_step(done)` is called with the number of optimizer steps done so far: when the run
    begins (0, or the step a resume starts from) and after every step. The profiler starts one
    step early for one unrecorded warm-up step (PyTorch's schedule: the first profiled step
    pays the tracer's start-up otherwise). A resume that starts inside the window profiles the
    rest of it, without the warm-up; a run that ends inside it writes what it recorded.
    """

    def __init__(self, config: Config, runtime: Runtime):
        self.window = config.profile_window()
        self.path = Path(config.run_dir) / "profile" / f"rank{runtime.rank}.pt.trace.json"
        self.activities = [ProfilerActivity.CPU]
        if runtime.device.type == "cuda":
            self.activities.append(ProfilerActivity.CUDA)
        self.profiler: profile | None = None
        self.written: Path | None = None

    def at_step(self, done: int) -> None:
        """Start, step or stop the profiler after `done` optimizer steps."""
        if self.window is None or self.written is not None:
            return
        if self.profiler is not None:
            self.profiler.step()  # after the window's last step this writes the trace
            return
        start, stop = self.window
        following = done + 1
        if following == start - 1:
            self._start(warmup=1, active=stop - start)
        elif start <= following < stop:
            self._start(warmup=0, active=stop - following)

    def _start(self, warmup: int, active: int) -> None:
        with warnings.catch_warnings():  # a resume inside the window has no step to warm up
            warnings.filterwarnings("ignore", "Profiler won't be using warmup")
            steps = schedule(wait=0, warmup=warmup, active=active, repeat=1)
        self.profiler = profile(
            activities=self.activities,
            schedule=steps,
            on_trace_ready=self._write,
            record_shapes=False,
        )
        self.profiler.start()

    def _write(self, profiler: profile) -> None:
        if self.activities[-1] is ProfilerActivity.CUDA:
            torch.cuda.synchronize()  # the window's kernels end inside it
        self.path.parent.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(self.path))
        self.written = self.path

    def close(self) -> str | None:
        """Stop the profiler (writing what a run that ended inside the window recorded);
        return the path of the trace written, if any (idempotent)."""
        if self.profiler is not None:
            self.profiler.stop()
            self.profiler = None
        return str(self.written) if self.written else None

    def __enter__(self) -> ProfileWindow:
        return self

    def __exit__(self, *exception: object) -> None:
        self.close()
