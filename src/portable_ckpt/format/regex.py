r"""Schema regular expressions: the portable subset of spec §18.7, evaluated in linear time.

A ``pattern`` (or ``patternProperties`` key) of a JSON Schema means what ECMA-262 with the ``u``
flag gives it. This module accepts the patterns of the spec's portable subset — ECMA-262 syntax
that RE2 also parses, without lookaround, backreferences or RE2-only syntax — and rewrites the
few constructs whose meaning differs between the two engines into RE2 syntax with the ECMA-262
meaning:

* ``.`` excludes the four ECMA-262 line terminators (RE2's ``.`` excludes only ``\n``);
* ``\s``/``\S`` are ECMA-262 white space and line terminators (RE2's ``\s`` is ASCII without
  ``\v``);
* ``\uHHHH``, ``\u{H…}`` and ``\xHH`` become ``\x{H…}``; ``\0`` becomes ``\x{0}``; ``[\b]``
  (backspace) becomes ``\x{8}``;
* a pattern with ``\B`` only starts matching at a character: ``^(?s:.)*?(?:…)``. RE2 runs on
  UTF-8 and also tests ``\B`` between the bytes of one multi-byte character, where both sides
  are non-word bytes (``\B`` alone matched ``"9\xa09"``, in which ECMA-262 finds no position).

Everything else keeps its text: RE2 and ECMA-262 agree on it (``$`` is the end of the input;
``\d``, ``\w``, ``\b`` are ASCII). Matching then runs on RE2, linear in the input.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any

import re2

__all__ = ["PatternError", "compile_pattern", "schema_patterns", "to_re2"]

#: ECMA-262 WhiteSpace and LineTerminator code points, as the body of an RE2 class.
_WS = r"\t\n\v\f\r \x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}\x{feff}"
#: ECMA-262 ``.`` without the ``s`` flag: anything but a line terminator.
_DOT = r"[^\n\r\x{2028}\x{2029}]"
#: Escapes with the same meaning in both engines.
_SAME = frozenset("dDwWtnvfr")
_NAMED_GROUP = re.compile(r"\(\?<([A-Za-z_][A-Za-z0-9_]*)>")
_HEX4 = re.compile(r"[0-9A-Fa-f]{4}")
_BRACED = re.compile(r"\{([0-9A-Fa-f]{1,6})\}")
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a hostile pattern must not write to the process's stderr


class PatternError(ValueError):
    """A pattern outside the portable subset (the caller reports ``PCK-ENTRY-SCHEMA``)."""


def _escape_u(p: str, i: int) -> tuple[int, int]:
    r"""Parse ``\uHHHH`` (a surrogate pair combines) or ``\u{H…}`` at ``i``: (code point, end)."""
    m = _BRACED.match(p, i + 2)
    if m:
        cp = int(m.group(1), 16)
        if cp > 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
            raise PatternError(f"\\u{{{m.group(1)}}} is not a Unicode scalar value")
        return cp, m.end()
    if not _HEX4.fullmatch(p, i + 2, i + 6):
        raise PatternError("\\u needs four hex digits or {…}")
    cp = int(p[i + 2 : i + 6], 16)
    if 0xD800 <= cp <= 0xDBFF and p.startswith("\\u", i + 6) and _HEX4.fullmatch(p, i + 8, i + 12):
        low = int(p[i + 8 : i + 12], 16)
        if 0xDC00 <= low <= 0xDFFF:
            return 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00), i + 12
    if 0xD800 <= cp <= 0xDFFF:
        raise PatternError(f"\\u{p[i + 2 : i + 6]} is a lone surrogate")
    return cp, i + 6


def _escape(p: str, i: int, in_class: bool) -> tuple[str, int]:
    r"""Translate the escape at ``p[i] == '\\'``; return (RE2 text, index after it)."""
    if i + 1 >= len(p):
        raise PatternError("the pattern ends with a backslash")
    e = p[i + 1]
    if e == "u":
        cp, end = _escape_u(p, i)
        return f"\\x{{{cp:x}}}", end
    if e == "x":
        if not re.fullmatch(r"[0-9A-Fa-f]{2}", p[i + 2 : i + 4]):
            raise PatternError("\\x needs two hex digits (\\x{…} is RE2-only syntax)")
        return f"\\x{{{p[i + 2 : i + 4]}}}", i + 4
    if e == "0" and not p[i + 2 : i + 3].isdigit():
        return "\\x{0}", i + 2
    if e == "s":
        return (_WS if in_class else f"[{_WS}]"), i + 2
    if e == "S":
        if in_class:
            raise PatternError("\\S inside a class is outside the subset; write (?:[…]|\\S)")
        return f"[^{_WS}]", i + 2
    if e == "b" and in_class:
        return "\\x{8}", i + 2
    if e in _SAME or (e in "bB" and not in_class):
        return "\\" + e, i + 2
    if e.isascii() and e.isprintable() and not e.isalnum() and e != "_":
        return "\\" + e, i + 2  # an escaped syntax character, other punctuation or a space
    raise PatternError(
        f"escape \\{e} is outside the subset (backreferences and RE2-only escapes such as \\A, "
        "\\z, \\p, \\Q are not allowed)"
    )


def to_re2(pattern: str) -> str:
    """Rewrite a portable-subset pattern into RE2 syntax with its ECMA-262 meaning.

    Raises:
        PatternError: the pattern is outside the subset (RE2 may still reject the result).

    """
    out: list[str] = []
    names: set[str] = set()
    i, n, in_class = 0, len(pattern), False
    non_boundary = False  # a \B token outside a class (not an escaped backslash before a B)
    while i < n:
        c = pattern[i]
        if c == "\\":
            text, i = _escape(pattern, i, in_class)
            non_boundary |= text == "\\B" and not in_class
            out.append(text)
            continue
        if in_class:
            if c == "[" and pattern.startswith("[:", i):
                raise PatternError("POSIX classes ([:alpha:]) are RE2-only syntax")
            in_class = c != "]"
            out.append(c)
            i += 1
            continue
        if c == "[":
            j = i + 2 if pattern.startswith("[^", i) else i + 1
            if pattern.startswith("]", j):
                raise PatternError("an empty class ([] or [^]) means something else in RE2")
            out.append(pattern[i:j])
            i, in_class = j, True
            continue
        if c == "(" and pattern.startswith("(?", i):
            m = _NAMED_GROUP.match(pattern, i)
            if not pattern.startswith("(?:", i) and m is None:
                raise PatternError(
                    "lookaround, inline flags and (?P<…>) are outside the subset; only (?:…) "
                    "and (?<name>…) groups"
                )
            if m is not None:
                if m.group(1) in names:
                    raise PatternError(f"group name {m.group(1)!r} is used twice")
                names.add(m.group(1))
            out.append("(?:")
            i = m.end() if m is not None else i + 3
            continue
        out.append(_DOT if c == "." else c)
        i += 1
    if in_class:
        raise PatternError("unterminated character class")
    text = "".join(out)
    if non_boundary:
        text = f"^(?s:.)*?(?:{text})"  # (?s:.) takes whole characters: no match starts inside one
    return text


@functools.lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> Any:
    """Compile a schema pattern for RE2 (``search`` semantics, as JSON Schema uses).

    Raises:
        PatternError: outside the subset, or rejected by RE2 (syntax, repetition above 1000,
            a program above RE2's memory budget).

    """
    try:
        return re2.compile(to_re2(pattern), _OPTIONS)
    except re2.error as exc:
        msg = exc.args[0] if exc.args else exc
        if isinstance(msg, bytes):
            msg = msg.decode("utf-8", "replace")
        raise PatternError(f"RE2 rejects it: {msg}") from None


_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SINGLE = (
    "not", "if", "then", "else", "items", "contains", "additionalProperties", "propertyNames",
    "unevaluatedItems", "unevaluatedProperties", "contentSchema",
)


def schema_patterns(schema: Any) -> Iterator[str]:
    """Every ``pattern`` and ``patternProperties`` key of a Draft 2020-12 schema.

    Only schema positions are visited (a ``const`` or ``enum`` value holding a ``"pattern"``
    member is data, not a pattern).
    """
    stack = [schema]
    while stack:
        s = stack.pop()
        if not isinstance(s, dict):
            continue
        if isinstance(s.get("pattern"), str):
            yield s["pattern"]
        if isinstance(s.get("patternProperties"), dict):
            yield from s["patternProperties"]
        for k in _MAPS:
            if isinstance(s.get(k), dict):
                stack.extend(s[k].values())
        for k in _LISTS:
            if isinstance(s.get(k), list):
                stack.extend(s[k])
        for k in _SINGLE:
            stack.append(s.get(k))
