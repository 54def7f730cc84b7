"""Talk with a trained model: `python -m lm_cpu_single_fp32.chat [--message TEXT] [options]`.

A conversation in the terminal through the model's chat template, the one its chat examples
were rendered with (prepare --format chat; the run keeps a copy, an export carries it): each
turn renders the conversation with the template's generation prompt and the reply streams as
it is sampled (generate's options; inference/decode.py, whose key-value cache keeps the
conversation so far), ending at the template's end of turn or the end of text. `--system`
starts it with a system prompt. Type /reset to start again, /exit (or Ctrl-D) to leave.
`--message TEXT` sends one message, prints the reply and exits (for scripts).

Reads a run (`--run-dir`, `--weights`, `--checkpoint`) or a Hugging Face model folder
(`--model`); `--chat-template FILE` talks through another template.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .config import command_parser, user_errors
from .generate import add_sampling_arguments, sampling_of
from .inference.decode import Decoder, Sampling
from .inference.sources import LanguageModel, add_source_arguments, load_language_model

COMMANDS = {"/reset": "start the conversation again", "/exit": "leave"}


class Conversation:
    """The messages so far (`[{"role": ..., "content": ...}]`) and the decoder whose cache
    holds them, for `used`'s model sampled as `sampling` says."""

    def __init__(self, used: LanguageModel, sampling: Sampling, device: torch.device, system: str):
        if used.template is None:
            raise ValueError(
                f"{used.source} has no chat template (it trained on text, not chat records): "
                "continue text with generate, or give a template with --chat-template FILE"
            )
        self.used, self.sampling, self.system = used, sampling, system
        self.decoder = Decoder(used.model, used.context, used.codec.vocab_size, device)
        self.generator = torch.Generator(device).manual_seed(sampling.seed)
        self.messages: list[dict[str, Any]] = []
        self.reset()

    def reset(self) -> None:
        """Forget every turn (the system prompt stays)."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def reply(self, message: str, max_new_tokens: int) -> Iterator[str]:
        """Send the user's `message`; yield the reply's text as it is sampled, piece by piece
        (whole characters only), and add the reply to the conversation once it ends.

        Raises:
            ValueError: the template refuses the conversation, or it fills the model's context
                (the message is then not kept).
        """
        if not message.strip():
            raise ValueError("the message is empty; say something")
        turn = [*self.messages, {"role": "user", "content": message}]
        text = self.used.template.render(turn, add_generation_prompt=True)
        prompt = self.used.codec.encode_batch([text])[0]
        stops = set(self.used.stop_ids)
        new = self.decoder.stream(prompt, max_new_tokens, self.sampling, stops, self.generator)
        ids, shown = [], ""
        for token in new:
            if token in stops:
                break
            ids.append(token)
            piece = self.used.codec.decode(ids)
            if not piece.endswith("\ufffd"):  # a character whose bytes have not all come yet
                yield piece[len(shown) :]
                shown = piece
        whole = self.used.codec.decode(ids)
        if whole != shown:
            yield whole[len(shown) :]
        self.messages = [*turn, {"role": "assistant", "content": whole}]


def talk(
    conversation: Conversation,
    max_new_tokens: int,
    read: Callable[[str], str] = input,
    write: Callable[[str], None] = lambda text: print(text, end="", flush=True),
) -> int:
    """The interactive loop: read a message, stream the reply, until /exit or end of input;
    returns the number of replies. A turn the model cannot take (a full context) is named in
    one line, and the conversation goes on."""
    replies = 0
    write(
        f"chatting with {conversation.used.source}; "
        + ", ".join(f"{name}: {what}" for name, what in COMMANDS.items())
        + "\n"
    )
    while True:
        try:
            message = read("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            write("\n")
            return replies
        if message == "/exit":
            return replies
        if message == "/reset":
            conversation.reset()
            write("(a new conversation)\n")
            continue
        if not message:
            continue
        try:
            for piece in conversation.reply(message, max_new_tokens):
                write(piece)
        except ValueError as error:
            write(f"error: {error}; /reset to start again\n")
            continue
        write("\n")
        replies += 1


def main(argv: list[str] | None = None) -> str | int:
    """Entry point: with `--message`, prints the reply and returns it; else the conversation,
    returning the number of replies."""
    parser = command_parser(__doc__.splitlines()[0])
    parser.add_argument("--message", help="send one message, print the reply, exit")
    parser.add_argument("--system", default="", help="a system prompt that starts the conversation")
    add_source_arguments(parser)
    add_sampling_arguments(parser)
    args = parser.parse_args(argv)
    with user_errors():
        sampling, device = sampling_of(args)
        used = load_language_model(args, device)
        conversation = Conversation(used, sampling, device, args.system)
        if args.message is not None:
            reply = ""
            for piece in conversation.reply(args.message, args.max_new_tokens):
                reply += piece
                print(piece, end="", flush=True)
            print()
            return reply
    if not sys.stdin.isatty():
        return talk(conversation, args.max_new_tokens, read=lambda _: next_line())
    return talk(conversation, args.max_new_tokens)


def next_line() -> str:
    """The next line of a piped stdin (no prompt echoed).

    Raises:
        EOFError: at its end.
    """
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line


if __name__ == "__main__":
    main()
