r"""Regular expressions of JSON Schemas, as the spec defines them (§18.7), on RE2.

Written from the spec, independently of :mod:`portable_ckpt`. A pattern has the meaning ECMA-262
(with the ``u`` flag) gives it and must lie in the portable subset: ECMA-262 syntax that RE2 also
parses, with no lookaround, backreference, inline flag or RE2-only construct (``\A``, ``\z``,
``\p``, ``\Q…\E``, ``[[:alpha:]]``, ``(?P<n>…)``), and no empty class. The pattern is
tokenised; each token maps to RE2 text with the same meaning (``.``, ``\s``, ``\S`` and the
``\u``/``\x``/``\0`` escapes are the only ones whose text changes; a pattern with ``\B`` only
starts matching at whole characters), and the result runs on RE2 in time linear in the input.
Anything else is ``PCK-ENTRY-SCHEMA`` for the caller.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import re2

__all__ = ["BadPattern", "compiled", "patterns_of", "translate"]

# ECMA-262 WhiteSpace ∪ LineTerminator (tab, LF, VT, FF, CR, space, NBSP, Zs, LS, PS, BOM).
_SPACE_SET = (r"\x{9}-\x{d}\x{20}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}"
              r"\x{205f}\x{3000}\x{feff}")
_TOKEN = re.compile(r"""
    \\u\{(?P<ubrace>[0-9A-Fa-f]{1,6})\}
  | \\u(?P<hi>[dD][89abAB][0-9A-Fa-f]{2})\\u(?P<lo>[dD][c-fC-F][0-9A-Fa-f]{2})
  | \\u(?P<u4>[0-9A-Fa-f]{4})
  | \\x(?P<x2>[0-9A-Fa-f]{2})
  | \\(?P<esc>.)
  | \((?P<group>\?:|\?<[A-Za-z_][A-Za-z0-9_]*>|\?)?
  | (?P<open>\[\^?)
  | (?P<char>.)
""", re.VERBOSE | re.DOTALL)
# escapes whose RE2 text means what ECMA-262 means (outside / inside a class)
_KEEP_OUT = set("dDwWbBtnvfr")
_KEEP_IN = set("dDwWtnvfr")
_OPTS = re2.Options()
_OPTS.log_errors = False


class BadPattern(Exception):
    """The pattern is outside the portable subset or RE2 cannot compile it."""


def _code_point(m: re.Match[str]) -> int | None:
    if m.group("ubrace") is not None:
        return int(m.group("ubrace"), 16)
    if m.group("hi") is not None:
        hi, lo = int(m.group("hi"), 16), int(m.group("lo"), 16)
        return 0x10000 + (hi - 0xD800) * 0x400 + (lo - 0xDC00)
    for name in ("u4", "x2"):
        if m.group(name) is not None:
            return int(m.group(name), 16)
    return None


def _esc(e: str, nxt: str, in_class: bool) -> str:
    if e == "0" and not nxt.isdigit():
        return r"\x{0}"
    if e == "s":
        return _SPACE_SET if in_class else f"[{_SPACE_SET}]"
    if e == "S" and not in_class:
        return f"[^{_SPACE_SET}]"
    if e == "b" and in_class:
        return r"\x{8}"  # backspace inside a class
    if e in (_KEEP_IN if in_class else _KEEP_OUT):
        return "\\" + e
    if e.isascii() and e.isprintable() and not e.isalnum() and e != "_":
        return "\\" + e
    raise BadPattern(f"escape \\{e} is outside the portable subset (backreference, RE2-only "
                     "escape or \\S inside a class)")


def translate(pattern: str) -> str:
    """RE2 text with the ECMA-262 meaning of a portable-subset ``pattern``."""
    parts: list[str] = []
    seen_names: list[str] = []
    in_class = False
    non_boundary = False
    for m in _TOKEN.finditer(pattern):
        text = m.group(0)
        cp = _code_point(m)
        if cp is not None:
            if cp > 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
                raise BadPattern(f"{text} is not a Unicode scalar value")
            parts.append(f"\\x{{{cp:x}}}")
        elif m.group("esc") is not None:
            if m.group("esc") in "ux":
                raise BadPattern(f"malformed escape {text}")
            nxt = pattern[m.end():m.end() + 1]
            parts.append(_esc(m.group("esc"), nxt, in_class))
            non_boundary |= m.group("esc") == "B" and not in_class
        elif in_class:
            if text.startswith("[") and pattern.startswith("[:", m.start()):
                raise BadPattern("POSIX character classes are RE2-only")
            parts.append(text)
            in_class = text != "]" and not text.endswith("]")
        elif m.group("open") is not None:
            if pattern.startswith("]", m.end()):
                raise BadPattern("empty character class")
            parts.append(text)
            in_class = True
        elif text.startswith("("):
            if text == "(?":
                raise BadPattern("lookaround or inline flags: outside the portable subset")
            if text.startswith("(?<"):
                if text in seen_names:
                    raise BadPattern(f"duplicate group name in {text}")
                seen_names.append(text)
            parts.append("(?:" if text != "(" else "(")
        else:
            parts.append(r"[^\x{a}\x{d}\x{2028}\x{2029}]" if text == "." else text)
    if in_class:
        raise BadPattern("unterminated character class")
    if non_boundary:
        # RE2 matches UTF-8 bytes and tests \B between the bytes of one multi-byte character
        # too (both non-word): start every match at a whole character instead.
        return "^(?s:.)*?(?:" + "".join(parts) + ")"
    return "".join(parts)


@lru_cache(maxsize=1024)
def compiled(pattern: str) -> Any:
    """The compiled RE2 program of a schema pattern (use ``.search``)."""
    try:
        return re2.compile(translate(pattern), _OPTS)
    except re2.error as exc:
        raise BadPattern(f"RE2 cannot compile it: {exc}") from None


_SUBSCHEMA_MAPS = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
_SUBSCHEMA_LISTS = {"allOf", "anyOf", "oneOf", "prefixItems"}
_SUBSCHEMA = {"not", "if", "then", "else", "items", "contains", "additionalProperties",
              "propertyNames", "unevaluatedItems", "unevaluatedProperties", "contentSchema"}


def patterns_of(schema: Any) -> Iterator[str]:
    """Every regular expression of a schema: ``pattern`` values, ``patternProperties`` keys."""
    todo = [schema]
    while todo:
        node = todo.pop()
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            elif key in _SUBSCHEMA_MAPS and isinstance(value, dict):
                if key == "patternProperties":
                    yield from value
                todo.extend(value.values())
            elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
                todo.extend(value)
            elif key in _SUBSCHEMA:
                todo.append(value)
