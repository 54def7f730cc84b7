"""What a template change needs beyond copier's merge, by scaffold version: notes for the
project owner, and the template files each version moved.

`scaffold update` prints every note of a version newer than the project's and not newer than
the installed scaffold. Add a note when a change cannot merge by itself: a renamed config key,
a checkpoint format change, a new required dependency.

Add a move when a version renders a file at a new path: the update carries the owner's edits
of the old path to the new one (`scaffold.update.carry_edits`). A file whose text the move
left unchanged is found without an entry; one the same version also edited needs it.
"""

from __future__ import annotations

from collections.abc import Mapping

from packaging.version import Version

NOTES: dict[str, str] = {
    "0.2.0": (
        "the package's machinery moved into folders (engine/, training/, checkpoint/, loader/, "
        "corpus/, report/, preflight/); your files (model.py, data.py, task.py, task_config.py, "
        "planned.py), what they import (config.py, runtime.py, state_io.py) and the commands "
        "(python -m <package>.train and the rest) stay where they were. Your edits of a moved "
        "file are merged into its new path, which the update names; an import of a moved "
        "module in your own code or tests needs its new path, e.g. <package>.progress -> "
        "<package>.training. "
        "Parts of three files moved to files of their own: resume.py's seeding, data position "
        "and world-size change (training/seeding.py, training/data_position.py, "
        "checkpoint/world_size.py), runtime.py's samplers (loader/samplers.py) and prepare.py's "
        "library (corpus/pipeline.py); an edit of yours there comes back as a conflict at the "
        "old place: move it to the new file. Checkpoints written before this update resume "
        "after it."
    ),
    "0.3.0": (
        "language-model projects gain the Hugging Face border: model_family (gpt2, llama: the "
        "new llama.py) and init_from (a model folder to start from) in configs/train.toml, "
        "hub/ (config.json, safetensors import, export) and python -m <package>.export. "
        "model.py's build_model now reads both keys: where you edited model.py, the update "
        "merges its new build_model and model_architecture beside your edits; data.py and "
        "task.py are unchanged"
    ),
    "0.4.0": (
        "language-model projects read chat and instruction records: prepare --format chat "
        "(`messages`, rendered by the tokenizer's chat template) or completion (`prompt`, "
        "`completion`) writes examples with loss masks (corpus/chat.py, corpus/examples.py), "
        "trained on the replies only and packed without attending across examples (pack in "
        "configs/train.toml, packing.py). model.py's ByteGPT and llama.py's Llama take the "
        "packed rows' documents, data.py's build_datasets reads examples as ExampleRows and "
        "task.py takes IGNORE_INDEX from corpus/ and reports the padding share: where you edited "
        "those files, the update merges these changes beside your edits; a text corpus trains "
        "as before"
    ),
    "0.5.0": (
        "image projects read real images: python -m <package>.prepare decodes class folders or "
        "tables of paths and labels into uint8 shards (images/), and data_dir in "
        "configs/train.toml trains on them, augmented with torchvision's transforms.v2. "
        "torchvision and Pillow are new dependencies: run pip install -e . again (torch and "
        "torchvision from the same index). data.py gains input_spec (model.py's build_model "
        "reads the classes and channels from it) and seeds each digit's random shift by "
        "(seed, epoch, index): a run resumed from an older checkpoint continues with other "
        "shifts than it would have drawn. model.py averages the last feature map down to 4x4 "
        "(the identity on the digits). state_io.py holds the prepared folders' scratch and "
        "replace helpers that corpus/pipeline.py held. The optimizer's groups may carry a "
        "rate of their own (training/optim.py: a task's task_lr_scale hook) and the LR "
        "schedule has one multiplier per group; checkpoints of earlier versions load as they "
        "are. configs/train.toml gains the image settings (data_dir, image_size, "
        "augment_policy, model_family, backbone, init_from, backbone_lr_ratio, "
        "freeze_backbone_epochs): where task_config.py is your own task's, delete those lines "
        "(config.py refuses a key your TaskConfig does not have)"
    ),
    "0.5.1": (
        "a validation no longer draws from the training's random streams (the validation "
        "loader has a generator of its own, loader/dataloaders.py): a run stopped where a "
        "validation was due and resumed now trains on the dropout masks the straight run "
        "draws. Checkpoints of 0.5.0 resume as they are"
    ),
    "0.6.0": (
        "language-model projects gain python -m <package>.chat (a conversation through the "
        "model's chat template) and python -m <package>.evaluate (bits per byte on any text, "
        "lm-evaluation-harness tasks: pip install -e '.[eval]'), and generate reads the "
        "model's whole context through a key-value cache (inference/decode.py). The model "
        "families moved into models/ (llama.py, lora.py, packing.py, with the new "
        "kv_cache.py) and trained.py into inference/: your edits of them are merged into their "
        "new paths; an import of them in your own code needs the new path (<package>.llama "
        "-> <package>.models). model.py's ByteGPT and models/llama.py's Llama take a `cache` "
        "in forward, and model.py's build_model builds through the new decoder_for (what a "
        "model folder read by the commands is built with): where you edited model.py, the "
        "update merges these beside your edits (a model of your own without a cache still "
        "decodes, a forward pass per token). "
        "configs/train.toml gains eval_every and eval_bytes (bits per byte on held-out text "
        "during training; where task_config.py is your own task's, delete those lines). "
        "prepare keeps a chat corpus's template (chat_template.jinja) and runs copy it: "
        "prepare a chat corpus again for chat and export to find it (or they fall back to "
        "init_from's). The run summary's tokens_trained now counts the corpus tokens read (padding "
        "out) and tokens_per_parameter the trained parameters (a LoRA run's adapters), with "
        "the new samples_per_epoch and trained_parameters. Checkpoints of 0.5 resume as they "
        "are"
    ),
    "0.7.0": (
        "scaffold's answers gain the image model: backbone (a timm model), image_size and "
        "init_from (its weights), planned from the backbone's own memory; scaffold update "
        "--data backbone=resnet50 --data init_from=W re-plans an image project for one. The "
        "image_size and model_family lines of configs/train.toml now say where the plan took "
        "them from, and the image tests pin the digits' CNN whatever train.toml names. "
        "language-model projects take the model's vocabulary from the prepared corpus: "
        "data.py's NUM_CLASSES is None by default (the manifest's vocab_size, data.input_spec), "
        "the planned value is PLANNED_VOCABULARY, and a number you set still wins; a run's "
        "start prints one line where the vocabulary differs from the plan. Where you had set "
        "NUM_CLASSES, the update conflicts on that line: keep your number and add "
        "PLANNED_VOCABULARY = <the old planned value>. model.py and task.py now import "
        "PLANNED_VOCABULARY, input_spec and corpus_vocabulary from data.py; your own tests that "
        "used NUM_CLASSES as a number should use PLANNED_VOCABULARY. Checkpoints of 0.6 resume "
        "as they are while the vocabulary is unchanged"
    ),
}

# version → {old path: new path}, relative to the project; "{package}" is the package's name.
MOVES: dict[str, dict[str, str]] = {
    # The package tree: the flat machinery modules grouped into packages named for what they are.
    "0.2.0": {
        "src/{package}/build.py": "src/{package}/engine/build.py",
        "src/{package}/engine.py": "src/{package}/engine/strategy.py",
        "src/{package}/replicated.py": "src/{package}/engine/replicated.py",
        "src/{package}/amp.py": "src/{package}/engine/amp.py",
        "src/{package}/fabric_step.py": "src/{package}/engine/fabric_step.py",
        "src/{package}/accelerate_step.py": "src/{package}/engine/accelerate_step.py",
        "src/{package}/sharding.py": "src/{package}/engine/sharding.py",
        "src/{package}/deepspeed_zero.py": "src/{package}/engine/deepspeed_zero.py",
        "src/{package}/zero3_init.py": "src/{package}/engine/zero3_init.py",
        "src/{package}/host_memory.py": "src/{package}/engine/host_memory.py",
        "src/{package}/progress.py": "src/{package}/training/state.py",
        "src/{package}/optim.py": "src/{package}/training/optim.py",
        "src/{package}/validation.py": "src/{package}/training/validation.py",
        "src/{package}/safeguards.py": "src/{package}/training/safeguards.py",
        "src/{package}/nonfinite.py": "src/{package}/training/nonfinite.py",
        "src/{package}/preemption.py": "src/{package}/training/preemption.py",
        "src/{package}/run_folder.py": "src/{package}/training/run_folder.py",
        "src/{package}/checkpoint.py": "src/{package}/checkpoint/store.py",
        "src/{package}/checkpointer.py": "src/{package}/checkpoint/schedule.py",
        "src/{package}/resume.py": "src/{package}/checkpoint/resume.py",
        "src/{package}/loader.py": "src/{package}/loader/dataloaders.py",
        "src/{package}/corpus.py": "src/{package}/corpus/shards.py",
        "src/{package}/sources.py": "src/{package}/corpus/sources.py",
        "src/{package}/documents.py": "src/{package}/corpus/documents.py",
        "src/{package}/survey.py": "src/{package}/corpus/survey.py",
        "src/{package}/prepare_jobs.py": "src/{package}/corpus/jobs.py",
        "src/{package}/report.py": "src/{package}/report/run_log.py",
        "src/{package}/trackers.py": "src/{package}/report/trackers.py",
        "src/{package}/summary.py": "src/{package}/report/summary.py",
        "src/{package}/profiling.py": "src/{package}/report/profiling.py",
        "src/{package}/preflight.py": "src/{package}/preflight/command.py",
        "src/{package}/preflight_checks.py": "src/{package}/preflight/checks.py",
        "src/{package}/preflight_facts.py": "src/{package}/preflight/facts.py",
        "src/{package}/preflight_step.py": "src/{package}/preflight/step.py",
    },
    # The language model's families and adapters in models/ (torchtitan's models/<name>/), a
    # finished run's loader in inference/: the package's top holds 16 modules with chat.py.
    "0.6.0": {
        "src/{package}/llama.py": "src/{package}/models/llama.py",
        "src/{package}/lora.py": "src/{package}/models/lora.py",
        "src/{package}/packing.py": "src/{package}/models/packing.py",
        "src/{package}/trained.py": "src/{package}/inference/trained.py",
    },
}


def notes_between(old: Version, new: Version, notes: dict[str, str] | None = None) -> list[str]:
    """The notes of versions v with old < v <= new, oldest first, each prefixed with `v<v>: `."""
    table = NOTES if notes is None else notes
    versions = sorted(Version(v) for v in table)
    return [f"v{v}: {table[str(v)]}" for v in versions if old < v <= new]


def moves_between(
    old: Version,
    new: Version,
    package: str,
    moves: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, str]:
    """Where the files of version `old` went by version `new`: {old path: new path} for the
    moves of versions v with old < v <= new, applied oldest first, so a file moved twice maps
    to its last path. Paths are relative to the project, with "{package}" replaced by
    `package`."""
    table = MOVES if moves is None else moves
    found: dict[str, str] = {}
    for version in sorted(Version(v) for v in table):
        if not old < version <= new:
            continue
        for source, target in table[str(version)].items():
            source, target = (p.replace("{package}", package) for p in (source, target))
            moved_here = [before for before, after in found.items() if after == source]
            for before in moved_here or [source]:
                found[before] = target
    return found
