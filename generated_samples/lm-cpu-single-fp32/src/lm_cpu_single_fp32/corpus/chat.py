"""Chat and instruction records as token ids with a loss mask: what is trained of each example.

A record is a JSON line or parquet row holding either
- `messages`: `[{"role": ..., "content": ...}, ...]`, the format of transformers' chat templates
  and of the OpenAI API (roles: ROLES). The tokenizer's chat template renders it to text, as
  transformers' `apply_chat_template` does (`ChatTemplate`); the assistant's replies, each with
  the end-of-turn text the template puts after it, are trained;
- or `prompt` and `completion` strings: the text is the prompt followed by the completion and
  then the end-of-text token; the completion and the end-of-text token are trained.

Which tokens are trained is found in characters, then mapped onto tokens (`token_mask`): the
span of reply i is what rendering the first i + 1 messages adds to rendering the first i with
the generation prompt (the template's own header of an assistant turn). A template that does not
render a conversation prefix by prefix (one that rewrites earlier turns once a later one
exists) is refused, since the spans would not be the replies.

Nothing here imports torch: prepare's processes import it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from .documents import JSON_TYPES, BadRecord
from .shards import Codec
from .sources import open_source, source_kind

ROLES = ("system", "user", "assistant", "tool")
FORMATS = ("text", "chat", "completion")  # what a prepare's records are: `--format`
TEMPLATE_FILE = "chat_template.jinja"  # where transformers >= 4.43 saves a chat template
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")
PARQUET_BATCH_ROWS = 256


def template_beside(tokenizer_file: Path) -> Path | None:
    """The file that holds the chat template of the tokenizer.json `tokenizer_file`: the
    chat_template.jinja beside it, else its tokenizer_config.json when that has a
    `chat_template`; None where neither does."""
    folder = tokenizer_file.parent
    if (folder / TEMPLATE_FILE).is_file():
        return folder / TEMPLATE_FILE
    config = read_tokenizer_config(folder)
    return folder / TOKENIZER_CONFIG if config.get("chat_template") else None


def read_tokenizer_config(folder: Path) -> dict[str, Any]:
    """`folder`'s tokenizer_config.json ({} where there is none or it is not a JSON object)."""
    try:
        config = json.loads((folder / TOKENIZER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def token_text(value: object) -> str | None:
    """A special token's text as tokenizer_config.json holds it: a string, or (older files) an
    object with its `content`."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template and the special tokens it may name (`bos_token`, `eos_token`...),
    rendered as transformers renders one: a sandboxed environment with `trim_blocks` and
    `lstrip_blocks`, loop controls, a `tojson` filter that leaves non-ASCII as it is, and the
    `raise_exception` and `strftime_now` functions (transformers' chat_template_utils.py)."""

    source: str
    special_tokens: tuple[tuple[str, str], ...] = ()

    @classmethod
    def load(cls, path: Path, tokenizer_config: dict[str, Any] | None = None) -> ChatTemplate:
        """The template in `path`: a .jinja file, or a tokenizer_config.json's `chat_template`
        (its "default" one where it lists several); the special tokens from
        `tokenizer_config` (default: the tokenizer_config.json beside `path`).

        Raises:
            ValueError: no such file, or no chat template in it.
        """
        if not path.is_file():
            raise ValueError(f"chat template {path}: no such file")
        config = (
            read_tokenizer_config(path.parent) if tokenizer_config is None else tokenizer_config
        )
        if path.suffix == ".json":
            source = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
            if isinstance(source, list):  # [{"name": ..., "template": ...}]
                named = {entry.get("name"): entry.get("template") for entry in source}
                source = named.get("default")
            if not isinstance(source, str):
                raise ValueError(f"{path} holds no chat_template; name a .jinja file instead")
        else:
            source = path.read_text(encoding="utf-8")
        tokens = ((name, token_text(config.get(name))) for name in SPECIAL_TOKENS)
        return cls(source, tuple((name, text) for name, text in tokens if text is not None))

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
        """The text of a conversation (`add_generation_prompt`: followed by the header of the
        assistant's next turn).

        Raises:
            ValueError: the template raised an error (its `raise_exception`) or is not valid
                Jinja.
        """
        import jinja2

        try:
            return compiled(self.source).render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                tools=None,
                documents=None,
                **dict(self.special_tokens),
            )
        except jinja2.TemplateError as error:
            raise ValueError(f"the chat template refused it: {error}") from None

    def reply_spans(self, messages: list[dict[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
        """The conversation's text and the character spans `[start, end)` of its assistant
        replies in it (module docstring).

        Raises:
            ValueError: the template does not render the conversation prefix by prefix.
        """
        text = self.render(messages)
        spans = []
        for index, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self.render(messages[:index], add_generation_prompt=True)
            through = self.render(messages[: index + 1])
            if not (through.startswith(before) and text.startswith(through)):
                raise ValueError(
                    "the chat template does not render a conversation prefix by prefix (turn "
                    f"{index} changes the text before it), so its replies cannot be found; give "
                    "one that does with --chat-template FILE"
                )
            spans.append((len(before), len(through)))
        return text, spans


@functools.cache
def compiled(source: str) -> Any:
    """The jinja2 Template of a chat template's `source`, compiled once per process."""
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """The `generation` block some templates wrap replies in for transformers' assistant
        mask: rendered as its body (the spans are found by prefix)."""

        tags = {"generation"}

        def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
            line = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body).set_lineno(line)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols]
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    try:
        return environment.from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"the chat template is not valid Jinja ({error})") from None


def token_mask(ends: list[int], spans: list[tuple[int, int]]) -> np.ndarray:
    """uint8 `[tokens]`: 1 for a token whose last character lies in one of `spans` (character
    ranges `[start, end)`), given each token's end offset in characters (`ends`)."""
    last = np.asarray(ends, dtype=np.int64) - 1
    mask = np.zeros(len(ends), dtype=np.uint8)
    for start, end in spans:
        mask[(last >= start) & (last < end)] = 1
    return mask


def record_problem(value: object, format: str) -> str | None:
    """Why a parsed record is not one of `format` ("chat" or "completion"), in words; None when
    it is one. A chat record's `messages` must hold an assistant reply and end with one: a
    trailing user (or system, or tool) turn would be encoded with nothing after it trained."""
    if not isinstance(value, dict):
        return f"a JSON {JSON_TYPES.get(type(value), 'value')}, not an object"
    if format == "completion":
        for key in ("prompt", "completion"):
            if not isinstance(value.get(key), str):
                fields = ", ".join(list(value)[:8]) or "none"
                return f"no {key!r} string (it has: {fields}); --format completion needs both"
        return None
    messages = value.get("messages")
    if not isinstance(messages, list) or not messages:
        fields = ", ".join(list(value)[:8]) or "none"
        return f"no 'messages' list (it has: {fields}); --format chat reads messages"
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            return f"message {index} is not an object with a 'content' string"
        if message.get("role") not in ROLES:
            return (
                f"message {index} has role {message.get('role')!r}, not one of {', '.join(ROLES)}"
            )
    if not any(message["role"] == "assistant" for message in messages):
        return "no assistant message: nothing in it would be trained"
    if messages[-1]["role"] != "assistant":
        return (
            f"its last message is a {messages[-1]['role']} turn with no reply after it to "
            "train; end the conversation with the assistant's reply, or drop that turn"
        )
    return None


def read_records(path: Path, format: str) -> Iterator[tuple[int, dict[str, Any] | BadRecord]]:
    """(number, record) for each line of a .jsonl source or row of a parquet one, in order
    (lines and rows numbered from 0, blank lines skipped but counted); a record that is not one
    of `format` is a BadRecord saying why.

    Raises:
        ValueError: a source that is neither JSON lines nor parquet.
    """
    kind = source_kind(path)
    if kind == "parquet":
        yield from parquet_records(path, format)
        return
    if kind != "jsonl":
        raise ValueError(f"{path}: --format {format} reads .jsonl or .parquet records, not text")
    with open_source(path) as stream:
        for number, line in enumerate(stream):
            if not line.strip():
                continue
            try:
                value = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as error:
                yield number, BadRecord(number, f"not JSON ({error})")
                continue
            problem = record_problem(value, format)
            yield number, BadRecord(number, problem) if problem else value


def parquet_records(path: Path, format: str) -> Iterator[tuple[int, dict[str, Any] | BadRecord]]:
    """`read_records` of a parquet file: its `messages` column, or `prompt` and `completion`."""
    import pyarrow.parquet as pq  # only where a parquet source is read

    table = pq.ParquetFile(path)
    wanted = ["prompt", "completion"] if format == "completion" else ["messages"]
    missing = [name for name in wanted if name not in table.schema_arrow.names]
    if missing:
        has = ", ".join(table.schema_arrow.names[:8])
        raise ValueError(f"{path} has no {', '.join(missing)} column (it has: {has})")
    number = 0
    for batch in table.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=wanted):
        for value in batch.to_pylist():
            problem = record_problem(value, format)
            yield number, BadRecord(number, problem) if problem else value
            number += 1


def encode_example(
    record: dict[str, Any], format: str, codec: Codec, template: ChatTemplate | None
) -> tuple[np.ndarray, np.ndarray]:
    """The token ids (int64) and the loss mask (uint8, 1: trained) of one record.

    Raises:
        ValueError: a chat record without a template, or one the template refuses.
    """
    if format == "completion":
        text = record["prompt"] + record["completion"]
        spans = [(len(record["prompt"]), len(text))]
        ids, ends = codec.encode_with_ends(text)
        ids, mask = ids + [codec.eot_id], np.append(token_mask(ends, spans), 1)
        return np.asarray(ids, dtype=np.int64), mask.astype(np.uint8)
    if template is None:
        raise ValueError("chat records need the tokenizer's chat template")
    text, spans = template.reply_spans([dict(message) for message in record["messages"]])
    ids, ends = codec.encode_with_ends(text)
    return np.asarray(ids, dtype=np.int64), token_mask(ends, spans)
