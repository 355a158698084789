"""Argument checks shared by every entry point, so each rule has one message.

The writer, the torch adapter (``save``/``async_save`` options, the DCP storage layer) and the
CheckpointManager refuse a bad step, contract or codec before anything is touched, with
:class:`~portable_ckpt.errors.UsageError` (``PCK-USAGE``).

Without them an odd argument surfaced as whatever the code below raised first (a
``TypeError`` from a comparison, an ``AttributeError``, a ``ValueError`` from ``random``), or
was silently taken for something else (``True`` as rank 1, ``2`` as a fraction). Each check
returns the value in its canonical type.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Collection, Mapping
from typing import Any, TypeVar

from portable_ckpt.errors import UsageError

__all__ = [
    "callable_or_none",
    "continuation_or_none",
    "flag",
    "fraction",
    "mapping",
    "name_collection",
    "path_text",
    "plain_array",
    "process_group_or_none",
    "require_non_negative_int",
    "require_one_of",
    "require_seconds",
    "storage_object",
    "strict_int",
    "timeout_seconds",
]

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


def mapping(value: object, what: str, *, allow_none: bool = False) -> Any:
    """``value`` when it is a mapping (a dict), or ``None`` when ``allow_none``.

    A list of pairs, a generator or a list of arrays failed below the call (an
    ``AttributeError`` on ``.items()``) once the root was created and files were written.

    Raises:
        UsageError: anything else.

    """
    if value is None and allow_none:
        return None
    if not isinstance(value, Mapping):
        raise UsageError(
            f"{what} must be a dict (name → value){' or None' if allow_none else ''}, got "
            f"{type(value).__name__} {value!r:.80}"
        )
    return value


def storage_object(value: object, what: str) -> None:
    """Refuse (``UsageError``) anything but a :class:`~portable_ckpt.storage.base.Storage`.

    A path where a backend object is taken was an ``AttributeError`` ('str' object has no
    attribute 'capabilities') from inside (api review 31).
    """
    from portable_ckpt.storage.base import Storage

    if not isinstance(value, Storage):
        raise UsageError(
            f"{what} takes a storage backend, got {type(value).__name__} {value!r:.80}: "
            "pass portable_ckpt.storage.open_storage(url, create=True)"
        )


def flag(value: object, what: str, *, allow_none: bool = False) -> bool | None:
    """``value`` when it is a bool (or ``None`` with ``allow_none``).

    A truthy string (``deep="no"``, ``compress="no"``, ``tensor_table="no"``) did what it says
    not to (api review 31).

    Raises:
        UsageError: anything else.

    """
    if isinstance(value, bool) or (value is None and allow_none):
        return value
    kinds = "True, False or None" if allow_none else "True or False"
    raise UsageError(f"{what} must be {kinds}, got {value!r:.80}")


def callable_or_none(value: object, what: str) -> None:
    """Refuse a callback that is no callable, before the work it reports on.

    It failed only when first called, part way through the work (a deep verification, a gc
    that had deleted a version, a conversion).

    Raises:
        UsageError: ``value`` is neither ``None`` nor callable.

    """
    if value is not None and not callable(value):
        raise UsageError(f"{what} must be a callable or None, got {type(value).__name__}")


def path_text(value: object, must: str) -> str:
    """``os.fspath(value)`` as a ``str``, or PCK-USAGE saying ``must`` and what was given.

    ``must`` says what was wanted: ``"events must be a file path or None"``.

    Raises:
        UsageError: no path (an int: ``os.fspath``'s ``TypeError``), or bytes.

    """
    import os

    try:
        text = os.fspath(value)  # type: ignore[call-overload]
    except TypeError:
        raise UsageError(f"{must}, got {type(value).__name__} {value!r:.80}") from None
    if not isinstance(text, str):
        raise UsageError(f"{must}, got bytes {text!r:.80}")
    return text


def timeout_seconds(value: object, what: str) -> float | None:
    """A collective's timeout: ``None`` (the default) or a finite number of seconds > 0.

    ``float(value)`` deep in the first collective turned ``"30"`` into a ``ValueError`` there,
    and took ``-1``, ``0`` or NaN, which time a collective out at once or never.

    Raises:
        UsageError: anything else.

    """
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not 0 < float(value) < float("inf")
    ):
        raise UsageError(
            f"{what} must be a finite number of seconds > 0 or None, got "
            f"{type(value).__name__} {value!r:.80}"
        )
    return float(value)


def strict_int(value: object, what: str, *, minimum: int | None = None) -> int:
    """``value`` as an ``int``: Python or numpy integers only, never a bool, float or string.

    ``int()`` would take ``1.5`` as 1 and ``"1"`` as 1, and a bool is an ``int`` to Python;
    each would silently name another rank, step or count than the caller meant.

    Raises:
        UsageError: not an integer, or below ``minimum``.

    """
    if isinstance(value, bool):
        raise UsageError(f"{what} must be an integer, got {value!r}")
    try:
        out = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise UsageError(
            f"{what} must be an integer, got {type(value).__name__} {value!r:.80}"
        ) from None
    if minimum is not None and out < minimum:
        raise UsageError(f"{what} must be >= {minimum}, got {out}")
    return out


def fraction(value: object, what: str) -> float:
    """``value`` as a fraction in (0, 1] (the CLI's ``--sample``), as a ``float``.

    Raises:
        UsageError: not a real number (a bool or string included), NaN, or outside (0, 1].

    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UsageError(
            f"{what} must be a fraction in (0, 1], got {type(value).__name__} {value!r:.80}"
        )
    out = float(value)
    if not 0.0 < out <= 1.0:  # NaN fails every comparison
        raise UsageError(f"{what} must be a fraction in (0, 1], got {out!r}")
    return out


def name_collection(value: object, what: str) -> frozenset[str]:
    """``value`` as a set of names: a collection of strings, never one string or a number.

    A string is a collection of its characters: ``keep_ids="s00...1-..."`` would keep no
    version (or one named by a single character) instead of refusing.

    Raises:
        UsageError: a string, bytes, a non-collection or a collection holding a non-string.

    """
    if isinstance(value, str | bytes) or not isinstance(value, Collection):
        raise UsageError(
            f"{what} must be a collection of names (a list or set of strings), got "
            f"{type(value).__name__} {value!r:.80}"
        )
    bad = [x for x in value if not isinstance(x, str)]
    if bad:
        raise UsageError(f"{what} must hold strings only, got {bad[0]!r:.80}")
    return frozenset(value)


def continuation_or_none(value: object, what: str) -> Any:
    """``value`` when it is ``None`` or a :class:`~portable_ckpt.format.manifest.Continuation`.

    Raises:
        UsageError: anything else (an int, a dict).

    """
    from portable_ckpt.format.manifest import Continuation

    if value is not None and not isinstance(value, Continuation):
        raise UsageError(
            f"{what} must be a portable_ckpt.Continuation or None, got "
            f"{type(value).__name__} {value!r:.80}"
        )
    return value


def plain_array(value: object, what: str) -> None:
    """Refuse a numpy masked array (``UsageError``); anything else is left to the writer.

    A masked array's mask has no place in a tensor: storing its data would bring back the
    masked elements' hidden values (and the writer's byte view of it fails anyway).
    """
    import numpy as np

    if isinstance(value, np.ma.MaskedArray):
        raise UsageError(
            f"{what} is a numpy masked array; a tensor has no mask: save arr.filled(value) "
            "(and the mask as an array of its own, np.ma.getmaskarray(arr), if it matters)"
        )


def process_group_or_none(value: object, what: str) -> Any:
    """``value`` when it is ``None`` or a ``torch.distributed.ProcessGroup``.

    Anything else (a string, a rank list, a ``DeviceMesh``) was ignored without a word where
    torch.distributed is not initialised, and failed in torch's group lookup where it is (api
    review 31). torch is imported only here, by the callers that take a group.

    Raises:
        UsageError: anything else.

    """
    if value is None:
        return None
    import torch.distributed as dist

    if not (dist.is_available() and isinstance(value, dist.ProcessGroup)):
        raise UsageError(
            f"{what} must be a torch.distributed ProcessGroup (dist.new_group(...)) or None "
            f"(the default group), got {type(value).__name__} {value!r:.80}"
        )
    return value
