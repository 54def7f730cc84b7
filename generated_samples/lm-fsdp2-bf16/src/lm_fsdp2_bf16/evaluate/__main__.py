"""Measure a trained language model: `python -m <package>.evaluate [DATA ...] [options]`.

Bits per byte (bits_per_byte.py) and perplexity on the run's prepared validation split, or on
the texts DATA names (text files, JSON lines, parquet: each encoded with the model's own
tokenizer, its bytes counted from the UTF-8 text, so that models with other tokenizers compare),
with the tokens and bytes read. `--tasks` also runs lm-evaluation-harness tasks (harness.py;
the project's `eval` extra: pip install -e '.[eval]') on the model's Hugging Face export, from
`--task-dir` (tasks written as lm-eval YAML over local files) or lm-eval's own names where
their data is on this machine.

Reads a run (`--run-dir`, `--weights`, `--checkpoint`) or a model folder (`--model`). Prints a
table; for a run, also records the results in its folder's eval.json (by weights, then by text
and task: each one's latest) and as TensorBoard scalars (`eval/...`) at its last step.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..config import command_parser, load_config, user_errors
from ..corpus import MANIFEST, read_manifest
from ..inference.sources import (
    LanguageModel,
    add_source_arguments,
    device_named,
    load_language_model,
)
from ..inference.trained import run_config
from ..state_io import atomic_write_text
from .bits_per_byte import HeldOutText, Score, score

EVAL_FILE = "eval.json"


def held_out_text(args: Any, used: LanguageModel, run_dir: Path | None) -> tuple[HeldOutText, str]:
    """The text to score and its name in the table: DATA, else the run's validation split.

    Raises:
        ValueError: no DATA for a model folder; the run's data_dir holds no corpus.
    """
    if args.data:
        from .texts import read_texts

        texts = read_texts(args.data, args.text_key)
        return HeldOutText.from_texts(texts, used.codec, args.max_bytes), " ".join(args.data)
    if run_dir is None:
        raise ValueError("a model folder has no validation split: name the texts to score (DATA)")
    data_dir = Path(run_config(run_dir).data_dir)
    manifest = read_manifest(data_dir, "name the texts to score (DATA) instead")
    text = HeldOutText.from_corpus(data_dir, manifest, used.codec, args.max_bytes)
    return text, f"{data_dir / MANIFEST} validation split"


def run_harness(
    args: Any, used: LanguageModel, run_dir: Path | None
) -> dict[str, dict[str, float]]:
    """lm-evaluation-harness's results on the model: its folder, or a run exported to a
    temporary one (merged, for LoRA adapters)."""
    from .harness import run_tasks

    tasks = [name.strip() for name in args.tasks.split(",") if name.strip()]
    task_dir = Path(args.task_dir) if args.task_dir else None
    if run_dir is None:
        return run_tasks(Path(args.model), tasks, task_dir, args.device_name, limit=args.limit)
    from ..export import main as export_main

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "export"
        export = [str(folder), "--run-dir", str(run_dir), "--weights", args.weights]
        export += ["--checkpoint", args.checkpoint] if args.checkpoint else []
        export += ["--merge"] if run_config(run_dir).finetune == "lora" else []
        export_main(export)
        return run_tasks(folder, tasks, task_dir, args.device_name, limit=args.limit)


def table(source: str, text: str, scored: Score, tasks: dict[str, dict[str, float]]) -> str:
    """The results as the command prints them."""
    lines = [f"model: {source}", f"text:  {text}"]
    lines.append(
        f"  bits per byte {scored.bits_per_byte:.4f} | loss {scored.loss:.4f} nats/token | "
        f"perplexity {scored.perplexity:.3f} | {scored.tokens:,} tokens, {scored.bytes:,} bytes"
    )
    for task, metrics in tasks.items():
        shown = ", ".join(f"{name} {value:.4f}" for name, value in metrics.items())
        lines.append(f"  {task}: {shown}")
    return "\n".join(lines)


def record(run_dir: Path, weights: str, results: dict[str, Any]) -> None:
    """The results in the run folder's eval.json, under the `weights` scored (a weights file or
    a checkpoint), beside what earlier evaluations recorded (each text's and task's latest),
    and the figures as TensorBoard scalars `eval/<name>` at the run's last step (its
    summary.json's; 0 without one)."""
    path = run_dir / EVAL_FILE
    kept = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    mine = kept.get(weights, {"texts": {}, "tasks": {}})
    mine["texts"][results["text"]["source"]] = results["text"]
    mine["tasks"] |= results["tasks"]
    atomic_write_text(json.dumps(kept | {weights: mine}, indent=1) + "\n", path)
    summary = run_dir / "summary.json"
    step = json.loads(summary.read_text(encoding="utf-8"))["steps"] if summary.is_file() else 0
    from torch.utils.tensorboard import SummaryWriter

    scalars = {f"eval/{name}": value for name, value in results["text"]["figures"].items()}
    for task, metrics in results["tasks"].items():
        scalars |= {f"eval/{task}/{name}": value for name, value in metrics.items()}
    with SummaryWriter(str(run_dir / "tensorboard" / "eval")) as writer:
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, step)


def check_arguments(args: Any) -> None:
    """Raises ValueError: a count below 1, or a task option without --tasks."""
    counts = {"--max-bytes": args.max_bytes, "--batch-size": args.batch_size}
    counts |= {"--limit": args.limit}
    for option, value in counts.items():
        if value is not None and value < 1:
            raise ValueError(f"{option} must be >= 1, got {value}")
    if not args.tasks and (args.task_dir or args.limit):
        raise ValueError("--task-dir and --limit choose lm-eval tasks: add --tasks")
    if args.task_dir and not Path(args.task_dir).is_dir():
        raise ValueError(f"--task-dir {args.task_dir} is not a folder")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Entry point; prints the table and returns the results (eval.json's content)."""
    parser = command_parser(__doc__.splitlines()[0])
    parser.add_argument("data", nargs="*", help="texts to score (default: the validation split)")
    add_source_arguments(parser, chat=False)
    parser.add_argument("--text-key", default="text", help="the text field of jsonl/parquet")
    parser.add_argument("--max-bytes", type=int, help="score the texts' first N bytes only")
    parser.add_argument("--context", type=int, help="tokens a window holds (default: block_size)")
    parser.add_argument("--batch-size", type=int, default=8, help="windows a forward pass reads")
    parser.add_argument("--tasks", help="lm-eval tasks, comma-separated")
    parser.add_argument("--task-dir", help="a folder of lm-eval task YAML files and their data")
    parser.add_argument("--limit", type=int, help="score each task's first N examples only")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, mps")
    args = parser.parse_args(argv)
    with user_errors():
        check_arguments(args)
        device = device_named(args.device)
        args.device_name = str(device)
        used = load_language_model(args, device)
        if args.tasks and used.codec.tokenizer is None:
            raise ValueError(
                f"{used.source} reads byte tokens, for which transformers (and so lm-eval) has "
                "no tokenizer: --tasks needs a model with a tokenizer.json (prepare with "
                "--tokenizer bpe or a model's own)"
            )
        run_dir = None
        if not args.model:
            run_dir = Path(args.run_dir or load_config("configs/train.toml").run_dir)
        context = args.context
        if context is None:
            context = run_config(run_dir).block_size if run_dir is not None else used.context
        if not 1 < context <= used.context:
            raise ValueError(f"--context must be in [2, {used.context}], the model's positions")
        text, name = held_out_text(args, used, run_dir)
        scored = score(used.model, text, context, args.batch_size, device)
        tasks = run_harness(args, used, run_dir) if args.tasks else {}
    results = {
        "model": used.source,
        "text": {"source": name, "context": context, "figures": scored.figures()},
        "tasks": tasks,
    }
    print(table(used.source, name, scored, tasks))
    if run_dir is not None:
        record(run_dir, args.checkpoint or args.weights, results)
        print(f"wrote {run_dir / EVAL_FILE}", file=sys.stderr)
    return results


if __name__ == "__main__":
    main()
