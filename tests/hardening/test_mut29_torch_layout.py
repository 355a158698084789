"""Mutation audit 29, the box arithmetic of :mod:`portable_ckpt.torch.layout`.

Plain Python over ``(mesh shape, coordinate, placements)``: where an empty shard is anchored
(an empty selection keeps the global index where it would begin), which strided split
factors and chunk indexes are refused, how ``_StridedShard`` is read, and the mesh labels
made unique.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from torch.distributed.tensor import Shard
from torch.distributed.tensor.placement_types import _StridedShard

from portable_ckpt.errors import UnsupportedValueError
from portable_ckpt.torch.layout import (
    PlacementSpec,
    _take,
    chunk_extent,
    dim_labels,
    local_runs,
    placement_specs,
    shard_box,
)


def test_an_empty_selection_is_anchored_where_it_would_begin() -> None:
    """At a run boundary the next run's start (L3 ``<``, L21 kept a zero run of the first
    run); past every run, the end of the last (L4 anchored it at 0)."""
    assert _take(((0, 2), (10, 2)), 2, 0) == ((10, 0),)
    assert _take(((0, 4),), 4, 0) == ((4, 0),)
    assert shard_box((4,), (3,), (2,), [PlacementSpec("shard", 0)]) == ((4,), (0,))


def test_an_empty_strided_shard_is_anchored_at_the_end_of_the_extent() -> None:
    """Two chunks of one row over four coordinates: only coordinate 0 holds rows.

    Mutants L5 (kept the empty runs, anchored at 1) and L6 (anchored at 0).
    """
    strided = [PlacementSpec("strided", 0, 2)]
    assert local_runs((2,), (4,), (0,), strided) == [((0, 2),)]
    for c in (1, 2, 3):
        assert local_runs((2,), (4,), (c,), strided) == [((2, 0),)]


def test_a_strided_split_factor_below_one_is_refused() -> None:
    """A factor of 0 cut the extent into no chunks (mutant L9 refused only negatives)."""
    with pytest.raises(UnsupportedValueError, match="split factor 0 < 1"):
        local_runs((4,), (2,), (0,), [PlacementSpec("strided", 0, 0)])


@pytest.mark.parametrize("index", [-1, 2, 5])
def test_a_chunk_index_outside_the_parts_is_refused(index: int) -> None:
    """Mutant L24 gave chunk 5 of 2 as an empty chunk at the end."""
    with pytest.raises(ValueError, match=f"chunk index {index} outside 0..1"):
        chunk_extent(4, 2, index)


def test_a_strided_shard_is_read_with_its_split_factor() -> None:
    """``_StridedShard`` is a ``Shard`` subclass: refused as unknown by mutant L12."""
    specs = placement_specs([_StridedShard(1, split_factor=2), Shard(0)], key="w")
    assert specs == [PlacementSpec("strided", 1, 2), PlacementSpec("shard", 0)]


def test_mesh_labels_repeated_three_times_get_distinct_suffixes() -> None:
    """Mutant L20 renamed a repeated label once only: ``a_1`` twice."""
    assert dim_labels(["a", "a", "a", "a-1"]) == ["a", "a_1", "a_2", "a_1_1"]
