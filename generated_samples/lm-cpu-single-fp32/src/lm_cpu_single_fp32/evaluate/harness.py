"""lm-evaluation-harness tasks on an exported model folder, offline.

`run_tasks` runs EleutherAI's lm-evaluation-harness (`lm_eval.simple_evaluate`, its Hugging Face
model class `"hf"`) on a folder that transformers' AutoModelForCausalLM and AutoTokenizer load
(what `python -m <package>.export` writes), on tasks from a folder of task YAML files and on
lm-eval's own task names. Nothing is downloaded: the Hugging Face offline switches are set, so a
task must read local files (`dataset_path: json`, `dataset_kwargs: data_files: ...`), and lm-eval's
own tasks only run where their datasets are already in the Hugging Face cache.

lm-eval is an optional dependency (`pip install -e '.[eval]'`), imported only when `run_tasks`
runs. Its documentation is the reference for task YAML files, metrics and `simple_evaluate`:
https://github.com/EleutherAI/lm-evaluation-harness/blob/main/docs/task_guide.md and
https://github.com/EleutherAI/lm-evaluation-harness/blob/main/docs/python-api.md

lm-eval passes `data_files` to `datasets.load_dataset` as written, so a relative path there is
relative to the working directory. `run_tasks` instead reads a relative path (or `data_dir`) in a
YAML file of `task_dir` as relative to that YAML file, so a task folder runs from anywhere.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

INSTALL_HINT = "pip install -e '.[eval]'"
# Set before lm_eval (and with it datasets and huggingface_hub) is imported: both read them once.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# Keys of a task's results that are not metrics.
NOT_METRICS = {"alias", "samples", "name", "sample_len", "sample_count"}


def run_tasks(
    model_folder: Path,
    tasks: list[str],
    task_dir: Path | None = None,
    device: str = "cpu",
    batch_size: int = 8,
    limit: int | None = None,
) -> dict[str, dict[str, float]]:
    """Run lm-eval tasks on the model in `model_folder`; return {task: {metric: value}}.

    `tasks` are names of tasks in `task_dir`'s YAML files (searched recursively, as lm-eval's
    `TaskManager(include_path=...)` does) or lm-eval's own task, group and tag names. The model
    runs in float32 on the CPU (the folder's own dtype on another `device`), `batch_size` requests
    at a time, on the first `limit` documents of each task (all where None: lm-eval's advice is to
    limit only for tests).

    Returns:
        One entry per task lm-eval reports (a group's subtasks and the group itself), each
        metric's value as lm-eval aggregates it over the documents: "acc" and "acc_norm" (the
        fraction of multiple-choice documents whose right choice has the highest log-likelihood,
        summed, or divided by the choice's length in characters), "exact_match" (the fraction
        of generations, stripped by the task's filters, equal to the target), "perplexity", and
        so on: fractions in [0, 1] unless the metric says otherwise. Standard errors
        ("..._stderr") and aliases are left out. A metric that a task reports under one filter
        is named as the metric; under several, "metric,filter".

    Sets HF_HUB_OFFLINE, HF_DATASETS_OFFLINE and TRANSFORMERS_OFFLINE to 1 for the rest of the
    process (the libraries read them once, when first imported). A task name in `task_dir` wins
    over lm-eval's own of that name. Naming any task that is not in `task_dir` makes lm-eval index
    its own (some 15,000 names; about 8 s).

    Raises:
        ValueError: lm-eval is not installed, `task_dir` or `model_folder` is not a folder, a task
            name is neither in `task_dir` nor lm-eval's, or transformers cannot load
            `model_folder` (each in one line).
    """
    if task_dir is not None and not Path(task_dir).is_dir():
        raise ValueError(f"task_dir {task_dir} is not a folder")
    os.environ.update(OFFLINE_ENV)
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
        from lm_eval.tasks._yaml_loader import load_yaml
    except ImportError as error:
        raise ValueError(f"lm-eval is not installed ({error}): {INSTALL_HINT}") from None

    local = TaskManager(include_path=str(task_dir), include_defaults=False) if task_dir else None
    local_yaml = {
        name: entry.yaml_path
        for name, entry in (local.task_index.items() if local else ())
        if name in local.all_subtasks and entry.yaml_path is not None
    }
    specs: list[str | dict[str, Any]] = []
    manager = local
    for name in tasks:
        if name in local_yaml:
            specs.append(_absolute_data_files(load_yaml(local_yaml[name]), local_yaml[name]))
            continue
        if manager is None or manager is local:
            manager = TaskManager(include_path=str(task_dir) if task_dir else None)
        if name not in manager.all_tasks:
            offered = ", ".join(local.all_tasks) if local and local.all_tasks else "no tasks"
            where = f"task_dir {task_dir} offers {offered}" if task_dir else "no task_dir given"
            raise ValueError(
                f"unknown lm-eval task {name!r}: {where}; `lm-eval ls tasks` lists lm-eval's own"
            )
        specs.append(name)

    folder = Path(model_folder)
    if not folder.is_dir():
        raise ValueError(f"model folder {folder} is not a folder (lm-eval would read a Hub name)")
    try:
        model = HFLM(
            pretrained=str(folder),
            device=device,
            batch_size=batch_size,
            dtype="float32" if device == "cpu" else "auto",
        )
    except Exception as error:  # transformers raises OSError, ValueError, KeyError, ...
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ValueError(
            f"transformers cannot load {folder} as a causal language model with its tokenizer "
            f"({type(error).__name__}: {first_line})"
        ) from None

    output = lm_eval.simple_evaluate(
        model=model,
        tasks=specs,
        task_manager=manager,
        limit=limit,
        bootstrap_iters=0,
        log_samples=False,
    )
    return {task: _metrics(values) for task, values in output["results"].items()}


def _absolute_data_files(config: dict[str, Any], yaml_path: Path) -> dict[str, Any]:
    """`config` (a task YAML file's, loaded) with relative `dataset_kwargs` paths made relative
    to the YAML file's folder: `data_dir` where given (datasets reads `data_files` relative to
    it), else each of `data_files` (a path, a list, or a dict of split to either)."""
    kwargs = dict(config.get("dataset_kwargs") or {})
    base = Path(yaml_path).resolve().parent

    def anchored(path: Any) -> Any:
        if not isinstance(path, str) or "://" in path or Path(path).is_absolute():
            return path
        return str(base / path)

    if kwargs.get("data_dir"):
        kwargs["data_dir"] = anchored(kwargs["data_dir"])
    elif "data_files" in kwargs:
        files = kwargs["data_files"]
        if isinstance(files, dict):
            files = {
                split: [anchored(p) for p in paths] if isinstance(paths, list) else anchored(paths)
                for split, paths in files.items()
            }
        elif isinstance(files, list):
            files = [anchored(p) for p in files]
        else:
            files = anchored(files)
        kwargs["data_files"] = files
    return {**config, "dataset_kwargs": kwargs} if kwargs else config


def _metrics(values: dict[str, Any]) -> dict[str, float]:
    """One task's results as lm-eval reports them ("acc,none": 0.5, "acc_stderr,none": ...,
    "alias": ...) as {metric: value}, the filter dropped where a metric has only one."""
    numbers = {
        key: float(value)
        for key, value in values.items()
        if key.split(",")[0] not in NOT_METRICS
        and "_stderr" not in key
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
    }
    filters_of = Counter(key.split(",")[0] for key in numbers)
    return {
        (key.split(",")[0] if filters_of[key.split(",")[0]] == 1 else key): value
        for key, value in numbers.items()
    }
