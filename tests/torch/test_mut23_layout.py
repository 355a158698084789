"""Mutation audit 23: torch.chunk arithmetic of DTensor layouts at its edges."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from portable_ckpt.errors import UnsupportedValueError  # noqa: E402
from portable_ckpt.torch.layout import (  # noqa: E402
    PlacementSpec,
    local_pieces,
    shard_box,
)

pytestmark = pytest.mark.torch


def test_runs_that_continue_each_other_are_one_box() -> None:
    # _StridedShard on a mesh dimension of one rank: its chunks follow each other in the
    # global tensor, so the local data is one box (one range on disk, not split_factor).
    shape, pieces = local_pieces((6, 4), (1,), (0,), [PlacementSpec("strided", 0, 3)])
    assert shape == (6, 4)
    assert [(p.offsets, p.lengths, p.local_offsets) for p in pieces] == [((0, 0), (6, 4), (0, 0))]
    assert shard_box((6, 4), (1,), (0,), [PlacementSpec("strided", 0, 3)]) == ((0, 0), (6, 4))
    # Shard(0) after _StridedShard(0, 2) on a 2 x 1 mesh: rank (0, 0) holds two chunks apart.
    _, pieces = local_pieces((8,), (2, 1), (0, 0),
                             [PlacementSpec("strided", 0, 2), PlacementSpec("shard", 0)])
    assert [(p.offsets, p.lengths) for p in pieces] == [((0,), (2,)), ((4,), (2,))]


def test_a_shard_dimension_past_the_rank_is_refused() -> None:
    for dim in (1, 2):
        with pytest.raises(UnsupportedValueError):
            local_pieces((4,), (2,), (0,), [PlacementSpec("shard", dim)])
        with pytest.raises(UnsupportedValueError):
            local_pieces((4,), (2,), (0,), [PlacementSpec("strided", dim, 2)])
