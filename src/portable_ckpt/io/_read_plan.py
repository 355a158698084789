"""A read's plan, made without I/O: the stored pieces that fill a box, the bytes each file gives.

Phases 1 and 2 of a read (:mod:`portable_ckpt.io.reader`), as pure functions and the data they
make: :func:`target_box` checks a requested box; :func:`plan_box` finds the stored pieces that
fill it, a pass of :data:`PIECES_PER_PASS` at a time (:class:`Pieces`); :func:`box_segments`
turns a piece into byte segments of its file, each with the sink that receives it
(:class:`FilePlan`); :func:`balanced` deals files to the reading lanes. Checking pieces against
shard headers, and every read, stay with :class:`~portable_ckpt.io.reader.Checkpoint`.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import numpy as np

from portable_ckpt.errors import CoverageGapError, UsageError
from portable_ckpt.format.manifest import RangeRecord, TensorEntry
from portable_ckpt.io.tensor_table import TableTensorEntry
from portable_ckpt.ranges.box import Box, contiguous_prefix, intersect, strides_of
from portable_ckpt.ranges.planning import RangeIndex, ReadItem, Segment, intersect_arrays

__all__ = [
    "PIECES_PER_PASS",
    "Direct",
    "FilePlan",
    "Pieces",
    "Sink",
    "Strided",
    "balanced",
    "box_segments",
    "plan_box",
    "target_box",
]

#: Tensors with at most this many ranges are planned by intersecting each (no index).
_SCAN_RANGES = 16

#: Stored pieces a read plans and reads at a time. A piece costs about 2 KB while planned
#: (its record, boxes, byte segment and sink), so a tensor of a million tiles (resource review
#: R8: 2.6 GB to load 16 MB) is read in passes of this many, each checksum block read and
#: verified once per pass (a block a pass boundary splits, at most one per file and pass, twice).
PIECES_PER_PASS = 4096


class Pieces:
    """The stored pieces that fill one request's box, built at most a pass at a time.

    A table-backed tensor keeps its hits as numpy rows (about 40 bytes a piece) and makes the
    :class:`ReadItem` objects of a slice only when that slice is planned; a JSON tensor's
    pieces are made from its records (``records``, objects anyway). The pass size is
    :data:`PIECES_PER_PASS` when read.
    """

    __slots__ = ("_built", "_make", "count", "records", "starts")

    def __init__(
        self, count: int, make: Callable[[int, int], list[ReadItem[RangeRecord]]]
    ) -> None:
        self.count = count
        self._make = make
        self._built: list[ReadItem[RangeRecord]] | None = None
        #: The JSON records the pieces are made from (None: a table's rows, or built pieces).
        self.records: list[RangeRecord] | None = None
        #: First byte of each piece in its file, when the pieces are one kept list (found
        #: when they were checked; other pieces are found again as they are planned).
        self.starts: list[int] | None = None

    @classmethod
    def of(cls, items: list[ReadItem[RangeRecord]]) -> Pieces:
        """Pieces already built (at most a pass of a JSON tensor's)."""
        pieces = cls(len(items), lambda a, b: items[a:b])
        pieces._built = items
        return pieces

    @classmethod
    def of_records(cls, records: list[RangeRecord], box: Box) -> Pieces:
        """The pieces of JSON ``records`` that fill ``box``, made a pass at a time."""
        pieces = cls(len(records), lambda a, b: [])
        pieces.reorder(records, box)
        return pieces

    def first(self, keep: bool, box: Box) -> list[ReadItem[RangeRecord]]:
        """All pieces (at most a pass), kept for the read pass when ``keep``.

        Not kept, a JSON tensor's built pieces are dropped for their records (made again when
        read), so that many requests do not hold all their pieces (parser review P2).
        """
        built = self._built if self._built is not None else self._make(0, self.count)
        if keep:
            self._built = built
        elif self._built is not None:
            self._built = None
            self.reorder([item.record for item in built], box)
        return built

    def reorder(self, records: list[RangeRecord], box: Box) -> None:
        """A JSON tensor's pieces: of ``records``, in that order (by file position)."""
        self.records = records

        def make(a: int, b: int) -> list[ReadItem[RangeRecord]]:
            out = []
            for r in records[a:b]:
                stored = r.box
                inter = cast(Box, intersect(stored, box))  # each was found intersecting it
                out.append(ReadItem(r, stored, inter))
            return out

        self._make = make

    def chunks(self) -> Iterable[list[ReadItem[RangeRecord]]]:
        """The pieces in lists of at most :data:`PIECES_PER_PASS`."""
        size = PIECES_PER_PASS  # read here, not bound at import: tests set it small
        if self._built is not None and self.count <= size:
            return (self._built,) if self.count else ()
        return (self._make(a, min(self.count, a + size)) for a in range(0, self.count, size))

    def all(self) -> list[ReadItem[RangeRecord]]:
        """Every piece (for :meth:`Checkpoint.plan_read`; a read goes by :meth:`chunks`)."""
        return self._make(0, self.count) if self._built is None else self._built


class Direct:
    """A destination read in place: ``view`` is exactly the segment's bytes."""

    __slots__ = ("view",)

    def __init__(self, view: memoryview) -> None:
        self.view = view

    def deliver(self, data: memoryview) -> None:
        self.view[:] = data


class Strided:
    """A destination filled from a byte span of a stored chunk with a strided numpy copy."""

    __slots__ = ("dst", "raw", "shape", "strides")

    def __init__(
        self, dst: np.ndarray[Any, Any], isz: int, shape: tuple[int, ...], strides: tuple[int, ...]
    ) -> None:
        self.dst = dst
        # Same-size unsigned ints: as_strided does not accept ml_dtypes' dtypes.
        self.raw = np.dtype(f"u{isz}")
        self.shape = shape
        self.strides = tuple(x * isz for x in strides)

    def deliver(self, data: memoryview) -> None:
        full = np.frombuffer(data, dtype=self.raw)
        view = np.lib.stride_tricks.as_strided(
            full, shape=self.shape, strides=self.strides, writeable=False
        )
        self.dst.view(self.raw)[...] = view


Sink = Direct | Strided


class FilePlan:
    """The byte segments one read needs from one file, with the sink of each."""

    __slots__ = ("segments", "sinks")

    def __init__(self) -> None:
        self.segments: list[Segment] = []
        self.sinks: list[Sink] = []

    def add(self, lo: int, hi: int, sink: Sink) -> None:
        self.segments.append(Segment(lo, hi, len(self.sinks), isinstance(sink, Direct)))
        self.sinks.append(sink)

    @property
    def nbytes(self) -> int:
        """Bytes the segments ask for (overlaps counted twice)."""
        return sum(s.hi - s.lo for s in self.segments)


def target_box(
    t: TensorEntry, offsets: Sequence[int] | None, lengths: Sequence[int] | None
) -> Box:
    """The box a caller asks of ``t`` (all of it by default), refused unless inside its shape."""
    offs = _indices(offsets, "offsets", t.key) if offsets is not None else (0,) * len(t.shape)
    lens = (
        _indices(lengths, "lengths", t.key)
        if lengths is not None
        else tuple(s - o for s, o in zip(t.shape, offs, strict=False))
    )
    box = Box(offs, lens)
    if len(offs) != len(t.shape) or len(lens) != len(t.shape) or not box.within(t.shape):
        raise UsageError(
            f"tensor {t.key!r}: requested box offsets={list(offs)} lengths={list(lens)} is not "
            f"inside its shape {list(t.shape)}"
        )
    return box


def _indices(xs: Sequence[int], what: str, key: str) -> tuple[int, ...]:
    """``xs`` as ints: Python or numpy integers only.

    ``int()`` would truncate 0.5 to 0, and read another box than the caller meant.
    """
    if type(xs) is tuple and all(type(x) is int for x in xs):
        return xs  # already what is returned (the planner's own boxes): nothing to convert
    items: tuple[Any, ...] = ()
    try:
        items = tuple(xs)  # read once: it may be an iterator
        out = tuple(operator.index(x) for x in items)
    except TypeError:
        out = None
    if out is None or any(isinstance(x, bool) for x in items):
        raise UsageError(f"tensor {key!r}: {what} must be a sequence of integers, got {xs!r:.80}")
    return out


def plan_box(t: TensorEntry, box: Box, indexes: dict[str, RangeIndex[RangeRecord]]) -> Pieces:
    """The pieces of an already validated ``box`` of ``t`` (coverage of it proven).

    ``indexes``: the reader's range indexes by tensor key, one added when ``t`` needs it.
    """
    if box.volume == 0:
        return Pieces(0, lambda a, b: [])
    if isinstance(t, TableTensorEntry) and t.table_ranges_untouched:
        return _plan_table(t, box)
    if len(t.ranges) <= _SCAN_RANGES:
        # A handful of ranges (a model's tensors have one per writer): intersecting each is
        # cheaper than building and querying an index used once per load.
        items = []
        for r in t.ranges:
            stored = r.box
            inter = intersect(stored, box)
            if inter is not None:
                items.append(ReadItem(r, stored, inter))
    else:
        index = indexes.get(t.key)
        if index is None:
            index = indexes[t.key] = RangeIndex([(r.box, r) for r in t.ranges])
        items = index.query(box)
    got = sum(it.box.volume for it in items)
    if got != box.volume:
        raise CoverageGapError(
            f"tensor {t.key!r}: the stored ranges provide {got} of the {box.volume} elements "
            f"of box {box}; the version is incomplete"
        )
    if len(items) <= PIECES_PER_PASS:
        return Pieces.of(items)
    # Only the records are kept (their objects exist anyway); a pass's pieces are made
    # again from them, so many large requests do not hold every piece (review P2).
    return Pieces.of_records([it.record for it in items], box)


def _plan_table(t: TableTensorEntry, box: Box) -> Pieces:
    """Vectorised plan over a table-backed tensor: records are built for the hits only."""
    offs, lens = t.boxes()
    rows, lo, hi = intersect_arrays(offs, lens, box)
    vols = np.prod(hi - lo, axis=1) if lo.shape[1] else np.ones(len(rows), np.int64)
    got = int(vols.sum())
    if got != box.volume:
        raise CoverageGapError(
            f"tensor {t.key!r}: the stored ranges provide {got} of the {box.volume} elements "
            f"of box {box}; the version is incomplete"
        )

    def make(i: int, k: int) -> list[ReadItem[RangeRecord]]:
        recs = t.records(rows[i:k])
        return [
            ReadItem(rec, rec.box, Box(tuple(a), tuple(x - y for x, y in zip(b, a, strict=True))))
            for rec, a, b in zip(recs, lo[i:k].tolist(), hi[i:k].tolist(), strict=True)
        ]

    return Pieces(len(rows), make)


def box_segments(
    plan: FilePlan,
    bs: int,
    base: int,
    chunk_shape: Sequence[int],
    isz: int,
    rel: Box,
    dst: np.ndarray[Any, Any],
    window: int,
) -> None:
    """Add the byte segments that fill ``dst`` with box ``rel`` of the chunk at ``base``.

    ``window``: the largest byte span of a segment copied out through scratch.
    """
    strides = strides_of(chunk_shape)
    first = sum(o * s for o, s in zip(rel.offsets, strides, strict=True))
    last = sum(
        (o + n - 1) * s for o, n, s in zip(rel.offsets, rel.lengths, strides, strict=True)
    )
    lo = base + first * isz
    hi = base + (last + 1) * isz
    needed = rel.volume * isz
    if contiguous_prefix(rel, chunk_shape) == 0 and dst.flags.c_contiguous:
        plan.add(lo, hi, Direct(dst.reshape(-1).view(np.uint8).data))
        return
    span = hi - lo
    d = next((i for i, n in enumerate(rel.lengths) if n > 1), None)
    sparse = d is not None and strides[d] * isz >= 2 * bs + needed // max(rel.lengths[d], 1)
    if d is None or (span <= window and not sparse):
        plan.add(lo, hi, Strided(dst, isz, rel.lengths, strides))
        return
    # Split along the first non-unit dimension: into single indices when rows are far apart
    # (skips the gaps), else into pieces whose span fits the window.
    n = rel.lengths[d]
    parts = n if sparse else max(2, -(-span // window))
    edges = [n * i // parts for i in range(parts + 1)]
    for a, b in itertools.pairwise(edges):
        if a == b:
            continue
        sub = Box(
            rel.offsets[:d] + (rel.offsets[d] + a,) + rel.offsets[d + 1 :],
            rel.lengths[:d] + (b - a,) + rel.lengths[d + 1 :],
        )
        idx = tuple(slice(None) for _ in range(d)) + (slice(a, b),)
        box_segments(plan, bs, base, chunk_shape, isz, sub, dst[idx], window)


def balanced(paths: Sequence[str], nbytes: dict[str, int], lanes: int) -> list[list[str]]:
    """Files per lane: the largest first, each to the lane with the fewest bytes so far.

    Dealing files round-robin by name put a rank's two large files on one lane when a small
    file sorted between them (the whole-tensor file beside rank 0's pieces, read by a 4 -> 2
    load), and the second lane idled. Each lane reads its files in name order.
    """
    share: list[list[str]] = [[] for _ in range(lanes)]
    load = [0] * lanes
    for p in sorted(paths, key=lambda p: (-nbytes[p], p)):
        i = min(range(lanes), key=lambda k: (load[k], k))
        share[i].append(p)
        load[i] += nbytes[p]
    return [sorted(s) for s in share]
