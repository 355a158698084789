"""The range-record fast path of the manifest parser accepts exactly what the full checks accept."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import portable_ckpt.format.manifest as mf
from portable_ckpt.errors import CheckpointError
from portable_ckpt.format.manifest import Checksum, FileRecord

FILES = {"data/a.safetensors": FileRecord("data/a.safetensors", 0, Checksum("crc32c", 4096, ""))}

ints = st.one_of(st.integers(-2, 12), st.just(True), st.just(2.0), st.just("1"), st.just(2**60))
coords = st.lists(ints, min_size=0, max_size=3)
ranges = st.fixed_dictionaries(
    {
        "offsets": st.one_of(coords, st.just("0")),
        "lengths": st.one_of(coords, st.none()),
        "file": st.sampled_from(["data/a.safetensors", "data/b.safetensors", "../x", 3]),
        "name": st.sampled_from(["w@0", "", "__metadata__", "a\x01b", "x" * 4097, "é@1", 7]),
        "codec": st.sampled_from(["none", "zstd", "gzip", None]),
    },
    optional={"extra": st.just(1)},
)


def _parse(rv: Any, shape: list[int], fast: bool) -> Any:
    doc = {"dtype": "float32", "shape": shape, "ranges": [rv]}
    saved = mf._range_fast
    if not fast:
        mf._range_fast = lambda *a: None  # type: ignore[assignment]
    try:
        return mf._tensor(mf._Ctx("m"), "w", doc, FILES, complete=False).ranges
    except CheckpointError as exc:
        return type(exc)
    finally:
        mf._range_fast = saved


@settings(max_examples=500, deadline=None)
@given(ranges, st.lists(st.integers(1, 10), min_size=0, max_size=3))
def test_fast_path_agrees_with_the_full_checks(rv: dict[str, Any], shape: list[int]) -> None:
    """R-TENSOR-2 / R-FILES-2 / R-LAYOUT-6: the same records pass, whichever way they are checked."""
    slow = _parse(rv, shape, fast=False)
    assert _parse(rv, shape, fast=True) == slow
    if isinstance(slow, type):  # refused: the fast path never accepts it
        assert mf._range_fast(rv, tuple(shape), FILES) is None
