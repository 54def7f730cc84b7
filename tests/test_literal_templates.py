"""Plain-text template strings compile once per process (scaffold.literal_templates); the
samples' sync test (tests/test_samples.py) checks whole renders through it."""

from __future__ import annotations

import jinja2
import pytest
from jinja2.ext import Extension

from scaffold.literal_templates import COMPILED, is_literal, literal_templates_compiled_once


class CountsPreprocessing(Extension):
    """Counts the calls of its `preprocess` hook, as copier's yield extension resets its state
    there."""

    calls = 0

    def preprocess(self, source, name, filename=None):
        CountsPreprocessing.calls += 1
        return source


@pytest.mark.parametrize(
    ("source", "literal"),
    [
        ("train.py", True),
        ("src", True),
        ("{{ package_name }}", False),
        ("{% if x %}a{% endif %}", False),
        ("a {# note #}", False),
        ("two\nlines", False),
    ],
)
def test_only_one_line_text_without_delimiters_is_literal(source, literal):
    assert is_literal(jinja2.Environment(), source) is literal


def test_a_line_comment_prefix_makes_its_text_not_literal():
    assert not is_literal(jinja2.Environment(line_comment_prefix="##"), "a ## b")


def test_a_literal_compiles_once_across_environments_and_still_preprocesses():
    source = "a-literal-only-this-test-uses.py"
    CountsPreprocessing.calls = 0
    with literal_templates_compiled_once():
        first = jinja2.Environment(extensions=[CountsPreprocessing])
        second = jinja2.Environment(extensions=[CountsPreprocessing])
        rendered = [env.from_string(source).render(x=1) for env in (first, second, second)]
        code = [key for key in COMPILED if source in key]
        templated = [second.from_string("{{ x }}-" + source).render(x=n) for n in (1, 2)]
    assert rendered == [source] * 3
    assert len(code) == 1, "one code object for every environment"
    assert CountsPreprocessing.calls == 5, "the hooks ran for each of the 5 compiles"
    assert templated == [f"1-{source}", f"2-{source}"]
    assert not [key for key in COMPILED if "{{ x }}" in key[2]], "templates compile each time"


def test_outside_the_block_jinja_compiles_as_it_always_did():
    original = jinja2.Environment.compile
    with literal_templates_compiled_once():
        assert jinja2.Environment.compile is not original
    assert jinja2.Environment.compile is original
