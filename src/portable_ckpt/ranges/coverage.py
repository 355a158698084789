"""Exactly-once coverage of a tensor by a set of boxes (spec §9, R-COVER-3, R-COVER-4).

The order of the checks is the spec's: bounds, then overlaps, then gaps (boxes in bounds and
pairwise disjoint cover the tensor exactly when their volumes add up to its size). Dimensions
that every box spans fully cannot separate boxes and are dropped first; ``d`` below counts the
others, ``n`` the boxes. Costs, never proportional to the number of elements (R-SEC-6):

* bounds and volumes: ``O(n·d)``; one dimension: a sort, ``O(n log n)``;
* grids (the boxes are the cells of a product of per-dimension partitions, whatever ``d``):
  ``O(n·d log n)``, vectorised;
* small compressed grids (at most ``8n + 64`` cells and ``2^d·n <= 2^22`` corners): counted
  with an N-d difference array, ``O(n·2^d)``;
* anything else: a sweep along the dimension with the most distinct starts. Boxes active at
  one position of the sweep must be disjoint in the other dimensions; with two dimensions they
  are a sorted list of disjoint intervals (``O(log n)`` per box, ``O(n log n)`` in all), with
  more each group of boxes starting together is compared with the active ones in one
  vectorised step, at most :data:`WORK_LIMIT` box pairs and events in all.

A tensor whose overlaps the sweep cannot decide within :data:`WORK_LIMIT` is reported by its
volumes when they decide it (short: ``PCK-COVERAGE-GAP``; more than the tensor:
``PCK-COVERAGE-OVERLAP``) and refused with ``PCK-LIMIT`` otherwise (R-COVER-4).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from sortedcontainers import SortedList

from portable_ckpt.errors import (
    CoverageGapError,
    CoverageOverlapError,
    LimitError,
    RangeBoundsError,
)
from portable_ckpt.ranges.box import Box

__all__ = [
    "MAX_GRID_CELLS",
    "TERM_LIMIT",
    "WORK_LIMIT",
    "LayoutCache",
    "check_coverage",
    "check_coverage_arrays",
    "find_overlap",
]

#: Largest compressed grid counted with the difference array.
MAX_GRID_CELLS = 1 << 24
#: Box pairs (and sweep events) the overlap sweep may compare for one tensor (R-COVER-4).
WORK_LIMIT = 1 << 26
#: int64 elements the signed (tiling) sweep may hold at once for one tensor (R-COVER-4).
TERM_LIMIT = 1 << 25

_I64 = np.int64
_Arr = np.ndarray[Any, Any]


def _bounds(shape: Sequence[int], boxes: Sequence[Box], key: str) -> None:
    nd = len(shape)
    for i, b in enumerate(boxes):
        if b.ndim != nd or len(b.lengths) != nd:
            ranks = f"rank {b.ndim}" if len(b.lengths) == b.ndim else (
                f"offsets of rank {b.ndim} and lengths of rank {len(b.lengths)}")
            raise RangeBoundsError(
                f"tensor {key!r}: range #{i} {b} has {ranks}, the tensor has rank {nd}"
            )
        for d, (o, n, s) in enumerate(zip(b.offsets, b.lengths, shape, strict=True)):
            if o < 0 or n < 1 or o + n > s:
                raise RangeBoundsError(
                    f"tensor {key!r}: range #{i} {b} is empty or outside shape {list(shape)} "
                    f"in dimension {d}; every range must lie inside the tensor and be non-empty"
                )


def check_coverage(
    shape: Sequence[int],
    boxes: Sequence[Box],
    *,
    key: str = "?",
    max_grid_cells: int = MAX_GRID_CELLS,
) -> None:
    """Prove that ``boxes`` cover every element of a tensor of ``shape`` exactly once.

    Costs are bounded by the boxes, never by the elements (module docstring, spec §9).
    ``max_grid_cells`` bounds the counting grid (0 forces the sweep).

    Raises:
        RangeBoundsError: a box of the wrong rank, empty, or outside the tensor.
        CoverageOverlapError: some element is covered twice (the message names both boxes).
        CoverageGapError: some element is covered by no box.
        LimitError: a layout whose overlaps cannot be decided within :data:`WORK_LIMIT`.

    """
    shape = [int(s) for s in shape]
    if any(s > 1 << 62 for s in shape):
        raise LimitError(f"tensor {key!r}: shape {shape} exceeds the format's limits")
    n, nd = len(boxes), len(shape)
    try:
        offs = np.array([b.offsets for b in boxes], dtype=_I64).reshape(n, -1 if n else nd)
        lens = np.array([b.lengths for b in boxes], dtype=_I64).reshape(n, -1 if n else nd)
    except (OverflowError, ValueError):
        offs = lens = np.empty((0, 0), dtype=_I64)  # ragged, or beyond int64
    if offs.shape != (n, nd) or lens.shape != (n, nd):
        _bounds(shape, boxes, key)  # raises, naming the box of the wrong rank or size
    check_coverage_arrays(shape, offs, lens, key=key, max_grid_cells=max_grid_cells)


def check_coverage_arrays(
    shape: Sequence[int],
    offs: _Arr,
    lens: _Arr,
    *,
    key: str = "?",
    max_grid_cells: int = MAX_GRID_CELLS,
) -> None:
    """:func:`check_coverage` for boxes given as ``[n, ndim]`` int64 arrays (vectorised)."""
    shape = [int(s) for s in shape]
    n, nd = int(offs.shape[0]), len(shape)
    if offs.ndim != 2 or lens.shape != offs.shape or offs.shape[1] != nd:
        raise RangeBoundsError(f"tensor {key!r}: box arrays of shape {offs.shape} for rank {nd}")
    if n:
        bad = (lens < 1) | (offs < 0) | (offs + lens > np.asarray(shape, dtype=_I64))
        if bad.any():
            i = int(np.flatnonzero(bad.any(axis=1))[0])
            _bounds(shape, [_box(offs, lens, i)], key)  # raises, naming the box
    if _trivial(shape, n, key):
        return
    _prove(shape, offs.astype(_I64, copy=False), lens.astype(_I64, copy=False), key, max_grid_cells)


def _box(offs: _Arr, lens: _Arr, i: int) -> Box:
    return Box(tuple(int(x) for x in offs[i]), tuple(int(x) for x in lens[i]))


def _trivial(shape: Sequence[int], n: int, key: str) -> bool:
    """Zero-size, 0-d and box-less tensors; True when they are settled (valid)."""
    if math.prod(shape) == 0:
        if n:
            raise RangeBoundsError(f"tensor {key!r} has zero elements but {n} range(s)")
        return True
    if not shape:
        if n == 1:
            return True
        if not n:
            raise CoverageGapError(f"tensor {key!r} (0-d) has no range record")
        raise CoverageOverlapError(
            f"tensor {key!r} (0-d) has {n} range records; exactly one is allowed"
        )
    if not n:
        raise CoverageGapError(f"tensor {key!r} of shape {list(shape)} has no range records")
    return False


def _prove(shape: list[int], offs: _Arr, lens: _Arr, key: str, max_grid_cells: int) -> None:
    """Boxes in bounds, at least one, tensor non-empty and at least 1-d: overlaps, then gaps."""
    n = int(offs.shape[0])
    full = np.asarray(shape, dtype=_I64)
    keep = np.flatnonzero(((offs != 0) | (lens != full)).any(axis=0))
    if keep.size == 0:
        if n > 1:
            _overlap(key, offs, lens, 0, 1, "both cover the whole tensor")
        return
    if keep.size < len(shape):
        ko, kl, kshape = offs[:, keep], lens[:, keep], [shape[d] for d in keep.tolist()]
    else:
        ko, kl, kshape = offs, lens, shape
    ctx = _Layout(key, offs, lens, kshape, ko, kl)
    if len(kshape) == 1:
        ctx.check_1d()
        return
    if ctx.total > ctx.numel:
        ctx.report_excess()
    if ctx.grid():
        return
    if (1 << len(kshape)) * n <= 1 << 22 and ctx.grid_cells() <= min(max_grid_cells, 8 * n + 64):
        ctx.count_grid()
        return
    ctx.sweep()


class _Layout:
    """The boxes of one tensor restricted to the dimensions that separate them."""

    def __init__(
        self, key: str, offs: _Arr, lens: _Arr, shape: list[int], ko: _Arr, kl: _Arr
    ) -> None:
        self.key, self.offs, self.lens = key, offs, lens
        self.shape, self.lo, self.hi = shape, ko, ko + kl
        self.n = int(ko.shape[0])
        self.numel = math.prod(shape)
        self.total = _total_volume(kl)

    # -- reports -------------------------------------------------------------------------------
    def overlap(self, i: int, j: int) -> None:
        _overlap(self.key, self.offs, self.lens, i, j, "overlap")

    def report_excess(self) -> None:
        """Volumes above the tensor's size: an overlap exists; name one if the sweep finds it."""
        pair = _sweep_overlap(self.lo, self.hi, WORK_LIMIT)
        if isinstance(pair, tuple):
            self.overlap(*pair)
        raise CoverageOverlapError(
            f"tensor {self.key!r}: the {self.n} ranges hold {self.total} elements, the tensor "
            f"has {self.numel}: some element is stored more than once"
        )

    def gap(self, where: str) -> None:
        raise CoverageGapError(
            f"tensor {self.key!r}: {where} is covered by no range record; a writer's chunk is "
            "missing"
        )

    def short(self, note: str = "") -> None:
        raise CoverageGapError(
            f"tensor {self.key!r}: ranges cover {self.total} of {self.numel} elements; some "
            f"region is missing (a writer's chunk was not recorded){note}"
        )

    # -- strategies ----------------------------------------------------------------------------
    def check_1d(self) -> None:
        order = np.argsort(self.lo[:, 0], kind="stable")
        so, se = self.lo[order, 0], self.hi[order, 0]
        reach = np.maximum.accumulate(se)
        clash = np.flatnonzero(so[1:] < reach[:-1])
        if clash.size:
            k = int(clash[0]) + 1
            j = int(np.argmax(se[:k] > so[k]))  # an earlier range reaching past this start
            self.overlap(int(order[j]), int(order[k]))
        holes = np.flatnonzero(so[1:] > se[:-1])
        if so[0] > 0:
            self.gap(f"elements [0:{int(so[0])}] of the split dimension")
        if holes.size:
            k = int(holes[0])
            self.gap(f"elements [{int(se[k])}:{int(so[k + 1])}] of the split dimension")
        if se[-1] < self.shape[0]:
            self.gap(f"elements [{int(se[-1])}:{self.shape[0]}] of the split dimension")

    def grid(self) -> bool:
        """True when the boxes are the cells of a grid, each once (then the tensor is covered).

        Duplicated cells are an overlap; a grid with missing cells is left to the other checks.
        """
        nd = len(self.shape)
        cells = np.empty((self.n, nd), dtype=_I64)
        size = 1  # a Python int: a grid with cells missing may have more than int64 holds
        for d in range(nd):
            cuts = np.unique(np.concatenate(([0, self.shape[d]], self.lo[:, d], self.hi[:, d])))
            a = np.searchsorted(cuts, self.lo[:, d])
            if not (np.searchsorted(cuts, self.hi[:, d]) == a + 1).all():
                return False  # some box spans several cells of this dimension
            size *= len(cuts) - 1
            cells[:, d] = a
        # A cell used twice is an overlap, also where cells are missing (spec §9, errata 12: a
        # grid is decided without comparing boxes; it was left to the volumes, which said gap).
        order = np.lexsort(cells.T[::-1])
        ordered = cells[order]
        dup = np.flatnonzero((ordered[1:] == ordered[:-1]).all(axis=1))
        if dup.size:
            self.overlap(int(order[dup[0]]), int(order[dup[0] + 1]))
        return size == self.n

    def cuts(self) -> list[_Arr]:
        """Per dimension, the sorted distinct box boundaries (with 0 and the size)."""
        return [np.unique(np.concatenate(([0, s], self.lo[:, d], self.hi[:, d])))
                for d, s in enumerate(self.shape)]

    def grid_cells(self) -> int:
        """Points of the compressed grid's difference array."""
        return math.prod(len(c) for c in self.cuts())

    def count_grid(self) -> None:
        """Count every cell of the compressed grid with an N-d difference array."""
        nd = len(self.shape)
        cuts = self.cuts()
        gshape = tuple(len(c) for c in cuts)
        a = np.stack([np.searchsorted(cuts[d], self.lo[:, d]) for d in range(nd)], 1)
        b = np.stack([np.searchsorted(cuts[d], self.hi[:, d]) for d in range(nd)], 1)
        strides = np.array([math.prod(gshape[d + 1 :]) for d in range(nd)], dtype=_I64)
        pos: list[_Arr] = []
        neg: list[_Arr] = []
        for corner in range(1 << nd):
            sel = np.array([(corner >> d) & 1 for d in range(nd)], dtype=bool)
            (neg if bin(corner).count("1") % 2 else pos).append(np.where(sel, b, a) @ strides)
        size = math.prod(gshape)
        counts: _Arr = np.bincount(np.concatenate(pos), minlength=size).astype(_I64)
        counts = (counts - np.bincount(np.concatenate(neg), minlength=size)).reshape(gshape)
        for d in range(nd):
            counts = np.cumsum(counts, axis=d)
        counts = counts[tuple(slice(0, g - 1) for g in gshape)]
        over = np.flatnonzero(counts > 1)
        if over.size:
            cell = np.unravel_index(int(over[0]), counts.shape)
            inside = np.all((a <= np.array(cell)) & (np.array(cell) < b), axis=1)
            i, j = (int(x) for x in np.flatnonzero(inside)[:2])
            self.overlap(i, j)
        holes = np.flatnonzero(counts == 0)
        if holes.size:
            cell = np.unravel_index(int(holes[0]), counts.shape)
            lo = [int(cuts[d][c]) for d, c in enumerate(cell)]
            hi = [int(cuts[d][c + 1]) for d, c in enumerate(cell)]
            self.gap(f"region offsets={lo} lengths={[h - x for h, x in zip(hi, lo, strict=True)]}"
                     " (in the split dimensions)")

    def sweep(self) -> None:
        tiles: bool | _Budget | None = None
        if self.total == self.numel:
            # Volumes add up: the boxes tile the tensor iff they do not overlap, and the signed
            # sweep decides tiling without comparing boxes pairwise.
            tiles = _tiles(self.lo, self.hi, self.shape, TERM_LIMIT)
            if tiles is True:
                return
        pair = _sweep_overlap(self.lo, self.hi, WORK_LIMIT)
        if isinstance(pair, tuple):
            self.overlap(*pair)
        if pair is None:
            if self.total < self.numel:
                self.short()
            return
        if self.total < self.numel:
            self.short(" (whether ranges also overlap was not decided within the coverage "
                       "budget, spec §9)")
        if tiles is False:
            raise CoverageOverlapError(
                f"tensor {self.key!r}: the {self.n} ranges hold exactly its {self.numel} "
                "elements but do not tile it: some element is stored more than once"
            )
        raise LimitError(
            f"tensor {self.key!r}: its {self.n} ranges differ in {len(self.shape)} dimensions "
            f"without forming a grid, and their coverage could not be proven within "
            f"{WORK_LIMIT} box comparisons (spec §9, R-COVER-4); store it as a grid of ranges"
        )


def _overlap(key: str, offs: _Arr, lens: _Arr, i: int, j: int, what: str) -> None:
    i, j = min(i, j), max(i, j)
    raise CoverageOverlapError(
        f"tensor {key!r}: ranges #{i} {_box(offs, lens, i)} and #{j} {_box(offs, lens, j)} "
        f"{what}; each element must be stored exactly once (replicated data is written by one "
        "writer)"
    )


def _total_volume(lens: _Arr) -> int:
    """Sum of the boxes' volumes, exact (Python ints when int64 could overflow)."""
    if lens.shape[1] == 0:
        return int(lens.shape[0])
    if float(np.log2(np.maximum(lens, 1)).sum(axis=1).max()) + math.log2(len(lens)) < 62:
        return int(np.prod(lens, axis=1).sum())
    return sum(math.prod(row) for row in lens.tolist())


def find_overlap(boxes: Sequence[Box]) -> tuple[int, int] | None:
    """Return the indices of two overlapping boxes (in bounds of some shape), or ``None``."""
    if len(boxes) < 2:
        return None
    nd = boxes[0].ndim
    if nd == 0:
        return (0, 1)
    lo = np.array([b.offsets for b in boxes], dtype=_I64)
    hi = lo + np.array([b.lengths for b in boxes], dtype=_I64)
    found = _sweep_overlap(lo, hi, None)
    return found if isinstance(found, tuple) else None


class _Budget:
    """Returned by a search that would exceed its work limit."""


def _tiles(lo: _Arr, hi: _Arr, shape: Sequence[int], limit: int) -> bool | _Budget:
    """Whether the boxes tile ``shape`` exactly (their volumes must add up), by a signed sweep.

    Let g be the sum of the boxes' indicator functions minus the tensor's. Along one dimension,
    g vanishes iff at every coordinate the boxes starting there minus those ending there (as
    functions of the other dimensions) vanish: each box becomes two signed terms one
    dimension down, grouped by the coordinate. Identical terms of opposite sign cancel at once
    (aligned layouts shrink to nothing after a level or two) and a group whose signed volume is
    not zero proves a non-tiling. At most ``2^d·(n+1)`` terms; ``limit`` bounds the int64
    elements held at once (returns :class:`_Budget` beyond it).
    """
    n, nd = lo.shape
    gid = np.zeros(n + 1, dtype=_I64)
    w = np.ones(n + 1, dtype=_I64)
    w[-1] = -1
    a = np.concatenate([lo, np.zeros((1, nd), dtype=_I64)])
    b = np.concatenate([hi, np.asarray(shape, dtype=_I64)[None]])
    for d in range(nd):
        m = len(w)
        if m * 2 * (2 * (nd - d) + 2) > limit:
            return _Budget()
        coord = np.concatenate([a[:, 0], b[:, 0]])
        g2, w2 = np.concatenate([gid, gid]), np.concatenate([w, -w])
        a2, b2 = np.concatenate([a[:, 1:], a[:, 1:]]), np.concatenate([b[:, 1:], b[:, 1:]])
        order = np.lexsort((coord, g2))
        new = np.ones(2 * m, dtype=bool)
        new[1:] = (g2[order][1:] != g2[order][:-1]) | (coord[order][1:] != coord[order][:-1])
        gid = np.empty(2 * m, dtype=_I64)
        gid[order] = np.cumsum(new) - 1
        gid, w, a, b = _cancel(gid, w2, a2, b2)
        if not len(w):
            return True
        if not _balanced(gid, w, a, b):
            return False
    return not len(w)


def _cancel(gid: _Arr, w: _Arr, a: _Arr, b: _Arr) -> tuple[_Arr, _Arr, _Arr, _Arr]:
    """Merge identical terms (same group and box), dropping those whose weights cancel."""
    keys = [*(b[:, k] for k in range(b.shape[1] - 1, -1, -1)),
            *(a[:, k] for k in range(a.shape[1] - 1, -1, -1)), gid]
    order = np.lexsort(keys)
    gid, w, a, b = gid[order], w[order], a[order], b[order]
    first = np.ones(len(w), dtype=bool)
    first[1:] = (gid[1:] != gid[:-1]) | (a[1:] != a[:-1]).any(axis=1) | (b[1:] != b[:-1]).any(axis=1)
    starts = np.flatnonzero(first)
    sums = np.add.reduceat(w, starts)
    keep = starts[sums != 0]
    return gid[keep], sums[sums != 0], a[keep], b[keep]


def _balanced(gid: _Arr, w: _Arr, a: _Arr, b: _Arr) -> bool:
    """Whether every group's signed volume is zero (mod 2^64: a non-zero residue is a proof)."""
    vol = np.prod((b - a).astype(np.uint64), axis=1) if a.shape[1] else np.ones(len(w), np.uint64)
    starts = np.flatnonzero(np.concatenate(([True], gid[1:] != gid[:-1])))
    sums = np.add.reduceat(vol * w.astype(np.uint64), starts)
    return not sums.any()


def _sweep_overlap(lo: _Arr, hi: _Arr, limit: int | None) -> tuple[int, int] | _Budget | None:
    """Two intersecting boxes (indices), ``None`` if there are none, or a :class:`_Budget`."""
    n, nd = lo.shape
    if n < 2:
        return None
    # Sweep along the dimension with the most distinct starts: fewest boxes active at once.
    dim = max(range(nd), key=lambda d: len(np.unique(lo[:, d])))
    order = np.argsort(lo[:, dim], kind="stable")
    rest = [d for d in range(nd) if d != dim]
    if len(rest) == 1:
        return _sweep_intervals(lo[:, dim], hi[:, dim], lo[:, rest[0]], hi[:, rest[0]], order)
    return _sweep_batches(lo, hi, dim, rest, order, limit)


def _sweep_intervals(
    start: _Arr, end: _Arr, ylo: _Arr, yhi: _Arr, order: _Arr
) -> tuple[int, int] | None:
    """2-d sweep (``O(log n)`` per box).

    The boxes active at one position are disjoint intervals in the other dimension, so a new
    box can only meet its predecessor by start.
    """
    active: SortedList = SortedList()  # (ylo, yhi, index), disjoint intervals
    ending: list[tuple[int, int]] = []  # heap of (end along the sweep, index)
    s, e, a, b = start.tolist(), end.tolist(), ylo.tolist(), yhi.tolist()
    for i in order.tolist():
        while ending and ending[0][0] <= s[i]:
            _, j = heapq.heappop(ending)
            active.remove((a[j], b[j], j))
        k = active.bisect_left((b[i], -1, -1))  # first active interval starting at or after yhi
        if k:
            _, pb, j = active[k - 1]
            if pb > a[i]:
                return (j, i)
        active.add((a[i], b[i], i))
        heapq.heappush(ending, (e[i], i))
    return None


def _sweep_batches(
    lo: _Arr, hi: _Arr, dim: int, rest: list[int], order: _Arr, limit: int | None
) -> tuple[int, int] | _Budget | None:
    """N-d sweep: boxes starting at one position are compared with the active ones and each other.

    Each comparison is one vectorised step; ``limit`` bounds the box pairs (and events).
    """
    starts = lo[order, dim]
    cuts = np.flatnonzero(np.diff(starts)) + 1
    groups = np.split(order, cuts)
    rlo, rhi = lo[:, rest], hi[:, rest]
    act = np.empty(0, dtype=_I64)
    work = 0
    for g in groups:
        x = lo[g[0], dim]
        act = act[hi[act, dim] > x]
        work += len(g) * len(act) + len(g) * (len(g) - 1) // 2 + 64
        if limit is not None and work > limit:
            return _Budget()
        hit = _first_meeting(rlo[g], rhi[g], rlo[act], rhi[act])
        if hit is not None:
            return (int(act[hit[1]]), int(g[hit[0]]))
        hit = _first_meeting(rlo[g], rhi[g], rlo[g], rhi[g], same=True)
        if hit is not None:
            return (int(g[hit[0]]), int(g[hit[1]]))
        act = np.concatenate([act, g])
    return None


def _first_meeting(
    alo: _Arr, ahi: _Arr, blo: _Arr, bhi: _Arr, *, same: bool = False
) -> tuple[int, int] | None:
    """First (i, j) with box a[i] meeting box b[j] (``i < j`` when both are one set)."""
    if not len(alo) or not len(blo):
        return None
    step = max(1, (1 << 22) // max(1, len(blo) * alo.shape[1]))  # bounded temporaries
    for s in range(0, len(alo), step):
        meet = np.all((alo[s : s + step, None] < bhi[None]) & (blo[None] < ahi[s : s + step, None]),
                      axis=2)
        if same:
            meet &= np.arange(s, s + len(meet))[:, None] < np.arange(len(blo))[None]
        hit = np.argwhere(meet)
        if len(hit):
            return (s + int(hit[0, 0]), int(hit[0, 1]))
    return None


class LayoutCache:
    """Layouts already proven to cover their shape exactly once.

    Tensors with the same shape and the same boxes (every layer of a model, and each parameter's
    optimizer moments) share one proof. Candidates are found by (shape, box count) and compared
    element by element, so a hit is exact, never a hash match.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[tuple[int, ...], int], list[tuple[Any, Any]]] = {}

    def check(
        self,
        shape: Sequence[int],
        offs: np.ndarray[Any, Any],
        lens: np.ndarray[Any, Any],
        *,
        key: str = "?",
    ) -> None:
        """:func:`check_coverage_arrays`, skipped when an identical layout was proven before."""
        k = (tuple(int(s) for s in shape), int(offs.shape[0]))
        cands = self._seen.setdefault(k, [])
        for o, n in cands:
            if np.array_equal(o, offs) and np.array_equal(n, lens):
                return
        check_coverage_arrays(k[0], offs, lens, key=key)
        if len(cands) < 8:  # bounded: hostile tables with all-distinct layouts gain nothing
            cands.append((offs, lens))
