#!/usr/bin/env python3
"""Generate the golden vectors of format 1.1 (run once; the output is frozen and committed).

Format 1.1 adds tensor tables (spec §8.5): the tensor entries and range records of a manifest or
writer index in one columnar safetensors file, optionally one whole-file Zstandard frame. The
cases here exercise tables (valid forms and one broken rule of R-TABLE-1 … R-TABLE-8 or of the
per-tensor rules each) and a 1.1 manifest without a table; the 1.0 vectors stay valid as they are.

Uses only the standard library, numpy, crc32c and zstandard (safetensors files and tables are
written by hand so that they can be made defective on purpose). Refuses to touch an existing
vector directory unless ``--force`` is given: vectors of a released version are never changed.

Usage: python conformance/vectors/generate_1_1.py [--out DIR] [--force]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

BLOCK = 4096
DT = {  # format dtype -> (safetensors dtype, itemsize, numpy storage dtype), in §7's row order
    "float64": ("F64", 8, "<f8"), "float32": ("F32", 4, "<f4"), "float16": ("F16", 2, "<f2"),
    "bfloat16": ("BF16", 2, "<u2"), "int64": ("I64", 8, "<i8"), "int32": ("I32", 4, "<i4"),
    "int16": ("I16", 2, "<i2"), "int8": ("I8", 1, "i1"), "uint8": ("U8", 1, "u1"),
    "uint16": ("U16", 2, "<u2"), "uint32": ("U32", 4, "<u4"), "uint64": ("U64", 8, "<u8"),
    "bool": ("BOOL", 1, "u1"), "float8_e4m3fn": ("F8_E4M3", 1, "u1"),
    "float8_e5m2": ("F8_E5M2", 1, "u1"),
}
#: §8.5: dtype code = row of §7's table counted from 0; codec code 0 = none, 1 = zstd.
DTYPE_CODE = {name: i for i, name in enumerate(DT)}
CODEC_CODE = {"none": 0, "zstd": 1}
#: §8.5: the ten columns (name -> safetensors dtype), in the order this generator writes them.
COLUMNS = {
    "tensor.key": "U8", "tensor.dtype": "U8", "tensor.ndim": "U8", "tensor.shape": "I64",
    "tensor.ranges": "I64", "range.file": "U32", "range.codec": "U8", "range.offsets": "I64",
    "range.lengths": "I64", "file.path": "U8",
}
_PACK = {"U8": "B", "U32": "I", "I64": "q"}
_SIZE = {"U8": 1, "U32": 4, "I64": 8}
def _load_1_0() -> Any:
    """The 1.0 generator (same directory): its value encoders and file records are reused."""
    import importlib.util

    path = Path(__file__).resolve().with_name("generate_1_0.py")
    spec = importlib.util.spec_from_file_location("pck_generate_1_0_shared", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_V10 = _load_1_0()
encode, nested, file_record = _V10.encode, _V10.nested, _V10.file_record
TABLE_NONE = "tensor-table.safetensors"
TABLE_ZSTD = "tensor-table.safetensors.zst"


def aid(step: int, n: int = 0) -> str:
    """Deterministic attempt id for ``step``."""
    return f"s{step:012d}-20260201T0000{n:02d}000000Z-{0x0123456789abcdef + n:016x}"


def st_file(tensors: list[tuple[str, str, list[int], bytes]],
            metadata: dict[str, str] | None = None) -> bytes:
    """A standard safetensors file: (name, st_dtype, shape, data) in order; header padded to 8."""
    hdr: dict[str, Any] = {} if metadata is None else {"__metadata__": metadata}
    pos = 0
    for name, dt, shape, data in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(t[3] for t in tensors)


SHARD_META = {"format": "pt", "portable_ckpt": "1.0"}


def zstd_frame(data: bytes) -> bytes:
    """A regular zstd frame with its content size (what a writer produces)."""
    return zstandard.ZstdCompressor(level=3, write_content_size=True).compress(data)


def raw_frame(data: bytes, *, fcs: int | None = None, block_type: int = 0) -> bytes:
    """A hand-made zstd frame: one raw block, 8-byte content size (``fcs`` overrides it)."""
    out = bytearray(b"\x28\xb5\x2f\xfd")
    out.append(0b11000000)  # FCS flag 3 (8 bytes), no single segment, no checksum, no dictionary
    out.append(7 << 3)  # window 128 KiB
    out += struct.pack("<Q", len(data) if fcs is None else fcs)
    out += ((len(data) << 3) | (block_type << 1) | 1).to_bytes(3, "little")
    return bytes(out + data)


# ----------------------------------------------------------------------------- tensor tables
#: a table record of one tensor: (key, dtype, shape, [(offsets, lengths, file, codec), ...])
Rec = tuple[str, str, list[int], list[tuple[list[int], list[int], str, str]]]
#: table columns: name -> [safetensors dtype, values (ints) or raw bytes, shape override or None]
Cols = dict[str, list[Any]]


def table_records(tensors: dict[str, Any]) -> list[Rec]:
    """The records of JSON-shaped tensor entries, in order."""
    return [(key, t["dtype"], list(t["shape"]),
             [(list(r["offsets"]), list(r["lengths"]), r["file"], r["codec"])
              for r in t["ranges"]]) for key, t in tensors.items()]


def table_columns(recs: list[Rec], paths: list[str] | None = None) -> Cols:
    """Column values of a table (paths in order of first use unless given)."""
    if paths is None:
        paths = []
        for _, _, _, ranges in recs:
            for _, _, f, _ in ranges:
                if f not in paths:
                    paths.append(f)
    key_bytes = b"".join(k.encode("utf-8") + b"\x00" for k, _, _, _ in recs)
    path_bytes = b"".join(p.encode("utf-8") + b"\x00" for p in paths)
    return {
        "tensor.key": ["U8", key_bytes, None],
        "tensor.dtype": ["U8", [DTYPE_CODE[d] for _, d, _, _ in recs], None],
        "tensor.ndim": ["U8", [len(s) for _, _, s, _ in recs], None],
        "tensor.shape": ["I64", [x for _, _, s, _ in recs for x in s], None],
        "tensor.ranges": ["I64", [len(r) for _, _, _, r in recs], None],
        "range.file": ["U32", [paths.index(f) for _, _, _, r in recs for _, _, f, _ in r], None],
        "range.codec": ["U8", [CODEC_CODE[c] for _, _, _, r in recs for _, _, _, c in r], None],
        "range.offsets": ["I64", [x for _, _, _, r in recs for o, _, _, _ in r for x in o], None],
        "range.lengths": ["I64", [x for _, _, _, r in recs for _, n, _, _ in r for x in n], None],
        "file.path": ["U8", path_bytes, None],
    }


def table_bytes(cols: Cols, metadata: dict[str, str] | None = None) -> bytes:
    """The (uncompressed) safetensors file of ``cols``."""
    items = []
    for name, (dt, values, shape) in cols.items():
        data = values if isinstance(values, bytes) else struct.pack(
            f"<{len(values)}{_PACK[dt]}", *values)
        items.append((name, dt, shape or [len(data) // _SIZE[dt]], data))
    return st_file(items, metadata)


class V:
    """Builder of one version (tensors in a table or in JSON), then written to disk."""

    def __init__(self, step: int = 10, n: int = 0, world_size: int = 1,
                 table: str | None = "none") -> None:
        self.step = step
        self.id = aid(step, n)
        self.world_size = world_size
        self.table = table  # table codec, or None for JSON tensors
        self.table_meta: dict[str, str] | None = None
        self.files: dict[str, bytes] = {}
        self.st: dict[str, list[tuple[str, str, list[int], bytes]]] = {}
        self.tensors: dict[str, Any] = {}
        self.entries: dict[str, Any] = {}
        self.expected_tensors: dict[str, Any] = {}
        self.expected_entries: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}
        # hooks that break one rule of the table each
        self.mutate_records: Callable[[list[Rec]], None] | None = None
        self.mutate_columns: Callable[[Cols], None] | None = None
        self.mutate_decoded: Callable[[bytes], bytes] | None = None
        self.mutate_encoded: Callable[[bytes], bytes] | None = None

    def tensor(self, key: str, dtype: str, shape: list[int], flat: list[Any],
               boxes: list[tuple[list[int], list[int], int]] | None = None,
               codec: str = "none") -> None:
        """Add a tensor with C-order ``flat`` values, split into ``boxes`` (offs, lens, writer).

        Each range is stored under its implied name ``key@offsets`` (R-TABLE-7).
        """
        st_dt, isz, _ = DT[dtype]
        full = np.frombuffer(encode(dtype, flat), dtype=np.uint8).reshape(*shape, isz) \
            if flat else np.zeros((*shape, isz), np.uint8)
        if boxes is None:
            boxes = [([0] * len(shape), list(shape), 0)] if math.prod(shape) else []
        ranges = []
        for offs, lens, w in boxes:
            sl = tuple(slice(o, o + n) for o, n in zip(offs, lens, strict=True))
            data = np.ascontiguousarray(full[sl]).tobytes()
            fname = f"data/w{w:05d}-0000.safetensors"
            name = f"{key}@{','.join(map(str, offs))}"
            if codec == "zstd":
                frame = zstd_frame(data)
                self.st.setdefault(fname, []).append((name, "U8", [len(frame)], frame))
            else:
                self.st.setdefault(fname, []).append((name, st_dt, list(lens), data))
            ranges.append({"offsets": offs, "lengths": lens, "file": fname, "name": name,
                           "codec": codec})
        self.tensors[key] = {"dtype": dtype, "shape": shape, "ranges": ranges}
        self.expected_tensors[key] = {"dtype": dtype, "shape": shape,
                                      "values": nested(flat, shape) if flat else [],
                                      "hex": full.tobytes().hex()}

    def entry(self, name: str, value: Any) -> None:
        """Add a global pck:json/1 entry."""
        fname = f"entries/{name}.g.json"
        self.files[fname] = json.dumps(value).encode()
        self.entries[name] = {"schema": {"id": "pck:json/1"}, "scope": "global",
                              "encoding": "json", "values": [{"file": fname}]}
        self.expected_entries[name] = value

    def table_file(self) -> str:
        """Path of the manifest's table file."""
        return TABLE_ZSTD if self.table == "zstd" else TABLE_NONE

    def encode_table(self, tensors: dict[str, Any], codec: str) -> bytes:
        """The table file of ``tensors`` with every hook applied."""
        recs = table_records(tensors)
        if self.mutate_records:
            self.mutate_records(recs)
        cols = table_columns(recs)
        if self.mutate_columns:
            self.mutate_columns(cols)
        data = table_bytes(cols, self.table_meta)
        if self.mutate_decoded:
            data = self.mutate_decoded(data)
        if codec == "zstd":
            data = zstd_frame(data)
        if self.mutate_encoded:
            data = self.mutate_encoded(data)
        return data

    def build(self) -> tuple[dict[str, bytes], dict[str, Any]]:
        """Return (files by relative path, manifest dict)."""
        files = dict(self.files)
        for fname, ts in self.st.items():
            files[fname] = st_file(ts, SHARD_META)
        m: dict[str, Any] = {
            "format": "portable-ckpt", "format_version": "1.1", "attempt_id": self.id,
            "step": self.step, "created_at": "2026-02-01T00:00:00.000000Z",
            "committed_at": "2026-02-01T00:00:01.000000Z",
            "producer": {"name": "pck-vector-generator", "version": "1.1"},
            "continuation": {"contract": "exact", "world_size": self.world_size, "mesh": None},
            "files": {}, "tensors": self.tensors, "entries": self.entries,
            "must_understand": [], "extensions": {},
        }
        if self.table is not None:
            files[self.table_file()] = self.encode_table(self.tensors, self.table)
            m["tensors"] = {}
            m["tensor_table"] = {"file": self.table_file(), "codec": self.table}
            m["must_understand"] = ["tensor-table"]
        m.update(self.extra)
        return files, m

    def expected(self) -> dict[str, Any]:
        """expected.json content."""
        return {"attempt_id": self.id, "step": self.step, "tensors": self.expected_tensors,
                "entries": self.expected_entries}


def write_version(root: Path, v: V, *, mutate_files: Callable[[dict[str, bytes]], None] | None
                  = None, mutate_manifest: Callable[[dict[str, Any]], None] | None = None,
                  after_records: Callable[[dict[str, bytes], dict[str, Any]], None] | None = None
                  ) -> Path:
    """Write ``v`` below ``root``; the hooks inject one defect each."""
    files, m = v.build()
    if mutate_files:
        mutate_files(files)
    m["files"] = {k: file_record(files[k]) for k in sorted(files)}
    if mutate_manifest:
        mutate_manifest(m)
    if after_records:
        after_records(files, m)
    vdir = root / v.id
    for rel, data in files.items():
        if ".." in rel.split("/") or rel.startswith("/"):
            continue
        p = vdir / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    vdir.mkdir(parents=True, exist_ok=True)
    (vdir / "manifest.json").write_text(json.dumps(m, indent=1) + "\n", encoding="utf-8")
    return vdir


CASES: list[dict[str, Any]] = []


def case(name: str, feature: str, *, code: str | None = None, target: str = "version") -> \
        Callable[[Callable[[Path], V | None]], Callable[[Path], V | None]]:
    """Register a case generator (valid when ``code`` is None)."""
    def deco(fn: Callable[[Path], V | None]) -> Callable[[Path], V | None]:
        CASES.append({"name": name, "feature": feature, "code": code, "target": target,
                      "fn": fn})
        return fn
    return deco


def basic(table: str | None = "none", step: int = 10, n: int = 0) -> V:
    """A 4x3 float32 tensor in two row blocks plus one global entry, tensors in a table."""
    v = V(step, n, table=table)
    v.tensor("model.w", "float32", [4, 3], [float(i) + 0.5 for i in range(12)],
             [([0, 0], [2, 3], 0), ([2, 0], [2, 3], 0)])
    v.entry("meta", {"epoch": 3, "name": "basic"})
    return v


# ------------------------------------------------------------------------------------ valid
@case("valid-table-none", "tensor table with codec none (a plain safetensors file)")
def _(root: Path) -> V:
    v = basic("none")
    write_version(root, v)
    return v


@case("valid-table-zstd", "tensor table with codec zstd (one frame with its content size); the "
      "table's __metadata__ carries strings a reader ignores")
def _(root: Path) -> V:
    v = basic("zstd")
    v.table_meta = {"producer": "pck-vector-generator", "note": "ignored by readers"}
    write_version(root, v)
    return v


@case("valid-table-mixed", "a zstd table holding a 0-d tensor, a zero-size tensor, a tensor "
      "split over two data files and zstd-compressed ranges")
def _(root: Path) -> V:
    v = V(world_size=2, table="zstd")
    v.tensor("scalar", "float64", [], [42.25])
    v.tensor("empty", "float32", [0, 4], [])
    v.tensor("w", "int32", [5, 7], list(range(35)),
             [([0, 0], [2, 3], 0), ([0, 3], [2, 4], 1), ([2, 0], [3, 5], 1), ([2, 5], [3, 2], 0)])
    v.tensor("z", "float32", [3, 4], [float(i) for i in range(12)],
             [([0, 0], [3, 2], 1), ([0, 2], [3, 2], 1)], codec="zstd")
    v.tensor("flags", "bool", [3], [True, False, True], codec="zstd")
    v.entry("meta", {"epoch": 1})
    write_version(root, v)
    return v


@case("valid-table-ndim", "1-d, 2-d, 3-d and 4-d tensors in one table, boxes cut along every "
      "dimension")
def _(root: Path) -> V:
    v = V(table="none")
    v.tensor("x1", "int64", [5], [-2, -1, 0, 1, 2], [([0], [2], 0), ([2], [3], 0)])
    v.tensor("x2", "uint16", [3, 2], [0, 1, 2, 65535, 4, 5], [([0, 0], [3, 1], 0),
                                                               ([0, 1], [3, 1], 0)])
    v.tensor("x3", "int16", [2, 3, 4], list(range(24)),
             [([0, 0, 0], [1, 3, 4], 0), ([1, 0, 0], [1, 1, 4], 0), ([1, 1, 0], [1, 2, 1], 0),
              ([1, 1, 1], [1, 2, 3], 0)])
    v.tensor("x4", "uint8", [2, 2, 2, 3], list(range(24)),
             [([0, 0, 0, 0], [2, 2, 1, 3], 0), ([0, 0, 1, 0], [2, 2, 1, 3], 0)])
    write_version(root, v)
    return v


DTYPE_VALUES: dict[str, list[Any]] = _V10.DTYPE_VALUES
_fix_exact = _V10._fix_exact


@case("valid-table-dtypes", "one tensor of every dtype of §7 in one table: dtype codes 0 … 14")
def _(root: Path) -> V:
    v = V(table="none")
    for dt in DT:
        v.tensor(f"t.{dt}", dt, [2, 2], _fix_exact(dt, DTYPE_VALUES[dt]),
                 [([0, 0], [1, 2], 0), ([1, 0], [1, 2], 0)])
    write_version(root, v)
    return v


@case("valid-table-keys", "keys with multi-byte UTF-8, spaces and '@' (implied names "
      "'emb.ü@0', 'a@b@0,1', ...)")
def _(root: Path) -> V:
    v = V(table="none")
    v.tensor("emb.ü", "float32", [2], [1.0, 2.0])
    v.tensor("层.0/权重", "int8", [3], [1, 2, 3], [([0], [1], 0), ([1], [2], 0)])
    v.tensor("a@b", "int32", [1, 2], [5, 6], [([0, 0], [1, 1], 0), ([0, 1], [1, 1], 0)])
    v.tensor("with space", "uint8", [], [9])
    write_version(root, v)
    return v


@case("valid-table-layers", "eight tensors with one layout (a 2x3 grid) and a tensor of 300 "
      "one-element ranges, in a zstd table")
def _(root: Path) -> V:
    v = V(world_size=6, table="zstd")
    grid = [([r * 4, c * 2], [4, 2], r * 3 + c) for r in range(2) for c in range(3)]
    for i in range(8):
        v.tensor(f"layers.{i}.w", "float16", [8, 6], [float(i * 48 + j) for j in range(48)],
                 grid)
    v.tensor("long", "int16", [300], [i - 150 for i in range(300)],
             [([i], [1], i % 6) for i in range(300)])
    write_version(root, v)
    return v


@case("valid-table-no-tensors", "an empty table (no tensors, every column of length 0)")
def _(root: Path) -> V:
    v = V(table="none")
    v.entry("meta", {"only": "entries"})
    write_version(root, v)
    return v


@case("valid-no-table-1.1", "format_version 1.1 with JSON tensors and no table: accepted")
def _(root: Path) -> V:
    v = basic(None)
    write_version(root, v)
    return v


@case("valid-table-writer-index", "manifest table plus a writer index (format 1.1) whose records "
      "are in a table of their own, listed in the index's files")
def _(root: Path) -> V:
    v = basic("none")

    write_version(root, v, mutate_files=lambda files: table_index(v, files, v.tensors))
    return v


def table_index(v: V, files: dict[str, bytes], tensors: dict[str, Any]) -> None:
    """Add writer 0's index whose records (``tensors``) are in a table of its own."""
    itable = "index/w00000.tensors.safetensors"
    files[itable] = v.encode_table(tensors, "none")
    own = [k for k in sorted(files) if k.startswith(("data/", "entries/", "index/"))]
    index = {"format": "portable-ckpt-writer-index", "format_version": "1.1",
             "attempt_id": v.id, "writer": 0,
             "files": {k: file_record(files[k]) for k in own}, "tensors": {},
             "entries": v.entries, "tensor_table": {"file": itable, "codec": "none"}}
    files["index/w00000.json"] = (json.dumps(index, indent=1) + "\n").encode()


@case("valid-table-latest", "a root with a 1.0 version at step 10 and a 1.1 table version at "
      "step 20: the latest is step 20", target="root")
def _(root: Path) -> V:
    old = basic(None, 10, 0)
    old.extra = {"format_version": "1.0"}
    write_version(root, old)
    v = V(20, 1, table="zstd")
    v.tensor("model.w", "float32", [4, 3], [float(-i) for i in range(12)])
    v.entry("meta", {"epoch": 4, "name": "newer"})
    write_version(root, v)
    return v


# ---------------------------------------------------------------------------------- invalid
def inv(name: str, feature: str, code: str, **kw: Any) -> Callable[
        [Callable[[Path], None]], Callable[[Path], None]]:
    """Register an invalid case."""
    return case(name, feature, code=code, **kw)  # type: ignore[return-value]


def _cols(fn: Callable[[Cols], None], v: V | None = None) -> V:
    v = v or basic()
    v.mutate_columns = fn
    return v


def _recs(fn: Callable[[list[Rec]], None], v: V | None = None) -> V:
    v = v or basic()
    v.mutate_records = fn
    return v


def _two_vectors() -> V:
    v = V(table="none")
    v.tensor("a", "float32", [2], [1.0, 2.0])
    v.tensor("b", "float32", [2], [3.0, 4.0])
    return v


# R-TABLE-1 / R-TABLE-2: the reference
@inv("invalid-table-file-not-listed", "tensor_table.file is not a key of files (R-TABLE-1)",
     "PCK-SCHEMA")
def _(root: Path) -> None:
    write_version(root, basic(), mutate_manifest=lambda m: m["files"].pop(TABLE_NONE))


@inv("invalid-table-tensors-not-empty", "a manifest with a table and a non-empty tensors object "
     "(R-TABLE-1)", "PCK-SCHEMA")
def _(root: Path) -> None:
    v = basic()
    v.extra = {"tensors": json.loads(json.dumps(v.tensors))}
    write_version(root, v)


@inv("invalid-table-must-understand", "a manifest with a table whose must_understand lacks "
     "'tensor-table' (R-TABLE-2)", "PCK-SCHEMA")
def _(root: Path) -> None:
    v = basic()
    v.extra = {"must_understand": []}
    write_version(root, v)


@inv("invalid-table-format-1.0", "a manifest with a table and format_version 1.0 (R-TABLE-2)",
     "PCK-SCHEMA")
def _(root: Path) -> None:
    v = basic()
    v.extra = {"format_version": "1.0"}
    write_version(root, v)


@inv("invalid-table-ref-codec", "tensor_table.codec is 'lz4'", "PCK-CODEC")
def _(root: Path) -> None:
    write_version(root, basic(), mutate_manifest=lambda m: m["tensor_table"].update(codec="lz4"))


@inv("invalid-table-ref-member", "tensor_table has a member other than file and codec",
     "PCK-SCHEMA")
def _(root: Path) -> None:
    write_version(root, basic(), mutate_manifest=lambda m: m["tensor_table"].update(rows=1))


# R-TABLE-3: decoding
@inv("invalid-table-zstd-corrupt", "the zstd table frame has a block of the reserved type 3",
     "PCK-CODEC")
def _(root: Path) -> None:
    v = basic("zstd")
    v.mutate_encoded = lambda b: raw_frame(_decoded(v), block_type=3)
    write_version(root, v)


def _decoded(v: V) -> bytes:
    return table_bytes(table_columns(table_records(v.tensors)), v.table_meta)


@inv("invalid-table-zstd-no-content-size", "the zstd table frame does not declare its content "
     "size (R-TABLE-3)", "PCK-CODEC")
def _(root: Path) -> None:
    v = basic("zstd")
    v.mutate_encoded = lambda b: zstandard.ZstdCompressor(
        level=3, write_content_size=False).compress(_decoded(v))
    write_version(root, v)


@inv("invalid-table-zstd-size", "the zstd table frame declares one byte more than it holds",
     "PCK-CODEC")
def _(root: Path) -> None:
    v = basic("zstd")
    v.mutate_encoded = lambda b: raw_frame(_decoded(v), fcs=len(_decoded(v)) + 1)
    write_version(root, v)


@inv("invalid-table-zstd-trailing", "four bytes after the zstd table frame", "PCK-CODEC")
def _(root: Path) -> None:
    v = basic("zstd")
    v.mutate_encoded = lambda b: b + b"\x00\x00\x00\x00"
    write_version(root, v)


@inv("invalid-table-checksum", "one byte of the table file flipped after the checksums were "
     "computed", "PCK-CHECKSUM")
def _(root: Path) -> None:
    def ar(files: dict[str, bytes], m: dict[str, Any]) -> None:
        b = bytearray(files[TABLE_NONE])
        b[-3] ^= 0x01
        files[TABLE_NONE] = bytes(b)
    write_version(root, basic(), after_records=ar)


@inv("invalid-table-truncated", "the table file is shorter than its recorded size",
     "PCK-FILE-SIZE")
def _(root: Path) -> None:
    def ar(files: dict[str, bytes], m: dict[str, Any]) -> None:
        files[TABLE_NONE] = files[TABLE_NONE][:-4]
    write_version(root, basic(), after_records=ar)


# R-TABLE-4: safetensors and columns
@inv("invalid-table-header", "the decoded table's safetensors header length exceeds the table",
     "PCK-SHARD-HEADER")
def _(root: Path) -> None:
    v = basic("zstd")
    v.mutate_decoded = lambda b: struct.pack("<Q", len(b)) + b[8:]
    write_version(root, v)


@inv("invalid-table-missing-column", "the table has no range.codec column", "PCK-SCHEMA")
def _(root: Path) -> None:
    write_version(root, _cols(lambda c: c.__delitem__("range.codec")))


@inv("invalid-table-extra-column", "the table has an eleventh column, range.name", "PCK-SCHEMA")
def _(root: Path) -> None:
    write_version(root, _cols(lambda c: c.update({"range.name": ["U8", b"model.w@0,0\x00", None]})))


@inv("invalid-table-column-dtype", "column tensor.ndim is I64 instead of U8", "PCK-SCHEMA")
def _(root: Path) -> None:
    write_version(root, _cols(lambda c: c["tensor.ndim"].__setitem__(0, "I64")))


@inv("invalid-table-column-2d", "column tensor.shape is 2-d ([1, 2] instead of [2])",
     "PCK-SCHEMA")
def _(root: Path) -> None:
    write_version(root, _cols(lambda c: c["tensor.shape"].__setitem__(2, [1, 2])))


# R-TABLE-5: lengths
@inv("invalid-table-column-length", "column tensor.dtype has two values for one key",
     "PCK-SCHEMA")
def _(root: Path) -> None:
    write_version(root, _cols(lambda c: c["tensor.dtype"][1].append(1)))


@inv("invalid-table-ranges-sum", "Σ tensor.ranges is 3, the table holds 2 range records",
     "PCK-SCHEMA")
def _(root: Path) -> None:
    write_version(root, _cols(lambda c: c["tensor.ranges"].__setitem__(1, [3])))


@inv("invalid-table-key-unterminated", "the last key of tensor.key is not followed by 0x00",
     "PCK-SCHEMA")
def _(root: Path) -> None:
    write_version(root, _cols(lambda c: c["tensor.key"].__setitem__(1, b"model.w")))


# R-TABLE-6: keys, paths, codes, limits
@inv("invalid-table-duplicate-key", "two tensors of the table have the key 'a'", "PCK-SCHEMA")
def _(root: Path) -> None:
    def fn(recs: list[Rec]) -> None:
        recs[1] = ("a", *recs[1][1:])
    write_version(root, _recs(fn, _two_vectors()))


@inv("invalid-table-key-control", "a key contains U+0001", "PCK-SCHEMA")
def _(root: Path) -> None:
    v = V(table="none")
    v.tensor("model\x01w", "float32", [2], [1.0, 2.0])
    write_version(root, v)


@inv("invalid-table-key-utf8", "a key is not UTF-8 (byte 0xff)", "PCK-SCHEMA")
def _(root: Path) -> None:
    write_version(root, _cols(lambda c: c["tensor.key"].__setitem__(1, b"model.\xffw\x00")))


@inv("invalid-table-key-empty", "an empty key (tensor.key is a single 0x00)", "PCK-SCHEMA")
def _(root: Path) -> None:
    write_version(root, _cols(lambda c: c["tensor.key"].__setitem__(1, b"\x00")))


@inv("invalid-table-path-unsafe", "file.path (and the files key) has a '..' component",
     "PCK-PATH-UNSAFE")
def _(root: Path) -> None:
    bad = "data/../data/w00000-0000.safetensors"

    def fn(recs: list[Rec]) -> None:
        for i, (k, d, s, ranges) in enumerate(recs):
            recs[i] = (k, d, s, [(o, n, bad, c) for o, n, _, c in ranges])

    def mm(m: dict[str, Any]) -> None:
        m["files"][bad] = m["files"].pop("data/w00000-0000.safetensors")
    write_version(root, _recs(fn), mutate_manifest=mm)


@inv("invalid-table-path-not-listed", "file.path names a file that files does not list",
     "PCK-SCHEMA")
def _(root: Path) -> None:
    def fn(recs: list[Rec]) -> None:
        for i, (k, d, s, ranges) in enumerate(recs):
            recs[i] = (k, d, s, [(o, n, "data/w00009-0000.safetensors", c)
                                 for o, n, _, c in ranges])
    write_version(root, _recs(fn))


@inv("invalid-table-duplicate-path", "file.path lists the same path twice", "PCK-SCHEMA")
def _(root: Path) -> None:
    p = b"data/w00000-0000.safetensors\x00"
    write_version(root, _cols(lambda c: c["file.path"].__setitem__(1, p + p)))


@inv("invalid-table-file-index", "a range.file value (1) is not below the number of paths (1)",
     "PCK-SCHEMA")
def _(root: Path) -> None:
    write_version(root, _cols(lambda c: c["range.file"].__setitem__(1, [0, 1])))


@inv("invalid-table-dtype-code", "dtype code 15 (one past float8_e5m2)",
     "PCK-DTYPE-UNSUPPORTED")
def _(root: Path) -> None:
    write_version(root, _cols(lambda c: c["tensor.dtype"].__setitem__(1, [15])))


@inv("invalid-table-codec-code", "codec code 2", "PCK-CODEC")
def _(root: Path) -> None:
    write_version(root, _cols(lambda c: c["range.codec"].__setitem__(1, [0, 2])))


@inv("invalid-table-ndim", "a tensor with ndim 65 (shape of 65 ones, one range)", "PCK-LIMIT")
def _(root: Path) -> None:
    v = basic()
    name = "deep@" + ",".join(["0"] * 65)  # numpy has no 65-d arrays: built by hand
    v.st["data/w00000-0000.safetensors"].append((name, "F32", [1] * 65, encode("float32", [1.5])))
    v.tensors["deep"] = {"dtype": "float32", "shape": [1] * 65, "ranges": [
        {"offsets": [0] * 65, "lengths": [1] * 65, "file": "data/w00000-0000.safetensors",
         "name": name, "codec": "none"}]}
    write_version(root, v)


@inv("invalid-table-shape-maxint", "a zero-size tensor with a dimension of 2^53, above MAXINT",
     "PCK-LIMIT")
def _(root: Path) -> None:
    def fn(recs: list[Rec]) -> None:
        recs.append(("huge", "uint8", [0, 2**53], []))
    write_version(root, _recs(fn))


@inv("invalid-table-shape-negative", "a tensor whose I64 shape value is -4", "PCK-LIMIT")
def _(root: Path) -> None:
    def fn(recs: list[Rec]) -> None:
        recs.append(("neg", "uint8", [-4], []))
    write_version(root, _recs(fn))


@inv("invalid-table-zero-size-limit", "a zero-size float32 tensor [0, 2^30, 2^30]: the non-zero "
     "dimensions × itemsize exceed MAXINT (R-TENSOR-1)", "PCK-LIMIT")
def _(root: Path) -> None:
    def fn(recs: list[Rec]) -> None:
        recs.append(("wide", "float32", [0, 2**30, 2**30], []))
    write_version(root, _recs(fn))


# per-tensor rules applied to table records
def _matrix(boxes: list[tuple[list[int], list[int], int]]) -> V:
    """model.w float32 [4, 3] stored in ``boxes`` (data taken from a taller matrix)."""
    v = V(table="none")
    v.tensor("tall", "float32", [6, 3], [float(i) for i in range(18)], boxes)
    rec = v.tensors.pop("tall")
    v.expected_tensors.pop("tall")
    # the same boxes and data under the key model.w, with shape [4, 3]
    v.st = {f: [(n.replace("tall@", "model.w@"), dt, shape, data) for n, dt, shape, data in items]
            for f, items in v.st.items()}
    for r in rec["ranges"]:
        r["name"] = r["name"].replace("tall@", "model.w@")
    v.tensors["model.w"] = {"dtype": "float32", "shape": [4, 3], "ranges": rec["ranges"]}
    return v


@inv("invalid-table-out-of-bounds", "a table record's box [2, 0]+[3, 3] reaches past the "
     "shape [4, 3]", "PCK-RANGE-BOUNDS")
def _(root: Path) -> None:
    write_version(root, _matrix([([0, 0], [2, 3], 0), ([2, 0], [3, 3], 0)]))


@inv("invalid-table-overlap", "row 1 is covered by two table records", "PCK-COVERAGE-OVERLAP")
def _(root: Path) -> None:
    write_version(root, _matrix([([0, 0], [2, 3], 0), ([1, 0], [3, 3], 0)]))


@inv("invalid-table-gap", "row 3 is covered by no table record", "PCK-COVERAGE-GAP")
def _(root: Path) -> None:
    write_version(root, _matrix([([0, 0], [2, 3], 0), ([2, 0], [1, 3], 0)]))


@inv("invalid-table-0d-two-records", "a 0-d tensor with two table records (both named 's@')",
     "PCK-COVERAGE-OVERLAP")
def _(root: Path) -> None:
    v = basic()
    v.tensor("s", "float64", [], [1.0])
    v.tensors["s"]["ranges"].append(dict(v.tensors["s"]["ranges"][0]))
    write_version(root, v)


@inv("invalid-table-name-missing", "the data file stores the range at [2, 0] as 'model.w@02,0', "
     "not under its implied name 'model.w@2,0' (R-TABLE-7)", "PCK-SHARD-MISMATCH")
def _(root: Path) -> None:
    v = basic()
    items = v.st["data/w00000-0000.safetensors"]
    items[1] = ("model.w@02,0", *items[1][1:])
    write_version(root, v)


@inv("invalid-table-shard-shape", "a table record's lengths [2, 3] disagree with the stored "
     "tensor's shape [3, 2]", "PCK-SHARD-MISMATCH")
def _(root: Path) -> None:
    v = basic()
    items = v.st["data/w00000-0000.safetensors"]
    items[0] = (items[0][0], items[0][1], [3, 2], items[0][3])
    write_version(root, v)


def main(argv: list[str] | None = None) -> int:
    """Write every case below ``--out`` (default: next to this script)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "1.1"))
    ap.add_argument("--force", action="store_true", help="overwrite existing vectors")
    args = ap.parse_args(argv)
    out = Path(args.out)
    existing = list(out.iterdir()) if out.is_dir() else []
    if existing and not args.force:
        print(f"refusing to overwrite {len(existing)} existing vector(s) in {out}; vectors of a "
              "released version are frozen (use --force only before release)", file=sys.stderr)
        return 1
    if args.force and out.is_dir():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    index = []
    for c in CASES:
        cdir = out / c["name"]
        root = cdir / "root"
        root.mkdir(parents=True)
        v = c["fn"](root)
        versions = sorted(p.name for p in root.iterdir() if p.is_dir())
        target = "root" if c["target"] == "root" else f"root/{versions[0]}"
        rec: dict[str, Any] = {"name": c["name"], "feature": c["feature"],
                               "valid": c["code"] is None, "target": target}
        if c["code"]:
            rec["code"] = c["code"]
            rec["deep"] = False
        else:
            (cdir / "expected.json").write_text(json.dumps(v.expected(), indent=1) + "\n")
            rec["expected"] = f"{c['name']}/expected.json"
        index.append(rec)
    doc = {"format_version": "1.1",
           "description": "Golden vectors of portable-ckpt format 1.1 (tensor tables, spec §8.5). "
                          "'target' is relative to the case directory. The vectors of 1.0 stay "
                          "valid for 1.1 readers.",
           "cases": index}
    (out / "cases.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(index)} cases to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
