"""Strict, bounded JSON for format documents.

Rejects what a hostile document might use to confuse two readers: duplicate keys, NaN/Infinity,
non-UTF-8 bytes, deep nesting and oversized documents. Every failure is a ``JsonInvalidError``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from portable_ckpt.errors import JsonInvalidError, UsageError

__all__ = [
    "MAX_DEPTH",
    "MAX_DOCUMENT_BYTES",
    "MAX_MANIFEST_BYTES",
    "MAX_VALUE_NODES",
    "count_values",
    "dumps",
    "loads",
]

#: Maximum nesting depth of any format document.
MAX_DEPTH = 64
#: Maximum size of manifest.json.
MAX_MANIFEST_BYTES = 1 << 30
#: Maximum size of any other JSON document of the format.
MAX_DOCUMENT_BYTES = 64 << 20
#: Maximum number of JSON values (objects, arrays, strings, numbers, literals) of one entry value
#: (R-SEC-15): a 64 MiB ``[{},{},...]`` would otherwise cost about 2 GB of Python objects.
MAX_VALUE_NODES = 1 << 21


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (NaN and Infinity are forbidden)")


_SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _lone_surrogate(text: str) -> bool:
    # Slow path, only for documents that contain a surrogate escape at all.
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return False  # reported by the main parse
    stack = [doc]
    while stack:
        node = stack.pop()
        items = (
            list(node.items())
            if isinstance(node, dict)
            else node
            if isinstance(node, list)
            else [node]
        )
        for item in items:
            parts = item if isinstance(item, tuple) else (item,)
            for part in parts:
                if isinstance(part, str):
                    try:
                        part.encode("utf-8")
                    except UnicodeEncodeError:
                        return True
                elif isinstance(part, dict | list) and part is not node:
                    stack.append(part)
    return False


#: Digits of the longest integer token a double holds (DBL_MAX is about 1.8e308).
_DOUBLE_DIGITS = 309


def _int_token(token: str) -> int:
    """An integer token, refused when it overflows a double (R-SEC-9) like ``1e400`` is.

    The length is checked before ``int()`` runs, so the verdict never depends on Python's own
    limit on digit strings (``sys.set_int_max_str_digits``); integers within the range are
    exact (never converted through a double).
    """
    digits = len(token) - (token[0] == "-")
    if digits > _DOUBLE_DIGITS:
        raise ValueError(f"integer of {digits} digits overflows a double")
    value = int(token)
    if digits == _DOUBLE_DIGITS:
        try:
            float(value)  # rounds to nearest: OverflowError exactly when it would be infinite
        except OverflowError:
            raise ValueError(f"integer {token[:40]}... overflows a double") from None
    return value


def _finite_float(token: str) -> float:
    value = float(token)
    if math.isinf(value):
        raise ValueError(f"number {token[:40]} overflows a double")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def loads(
    data: bytes | str,
    *,
    what: str,
    max_bytes: int = MAX_DOCUMENT_BYTES,
    max_nodes: int | None = None,
) -> Any:
    """Parse one JSON document strictly.

    Args:
        data: The raw document.
        what: A name for messages (usually the path of the document).
        max_bytes: Refuse larger documents.
        max_nodes: Refuse documents of more JSON values (counted on the text, before anything
            is built: memory stays proportional to the budget, not to the document).

    Raises:
        JsonInvalidError: malformed, non-UTF-8, duplicate keys, NaN/Infinity, too deep, larger
            than ``max_bytes`` or of more than ``max_nodes`` values.

    """
    if len(data) > max_bytes:
        raise JsonInvalidError(
            f"{what}: {len(data)} bytes exceeds the limit of {max_bytes}", path=what
        )
    if max_nodes is not None and len(data) > 2 * max_nodes:  # smaller texts cannot hold more
        nodes = count_values(data.encode("utf-8") if isinstance(data, str) else bytes(data))
        if nodes > max_nodes:
            raise JsonInvalidError(
                f"{what}: holds {nodes} JSON values, more than the limit of {max_nodes} "
                "(spec §18.3, R-SEC-15)",
                path=what,
            )
    if isinstance(data, bytes | bytearray | memoryview):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonInvalidError(
                f"{what}: not UTF-8 ({exc.reason} at byte {exc.start})", path=what
            ) from None
    else:
        text = data
    if text.startswith("\ufeff"):
        raise JsonInvalidError(f"{what}: starts with a byte-order mark", path=what)
    if _SURROGATE.search(text) and _lone_surrogate(text):
        raise JsonInvalidError(f"{what}: contains an unpaired surrogate escape", path=what)
    try:
        doc = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
            parse_int=_int_token,
        )
    except RecursionError:
        raise JsonInvalidError(f"{what}: nesting deeper than {MAX_DEPTH}", path=what) from None
    except ValueError as exc:
        raise JsonInvalidError(f"{what}: invalid JSON: {exc}", path=what) from None
    # On the text (numpy, ~100x faster than walking the parsed document; equal for valid JSON).
    raw = text.encode("utf-8") if isinstance(data, str) else bytes(data)
    if text_depth(raw) > MAX_DEPTH:
        raise JsonInvalidError(f"{what}: nesting deeper than {MAX_DEPTH}", path=what)
    return doc


def dumps(doc: Any, *, indent: int | None = None) -> bytes:
    """Serialise a format document: UTF-8, no NaN/Infinity, keys in insertion order."""
    try:
        return json.dumps(
            doc,
            allow_nan=False,
            ensure_ascii=False,
            indent=indent,
            separators=(",", ":") if indent is None else None,
        ).encode("utf-8")
    except (ValueError, TypeError) as exc:
        raise UsageError(f"value cannot be stored as JSON: {exc}") from None
    except RecursionError:
        raise UsageError(
            f"value cannot be stored as JSON: nested deeper than this interpreter's recursion "
            f"limit (readers refuse more than {MAX_DEPTH} levels, spec §18.3)"
        ) from None


def count_values(data: bytes, *, chunk: int = 1 << 20) -> int:
    """Number of JSON values in a JSON text, without parsing it (exact for valid JSON).

    Every object, array, string, number and literal is one value; member names are not. Outside
    strings, a text of ``c`` commas and ``k`` containers of which ``e`` are empty holds
    ``1 + c + k - e`` values. The text is scanned in ``chunk``-byte numpy windows (strings are
    delimited by unescaped quotes), so memory is a few times ``chunk``.
    """
    total = 1
    inside = 0  # 1 while the scan is in a string
    run = 0  # backslashes ending the previous window
    pending = False  # the last non-blank byte so far opened a container
    for lo in range(0, len(data), chunk):
        a = np.frombuffer(data, dtype=np.uint8, count=min(chunk, len(data) - lo), offset=lo)
        quotes = _unescaped_quotes(a, run)
        if len(quotes):
            toggle = np.zeros(len(a), dtype=np.uint8)
            toggle[quotes] = 1
            state = np.bitwise_xor.accumulate(toggle)  # parity of the quotes up to each byte
            out = (state ^ toggle ^ inside) == 0  # outside strings (a quote is never counted)
            out[quotes] = False
            inside ^= int(state[-1])
        else:
            out = np.full(len(a), not inside)
        # Only bytes above the space can be structural (JSON whitespace is 09, 0A, 0D, 20).
        solid = a > 0x20
        sa, so = a[solid], out[solid]
        total += int(np.count_nonzero(so & (sa == 0x2C)))
        opens = so & ((sa == 0x5B) | (sa == 0x7B))
        closes = (sa == 0x5D) | (sa == 0x7D)
        total += int(np.count_nonzero(opens))
        if len(sa):
            total -= int(np.count_nonzero(opens[:-1] & closes[1:])) + int(pending and closes[0])
            pending = bool(opens[-1])
        back = np.flatnonzero(a != 0x5C)
        run = len(a) - 1 - int(back[-1]) if len(back) else run + len(a)
    return total


def text_depth(data: bytes, *, chunk: int = 1 << 20) -> int:
    """Deepest nesting of containers in a JSON text, without parsing it (exact for valid JSON).

    The depth the parsed document would have (the top-level container counts 1; a scalar
    document has depth 0): brackets outside strings, scanned in ``chunk``-byte numpy windows
    like :func:`count_values`.
    """
    deepest = depth = 0
    inside = 0  # 1 while the scan is in a string
    run = 0  # backslashes ending the previous window
    for lo in range(0, len(data), chunk):
        a = np.frombuffer(data, dtype=np.uint8, count=min(chunk, len(data) - lo), offset=lo)
        quotes = _unescaped_quotes(a, run)
        brackets = np.flatnonzero((a == 0x5B) | (a == 0x7B) | (a == 0x5D) | (a == 0x7D))
        if len(quotes):
            # A bracket is outside strings when an even number of quotes (plus the parity
            # carried in) precede it.
            before = np.searchsorted(quotes, brackets)
            brackets = brackets[(before + inside) % 2 == 0]
            inside ^= len(quotes) % 2
        elif inside:
            brackets = brackets[:0]
        if len(brackets):
            b = a[brackets]
            level = np.cumsum(np.where((b == 0x5B) | (b == 0x7B), 1, -1)) + depth
            deepest = max(deepest, int(level.max()))
            depth = int(level[-1])
        back = np.flatnonzero(a != 0x5C)
        run = len(a) - 1 - int(back[-1]) if len(back) else run + len(a)
    return deepest


def _unescaped_quotes(a: np.ndarray[Any, Any], run: int) -> np.ndarray[Any, Any]:
    """Positions of the quotes of ``a`` not escaped (``run``: backslashes just before ``a``)."""
    quotes = np.flatnonzero(a == 0x22)
    if not len(quotes) or (not run and not (a == 0x5C).any()):
        return quotes
    nonbs = np.flatnonzero(a != 0x5C)
    k = np.searchsorted(nonbs, quotes) - 1  # the last byte before each quote that is no backslash
    prev = np.where(k >= 0, nonbs[np.maximum(k, 0)], -1)
    backslashes = quotes - 1 - prev + np.where(k >= 0, 0, run)
    kept: np.ndarray[Any, Any] = quotes[backslashes % 2 == 0]
    return kept
