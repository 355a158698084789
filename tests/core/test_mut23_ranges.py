"""Mutation audit 23: range arithmetic the existing properties left unpinned."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from portable_ckpt.errors import CoverageGapError, CoverageOverlapError
from portable_ckpt.ranges import Box, check_coverage, contiguous_prefix, coverage
from portable_ckpt.ranges.planning import Segment, plan_file

shapes = st.lists(st.integers(1, 7), min_size=1, max_size=4).map(tuple)


def _box_in(shape: tuple[int, ...], data: st.DataObject) -> Box:
    offs = tuple(data.draw(st.integers(0, s - 1)) for s in shape)
    return Box(offs, tuple(data.draw(st.integers(1, s - o)) for s, o in zip(shape, offs, strict=True)))


@given(shapes, st.data())
def test_box_ends_and_within(shape: tuple[int, ...], data: st.DataObject) -> None:
    box = _box_in(shape, data)
    assert box.ends == tuple(o + n for o, n in zip(box.offsets, box.lengths, strict=True))
    assert box.within(shape)
    # Another rank is not within, whatever the sizes (no exception either).
    assert not box.within((*shape, 1))
    assert not box.within(shape[:-1])
    # One past the end in any dimension is outside.
    for d in range(len(shape)):
        grown = Box(box.offsets, box.lengths[:d] + (shape[d] - box.offsets[d] + 1,) + box.lengths[d + 1 :])
        assert not grown.within(shape)


@given(shapes, st.data())
def test_contiguous_prefix_is_zero_exactly_for_one_run(shape: tuple[int, ...], data: st.DataObject) -> None:
    # The reader reads a box straight into its destination only when this is 0: a box that is
    # one run must get 0 (else it is copied through scratch), and the count of runs must match.
    box = _box_in(shape, data)
    k = contiguous_prefix(box, shape)
    flat = np.arange(math.prod(shape)).reshape(shape)[box.slices()].reshape(-1)
    runs = 1 + int((np.diff(flat) != 1).sum())
    assert (k == 0) == (runs == 1)
    # k is the smallest such split: the runs are prod(lengths[:k]) and lengths[k - 1] > 1.
    assert runs == math.prod(box.lengths[:k])
    assert k == 0 or box.lengths[k - 1] > 1


@st.composite
def _segments(draw: st.DrawFn) -> tuple[int, int, list[Segment]]:
    bs = draw(st.sampled_from([1, 2, 4, 7, 16]))
    size = draw(st.integers(1, 300))
    segs = []
    for i in range(draw(st.integers(0, 10))):
        lo = draw(st.integers(0, size - 1))
        segs.append(Segment(lo, draw(st.integers(lo + 1, min(size, lo + 40))), i, draw(st.booleans())))
    return bs, size, segs


@given(_segments())
def test_extents_whose_blocks_touch_are_one_read(case: tuple[int, int, list[Segment]]) -> None:
    # Coalescing gap zero: two extents of a pass are apart by at least one whole unneeded block
    # (else they would be one read of the same blocks), and every block of an extent is needed.
    bs, size, segs = case
    for extents in plan_file(segs, block_size=bs, file_size=size, max_shared=1 << 20):
        for a, b in itertools.pairwise(extents):
            assert b.lo - a.hi >= bs
        for ext in extents:
            needed = set()
            for part in ext.parts:
                needed |= set(range(part.lo // bs, -(-part.hi // bs)))
            assert needed == set(range(ext.lo // bs, -(-ext.hi // bs)))


def test_touching_blocks_coalesce_into_one_extent() -> None:
    # Bytes [0, 3) and [5, 8) with 4-byte blocks: blocks 0 and 1 touch, one extent, two parts.
    (extents,) = plan_file([Segment(0, 3, 0), Segment(5, 8, 1)], block_size=4, file_size=8,
                           max_shared=100)
    assert [(e.lo, e.hi, len(e.parts)) for e in extents] == [(0, 8, 2)]
    # A whole block between them: two reads, the gap block never read.
    (extents,) = plan_file([Segment(0, 3, 0), Segment(9, 12, 1)], block_size=4, file_size=12,
                           max_shared=100)
    assert [(e.lo, e.hi) for e in extents] == [(0, 4), (8, 12)]


def test_empty_segments_are_dropped_not_refused() -> None:
    # plan_file's contract: empty segments are dropped (even one at the end of the file).
    passes = plan_file([Segment(5, 5, 0), Segment(8, 8, 1), Segment(2, 6, 2)], block_size=4,
                       file_size=8, max_shared=100)
    assert [[(e.lo, e.hi, [s.sink for p in e.parts for s in p.segments]) for e in ext]
            for ext in passes] == [[(0, 8, [2])]]
    assert plan_file([Segment(3, 3, 0)], block_size=4, file_size=8, max_shared=100) == []


@st.composite
def _shifted_tilings(draw: st.DrawFn) -> tuple[tuple[int, ...], list[Box]]:
    """A 2-d or 3-d grid partition with one box moved by one: equal volumes, overlap and gap."""
    shape = tuple(draw(st.lists(st.integers(2, 5), min_size=2, max_size=3)))
    cuts = [[0, *sorted(draw(st.sets(st.integers(1, s - 1), min_size=1))), s] for s in shape]
    boxes = [
        Box(tuple(c[i] for c, i in zip(cuts, idx, strict=True)),
            tuple(c[i + 1] - c[i] for c, i in zip(cuts, idx, strict=True)))
        for idx in itertools.product(*[range(len(c) - 1) for c in cuts])
    ]
    i = draw(st.integers(0, len(boxes) - 1))
    b = boxes[i]
    d = draw(st.integers(0, len(shape) - 1))
    step = 1 if b.offsets[d] + b.lengths[d] < shape[d] else -1
    boxes[i] = Box(b.offsets[:d] + (b.offsets[d] + step,) + b.offsets[d + 1 :], b.lengths)
    return shape, boxes


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_shifted_tilings())
def test_equal_volumes_that_do_not_tile_are_an_overlap(
    monkeypatch: pytest.MonkeyPatch, case: tuple[tuple[int, ...], list[Box]]
) -> None:
    # Volumes that add up with an overlap and a gap, on the sweep path (no counting grid):
    # the pairwise sweep must find the overlap (a 2-d one through its sorted active intervals),
    # and with no budget for it the signed tiling sweep alone must say the boxes do not tile.
    shape, boxes = case
    with pytest.raises(CoverageOverlapError):
        check_coverage(shape, boxes, max_grid_cells=0)
    with monkeypatch.context() as m:
        m.setattr(coverage, "WORK_LIMIT", 0)
        with pytest.raises(CoverageOverlapError):
            check_coverage(shape, boxes, max_grid_cells=0)


def test_volumes_beyond_int64_are_summed_exactly() -> None:
    # A huge logical tensor tiled by four boxes that form no grid (the sweep path): each box
    # holds about 2^78 elements, their sum must not wrap around in int64.
    big, h, c1, c2 = 1 << 40, 1 << 39, 1 << 38, 3 << 37
    boxes = [Box((0, 0), (h, c1)), Box((0, c1), (h, big - c1)),
             Box((h, 0), (big - h, c2)), Box((h, c2), (big - h, big - c2))]
    check_coverage((big, big), boxes, max_grid_cells=0)
    check_coverage((big, big), boxes)
    with pytest.raises(CoverageGapError):
        check_coverage((big, big), boxes[:3], max_grid_cells=0)
