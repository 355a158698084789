"""Strict, bounded JSON for format documents.

Rejects what a hostile document might use to confuse two readers: duplicate keys, NaN/Infinity,
non-UTF-8 bytes, deep nesting and oversized documents. Every failure is a ``JsonInvalidError``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from portable_ckpt.errors import JsonInvalidError, UsageError

__all__ = ["MAX_DEPTH", "MAX_DOCUMENT_BYTES", "MAX_MANIFEST_BYTES", "dumps", "loads"]

#: Maximum nesting depth of any format document.
MAX_DEPTH = 64
#: Maximum size of manifest.json.
MAX_MANIFEST_BYTES = 1 << 30
#: Maximum size of any other JSON document of the format.
MAX_DOCUMENT_BYTES = 64 << 20


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


def loads(data: bytes | str, *, what: str, max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """Parse one JSON document strictly.

    Args:
        data: The raw document.
        what: A name for messages (usually the path of the document).
        max_bytes: Refuse larger documents with ``LimitError``.

    Raises:
        JsonInvalidError: malformed, non-UTF-8, duplicate keys, NaN/Infinity or too deep.
        LimitError: larger than ``max_bytes``.

    """
    if len(data) > max_bytes:
        raise JsonInvalidError(
            f"{what}: {len(data)} bytes exceeds the limit of {max_bytes}", path=what
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
        )
    except RecursionError:
        raise JsonInvalidError(f"{what}: nesting deeper than {MAX_DEPTH}", path=what) from None
    except ValueError as exc:
        raise JsonInvalidError(f"{what}: invalid JSON: {exc}", path=what) from None
    if _depth(doc) > MAX_DEPTH:
        raise JsonInvalidError(f"{what}: nesting deeper than {MAX_DEPTH}", path=what)
    return doc


def _depth(doc: Any) -> int:
    """Nesting depth of containers, computed iteratively (no recursion on hostile input)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, d = stack.pop()
        if d > deepest:
            deepest = d
            if deepest > MAX_DEPTH:
                return deepest
        children = (
            node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        )
        for child in children:
            if isinstance(child, dict | list):
                stack.append((child, d + 1))
    return deepest if isinstance(doc, dict | list) else 0


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
