"""Strict JSON decoding as the spec requires for every document (independent of portable_ckpt).

Rules (spec §18.3): UTF-8 without BOM, no escaped unpaired surrogates, RFC 8259 syntax, no
duplicate object keys, no NaN/Infinity, no number overflowing a double, nesting depth <= 64, and a
bounded size.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_VALUES", "StrictJsonError", "count_values", "loads_strict",
           "loads_text"]

#: Maximum nesting depth of a document (arrays and objects).
MAX_DEPTH = 64


class StrictJsonError(ValueError):
    """The bytes are not a strict JSON document."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise StrictJsonError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _constant(name: str) -> Any:
    raise StrictJsonError(f"{name} is not JSON")


def _float(s: str) -> float:
    v = float(s)
    if v in (float("inf"), float("-inf")):
        raise StrictJsonError(f"the number {s[:40]} is out of range (not a finite double)")
    return v


def _int(s: str) -> int:
    """An integer token, refused when its value overflows a double (R-SEC-9, errata 3).

    Decided by the value, before Python's own digit-string limit could decide instead: a
    double holds no integer of more than 309 digits, and float() of one of 309 digits raises
    OverflowError exactly when it would round to infinity.
    """
    digits = len(s) - s.startswith("-")
    if digits > 309:
        raise StrictJsonError(f"integer of {digits} digits overflows an IEEE 754 double")
    v = int(s)
    if digits == 309:
        try:
            float(v)
        except OverflowError:
            raise StrictJsonError(f"integer {s[:40]}... overflows an IEEE 754 double") from None
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


#: JSON values an entry value may hold (R-SEC-15).
MAX_VALUES = 2**21


def count_values(data: bytes, window: int = 1 << 22) -> int:
    """Number of JSON values of a JSON text, counted without building it (R-SEC-15).

    Outside strings (from each unescaped quote to the next), a valid text of ``c`` commas and
    ``k`` brackets/braces of which ``e`` open an empty container holds ``1 + c + k - e``
    values. Scanned in numpy windows carrying the string state and the backslash run across
    their edges, so memory stays a few times ``window``.
    """
    import numpy as np

    total, in_string, backslashes, last_open = 1, 0, 0, False
    for start in range(0, len(data), window):
        a = np.frombuffer(data, dtype=np.uint8, count=min(window, len(data) - start),
                          offset=start)
        pos = np.flatnonzero(a == 0x22)
        bs = a == 0x5C
        if len(pos) and (backslashes or bs.any()):
            # the length of the backslash run just before each quote (odd: escaped)
            plain = np.flatnonzero(~bs)
            k = np.searchsorted(plain, pos) - 1
            run = pos - 1 - np.where(k >= 0, plain[np.maximum(k, 0)], -1 - backslashes)
            pos = pos[run % 2 == 0]
        flip = np.zeros(len(a), dtype=np.uint8)
        flip[pos] = 1
        parity = np.bitwise_xor.accumulate(flip) ^ in_string  # 1 from an opening quote on
        keep = (parity == 0) & (flip == 0)
        solid = (a > 0x20) & (keep | (flip == 1) | (parity == 1))  # quotes/strings stay solid
        b, k_out = a[solid], keep[solid]
        total += int(np.count_nonzero(k_out & (b == 0x2C)))
        opens = k_out & ((b == 0x5B) | (b == 0x7B))
        closes = (b == 0x5D) | (b == 0x7D)
        total += int(np.count_nonzero(opens))
        if len(b):
            total -= int(np.count_nonzero(opens[:-1] & closes[1:]))
            total -= int(last_open and closes[0])
            last_open = bool(opens[-1])
        in_string = int(parity[-1])
        tail = np.flatnonzero(~bs)
        backslashes = len(a) - 1 - int(tail[-1]) if len(tail) else backslashes + len(a)
    return total


def loads_text(text: str) -> Any:
    """``text`` as strict JSON without the format's limits on depth and integers.

    No duplicate keys, no ``NaN``/``Infinity``, no number beyond a double (``1e400``): for what
    the suite reads from adapters (a result line wraps a case's values in more levels and
    carries integers of any size, which a valid case may hold).

    Raises:
        StrictJsonError: a violation (a ``ValueError`` too, as a decoding error is).

    """
    return json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant,
                      parse_float=_float)


def loads_strict(data: bytes, *, max_bytes: int | None = None,
                 max_values: int | None = None) -> Any:
    """Decode ``data`` as one strict JSON document.

    ``max_values`` bounds the JSON values of the document (counted before it is decoded).

    Raises:
        StrictJsonError: on any violation (message says which).

    """
    if max_bytes is not None and len(data) > max_bytes:
        raise StrictJsonError(f"document of {len(data)} bytes exceeds the limit of {max_bytes}")
    if max_values is not None and len(data) > 2 * max_values:
        n = count_values(data)
        if n > max_values:
            raise StrictJsonError(f"document holds {n} JSON values, more than {max_values} "
                                  "(R-SEC-15)")
    if data.startswith(b"\xef\xbb\xbf"):
        raise StrictJsonError("document starts with a UTF-8 byte-order mark")
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise StrictJsonError(f"not UTF-8: {exc}") from None
    try:
        value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant,
                           parse_float=_float, parse_int=_int)
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
