"""Tensor tables (spec §8.5, format 1.1): decoding, validation and encoding.

Written from the spec, independently of :mod:`portable_ckpt`. A tensor table is a safetensors file
(optionally one whole-file Zstandard frame) of ten 1-d columns that holds the tensor entries and
range records of a manifest or writer index instead of the JSON ``tensors`` object.

:func:`load_table` reads the table file (every checksum block verified), decodes it and applies
R-TABLE-3 … R-TABLE-6; the result, :class:`TensorTable`, yields every tensor in the shape of a JSON
tensor entry, with the implied range names of R-TABLE-7, so that the per-tensor rules (§8–§11)
are applied by the same code for both forms. :func:`encode_table` builds a table from JSON-shaped
tensor entries (used by the suite's tests).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Container, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from conformance.spec import (
    DTYPE_CODES,
    MAX_NDIM,
    MAX_SIZE,
    MAX_TABLE_BYTES,
    RANGE_CODECS,
    TABLE_COLUMNS,
    has_control_chars,
    path_problem,
)
from conformance.store import (
    Problem,
    VersionFiles,
    parse_safetensors_bytes,
    zstd_bound,
    zstd_decode,
)

__all__ = ["TensorTable", "decode_table", "encode_table", "implied_name", "load_table"]

_NP = {"U8": "<u1", "U32": "<u4", "I64": "<i8"}


def implied_name(key: str, offsets: Any) -> str:
    """The safetensors name of a table record (R-TABLE-7): ``key@o0,o1``; 0-d: ``key@``."""
    return f"{key}@{','.join(str(int(o)) for o in offsets)}"


@dataclass
class TensorTable:
    """A decoded, validated tensor table (column arrays plus per-tensor index ranges)."""

    keys: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    paths: list[str]
    range_begin: list[int]  # T + 1 prefix sums over tensor.ranges
    coord_begin: list[int]  # T + 1 prefix sums over tensor.ranges * ndim
    file_idx: np.ndarray[Any, Any]
    codec_idx: np.ndarray[Any, Any]
    offsets: np.ndarray[Any, Any]
    lengths: np.ndarray[Any, Any]

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def num_records(self) -> int:
        """R, the number of range records."""
        return self.range_begin[-1]

    def boxes(self, t: int) -> tuple[list[list[int]], list[list[int]]]:
        """Offsets and lengths of the records of tensor ``t`` (as Python int lists)."""
        n = self.range_begin[t + 1] - self.range_begin[t]
        nd = len(self.shapes[t])
        a, b = self.coord_begin[t], self.coord_begin[t + 1]
        if nd == 0:
            return [[] for _ in range(n)], [[] for _ in range(n)]
        offs: list[list[int]] = self.offsets[a:b].reshape(n, nd).tolist()
        lens: list[list[int]] = self.lengths[a:b].reshape(n, nd).tolist()
        return offs, lens

    def tensor(self, t: int) -> dict[str, Any]:
        """Tensor ``t`` as a JSON tensor entry ``{"dtype", "shape", "ranges": [...]}``."""
        key = self.keys[t]
        offs, lens = self.boxes(t)
        r0 = self.range_begin[t]
        files = self.file_idx[r0:self.range_begin[t + 1]].tolist()
        codecs = self.codec_idx[r0:self.range_begin[t + 1]].tolist()
        ranges = [{"offsets": o, "lengths": ln, "file": self.paths[f],
                   "name": implied_name(key, o), "codec": RANGE_CODECS[c]}
                  for o, ln, f, c in zip(offs, lens, files, codecs, strict=True)]
        return {"dtype": self.dtypes[t], "shape": list(self.shapes[t]), "ranges": ranges}

    def items(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(key, tensor entry)`` for every tensor, in table order (built lazily)."""
        for t, key in enumerate(self.keys):
            yield key, self.tensor(t)


def _split_strings(raw: bytes, column: str, where: str) -> list[bytes]:
    if not raw:
        return []
    if raw[-1] != 0:
        raise Problem("PCK-SCHEMA", f"{where}: column {column}: the last string is not followed "
                      "by a 0x00 byte (R-TABLE-5)")
    return raw[:-1].split(b"\x00")


def decode_table(data: bytes, files: Container[str], where: str) -> TensorTable:
    """Validate decoded table bytes (R-TABLE-4 … R-TABLE-6) and return the table.

    Args:
        data: The decoded table (a safetensors file).
        files: The ``files`` keys of the referencing document (every path must be one).
        where: Names the table in messages.

    Raises:
        Problem: with the code the spec gives for the first violation found.

    """
    hdr = parse_safetensors_bytes(data, where)
    names = set(hdr.tensors)
    missing = sorted(set(TABLE_COLUMNS) - names)
    extra = sorted(names - set(TABLE_COLUMNS))
    if missing or extra:
        raise Problem("PCK-SCHEMA", f"{where}: the table's columns differ from §8.5: missing "
                      f"{missing}, additional {extra[:10]} (R-TABLE-4)")
    col: dict[str, np.ndarray[Any, Any]] = {}
    for name, dt in TABLE_COLUMNS.items():
        st = hdr.tensors[name]
        if st.dtype != dt or len(st.shape) != 1:
            raise Problem("PCK-SCHEMA", f"{where}: column {name} is {st.dtype}{st.shape}, must "
                          f"be 1-d {dt} (R-TABLE-4)")
        col[name] = np.frombuffer(data, dtype=_NP[dt], count=st.shape[0], offset=st.begin)

    # R-TABLE-5: lengths of the columns.
    raw_keys = _split_strings(col["tensor.key"].tobytes(), "tensor.key", where)
    t_count = len(raw_keys)
    for name in ("tensor.dtype", "tensor.ndim", "tensor.ranges"):
        if len(col[name]) != t_count:
            raise Problem("PCK-SCHEMA", f"{where}: column {name} has {len(col[name])} values for "
                          f"{t_count} keys (R-TABLE-5)")
    ndims = [int(x) for x in col["tensor.ndim"]]
    too_deep = [i for i, n in enumerate(ndims) if n > MAX_NDIM]
    if too_deep:
        raise Problem("PCK-LIMIT", f"{where}: tensor {too_deep[0]} has ndim "
                      f"{ndims[too_deep[0]]} > {MAX_NDIM} (R-TABLE-6)")
    if len(col["tensor.shape"]) != sum(ndims):
        raise Problem("PCK-SCHEMA", f"{where}: column tensor.shape has "
                      f"{len(col['tensor.shape'])} values, Σ ndim is {sum(ndims)} (R-TABLE-5)")
    counts = [int(x) for x in col["tensor.ranges"]]
    if any(c < 0 for c in counts):
        raise Problem("PCK-SCHEMA", f"{where}: column tensor.ranges holds a negative count "
                      "(R-TABLE-5)")
    r_count = len(col["range.file"])
    if sum(counts) != r_count or len(col["range.codec"]) != r_count:
        raise Problem("PCK-SCHEMA", f"{where}: Σ tensor.ranges = {sum(counts)}, range.file has "
                      f"{r_count} and range.codec {len(col['range.codec'])} values (R-TABLE-5)")
    n_coords = sum(c * n for c, n in zip(counts, ndims, strict=True))
    for name in ("range.offsets", "range.lengths"):
        if len(col[name]) != n_coords:
            raise Problem("PCK-SCHEMA", f"{where}: column {name} has {len(col[name])} values, "
                          f"Σ ranges·ndim is {n_coords} (R-TABLE-5)")

    # R-TABLE-6: keys and paths.
    keys: list[str] = []
    for i, rk in enumerate(raw_keys):
        try:
            key = rk.decode("utf-8")
        except UnicodeDecodeError:
            raise Problem("PCK-SCHEMA", f"{where}: key {i} ({rk[:40]!r}) is not UTF-8 "
                          "(R-TABLE-6)") from None
        if not key or len(key) > 1024 or has_control_chars(key):
            raise Problem("PCK-SCHEMA", f"{where}: key {i} ({key[:40]!r}) must be 1..1024 "
                          "characters without control characters (R-TABLE-6, §8.1)")
        keys.append(key)
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            raise Problem("PCK-SCHEMA", f"{where}: key {key!r} appears twice (R-TABLE-6)")
        seen.add(key)
    paths: list[str] = []
    for i, rp in enumerate(_split_strings(col["file.path"].tobytes(), "file.path", where)):
        try:
            path = rp.decode("utf-8")
        except UnicodeDecodeError:
            raise Problem("PCK-PATH-UNSAFE", f"{where}: path {i} ({rp[:40]!r}) is not UTF-8 "
                          "(R-TABLE-6)") from None
        why = path_problem(path)
        if why is not None:
            raise Problem("PCK-PATH-UNSAFE", f"{where}: file.path {i}: {why} (R-TABLE-6)")
        paths.append(path)
    if len(set(paths)) != len(paths):
        raise Problem("PCK-SCHEMA", f"{where}: column file.path lists a path twice (R-TABLE-6)")
    for path in paths:
        if path not in files:
            raise Problem("PCK-SCHEMA", f"{where}: path {path!r} of file.path is not a key of "
                          "the document's files (R-TABLE-6)")
    file_idx = col["range.file"]
    if r_count and int(file_idx.max()) >= len(paths):
        raise Problem("PCK-SCHEMA", f"{where}: range.file value {int(file_idx.max())} is not "
                      f"below the number of paths, {len(paths)} (R-TABLE-6)")
    dcodes = col["tensor.dtype"]
    if t_count and int(dcodes.max()) >= len(DTYPE_CODES):
        raise Problem("PCK-DTYPE-UNSUPPORTED", f"{where}: dtype code {int(dcodes.max())} is not "
                      f"in §7's table (0 … {len(DTYPE_CODES) - 1}) (R-TABLE-6)")
    codec_idx = col["range.codec"]
    if r_count and int(codec_idx.max()) >= len(RANGE_CODECS):
        raise Problem("PCK-CODEC", f"{where}: codec code {int(codec_idx.max())} is not 0 (none) "
                      "or 1 (zstd) (R-TABLE-6)")
    shape_col = col["tensor.shape"]
    if len(shape_col) and (int(shape_col.min()) < 0 or int(shape_col.max()) > MAX_SIZE):
        raise Problem("PCK-LIMIT", f"{where}: a shape value is negative or above 2^53-1 "
                      "(R-TABLE-6)")
    for name in ("range.offsets", "range.lengths"):
        if len(col[name]) and int(col[name].max()) > MAX_SIZE:
            raise Problem("PCK-LIMIT", f"{where}: a value of {name} is above 2^53-1 (R-TABLE-6)")

    shapes: list[tuple[int, ...]] = []
    flat = shape_col.tolist()
    pos = 0
    for n in ndims:
        shapes.append(tuple(flat[pos:pos + n]))
        pos += n
    range_begin = [0]
    coord_begin = [0]
    for c, n in zip(counts, ndims, strict=True):
        range_begin.append(range_begin[-1] + c)
        coord_begin.append(coord_begin[-1] + c * n)
    return TensorTable(keys, [DTYPE_CODES[int(d)] for d in dcodes], shapes, paths, range_begin,
                       coord_begin, file_idx, codec_idx, col["range.offsets"],
                       col["range.lengths"])


def load_table(vf: VersionFiles, ref: Any, files: Container[str], where: str) -> TensorTable:
    """Read, decode and validate the table a document references (R-TABLE-1, -3 … -6).

    ``ref`` is the document's ``tensor_table`` member; its file must already be recorded in
    ``vf`` (its blocks are verified as they are read).

    Raises:
        Problem: with the code the spec gives for the first violation found.

    """
    if not isinstance(ref, Mapping):
        raise Problem("PCK-SCHEMA", f"{where}: tensor_table must be an object")
    rel, codec = ref.get("file"), ref.get("codec")
    why = path_problem(rel)
    if why is not None:
        raise Problem("PCK-PATH-UNSAFE", f"{where}: tensor_table.file: {why}")
    assert isinstance(rel, str)
    if rel not in files:
        raise Problem("PCK-SCHEMA", f"{where}: tensor_table.file {rel!r} is not a key of files "
                      "(R-TABLE-1)")
    if codec not in RANGE_CODECS:
        raise Problem("PCK-CODEC", f"{where}: tensor_table.codec {codec!r} is not 'none' or "
                      "'zstd'")
    rec = vf.records.get(rel)
    if rec is None:
        raise Problem("PCK-SCHEMA", f"{where}: table file {rel!r} is not listed in the "
                      "manifest's files (R-FILES-1)")
    if codec == "none" and rec.size > MAX_TABLE_BYTES:
        raise Problem("PCK-LIMIT", f"{where}: table {rel!r} has {rec.size} bytes, above 2^32 "
                      "(R-TABLE-3)")
    if codec == "zstd" and rec.size > zstd_bound(MAX_TABLE_BYTES):
        raise Problem("PCK-LIMIT", f"{where}: zstd table {rel!r} has {rec.size} bytes, more than "
                      "ZSTD_COMPRESSBOUND(2^32): it would decode to more than 2^32 (R-TABLE-3)")
    raw = vf.read(rel)  # whole file, every block verified (R-TABLE-3, R-CKSUM-3)
    if codec == "zstd":
        raw = zstd_decode(raw, where=f"{where}: table {rel!r}", limit=MAX_TABLE_BYTES,
                          need_content_size=True, limit_code="PCK-LIMIT")
    return decode_table(raw, files, f"{where}: table {rel!r}")


# ------------------------------------------------------------------------------------ encoding
def encode_table(tensors: Mapping[str, Mapping[str, Any]],
                 metadata: Mapping[str, str] | None = None) -> bytes:
    """Encode JSON-shaped tensor entries as an (uncompressed) tensor table.

    Range names are not stored (R-TABLE-7): the caller stores each range under
    :func:`implied_name`. Paths are listed in order of first use.
    """
    keys = bytearray()
    dtypes, ndims, shapes, counts = [], [], [], []
    files, codecs, offs, lens = [], [], [], []
    path_index: dict[str, int] = {}
    for key, t in tensors.items():
        keys += key.encode("utf-8") + b"\x00"
        dtypes.append(DTYPE_CODES.index(t["dtype"]))
        ndims.append(len(t["shape"]))
        shapes += list(t["shape"])
        counts.append(len(t["ranges"]))
        for r in t["ranges"]:
            files.append(path_index.setdefault(r["file"], len(path_index)))
            codecs.append(RANGE_CODECS.index(r["codec"]))
            offs += list(r["offsets"])
            lens += list(r["lengths"])
    paths = b"".join(p.encode("utf-8") + b"\x00" for p in path_index)
    columns = {
        "tensor.key": ("U8", bytes(keys)),
        "tensor.dtype": ("U8", bytes(dtypes)),
        "tensor.ndim": ("U8", bytes(ndims)),
        "tensor.shape": ("I64", struct.pack(f"<{len(shapes)}q", *shapes)),
        "tensor.ranges": ("I64", struct.pack(f"<{len(counts)}q", *counts)),
        "range.file": ("U32", struct.pack(f"<{len(files)}I", *files)),
        "range.codec": ("U8", bytes(codecs)),
        "range.offsets": ("I64", struct.pack(f"<{len(offs)}q", *offs)),
        "range.lengths": ("I64", struct.pack(f"<{len(lens)}q", *lens)),
        "file.path": ("U8", paths),
    }
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    pos = 0
    for name, (dt, data) in columns.items():
        n = len(data) // {"U8": 1, "U32": 4, "I64": 8}[dt]
        header[name] = {"dtype": dt, "shape": [n], "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(d for _, d in columns.values())

