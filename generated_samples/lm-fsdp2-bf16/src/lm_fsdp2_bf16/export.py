"""Write a run's model as a Hugging Face folder: `python -m lm_fsdp2_bf16.export OUT`.

Writes OUT from the run's best weights (`model.safetensors`; `--weights model-last.safetensors`
for the final step's, or a path), which every strategy's run writes as one file when it ends,
or from any checkpoint (`--checkpoint runs/<run>/checkpoints/step-N`, any strategy's format
written at any number of processes: loaded here as a resume on one CPU process would load it):
config.json, the weights under transformers' names (sharded above `--max-shard-size`, as
transformers shards), generation_config.json (its `eos_token_id` ends a reply at the end of text
and at the chat template's end of turn) and the run's tokenizer with its chat template. Then

    AutoModelForCausalLM.from_pretrained(OUT), AutoTokenizer.from_pretrained(OUT)

load it with no custom code, and `vllm serve OUT` serves it. Runs on a CPU-only machine, in
the memory of one shard (`--max-shard-size`, 2 GiB: safetensors writes a file whole).

A LoRA run (`finetune = "lora"`) exports its adapters in PEFT's format (adapter_config.json,
adapter_model.safetensors), which `PeftModel.from_pretrained(base, OUT)` loads onto the model
`init_from` names; `--merge` writes the merged model instead, as above (it holds the whole
model once). The tokenizer files go beside the adapters too.
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
from pathlib import Path

from safetensors.torch import load_file, save_file

from .checkpoint import WEIGHTS_FILE
from .config import command_parser, load_config, user_errors
from .corpus import TOKENIZER_FILE
from .hub import export_folder
from .hub.export_folder import (
    DEFAULT_SHARD_BYTES,
    TOKENIZER_CONFIG,
    export_dtype,
    write_tokenizer,
)
from .inference import run_config, run_weights
from .inference.sources import checkpoint_weights, end_of_turn_ids, run_codec, run_template
from .model import model_architecture
from .models import adapter_state, base_name, merged_state, write_adapter

SIZE_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    """Bytes of a size as transformers writes `max_shard_size` ("5GB", "500MB", "2GiB", or a
    number of bytes).

    Raises:
        ValueError: anything else.
    """
    upper = text.strip().upper()
    for unit, factor in sorted(SIZE_UNITS.items(), key=lambda item: -len(item[0])):
        if upper.endswith(unit) and upper[: -len(unit)].replace(".", "", 1).isdigit():
            return int(float(upper[: -len(unit)]) * factor)
    if upper.isdigit() and int(upper) > 0:
        return int(upper)
    raise ValueError(f"--max-shard-size {text!r} is not a size such as 5GB, 500MB or 2GiB")


def main(argv: list[str] | None = None) -> list[Path]:
    """Entry point; prints the folder written and returns its files."""
    parser = command_parser(__doc__.splitlines()[0])
    parser.add_argument("out", help="the folder to write (new, or empty)")
    parser.add_argument("--run-dir", help="the trained run (default: configs/train.toml's)")
    parser.add_argument("--weights", default=WEIGHTS_FILE, help="a weights file of the run")
    parser.add_argument("--checkpoint", help="a checkpoint folder of the run instead")
    parser.add_argument(
        "--dtype", default="float32", help="the weights' dtype: float32, or a 16-bit one of torch"
    )
    parser.add_argument(
        "--merge", action="store_true", help="a LoRA run: the merged model, not the adapters"
    )
    parser.add_argument(
        "--max-shard-size",
        default=f"{DEFAULT_SHARD_BYTES // 2**30}GiB",
        help="the largest weights file, e.g. 5GB or 500MB (default 2GiB): what the export holds",
    )
    args = parser.parse_args(argv)
    with user_errors():
        max_shard_bytes = parse_size(args.max_shard_size)
        run_dir = Path(args.run_dir or load_config("configs/train.toml").run_dir)
        config = run_config(run_dir)
        architecture = model_architecture(config)
        codec = run_codec(run_dir, config)
        tokenizer, eot, original = None, None, None
        if codec.tokenizer is not None:
            tokenizer = run_dir / TOKENIZER_FILE
            eot = codec.tokenizer.id_to_token(codec.eot_id)
        if config.init_from:
            original = Path(config.init_from) / TOKENIZER_CONFIG
        if architecture.eos_token_id is None:
            architecture = dataclasses.replace(architecture, eos_token_id=codec.eot_id)
        template = run_template(run_dir, config)
        turn_ends = end_of_turn_ids(template, codec) if template else []
        stop_ids = tuple(dict.fromkeys([codec.eot_id, *turn_ends]))
        template_source = template.source if template else None
        tokenizer_files = None
        if tokenizer is not None:
            tokenizer_files = functools.partial(
                write_tokenizer,
                architecture=architecture,
                tokenizer=tokenizer,
                eot=eot,
                original_tokenizer_config=original,
                chat_template=template_source,
            )
        if args.merge and config.finetune != "lora":
            raise ValueError(
                f"--merge folds LoRA adapters in, and {run_dir} trained every weight; leave "
                "--merge out"
            )
        with tempfile.TemporaryDirectory() as scratch:
            if args.checkpoint:
                weights = checkpoint_weights(config, Path(args.checkpoint), Path(scratch) / "w")
            else:
                weights = run_weights(run_dir, args.weights)
            if config.finetune == "lora":
                adapted = load_file(weights)
                adapters = adapter_state(adapted)
                if not args.merge:
                    files = write_adapter(
                        adapters, config, Path(args.out), export_dtype(args.dtype), tokenizer_files
                    )
                    print(f"wrote {args.out}: {', '.join(path.name for path in files)}")
                    return files
                base = {
                    base_name(key): value for key, value in adapted.items() if key not in adapters
                }
                merged = merged_state(base, adapters, config.lora_alpha, config.lora_rank)
                weights = Path(scratch) / "merged.safetensors"
                save_file(merged, weights)
            files = export_folder(
                weights,
                architecture,
                Path(args.out),
                tokenizer,
                eot,
                original,
                args.dtype,
                max_shard_bytes,
                template_source,
                stop_ids,
            )
    tokenizer_note = "" if tokenizer else " (byte tokens: no tokenizer.json to ship)"
    print(f"wrote {args.out}: {', '.join(path.name for path in files)}{tokenizer_note}")
    return files


if __name__ == "__main__":
    main()
