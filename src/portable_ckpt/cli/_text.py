"""Text for the terminal: strings from a checkpoint made safe, and tables.

Names and strings that come from a root (entry names found by a listing, manifest strings such as
``producer.name``, error messages quoting them) are written by whoever wrote the root. Printed as
they are, an escape sequence among them sets the terminal's title, clears the screen or recolours
what follows. The text CLI prints them through :func:`safe`, messages included: a newline is escaped too, so
a name holding one (a path given on the command line, a key in a hostile root) cannot start a line
that looks like the CLI's own. ``--json`` output is escaped by JSON itself.
"""

from __future__ import annotations

from portable_ckpt._printable import printable

__all__ = ["age_seconds", "safe", "table"]


def safe(text: object) -> str:
    r"""``str(text)`` with every non-printable character escaped as ``repr`` does (``\x1b``).

    :func:`portable_ckpt._printable.printable`, which the library's own messages use too.
    """
    return printable(text)


def table(rows: list[list[str]], header: list[str]) -> str:
    """Columns padded to their widest cell; every cell escaped (names come from the root)."""
    rows = [[safe(c) for c in r] for r in rows]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def age_seconds(when_text: str | None) -> float | None:
    """Seconds since ``when_text`` (a format timestamp, UTC), ``None`` when it has none."""
    import datetime as dt

    try:
        when = dt.datetime.fromisoformat(str(when_text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return round((dt.datetime.now(dt.UTC) - when).total_seconds(), 3)
