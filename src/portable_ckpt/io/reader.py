"""The reader: open a committed version, read any box of any tensor, verify what was read.

A read (:meth:`Checkpoint.read`, or :meth:`Checkpoint.read_many` for many boxes at once) runs in
three phases:

1. **Plan pieces** (no I/O but shard headers): per request, the stored ranges that feed its box
   (``ranges.planning``), every piece checked against its shard header, destinations allocated.
2. **Plan bytes per file**: every piece becomes byte segments of its file — one segment when the
   piece is one contiguous run of the stored chunk and of the destination (read straight into
   the destination), else bounded windows or rows copied out with numpy. All segments of one
   file are planned together (:func:`~portable_ckpt.ranges.planning.plan_file`): sorted,
   coalesced into extents of whole checksum blocks, each byte read once and each block
   verified once however many tensors share it.
3. **Execute** each file's plan (:func:`~portable_ckpt.io.checksum.read_planned`), pipelined:
   reads of the next window overlap the checksums and copies of the current one;
   :data:`FILE_LANES` files at a time, each with its own I/O thread.

Bytes after a shard header that share its checksum blocks were verified with the header; they
are kept (within :data:`PREFIX_BUDGET`) and served without reading them again — small tensors
that writers store right after the header cost no extra read.

This module opens the version and reads; what a read needs is planned, without I/O, by
:mod:`portable_ckpt.io._read_plan` (the pieces of a box, a piece's byte segments); an entry's
value is chosen and decoded by :mod:`portable_ckpt.io._entries`; :meth:`Checkpoint.verify` is
:mod:`portable_ckpt.io._verify`. The knobs (``WINDOW_BYTES``, ``ZSTD_*``, ``FILE_LANES``,
``PREFIX_BUDGET``) stay here; ``PIECES_PER_PASS`` is the plan's.
"""

from __future__ import annotations

import functools
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, cast

import numpy as np

from portable_ckpt._gc import paused_gc
from portable_ckpt._threads import worker
from portable_ckpt.errors import (
    CheckpointError,
    ChecksumError,
    DtypeUnsupportedError,
    DtypeValueError,
    FileMissingError,
    FileSizeError,
    LimitError,
    TensorMissingError,
    UsageError,
    VersionDeletedError,
)
from portable_ckpt.format.dtypes import DTYPES
from portable_ckpt.format.keys import similar_keys
from portable_ckpt.format.manifest import (
    Continuation,
    Entry,
    FileRecord,
    Manifest,
    RangeRecord,
    TableRef,
    TensorEntry,
)
from portable_ckpt.format.naming import ATTEMPT_ID_RE
from portable_ckpt.io import _read_plan  # PIECES_PER_PASS is read at call time: tests set it
from portable_ckpt.io._blame import name_block
from portable_ckpt.io._entries import NO_VALUE, entry_value
from portable_ckpt.io._entries import _NoValue as _NoValue  # pickles of NO_VALUE name it here
from portable_ckpt.io._read_plan import (
    Direct,
    FilePlan,
    Pieces,
    Strided,
    balanced,
    box_segments,
    plan_box,
    target_box,
)
from portable_ckpt.io._zstd_box import stream_box
from portable_ckpt.io.checksum import read_planned, read_verified
from portable_ckpt.io.codec import FrameStream, check_frame_header, decompress_frame
from portable_ckpt.io.safetensors_io import ShardHeader, ShardTensor, check_range, load_header
from portable_ckpt.io.table_decode import decode_table, read_table_file
from portable_ckpt.io.tensor_table import TableTensorEntry
from portable_ckpt.logs import Progress
from portable_ckpt.ranges.box import Box
from portable_ckpt.ranges.coverage import LayoutCache, check_coverage
from portable_ckpt.ranges.planning import RangeIndex, ReadItem, Segment, plan_file
from portable_ckpt.storage.base import Storage

__all__ = [
    "NO_VALUE",
    "PREFIX_BUDGET",
    "WINDOW_BYTES",
    "Checkpoint",
    "ReadRequest",
    "ReadStats",
    "TensorInfo",
]


#: Files a read reads at the same time (see ``Checkpoint._run_plans``).
FILE_LANES = 2
#: Largest scratch window for reads that cannot go straight into the destination.
WINDOW_BYTES = 16 << 20

#: zstd ranges up to this size are decoded whole (and kept for the next read of the same range);
#: larger ones are streamed, holding ``ZSTD_WINDOW_BYTES`` decoded and ``ZSTD_INPUT_BYTES`` stored.
ZSTD_WHOLE_BYTES = 16 << 20
ZSTD_WINDOW_BYTES = 4 << 20
ZSTD_INPUT_BYTES = 1 << 20

#: Most bytes after shard headers kept verified for later reads (per opened version).
PREFIX_BUDGET = 16 << 20

#: read), kept per version for the next read of them: at most this many (about 1.2 MB, a
#: model's state), then forgotten. A read checks every piece before it allocates, then finds
#: it again when read.
_RANGES_CHECKED = 1 << 12


def _alike(key: Any, keys: Mapping[str, Any]) -> str:
    """Stored keys that look like a missing ``key``, for its message ("" for none)."""
    found = similar_keys(key, keys) if isinstance(key, str) else []
    return f"; stored keys that look alike: {found}" if found else ""


#: Public name of a tensor's metadata record.
TensorInfo = TensorEntry


@dataclass(frozen=True)
class ReadRequest:
    """One box of one tensor for :meth:`Checkpoint.read_many` (arguments as :meth:`~Checkpoint.read`)."""

    key: str
    offsets: Sequence[int] | None = None
    lengths: Sequence[int] | None = None
    out: np.ndarray[Any, Any] | None = None



@dataclass
class ReadStats:
    """Counters of one :class:`Checkpoint` (thread-safe updates).

    Attributes:
        bytes_read: Bytes fetched from storage (data plus checksum-block edges).
        bytes_delivered: Bytes written into destinations.
        peak_scratch_bytes: Largest temporary buffer alive at once.
        blocks_verified: Checksum blocks verified.

    """

    bytes_read: int = 0
    bytes_delivered: int = 0
    peak_scratch_bytes: int = 0
    blocks_verified: int = 0


#: Decoded zstd ranges a Checkpoint keeps (each at most ZSTD_WHOLE_BYTES): at most this many,
#: and at most _ZCACHE_BYTES together beyond the newest.
_ZCACHE_ENTRIES = 4
_ZCACHE_BYTES = 2 * ZSTD_WHOLE_BYTES

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _deleted_is_said(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """A file found missing because its version was deleted raises :class:`VersionDeletedError`.

    Retention or gc that removes a version while a reader reads it (a serving process polling
    a root a trainer keeps writing) made reads fail with a plain ``PCK-FILE-MISSING``, the
    error of a damaged version (serving review F1). gc deletes the commit record first, so a
    missing file whose record is gone too is a deleted version.
    """

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return fn(*args, **kwargs)
        except VersionDeletedError:
            raise
        except FileMissingError as e:
            gone = cast("Checkpoint", args[0])._deleted(e)
            if gone is None:
                raise
            raise gone from e

    return wrapper


class Checkpoint:
    """One committed version, opened for reading. Create with :func:`portable_ckpt.open`."""

    def __init__(self, storage: Storage, attempt_id: str, manifest: Manifest) -> None:
        self.storage = storage
        self.manifest = manifest
        self.stats = ReadStats()
        self._lock = threading.Lock()
        self._headers: dict[str, ShardHeader] = {}
        self._sizes_checked: set[str] = set()
        self._covered: set[str] = set()
        #: Ranges checked (at most _RANGES_CHECKED, then forgotten).
        self._ranges_checked: dict[tuple[Any, ...], ShardTensor] = {}
        self._indexes: dict[str, RangeIndex[RangeRecord]] = {}
        #: Decoded zstd ranges, most recent last; at most _ZCACHE_ENTRIES. One entry thrashed
        #: when threads shared a Checkpoint (serving review F8: 2x the bytes, 3.3x the time).
        self._zcache: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()
        #: path -> (offset, verified bytes after the header in the header's last blocks).
        self._prefix: dict[str, tuple[int, bytes]] = {}
        self._prefix_bytes = 0
        self._attempt = attempt_id
        #: Layouts already proven to cover their shape exactly once (table-backed tensors).
        self._layouts = LayoutCache()
        #: The same for JSON tensors: (shape, boxes) proven.
        self._proven: set[tuple[Any, ...]] = set()
        if manifest.tensor_table is not None and not manifest.tensors:
            self._load_table(manifest.tensor_table)

    def _load_table(self, ref: TableRef) -> None:
        """Read, verify and decode the version's tensor table (spec §8.5, R-TABLE-8)."""
        rec = self._file(ref.file)
        buf = read_table_file(
            lambda lo, hi, dest: self._read_verified(ref.file, lo, hi, dest),
            size=rec.size,
            codec=ref.codec,
            block_size=rec.checksum.block_size,
            what=self._rel(ref.file),
        )
        table = decode_table(
            buf, codec=ref.codec, what=self._rel(ref.file), files=self.manifest.files
        )
        # as the JSON tensors' (review D1)
        problem = table.dtypes_not_defined(
            self.manifest.format_version, self.manifest.must_understand
        )
        if problem:
            raise DtypeUnsupportedError(f"{self._rel(ref.file)}: {problem}", path=ref.file)
        self.manifest.tensors = dict(table.entries())

    # -- metadata ----------------------------------------------------------------------------------
    @property
    def id(self) -> str:
        """The attempt id of this version."""
        return self._attempt

    @property
    def step(self) -> int:
        """The completed training step this version holds."""
        return self.manifest.step

    @property
    def path(self) -> str:
        """Location of the version directory."""
        base = self.storage.url.rstrip("/")
        return f"{base}/{self._attempt}"

    @property
    def continuation(self) -> Continuation:
        """The continuation contract recorded at save time."""
        return self.manifest.continuation

    @property
    def tensors(self) -> dict[str, TensorEntry]:
        """Tensor key → metadata (dtype, shape, ranges)."""
        return self.manifest.tensors

    @property
    def entries(self) -> dict[str, Entry]:
        """Entry name → declaration."""
        return self.manifest.entries

    def __repr__(self) -> str:
        return f"Checkpoint({self.path!r}, step={self.step}, tensors={len(self.tensors)})"

    def _rel(self, path: str) -> str:
        return f"{self._attempt}/{path}"

    def _deleted(self, cause: CheckpointError | None = None) -> VersionDeletedError | None:
        """The error to raise when this version was deleted under the reader, else ``None``.

        Deleted: its commit record is gone, and the root still holds a committed version
        (retention and gc never delete the last one). A root that holds none is not this
        version's root (a rank of a group given a wrong path, which received the record from
        rank 0), or was removed as a whole: the file's absence stands as it is.
        """
        try:
            if self.storage.exists(self._rel("manifest.json")):
                return None
            if not self._root_holds_another():
                return None
        except CheckpointError:
            return None  # could not tell: the original error stands
        what = f"{cause.path!r} is gone and so is" if cause is not None and cause.path else "lost"
        return VersionDeletedError(
            f"version {self.id} was deleted while it was read ({what} its commit record): "
            "retention or gc removed it, this is not damage. Open the root again for the newest "
            "version; pin a version (`portable-ckpt pin`) for as long as a reader needs it",
            path=self._rel("manifest.json"),
        )

    def _root_holds_another(self) -> bool:
        """Whether one of the root's newest attempts (16 at most) has a commit record."""
        names = sorted(
            (d for d in self.storage.list_dirs("") if d != self._attempt and ATTEMPT_ID_RE.fullmatch(d)),
            reverse=True,
        )
        return any(self.storage.exists(f"{d}/manifest.json") for d in names[:16])

    def _file(self, path: str) -> FileRecord:
        rec = self.manifest.files[path]
        if path not in self._sizes_checked:
            actual = self.storage.size(self._rel(path))
            if actual != rec.size:
                raise FileSizeError(
                    f"{self._rel(path)!r} is {actual} bytes, the manifest records {rec.size} "
                    f"({'truncated' if actual < rec.size else 'extended'}); the version is damaged",
                    path=path,
                )
            self._sizes_checked.add(path)
        return rec

    def _header(self, path: str) -> ShardHeader:
        hdr = self._headers.get(path)
        if hdr is None:
            rec = self._file(path)
            bs = rec.checksum.block_size
            blocks: list[tuple[int, bytearray]] = []

            def read(lo: int, hi: int) -> memoryview:
                # Whole blocks (a verified read costs them anyway); they are kept below.
                a, b = lo // bs * bs, min(-(-hi // bs) * bs, rec.size)
                buf = bytearray(b - a)
                self._read_verified(path, a, b, memoryview(buf))
                last = max(a, b - bs)  # only the last block is kept (_keep_prefix), not buf
                blocks.append((last, buf[last - a :]))
                return memoryview(buf)[lo - a : hi - a]  # not copied: a header may be 100 MB

            # Header bytes are verified against their checksum blocks before they are parsed.
            hdr = load_header(read, file_size=rec.size, what=self._rel(path), probe=bs)
            self._headers[path] = hdr
            self._keep_prefix(path, hdr.data_start, blocks)
        return hdr

    def _keep_prefix(self, path: str, start: int, blocks: list[tuple[int, bytearray]]) -> None:
        """Keep the verified data bytes that share the header's blocks (within the budget)."""
        a, buf = blocks[-1]
        if a + len(buf) <= start:
            return
        tail = bytes(buf[max(0, start - a) :])
        if self._prefix_bytes + len(tail) <= PREFIX_BUDGET:
            self._prefix[path] = (max(start, a), tail)
            self._prefix_bytes += len(tail)

    def _tensor(
        self, key: str, offsets: Sequence[int] | None = None, lengths: Sequence[int] | None = None
    ) -> tuple[TensorEntry, Box]:
        """The tensor and the requested box: the box checked first (R-READ-3), then coverage."""
        t = self.manifest.tensors.get(key)
        if t is None:
            raise TensorMissingError(
                f"tensor {key!r} is not in checkpoint {self.path} ({len(self.tensors)} tensors"
                f"{_alike(key, self.tensors)}; see `portable-ckpt inspect`)"
            )
        box = target_box(t, offsets, lengths)
        self._prove_coverage(key, t)
        return t, box

    def _prove_coverage(self, key: str, t: TensorEntry) -> None:
        if key not in self._covered:
            if isinstance(t, TableTensorEntry) and t.table_ranges_untouched:
                offs, lens = t.boxes()
                self._layouts.check(t.shape, offs, lens, key=key)
            else:
                self._check_layout(t)
            self._covered.add(key)

    def _check_layout(self, t: TensorEntry) -> None:
        """Prove a JSON tensor's coverage once per distinct layout (shape and boxes).

        Every layer of a model, and each parameter's optimizer moments, share a layout: the
        realistic state's 404 tensors have about a dozen. Layouts are compared exactly
        (tuples of ints), never by a hash alone.
        """
        boxes = [r.box for r in t.ranges]
        layout = (t.shape, tuple((b.offsets, b.lengths) for b in boxes))
        if layout not in self._proven:
            check_coverage(t.shape, boxes, key=t.key)
            self._proven.add(layout)

    def _shard_tensor(self, t: TensorEntry, rec: RangeRecord) -> ShardTensor:
        # Keyed by everything the check compares (never by the range name alone: two records
        # naming one stored tensor are each checked against it).
        ck = (rec.file, rec.name, rec.codec, t.dtype, rec.lengths)
        done = self._ranges_checked.get(ck)
        if done is not None:
            return done  # read() checks every piece before allocating, then reads it
        hdr = self._header(rec.file)
        item = DTYPES[t.dtype]
        st = check_range(
            hdr,
            what=self._rel(rec.file),
            key=t.key,
            rec_name=rec.name,
            codec=rec.codec,
            st_dtype=item.safetensors,
            lengths=rec.lengths,
            nbytes=math.prod(rec.lengths) * item.itemsize,
        )
        if rec.codec == "zstd":
            self._check_frame(t, rec, st)
        with self._lock:
            if len(self._ranges_checked) >= _RANGES_CHECKED:
                self._ranges_checked.clear()
            self._ranges_checked[ck] = st
        return st

    def _check_frame(self, t: TensorEntry, rec: RangeRecord, st: ShardTensor) -> None:
        """Check a zstd frame's header and length before anything is allocated for its range."""
        head = bytearray(min(18, st.end - st.start))
        self._read_verified(rec.file, st.start, st.start + len(head), memoryview(head))
        expect = math.prod(rec.lengths) * t.itemsize
        check_frame_header(
            bytes(head),
            stored=st.end - st.start,
            expect=expect,
            limit=expect,
            what=f"{self._rel(rec.file)}: tensor {t.key!r} range {rec.name!r}",
        )

    # -- planning -----------------------------------------------------------------------------------
    def plan_read(
        self, key: str, offsets: Sequence[int] | None = None, lengths: Sequence[int] | None = None
    ) -> list[ReadItem[RangeRecord]]:
        """Return the stored pieces that fill the box, proving exactly-once coverage of it."""
        t, box = self._tensor(key, offsets, lengths)
        return plan_box(t, box, self._indexes).all()

    # -- reading ------------------------------------------------------------------------------------
    def read(
        self,
        key: str,
        offsets: Sequence[int] | None = None,
        lengths: Sequence[int] | None = None,
        *,
        out: np.ndarray[Any, Any] | None = None,
    ) -> np.ndarray[Any, Any]:
        """Read a box of tensor ``key`` (the whole tensor by default).

        Only the bytes of stored chunks that intersect the box are read (rounded out to checksum
        blocks, which are all verified).

        Args:
            key: Logical tensor key.
            offsets: Box start per dimension (default zeros).
            lengths: Box size per dimension (default: to the end).
            out: Optional destination (shape ``lengths``, the tensor's dtype, any strides);
                filled in place and returned.

        """
        return self.read_many([ReadRequest(key, offsets, lengths, out)])[0]

    @paused_gc()  # planning hundreds of requests must not trigger full collections
    @_deleted_is_said
    def read_many(self, requests: Sequence[ReadRequest]) -> list[np.ndarray[Any, Any]]:
        """Read many boxes (of one or many tensors) at once; return one array per request.

        All pieces the requests need from one file are planned together: each byte is read
        once and each checksum block verified once, however many requests share it, and
        contiguous pieces go straight into their destinations. Every piece is checked against
        its shard header before anything sized by the requests is allocated. Boxes of two
        requests may overlap; their bytes are then shared (or, for large overlaps, read again).

        Raises:
            UsageError: ``requests`` is not a sequence of :class:`ReadRequest` (a tuple
                ``(key, offsets, lengths)`` included), or a request's box or ``out`` is wrong.

        """
        if isinstance(requests, str | bytes | ReadRequest):
            raise UsageError(
                f"read_many takes a sequence of ReadRequest, got {type(requests).__name__}"
            )
        try:
            requests = list(requests)  # read once: it may be an iterator
        except TypeError:
            raise UsageError(
                f"read_many takes a sequence of ReadRequest, got {type(requests).__name__}"
            ) from None
        for r in requests:
            if not isinstance(r, ReadRequest):
                raise UsageError(
                    f"read_many takes ReadRequest(key, offsets, lengths, out) items, got "
                    f"{type(r).__name__} {r!r:.80}"
                )
        # The pieces of the first PIECES_PER_PASS are kept from their check to their read;
        # later ones are made again (a read of many requests held all: parser review P2).
        budget = [_read_plan.PIECES_PER_PASS]
        planned = [self._plan_request(r, budget) for r in requests]
        outs = [
            self._destination(t, box, r.out)
            for (t, box, _), r in zip(planned, requests, strict=True)
        ]
        # Planned and read PIECES_PER_PASS pieces at a time (all of them, for a model's state):
        # the pieces of one pass share each checksum block and each file's reads.
        files: dict[str, FilePlan] = {}
        queued = 0
        for (t, box, pieces), out in zip(planned, outs, strict=True):
            for chunk in pieces.chunks():
                starts = pieces.starts if pieces.starts is not None else [-1] * len(chunk)
                for item, start in zip(chunk, starts, strict=True):
                    self._plan_piece(files, t, box, item, out, start)
                queued += len(chunk)
                if queued >= _read_plan.PIECES_PER_PASS:
                    self._run_plans(files)
                    files, queued = {}, 0
        self._run_plans(files)
        for (t, box, pieces), out in zip(planned, outs, strict=True):
            if t.dtype == "bool":
                self._check_bool(t, out, pieces, box.offsets)
        return outs

    def _plan_piece(
        self,
        files: dict[str, FilePlan],
        t: TensorEntry,
        box: Box,
        item: ReadItem[RangeRecord],
        out: np.ndarray[Any, Any],
        start: int,
    ) -> None:
        """Add one piece to its file's plan (a zstd piece is read at once).

        ``start``: the piece's first byte in its file, or -1 to find it in the shard header.
        """
        rec = item.record
        whole = item.box == item.stored
        dst = out if whole and out.shape == rec.lengths else (
            out[item.box.slices(box.offsets)] if out.ndim else out
        )
        if rec.codec == "zstd":  # its frame header was checked with the piece (_plan_request)
            self._read_item(t, rec, item.box, dst, self._header(rec.file).tensors[rec.name])
            return
        if start < 0:  # checked with every piece before anything was allocated (_plan_request)
            start = self._header(rec.file).start_of(rec.name)
        plan = files.get(rec.file)
        if plan is None:
            plan = files[rec.file] = FilePlan()
        rel = Box((0,) * len(rec.lengths), rec.lengths) if whole else (
            item.box.relative_to(item.stored)
        )
        bs = self.manifest.files[rec.file].checksum.block_size
        box_segments(plan, bs, start, rec.lengths, t.itemsize, rel, dst, WINDOW_BYTES)

    def _plan_request(
        self, r: ReadRequest, budget: list[int]
    ) -> tuple[TensorEntry, Box, Pieces]:
        """Plan one request; check every stored piece against its file.

        Before anything sized by the box is allocated. ``budget``: pieces that may still be
        kept built for the read pass.
        """
        t, box = self._tensor(r.key, r.offsets, r.lengths)
        pieces = plan_box(t, box, self._indexes)
        if pieces.count <= _read_plan.PIECES_PER_PASS:
            keep = pieces.count <= budget[0]
            built = pieces.first(keep, box)
            starts = [self._shard_tensor(t, item.record).start for item in built]
            if keep:
                budget[0] -= pieces.count
                pieces.starts = starts
        elif pieces.records is not None:
            # In file order, so that each pass reads one stretch of the file: the range index
            # gave them by box, and every pass read most of the tensor again (review P4).
            recs = pieces.records
            starts = [self._shard_tensor(t, r).start for r in recs]
            order = sorted(range(len(recs)), key=lambda i: (recs[i].file, starts[i]))
            pieces.reorder([recs[i] for i in order], box)
        else:  # a table's records, in the writer's order (file order), made a pass at a time
            for chunk in pieces.chunks():
                for item in chunk:
                    self._shard_tensor(t, item.record)
        return t, box, pieces

    def _destination(
        self, t: TensorEntry, box: Box, out: np.ndarray[Any, Any] | None
    ) -> np.ndarray[Any, Any]:
        if out is None:
            try:
                return np.empty(box.lengths, dtype=t.numpy_dtype)
            except (MemoryError, ValueError):
                raise LimitError(
                    f"tensor {t.key!r}: box {box} needs {box.volume * t.itemsize} bytes, more "
                    "than this process can allocate; read smaller boxes or pass out="
                ) from None
        if not isinstance(out, np.ndarray):
            raise UsageError(
                f"tensor {t.key!r}: out must be a numpy array (or None), got "
                f"{type(out).__name__} {out!r:.80}"
            )
        if tuple(out.shape) != box.lengths or out.dtype != t.numpy_dtype:
            raise UsageError(
                f"tensor {t.key!r}: out has {out.dtype}{list(out.shape)}, the box needs "
                f"{t.numpy_dtype}{list(box.lengths)}"
            )
        if not out.flags.writeable:
            raise UsageError(f"tensor {t.key!r}: out is not writeable")
        return out

    def _check_bool(
        self, t: TensorEntry, arr: np.ndarray[Any, Any], pieces: Pieces, origin: Sequence[int]
    ) -> None:
        """R-DTYPE-4: every delivered ``bool`` byte is 0x00 or 0x01 (one pass, no temporary).

        ``pieces`` filled ``arr``, whose first element is at ``origin``; they are searched only
        to name the offending range.
        """
        if arr.size == 0 or int(arr.view(np.uint8).max()) <= 1:
            return
        for chunk in pieces.chunks():
            for item in chunk:
                rec, inter = item.record, item.box
                part = arr[inter.slices(origin)] if arr.ndim else arr
                raw = part.view(np.uint8)
                if int(raw.max()) > 1:
                    at = np.unravel_index(int(np.argmax(raw > 1)), raw.shape)
                    elem = [int(o + i) for o, i in zip(inter.offsets, at, strict=True)]
                    raise self._bool_error(t, rec, elem, int(raw[at]))

    def _bool_error(
        self, t: TensorEntry, rec: RangeRecord, elem: Sequence[int], byte: int
    ) -> DtypeValueError:
        return DtypeValueError(
            f"{self._rel(rec.file)!r}: tensor {t.key!r} range {rec.name!r}: element "
            f"{list(elem)} is stored as byte 0x{byte:02x}; a bool is 0x00 or 0x01 (the writer "
            "broke R-DTYPE-2)",
            path=rec.file,
        )

    def _check_bool_window(
        self, t: TensorEntry, rec: RangeRecord, window: memoryview, first: int
    ) -> None:
        """R-DTYPE-4 on bytes ``first …`` of a range's elements (C order of the range)."""
        raw = np.frombuffer(window, dtype=np.uint8)
        if raw.size and int(raw.max()) > 1:
            i = int(np.argmax(raw > 1))
            at = np.unravel_index(first + i, rec.lengths) if rec.lengths else ()
            elem = [int(o + j) for o, j in zip(rec.offsets, at, strict=True)]
            raise self._bool_error(t, rec, elem, int(raw[i]))

    def _read_item(
        self,
        t: TensorEntry,
        rec: RangeRecord,
        inter: Box,
        dst: np.ndarray[Any, Any],
        st: ShardTensor,
    ) -> None:
        """Serve one piece of a zstd range (decoded whole and cached, or streamed).

        ``st``: the range's shard tensor, checked with its frame header before the read (not
        again here: the cache of checked frames is bounded, and a frame checked twice is read
        twice: parser review P7).
        """
        rel = inter.relative_to(rec.box)
        self._decompressed(t, rec, st, rel, dst)
        with self._lock:
            self.stats.bytes_delivered += dst.nbytes

    def _decompressed(
        self, t: TensorEntry, rec: RangeRecord, st: ShardTensor, rel: Box, dst: np.ndarray[Any, Any]
    ) -> None:
        """Copy box ``rel`` of a zstd range into ``dst`` (spec §8.3, R-TENSOR-10).

        Ranges up to ``ZSTD_WHOLE_BYTES`` are decoded whole and kept (the next read of the same
        record reuses them); larger ones are streamed through bounded windows, so memory does
        not grow with the range's declared size.
        """
        expect = math.prod(rec.lengths) * t.itemsize
        what = f"{self._rel(rec.file)}: tensor {t.key!r} range {rec.name!r}"
        if expect > ZSTD_WHOLE_BYTES:
            self._stream_range(t, rec, st, rel, dst, what)
            return
        ck = (rec.file, rec.name, rec.codec, t.dtype, rec.lengths)
        with self._lock:
            raw_or_none = self._zcache.get(ck)
            if raw_or_none is not None:
                self._zcache.move_to_end(ck)
        if raw_or_none is not None:
            raw = raw_or_none
        else:
            frame = bytearray(st.end - st.start)
            self._read_verified(rec.file, st.start, st.end, memoryview(frame))
            raw = decompress_frame(frame, expect=expect, limit=expect, what=what)
            with self._lock:
                self._zcache[ck] = raw
                while len(self._zcache) > 1 and (
                    len(self._zcache) > _ZCACHE_ENTRIES
                    or sum(len(v) for v in self._zcache.values()) > _ZCACHE_BYTES
                ):
                    self._zcache.popitem(last=False)
            self._note_scratch(len(frame) + len(raw))
        src = np.frombuffer(raw, dtype=t.numpy_dtype).reshape(rec.lengths)
        dst[...] = src[rel.slices()] if src.ndim else src

    def _stream_range(
        self,
        t: TensorEntry,
        rec: RangeRecord,
        st: ShardTensor,
        rel: Box,
        dst: np.ndarray[Any, Any],
        what: str,
    ) -> None:
        """Decode a large zstd range through bounded windows, delivering box ``rel``."""
        stream, step = self._frame_stream(t, rec, st, what)
        used = stream_box(stream, rec.lengths, t.itemsize, rel, dst, ZSTD_WINDOW_BYTES)
        self._note_scratch(used + step)

    def _frame_stream(
        self, t: TensorEntry, rec: RangeRecord, st: ShardTensor, what: str
    ) -> tuple[FrameStream, int]:
        """A bounded decoder of a range's frame, and its input window (checksum-aligned)."""
        bs = self.manifest.files[rec.file].checksum.block_size
        step = max(bs, ZSTD_INPUT_BYTES // bs * bs)  # input windows end on checksum blocks

        def read(lo: int, hi: int, dest: memoryview) -> None:
            self._read_verified(rec.file, st.start + lo, st.start + hi, dest)

        expect = math.prod(rec.lengths) * t.itemsize
        stream = FrameStream(
            read, st.end - st.start, expect=expect, what=what, first=step - st.start % step,
            step=step,
        )
        return stream, step

    def _run_plans(self, files: dict[str, FilePlan]) -> None:
        """Read every file's plan, ``FILE_LANES`` files at a time.

        One reader of one file at a time left the disk half idle when a rank reads two files
        or more (a resharded load: 4 -> 2 ranks): two cold 235 MiB files per process, two
        processes, took 0.565 s one after the other and 0.469 s side by side (medians of 6).
        Files the storage says are in memory already (:meth:`Storage.cached`) are read one at
        a time: there the second lane only adds threads competing for the CPU.
        Files are dealt to the lanes by size (:func:`_read_plan.balanced`), so two large files
        do not queue on one lane. Lane 0 runs on the calling thread; every lane has its own I/O
        thread. A failure waits for every lane (no read keeps writing into the caller's
        memory), then the failure of the lowest lane is raised.
        """
        paths = sorted(files)
        lanes = min(FILE_LANES, len(paths))
        if lanes > 1 and all(self._cached(p, files[p]) for p in paths):
            lanes = 1  # from memory the second lane only adds threads (1 GiB, 4 -> 2: 12 % slower)
        if lanes <= 1:
            for path in paths:
                self._run_plan(path, files[path])
            return
        share = balanced(paths, {p: files[p].nbytes for p in paths}, lanes)

        def lane(i: int) -> int:
            io = worker("pck-io" if i == 0 else f"pck-io{i}")
            return max((self._run_plan(p, files[p], io) for p in share[i]), default=0)

        futs = [worker(f"pck-lane{i}").submit(lane, i) for i in range(1, lanes)]
        first: BaseException | None = None
        peak = 0
        try:
            peak = lane(0)
        except BaseException as exc:
            first = exc
        errors = [first] + [f.exception() for f in futs]  # waits for every lane
        failed = [e for e in errors if e is not None]
        if failed:
            raise failed[0]
        # The lanes' scratch buffers may be alive at the same time: count their sum.
        self._note_scratch(peak + sum(f.result() for f in futs))

    def _cached(self, path: str, plan: FilePlan) -> bool:
        """Whether the last bytes ``plan`` reads from ``path`` are in memory (unknown: no).

        The last, not the first: reading the shard header brought the bytes after it into
        memory with the kernel's readahead, in a file that is cold everywhere else.
        """
        if not plan.segments:
            return True
        last = max(seg.hi for seg in plan.segments)
        probe = max(0, last - 4096)
        return self.storage.cached(self._rel(path), probe, last - probe) is True

    def _run_plan(self, path: str, plan: FilePlan, io: ThreadPoolExecutor | None = None) -> int:
        """Read one file's segments: from the kept header blocks, else by a planned read.

        Returns the read's peak scratch bytes.
        """
        rec = self._file(path)
        segs = self._from_prefix(path, plan)
        scratch = 0
        if segs:
            passes = plan_file(
                segs,
                block_size=rec.checksum.block_size,
                file_size=rec.size,
                max_shared=WINDOW_BYTES,
            )
            sinks = plan.sinks
            try:
                res = read_planned(
                    self.storage,
                    self._rel(path),
                    rec,
                    passes,
                    direct=lambda seg: cast(Direct, sinks[seg.sink]).view,
                    deliver=lambda seg, data: sinks[seg.sink].deliver(data),
                    io=io,
                )
            except ChecksumError as exc:
                raise self._named(exc, path) from None
            self._account(res)
            scratch = res.scratch
        with self._lock:
            self.stats.bytes_delivered += sum(
                s.dst.nbytes if isinstance(s, Strided) else len(s.view) for s in plan.sinks
            )
        return scratch

    def _from_prefix(self, path: str, plan: FilePlan) -> list[Segment]:
        """Serve segments inside the kept header blocks; return the segments still to read."""
        kept = self._prefix.get(path)
        if kept is None:
            return plan.segments
        start, data = kept
        end = start + len(data)
        rest: list[Segment] = []
        for seg in plan.segments:
            sink = plan.sinks[seg.sink]
            if seg.lo < start or seg.lo >= end:
                rest.append(seg)
            elif seg.hi <= end:
                sink.deliver(memoryview(data)[seg.lo - start : seg.hi - start])
            elif isinstance(sink, Direct):  # the head from the kept bytes, the rest read
                cut = end - seg.lo
                sink.view[:cut] = memoryview(data)[seg.lo - start :]
                plan.sinks.append(Direct(sink.view[cut:]))
                rest.append(Segment(end, seg.hi, len(plan.sinks) - 1, True))
                plan.sinks[seg.sink] = Direct(sink.view[:cut])
            else:
                rest.append(seg)
        return rest

    def _account(self, res: Any) -> None:
        """Count a verified read's bytes, blocks and scratch in :attr:`stats`."""
        with self._lock:
            self.stats.bytes_read += res.bytes_read
            self.stats.blocks_verified += res.blocks
        self._note_scratch(res.scratch)

    def _note_scratch(self, n: int) -> None:
        with self._lock:
            if n > self.stats.peak_scratch_bytes:
                self.stats.peak_scratch_bytes = n

    def _read_verified(self, path: str, lo: int, hi: int, dest: memoryview | None) -> None:
        """Read bytes ``[lo, hi)`` of ``path`` into ``dest`` verifying every block touched.

        With ``dest=None`` the bytes are only verified.
        """
        try:
            res = read_verified(self.storage, self._rel(path), self._file(path), lo, hi, dest)
        except ChecksumError as exc:
            raise self._named(exc, path) from None
        self._account(res)

    def _named(self, exc: ChecksumError, path: str) -> ChecksumError:
        """``exc`` naming the tensor ranges (or entry, header) whose bytes are in its block."""
        return name_block(exc, self.manifest, path, self._headers.get(path))

    # -- entries ------------------------------------------------------------------------------------
    @_deleted_is_said
    def entry(self, name: str, rank: int | None = None, world_size: int | None = None) -> Any:
        """Return the value of non-tensor entry ``name``.

        For ``per_rank`` entries pass the reader's ``rank`` (and ``world_size`` when it differs
        from the saved one): the entry's ``world_size_policy`` decides which stored value it gets
        (``require_same`` raises ``ContractError``, ``drop`` returns :data:`NO_VALUE`).

        Raises:
            UsageError: ``rank`` is not an integer >= 0 or ``world_size`` not one >= 1 (a
                bool, float or string included), or a per_rank entry without ``rank``.

        """
        return entry_value(self, name, rank, world_size)

    # -- verification -------------------------------------------------------------------------------
    def verify(
        self,
        *,
        deep: bool = False,
        sample: float | None = None,
        seed: int | None = None,
        progress: Progress | None = None,
    ) -> list[CheckpointError]:
        """Check the version; return every problem found (empty when it verifies).

        The checks and their order are those of spec §10.1 (R-VERIFY-1 … R-VERIFY-5):

        1. every listed file exists with its recorded size;
        2. every tensor: exactly-once coverage; every range record against its shard header
           (and a zstd frame's declared size);
        3. every entry value: decoded, strict JSON, valid against its schema, and a
           ``pck:step/1`` value equal to the manifest's step;
        4. data: with ``deep``, every block of every file, every zstd range decoded and every
           ``bool`` range's bytes; with ``sample`` (a fraction in (0, 1]), ``ceil(sample × n)``
           (the product taken to six decimals: 0.3 of 10 is 3) of the n range records drawn without replacement by ``random.Random(seed)``, each
           read whole with the same checks.

        Decoding a zstd range (here, or to read any of its elements) takes time proportional to
        its declared elements, which its tensor's shape bounds, not to its stored bytes: zstd
        legitimately decodes up to ~32,768 times its size (a zero tensor compresses ~30,000x), so
        a hostile shard costs up to ~2 s of CPU per MiB present; memory stays one window.

        Each problem is reported once: a file that failed (missing, wrong size, bad header, bad
        checksum block) is not used again by a later check. The deep pass still reads a file
        whose bad checksum block an earlier check met (in its shard header, say) to its end, and
        names every damaged block of every file, with its bytes and the tensor ranges, entry or
        header it holds: consecutive damaged blocks as one run, at most
        :data:`~portable_ckpt.io.checksum.MAX_DAMAGED_RUNS` runs per file, the damaged blocks
        after them counted in one more problem ("and N more damaged blocks in bytes [x:y]
        (blocks a..b)"). Each block is read and verified once. A storage error stops the pass
        over its file; its message says which bytes of the file were not checked. A sampled
        verification names the first damaged block of each file it meets (a probe: the deep
        one names them all). ``progress(done, total)`` follows the bytes of the deep pass.

        Raises:
            UsageError: ``sample`` is not a fraction in (0, 1] (NaN, 0, 2, a string), ``seed``
                not an integer, ``deep`` not a bool or ``progress`` not a callable; ``seed``
                without ``sample``, or ``sample`` with ``deep`` (the deep pass reads every
                range: neither would change what is checked, as the CLI's ``--seed`` and
                ``--sample`` say).

        """
        from portable_ckpt.io._verify import verify_version  # it imports this module

        return verify_version(self, deep=deep, sample=sample, seed=seed, progress=progress)
