"""Strict JSON decoding as the spec requires for every document (independent of portable_ckpt).

Rules (spec §18.3): UTF-8 without BOM, no escaped unpaired surrogates, RFC 8259 syntax, no
duplicate object keys, no NaN/Infinity, no number overflowing a double, nesting depth <= 64, and a
bounded size.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_DEPTH", "StrictJsonError", "loads_strict"]

#: Maximum nesting depth of a document (arrays and objects).
MAX_DEPTH = 64


class StrictJsonError(ValueError):
    """The bytes are not a strict JSON document."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise StrictJsonError(f"duplicate object key {k!r}")
        out[k] = v
    return out


def _constant(name: str) -> Any:
    raise StrictJsonError(f"{name} is not allowed in JSON documents of the format")


def _float(s: str) -> float:
    v = float(s)
    if v in (float("inf"), float("-inf")):
        raise StrictJsonError(f"number {s[:40]} overflows an IEEE 754 double")
    return v


def _has_surrogate(s: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in s)


def _check_strings(value: Any) -> None:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if _has_surrogate(v):
                raise StrictJsonError("string contains an unpaired surrogate escape")
        elif isinstance(v, dict):
            for k, x in v.items():
                if _has_surrogate(k):
                    raise StrictJsonError("member name contains an unpaired surrogate escape")
                stack.append(x)
        elif isinstance(v, list):
            stack.extend(v)


def _depth(value: Any) -> int:
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            deepest = max(deepest, d)
            if d > MAX_DEPTH:
                return d
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            deepest = max(deepest, d)
            if d > MAX_DEPTH:
                return d
            stack.extend((x, d + 1) for x in v)
    return deepest


def loads_strict(data: bytes, *, max_bytes: int | None = None) -> Any:
    """Decode ``data`` as one strict JSON document.

    Raises:
        StrictJsonError: on any violation (message says which).

    """
    if max_bytes is not None and len(data) > max_bytes:
        raise StrictJsonError(f"document of {len(data)} bytes exceeds the limit of {max_bytes}")
    if data.startswith(b"\xef\xbb\xbf"):
        raise StrictJsonError("document starts with a UTF-8 byte-order mark")
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise StrictJsonError(f"not UTF-8: {exc}") from None
    try:
        value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant,
                           parse_float=_float)
    except StrictJsonError:
        raise
    except RecursionError:
        raise StrictJsonError(f"nesting deeper than {MAX_DEPTH}") from None
    except ValueError as exc:  # JSONDecodeError, int digit limits, ...
        raise StrictJsonError(f"malformed JSON: {str(exc)[:200]}") from None
    if _depth(value) > MAX_DEPTH:
        raise StrictJsonError(f"nesting deeper than {MAX_DEPTH}")
    _check_strings(value)
    return value
