"""Where a run's scalars go besides metrics.jsonl: TensorBoard event files in
`<run_dir>/tensorboard/` (on by default) and, optionally, Weights & Biases.

Only the main process opens trackers. Tags are `<kind>/<name>`: `train/loss`, `train/lr`,
`train/grad_norm`, `train/samples_per_second`, and `val/<metric>` for each of the task's
validation metrics (`val/loss`...); the step of every value is the optimizer step it belongs to.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any, Protocol

from ..config import Config


class Tracker(Protocol):
    """An experiment tracker: takes scalars by optimizer step, flushes on `close`."""

    def log_scalars(self, values: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    """TensorBoard event files in `log_dir`, through `torch.utils.tensorboard.SummaryWriter`.

    `purge_step` is the first step this process writes: TensorBoard's readers drop what an
    earlier process of the same run logged from that step on (a run killed after its last
    checkpoint logged steps that its resume trains again), so every step is shown once.
    """

    def __init__(self, log_dir: Path, config: Config, purge_step: int):
        from torch.utils.tensorboard import SummaryWriter  # imported only when switched on

        wait_for_a_later_second(log_dir)
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)
        config_json = json.dumps(config.to_dict(), indent=2)
        # Four leading spaces: TensorBoard renders text summaries as Markdown.
        self.writer.add_text("config", "    " + config_json.replace("\n", "\n    "), purge_step)

    def log_scalars(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self.writer.close()


def wait_for_a_later_second(log_dir: Path) -> None:
    """Return once this second is later than the one in any event file's name in `log_dir`.

    TensorBoard reads a folder's event files in name order, and a name is
    `events.out.tfevents.<second created>.<host>.<pid>.<n>` (tensorboard's
    event_file_writer.py): a resume that opens its file in the second an earlier launch opened
    its own sorts by the pids as text, and may sort first; the reader then takes the earlier
    launch's step 1 as a restart and drops every step the resume wrote. Waits at most ~2 s; an
    event file from a clock further ahead (another machine's) is left as it is.
    """
    seconds = [path.name.split(".")[3] for path in log_dir.glob("events.out.tfevents.*")]
    newest = max((int(second) for second in seconds if second.isdigit()), default=0)
    now = time.time()
    if int(now) <= newest < now + 2:
        time.sleep(newest + 1 - now)


class WandbTracker:
    """A Weights & Biases run, files under `<run_dir>/wandb/`; `WANDB_MODE=offline` keeps it
    off the network. Every launch of a run (the first, each resume) is one W&B run in the group
    named after the run folder, so resumed segments never overwrite logged steps.
    """

    def __init__(self, run_dir: Path, config: Config, first_step: int):
        import wandb  # the optional extra; `check_trackers` made sure it is there

        name = run_dir.resolve().name
        run_dir.mkdir(parents=True, exist_ok=True)  # W&B 0.17 writes to /tmp without it
        self.wandb = wandb
        self.run = wandb.init(
            project=config.wandb_project,
            group=name,
            name=f"{name}-from-step-{first_step}",
            dir=str(run_dir),
            config=config.to_dict(),
            job_type="resume" if first_step > 1 else "train",
        )

    def log_scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()
        self.wandb.teardown()  # stops W&B's service process: the run file is whole on disk


def check_trackers(config: Config) -> None:
    """Fail before any work starts when a tracker `config` asks for is not installed.

    Raises:
        ValueError: `logger = "wandb"` without wandb (`pip install -e ".[wandb]"`).
    """
    if config.logger == "wandb" and importlib.util.find_spec("wandb") is None:
        raise ValueError(
            'logger = "wandb" needs wandb: pip install -e ".[wandb]", or set logger = "none"'
        )


def open_trackers(config: Config, first_step: int) -> list[Tracker]:
    """The trackers `config` switches on, writing from optimizer step `first_step` on."""
    run_dir = Path(config.run_dir)
    trackers: list[Tracker] = []
    if config.tensorboard:
        trackers.append(TensorBoardTracker(run_dir / "tensorboard", config, first_step))
    if config.logger == "wandb":
        trackers.append(WandbTracker(run_dir, config, first_step))
    return trackers


def scalar_tags(kind: str, values: dict[str, Any]) -> dict[str, float]:
    """`{"val_loss": 0.3, "epoch": 2}` of kind "val" -> `{"val/loss": 0.3}`: the numeric values
    but the step and epoch counters, tagged `<kind>/<name>`."""
    return {
        f"{kind}/{key.removeprefix(kind + '_')}": float(value)
        for key, value in values.items()
        if key not in ("step", "epoch") and isinstance(value, int | float)
    }
