"""Strict, bounded JSON for format documents.

Rejects what a hostile document might use to confuse two readers: duplicate keys, NaN/Infinity,
non-UTF-8 bytes, deep nesting and oversized documents; and, before anything is built, format
documents whose objects would cost more memory per byte than any writer's (:func:`tally`).
Every failure is a ``JsonInvalidError``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from portable_ckpt.errors import CheckpointError, JsonInvalidError, ValueNotJsonError

__all__ = [
    "COST_FLOOR",
    "MAX_COST_PER_BYTE",
    "MAX_DEPTH",
    "MAX_DOCUMENT_BYTES",
    "MAX_MANIFEST_BYTES",
    "MAX_VALUE_NODES",
    "Tally",
    "count_values",
    "dumps",
    "encode_value",
    "loads",
    "tally",
    "unescaped_quotes",
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
#: Most bytes of Python objects that parsing a format document (a manifest, writer index, record,
#: shard header: anything but an entry value or other user value) may cost per byte of its text,
#: as estimated by :meth:`Tally.cost` before anything is built, besides :data:`COST_FLOOR`.
#: Documents written by this library measure 3-10 bytes per byte (the densest: shard headers of
#: many scalar or 8-dimensional tensors), so the bound leaves them a margin of 2. Without it the
#: objects of ``[[[...]]]`` take 44 bytes per byte of text and of ``{},{},...`` 24 (a process
#: parsing a 64 MiB manifest: 51 and 28 times its size); with it about 21 at most (a document
#: tuned to the bound: 26 times its size, the text and list growth included).
MAX_COST_PER_BYTE = 20
#: What any format document may cost besides ``MAX_COST_PER_BYTE`` per byte: documents below
#: ``COST_FLOOR / 44`` bytes (about 380 KB) cannot exceed the budget and are not counted at all.
COST_FLOOR = 16 << 20
#: No text costs more than this per byte by :meth:`Tally.cost` (``[[[...]]]``: 48).
_MOST_COST_PER_BYTE = 64


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
    max_cost_per_byte: int | None = MAX_COST_PER_BYTE,
) -> Any:
    """Parse one JSON document strictly.

    Args:
        data: The raw document.
        what: A name for messages (usually the path of the document).
        max_bytes: Refuse larger documents.
        max_nodes: Refuse documents of more JSON values (counted on the text, before anything
            is built: memory stays proportional to the budget, not to the document).
        max_cost_per_byte: Refuse documents whose objects would cost more than this many bytes
            per byte of text (plus :data:`COST_FLOOR`), estimated on the text before anything is
            built (:meth:`Tally.cost`). The default suits every format document; pass ``None``
            for user values (entry values, whose bound is ``max_nodes``), which may be denser.

    Raises:
        JsonInvalidError: malformed, non-UTF-8, duplicate keys, NaN/Infinity, too deep, larger
            than ``max_bytes``, of more than ``max_nodes`` values or costlier than
            ``max_cost_per_byte``.

    """
    if len(data) > max_bytes:
        raise JsonInvalidError(
            f"{what}: {len(data)} bytes exceeds the limit of {max_bytes}", path=what
        )
    # The counts below run on the bytes, made once (a bytearray or memoryview copied once, a
    # str encoded once: each count made its own copy).
    if isinstance(data, str):
        try:
            raw = data.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate code point (not an escape)
            raise JsonInvalidError(
                f"{what}: holds a code point UTF-8 cannot encode (U+{ord(data[exc.start]):04X} "
                f"at character {exc.start}): no JSON text of a file can", path=what
            ) from None
    else:
        raw = bytes(data)
    depth: int | None = None  # measured on the text with the cost (not measured twice)
    if max_cost_per_byte is not None and len(data) * (
        _MOST_COST_PER_BYTE - max_cost_per_byte
    ) > COST_FLOOR:  # smaller texts cannot cost more
        counts = tally(raw)
        cost, budget = counts.cost(), max_cost_per_byte * len(data) + COST_FLOOR
        if cost > budget:
            raise JsonInvalidError(
                f"{what}: its {len(data)} bytes would take about {cost >> 20} MiB of memory "
                f"to parse, more than the {budget >> 20} MiB a format document may cost "
                f"({max_cost_per_byte} bytes per byte, plus {COST_FLOOR >> 20} MiB; "
                f"{counts.values} values, {counts.objects + counts.arrays} objects and arrays). "
                "No writer of this format produces such a document: the file is damaged or was "
                "not written by a portable_ckpt writer; delete it (or the version it belongs "
                "to) or restore it from a copy",
                path=what,
            )
        depth = counts.depth
    if max_nodes is not None and len(data) > 2 * max_nodes:  # smaller texts cannot hold more
        nodes = count_values(raw)
        if nodes > max_nodes:
            raise JsonInvalidError(
                f"{what}: holds {nodes} JSON values, more than the limit of {max_nodes} "
                "(spec §18.3, R-SEC-15)",
                path=what,
            )
    if isinstance(data, bytes | bytearray | memoryview):
        try:
            text = raw.decode("utf-8")
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
    if depth is None:
        # Brackets anywhere (in strings too) bound the depth: a small record with a few needs
        # no scan (the numpy scan's fixed cost was half of parsing one; a listing parses all).
        opening = raw.count(b"[") + raw.count(b"{")
        depth = opening if opening <= MAX_DEPTH else text_depth(raw)
    if depth > MAX_DEPTH:
        raise JsonInvalidError(f"{what}: nesting deeper than {MAX_DEPTH}", path=what)
    return doc


def dumps(doc: Any, *, indent: int | None = None, what: str = "value") -> bytes:
    """Serialise a format document: UTF-8, no NaN/Infinity, keys in insertion order.

    ``what`` names the document in a refusal (``"entry 'meta'"``).
    """
    try:
        return json.dumps(
            doc,
            allow_nan=False,
            ensure_ascii=False,
            indent=indent,
            separators=(",", ":") if indent is None else None,
        ).encode("utf-8")
    except (ValueError, TypeError) as exc:
        # (Python's advice to raise sys.set_int_max_str_digits is no advice for a reader)
        why = str(exc).split("; use sys.set_int_max_str_digits", 1)[0]
        raise ValueNotJsonError(f"{what} cannot be stored as JSON: {why}") from None
    except RecursionError:
        raise ValueNotJsonError(
            f"{what} cannot be stored as JSON: nested deeper than this interpreter's recursion "
            f"limit (readers refuse more than {MAX_DEPTH} levels, spec §18.3)"
        ) from None


def encode_value(value: Any, *, what: str = "value") -> bytes:
    """:func:`dumps` of a value, parsed back as readers parse it (depth, integer range, ...).

    Raises:
        ValueNotJsonError: a value JSON cannot hold, one readers would refuse, or a dict key
            that is no string (JSON would store it as one: it would not read back as given):
            refused when it is stored, not when it is read.

    """
    payload = dumps(value, what=what)
    try:  # (the value count is the schema validator's: not counted twice)
        loads(payload, what=what, max_cost_per_byte=None)
    except CheckpointError as exc:
        raise ValueNotJsonError(f"{exc.message}; readers would refuse this value") from None
    _refuse_non_string_keys(value, what)  # after dumps: no cycle, a bounded depth
    return payload


def _refuse_non_string_keys(value: Any, what: str) -> None:
    """Refuse a dict key that is no string anywhere in ``value`` (``ValueNotJsonError``).

    ``json.dumps`` writes an int, float, bool or ``None`` key as a string: ``{1.5: "a"}`` read
    back as ``{"1.5": "a"}`` and ``{True: 1}`` as ``{"true": 1}`` without a word (api review 31;
    the torch adapter refuses such keys already).
    """
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if not isinstance(k, str):
                    where = "".join(f"[{p!r}]" for p in path) or "the top"
                    raise ValueNotJsonError(
                        f"{what}: dict key {k!r} ({type(k).__name__}) at {where} would read back "
                        f"as the string {json.dumps({k: 0})[1:-4]}; JSON object keys are "
                        "strings: use str keys (or a list of [key, value] pairs)"
                    )
                if isinstance(v, dict | list | tuple):
                    stack.append((v, (*path, k)))
        elif isinstance(node, list | tuple):
            stack.extend(
                (v, (*path, i)) for i, v in enumerate(node) if isinstance(v, dict | list | tuple)
            )


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
        quotes = unescaped_quotes(a, run)
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
        quotes = unescaped_quotes(a, run)
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


@dataclass(frozen=True)
class Tally:
    """What a JSON text would build, counted on the text (:func:`tally`).

    ``values``, ``objects``, ``arrays``, ``members`` and ``depth`` are exact for valid JSON
    (``values`` equals :func:`count_values`, ``depth`` :func:`text_depth`); ``long_scalars``
    (numbers and literals of three characters or more, padding included) is an upper bound.
    """

    values: int
    objects: int
    empty_objects: int
    arrays: int
    empty_arrays: int
    members: int
    strings: int  # string values and member names
    long_scalars: int
    depth: int

    def cost(self) -> int:
        """Bytes of Python objects ``json.loads`` builds from the text, estimated.

        Within -15% / +50% of what CPython allocates for dense texts of containers, numbers and
        short strings (more for real documents, whose member names repeat and are shared).

        Sizes of CPython (3.11+, 64-bit): a slot of 8 bytes for each value in its list or
        object; a dict of 64 bytes (184 holding one to five members, about 48 more for each
        further member), plus 40 per member for its name (names that repeat are shared, so
        real documents cost less); a list of 56 bytes (88 with items, as lists grow); a string
        value of 52 bytes plus its characters; a number of three or more characters 32 (shorter
        ones are cached integers). Characters of strings (at most 4 bytes per byte of text)
        are not charged: the budget is per byte of text.
        """
        filled = self.objects - self.empty_objects
        return (
            8 * self.values
            + 64 * self.objects
            + 120 * filled
            + 48 * max(0, self.members - 5 * filled)
            + 40 * self.members
            + 56 * self.arrays
            + 32 * (self.arrays - self.empty_arrays)
            + 52 * max(0, self.strings - self.members)
            + 32 * self.long_scalars
        )


def tally(data: bytes, *, chunk: int = 1 << 16) -> Tally:
    """Count what a JSON text would build (:class:`Tally`) without parsing it.

    One pass of ``chunk``-byte numpy windows over the structural bytes (``,:[]{}`` and
    quotes; strings delimited by unescaped quotes): memory stays under about 70 times
    ``chunk`` (positions are 8 bytes) and the cost is a few milliseconds per MiB (about that
    of :func:`text_depth`, which it replaces for the documents it counts).
    """
    commas = members = objects = arrays = empty_objects = empty_arrays = 0
    quotes_total = long_scalars = 0
    depth = deepest = 0
    inside = 0  # 1 while the scan is in a string
    run = 0  # backslashes ending the previous window
    # The last structural byte or quote before this window: its absolute position, the byte
    # (a quote is 0x22) and the number of non-blank bytes after it (in earlier windows).
    last_pos, last_byte, last_solid = -1, 0, 0
    for lo in range(0, len(data), chunk):
        a = np.frombuffer(data, dtype=np.uint8, count=min(chunk, len(data) - lo), offset=lo)
        folded = a | 0x20  # [ ] fold onto { }
        pos = np.flatnonzero(
            (a == 0x2C) | (a == 0x3A) | (folded == 0x7B) | (folded == 0x7D) | (a == 0x22)
        )
        byte = a[pos]
        escapes = bool(run) or bool((a == 0x5C).any())
        if escapes:
            isq = np.zeros(len(pos), dtype=np.uint8)
            isq[np.searchsorted(pos, unescaped_quotes(a, run))] = 1
        else:
            isq = (byte == 0x22).view(np.uint8)
        # Events: bytes outside strings, and the quotes (parity of the quotes before each).
        event = (np.bitwise_xor.accumulate(isq) ^ isq ^ inside) == 0
        event |= isq.view(bool)
        pos, byte = pos[event], byte[event]
        isq = isq[event] if escapes else (byte == 0x22).view(np.uint8)
        nq = int(np.count_nonzero(isq))
        quotes_total += nq
        inside ^= nq & 1
        if not len(pos):
            last_solid += int(np.count_nonzero(a > 0x20))
        else:
            struct = byte if not escapes else np.where(isq.view(bool), 0x22, byte)
            commas += int(np.count_nonzero(struct == 0x2C))
            members += int(np.count_nonzero(struct == 0x3A))
            objects += int(np.count_nonzero(struct == 0x7B))
            arrays += int(np.count_nonzero(struct == 0x5B))
            brackets = struct[(struct | 0x20) >= 0x7B]  # [ ] { }
            if len(brackets):  # bit 1 is set in [ and {, clear in ] and }
                steps = ((brackets >> 1) & 1).astype(np.int8) * 2 - 1
                level = np.cumsum(steps, dtype=np.int64) + depth
                deepest = max(deepest, int(level.max()))
                depth = int(level[-1])
            # Pairs of consecutive events, the last one of an earlier window first.
            left_pos = np.concatenate(([last_pos - lo], pos[:-1]))
            gap = pos - left_pos - 1
            # A number or literal of three characters or more (or padded) between , : [ and
            # , ] }: counted on the few wide gaps only.
            wide = np.flatnonzero(gap >= 3)
            if len(wide):
                right = struct[wide]
                left = np.where(wide > 0, struct[np.maximum(wide - 1, 0)], last_byte)
                long_scalars += int(
                    np.count_nonzero(
                        ((left == 0x2C) | (left == 0x3A) | (left == 0x5B))
                        & ((right == 0x2C) | (right == 0x5D) | (right == 0x7D))
                    )
                )
            # Empty containers: [] and {}, also with blanks between.
            closing = np.flatnonzero((struct | 0x20) == 0x7D)
            if len(closing):
                right = struct[closing]
                left = np.where(closing > 0, struct[np.maximum(closing - 1, 0)], last_byte)
                opened = left == right - 2  # [ ] and { } are 2 apart
                g = gap[closing]
                blank = opened & (g == 0)
                # Blanks between the brackets: the bytes between are counted (only when the
                # byte before the closing bracket is blank).
                end = pos[closing]
                maybe = np.flatnonzero(
                    opened & (g > 0) & ((end == 0) | (a[np.maximum(end - 1, 0)] <= 0x20))
                )
                if len(maybe):
                    solid = np.concatenate(([0], np.cumsum(a > 0x20)))  # non-blank before
                    begin = left_pos[closing[maybe]] + 1
                    inner = solid[end[maybe]] - solid[np.maximum(begin, 0)]
                    inner[begin <= 0] += last_solid  # the pair began in an earlier window
                    blank[maybe] = inner == 0
                empty_arrays += int(np.count_nonzero(blank & (right == 0x5D)))
                empty_objects += int(np.count_nonzero(blank & (right == 0x7D)))
            last_pos, last_byte = lo + int(pos[-1]), int(struct[-1])
            last_solid = int(np.count_nonzero(a[int(pos[-1]) + 1 :] > 0x20))
        if a[-1] != 0x5C:
            run = 0
        else:
            back = np.flatnonzero(a != 0x5C)
            run = len(a) - 1 - int(back[-1]) if len(back) else run + len(a)
    return Tally(
        values=1 + commas + objects + arrays - empty_objects - empty_arrays,
        objects=objects,
        empty_objects=empty_objects,
        arrays=arrays,
        empty_arrays=empty_arrays,
        members=members,
        strings=quotes_total // 2,
        long_scalars=long_scalars,
        depth=deepest,
    )


def unescaped_quotes(a: np.ndarray[Any, Any], run: int) -> np.ndarray[Any, Any]:
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
