"""Exactly-once coverage of a tensor by a set of boxes.

Algorithm (spec §Coverage, informative): bounds and volume are checked first; then the boxes'
corners are coordinate-compressed along each dimension and every compressed cell is counted with an
N-d difference array (numpy, ``O(n·2^d + cells)``). Layouts produced by real shardings have about
as many cells as boxes. When the compressed grid would be too large, a sweep along the dimension
with the most distinct starts finds overlaps instead, and a volume count proves the absence of gaps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from portable_ckpt.errors import CoverageGapError, CoverageOverlapError, RangeBoundsError
from portable_ckpt.ranges.box import Box

__all__ = [
    "MAX_GRID_CELLS",
    "check_coverage",
    "check_coverage_arrays",
    "LayoutCache",
    "find_overlap",
]

#: Largest compressed grid counted with the difference array before falling back to a sweep.
MAX_GRID_CELLS = 1 << 24


def _bounds(shape: Sequence[int], boxes: Sequence[Box], key: str) -> None:
    nd = len(shape)
    for i, b in enumerate(boxes):
        if b.ndim != nd or len(b.lengths) != nd:
            raise RangeBoundsError(
                f"tensor {key!r}: range #{i} {b} has rank {b.ndim}, the tensor has rank {nd}"
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

    ``max_grid_cells`` bounds the counting grid; larger layouts use the sweep.

    Raises:
        RangeBoundsError: a box of the wrong rank, empty, or outside the tensor.
        CoverageOverlapError: some element is covered twice (the message names both boxes).
        CoverageGapError: some element is covered by no box (the message names one).

    """
    shape = [int(s) for s in shape]
    _bounds(shape, boxes, key)
    numel = math.prod(shape)
    if numel == 0:
        if boxes:
            raise RangeBoundsError(f"tensor {key!r} has zero elements but {len(boxes)} range(s)")
        return
    if len(shape) == 0:
        if len(boxes) == 1:
            return
        if not boxes:
            raise CoverageGapError(f"tensor {key!r} (0-d) has no range record")
        raise CoverageOverlapError(
            f"tensor {key!r} (0-d) has {len(boxes)} range records; exactly one is allowed"
        )
    if not boxes:
        raise CoverageGapError(f"tensor {key!r} of shape {shape} has no range records")
    total = sum(b.volume for b in boxes)
    # Dimensions every box spans fully cannot separate boxes: drop them (a hostile 64-d
    # [1, ..., 1] tensor must not cost 2^64 corners).
    keep = [
        d
        for d in range(len(shape))
        if any(b.offsets[d] != 0 or b.lengths[d] != shape[d] for b in boxes)
    ]
    if len(keep) < len(shape):
        if not keep:
            if len(boxes) > 1:
                raise CoverageOverlapError(
                    f"tensor {key!r}: ranges #0 {boxes[0]} and #1 {boxes[1]} overlap (both "
                    "cover the whole tensor)"
                )
            return
        shape = [shape[d] for d in keep]
        boxes = [
            Box(tuple(b.offsets[d] for d in keep), tuple(b.lengths[d] for d in keep)) for b in boxes
        ]
    if len(shape) == 1:
        _check_1d(shape[0], boxes, key)
        return
    cells = 1
    cuts: list[np.ndarray] = []
    for d in range(len(shape)):
        pts = {0, shape[d]}
        for b in boxes:
            pts.add(b.offsets[d])
            pts.add(b.offsets[d] + b.lengths[d])
        arr = np.array(sorted(pts), dtype=np.int64)
        cuts.append(arr)
        cells *= len(arr) - 1
    # The difference array has prod(cuts) cells and every box touches 2^d corners.
    grid_cost = max(cells, (1 << len(shape)) * len(boxes))
    if len(shape) <= 16 and grid_cost <= max_grid_cells:
        _check_grid(shape, boxes, cuts, key)
        return
    overlap = find_overlap(boxes)
    if overlap is not None:
        i, j = overlap
        raise CoverageOverlapError(
            f"tensor {key!r}: ranges #{i} {boxes[i]} and #{j} {boxes[j]} overlap; each element "
            "must be stored exactly once (replicated data is written by one writer)"
        )
    if total != numel:
        raise CoverageGapError(
            f"tensor {key!r}: ranges cover {total} of {numel} elements; some region is missing "
            "(a writer's chunk was not recorded)"
        )


def _check_1d(n: int, boxes: Sequence[Box], key: str) -> None:
    order = sorted(range(len(boxes)), key=lambda i: boxes[i].offsets[0])
    # Overlaps take precedence over gaps (spec: one code per tensor, overlap first).
    end = -1
    prev = -1
    for i in order:
        if boxes[i].offsets[0] < end:
            raise CoverageOverlapError(
                f"tensor {key!r}: ranges #{prev} {boxes[prev]} and #{i} {boxes[i]} overlap; each "
                "element must be stored exactly once"
            )
        if boxes[i].offsets[0] + boxes[i].lengths[0] > end:
            end = boxes[i].offsets[0] + boxes[i].lengths[0]
            prev = i
    pos = 0
    for i in order:
        o = boxes[i].offsets[0]
        if o > pos:
            raise CoverageGapError(f"tensor {key!r}: elements [{pos}:{o}] are covered by no range")
        pos = o + boxes[i].lengths[0]
    if pos != n:
        raise CoverageGapError(f"tensor {key!r}: elements [{pos}:{n}] are covered by no range")


def _check_grid(
    shape: Sequence[int], boxes: Sequence[Box], cuts: list[np.ndarray], key: str
) -> None:
    nd = len(shape)
    gshape = tuple(len(c) - 1 for c in cuts)
    lo = np.empty((len(boxes), nd), dtype=np.int64)
    hi = np.empty((len(boxes), nd), dtype=np.int64)
    offs = np.array([b.offsets for b in boxes], dtype=np.int64)
    ends = offs + np.array([b.lengths for b in boxes], dtype=np.int64)
    for d in range(nd):
        lo[:, d] = np.searchsorted(cuts[d], offs[:, d])
        hi[:, d] = np.searchsorted(cuts[d], ends[:, d])
    diff = np.zeros(tuple(g + 1 for g in gshape), dtype=np.int32)
    # Inclusion–exclusion over the 2^d corners of every box.
    for corner in range(1 << nd):
        idx = []
        sign = 1
        for d in range(nd):
            if corner >> d & 1:
                idx.append(hi[:, d])
                sign = -sign
            else:
                idx.append(lo[:, d])
        np.add.at(diff, tuple(idx), sign)
    counts = diff
    for d in range(nd):
        counts = np.cumsum(counts, axis=d, dtype=np.int32)
    counts = counts[tuple(slice(0, g) for g in gshape)]
    bad = np.flatnonzero(counts > 1)
    if bad.size == 0:
        bad = np.flatnonzero(counts == 0)
    if bad.size == 0:
        return
    cell = np.unravel_index(int(bad[0]), gshape)
    where = Box(
        tuple(int(cuts[d][cell[d]]) for d in range(nd)),
        tuple(int(cuts[d][cell[d] + 1] - cuts[d][cell[d]]) for d in range(nd)),
    )
    c = int(counts[cell])
    if c == 0:
        raise CoverageGapError(
            f"tensor {key!r}: region {where} is covered by no range record; a writer's chunk is "
            "missing"
        )
    members = [
        i for i in range(len(boxes)) if all(lo[i, d] <= cell[d] < hi[i, d] for d in range(nd))
    ][:2]
    raise CoverageOverlapError(
        f"tensor {key!r}: region {where} is covered {c} times (ranges "
        + " and ".join(f"#{i} {boxes[i]}" for i in members)
        + "); each element must be stored exactly once"
    )


def find_overlap(boxes: Sequence[Box]) -> tuple[int, int] | None:
    """Return the indices of two overlapping boxes, or ``None`` (sweep-line algorithm)."""
    if len(boxes) < 2:
        return None
    nd = boxes[0].ndim
    if nd == 0:
        return (0, 1)
    # Sweep along the dimension with the most distinct starts: fewest boxes active at once.
    dim = max(range(nd), key=lambda d: len({b.offsets[d] for b in boxes}))
    order = sorted(range(len(boxes)), key=lambda i: boxes[i].offsets[dim])
    active: list[int] = []
    for i in order:
        bi = boxes[i]
        start = bi.offsets[dim]
        active = [j for j in active if boxes[j].offsets[dim] + boxes[j].lengths[dim] > start]
        for j in active:
            bj = boxes[j]
            if all(
                bi.offsets[d] < bj.offsets[d] + bj.lengths[d]
                and bj.offsets[d] < bi.offsets[d] + bi.lengths[d]
                for d in range(nd)
            ):
                return (j, i)
        active.append(i)
    return None


def check_coverage_arrays(
    shape: Sequence[int],
    offs: np.ndarray[Any, Any],
    lens: np.ndarray[Any, Any],
    *,
    key: str = "?",
    max_grid_cells: int = MAX_GRID_CELLS,
) -> None:
    """:func:`check_coverage` for boxes given as ``[n, ndim]`` int64 arrays (vectorised).

    The common case (valid layouts) runs in a few numpy passes without per-box objects; any
    failure, and layouts the fast paths do not handle, go through :func:`check_coverage`, so
    codes and messages are the same for both forms.
    """
    shape = [int(s) for s in shape]
    nd = len(shape)
    n = int(offs.shape[0])

    def exact() -> None:
        boxes = [
            Box(tuple(o), tuple(ln))
            for o, ln in zip(offs.tolist(), lens.tolist(), strict=True)
        ]
        check_coverage(shape, boxes, key=key, max_grid_cells=max_grid_cells)

    if nd == 0 or n == 0 or math.prod(shape) == 0:
        exact()
        return
    shp = np.asarray(shape, dtype=np.int64)
    ends = offs + lens
    if (lens < 1).any() or (offs < 0).any() or (ends > shp).any():
        exact()
        return
    keep = [d for d in range(nd) if (offs[:, d] != 0).any() or (lens[:, d] != shape[d]).any()]
    if not keep:
        if n != 1:
            exact()
        return
    if len(keep) == 1:
        d = keep[0]
        order = np.argsort(offs[:, d], kind="stable")
        so, se = offs[order, d], ends[order, d]
        if so[0] != 0 or se[-1] != shape[d] or (so[1:] != se[:-1]).any():
            exact()
        return
    cuts = [np.unique(np.concatenate(([0, shape[d]], offs[:, d], ends[:, d]))) for d in keep]
    gshape = tuple(len(c) for c in cuts)
    size = math.prod(gshape)
    k = len(keep)
    if k > 16 or size > max_grid_cells or (1 << k) * n > max_grid_cells:
        exact()
        return
    lo = np.stack([np.searchsorted(cuts[i], offs[:, d]) for i, d in enumerate(keep)], 1)
    hi = np.stack([np.searchsorted(cuts[i], ends[:, d]) for i, d in enumerate(keep)], 1)
    strides = np.array([math.prod(gshape[i + 1 :]) for i in range(k)], dtype=np.int64)
    pos: list[np.ndarray[Any, Any]] = []
    neg: list[np.ndarray[Any, Any]] = []
    for corner in range(1 << k):
        sel = np.array([(corner >> i) & 1 for i in range(k)], dtype=bool)
        (neg if bin(corner).count("1") % 2 else pos).append(np.where(sel, hi, lo) @ strides)
    # Inclusion–exclusion over the 2^k corners; bincount is much faster than np.add.at.
    counts = (
        np.bincount(np.concatenate(pos), minlength=size).astype(np.int64)
        - np.bincount(np.concatenate(neg), minlength=size)
    ).reshape(gshape)
    for i in range(k):
        counts = np.cumsum(counts, axis=i)
    if not (counts[tuple(slice(0, g - 1) for g in gshape)] == 1).all():
        exact()


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
