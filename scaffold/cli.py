"""The command line: `scaffold new`, `scaffold plan`, `scaffold update`, `scaffold variants`,
`scaffold samples`. Thin: it parses, calls, prints, and turns every ScaffoldError into one line
on stderr and exit code 2.

Exit codes: 0 done; 1 `update` left conflicts to resolve, or `update --diff` would (or
`samples --check` found stale files); 2 bad input, nothing written; 3 `update` could not apply
template changes to files the project deleted (listed, with the command that brings one back);
130 cancelled."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from scaffold import __version__
from scaffold.answers import QUESTIONS, Answers, build_answers, merge_sources, parse_data_pairs
from scaffold.errors import AnswerError, ScaffoldError
from scaffold.variants import VARIANTS

if TYPE_CHECKING:
    from scaffold.planner import Plan
    from scaffold.update import UpdateResult

EXIT_CONFLICTS = 1
EXIT_USAGE = 2
EXIT_DROPPED_CHANGES = 3
EXIT_INTERRUPTED = 130
UPDATE_EXIT_CODES = f"""exit status:
  0  updated, or already up to date (with --diff: the update would leave no conflicts)
  {EXIT_CONFLICTS}  conflicts: resolve the <<<<<<< markers in the listed files, git add, commit
     (with --diff: the update would leave conflicts; nothing changed)
  {EXIT_USAGE}  bad input or a project that cannot be updated as it is; nothing changed
  {EXIT_DROPPED_CHANGES}  updated, but the template changed files this project deleted; those
     changes were not applied (the files are listed with the command that brings one
     back); exit {EXIT_CONFLICTS} wins when there are conflicts too"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="scaffold",
        description="Render a runnable, tested PyTorch training project.",
    )
    parser.add_argument("--version", action="version", version=f"scaffold {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    new = commands.add_parser(
        "new",
        help="render a new training project into DEST",
        epilog=answer_keys_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    new.add_argument(
        "dest",
        metavar="DEST",
        type=Path,
        help="folder to create (its name is the default project name)",
    )
    _add_answer_options(new)
    new.add_argument(
        "--force",
        action="store_true",
        help="allow a non-empty DEST: rendered files replace same-named ones, only if the "
        "whole render succeeds",
    )

    planner = commands.add_parser(
        "plan",
        help="print the plan for a set of answers (strategy, batch, memory) and exit",
        epilog=answer_keys_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_answer_options(planner)

    update = commands.add_parser(
        "update",
        help="merge this scaffold's template fixes into an existing project",
        epilog=f"{UPDATE_EXIT_CODES}\n\n{answer_keys_help()}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    update.add_argument("dest", metavar="DEST", type=Path, nargs="?", default=Path("."))
    update.add_argument(
        "--data", action="append", default=[], metavar="KEY=VALUE", help="change one answer"
    )
    update.add_argument("--ask", action="store_true", help="ask new questions instead of defaults")
    update.add_argument(
        "--diff", "--dry-run", dest="dry_run", action="store_true", help="show the change only"
    )
    update.add_argument(
        "--recopy", action="store_true", help="re-render from scratch with the recorded answers"
    )
    # For template developers and tests: update from a template folder as if it were a release.
    update.add_argument("--template", type=Path, help=argparse.SUPPRESS)
    update.add_argument("--template-version", default=__version__, help=argparse.SUPPRESS)

    commands.add_parser("variants", help="list the named variants, one per line")

    samples = commands.add_parser("samples", help="re-render generated_samples/ (or check it)")
    samples.add_argument("--dir", type=Path, default=Path("generated_samples"))
    samples.add_argument(
        "--check", action="store_true", help="only list stale files; exit 1 if any"
    )
    return parser


def answer_keys_help() -> str:
    """The `--data` keys, each with what it asks, its default and the values it takes, from the
    question table (`scaffold.answers.QUESTIONS`)."""
    lines = [
        "answer keys (--data KEY=VALUE; the prompts ask the others, --defaults takes each",
        "default; hardware, GPU and memory answers default to what this machine has):",
    ]
    for question in QUESTIONS:
        default = "DEST's name" if question.default is None else str(question.default)
        default = default.lower() if question.kind is bool else default
        default = "none" if question.positive and not question.default else default
        only = "; hardware=cuda only" if question.only_for_cuda else ""
        only += "; task=language-model only" if question.only_for_language_model else ""
        only += "; init_from's config.json sets it" if question.derived_from_init_from else ""
        lines.append(f"  {question.key:<15} {question.prompt} (default {default}{only})")
        lines.append(f"  {'':<15}   {question.accepted()}")
    return "\n".join(lines)


def _add_answer_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--defaults", action="store_true", help="take every default; ask nothing")
    command.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="answer one question (repeatable)",
    )
    command.add_argument(
        "--variant",
        choices=sorted(VARIANTS),
        help="start from a named variant's answers",
    )


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                return COMMANDS[args.command](args)
            finally:
                for warning in caught:
                    print(f"scaffold: warning: {warning.message}", file=sys.stderr)
    except ScaffoldError as error:
        print(f"scaffold: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as error:  # e.g. a name too long for the file system, a read-only folder
        print(f"scaffold: error: {error.strerror or error}: {error.filename}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("scaffold: cancelled; nothing was written", file=sys.stderr)
        return EXIT_INTERRUPTED


def collect_answers(args: argparse.Namespace, project_name: str) -> Answers:
    """The answers of `new` and `plan`, first source wins: `--data`, the `--variant`, the
    prompts (with a terminal, unless `--defaults` or `--variant`), the project name, the
    hardware probe, then the static defaults.

    Raises:
        AnswerError: prompts are needed but there is no terminal, or an answer is invalid.
    """
    from scaffold.hardware import probe

    data = parse_data_pairs(args.data)
    variant = VARIANTS[args.variant] if args.variant else {}
    named = {"project_name": project_name}
    interactive = not args.defaults and not args.variant
    if interactive and not sys.stdin.isatty():
        raise AnswerError("no terminal to ask questions on; pass --defaults (and --data KEY=VALUE)")
    detected = probe().answer_defaults()
    prompted: dict = {}
    if interactive:
        from scaffold.questionnaire import ask

        answered = {**variant, **data} | ({} if args.command == "new" else named)
        prompted = ask(answered, merge_sources(named, detected))
    return build_answers(merge_sources(data, variant, prompted, named, detected))


def cmd_new(args: argparse.Namespace) -> int:
    """`scaffold new`: collect answers (flags, variant, prompts, probe), plan, render."""
    from scaffold.destination import check_destination
    from scaffold.planner import plan
    from scaffold.render import render_project

    check_destination(args.dest, args.force)
    result = plan(collect_answers(args, args.dest.resolve().name))
    render_project(result.copier_data(), args.dest, force=args.force)
    _print_plan(result)
    _print_next_steps(result.answers, args.dest)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """`scaffold plan`: the plan of `new` for the same answers, printed; nothing is written."""
    from scaffold.planner import plan

    _print_plan(plan(collect_answers(args, "project")))
    return 0


def _print_plan(result: Plan) -> None:
    for line in result.describe():
        print(line)
    for line in result.warnings:
        print(f"  warning: {line}", file=sys.stderr)


def _print_next_steps(answers: Answers, dest: Path) -> None:
    print(f"Rendered {answers.project_name} into {dest}. Next:")
    if not (dest / ".git").is_dir():
        print(f"  (not committed: {dest} was not empty; review the files with git or diff)")
    print(f"  cd {dest} && python -m venv .venv && . .venv/bin/activate")
    for command in install_commands(answers):
        print(f"  {command}")
    print("  pytest")
    before, after = project_commands(answers)
    launches = [*before, preflight_command(answers), *launch_commands(answers), *after]
    width = max(len(command) for command, _ in launches) + 2
    for command, what in launches:
        print(f"  {command:<{width}}# {what}")


def project_commands(
    answers: Answers,
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(command, what it does) for the project's commands beside training, as its README gives
    them, those to run before training and those after: prepare your own data (before, for a
    timm backbone: it trains on your images, not the digits), then use what trained (predict;
    or generate, chat, evaluate and export), and the file that is yours for a timm backbone."""
    from scaffold.planner import BACKBONE_DATA_DIR

    module = f"python -m {answers.package_name}"
    if answers.task == "language-model":
        return [], [
            (f"{module}.prepare CORPUS/ --out data/mine", "your text (or chats) as token shards"),
            (f'{module}.generate "PROMPT"', "samples from the trained run"),
            (f"{module}.chat", "a conversation with a chat-trained run"),
            (f"{module}.evaluate", "bits per byte on the validation split; --tasks: lm-eval"),
            (f"{module}.export exported/", "a Hugging Face folder (transformers, vLLM)"),
        ]
    prepare = (
        f"{module}.prepare PHOTOS/ --out {BACKBONE_DATA_DIR}",
        f"your class folders (or a CSV) as shards; train with data_dir={BACKBONE_DATA_DIR}",
    )
    predict = (f"{module}.predict IMAGE.jpg --run-dir RUN", "classifies with a trained run")
    if answers.model_family != "timm":
        return [], [prepare, predict]
    yours = (f"src/{answers.package_name}/backbone.py", f"yours: {answers.backbone} and its head")
    first = (prepare[0], "first: a backbone trains on your images (data_dir in train.toml)")
    return [yours, first], [predict]


def install_commands(answers: Answers) -> list[str]:
    """The project's install, as its README's quick start gives it: on a CPU, torch (and an
    image project's torchvision, whose ops load only beside the torch build of the same index)
    from PyTorch's CPU wheel index first (PyPI's Linux torch is the CUDA build: GBs the project
    never loads), then the project with its dev extra."""
    packages = "torch torchvision" if answers.task == "image-classification" else "torch"
    cpu_torch = [f"pip install {packages} --index-url https://download.pytorch.org/whl/cpu"]
    return [*(cpu_torch if answers.hardware == "cpu" else []), 'pip install -e ".[dev]"']


def preflight_command(answers: Answers) -> tuple[str, str]:
    """(command, what it does) of the project's check of its machines before a launch (the
    README's "Before a long launch" section), started as the planned launch is."""
    checks = "devices, code, disk, one step and checkpoint"
    if answers.strategy == "single":
        command = f"python -m {answers.package_name}.preflight"
        return (command, f"checks this machine first: {checks}")
    if answers.num_nodes > 1 and answers.framework != "accelerate":
        what = f"checks the allocation first, on each node ({checks}); sbatch runs it itself"
        return ("HEAD_NODE=<first node> bash launch/preflight.sh", what)
    return ("bash launch/preflight.sh", f"checks the allocation first: {checks}")


def launch_commands(answers: Answers) -> list[tuple[str, str]]:
    """(command, what it does) for each way to launch training as planned (`answers` resolved
    by the planner): the launcher of the project's launch/ folder that starts the planned
    processes, or the module itself for one process."""
    nodes, per_node = answers.num_nodes, answers.gpus_per_node
    processes = f"{answers.world_size} process{'es' if answers.world_size > 1 else ''}"
    if answers.strategy == "single":
        return [(f"python -m {answers.package_name}.train", "trains on one device")]
    if answers.framework == "accelerate":
        where = f'on each of the {nodes} nodes, with ACCELERATE_ARGS="--machine_rank R'
        where += ' --main_process_ip HEAD" on all but the first'
        return [
            (
                "bash launch/accelerate.sh",
                f"accelerate launch, {processes}" + (f", {where}" if nodes > 1 else ""),
            )
        ]
    if nodes > 1:
        return [
            ("sbatch launch/slurm.sbatch", f"SLURM: {nodes} nodes x {per_node} GPUs, resumes"),
            (
                "HEAD_NODE=<first node> bash launch/multinode.sh",
                f"or, without SLURM, on each of the {nodes} nodes",
            ),
        ]
    several = "; NPROC_PER_NODE=N for N" if answers.world_size == 1 else " on this node"
    return [("bash launch/torchrun.sh", f"torchrun, {processes}{several}")]


def cmd_update(args: argparse.Namespace) -> int:
    """`scaffold update`: merge (printing the new plan when `--data` changes an answer); exit 1
    listing the conflicted files when markers remain, else exit 3 listing the files the
    template changed that the project deleted (copier leaves those changes out), with the `git
    checkout` that brings one back (`UPDATE_EXIT_CODES`). `--diff` prints the diff and a
    summary line, and exits 1 when the update would leave conflicts."""
    from scaffold.update import update_project

    data = parse_data_pairs(args.data)
    result = update_project(
        args.dest,
        data,
        ask=args.ask,
        dry_run=args.dry_run,
        recopy=args.recopy,
        template=args.template,
        version=args.template_version,
    )
    for note in result.notes:
        print(f"migration note {note}")
    if data and result.plan:  # a changed answer: the plan the update renders
        _print_plan(result.plan)
    else:
        for line in result.warnings:  # e.g. a recorded strategy too small for the model
            print(f"scaffold: warning: {line}", file=sys.stderr)
    for note in result.config_notes:
        print(f"scaffold: note: configs/train.toml: {note}", file=sys.stderr)
    _print_carried(result, args.dry_run)
    if args.dry_run:
        return _print_dry_run(result)
    _print_dropped(result)
    if result.conflicts:
        print(f"scaffold: conflicts in {len(result.conflicts)} file(s):", file=sys.stderr)
        for path in result.conflicts:
            print(f"  {path}", file=sys.stderr)
        print("resolve the <<<<<<< markers, then git add and commit", file=sys.stderr)
        return EXIT_CONFLICTS
    if not result.changed:
        print(f"already up to date with {result.new_tag}; nothing changed")
        return EXIT_DROPPED_CHANGES if result.dropped else 0
    how = "re-rendered" if args.recopy else "updated"
    versions = f"from {result.old_tag} to {result.new_tag}"
    print(f"{how} {args.dest.resolve()} {versions}; review with git diff, then commit")
    return EXIT_DROPPED_CHANGES if result.dropped else 0


def _print_dry_run(result: UpdateResult) -> int:
    """`update --diff`: the diff, then one summary line; EXIT_CONFLICTS if the update would
    leave conflicts."""
    print(result.diff or f"no changes from {result.old_tag} to {result.new_tag}")
    if result.dropped:
        print(
            f"scaffold: note: the update would not apply the template's changes to "
            f"{len(result.dropped)} file(s) this project deleted: {', '.join(result.dropped)}"
            "; scaffold update lists them with the command that brings one back",
            file=sys.stderr,
        )
    conflicts = (
        f", {len(result.conflicts)} with conflicts: {', '.join(result.conflicts)}"
        if result.conflicts
        else ", no conflicts"
    )
    print(
        f"scaffold update --diff: {len(result.changed_files)} file(s) would change from "
        f"{result.old_tag} to {result.new_tag}{conflicts}; nothing was written",
        file=sys.stderr,
    )
    return EXIT_CONFLICTS if result.conflicts else 0


def _print_carried(result: UpdateResult, dry_run: bool) -> None:
    """Name the edited files the template moved (the edits now at the new path) and the
    edited files it no longer has (kept as they were), with what to do about each."""
    carried, kept = ("would carry", "would keep") if dry_run else ("carried", "kept")
    if result.carried:
        print(
            f"scaffold: {carried} your edits of {len(result.carried)} file(s) that the template "
            "moved to their new paths:",
            file=sys.stderr,
        )
        for old, new in result.carried.items():
            print(f"  {old} -> {new}", file=sys.stderr)
    if result.kept:
        print(
            f"scaffold: {kept} {len(result.kept)} file(s) that you edited and the template no "
            "longer has; nothing it renders uses them now: move your edits where they belong, "
            "then git rm the file",
            file=sys.stderr,
        )
        for path in result.kept:
            print(f"  {path}", file=sys.stderr)


def _print_dropped(result: UpdateResult) -> None:
    """List the files whose template change the update left out, and how to bring one back."""
    if not result.dropped:
        return
    print(
        f"scaffold: the template changed {len(result.dropped)} file(s) that this project "
        "deleted; the update did not apply those changes:",
        file=sys.stderr,
    )
    for path in result.dropped:
        print(f"  {path}", file=sys.stderr)
    print(
        f"to bring one back with the change, run in {result.project}: "
        f"git checkout {result.restore_ref} -- PATH  (to read it first: "
        f"git show {result.restore_ref}:./PATH); or leave it deleted",
        file=sys.stderr,
    )


def cmd_variants(args: argparse.Namespace) -> int:
    """`scaffold variants`: one variant per line, the name first."""
    for name, answers in VARIANTS.items():
        summary = " ".join(
            f"{key}={answers[key]}" for key in ("task", "hardware", "strategy", "precision")
        )
        print(f"{name}  {summary}")
    return 0


def cmd_samples(args: argparse.Namespace) -> int:
    """`scaffold samples`: re-render generated_samples/, or with --check list stale files."""
    from scaffold.samples import stale_sample_files, write_samples

    if args.check:
        stale = stale_sample_files(args.dir)
        for path in stale:
            print(f"stale: {args.dir / path}")
        return 1 if stale else 0
    for name in write_samples(args.dir):
        print(f"wrote {args.dir / name}")
    return 0


COMMANDS = {
    "new": cmd_new,
    "plan": cmd_plan,
    "update": cmd_update,
    "variants": cmd_variants,
    "samples": cmd_samples,
}
