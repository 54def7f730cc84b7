"""The interactive questions (questionary). Each has a non-interactive twin: `--data KEY=VALUE`
answers it, `--defaults` takes its default.

Every answer is checked when it is given, against the answers so far (`planner.check`): a choice
that cannot work is shown disabled with the reason, and a typed answer that cannot is refused
under the prompt. The strategy question shows what each choice needs per device and what `auto`
picks; once it is answered, the whole plan is shown.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import questionary

from scaffold.answers import (
    QUESTION_BY_KEY,
    QUESTIONS,
    AnswerError,
    Question,
    coerce,
    package_name_for,
)
from scaffold.memory import gib
from scaffold.planner import check, partial_answers, plan


def ask(answered: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Ask every question not in `answered`, offering `defaults`; return the new answers.

    Raises:
        AnswerError: a value in `answered` is invalid, or cannot work with the others.
        KeyboardInterrupt: the user pressed Ctrl-C (nothing has been written yet).
    """
    known = {key: coerce(QUESTION_BY_KEY[key], value) for key, value in answered.items()}
    if "project_name" in known:
        package_name_for(known["project_name"])
    check(known)
    answers: dict[str, Any] = {}
    for question in QUESTIONS:
        if question.key in answered:
            continue
        if question.only_for_cuda and known.get("hardware", defaults.get("hardware")) != "cuda":
            continue
        default = defaults.get(question.key, question.default)
        answers[question.key] = known[question.key] = _ask_one(question, default, known)
        if question.key == "strategy":
            planned = plan(partial_answers(known))
            for line in planned.describe():
                questionary.print(line, style="fg:ansiblue")
            for line in planned.warnings:
                questionary.print(f"  warning: {line}", style="fg:ansiyellow")
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
    """A strategy choice with what it needs per device: for `auto`, the strategy it picks."""
    try:
        result = plan(partial_answers({**known, "strategy": value}))
    except AnswerError:
        return value
    peak = f"~{gib(result.estimate.peak)} GiB per device"
    usable = f" of {gib(result.usable)} usable" if result.usable else ""
    risky = " (may run out of memory)" if result.warnings and result.usable else ""
    picked = f"{result.answers.strategy}, " if value == "auto" else ""
    return f"{value}  [{picked}{peak}{usable}{risky}]"


def _ask_one(question: Question, default: Any, known: Mapping[str, Any]) -> Any:
    if question.kind is bool:
        return questionary.confirm(question.prompt, default=bool(default)).unsafe_ask()
    if question.choices:
        reasons = {value: unavailable(question, value, known) for value in question.choices}
        for value, reason in reasons.items():  # whole, where the menu line would cut it short
            if reason:
                questionary.print(f"  {value} cannot be chosen: {reason}", style="fg:ansiyellow")
        choices = [
            questionary.Choice(
                strategy_title(value, known) if question.key == "strategy" else value,
                value=value,
                disabled=reasons[value] and "cannot be chosen: see above",
            )
            for value in question.choices
        ]
        enabled = [choice.value for choice in choices if not choice.disabled]
        if not enabled:
            raise AnswerError(f"no {question.key} can work with the answers so far; start over")
        start = default if default in enabled else enabled[0]
        return questionary.select(question.prompt, choices=choices, default=start).unsafe_ask()
    typed = questionary.text(
        question.prompt,
        default="" if default is None else str(default),
        validate=lambda text: _validate(question, text, known),
    ).unsafe_ask()
    return coerce(question, typed)


def _validate(question: Question, text: str, known: Mapping[str, Any]) -> bool | str:
    """questionary's validator: True, or the error message shown under the prompt."""
    try:
        if question.key == "project_name":
            package_name_for(text)
            return True
        check({**known, question.key: coerce(question, text)})
    except AnswerError as error:
        return str(error)
    return True
