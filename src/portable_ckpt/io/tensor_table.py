"""Tensor tables (spec §8.5, format 1.1): tensor entries and range records as columns.

A table holds the same information as a document's JSON ``tensors`` object, as ten 1-d columns of
one safetensors file (optionally one zstd frame as a whole). Readers keep the columns as numpy
arrays: nothing is built per range record until a read needs that record, so a version with
millions of records opens, plans and proves coverage in vectorised passes.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zstandard

from portable_ckpt.errors import (
    CodecError,
    DtypeUnsupportedError,
    LimitError,
    SchemaError,
)
from portable_ckpt.format.dtypes import DTYPES
from portable_ckpt.format.manifest import MAX_NDIM, MAX_SIZE, RangeRecord, TensorEntry
from portable_ckpt.format.paths import check_relative_path
from portable_ckpt.format.vocab import CODEC_CODES, CODECS
from portable_ckpt.io.codec import check_frame_header, decompress_frame, zstd_bound
from portable_ckpt.io.safetensors_io import build_header, parse_header

__all__ = [
    "COLUMNS",
    "DTYPE_CODES",
    "EXTENSION",
    "MAX_TABLE_BYTES",
    "TABLE_THRESHOLD",
    "TableCache",
    "TableTensorEntry",
    "TensorTable",
    "check_table_head",
    "decode_table",
    "encode_table",
    "range_name",
    "read_table_file",
]

#: The ``must_understand`` name of the feature.
EXTENSION = "tensor-table"
#: Largest decoded table (R-TABLE-3).
MAX_TABLE_BYTES = 1 << 32
#: The reference implementation writes a table above this many range records (spec §8.5).
TABLE_THRESHOLD = 65536
#: dtype code → format dtype name: the rows of spec §7 in order.
DTYPE_CODES: tuple[str, ...] = tuple(DTYPES)
_CODE_OF = {name: i for i, name in enumerate(DTYPE_CODES)}
#: Column name → (safetensors dtype, numpy dtype), in the order writers store them.
COLUMNS: dict[str, tuple[str, str]] = {
    "tensor.key": ("U8", "u1"),
    "tensor.dtype": ("U8", "u1"),
    "tensor.ndim": ("U8", "u1"),
    "tensor.shape": ("I64", "<i8"),
    "tensor.ranges": ("I64", "<i8"),
    "range.file": ("U32", "<u4"),
    "range.codec": ("U8", "u1"),
    "range.offsets": ("I64", "<i8"),
    "range.lengths": ("I64", "<i8"),
    "file.path": ("U8", "u1"),
}
_I64 = np.dtype("<i8")


def range_name(key: str, offsets: Iterable[int]) -> str:
    """The implied safetensors name of a table record (R-TABLE-7): ``key@o0,o1,...``."""
    return f"{key}@{','.join(str(int(o)) for o in offsets)}"


@dataclass(eq=False)
class TensorTable:
    """The columns of one table, validated; per-tensor offsets into them are precomputed."""

    keys: list[str]
    dtypes: np.ndarray[Any, Any]  # uint8 [T]
    ndim: np.ndarray[Any, Any]  # uint8 [T]
    shape: np.ndarray[Any, Any]  # int64 [sum ndim]
    counts: np.ndarray[Any, Any]  # int64 [T]
    paths: list[str]
    file: np.ndarray[Any, Any]  # uint32 [R]
    codec: np.ndarray[Any, Any]  # uint8 [R]
    offsets: np.ndarray[Any, Any]  # int64 [C]
    lengths: np.ndarray[Any, Any]  # int64 [C]

    # Positions are prefix sums, computed on first use: a committer merging thousands of writer
    # tables never needs them.
    @functools.cached_property
    def row_start(self) -> np.ndarray[Any, Any]:
        """First row of each tensor (length T + 1)."""
        out = np.zeros(len(self.keys) + 1, dtype=np.int64)
        np.cumsum(self.counts, out=out[1:])
        return out

    @functools.cached_property
    def coord_start(self) -> np.ndarray[Any, Any]:
        """First coordinate of each tensor in ``offsets``/``lengths`` (length T + 1)."""
        out = np.zeros(len(self.keys) + 1, dtype=np.int64)
        np.cumsum(self.counts * self.ndim.astype(np.int64), out=out[1:])
        return out

    @functools.cached_property
    def shape_start(self) -> np.ndarray[Any, Any]:
        """First value of each tensor's shape in ``shape`` (length T + 1)."""
        out = np.zeros(len(self.keys) + 1, dtype=np.int64)
        np.cumsum(self.ndim.astype(np.int64), out=out[1:])
        return out

    # -- access --------------------------------------------------------------------------------
    @property
    def records(self) -> int:
        """Number of range records."""
        return int(self.file.shape[0])

    def dtype_of(self, i: int) -> str:
        """Format dtype name of tensor ``i``."""
        return DTYPE_CODES[int(self.dtypes[i])]

    def shape_of(self, i: int) -> tuple[int, ...]:
        """Global shape of tensor ``i``."""
        return tuple(int(x) for x in self.shape[self.shape_start[i] : self.shape_start[i + 1]])

    def boxes(self, i: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """``(offsets, lengths)`` of tensor ``i``'s records as ``[count, ndim]`` int64 views."""
        c, nd = int(self.counts[i]), int(self.ndim[i])
        a, b = int(self.coord_start[i]), int(self.coord_start[i + 1])
        return self.offsets[a:b].reshape(c, nd), self.lengths[a:b].reshape(c, nd)

    def record(self, i: int, j: int) -> RangeRecord:
        """Range record ``j`` (0-based within the tensor) of tensor ``i``."""
        offs, lens = self.boxes(i)
        row = int(self.row_start[i]) + j
        o = tuple(int(x) for x in offs[j])
        return RangeRecord(
            o,
            tuple(int(x) for x in lens[j]),
            self.paths[int(self.file[row])],
            range_name(self.keys[i], o),
            CODECS[int(self.codec[row])],
        )

    def declaration_digest(self) -> bytes:
        """Digest of keys, dtypes and shapes: equal digests mean identical declarations."""
        h = hashlib.blake2b(digest_size=20)
        h.update(bytes(_heap(self.keys)))
        for col in (self.dtypes, self.ndim, self.shape):
            h.update(b"|")
            h.update(np.ascontiguousarray(col).tobytes())
        return h.digest()

    def entries(self) -> dict[str, TableTensorEntry]:
        """Key → tensor entry backed by this table (records are built on first use)."""
        return {k: TableTensorEntry(self, i) for i, k in enumerate(self.keys)}

    # -- building --------------------------------------------------------------------------------
    @staticmethod
    def from_entries(tensors: Iterable[TensorEntry]) -> TensorTable:
        """Build a table from tensor entries (JSON-form or table-backed)."""
        ts = list(tensors)
        paths: dict[str, int] = {}
        keys: list[str] = []
        dts: list[int] = []
        nds: list[int] = []
        shp: list[int] = []
        cnt: list[int] = []
        fl: list[np.ndarray[Any, Any]] = []
        cd: list[np.ndarray[Any, Any]] = []
        of: list[np.ndarray[Any, Any]] = []
        ln: list[np.ndarray[Any, Any]] = []
        for t in ts:
            keys.append(t.key)
            dts.append(_CODE_OF[t.dtype])
            nds.append(len(t.shape))
            shp.extend(t.shape)
            rs = t.ranges
            cnt.append(len(rs))
            fl.append(np.array([paths.setdefault(r.file, len(paths)) for r in rs], np.uint32))
            cd.append(np.array([CODEC_CODES[r.codec] for r in rs], np.uint8))
            of.append(np.array([x for r in rs for x in r.offsets], _I64))
            ln.append(np.array([x for r in rs for x in r.lengths], _I64))

        def cat(parts: list[np.ndarray[Any, Any]], dt: Any) -> np.ndarray[Any, Any]:
            return np.concatenate(parts).astype(dt, copy=False) if parts else np.zeros(0, dt)

        return TensorTable(
            keys,
            np.array(dts, np.uint8),
            np.array(nds, np.uint8),
            np.array(shp, _I64),
            np.array(cnt, _I64),
            list(paths),
            cat(fl, np.uint32),
            cat(cd, np.uint8),
            cat(of, _I64),
            cat(ln, _I64),
        )


class TableTensorEntry(TensorEntry):
    """A :class:`TensorEntry` whose range records live in a :class:`TensorTable`.

    ``ranges`` is built (once) on first access; planning and coverage use :meth:`boxes` instead,
    which costs no per-record objects.
    """

    def __init__(self, table: TensorTable, index: int) -> None:
        self.key = table.keys[index]
        self.dtype = table.dtype_of(index)
        self.shape = table.shape_of(index)
        self.table = table
        self.index = index
        self._ranges: list[RangeRecord] | None = None

    @property
    def ranges(self) -> list[RangeRecord]:
        """The range records (materialised from the table on first access)."""
        if self._ranges is None:
            n = int(self.table.counts[self.index])
            self._ranges = [self.table.record(self.index, j) for j in range(n)]
        return self._ranges

    @ranges.setter
    def ranges(self, value: list[RangeRecord]) -> None:
        self._ranges = value

    @property
    def table_ranges_untouched(self) -> bool:
        """True while ``ranges`` has not been materialised (and so cannot have been edited)."""
        return self._ranges is None

    @property
    def range_count(self) -> int:
        """Number of range records."""
        return int(self.table.counts[self.index])

    def boxes(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """``(offsets, lengths)`` as ``[count, ndim]`` int64 arrays."""
        return self.table.boxes(self.index)

    def record(self, j: int) -> RangeRecord:
        """Range record ``j`` of this tensor."""
        if self._ranges is not None:
            return self._ranges[j]
        return self.table.record(self.index, j)

    def __repr__(self) -> str:
        return (
            f"TableTensorEntry(key={self.key!r}, dtype={self.dtype!r}, shape={self.shape!r}, "
            f"ranges={self.range_count})"
        )


# ---------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------


def _heap(strings: Sequence[str]) -> np.ndarray[Any, Any]:
    return np.frombuffer(b"".join(s.encode("utf-8") + b"\0" for s in strings), dtype=np.uint8)


def encode_table(table: TensorTable, *, codec: str = "zstd", level: int = 3) -> bytes:
    """The bytes of a table file (spec §8.5): safetensors columns, optionally one zstd frame."""
    cols: dict[str, np.ndarray[Any, Any]] = {
        "tensor.key": _heap(table.keys),
        "tensor.dtype": table.dtypes,
        "tensor.ndim": table.ndim,
        "tensor.shape": table.shape,
        "tensor.ranges": table.counts,
        "range.file": table.file,
        "range.codec": table.codec,
        "range.offsets": table.offsets,
        "range.lengths": table.lengths,
        "file.path": _heap(table.paths),
    }
    arrays = [np.ascontiguousarray(cols[name], dtype=np_dt) for name, (_, np_dt) in COLUMNS.items()]
    head = build_header(
        [(name, st, [a.shape[0]], a.nbytes) for (name, (st, _)), a in zip(COLUMNS.items(), arrays, strict=True)],
        {"portable_ckpt": "1.1"},
    )
    raw = b"".join([head, *(a.tobytes() for a in arrays)])
    if codec == "none":
        return raw
    if codec != "zstd":
        raise CodecError(f"tensor table codec {codec!r} is not 'none' or 'zstd'")
    cctx = zstandard.ZstdCompressor(level=level, write_content_size=True, threads=-1 if len(raw) > 8 << 20 else 0)
    return cctx.compress(raw)


# ---------------------------------------------------------------------------------------------
# Decoding untrusted bytes
# ---------------------------------------------------------------------------------------------


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


def decode_table(
    data: bytes | bytearray | memoryview,
    *,
    codec: str,
    what: str,
    files: Mapping[str, Any],
    cache: TableCache | None = None,
) -> TensorTable:
    """Decode and validate a table file's bytes (spec §8.5, R-TABLE-3 … R-TABLE-6).

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
    raw: bytes | bytearray
    declared = check_table_head(data[:18], size=len(data), codec=codec, what=what)
    if codec == "zstd":
        raw = decompress_frame(data, expect=declared, limit=MAX_TABLE_BYTES, what=what)
    else:
        raw = data if isinstance(data, bytes | bytearray) else bytes(data)
    if len(raw) < 8:
        from portable_ckpt.errors import ShardHeaderError

        raise ShardHeaderError(f"{what}: {len(raw)} bytes is too short for a safetensors file", path=what)
    n = int.from_bytes(raw[:8], "little")
    if n > len(raw) - 8 or n > 100_000_000:
        from portable_ckpt.errors import ShardHeaderError

        raise ShardHeaderError(
            f"{what}: header length {n} exceeds the limit or the table size ({len(raw)})", path=what
        )
    head = bytes(raw[8 : 8 + n])
    if cache is not None and cache.header is not None and cache.header[:2] == (head, len(raw)):
        hdr = cache.header[2]  # same header and size as the previous table: same parse
    else:
        hdr = parse_header(bytes(raw[:8]), head, path=what, file_size=len(raw))
        if cache is not None:
            cache.header = (head, len(raw), hdr)
    names = set(hdr.tensors)
    if names != set(COLUMNS):
        missing = sorted(set(COLUMNS) - names)
        extra = sorted(names - set(COLUMNS))
        raise SchemaError(
            f"{what}: tensor table columns differ from spec §8.5 (missing {missing}, extra "
            f"{extra[:8]})",
            path=what,
        )
    cols: dict[str, np.ndarray[Any, Any]] = {}
    for name, (st, np_dt) in COLUMNS.items():
        t = hdr.tensors[name]
        if t.dtype != st or len(t.shape) != 1:
            raise SchemaError(
                f"{what}: column {name!r} is {t.dtype}{list(t.shape)}; spec §8.5 requires a 1-d "
                f"{st} column",
                path=what,
            )
        cols[name] = np.frombuffer(raw, dtype=np_dt, count=t.shape[0], offset=t.start)
    dtypes, ndim, shape = cols["tensor.dtype"], cols["tensor.ndim"], cols["tensor.shape"]
    mv = memoryview(raw)
    spans = [hdr.tensors[c] for c in ("tensor.key", "tensor.dtype", "tensor.ndim", "tensor.shape")]
    last = cache.last if cache is not None else None
    # Declarations byte-identical to the previous table's were validated already (memcmp only).
    if last is not None and all(
        len(prev) == t.end - t.start and raw[t.start : t.end] == prev
        for t, prev in zip(spans, last, strict=True)
    ):
        keys = cache.keys if cache is not None else []
    else:
        keys = _decode_declarations(cols, what)
        if cache is not None:
            cache.last = tuple(bytes(mv[t.start : t.end]) for t in spans)
            cache.keys = keys
    if cols["tensor.ranges"].shape[0] != len(keys):
        raise SchemaError(
            f"{what}: column 'tensor.ranges' has {cols['tensor.ranges'].shape[0]} values for "
            f"{len(keys)} keys",
            path=what,
        )
    counts = cols["tensor.ranges"]
    r_count = cols["range.file"].shape[0]
    if counts.size and (int(counts.min()) < 0 or int(counts.max()) > r_count):
        raise SchemaError(f"{what}: 'tensor.ranges' holds a count outside 0..{r_count}", path=what)
    if int(counts.sum()) != r_count or cols["range.codec"].shape[0] != r_count:
        raise SchemaError(
            f"{what}: 'tensor.ranges' adds up to {int(counts.sum())}, but 'range.file' has "
            f"{r_count} and 'range.codec' {cols['range.codec'].shape[0]} records",
            path=what,
        )
    c_count = int((counts * ndim.astype(np.int64)).sum())
    for name in ("range.offsets", "range.lengths"):
        if cols[name].shape[0] != c_count:
            raise SchemaError(
                f"{what}: column {name!r} has {cols[name].shape[0]} values; the records need "
                f"{c_count}",
                path=what,
            )
        if c_count and int(cols[name].max()) > MAX_SIZE:
            raise LimitError(f"{what}: column {name!r} holds a value above 2^53-1", path=what)
    codec_col = cols["range.codec"]
    if r_count and int(codec_col.max()) >= len(CODECS):
        raise CodecError(
            f"{what}: range codec code {int(codec_col.max())}; 0 (none) and 1 (zstd) exist",
            path=what,
        )
    paths = _split_heap(cols["file.path"], what=what, column="file.path")
    pseen: set[str] = set()
    for i, p in enumerate(paths):
        check_relative_path(p, what=f"{what}: file.path #{i}")
        if p in pseen:
            raise SchemaError(f"{what}: file.path {p!r} appears twice", path=what)
        pseen.add(p)
        if p not in files:
            raise SchemaError(
                f"{what}: file.path {p!r} is not listed in the document's files (R-FILES-2)",
                path=what,
            )
    if r_count and int(cols["range.file"].max()) >= len(paths):
        raise SchemaError(
            f"{what}: range.file index {int(cols['range.file'].max())} is out of range for "
            f"{len(paths)} paths",
            path=what,
        )
    return TensorTable(
        keys, dtypes, ndim, shape, counts, paths, cols["range.file"], codec_col,
        cols["range.offsets"], cols["range.lengths"],
    )  # fmt: skip


def _decode_declarations(cols: dict[str, np.ndarray[Any, Any]], what: str) -> list[str]:
    """Keys, dtype codes, ndims and shapes of a table (R-TABLE-6 for the tensor columns)."""
    keys = _split_heap(cols["tensor.key"], what=what, column="tensor.key")
    _check_keys(cols["tensor.key"], keys, what)
    t_count = len(keys)
    for name in ("tensor.dtype", "tensor.ndim", "tensor.ranges"):
        if cols[name].shape[0] != t_count:
            raise SchemaError(
                f"{what}: column {name!r} has {cols[name].shape[0]} values for {t_count} keys",
                path=what,
            )
    dtypes, ndim = cols["tensor.dtype"], cols["tensor.ndim"]
    if t_count and int(dtypes.max()) >= len(DTYPE_CODES):
        i = int(np.argmax(dtypes >= len(DTYPE_CODES)))
        raise DtypeUnsupportedError(
            f"{what}: tensor {keys[i][:80]!r} has dtype code {int(dtypes[i])}; codes 0-14 exist "
            "(spec §7)",
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
    return keys


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
