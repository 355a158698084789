"""Tensor tables (spec §8.5, format 1.1): tensor entries and range records as columns.

A table holds the same information as a document's JSON ``tensors`` object, as ten 1-d columns of
one safetensors file (optionally one zstd frame as a whole). Readers keep the columns as numpy
arrays: nothing is built per range record until a read needs that record, so a version with
millions of records opens, plans and proves coverage in vectorised passes.

This module holds the table itself and its encoding; reading one (bounded decoding and every
check of a hostile file) is :mod:`portable_ckpt.io.table_decode`.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zstandard

from portable_ckpt.errors import CodecError
from portable_ckpt.format.dtypes import DTYPES
from portable_ckpt.format.manifest import RangeRecord, TensorEntry, dtype_not_defined
from portable_ckpt.format.vocab import CODEC_CODES, CODECS, TABLE_EXTENSION
from portable_ckpt.io.safetensors_io import build_header

__all__ = [
    "COLUMNS",
    "DTYPE_CODES",
    "EXTENSION",
    "MAX_TABLE_BYTES",
    "TABLE_THRESHOLD",
    "TableTensorEntry",
    "TensorTable",
    "encode_table",
    "iter_records",
    "range_name",
]

#: The ``must_understand`` name of the feature.
EXTENSION = TABLE_EXTENSION
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

    def used_dtypes(self) -> set[str]:
        """The format dtype names the table's tensors use (each code looked up once)."""
        return {DTYPE_CODES[c] for c in np.unique(self.dtypes).tolist()}

    def dtypes_not_defined(self, version: str | None, must_understand: list[str] | None) -> str:
        """Why a dtype the table uses is no row of a document of ``version`` ("" if none is).

        R-DTYPE-3 per version (:func:`~portable_ckpt.format.manifest.dtype_not_defined`),
        applied to a table's codes as the parser applies it to JSON tensors; ``None``: not
        known (a writer index has no ``must_understand``).
        """
        for name in sorted(self.used_dtypes()):
            problem = dtype_not_defined(DTYPES[name], version, must_understand)
            if problem:
                return problem
        return ""

    def shape_of(self, i: int) -> tuple[int, ...]:
        """Global shape of tensor ``i``."""
        return tuple(int(x) for x in self.shape[self.shape_start[i] : self.shape_start[i + 1]])

    def boxes(self, i: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """``(offsets, lengths)`` of tensor ``i``'s records as ``[count, ndim]`` int64 views."""
        c, nd = int(self.counts[i]), int(self.ndim[i])
        a, b = int(self.coord_start[i]), int(self.coord_start[i + 1])
        return self.offsets[a:b].reshape(c, nd), self.lengths[a:b].reshape(c, nd)

    def records_of(self, i: int, js: np.ndarray[Any, Any]) -> list[RangeRecord]:
        """Range records ``js`` (0-based within the tensor) of tensor ``i``, made together."""
        offs, lens = self.boxes(i)
        rows = int(self.row_start[i]) + js
        key, paths = self.keys[i], self.paths
        out: list[RangeRecord] = []
        for o, n, f, c in zip(
            offs[js].tolist(),
            lens[js].tolist(),
            self.file[rows].tolist(),
            self.codec[rows].tolist(),
            strict=True,
        ):
            at = tuple(o)
            out.append(RangeRecord(at, tuple(n), paths[f], range_name(key, at), CODECS[c]))
        return out

    def record(self, i: int, j: int) -> RangeRecord:
        """Range record ``j`` (0-based within the tensor) of tensor ``i``."""
        return self.records_of(i, np.array([j]))[0]

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
            self._ranges = self.table.records_of(self.index, np.arange(n))
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

    def records(self, js: np.ndarray[Any, Any]) -> list[RangeRecord]:
        """Range records ``js`` of this tensor (indices within it)."""
        if self._ranges is not None:
            return [self._ranges[j] for j in js.tolist()]
        return self.table.records_of(self.index, js)

    def __repr__(self) -> str:
        return (
            f"TableTensorEntry(key={self.key!r}, dtype={self.dtype!r}, shape={self.shape!r}, "
            f"ranges={self.range_count})"
        )


def iter_records(t: TensorEntry, chunk: int = 4096) -> Iterator[RangeRecord]:
    """Every range record of ``t``, in order; a table's made ``chunk`` at a time, not kept.

    ``t.ranges`` would build and keep them all (about 300 bytes each).
    """
    if isinstance(t, TableTensorEntry) and t.table_ranges_untouched:
        n = t.range_count
        for a in range(0, n, chunk):
            yield from t.records(np.arange(a, min(n, a + chunk)))
    else:
        yield from t.ranges


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
