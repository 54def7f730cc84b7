"""Jinja compiles a template string that holds no Jinja once per process, not once per use.

copier renders every part of every template path (`src`, `tests`, `train.py`, ...) and most of
its question settings through `Environment.from_string`, and each copier run builds a new
environment, so the same few hundred strings are parsed, turned into Python and compiled again
for each of the five renders a `scaffold update` makes. Measured: 546 of a render's 631
from_string calls are plain text; compiling them once took the clean-update test from ~5.1 s
to ~3.9 s. Such a string's compiled module is `yield <the string>` whatever the
environment's filters, tests or globals, so one code object serves every environment of its
class (Jinja's own `BytecodeCache` shares code objects between environments the same way,
keyed by template name and source only).

What a compile also does is kept: the extensions' `preprocess` hooks still run on every use
(copier's `{% yield %}` extension resets its per-path state there).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import CodeType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jinja2

# (environment class, async, source, name, filename, defer_init) -> the code compiled for it.
COMPILED: dict[tuple[Any, ...], CodeType] = {}


def is_literal(environment: jinja2.Environment, source: object) -> bool:
    """Whether `source` renders to itself in `environment`: a one-line string without any of
    its delimiters (block, variable, comment, line statement or line comment)."""
    if not isinstance(source, str) or "\n" in source or "\r" in source:
        return False
    delimiters = (
        environment.block_start_string,
        environment.variable_start_string,
        environment.comment_start_string,
        environment.line_statement_prefix,
        environment.line_comment_prefix,
    )
    return not any(delimiter and delimiter in source for delimiter in delimiters)


@contextlib.contextmanager
def literal_templates_compiled_once() -> Iterator[None]:
    """Within the block, `jinja2.Environment.compile` keeps the code object of each literal
    string (`is_literal`) and hands it to every later compile of the same string, name and
    file in an environment of the same class and mode (for the rest of the process: `COMPILED`);
    anything else compiles as before."""
    import jinja2  # deferred, as copier is (scaffold.copier_runs)

    compile_anew = jinja2.Environment.compile

    def compile_once(
        self: jinja2.Environment,
        source: Any,
        name: str | None = None,
        filename: str | None = None,
        raw: bool = False,
        defer_init: bool = False,
    ) -> Any:
        if raw or not is_literal(self, source):
            return compile_anew(self, source, name, filename, raw, defer_init)
        key = (type(self), self.is_async, source, name, filename, defer_init)
        if key in COMPILED:
            self.preprocess(source, name, filename)
        else:
            COMPILED[key] = compile_anew(self, source, name, filename, raw, defer_init)
        return COMPILED[key]

    jinja2.Environment.compile = compile_once
    try:
        yield
    finally:
        jinja2.Environment.compile = compile_anew
