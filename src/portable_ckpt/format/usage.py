"""Argument checks shared by every entry point, so each rule has one message.

The writer, the torch adapter (``save``/``async_save`` options, the DCP storage layer) and the
CheckpointManager refuse a bad step, contract or codec before anything is touched, with
:class:`~portable_ckpt.errors.UsageError` (``PCK-USAGE``).
"""

from __future__ import annotations

from typing import TypeVar

from portable_ckpt.errors import UsageError

__all__ = ["require_non_negative_int", "require_one_of", "require_seconds"]

_T = TypeVar("_T")


def require_one_of(value: object, values: tuple[_T, ...], what: str) -> _T:
    """Return ``value`` when it is one of ``values``; raise ``PCK-USAGE`` naming ``what`` otherwise."""
    if value in values:
        return values[values.index(value)]
    raise UsageError(f"{what} must be one of {values}, got {value!r}")


def require_non_negative_int(value: object, what: str, *, allow_none: bool = False) -> int | None:
    """Return ``value`` when it is an int ≥ 0 (not a bool), or ``None`` when ``allow_none``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        extra = " or None" if allow_none else ""
        raise UsageError(f"{what} must be a non-negative int{extra}, got {value!r}")
    return value


def require_seconds(value: object, what: str) -> float:
    """Return ``value`` as a float when it is a number of seconds ≥ 0 (``math.inf``: no bound)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise UsageError(f"{what} must be a number of seconds >= 0, got {value!r}")
    return float(value)
