"""Read planning: which stored ranges feed a target box (no I/O here).

Stored ranges of a tensor are indexed once, sorted by their start along the dimension with the most
distinct starts; a query then bisects to the candidates instead of scanning every range
(``O(log n + k)`` for the layouts real shardings produce).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from portable_ckpt.ranges.box import Box, intersect

__all__ = ["RangeIndex", "ReadItem", "intersect_arrays", "plan_reads"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ReadItem(Generic[T]):
    """One piece of a read: the stored ``record`` provides global ``box``."""

    record: T
    stored: Box
    box: Box


class RangeIndex(Generic[T]):
    """An interval index over the stored boxes of one tensor."""

    def __init__(self, items: Sequence[tuple[Box, T]]) -> None:
        self._items = list(items)
        nd = self._items[0][0].ndim if self._items else 0
        self._dim = 0
        if nd:
            self._dim = max(range(nd), key=lambda d: len({b.offsets[d] for b, _ in self._items}))
        self._items.sort(key=lambda it: it[0].offsets[self._dim] if nd else 0)
        self._starts = [b.offsets[self._dim] if nd else 0 for b, _ in self._items]
        self._maxlen = max((b.lengths[self._dim] for b, _ in self._items), default=0) if nd else 0
        self._nd = nd

    def query(self, target: Box) -> list[ReadItem[T]]:
        """Return the stored pieces intersecting ``target``, in stored order."""
        if self._nd == 0:
            return [ReadItem(rec, b, target) for b, rec in self._items]
        d = self._dim
        lo = bisect.bisect_left(self._starts, target.offsets[d] - self._maxlen + 1)
        hi = bisect.bisect_left(self._starts, target.offsets[d] + target.lengths[d])
        out: list[ReadItem[T]] = []
        for b, rec in self._items[lo:hi]:
            inter = intersect(b, target)
            if inter is not None:
                out.append(ReadItem(rec, b, inter))
        return out


def plan_reads(index: RangeIndex[T], target: Box) -> list[ReadItem[T]]:
    """Plan the pieces that fill ``target`` (see :meth:`RangeIndex.query`)."""
    return index.query(target)


def intersect_arrays(
    offs: np.ndarray[Any, Any], lens: np.ndarray[Any, Any], target: Box
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Stored boxes (``[n, ndim]`` arrays) that intersect ``target``, in one vectorised pass.

    Returns:
        ``(rows, lo, hi)``: indices of the intersecting boxes and, per hit, the intersection as
        global start and end coordinates (``[k, ndim]``).

    """
    t_lo = np.asarray(target.offsets, dtype=np.int64)
    t_hi = t_lo + np.asarray(target.lengths, dtype=np.int64)
    if offs.shape[1] == 0:
        rows = np.arange(offs.shape[0])
        return rows, offs[rows], offs[rows] + lens[rows]
    # Filter on dimension 0 alone first (one column, one pass); the full N-d test then runs on
    # the few candidates only: about 3x faster on the thousands of boxes of a large layout.
    o0 = offs[:, 0]
    cand = np.flatnonzero((o0 < t_hi[0]) & (o0 + lens[:, 0] > t_lo[0]))
    oc = offs[cand]
    lo = np.maximum(oc, t_lo)
    hi = np.minimum(oc + lens[cand], t_hi)
    keep = (hi > lo).all(axis=1)
    return cand[keep], lo[keep], hi[keep]
