"""Loss curves of runs, drawn from their metrics.jsonl into a PNG.

    python -m cpu_single_fp32.plot RUN_DIR [RUN_DIR ...] [--out PNG]

Draws train loss and the validation metrics against optimizer steps: a star on the
validation the `best` checkpoint holds, a dotted line where a resumed segment begins. Every
run writes `<run_dir>/loss_curve.png` when it ends (`plot = false` switches that off); given
several runs, this command overlays them in one PNG.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from .config import command_parser
from .state_io import atomic_write

PLOT_FILE = "loss_curve.png"
FIGURE_INCHES, DPI = (10.0, 4.0), 100  # 1000 x 400 px


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl, in file order. A line that does not parse is skipped: a
    process killed while appending leaves its last line torn.

    Raises:
        ValueError: the file is missing (not a run folder).
    """
    if not path.is_file():
        raise ValueError(f"{path} not found; pass the run_dir of a run that has started")
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def read_metrics(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """The records of `<run_dir>/metrics.jsonl` by kind ("train", "val", "start"), in file order.

    Raises:
        ValueError: see `read_records`.
    """
    by_kind: dict[str, list[dict[str, Any]]] = {"train": [], "val": [], "start": []}
    for record in read_records(run_dir / "metrics.jsonl"):
        by_kind.setdefault(record["kind"], []).append(record)
    return by_kind


def best_step(run_dir: Path) -> int | None:
    """The optimizer step of the checkpoint `checkpoints/best` names, or None."""
    pointer = run_dir / "checkpoints" / "best"
    if not pointer.is_file():
        return None
    return int(pointer.read_text().strip().removeprefix("step-"))


def monitored_metric(run_dir: Path) -> str:
    """The validation metric the run selects its best checkpoint by (config.json `monitor`)."""
    config = run_dir / "config.json"
    return json.loads(config.read_text())["monitor"] if config.is_file() else "val_loss"


def draw(run_dirs: list[Path]) -> bytes:
    """The PNG (FIGURE_INCHES at DPI) of `run_dirs`' curves: train and validation loss left,
    the other validation metrics right, one colour per run.

    Raises:
        ValueError: a run folder without metrics.jsonl.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, none opened
    from matplotlib.figure import Figure

    figure = Figure(figsize=FIGURE_INCHES, dpi=DPI, layout="constrained")
    losses, others = figure.subplots(1, 2)
    for index, run_dir in enumerate(run_dirs):
        name = f"{run_dir.name} " if len(run_dirs) > 1 else ""
        _draw_run(run_dir, losses, others, color=f"C{index}", name=name)
    losses.set(xlabel="optimizer step", ylabel="loss (log scale)", title="loss", yscale="log")
    others.set(xlabel="optimizer step", title="validation metrics")
    for axes in (losses, others):
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:  # the resume lines carry no label
            axes.legend(fontsize="small")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _draw_run(run_dir: Path, losses: Any, others: Any, color: str, name: str) -> None:
    records, best, monitor = read_metrics(run_dir), best_step(run_dir), monitored_metric(run_dir)
    train, val = records["train"], records["val"]
    train_loss = [r["loss"] for r in train]
    losses.plot([r["step"] for r in train], train_loss, color=color, alpha=0.6)
    losses.lines[-1].set_label(f"{name}train loss")
    val_steps = [r["step"] for r in val]
    first = val[0] if val else {}
    scalars = [k for k, v in first.items() if k.startswith("val_") and isinstance(v, int | float)]
    for metric in scalars:  # per-class lists have figures of their own
        axes = losses if metric == "val_loss" else others
        values = [r[metric] for r in val]
        axes.plot(val_steps, values, "o-", color=color, label=f"{name}{metric}")
        if metric == monitor and best in val_steps:
            best_value = values[val_steps.index(best)]
            axes.plot(best, best_value, "*", color="gold", markeredgecolor="black", markersize=16)
            axes.lines[-1].set_label(f"{name}best checkpoint")
    for start in (r["step"] for r in records["start"] if r["step"] > 0):
        for axes in (losses, others):
            axes.axvline(start, color=color, linestyle=":", linewidth=1)
        where = {"xycoords": ("data", "axes fraction"), "rotation": 90, "va": "top"}
        losses.annotate(f"resumed at {start}", (start, 0.98), color=color, **where)


def write_plot(run_dirs: list[Path], out: Path) -> Path:
    """Draw `run_dirs` into the PNG `out` (written atomically); return `out`.

    Raises:
        ValueError: a run folder without metrics.jsonl.
    """
    png = draw(run_dirs)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, lambda tmp: tmp.write_bytes(png))
    return out


def main(argv: list[str] | None = None) -> Path:
    """Entry point of `python -m cpu_single_fp32.plot`; returns the PNG written."""
    parser = command_parser(__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    parser.add_argument(
        "--out",
        type=Path,
        help=f"PNG to write (default RUN_DIR/{PLOT_FILE} for "
        "one run, loss_curves.png here for several)",
    )
    args = parser.parse_args(argv)
    default = Path("loss_curves.png") if len(args.run_dirs) > 1 else args.run_dirs[0] / PLOT_FILE
    try:
        written = write_plot(args.run_dirs, args.out or default)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    print(written)
    return written


if __name__ == "__main__":
    main()
