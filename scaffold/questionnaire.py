"""The interactive questions (questionary). Each has a non-interactive twin: `--data KEY=VALUE`
answers it, `--defaults` takes its default.

Every answer is checked when it is given, against the answers so far (`answer_rules.check`): a
choice that cannot work is shown as not available, with the reason, and a typed answer that
cannot is refused under the prompt. The strategy question shows, for each choice, the
micro-batch the plan would use and what it needs per device, and what `auto` picks. `scaffold
new` prints the plan once, after the last answer.

Going back: every question after the first has a `← back` choice (a select) or takes `<` (a
typed answer); it returns to the previous question, offering the answer given there.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Mapping
from typing import Any

import questionary

from scaffold.answer_rules import check, gains_nothing_on_one_process, partial_answers
from scaffold.answers import (
    QUESTION_BY_KEY,
    QUESTIONS,
    AnswerError,
    Question,
    coerce,
    package_name_for,
)
from scaffold.memory import gib
from scaffold.planner import plan

BACK = "<"  # typed at a text prompt; also the value of the `← back` choice
BACK_TITLE = "← back"
# Said once, at the first question asked: how to go back from the later ones.
FIRST_INSTRUCTION = {
    "select": "(arrow keys; later questions have '← back' to return to the previous one)",
    "text": "(later, '← back' in a list or < typed goes back to the previous question)",
}


def ask(answered: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Ask every question not in `answered`, offering `defaults`; return the new answers.

    The user can go back to the previous question (see the module's docstring); its answer is
    then offered as the default, and every later question is asked again.

    Raises:
        AnswerError: a value in `answered` is invalid, or cannot work with the others.
        KeyboardInterrupt: the user pressed Ctrl-C (nothing has been written yet).
    """
    known = {key: coerce(QUESTION_BY_KEY[key], value) for key, value in answered.items()}
    if "project_name" in known:
        package_name_for(known["project_name"])
    check(known)
    pending = [question for question in QUESTIONS if question.key not in answered]
    answers: dict[str, Any] = {}
    given: dict[str, Any] = {}  # answers taken back, offered again as defaults
    asked: list[int] = []  # indexes into `pending`, in the order they were answered
    index = 0
    while index < len(pending):
        question = pending[index]
        if not question.asked({**defaults, **known}):
            index += 1
            continue
        default = given.get(question.key, defaults.get(question.key, question.default))
        value = _ask_one(question, default, known, first=not asked)
        if value == BACK and asked:
            index = asked.pop()
            key = pending[index].key
            given[key] = answers.pop(key)
            del known[key]
            continue
        answers[question.key] = known[question.key] = value
        asked.append(index)
        index += 1
    return answers


def unavailable(question: Question, value: Any, known: Mapping[str, Any]) -> str | None:
    """Why `value` cannot be answered to `question` after the answers `known`, or None. The
    strategy, the last answer the plan depends on, is planned whole: `auto` is refused when
    what it would pick cannot be rendered."""
    try:
        check({**known, question.key: value})
        if question.key == "strategy":
            plan(partial_answers({**known, question.key: value}))
    except AnswerError as error:
        return str(error)
    return None


def strategy_title(value: str, known: Mapping[str, Any]) -> str:
    """A strategy choice, as a row under `strategy_instruction`: the micro-batch (and activation
    checkpointing) its plan uses and what that needs per device, and for `auto` the strategy it
    picks; then why it may not be the one to choose: it does not fit (or barely), or one
    process gains nothing from it."""
    try:
        result = plan(partial_answers({**known, "strategy": value}))
    except AnswerError:
        return value
    settings = result.settings
    checkpointing = " + checkpointing" if settings["activation_checkpointing"].value else ""
    batch = f"micro-batch {settings['micro_batch_size'].value}{checkpointing}"
    picked = f"{result.answers.strategy}: " if value == "auto" else ""
    notes = [result.memory_verdict()]
    if gains_nothing_on_one_process(result.answers):
        notes.append("1 process: adds nothing")
    shown = "".join(f"; {note}" for note in notes if note)
    width = max(len(choice) for choice in QUESTION_BY_KEY["strategy"].choices)
    return f"{value:<{width}}  {picked}{batch}, ~{gib(result.estimate.peak)} GiB{shown}"


def strategy_instruction(known: Mapping[str, Any]) -> str:
    """The strategy question's header for `strategy_title`'s rows: per device, and the usable
    memory they compare with."""
    try:
        usable = plan(partial_answers({**known, "strategy": "auto"})).usable
    except AnswerError:
        usable = 0
    of = f" of {gib(usable)} usable" if usable else ""
    return f"(per device: micro-batch, GiB needed{of})"


def _ask_one(question: Question, default: Any, known: Mapping[str, Any], first: bool) -> Any:
    """The answer to `question`, typed as `coerce` types it, or BACK."""
    back = [] if first else [questionary.Choice(BACK_TITLE, value=BACK)]
    instruction = FIRST_INSTRUCTION["select"] if first else None
    if question.kind is bool:
        choices = [questionary.Choice("no", value=False), questionary.Choice("yes", value=True)]
        return questionary.select(
            question.prompt_for(known),
            choices=choices + back,
            default=choices[bool(default)],
            instruction=instruction,
        ).unsafe_ask()
    if question.choices:
        return _select(question, default, known, back, instruction)
    if default is None or (question.positive and not default):
        default = ""  # nothing to offer: a probe that found no GPU gives 0, which is refused
    return _ask_text(question, str(default), known, first)


def _ask_text(question: Question, default: str, known: Mapping[str, Any], first: bool) -> Any:
    """A typed answer, refused until it can work. The refusal is shown under the prompt while
    the answer is typed, in the one line prompt_toolkit gives it; one longer than the terminal
    is wide would lose its end, which says what to answer, so it is printed whole once Enter
    is pressed, and the question is asked again with the typed answer."""
    width = shutil.get_terminal_size().columns

    def under_the_prompt(text: str) -> bool | str:
        refusal = _refusal(question, text, known, first)
        return True if refusal is None or len(refusal) >= width else refusal

    while True:
        typed = questionary.text(
            question.prompt_for(known),
            default=default,
            validate=under_the_prompt,
            instruction=FIRST_INSTRUCTION["text"] if first else None,
        ).unsafe_ask()
        refusal = _refusal(question, typed, known, first)
        if refusal is None:
            return BACK if typed.strip() == BACK else coerce(question, typed)
        print(textwrap.fill(refusal, width, initial_indent="  ! ", subsequent_indent="    "))
        default = typed


def _select(
    question: Question,
    default: Any,
    known: Mapping[str, Any],
    back: list[questionary.Choice],
    instruction: str | None,
) -> Any:
    """A select question; a choice that cannot work is listed, not selectable, with why."""
    choices = []
    for value in question.choices_for(known):
        reason = unavailable(question, value, known)
        title = strategy_title(value, known) if question.key == "strategy" else value
        # The reason's first clause: a menu line is cut at the terminal's width.
        why = reason and f"not available: {reason.split('; ')[0]}"
        choices.append(questionary.Choice(title, value=value, disabled=why))
    enabled = [choice.value for choice in choices if not choice.disabled]
    if not enabled and not back:
        raise AnswerError(f"no {question.key} can work with the answers so far; start over")
    start = default if default in enabled else (enabled or [BACK])[0]
    if question.key == "strategy" and not instruction:
        instruction = strategy_instruction(known)
    return questionary.select(
        question.prompt_for(known), choices=choices + back, default=start, instruction=instruction
    ).unsafe_ask()


def _refusal(question: Question, text: str, known: Mapping[str, Any], first: bool) -> str | None:
    """Why `text` cannot be the answer to `question` after the answers `known`, or None."""
    if text.strip() == BACK:
        return None if not first else "this is the first question; there is none to go back to"
    try:
        if question.key == "project_name":
            package_name_for(text)
            return None
        check({**known, question.key: coerce(question, text)})
    except AnswerError as error:
        return str(error)
    return None
