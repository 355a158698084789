"""Text from a root made safe for a terminal (escape sequences, line breaks).

Strings a root holds (names, messages of records, a copy record's destination) are written by
whoever can write the root. Printed as they are, an escape sequence among them clears the
screen or rewrites what was printed; a line break starts a line that looks like the tool's own
(attack review 12b, B2: a forged copy record's destination reached a restore's stderr).
"""

from __future__ import annotations

__all__ = ["one_line", "printable", "spans"]


def _escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(text: object) -> str:
    r"""``str(text)`` with every non-printable character escaped as ``repr`` does (``\x1b``).

    Control characters (C0, DEL, C1), line and paragraph separators, format characters (such as
    the bidirectional overrides) and unassigned code points are escaped; everything printable,
    non-ASCII letters included, is kept as is.
    """
    s = str(text)
    if s.isprintable():
        return s
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in s)


def one_line(text: str, n: int) -> str:
    """``text`` on one line, at most ``n`` characters (``...`` where cut)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= n else flat[: n - 3] + "..."


def spans(numbers: list[int]) -> list[str]:
    """Runs of consecutive numbers: ``["0-3", "7"]`` for ``[0, 1, 2, 3, 7]`` (ranks, groups)."""
    out: list[str] = []
    if not numbers:
        return out
    start = prev = numbers[0]
    for i in [*numbers[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return out
