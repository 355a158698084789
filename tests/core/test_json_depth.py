"""The nesting depth measured on the JSON text equals the parsed document's (R-SEC-10)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from portable_ckpt.errors import JsonInvalidError
from portable_ckpt.format import jsonio
from tests.hardening._util import json_depth

_VALUES = st.recursive(
    st.one_of(st.integers(), st.booleans(), st.none(),
              st.text(alphabet='ab,[]{}:"\\ \n\u00e9', max_size=6)),
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(
        st.text(alphabet='k[]{}"\\', max_size=3), c, max_size=3)), max_leaves=40)


@settings(max_examples=300, deadline=None)
@given(_VALUES, st.sampled_from([None, 2]), st.sampled_from([1, 2, 5, 64, 1 << 20]))
def test_text_depth_equals_the_parsed_depth(value: Any, indent: int | None, chunk: int) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=False).encode()
    assert jsonio.text_depth(text, chunk=chunk) == json_depth(value)


@pytest.mark.parametrize("depth", [jsonio.MAX_DEPTH, jsonio.MAX_DEPTH + 1])
def test_depth_limit_on_the_text(depth: int) -> None:
    doc = b"[" * depth + b'"]]}{["' + b"]" * depth  # brackets inside a string do not count
    if depth <= jsonio.MAX_DEPTH:
        assert json_depth(jsonio.loads(doc, what="d")) == depth
    else:
        with pytest.raises(JsonInvalidError, match="nesting deeper"):
            jsonio.loads(doc, what="d")


@pytest.mark.parametrize("depth", [jsonio.MAX_DEPTH, jsonio.MAX_DEPTH + 1])
@pytest.mark.parametrize("as_text", [False, True])
def test_depth_limit_of_mixed_brackets(depth: int, as_text: bool) -> None:
    """A small document is measured by counting its opening brackets, both kinds: half
    arrays, half objects, ``depth`` deep (a count of ``[`` alone passed 65 levels)."""
    doc = ""
    for level in range(depth):
        doc = f'{{"k":{doc or 0}}}' if level % 2 else f"[{doc or 0}]"
    data: str | bytes = doc if as_text else doc.encode()
    if depth <= jsonio.MAX_DEPTH:
        assert json_depth(jsonio.loads(data, what="d")) == depth
    else:
        with pytest.raises(JsonInvalidError, match="nesting deeper"):
            jsonio.loads(data, what="d")


def test_brackets_in_strings_past_the_limit_are_scanned_not_refused() -> None:
    """More than 64 opening brackets, all inside strings: the count says "maybe deep", the
    scan of the text says depth 1."""
    doc = json.dumps(["[{" * 40]).encode()
    assert jsonio.loads(doc, what="d") == ["[{" * 40]


@pytest.mark.parametrize("text", ['["\ud800"]', '{"a": "x\udcff"}', "\udfff"])
def test_a_str_with_a_lone_surrogate_is_invalid_json(text: str) -> None:
    """A str (not bytes) holding an unpaired surrogate code point: JsonInvalidError, not the
    UnicodeEncodeError of encoding it for the counts (re-attack 29)."""
    with pytest.raises(JsonInvalidError, match="cannot encode"):
        jsonio.loads(text, what="d")
