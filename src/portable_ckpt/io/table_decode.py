"""Reading a tensor table (spec §8.5, R-TABLE-3 … R-TABLE-8): bounded decoding and its checks.

A table file is hostile input: its zstd frame may declare 2^32 bytes in a few KiB, its header
may claim columns that do not agree, its columns may hold anything. It is decoded header
first and in steps, each column checked as soon as it is complete, so that what a reader
holds follows the bytes that decoded and agree with what the header declared (see
:func:`decode_table` for the bound that remains). The table and its encoding are
:mod:`portable_ckpt.io.tensor_table`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import zstandard

from portable_ckpt.errors import (
    CheckpointError,
    CodecError,
    DtypeUnsupportedError,
    LimitError,
    SchemaError,
    ShardHeaderError,
)
from portable_ckpt.format import jsonio
from portable_ckpt.format.dtypes import DTYPES
from portable_ckpt.format.manifest import MAX_NDIM, MAX_SIZE
from portable_ckpt.format.paths import check_relative_path
from portable_ckpt.format.vocab import CODECS
from portable_ckpt.io.codec import (
    FrameStream,
    FrameWalker,
    check_frame_header,
    decompress_frame,
    zstd_bound,
)
from portable_ckpt.io.safetensors_io import MAX_HEADER_BYTES, ShardHeader, parse_header
from portable_ckpt.io.tensor_table import COLUMNS, DTYPE_CODES, MAX_TABLE_BYTES, TensorTable

__all__ = [
    "TableCache",
    "check_table_head",
    "check_table_size",
    "decode_table",
    "read_table_file",
]


class TableCache:
    """Declarations already validated, shared by the decoding of many writer tables.

    Writers of one job declare the same tensors: a table whose key, dtype, ndim and shape columns
    are byte-identical to an already validated table skips their checks (a byte comparison).
    """

    def __init__(self) -> None:
        self.last: tuple[bytes, ...] | None = None
        self.keys: list[str] = []
        self.header: tuple[bytes, int, Any] | None = None


def _split_heap(col: np.ndarray[Any, Any], *, what: str, column: str) -> list[str]:
    data = col.tobytes()
    if not data:
        return []
    if data[-1:] != b"\0":
        raise SchemaError(f"{what}: column {column!r} does not end with a 0x00 terminator", path=what)
    try:
        # 0x00 never occurs inside a UTF-8 multi-byte sequence: one decode checks every string.
        return data[:-1].decode("utf-8").split("\0")
    except UnicodeDecodeError as exc:
        raise SchemaError(f"{what}: column {column!r} is not valid UTF-8 ({exc})", path=what) from None


def _check_keys(col: np.ndarray[Any, Any], keys: list[str], what: str) -> None:
    """§8.1 for every key: 1 to 1024 characters, no control character, unique."""
    # UTF-8 continuation and lead bytes are >= 0x80, so a byte below 0x20 or equal to 0x7F is a
    # control character (0x00 is the terminator).
    bad = (col < 0x20) & (col != 0) | (col == 0x7F)
    for i, key in enumerate(keys):
        if not 1 <= len(key) <= 1024:
            raise SchemaError(
                f"{what}: tensor key #{i} {key[:80]!r} must have 1 to 1024 characters (spec §8.1)",
                path=what,
            )
    if bad.any():
        pos = int(np.argmax(bad))
        i = int(np.count_nonzero(col[:pos] == 0))
        raise SchemaError(
            f"{what}: tensor key #{i} {keys[i][:80]!r} contains a control character (spec §8.1)",
            path=what,
        )
    if len(set(keys)) != len(keys):
        seen: set[str] = set()
        for key in keys:
            if key in seen:
                raise SchemaError(f"{what}: tensor key {key[:80]!r} appears twice", path=what)
            seen.add(key)


def check_table_size(size: int, *, codec: str, what: str) -> None:
    """The checks of :func:`check_table_head` that need only the file's size and codec."""
    if codec == "none":
        if size > MAX_TABLE_BYTES:
            raise LimitError(f"{what}: tensor table of {size} bytes is above 2^32", path=what)
        return
    if codec != "zstd":
        raise CodecError(f"{what}: tensor_table codec {codec!r} is not 'none' or 'zstd'", path=what)
    if size > zstd_bound(MAX_TABLE_BYTES):
        raise LimitError(
            f"{what}: a {size}-byte zstd tensor table would decode to more than 2^32 bytes",
            path=what,
        )


def check_table_head(
    head: bytes | bytearray | memoryview, *, size: int, codec: str, what: str
) -> int:
    """Check a table file from its size and first bytes, before it is read (R-TABLE-3).

    Args:
        head: The file's first ``min(18, size)`` bytes (only looked at for codec ``zstd``).
        size: The file's recorded size.
        codec: ``tensor_table.codec`` of the referencing document.
        what: Names the file in messages.

    Returns:
        The decoded size the table declares (the file size for codec ``none``).

    Raises:
        CheckpointError: ``PCK-CODEC`` (unknown codec, not a frame, no declared size, a frame
            longer than its bound), ``PCK-LIMIT`` (decoded size above 2^32).

    """
    check_table_size(size, codec=codec, what=what)
    if codec == "none":
        return size
    try:
        declared = zstandard.get_frame_parameters(bytes(head)).content_size
    except zstandard.ZstdError as exc:
        raise CodecError(f"{what}: tensor table is not a zstd frame ({exc})", path=what) from None
    if declared == zstandard.CONTENTSIZE_UNKNOWN:
        raise CodecError(
            f"{what}: the tensor table's zstd frame does not declare its content size "
            "(spec §8.5 requires it)",
            path=what,
        )
    if declared > MAX_TABLE_BYTES:
        raise LimitError(
            f"{what}: tensor table declares {declared} decoded bytes, above the 2^32 limit",
            path=what,
        )
    check_frame_header(head, stored=size, expect=declared, limit=MAX_TABLE_BYTES, what=what)
    return int(declared)


def read_table_file(
    read: Callable[[int, int, memoryview], None],
    *,
    size: int,
    codec: str,
    block_size: int,
    what: str,
) -> bytearray:
    """Read a table file whole, checking its size and frame header first (R-TABLE-3).

    ``read(lo, hi, dest)`` fills ``dest`` with verified bytes ``[lo, hi)``. The first checksum
    block (when at most 1 MiB) is read once: it holds the header checked here and the start of
    the file returned.
    """
    check_table_size(size, codec=codec, what=what)
    first = bytearray(min(size, block_size if block_size <= 1 << 20 else 18))
    if codec == "zstd" and first:
        read(0, len(first), memoryview(first))
    check_table_head(first[:18], size=size, codec=codec, what=what)
    buf = bytearray(size)
    done = len(first) if codec == "zstd" else 0
    buf[:done] = first[:done]
    read(done, size, memoryview(buf)[done:])
    return buf


#: Decoded bytes per step of a streamed zstd table (spec §8.5): what a column grows by before the
#: checks that can already run on it have seen those bytes.
_OUT_STEP = 4 << 20
#: Stored bytes handed to the zstd decoder per step.
_IN_STEP = 1 << 20


class _TableBytes:
    """The decoded bytes of a table file, delivered in order (spec §8.5, R-TABLE-3).

    Codec ``none``: views of the stored bytes. Codec ``zstd``: a frame declaring at most one step
    is decoded at once; a larger one in windows (:class:`FrameStream`) into buffers that grow as
    bytes actually decode, so memory follows what the frame produced, never the content size its
    header declares.
    """

    def __init__(
        self, data: bytes | bytearray | memoryview, *, codec: str, declared: int, what: str
    ) -> None:
        self.data, self.declared, self.what, self.pos = data, declared, what, 0
        self.stream: FrameStream | None = None
        if codec != "zstd":
            return
        if declared <= _OUT_STEP:  # one step anyway: decoded at once (committers read thousands)
            self.data = decompress_frame(data, expect=declared, limit=declared, what=what)
            return
        # The frame's structure first: trailing bytes, truncation and reserved blocks are
        # PCK-CODEC before any of the table is looked at (the walk reads block headers only).
        walker = FrameWalker(what)
        walker.feed(data)
        walker.check_end(len(data))
        src = memoryview(data).cast("B")

        def read(lo: int, hi: int, dest: memoryview) -> None:
            dest[:] = src[lo:hi]

        self.stream = FrameStream(
            read, len(data), expect=declared, what=what, first=_IN_STEP, step=_IN_STEP
        )
        self.scratch = memoryview(bytearray(min(_OUT_STEP, declared)))

    def take(
        self, n: int, check: Callable[[memoryview], None] | None = None
    ) -> bytes | bytearray | memoryview:
        """The next ``n`` decoded bytes; ``check`` sees each decoded piece before it is kept."""
        lo, self.pos = self.pos, self.pos + n
        if self.stream is None:
            return memoryview(self.data)[lo : lo + n]
        out = bytearray()
        while len(out) < n:
            piece = self.scratch[: min(n - len(out), len(self.scratch))]
            self.stream.readinto(piece)
            if check is not None:
                check(piece)
            out += piece
        return out

    def finish(self) -> None:
        """Check that the frame decodes to exactly the declared size (R-TENSOR-7)."""
        if self.stream is not None:
            self.stream.finish()

    def more(self) -> None:
        """Decode one byte past the columns: PCK-CODEC if the frame ends there (R-TENSOR-7)."""
        if self.stream is not None:
            self.stream.readinto(self.scratch[:1])


class _KeyScan:
    """Checks of ``tensor.key`` that need no whole column (§8.1), run on each decoded piece.

    An empty key, a control character or a run of more than 4096 bytes without a terminator
    (more than 1024 characters) fails in the piece that holds it: a column of zeros, or of any
    one byte, costs one step, not its declared length. The full checks run on the whole column.
    """

    def __init__(self, what: str) -> None:
        self.what, self.keys, self.run = what, 0, 0

    def __call__(self, piece: memoryview) -> None:
        for i in range(0, len(piece), 1 << 18):  # bounded temporaries (8 B per byte scanned)
            self._scan(np.frombuffer(piece[i : i + (1 << 18)], np.uint8))

    def _scan(self, a: np.ndarray[Any, Any]) -> None:
        nul = np.flatnonzero(a == 0)
        bad = (a < 0x20) & (a != 0) | (a == 0x7F)
        gaps = np.diff(nul, prepend=-1 - self.run)  # key length + 1 at each terminator
        first = None
        if gaps.size and int(gaps.min()) == 1:
            first = ("empty", int(nul[int(np.argmin(gaps))]))
        if bad.any():
            pos = int(np.argmax(bad))
            if first is None or pos < first[1]:
                first = ("control", pos)
        long = np.flatnonzero(gaps > 4097)
        tail = a.size - 1 - int(nul[-1]) if nul.size else self.run + a.size
        if long.size or tail > 4096:
            pos = int(nul[long[0]]) if long.size else a.size - 1
            if first is None or pos < first[1]:
                first = ("long", pos)
        if first is not None:
            i = self.keys + int(np.searchsorted(nul, first[1]))
            why = {
                "empty": "is empty; keys must have 1 to 1024 characters",
                "control": "contains a control character",
                "long": "is longer than 4096 bytes; keys must have 1 to 1024 characters",
            }[first[0]]
            raise SchemaError(f"{self.what}: tensor key #{i} {why} (spec §8.1)", path=self.what)
        self.keys += nul.size
        self.run = tail


def _header_bytes(what: str) -> Callable[[memoryview], None]:
    """A check of each decoded piece of a table's safetensors header: no byte JSON cannot hold."""

    def check(piece: memoryview) -> None:
        for i in range(0, len(piece), 1 << 18):
            a = np.frombuffer(piece[i : i + (1 << 18)], np.uint8)
            bad = (a < 0x20) & (a != 0x09) & (a != 0x0A) & (a != 0x0D)
            if bad.any():
                byte = int(a[int(np.argmax(bad))])
                raise ShardHeaderError(
                    f"{what}: the table's safetensors header holds byte 0x{byte:02x}, which JSON "
                    "text cannot contain",
                    path=what,
                )

    return check


def _parse_table_header(
    prefix: bytes, head: bytes, *, declared: int, codec: str, what: str
) -> tuple[ShardHeader, ShardHeaderError | None]:
    """Parse the table's header against the declared size (§11.2 checks, PCK-SHARD-HEADER).

    Returns the header and, when its columns end before the declared size of a zstd table, the
    error to raise unless the frame ends with the columns (then it is PCK-CODEC: the frame
    decodes to fewer bytes than it declares, R-TENSOR-7).
    """
    try:
        return parse_header(prefix, head, path=what, file_size=declared), None
    except ShardHeaderError as exc:
        end = _columns_end(head, 8 + len(head)) if codec == "zstd" else None
        if end is None or end >= declared:
            raise
        try:
            return parse_header(prefix, head, path=what, file_size=end), exc
        except ShardHeaderError:
            raise exc from None


def _columns_end(head: bytes, data_start: int) -> int | None:
    """Where the columns of a header end (None if it lists no well-formed data_offsets)."""
    try:
        doc = jsonio.loads(head, what="table header", max_bytes=MAX_HEADER_BYTES)
    except CheckpointError:
        return None
    if not isinstance(doc, dict):
        return None
    ends = [0]
    for name, t in doc.items():
        if name == "__metadata__":  # every table has one; it holds no column (mutation audit
            continue                # 28: a short frame was PCK-SHARD-HEADER, not PCK-CODEC)
        offs = t.get("data_offsets") if isinstance(t, dict) else None
        if not (isinstance(offs, list) and len(offs) == 2 and isinstance(offs[1], int)):
            return None
        ends.append(offs[1])
    return data_start + max(ends)


def decode_table(
    data: bytes | bytearray | memoryview,
    *,
    codec: str,
    what: str,
    files: Mapping[str, Any],
    cache: TableCache | None = None,
) -> TensorTable:
    """Decode and validate a table file's bytes (spec §8.5, R-TABLE-3 … R-TABLE-6).

    A zstd table is decoded in steps, header first: the length prefix and JSON header are checked
    before anything sized by the frame's declared content size exists, the column lengths the
    header gives are checked against each other and the declared size, and then each column is
    decoded into a buffer that grows only as its bytes decode, its checks (and those of the
    columns before it) running as soon as it is complete: a frame of zeros fails in its first
    bytes. Remaining bound: a table whose header and columns are consistent costs its declared
    size (at most 2^32 bytes, R-TABLE-3; a ~128 KiB frame can declare that much), which is what
    its columns legitimately occupy for the counts they declare; columns stored before the one
    that fails (the order of the columns is the writer's) are held until it fails. Measured: a
    129 KiB frame of zeros under a header storing 858M records' range.file and range.codec
    before tensor.key reaches 4.1 GiB peak RSS and 2.8 s, then PCK-SCHEMA (before: the same).
    Keys and file paths become Python strings (~50 bytes each beyond their bytes) only once
    their count matches the declared tensor count (file paths: at most the document's files),
    so a key column of many short keys costs its count check, not 25x its size. The header
    itself may take MAX_HEADER_BYTES (§11.2).

    Args:
        data: The table file's stored bytes (already checksum-verified).
        codec: ``tensor_table.codec`` of the referencing document.
        what: Names the file in messages.
        files: The referencing document's ``files`` (every path must be one of its keys).
        cache: Declarations already validated; a committer reading thousands of writer tables
            with the same tensors passes one :class:`TableCache` to all calls.

    Raises:
        CheckpointError: with the code of the rule broken; nothing is returned half-validated.

    """
    declared = check_table_head(data[:18], size=len(data), codec=codec, what=what)
    src = _TableBytes(data, codec=codec, declared=declared, what=what)
    if declared < 8:
        src.take(declared)
        src.finish()
        raise ShardHeaderError(
            f"{what}: {declared} bytes is too short for a safetensors file", path=what
        )
    prefix = bytes(src.take(8))
    n = int.from_bytes(prefix, "little")
    if n > declared - 8 or n > MAX_HEADER_BYTES:
        raise ShardHeaderError(
            f"{what}: header length {n} exceeds the limit or the table size ({declared})", path=what
        )
    # At most MAX_HEADER_BYTES (the §11.2 limit of every safetensors header), and bytes JSON
    # cannot hold stop it in the piece that holds them.
    head = bytes(src.take(n, _header_bytes(what)))
    pending: ShardHeaderError | None = None
    if cache is not None and cache.header is not None and cache.header[:2] == (head, declared):
        hdr = cache.header[2]  # same header and size as the previous table: same parse
    else:
        hdr, pending = _parse_table_header(prefix, head, declared=declared, codec=codec, what=what)
        if cache is not None and pending is None:
            cache.header = (head, declared, hdr)
    _check_columns(hdr, what)
    steps = _Steps(hdr, what=what, files=files, cache=cache)
    for name in sorted(COLUMNS, key=lambda c: (hdr.tensors[c].start, hdr.tensors[c].end)):
        t = hdr.tensors[name]
        if t.start != src.pos:  # parse_header packs the columns; a caller bug otherwise
            raise AssertionError(f"column {name} at {t.start}, decoded up to {src.pos}")
        check = _KeyScan(what) if name == "tensor.key" and src.stream is not None else None
        buf = src.take(t.end - t.start, check)
        steps.add(name, np.frombuffer(buf, dtype=COLUMNS[name][1], count=t.shape[0]))
    if pending is not None:
        src.more()
        raise pending
    src.finish()
    return steps.table()


def _check_columns(hdr: ShardHeader, what: str) -> None:
    """R-TABLE-4, and the column lengths of R-TABLE-5 that the header alone gives."""
    names = set(hdr.tensors)
    if names != set(COLUMNS):
        missing = sorted(set(COLUMNS) - names)
        extra = sorted(names - set(COLUMNS))
        raise SchemaError(
            f"{what}: tensor table columns differ from spec §8.5 (missing {missing}, extra "
            f"{extra[:8]})",
            path=what,
        )
    for name, (st, _) in COLUMNS.items():
        t = hdr.tensors[name]
        if t.dtype != st or len(t.shape) != 1:
            raise SchemaError(
                f"{what}: column {name!r} is {t.dtype}{list(t.shape)}; spec §8.5 requires a 1-d "
                f"{st} column",
                path=what,
            )
    size = {name: t.shape[0] for name, t in hdr.tensors.items()}
    for a, b in (
        ("tensor.dtype", "tensor.ndim"),
        ("tensor.dtype", "tensor.ranges"),
        ("range.file", "range.codec"),
        ("range.offsets", "range.lengths"),
    ):
        if size[a] != size[b]:
            raise SchemaError(
                f"{what}: column {b!r} has {size[b]} values, column {a!r} {size[a]}; spec §8.5 "
                "requires as many",
                path=what,
            )
    t_count, k = size["tensor.dtype"], size["tensor.key"]
    if not 2 * t_count <= k <= 4097 * t_count:
        raise SchemaError(
            f"{what}: column 'tensor.key' has {k} bytes for {t_count} tensors; a key and its "
            "0x00 byte take 2 to 4097 (1 to 1024 characters, spec §8.1)",
            path=what,
        )


class _Steps:
    """The checks of R-TABLE-5 and R-TABLE-6, each run once the columns it reads are decoded.

    They run in a fixed order (the code of a table that breaks several rules does not depend on
    the order of its columns); a table stored in the writers' order is checked column by column.
    """

    ORDER: tuple[tuple[frozenset[str], str], ...] = tuple(
        (frozenset(deps.split()), method)
        for deps, method in (
            ("tensor.key", "_keys"),
            ("tensor.dtype tensor.ndim tensor.shape", "_declarations"),
            ("tensor.ranges", "_counts"),
            ("range.offsets range.lengths", "_coordinates"),
            ("range.codec", "_codecs"),
            ("file.path", "_paths"),
            ("range.file", "_files"),
        )
    )

    def __init__(
        self, hdr: ShardHeader, *, what: str, files: Mapping[str, Any], cache: TableCache | None
    ) -> None:
        self.what, self.files, self.cache = what, files, cache
        self.cols: dict[str, np.ndarray[Any, Any]] = {}
        self.t_count = hdr.tensors["tensor.dtype"].shape[0]
        self.r_count = hdr.tensors["range.file"].shape[0]
        self.c_len = hdr.tensors["range.offsets"].shape[0]
        self.keys: list[str] = []
        self.cached_keys = False
        self.paths: list[str] = []
        self.next = 0

    def add(self, name: str, col: np.ndarray[Any, Any]) -> None:
        self.cols[name] = col
        order = self.ORDER
        while self.next < len(order) and order[self.next][0] <= self.cols.keys():
            self.next += 1
            getattr(self, order[self.next - 1][1])()

    def _keys(self) -> None:
        col, cache = self.cols["tensor.key"], self.cache
        # Declarations byte-identical to the previous table's were validated already.
        if cache is not None and cache.last is not None and col.tobytes() == cache.last[0]:
            self.keys, self.cached_keys = cache.keys, True
        else:
            # Counted before any string exists: one Python str per key costs ~50 bytes, so a
            # column of many short keys would cost 25x its bytes before the count refused it.
            n = int(np.count_nonzero(col == 0))
            if n != self.t_count:
                raise SchemaError(
                    f"{self.what}: column 'tensor.dtype' has {self.t_count} values for "
                    f"{n} keys",
                    path=self.what,
                )
            self.keys = _split_heap(col, what=self.what, column="tensor.key")
            _check_keys(col, self.keys, self.what)
        if len(self.keys) != self.t_count:
            raise SchemaError(
                f"{self.what}: column 'tensor.dtype' has {self.t_count} values for "
                f"{len(self.keys)} keys",
                path=self.what,
            )

    def _declarations(self) -> None:
        cols, cache = self.cols, self.cache
        spans = ("tensor.key", "tensor.dtype", "tensor.ndim", "tensor.shape")
        last = cache.last if cache is not None else None
        if (
            self.cached_keys
            and last is not None
            and all(cols[c].tobytes() == prev for c, prev in zip(spans[1:], last[1:], strict=True))
        ):
            return
        _check_declarations(cols, self.keys, self.what)
        if cache is not None:
            cache.last = tuple(cols[c].tobytes() for c in spans)
            cache.keys = self.keys

    def _counts(self) -> None:
        counts, r_count, what = self.cols["tensor.ranges"], self.r_count, self.what
        if counts.size and (int(counts.min()) < 0 or int(counts.max()) > r_count):
            raise SchemaError(
                f"{what}: 'tensor.ranges' holds a count outside 0..{r_count}", path=what
            )
        if int(counts.sum()) != r_count:
            raise SchemaError(
                f"{what}: 'tensor.ranges' adds up to {int(counts.sum())}, but 'range.file' and "
                f"'range.codec' have {r_count} records",
                path=what,
            )
        # Before the coordinate columns are decoded: their length is in the header.
        c_count = int((counts * self.cols["tensor.ndim"].astype(np.int64)).sum())
        if self.c_len != c_count:
            raise SchemaError(
                f"{what}: column 'range.offsets' has {self.c_len} values; the records need "
                f"{c_count}",
                path=what,
            )

    def _coordinates(self) -> None:
        what = self.what
        for name in ("range.offsets", "range.lengths"):
            col = self.cols[name]
            if col.size and int(col.max()) > MAX_SIZE:
                raise LimitError(f"{what}: column {name!r} holds a value above 2^53-1", path=what)

    def _codecs(self) -> None:
        col = self.cols["range.codec"]
        if col.size and int(col.max()) >= len(CODECS):
            raise CodecError(
                f"{self.what}: range codec code {int(col.max())}; 0 (none) and 1 (zstd) exist",
                path=self.what,
            )

    def _paths(self) -> None:
        what = self.what
        col = self.cols["file.path"]
        n = int(np.count_nonzero(col == 0))
        if n > len(self.files):  # each path is one of the document's files (R-FILES-2)
            raise SchemaError(
                f"{what}: column 'file.path' holds {n} paths, the document lists "
                f"{len(self.files)} files (R-FILES-2)",
                path=what,
            )
        self.paths = _split_heap(col, what=what, column="file.path")
        seen: set[str] = set()
        for i, p in enumerate(self.paths):
            check_relative_path(p, what=f"{what}: file.path #{i}")
            if p in seen:
                raise SchemaError(f"{what}: file.path {p!r} appears twice", path=what)
            seen.add(p)
            if p not in self.files:
                raise SchemaError(
                    f"{what}: file.path {p!r} is not listed in the document's files (R-FILES-2)",
                    path=what,
                )

    def _files(self) -> None:
        col = self.cols["range.file"]
        if col.size and int(col.max()) >= len(self.paths):
            raise SchemaError(
                f"{self.what}: range.file index {int(col.max())} is out of range for "
                f"{len(self.paths)} paths",
                path=self.what,
            )

    def table(self) -> TensorTable:
        if self.next < len(self.ORDER):  # every column was added: a caller bug otherwise
            raise AssertionError("tensor table checks left undone")
        c = self.cols
        return TensorTable(
            self.keys, c["tensor.dtype"], c["tensor.ndim"], c["tensor.shape"], c["tensor.ranges"],
            self.paths, c["range.file"], c["range.codec"], c["range.offsets"], c["range.lengths"],
        )  # fmt: skip


def _check_declarations(cols: dict[str, np.ndarray[Any, Any]], keys: list[str], what: str) -> None:
    """Dtype codes, ndims and shapes of a table (R-TABLE-6 for the tensor columns)."""
    t_count = len(keys)
    dtypes, ndim = cols["tensor.dtype"], cols["tensor.ndim"]
    if t_count and int(dtypes.max()) >= len(DTYPE_CODES):
        i = int(np.argmax(dtypes >= len(DTYPE_CODES)))
        raise DtypeUnsupportedError(
            f"{what}: tensor {keys[i][:80]!r} has dtype code {int(dtypes[i])}; codes "
            f"0-{len(DTYPE_CODES) - 1} exist (spec §7)",
            path=what,
        )
    if t_count and int(ndim.max()) > MAX_NDIM:
        i = int(np.argmax(ndim > MAX_NDIM))
        raise LimitError(
            f"{what}: tensor {keys[i][:80]!r} has {int(ndim[i])} dimensions (limit {MAX_NDIM})",
            path=what,
        )
    shape = cols["tensor.shape"]
    if shape.shape[0] != int(ndim.astype(np.int64).sum()):
        raise SchemaError(
            f"{what}: column 'tensor.shape' has {shape.shape[0]} values, the ndims add up to "
            f"{int(ndim.astype(np.int64).sum())}",
            path=what,
        )
    if shape.size and (int(shape.min()) < 0 or int(shape.max()) > MAX_SIZE):
        raise LimitError(f"{what}: a shape value is negative or above 2^53-1", path=what)
    _check_sizes(keys, dtypes, ndim, shape, what)


def _check_sizes(
    keys: list[str],
    dtypes: np.ndarray[Any, Any],
    ndim: np.ndarray[Any, Any],
    shape: np.ndarray[Any, Any],
    what: str,
) -> None:
    """R-TENSOR-1 for every tensor: exact integers where a float estimate comes near the limit."""
    if not keys:
        return
    itemsize = np.array([DTYPES[n].itemsize for n in DTYPE_CODES], np.float64)[dtypes]
    logs = np.log2(np.maximum(shape, 1).astype(np.float64))
    starts = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum(ndim.astype(np.int64), out=starts[1:])
    bits = np.add.reduceat(np.append(logs, 0.0), starts[:-1]) * (ndim > 0) + np.log2(itemsize)
    for i in np.flatnonzero(bits > 52.0):
        dims = [int(x) for x in shape[starts[i] : starts[i + 1]]]
        item = DTYPES[DTYPE_CODES[int(dtypes[i])]].itemsize
        if math.prod(d for d in dims if d) * item > MAX_SIZE or math.prod(dims) * item > MAX_SIZE:
            raise LimitError(
                f"{what}: tensor {keys[i][:80]!r} of shape {dims} exceeds 2^53-1 bytes "
                "(R-TENSOR-1)",
                path=what,
            )
