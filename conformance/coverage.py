"""Exactly-once coverage of a tensor by its ranges' boxes (spec §9), by box arithmetic.

The checker's own geometry, written from the spec independently of :mod:`portable_ckpt`: a
sweep for overlaps plus a volume count (:func:`check_coverage`).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence

from conformance.store import Problem

__all__ = ["Box", "check_coverage"]

Box = tuple[Sequence[int], Sequence[int]]


def _overlap(a: Box, b: Box) -> Problem:
    lo = [max(x, y) for x, y in zip(a[0], b[0], strict=True)]
    return Problem("PCK-COVERAGE-OVERLAP", f"boxes offsets={list(a[0])} lengths={list(a[1])} and "
                   f"offsets={list(b[0])} lengths={list(b[1])} both cover element {lo}")


def check_coverage(shape: Sequence[int], boxes: Sequence[Box]) -> None:
    """Exactly-once coverage (§9) by box arithmetic: a sweep for overlaps plus a volume count.

    Boxes are already known to be in bounds and non-empty. Without overlaps, the boxes cover
    the tensor iff their volumes add up to the tensor's element count (R-COVER-3). Dimensions
    that every box spans whole cannot separate two boxes and are left out of the sweep. With one
    dimension left the sweep compares neighbours after a sort; with two it keeps the boxes that
    contain the sweep coordinate in a sorted list of (pairwise disjoint) intervals of the other
    dimension and finds the only candidate by bisection: O(n log n) either way. With three or
    more it compares each box with the boxes that contain the sweep coordinate.
    """
    total = math.prod(shape)
    if total == 0:
        if boxes:
            raise Problem("PCK-RANGE-BOUNDS", "a zero-size tensor must have no ranges")
        return
    ndim = len(shape)
    if ndim == 0 or len(boxes) <= 1:
        if len(boxes) > 1:
            raise Problem("PCK-COVERAGE-OVERLAP", f"0-d tensor has {len(boxes)} ranges")
    else:
        keep = [d for d in range(ndim)
                if any(b[0][d] != 0 or b[1][d] != shape[d] for b in boxes)]
        if not keep:  # every box is the whole tensor
            raise _overlap(boxes[0], boxes[1])
        if len(keep) == 1:
            _sweep_1d(keep[0], boxes)
        elif len(keep) == 2:
            a, b = keep
            if len({x[0][b] for x in boxes}) > len({x[0][a] for x in boxes}):
                a, b = b, a
            _sweep_2d(a, b, boxes)
        else:
            _sweep_nd(keep, boxes)
    covered = sum(math.prod(b[1]) for b in boxes)
    if covered < total:
        raise Problem("PCK-COVERAGE-GAP", f"ranges cover {covered} of {total} elements of shape "
                      f"{list(shape)}")


def _sweep_1d(d: int, boxes: Sequence[Box]) -> None:
    order = sorted(boxes, key=lambda b: b[0][d])
    reach = order[0]
    for b in order[1:]:
        if b[0][d] < reach[0][d] + reach[1][d]:
            raise _overlap(reach, b)
        reach = b


def _sweep_2d(sd: int, d2: int, boxes: Sequence[Box]) -> None:
    """Sweep along ``sd``; the active boxes' ``d2`` intervals are pairwise disjoint."""
    order = sorted(range(len(boxes)), key=lambda i: boxes[i][0][sd])
    expiry: list[tuple[int, int]] = []  # heap of (end in sd, start in d2)
    starts: list[int] = []  # sorted d2 starts of the active boxes
    at: dict[int, Box] = {}
    for i in order:
        b = boxes[i]
        pos = b[0][sd]
        while expiry and expiry[0][0] <= pos:
            _, s2 = heapq.heappop(expiry)
            del starts[bisect.bisect_left(starts, s2)]
            del at[s2]
        lo, hi = b[0][d2], b[0][d2] + b[1][d2]
        k = bisect.bisect_left(starts, hi) - 1
        if k >= 0:
            a = at[starts[k]]
            if a[0][d2] + a[1][d2] > lo:
                raise _overlap(a, b)
        bisect.insort(starts, lo)
        at[lo] = b
        heapq.heappush(expiry, (pos + b[1][sd], lo))


def _sweep_nd(dims: Sequence[int], boxes: Sequence[Box]) -> None:
    sd = max(dims, key=lambda d: len({b[0][d] for b in boxes}))
    order = sorted(boxes, key=lambda b: b[0][sd])
    active: list[Box] = []
    for b in order:
        start = b[0][sd]
        active = [a for a in active if a[0][sd] + a[1][sd] > start]
        for a in active:
            if all(a[0][d] < b[0][d] + b[1][d] and b[0][d] < a[0][d] + a[1][d] for d in dims):
                raise _overlap(a, b)
        active.append(b)
