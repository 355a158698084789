"""Mutation audit 28, the argument checks shared by every entry point (:mod:`portable_ckpt.format.usage`).

Each check refuses an odd argument with PCK-USAGE and returns the value in its canonical type;
the boundaries (0, 1.0, NaN, bools, strings) are where a looser check would silently take an
argument for another.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from portable_ckpt.errors import UsageError
from portable_ckpt.format import usage
from portable_ckpt.format.manifest import Continuation


def _refused(fn: object, *args: object, **kw: object) -> UsageError:
    with pytest.raises(UsageError) as ei:
        fn(*args, **kw)  # type: ignore[operator]
    assert ei.value.code == "PCK-USAGE"
    return ei.value


def test_require_one_of_returns_the_listed_value() -> None:
    """``1.0 == 1 == True`` to Python: the listed value is returned, not the argument."""
    assert usage.require_one_of("zstd", ("none", "zstd"), "codec") == "zstd"
    out = usage.require_one_of(1.0, (0, 1), "x")
    assert out == 1 and type(out) is int
    out = usage.require_one_of(True, (0, 1), "x")
    assert type(out) is int
    _refused(usage.require_one_of, "gzip", ("none", "zstd"), "codec")


def test_require_non_negative_int_bounds() -> None:
    assert usage.require_non_negative_int(0, "n") == 0
    assert usage.require_non_negative_int(7, "n") == 7
    assert usage.require_non_negative_int(None, "n", allow_none=True) is None
    for bad in (-1, True, False, 1.0, "1", None):
        _refused(usage.require_non_negative_int, bad, "n")


def test_require_seconds_bounds() -> None:
    assert usage.require_seconds(0, "t") == 0.0 and usage.require_seconds(math.inf, "t") == math.inf
    assert type(usage.require_seconds(3, "t")) is float
    for bad in (-0.5, math.nan, True, "1", None):
        _refused(usage.require_seconds, bad, "t")


def test_strict_int_takes_integers_only() -> None:
    assert usage.strict_int(np.int64(5), "step") == 5
    assert usage.strict_int(0, "step", minimum=0) == 0
    assert usage.strict_int(1, "jobs", minimum=1) == 1
    _refused(usage.strict_int, 0, "jobs", minimum=1)
    for bad in (True, False, 1.5, 2.0, "1", np.float64(1.0), None):
        _refused(usage.strict_int, bad, "step")


def test_fraction_is_in_zero_one() -> None:
    assert usage.fraction(1, "sample") == 1.0 and usage.fraction(1e-9, "sample") == 1e-9
    assert usage.fraction(np.float32(0.5), "sample") == 0.5
    for bad in (0, 0.0, -0.1, 1.0000001, 2, math.nan, math.inf, True, "0.5", None):
        _refused(usage.fraction, bad, "sample")


def test_name_collection_refuses_strings_and_non_strings() -> None:
    assert usage.name_collection(["a", "b", "a"], "keep_ids") == frozenset({"a", "b"})
    assert usage.name_collection((), "keep_ids") == frozenset()
    for bad in ("abc", b"abc", 5, None, ["a", 1], {"a": 1, 2: 3}):
        _refused(usage.name_collection, bad, "keep_ids")


def test_continuation_or_none() -> None:
    c = Continuation("exact", 1, None)
    assert usage.continuation_or_none(c, "c") is c and usage.continuation_or_none(None, "c") is None
    for bad in (1, {"contract": "exact"}, "exact"):
        _refused(usage.continuation_or_none, bad, "c")


def test_plain_array_refuses_a_masked_array() -> None:
    usage.plain_array(np.arange(3), "a")
    usage.plain_array([1, 2], "a")
    assert "mask" in _refused(usage.plain_array, np.ma.masked_array([1, 2], [0, 1]), "a").message
