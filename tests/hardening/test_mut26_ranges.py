"""Mutation audit 26, range arithmetic and the exactly-once coverage proof (spec §9).

What the earlier properties left unpinned: the order of the verdicts when a strategy runs out
of budget (R-COVER-4: the volumes decide before ``PCK-LIMIT``), the layouts only the sweeps see
(a layout that is no grid and too large to count: gaps, shifted boxes, an overlap beside a gap
whose volumes add up), exact volumes beyond int64, which two ranges an overlap names, the
format's size limit, and the vectorised intersection the reader plans tables with.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from portable_ckpt.errors import (
    CoverageGapError,
    CoverageOverlapError,
    LimitError,
    RangeBoundsError,
)
from portable_ckpt.ranges import (
    Box,
    RangeIndex,
    check_coverage,
    coverage,
    intersect,
    intersect_arrays,
)
from portable_ckpt.ranges.planning import Segment, plan_file
from tests.core.test_ranges import guillotine

# -- reference -----------------------------------------------------------------------------------


def _verdict(shape: tuple[int, ...], boxes: list[Box]) -> type[Exception] | None:
    """The spec's verdict by counting every element (R-COVER-3: bounds, overlap, then gap)."""
    for b in boxes:
        if not (b.ndim == len(shape) and b.within(shape) and all(n >= 1 for n in b.lengths)):
            return RangeBoundsError
    counts = np.zeros(shape, dtype=np.int64)
    for b in boxes:
        counts[b.slices()] += 1
    if (counts > 1).any():
        return CoverageOverlapError
    if (counts == 0).any():
        return CoverageGapError
    return None


@contextmanager
def _limits(work: int | None = None, terms: int | None = None) -> Iterator[None]:
    """Run with smaller coverage budgets (``None``: the module's own)."""
    saved = coverage.WORK_LIMIT, coverage.TERM_LIMIT
    try:
        if work is not None:
            coverage.WORK_LIMIT = work
        if terms is not None:
            coverage.TERM_LIMIT = terms
        yield
    finally:
        coverage.WORK_LIMIT, coverage.TERM_LIMIT = saved


def _outcome(shape: tuple[int, ...], boxes: list[Box], **kw: int) -> type[Exception] | None:
    try:
        check_coverage(shape, boxes, key="t", **kw)
    except (RangeBoundsError, CoverageOverlapError, CoverageGapError, LimitError) as e:
        return type(e)
    return None


# -- layouts -------------------------------------------------------------------------------------


@st.composite
def _tilings(draw: st.DrawFn, min_nd: int = 2, max_nd: int = 4) -> tuple[tuple[int, ...], list[Box]]:
    """A shape and a tiling of it by recursive (guillotine) splits: rarely a grid."""
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=min_nd, max_size=max_nd)))
    return shape, guillotine(draw, shape, draw(st.integers(1, 14)))


def _moved(b: Box, d: int, by: int) -> Box:
    return Box(b.offsets[:d] + (b.offsets[d] + by,) + b.offsets[d + 1 :], b.lengths)


def _resized(b: Box, d: int, by: int) -> Box:
    return Box(b.offsets, b.lengths[:d] + (b.lengths[d] + by,) + b.lengths[d + 1 :])


@st.composite
def _damaged(draw: st.DrawFn, min_nd: int = 2, max_nd: int = 4) -> tuple[tuple[int, ...], list[Box]]:
    """A tiling, maybe with one box dropped, doubled, grown or shrunk by one element, or moved
    by one (then the volumes add up: an overlap beside a gap, or a box out of bounds)."""
    shape, boxes = draw(_tilings(min_nd, max_nd))
    how = draw(st.sampled_from(["none", "drop", "double", "move", "grow", "shrink"]))
    i = draw(st.integers(0, len(boxes) - 1))
    d = draw(st.integers(0, len(shape) - 1))
    b = boxes[i]
    if how == "drop" and len(boxes) > 1:
        del boxes[i]
    elif how == "double":
        boxes.append(b)
    elif how == "move":
        boxes[i] = _moved(b, d, draw(st.sampled_from([-1, 1])))
    elif how == "grow":
        boxes[i] = _resized(b, d, 1)
    elif how == "shrink" and b.lengths[d] > 1:
        boxes[i] = _resized(b, d, -1)
    return shape, boxes


_SETTINGS = settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@_SETTINGS
@given(_damaged())
def test_every_strategy_agrees_with_counting_every_element(
    case: tuple[tuple[int, ...], list[Box]],
) -> None:
    """R-COVER-3 on layouts that are no grid, decided by each strategy of the proof in turn:
    the counting grid (default), the sweeps (``max_grid_cells=0``), and the sweeps with the
    signed tiling sweep out of budget, so that even equal volumes go to the box comparisons.
    Every one gives the verdict counting every element gives, in the spec's order."""
    shape, boxes = case
    want = _verdict(shape, boxes)
    assert _outcome(shape, boxes) is want
    assert _outcome(shape, boxes, max_grid_cells=0) is want
    with _limits(terms=0):
        assert _outcome(shape, boxes, max_grid_cells=0) is want


@_SETTINGS
@given(_damaged(min_nd=2, max_nd=2), st.integers(0, 3))
def test_two_varying_dimensions_are_decided_at_any_budget(
    case: tuple[tuple[int, ...], list[Box]], pad: int,
) -> None:
    """R-COVER-4, errata 8: boxes that differ in at most two dimensions are decided by every
    reader whatever its bound (the interval sweep has no budget). Dimensions every box spans
    fully are dropped first, so padding the boxes with whole dimensions changes nothing."""
    shape, boxes = case
    shape = (*shape, *([3] * pad))
    boxes = [Box((*b.offsets, *([0] * pad)), (*b.lengths, *([3] * pad))) for b in boxes]
    want = _verdict(shape, boxes)
    with _limits(work=1, terms=0):
        assert _outcome(shape, boxes, max_grid_cells=0) is want


# A 3-d tiling of a 4x4x4 tensor that is no grid (A spans two cells of dimension 1).
_A = Box((0, 0, 0), (2, 4, 4))
_TILES = [_A, Box((2, 0, 0), (2, 2, 4)), Box((2, 2, 0), (2, 2, 2)), Box((2, 2, 2), (2, 2, 2))]
_SHAPE = (4, 4, 4)
# The last box moved by one along dimension 2: volumes add up, z=1 stored twice, z=3 missing.
_SHIFTED = [*_TILES[:3], Box((2, 2, 1), (2, 2, 2))]


@pytest.mark.parametrize(
    ("boxes", "work", "terms", "want"),
    [
        # Volumes add up and the signed sweep proves the tiling: accepted without comparing.
        (_TILES, 1, None, None),
        # Volumes add up, the signed sweep proves no tiling: an overlap, even out of budget.
        (_SHIFTED, 1, None, CoverageOverlapError),
        # The signed sweep out of budget: the box comparisons find the overlap.
        (_SHIFTED, None, 0, CoverageOverlapError),
        # Both out of budget and the volumes add up: neither verdict is proven (PCK-LIMIT).
        (_SHIFTED, 1, 0, LimitError),
        (_TILES, 1, 0, LimitError),
        # Volumes above the tensor's size: an overlap, whatever the budget.
        ([*_TILES, Box((0, 0, 0), (1, 1, 1))], 1, 0, CoverageOverlapError),
        # Volumes below: a gap, also when no overlap could be looked for.
        (_TILES[:3], 1, 0, CoverageGapError),
        (_SHIFTED[:3] + [Box((2, 2, 1), (2, 2, 1))], 1, 0, CoverageGapError),
    ],
)
def test_budgets_give_way_to_the_volumes_in_the_spec_order(
    boxes: list[Box], work: int | None, terms: int | None, want: type[Exception] | None
) -> None:
    """R-COVER-4: a check beyond its bound never accepts; when the volumes decide it the verdict
    is ``PCK-COVERAGE-OVERLAP`` (sum above) or ``PCK-COVERAGE-GAP`` (sum below), else
    ``PCK-LIMIT``; a proof found within the bound is reported as such."""
    with _limits(work=work, terms=terms):
        assert _outcome(_SHAPE, boxes, max_grid_cells=0) is want


def test_an_overlap_names_two_ranges_that_do_overlap() -> None:
    """R-COVER-3: the message names the two ranges that intersect. Range #0 ends where #1
    and #2 start: it touches them, it does not overlap them (boxes are half-open)."""
    boxes = [Box((0,), (5,)), Box((5,), (5,)), Box((5,), (1,))]
    with pytest.raises(CoverageOverlapError) as err:
        check_coverage((10,), boxes, key="t")
    assert "ranges #1 [5:10] and #2 [5:6] overlap" in str(err.value)
    # The same in two dimensions (named by the interval sweep, whatever the strategy after it).
    boxes2 = [Box((0, 0), (5, 2)), Box((5, 0), (5, 2)), Box((5, 1), (1, 1))]
    for cells in (0, coverage.MAX_GRID_CELLS):
        with pytest.raises(CoverageOverlapError) as err:
            check_coverage((10, 2), boxes2, key="t", max_grid_cells=cells)
        assert "ranges #1 [5:10, 0:2] and #2 [5:6, 1:2] overlap" in str(err.value)


def test_one_element_missing_at_either_end_of_the_split_dimension_is_a_gap() -> None:
    """R-COVER-3 in one varying dimension (a sort, no volumes): a range set missing only the
    first or only the last element is ``PCK-COVERAGE-GAP``, naming the missing elements."""
    for boxes, where in (
        ([Box((1,), (4,)), Box((5,), (5,))], "elements [0:1]"),
        ([Box((0,), (4,)), Box((4,), (5,))], "elements [9:10]"),
        ([Box((0,), (4,)), Box((5,), (5,))], "elements [4:5]"),
    ):
        with pytest.raises(CoverageGapError, match=re.escape(f"{where} of the split dimension")):
            check_coverage((10,), boxes, key="t")
        with pytest.raises(CoverageGapError):
            check_coverage((10, 3), [Box((*b.offsets, 0), (*b.lengths, 3)) for b in boxes])


def test_volumes_beyond_int64_are_added_exactly() -> None:
    """R-SEC-6 / §18.2: sizes from hostile documents cannot overflow. A 2^32 x 2^32 tensor
    (2^64 elements) tiled by three boxes that are no grid: the volumes 2^63 + 2^62 + 2^62 add
    up to 2^64 exactly (in int64 they wrap to 0, a gap), so the tiling is accepted, and
    without its last box it is a gap."""
    h = 1 << 31
    boxes = [Box((0, 0), (h, 2 * h)), Box((h, 0), (h, h)), Box((h, h), (h, h))]
    shape = (2 * h, 2 * h)
    for cells in (0, coverage.MAX_GRID_CELLS):
        check_coverage(shape, boxes, key="t", max_grid_cells=cells)
        with pytest.raises(CoverageGapError):
            check_coverage(shape, boxes[:2], key="t", max_grid_cells=cells)
        with pytest.raises(CoverageOverlapError):
            check_coverage(shape, [*boxes, Box((h, h), (1, 1))], key="t", max_grid_cells=cells)


def test_the_format_size_limit_is_2_to_the_62_per_dimension() -> None:
    """§18.2, R-TENSOR-1: a dimension above 2^62 is ``PCK-LIMIT`` before any box is looked at;
    2^62 itself is decided as usual."""
    top = 1 << 62
    check_coverage((top,), [Box((0,), (top,))])
    check_coverage((top, 2), [Box((0, 0), (top, 1)), Box((0, 1), (top, 1))])
    for shape in ((top + 1,), (2, top + 1), ((1 << 63) - 1,)):
        with pytest.raises(LimitError):
            check_coverage(shape, [Box.full(shape)])


def test_a_box_of_another_rank_is_a_bounds_error() -> None:
    """R-TENSOR-2: ``len(offsets)`` and ``len(lengths)`` both equal the tensor's rank."""
    for box in (Box((0, 0), (4, 1)), Box((), ())):
        with pytest.raises(RangeBoundsError, match="rank"):
            check_coverage((4,), [box], key="t")


def test_a_box_out_of_bounds_is_named_with_its_dimension() -> None:
    """R-TENSOR-2: the error names the dimension the box leaves, not one it ends exactly at the
    end of (ranges are half-open: ``offsets + lengths == shape`` is inside)."""
    for box, dim in ((Box((0, 0), (4, 5)), 1), (Box((0, 1), (5, 3)), 0), (Box((0, 4), (4, 1)), 1)):
        with pytest.raises(RangeBoundsError, match=f"in dimension {dim};"):
            check_coverage((4, 4), [Box((0, 0), (4, 4)), box], key="t")


@pytest.mark.parametrize("box", [Box((0,), (4, 1)), Box((0,), ())])
def test_a_box_whose_lengths_have_another_rank_is_a_bounds_error(box: Box) -> None:
    """``check_coverage`` documents RangeBoundsError for "a box of the wrong rank"; ``_bounds``
    tests ``len(b.lengths)`` apart from ``b.ndim`` for exactly this box (a document cannot make
    one: the manifest parser refuses it first, so only direct callers meet it). The audit found
    a ValueError instead: the message formatted the ragged box with ``zip(strict=True)``."""
    with pytest.raises(RangeBoundsError, match=r"offsets \[0\], lengths .* has offsets of rank 1 and lengths of rank [02]"):
        check_coverage((4,), [box], key="t")


def test_a_tensor_covered_twice_whole_is_an_overlap() -> None:
    """R-COVER-3: two (or more) ranges each spanning the whole tensor, in any rank."""
    for shape in ((3,), (2, 5), (1, 1, 1)):
        for n in (2, 3):
            with pytest.raises(CoverageOverlapError, match="both cover the whole tensor"):
                check_coverage(shape, [Box.full(shape)] * n, key="t")


# -- vectorised intersection ---------------------------------------------------------------------


def test_intersect_arrays_one_element_either_side() -> None:
    """Boxes that meet the target in exactly one element at either edge are hits; boxes that
    end where it starts, or start where it ends, are not (dimension 0 and the others)."""
    target = Box((4, 4), (3, 3))
    stored = [
        Box((0, 4), (5, 1)),  # ends at 5: meets row 4 only
        Box((6, 4), (4, 1)),  # starts at 6: meets row 6 only
        Box((0, 4), (4, 3)),  # ends at 4: touches
        Box((7, 4), (2, 3)),  # starts at 7: touches
        Box((4, 0), (3, 4)),  # dimension 1 ends at 4: touches
        Box((4, 6), (1, 4)),  # dimension 1 meets column 6 only
    ]
    offs = np.array([b.offsets for b in stored], dtype=np.int64)
    lens = np.array([b.lengths for b in stored], dtype=np.int64)
    rows, lo, hi = intersect_arrays(offs, lens, target)
    assert rows.tolist() == [0, 1, 5]
    assert lo.tolist() == [[4, 4], [6, 4], [4, 6]]
    assert hi.tolist() == [[5, 5], [7, 5], [5, 7]]


def test_grids_of_every_rank_are_decided_without_counting() -> None:
    """§9 (errata 12), R-COVER-4: grids of cells of uneven sizes, each cell once, are accepted;
    with a cell twice an overlap, with one missing a gap, whatever the counting grid's size and
    whatever the budgets of the sweeps: a grid is decided without comparing boxes."""
    for shape, parts in (((7,), (3,)), ((5, 7), (2, 3)), ((4, 5, 6), (2, 3, 2))):
        cuts = [[s * i // p for i in range(p + 1)] for s, p in zip(shape, parts, strict=True)]
        boxes = [
            Box(tuple(c[i] for c, i in zip(cuts, idx, strict=True)),
                tuple(c[i + 1] - c[i] for c, i in zip(cuts, idx, strict=True)))
            for idx in itertools.product(*[range(p) for p in parts])
        ]
        assert len(boxes) == math.prod(parts)
        for cells in (0, coverage.MAX_GRID_CELLS):
            with _limits(work=1, terms=0):
                check_coverage(shape, boxes, max_grid_cells=cells)
                assert _outcome(shape, [*boxes[1:], boxes[-1]], max_grid_cells=cells) is (
                    CoverageOverlapError
                )
                assert _outcome(shape, boxes[1:], max_grid_cells=cells) is CoverageGapError


def test_an_overlap_between_boxes_that_start_far_apart_along_the_sweep() -> None:
    """R-COVER-3 in three varying dimensions (the batched sweep): a box stays active until the
    sweep passes its end, not only until the next group of starts. ``a`` spans x 0..3 and meets
    ``c`` (starting at x=2) after ``b`` started at x=1; volumes below the size, so the overlap is
    found by the sweep or not at all (the verdict would be a gap)."""
    a = Box((0, 0, 0), (3, 1, 1))
    b = Box((1, 1, 0), (1, 1, 2))
    c = Box((2, 0, 0), (1, 1, 1))
    with pytest.raises(CoverageOverlapError, match=r"ranges #0 \[0:3, 0:1, 0:1\] and #2"):
        check_coverage((4, 2, 2), [a, b, c], key="t", max_grid_cells=0)


def test_a_layout_cache_hit_needs_the_same_lengths_too() -> None:
    """R-COVER-3 for tensor tables: a layout proven once is skipped for an identical one only.
    Same shape, same number of boxes, same offsets, one box a row short: proven again, a gap."""
    cache = coverage.LayoutCache()
    offs = np.array([[0, 0], [4, 0]], dtype=np.int64)
    lens = np.array([[4, 8], [4, 8]], dtype=np.int64)
    cache.check((8, 8), offs, lens, key="a")
    cache.check((8, 8), offs.copy(), lens.copy(), key="b")  # a hit: nothing to prove
    short = lens.copy()
    short[1, 0] = 3
    with pytest.raises(CoverageGapError):
        cache.check((8, 8), offs.copy(), short, key="c")
    moved = offs.copy()
    moved[1, 0] = 3
    with pytest.raises(CoverageOverlapError):
        cache.check((8, 8), moved, lens.copy(), key="d")


def test_plan_file_refuses_segments_outside_the_file_and_blocks_below_one() -> None:
    """The planner's own guards (its callers check first; a slip there must not read outside
    the file): a segment starting before byte 0 or ending past the end, and a block size
    below 1, are ``ValueError``; empty segments are dropped, and the last byte is inside."""
    for seg in (Segment(-1, 5, 0), Segment(-4, 1, 0), Segment(5, 11, 0)):
        with pytest.raises(ValueError, match="outside the 10-byte file"):
            plan_file([seg], block_size=4, file_size=10, max_shared=100)
    for bs in (0, -4):
        with pytest.raises(ValueError, match="block size must be positive"):
            plan_file([Segment(0, 5, 0)], block_size=bs, file_size=10, max_shared=100)
    assert plan_file([Segment(3, 3, 0), Segment(-2, -2, 1)], block_size=4, file_size=10,
                     max_shared=100) == []
    ((ext,),) = plan_file([Segment(9, 10, 0)], block_size=4, file_size=10, max_shared=100)
    assert (ext.lo, ext.hi) == (8, 10)


def test_find_overlap_of_0_d_boxes() -> None:
    """§8.4: a 0-d tensor's one element is in every 0-d box, so two 0-d boxes overlap (the
    public helper says which), and one alone does not."""
    assert coverage.find_overlap([Box((), ()), Box((), ())]) == (0, 1)
    assert coverage.find_overlap([Box((), ())]) is None
    assert coverage.find_overlap([Box((0,), (2,)), Box((2,), (1,)), Box((1,), (2,))]) == (0, 2)


@settings(max_examples=100, deadline=None)
@given(st.integers(17, 40), st.randoms(use_true_random=False), st.data())
def test_range_index_finds_every_piece_whatever_the_order_given(
    n: int, rnd: Any, data: st.DataObject
) -> None:
    """The reader's index over more than a handful of ranges (1-d splits of uneven lengths,
    given in any order) returns exactly the stored ranges that meet a box, with their
    intersections: the pieces of a read (R-READ-3)."""
    cuts = sorted(rnd.sample(range(1, 200), n - 1))
    edges = [0, *cuts, 200]
    boxes = [Box((a,), (b - a,)) for a, b in itertools.pairwise(edges)]
    rnd.shuffle(boxes)
    index = RangeIndex([(b, i) for i, b in enumerate(boxes)])
    lo = data.draw(st.integers(0, 199))
    target = Box((lo,), (data.draw(st.integers(1, 200 - lo)),))
    got = {(it.record, it.box) for it in index.query(target)}
    want = {(i, x) for i, b in enumerate(boxes) if (x := intersect(b, target)) is not None}
    assert got == want


def test_overlapping_requests_beyond_max_shared_are_read_in_another_pass() -> None:
    """Segments that overlap share one scratch part only while it stays within ``max_shared``
    bytes; the rest go to another pass (their bytes read again), so no part grows beyond it."""
    segs = [Segment(0, 600, 0), Segment(500, 1100, 1), Segment(1000, 1600, 2)]
    passes = plan_file(segs, block_size=100, file_size=2000, max_shared=1000)
    assert [[[(p.lo, p.hi) for p in e.parts] for e in ext] for ext in passes] == [
        [[(0, 600)], [(1000, 1600)]], [[(500, 1100)]]
    ]
    for ext in passes:
        assert all(p.hi - p.lo <= 1000 for e in ext for p in e.parts)
