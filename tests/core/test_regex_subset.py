"""Schema patterns (spec §18.7, R-SEC-14, R-ENTRY-15): both RE2 rewrites against an ECMA-262 model.

Patterns are generated as syntax trees and rendered twice: as ECMA-262 text (the input of the
reference reader's ``format/regex.py`` and of the conformance checker's ``conformance/regex.py``)
and as a Python ``re`` pattern with ECMA-262 ``u``-flag semantics spelled out (``$`` → ``\\Z``,
``.`` without line terminators, ``\\s`` as ECMA-262 white space, ASCII ``\\d``/``\\w``/``\\b``).
On every generated string the three must agree.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from conformance import regex as checker_regex
from portable_ckpt.format import regex as reader_regex

_ECMA_WS = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_ECMA_DOT = "[^\n\r\u2028\u2029]"
ALPHABET = "ab_-/.9 \n\r\t\v\u00a0\u2028é😀"

# A syntax tree is a tuple (kind, ...); render() gives (ECMA-262 text, Python-re oracle text).
_LITERALS = ["a", "b", "_", "-", "/", "9", " ", "é", "😀", r"\.", r"\-", r"\/", r"\u00e9",
             r"\ud83d\ude00", r"\x61", r"\u{1F600}", r"\t", r"\n", r"\v"]
_ORACLE_LIT = {r"\.": r"\.", r"\-": r"\-", r"\/": "/", r"\u00e9": "é", r"\ud83d\ude00": "😀",
               r"\x61": "a", r"\u{1F600}": "😀", r"\t": r"\t", r"\n": r"\n", r"\v": r"\v",
               "😀": "😀"}
_CLASS_ITEMS = ["a", "b", "_", r"\-", "é", "a-z", "0-9", r"\d", r"\w", r"\s", r"\u00e9", r"\n",
                ".", r"\b"]
_ORACLE_CLASS = {r"\d": "0-9", r"\w": "A-Za-z0-9_", r"\s": _ECMA_WS, r"\u00e9": "é",
                 r"\n": r"\n", ".": r"\.", r"\-": r"\-", r"\b": r"\x08"}
# ECMA-262 IsWordChar on both sides (Python's \B never matches an empty string; ECMA's does).
_W = "[A-Za-z0-9_]"
_BOUNDARY = f"(?:(?<={_W})(?!{_W})|(?<!{_W})(?={_W}))"
_NOT_BOUNDARY = f"(?:(?<={_W})(?={_W})|(?<!{_W})(?!{_W}))"
_ESCAPES = {r"\d": "[0-9]", r"\D": "[^0-9]", r"\w": "[A-Za-z0-9_]", r"\W": "[^A-Za-z0-9_]",
            r"\s": f"[{_ECMA_WS}]", r"\S": f"[^{_ECMA_WS}]"}


def _render(node: Any, names: list[int] | None = None) -> tuple[str, str]:
    names = [0] if names is None else names  # group names must be unique (g0, g1, ...)
    kind = node[0]
    if kind == "lit":
        return node[1], _ORACLE_LIT.get(node[1], re.escape(node[1]))
    if kind == "dot":
        return ".", _ECMA_DOT
    if kind == "esc":
        return node[1], _ESCAPES[node[1]]
    if kind == "anchor":
        return node[1], {"^": "^", "$": r"\Z", r"\b": _BOUNDARY, r"\B": _NOT_BOUNDARY}[node[1]]
    if kind == "class":
        neg, items = node[1], node[2]
        body = "".join(items)
        oracle = "".join(_ORACLE_CLASS.get(i, i) for i in items)
        return f"[{'^' if neg else ''}{body}]", f"[{'^' if neg else ''}{oracle}]"
    if kind == "cat":
        parts = [_render(n, names) for n in node[1]]
        return "".join(p[0] for p in parts), "".join(p[1] for p in parts)
    if kind == "alt":
        parts = [_render(n, names) for n in node[1]]
        return "|".join(p[0] for p in parts), "|".join(p[1] for p in parts)
    if kind == "group":
        names[0] += node[1] == "named"
        opener = {"cap": "(", "nc": "(?:", "named": f"(?<g{names[0]}>"}[node[1]]
        text, oracle = _render(node[2], names)
        return f"{opener}{text})", f"(?:{oracle})"
    # repeat
    text, oracle = _render(node[1], names)
    q = node[2] + ("?" if node[3] else "")
    return f"(?:{text}){q}", f"(?:{oracle}){q}"


_atoms = st.one_of(
    st.sampled_from(_LITERALS).map(lambda x: ("lit", x)),
    st.just(("dot",)),
    st.sampled_from(sorted(_ESCAPES)).map(lambda x: ("esc", x)),
    st.sampled_from(["^", "$", r"\b", r"\B"]).map(lambda x: ("anchor", x)),
    st.tuples(st.just("class"), st.booleans(),
              st.lists(st.sampled_from(_CLASS_ITEMS), min_size=1, max_size=3)),
)
_trees = st.recursive(
    _atoms,
    lambda sub: st.one_of(
        st.lists(sub, min_size=1, max_size=4).map(lambda xs: ("cat", xs)),
        st.lists(sub, min_size=2, max_size=3).map(lambda xs: ("alt", xs)),
        st.tuples(st.just("group"), st.sampled_from(["cap", "nc", "named"]), sub),
        st.tuples(st.just("rep"), sub, st.sampled_from(["*", "+", "?", "{2}", "{0,3}", "{1,}"]),
                  st.booleans()),
    ),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None)
@given(_trees, st.lists(st.text(ALPHABET, max_size=10), min_size=1, max_size=6))
def test_both_rewrites_give_patterns_their_ecma262_meaning(tree: Any, strings: list[str]) -> None:
    text, oracle = _render(tree)
    want = re.compile(oracle, re.ASCII)
    try:
        ours = reader_regex.compile_pattern(text)
    except reader_regex.PatternError:
        # Only RE2's limit on nested repetition counts refuses a generated pattern; the
        # checker must refuse it too.
        with pytest.raises(checker_regex.BadPattern, match="repetition"):
            checker_regex.compiled(text)
        assume(False)
    theirs = checker_regex.compiled(text)
    for s in strings:
        expected = want.search(s) is not None
        assert (ours.search(s) is not None) == expected, (text, oracle, s)
        assert (theirs.search(s) is not None) == expected, (text, oracle, s)


OUTSIDE = [
    "(?=a)", "(?!a)", "a(?<=a)", "a(?<!b)", r"(a)\1", r"\k<n>", "(?i)a", "(?P<n>a)", r"\A",
    r"\z", r"\a", r"\C", r"\pL", r"\p{Greek}", r"\Q.\E", r"\x{41}", "[[:alpha:]]", "[]a]", "[^]a]",
    r"[\S]", r"\ud800", r"\cA", "a{1001}", "(?:a{1,255}){0,7}", "a**", "(", "[a", "\\", r"\e",
    r"\_", r"\u12", "(?<n>a)(?<n>b)",
]


@pytest.mark.parametrize("pattern", OUTSIDE)
def test_patterns_outside_the_subset_are_refused_by_both(pattern: str) -> None:
    with pytest.raises(reader_regex.PatternError):
        reader_regex.compile_pattern(pattern)
    with pytest.raises(checker_regex.BadPattern):
        checker_regex.compiled(pattern)


@pytest.mark.parametrize(("pattern", "yes", "no"), [
    ("^1\\.0$", "1.0", "1.0\n"),            # $ is the end of the input (Python's $ is not)
    ("^\\w+$", "abc_9", "é"),                # \w is ASCII
    ("^\\d$", "7", "٣"),                    # \d is ASCII
    ("^\\s$", "\v", "x"),                    # \s has \v (RE2's does not) ...
    ("^\\s$", "\u00a0", "\u200b"),          # ... and the Unicode spaces, not U+200B
    ("^.$", "😀", "\r"),                     # . is one code point, never a line terminator
    ("^[\\b]$", "\b", "b"),                  # [\b] is a backspace
    ("^\\u00e9$", "é", "e"),
    ("^(?<year>[0-9]{4})$", "2026", "26"),
    ("a{,3}", "a{,3}", "aaa"),               # not a quantifier: literal text, as in both
    ("\\B", "é", "9\u00a09"),                # \B never inside a character (RE2: UTF-8 bytes)
    ("x|\\B", "ab", "9\u00e99"),
])
def test_meanings_where_the_engines_differ(pattern: str, yes: str, no: str) -> None:
    for rx in (reader_regex.compile_pattern(pattern), checker_regex.compiled(pattern)):
        assert rx.search(yes) is not None
        assert rx.search(no) is None


def test_a_catastrophic_pattern_runs_in_linear_time() -> None:
    """R-ENTRY-15: ^(a+)+$ on 100,000 a's and a '!' (Python's re would not finish)."""
    s = "a" * 100_000 + "!"
    for rx in (reader_regex.compile_pattern("^(a+)+$"), checker_regex.compiled("^(a+)+$")):
        t0 = time.process_time()  # (CPU: other processes do not count)
        assert rx.search(s) is None
        assert time.process_time() - t0 < 1.0


def test_only_schema_positions_are_patterns() -> None:
    schema = {
        "properties": {"pattern": {"type": "string", "pattern": "^p$"}},
        "patternProperties": {"^k": {"items": {"pattern": "^i$"}}},
        "const": {"pattern": "(?=not a pattern)"},
        "enum": [{"pattern": "(?=data)"}],
        "$defs": {"d": {"anyOf": [{"pattern": "^d$"}]}},
        "if": {"not": {"pattern": "^n$"}},
    }
    want = ["^p$", "^k", "^i$", "^d$", "^n$"]
    assert sorted(reader_regex.schema_patterns(schema)) == sorted(want)
    assert sorted(checker_regex.patterns_of(schema)) == sorted(want)


def test_an_escaped_backslash_before_b_is_no_non_boundary() -> None:
    """Only a \\B token starts matches at whole characters; ``\\\\B`` is a backslash and a B."""
    assert reader_regex.to_re2(r"\\B") == r"\\B"
    assert checker_regex.translate(r"\\B") == r"\\B"
    for rx in (reader_regex.compile_pattern(r"^\\B$"), checker_regex.compiled(r"^\\B$")):
        assert rx.search("\\B") is not None and rx.search("B") is None
