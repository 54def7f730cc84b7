"""The interactive questions (questionary). Each has a non-interactive twin: `--data KEY=VALUE`
answers it, `--defaults` takes its default. Values not renderable yet are shown but disabled."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import questionary

from scaffold.answers import (
    QUESTIONS,
    AnswerError,
    Question,
    coerce,
    framework_renders,
    package_name_for,
)


def ask(answered: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Ask every question not in `answered`, offering `defaults`; return the new answers.

    Raises:
        KeyboardInterrupt: the user pressed Ctrl-C (nothing has been written yet).
    """
    answers: dict[str, Any] = {}
    for question in QUESTIONS:
        if question.key in answered:
            continue
        hardware = answers.get("hardware", answered.get("hardware", defaults.get("hardware")))
        if question.only_for_cuda and hardware != "cuda":
            continue
        framework = answers.get("framework", answered.get("framework", "pytorch"))
        default = defaults.get(question.key, question.default)
        answers[question.key] = _ask_one(question, default, framework)
    return answers


def _unavailable(question: Question, value: str, framework: str) -> str | None:
    """Why `value` cannot be picked (shown beside it), or None if it can."""
    if not question.renders(value):
        return "not available yet"
    if not framework_renders(framework, question.key, value):
        return f"not with {framework} yet"
    return None


def _ask_one(question: Question, default: Any, framework: str) -> Any:
    if question.kind is bool:
        return questionary.confirm(question.prompt, default=bool(default)).unsafe_ask()
    if question.choices:
        choices = [
            questionary.Choice(
                value,
                value=value,
                disabled=_unavailable(question, value, framework),
            )
            for value in question.choices
        ]
        return questionary.select(question.prompt, choices=choices, default=default).unsafe_ask()
    return questionary.text(
        question.prompt,
        default="" if default is None else str(default),
        validate=lambda text: _validate(question, text),
    ).unsafe_ask()


def _validate(question: Question, text: str) -> bool | str:
    """questionary's validator: True, or the error message shown under the prompt."""
    try:
        if question.key == "project_name":
            package_name_for(text)
        else:
            coerce(question, text)
    except AnswerError as error:
        return str(error)
    return True
