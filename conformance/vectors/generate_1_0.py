#!/usr/bin/env python3
"""Generate the golden vectors of format 1.0 (run once; the output is frozen and committed).

Uses only the standard library, numpy, crc32c and zstandard (safetensors files are written by
hand so that headers can be made defective on purpose). Refuses to touch an existing vector
directory unless ``--force`` is given: vectors of a released version are never changed.

Usage: python conformance/vectors/generate_1_0.py [--out DIR] [--force]
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

import crc32c
import numpy as np
import zstandard

BLOCK = 4096
DT = {  # format dtype -> (safetensors dtype, itemsize, numpy storage dtype)
    "float64": ("F64", 8, "<f8"), "float32": ("F32", 4, "<f4"), "float16": ("F16", 2, "<f2"),
    "bfloat16": ("BF16", 2, "<u2"), "int64": ("I64", 8, "<i8"), "int32": ("I32", 4, "<i4"),
    "int16": ("I16", 2, "<i2"), "int8": ("I8", 1, "i1"), "uint8": ("U8", 1, "u1"),
    "uint16": ("U16", 2, "<u2"), "uint32": ("U32", 4, "<u4"), "uint64": ("U64", 8, "<u8"),
    "bool": ("BOOL", 1, "u1"), "float8_e4m3fn": ("F8_E4M3", 1, "u1"),
    "float8_e5m2": ("F8_E5M2", 1, "u1"),
}


def aid(step: int, n: int = 0) -> str:
    """Deterministic attempt id for ``step``."""
    return f"s{step:012d}-20260101T0000{n:02d}000000Z-{0x0123456789abcdef + n:016x}"


def _minifloat(v: float, ebits: int, mbits: int) -> int:
    """Encode an exactly representable normal/zero value as a minifloat bit pattern."""
    sign = 1 if (v < 0 or (v == 0 and math.copysign(1, v) < 0)) else 0
    a = abs(v)
    if a == 0:
        return sign << (ebits + mbits)
    bias = (1 << (ebits - 1)) - 1
    m, e = math.frexp(a)  # a = m * 2**e, 0.5 <= m < 1
    exp = e - 1 + bias
    if exp <= 0:  # subnormal
        mant = a / 2 ** (1 - bias) * (1 << mbits)
        exp = 0
    else:
        mant = (m * 2 - 1) * (1 << mbits)
    if mant != int(mant):
        raise ValueError(f"{v} not exactly representable")
    return (sign << (ebits + mbits)) | (exp << mbits) | int(mant)


def encode(dtype: str, values: list[Any]) -> bytes:
    """Little-endian bytes of exact ``values`` (flat list) in ``dtype``."""
    if dtype == "bfloat16":
        f = np.array(values, dtype="<f4")
        bits = f.view("<u4")
        if np.any(bits & 0xFFFF):
            raise ValueError("bfloat16 values must be exact")
        return (bits >> 16).astype("<u2").tobytes()
    if dtype == "float8_e4m3fn":
        return bytes(_minifloat(v, 4, 3) for v in values)
    if dtype == "float8_e5m2":
        return bytes(_minifloat(v, 5, 2) for v in values)
    if dtype == "bool":
        return bytes(1 if v else 0 for v in values)
    arr = np.array(values, dtype=DT[dtype][2])
    if arr.tolist() != list(values):
        raise ValueError(f"values not exact in {dtype}")
    return arr.tobytes()


def nested(flat: list[Any], shape: list[int]) -> Any:
    """Reshape a flat list into nested lists (C order)."""
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return list(flat)
    step = math.prod(shape[1:])
    return [nested(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def st_file(tensors: list[tuple[str, str, list[int], bytes]]) -> bytes:
    """A standard safetensors file: (name, st_dtype, shape, data) in order; header padded to 8."""
    hdr: dict[str, Any] = {"__metadata__": {"format": "pt", "portable_ckpt": "1.0"}}
    pos = 0
    for name, dt, shape, data in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(t[3] for t in tensors)


def file_record(data: bytes, block: int = BLOCK) -> dict[str, Any]:
    """The ``files`` record of ``data``."""
    blocks = "".join(f"{crc32c.crc32c(data[i:i + block]):08x}" for i in range(0, len(data), block))
    return {"size": len(data), "checksum": {"algorithm": "crc32c", "block_size": block,
                                            "blocks": blocks}}


class V:
    """Builder of one version: tensors, entries, files; then written to disk."""

    def __init__(self, step: int = 10, n: int = 0, world_size: int = 1) -> None:
        self.step = step
        self.id = aid(step, n)
        self.world_size = world_size
        self.files: dict[str, bytes] = {}
        self.st: dict[str, list[tuple[str, str, list[int], bytes]]] = {}
        self.tensors: dict[str, Any] = {}
        self.entries: dict[str, Any] = {}
        self.expected_tensors: dict[str, Any] = {}
        self.expected_entries: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}

    def tensor(self, key: str, dtype: str, shape: list[int], flat: list[Any],
               boxes: list[tuple[list[int], list[int], int]] | None = None,
               codec: str = "none") -> None:
        """Add a tensor with C-order ``flat`` values, split into ``boxes`` (offs, lens, writer)."""
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
                frame = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(data)
                self.st.setdefault(fname, []).append((name, "U8", [len(frame)], frame))
            else:
                self.st.setdefault(fname, []).append((name, st_dt, list(lens), data))
            ranges.append({"offsets": offs, "lengths": lens, "file": fname, "name": name,
                           "codec": codec})
        self.tensors[key] = {"dtype": dtype, "shape": shape, "ranges": ranges}
        self.expected_tensors[key] = {"dtype": dtype, "shape": shape,
                                      "values": nested(flat, shape) if flat else [],
                                      "hex": full.tobytes().hex()}

    def entry(self, name: str, value: Any, *, schema: Any = None, scope: str = "global",
              policy: str | None = None, zstd: bool = False) -> None:
        """Add an entry; for per_rank, ``value`` is a list indexed by rank."""
        schema = schema or {"id": "pck:json/1"}
        ext = ".json.zst" if zstd else ".json"
        rec: dict[str, Any] = {"schema": schema, "scope": scope,
                               "encoding": "json+zstd" if zstd else "json", "values": []}
        if policy:
            rec["world_size_policy"] = policy
        vals = list(enumerate(value)) if scope == "per_rank" else [(None, value)]
        for rank, v in vals:
            fname = f"entries/{name}.g{ext}" if rank is None else f"entries/{name}.r{rank:05d}{ext}"
            raw = json.dumps(v).encode()
            self.files[fname] = zstandard.ZstdCompressor().compress(raw) if zstd else raw
            rec["values"].append({"file": fname} if rank is None else {"rank": rank,
                                                                        "file": fname})
        self.entries[name] = rec
        self.expected_entries[name] = value if scope == "global" else \
            {"per_rank": {str(r): v for r, v in vals}}

    def build(self) -> tuple[dict[str, bytes], dict[str, Any]]:
        """Return (files by relative path, manifest dict)."""
        files = dict(self.files)
        for fname, ts in self.st.items():
            files[fname] = st_file(ts)
        m = {
            "format": "portable-ckpt", "format_version": "1.0", "attempt_id": self.id,
            "step": self.step, "created_at": "2026-01-01T00:00:00.000000Z",
            "committed_at": "2026-01-01T00:00:01.000000Z",
            "producer": {"name": "pck-vector-generator", "version": "1.0"},
            "continuation": {"contract": "exact", "world_size": self.world_size, "mesh": None},
            "files": {}, "tensors": self.tensors, "entries": self.entries,
            "must_understand": [], "extensions": {},
        }
        m.update(self.extra)
        return files, m

    def expected(self) -> dict[str, Any]:
        """expected.json content."""
        return {"attempt_id": self.id, "step": self.step, "tensors": self.expected_tensors,
                "entries": self.expected_entries}


def write_version(root: Path, v: V, *, mutate_files: Callable[[dict[str, bytes]], None] | None
                  = None, mutate_manifest: Callable[[dict[str, Any]], None] | None = None,
                  after_records: Callable[[dict[str, bytes], dict[str, Any]], None] | None = None,
                  manifest_text: Callable[[str], str] | None = None, dirname: str | None = None,
                  no_manifest: bool = False) -> Path:
    """Write ``v`` below ``root``; the hooks inject one defect each."""
    files, m = v.build()
    if mutate_files:
        mutate_files(files)
    m["files"] = {k: file_record(files[k]) for k in sorted(files)}
    if mutate_manifest:
        mutate_manifest(m)
    if after_records:
        after_records(files, m)
    vdir = root / (dirname or v.id)
    for rel, data in files.items():
        p = vdir / rel
        if ".." in rel.split("/") or rel.startswith("/"):
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    vdir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(m, indent=1) + "\n"
    if manifest_text:
        text = manifest_text(text)
    if not no_manifest:
        (vdir / "manifest.json").write_text(text, encoding="utf-8")
    return vdir


CASES: list[dict[str, Any]] = []


def case(name: str, feature: str, *, code: str | None = None, target: str = "version",
         deep: bool = False, setup: list[dict[str, str]] | None = None) -> Callable[
             [Callable[[Path], V | None]], Callable[[Path], V | None]]:
    """Register a case generator (valid when ``code`` is None)."""
    def deco(fn: Callable[[Path], V | None]) -> Callable[[Path], V | None]:
        CASES.append({"name": name, "feature": feature, "code": code, "target": target,
                      "deep": deep, "setup": setup or [], "fn": fn})
        return fn
    return deco


def basic(step: int = 10, n: int = 0) -> V:
    """A 4x3 float32 tensor in two row blocks plus one global entry."""
    v = V(step, n)
    v.tensor("model.w", "float32", [4, 3], [float(i) + 0.5 for i in range(12)],
             [([0, 0], [2, 3], 0), ([2, 0], [2, 3], 0)])
    v.entry("meta", {"epoch": 3, "name": "basic"})
    return v


# ------------------------------------------------------------------------------------ valid
@case("valid-basic", "two row blocks of a float32 matrix, one global entry")
def _(root: Path) -> V:
    v = basic()
    write_version(root, v)
    return v


DTYPE_VALUES: dict[str, list[Any]] = {
    "float64": [0.0, -1.5, 1e300, 2.5e-310], "float32": [0.0, -1.5, 3.25, 1e30],
    "float16": [0.0, -1.5, 65504.0, 0.000061035156], "bfloat16": [0.0, -1.5, 3.0, 1.0e30],
    "int64": [0, -1, 2**62, -(2**63)], "int32": [0, -1, 2**31 - 1, -(2**31)],
    "int16": [0, -1, 32767, -32768], "int8": [0, -1, 127, -128],
    "uint8": [0, 1, 128, 255], "uint16": [0, 1, 32768, 65535],
    "uint32": [0, 1, 2**31, 2**32 - 1], "uint64": [0, 1, 2**63, 2**64 - 1],
    "bool": [True, False, False, True], "float8_e4m3fn": [0.0, -1.5, 448.0, 0.015625],
    "float8_e5m2": [0.0, -1.5, 57344.0, 0.0078125],
}


def _fix_exact(dtype: str, vals: list[Any]) -> list[Any]:
    if dtype == "bfloat16":
        u = np.array(vals, "<f4").view("<u4") & 0xFFFF0000
        return [float(x) for x in u.astype("<u4").view("<f4")]
    if dtype == "float16":
        return [float(x) for x in np.array(vals, "<f2")]
    if dtype == "float32":
        return [float(x) for x in np.array(vals, "<f4")]
    return vals


for _dt in DT:
    def _mk(root: Path, dt: str = _dt) -> V:
        v = V()
        v.tensor(f"t.{dt}", dt, [2, 2], _fix_exact(dt, DTYPE_VALUES[dt]),
                 [([0, 0], [1, 2], 0), ([1, 0], [1, 2], 0)])
        write_version(root, v)
        return v
    case(f"valid-dtype-{_dt}", f"dtype {_dt} (safetensors {DT[_dt][0]})")(_mk)


@case("valid-uneven-2d", "5x7 tensor cut into 4 uneven boxes by 2 writers in 2 files")
def _(root: Path) -> V:
    v = V(world_size=2)
    v.tensor("w", "int32", [5, 7], list(range(35)),
             [([0, 0], [2, 3], 0), ([0, 3], [2, 4], 1), ([2, 0], [3, 5], 1), ([2, 5], [3, 2], 0)])
    write_version(root, v)
    return v


@case("valid-3d", "3-D tensor in boxes cut along every dimension")
def _(root: Path) -> V:
    v = V()
    v.tensor("x3", "int16", [2, 3, 4], list(range(24)),
             [([0, 0, 0], [1, 3, 4], 0), ([1, 0, 0], [1, 1, 4], 0), ([1, 1, 0], [1, 2, 1], 0),
              ([1, 1, 1], [1, 2, 3], 0)])
    write_version(root, v)
    return v


@case("valid-4d", "4-D tensor, two boxes")
def _(root: Path) -> V:
    v = V()
    v.tensor("x4", "uint8", [2, 2, 2, 3], list(range(24)),
             [([0, 0, 0, 0], [2, 2, 1, 3], 0), ([0, 0, 1, 0], [2, 2, 1, 3], 0)])
    write_version(root, v)
    return v


@case("valid-0d", "0-d (scalar) tensor: one range with empty offsets and lengths")
def _(root: Path) -> V:
    v = V()
    v.tensor("scalar", "float64", [], [42.25])
    write_version(root, v)
    return v


@case("valid-zero-size", "zero-size tensor (a dimension is 0): no ranges")
def _(root: Path) -> V:
    v = V()
    v.tensor("empty", "float32", [0, 4], [])
    v.tensor("one", "int8", [1], [7])
    write_version(root, v)
    return v


@case("valid-zstd", "codec zstd: U8 tensor holding one zstd frame per range")
def _(root: Path) -> V:
    v = V()
    v.tensor("z", "float32", [3, 4], [float(i) for i in range(12)],
             [([0, 0], [3, 2], 0), ([0, 2], [3, 2], 0)], codec="zstd")
    write_version(root, v)
    return v


@case("valid-multiblock", "file of several 4096-byte checksum blocks; a box spanning blocks")
def _(root: Path) -> V:
    v = V()
    v.tensor("big", "int32", [40, 40], list(range(1600)),
             [([0, 0], [13, 40], 0), ([13, 0], [27, 40], 0)])
    write_version(root, v)
    return v


@case("valid-entries", "global entries: builtin schema, inline json_schema, json+zstd encoding")
def _(root: Path) -> V:
    v = V(step=7)
    v.tensor("w", "float32", [2], [1.0, 2.0])
    v.entry("anything", [1, "two", {"three": None}, True])
    v.entry("config", {"lr": 0.5, "layers": [4, 4]},
            schema={"json_schema": {"type": "object", "required": ["lr"],
                                    "properties": {"lr": {"type": "number"}}}})
    v.entry("packed", {"numbers": list(range(20))}, zstd=True)
    write_version(root, v)
    return v


SPEC_EXAMPLES = Path(__file__).resolve().parents[2] / "spec" / "examples" / "entries"


@case("valid-builtin-entries", "one value of every built-in schema (values from spec/examples)")
def _(root: Path) -> V:
    v = V(step=10)
    v.tensor("w", "float32", [1], [1.0])
    v.entry("progress", {"step": 10, "tokens_seen": 18446744073709551615},
            schema={"id": "pck:step/1"})
    for name, sid in (("lr-scheduler--sequential", "pck:lr-scheduler/1"),
                      ("grad-scaler", "pck:grad-scaler/1"), ("rng--python-only", "pck:rng/1"),
                      ("data-position--seed-64bit", "pck:data-position/1"),
                      ("json--scalar", "pck:json/1")):
        value = json.loads((SPEC_EXAMPLES / f"{name}.json").read_text())
        v.entry(name.split("--")[0], value, schema={"id": sid})
    v.entry("big_ints", [2**64 - 1, -(2**63), 2**53 + 1])
    write_version(root, v)
    return v


@case("valid-per-rank", "per_rank entry with one value per rank of world size 3")
def _(root: Path) -> V:
    v = V(world_size=3)
    v.tensor("w", "float32", [3], [1.0, 2.0, 3.0],
             [([0], [1], 0), ([1], [1], 1), ([2], [1], 2)])
    v.entry("rank_state", [{"r": 0}, {"r": 1}, {"r": 2}], scope="per_rank", policy="modulo")
    write_version(root, v)
    return v


@case("valid-minor-version", "format_version 1.7 with unknown top-level field: accepted")
def _(root: Path) -> V:
    v = basic()
    v.extra = {"format_version": "1.7", "future_field": {"x": 1},
               "extensions": {"org.example.note": {"k": "v"}}}
    write_version(root, v)
    return v


@case("valid-latest-of-two", "root with versions at steps 10 and 20: the latest is step 20",
      target="root")
def _(root: Path) -> V:
    write_version(root, basic(10, 0))
    v = V(20, 1)
    v.tensor("model.w", "float32", [4, 3], [float(-i) for i in range(12)])
    v.entry("meta", {"epoch": 4, "name": "newer"})
    write_version(root, v)
    return v


@case("valid-latest-same-step", "two versions of step 10: the later committed_at wins, compared "
      "as timestamps (01.5Z is later than 01Z)", target="root")
def _(root: Path) -> V:
    a = basic(10, 0)
    a.extra = {"committed_at": "2026-01-01T00:00:01Z"}
    write_version(root, a)
    b = V(10, 1)
    b.tensor("model.w", "float32", [4, 3], [float(100 + i) for i in range(12)])
    b.entry("meta", {"epoch": 5, "name": "later"})
    b.extra = {"committed_at": "2026-01-01T00:00:01.5Z"}
    write_version(root, b)
    return b


@case("valid-incomplete-newer", "an uncommitted attempt at a higher step is invisible",
      target="root")
def _(root: Path) -> V:
    v = basic(10, 0)
    write_version(root, v)
    w = basic(30, 2)
    write_version(root, w, no_manifest=True)
    return v


@case("valid-drill-record", "drills/ records are not part of files and do not change the version")
def _(root: Path) -> V:
    v = basic()
    vdir = write_version(root, v)
    (vdir / "drills").mkdir()
    (vdir / "drills" / "d20260101T000002000000Z-0123abcd.json").write_text(json.dumps({
        "format": "portable-ckpt-drill", "format_version": "1.0", "attempt_id": v.id,
        "drill_id": "d20260101T000002000000Z-0123abcd", "ok": True,
        "started_at": "2026-01-01T00:00:02Z", "finished_at": "2026-01-01T00:00:03Z",
        "world_size": 1, "saved_world_size": 1, "contract": "exact",
        "measurements": {"restore_seconds": 0.5}, "error": None}, indent=1))
    return v


# ---------------------------------------------------------------------------------- invalid
def inv(name: str, feature: str, code: str, **kw: Any) -> Callable[
        [Callable[[Path], None]], Callable[[Path], None]]:
    """Register an invalid case."""
    return case(name, feature, code=code, **kw)  # type: ignore[return-value]


def _tensor(m: dict[str, Any]) -> dict[str, Any]:
    t: dict[str, Any] = m["tensors"]["model.w"]
    return t


@inv("invalid-gap", "row 3 of a 4x3 tensor is covered by no range", "PCK-COVERAGE-GAP")
def _(root: Path) -> None:
    def mm(m: dict[str, Any]) -> None:
        _tensor(m)["ranges"][1]["lengths"] = [1, 3]
    v = basic()
    v.st["data/w00000-0000.safetensors"][1] = (
        "model.w@2,0", "F32", [1, 3], encode("float32", [6.5, 7.5, 8.5]))
    write_version(root, v, mutate_manifest=mm)


@inv("invalid-overlap", "row 1 is covered by two ranges", "PCK-COVERAGE-OVERLAP")
def _(root: Path) -> None:
    v = V()
    v.tensor("model.w", "float32", [4, 3], [float(i) for i in range(12)],
             [([0, 0], [2, 3], 0), ([1, 0], [3, 3], 0)])
    write_version(root, v)


@inv("invalid-out-of-bounds", "a box reaches past the tensor's shape", "PCK-RANGE-BOUNDS")
def _(root: Path) -> None:
    v = V()
    v.tensor("model.w", "float32", [4, 3], [float(i) for i in range(12)])
    v.tensor("other", "float32", [5, 3], [float(i) for i in range(15)])

    def mm(m: dict[str, Any]) -> None:
        m["tensors"]["model.w"]["ranges"] = m["tensors"]["other"]["ranges"]
        del m["tensors"]["other"]
    write_version(root, v, mutate_manifest=mm)


@inv("invalid-box-rank", "a box of rank 1 for a 2-D tensor", "PCK-RANGE-BOUNDS")
def _(root: Path) -> None:
    def mm(m: dict[str, Any]) -> None:
        r = _tensor(m)["ranges"][0]
        r["offsets"], r["lengths"] = [0], [2]
    write_version(root, basic(), mutate_manifest=mm)


@inv("invalid-bad-checksum", "one data byte flipped after the checksums were computed",
     "PCK-CHECKSUM", deep=True)
def _(root: Path) -> None:
    def ar(files: dict[str, bytes], m: dict[str, Any]) -> None:
        b = bytearray(files["data/w00000-0000.safetensors"])
        b[-1] ^= 0x01
        files["data/w00000-0000.safetensors"] = bytes(b)
    write_version(root, basic(), after_records=ar)


@inv("invalid-truncated-file", "a data file is shorter than its recorded size", "PCK-FILE-SIZE")
def _(root: Path) -> None:
    def ar(files: dict[str, bytes], m: dict[str, Any]) -> None:
        files["data/w00000-0000.safetensors"] = files["data/w00000-0000.safetensors"][:-4]
    write_version(root, basic(), after_records=ar)


@inv("invalid-missing-file", "a file listed in files does not exist", "PCK-FILE-MISSING")
def _(root: Path) -> None:
    def ar(files: dict[str, bytes], m: dict[str, Any]) -> None:
        del files["entries/meta.g.json"]
    write_version(root, basic(), after_records=ar)


@inv("invalid-missing-manifest", "an attempt directory without manifest.json is not a version",
     "PCK-MANIFEST-MISSING")
def _(root: Path) -> None:
    write_version(root, basic(), no_manifest=True)


@inv("invalid-no-version", "a root whose only attempt is uncommitted has no version",
     "PCK-NOT-FOUND", target="root")
def _(root: Path) -> None:
    write_version(root, basic(), no_manifest=True)


@inv("invalid-major-version", "format_version 2.0", "PCK-VERSION-UNSUPPORTED")
def _(root: Path) -> None:
    write_version(root, basic(), mutate_manifest=lambda m: m.update(format_version="2.0"))


@inv("invalid-must-understand", "must_understand names an unknown extension",
     "PCK-FEATURE-UNSUPPORTED")
def _(root: Path) -> None:
    write_version(root, basic(), mutate_manifest=lambda m: m.update(
        must_understand=["org.example.encryption"],
        extensions={"org.example.encryption": {"key": "k1"}}))


def _move_file(old: str, new: str) -> Callable[[dict[str, Any]], None]:
    def mm(m: dict[str, Any]) -> None:
        m["files"][new] = m["files"].pop(old)
        for t in m["tensors"].values():
            for r in t["ranges"]:
                if r["file"] == old:
                    r["file"] = new
    return mm


@inv("invalid-path-dotdot", "a range file path with a '..' component", "PCK-PATH-UNSAFE")
def _(root: Path) -> None:
    write_version(root, basic(), mutate_manifest=_move_file(
        "data/w00000-0000.safetensors", "data/../data/w00000-0000.safetensors"))


@inv("invalid-path-absolute", "an absolute file path", "PCK-PATH-UNSAFE")
def _(root: Path) -> None:
    write_version(root, basic(), mutate_manifest=_move_file(
        "data/w00000-0000.safetensors", "/etc/w00000-0000.safetensors"))


@inv("invalid-path-backslash", "a path with a backslash", "PCK-PATH-UNSAFE")
def _(root: Path) -> None:
    write_version(root, basic(), mutate_manifest=_move_file(
        "data/w00000-0000.safetensors", "data\\w00000-0000.safetensors"))


@inv("invalid-symlink-out", "a data file is a symlink to a file outside the attempt "
     "(created at test time, see setup)", "PCK-PATH-UNSAFE",
     setup=[{"op": "symlink", "path": "VERSION/data/w00000-0000.safetensors",
             "target": "../../outside.safetensors"}])
def _(root: Path) -> None:
    v = basic()
    vdir = write_version(root, v)
    p = vdir / "data" / "w00000-0000.safetensors"
    (root / "outside.safetensors").write_bytes(p.read_bytes())
    p.unlink()


@inv("invalid-schema-missing-field", "manifest without the required 'producer'", "PCK-SCHEMA")
def _(root: Path) -> None:
    write_version(root, basic(), mutate_manifest=lambda m: m.pop("producer"))


@inv("invalid-schema-type", "step is a string", "PCK-SCHEMA")
def _(root: Path) -> None:
    write_version(root, basic(), mutate_manifest=lambda m: m.update(step="10"))


@inv("invalid-schema-checksum-blocks", "blocks string has the wrong number of digits",
     "PCK-SCHEMA")
def _(root: Path) -> None:
    def mm(m: dict[str, Any]) -> None:
        m["files"]["data/w00000-0000.safetensors"]["checksum"]["blocks"] += "00000000"
    write_version(root, basic(), mutate_manifest=mm)


@inv("invalid-duplicate-keys", "manifest.json has a duplicate key", "PCK-JSON-INVALID")
def _(root: Path) -> None:
    write_version(root, basic(), manifest_text=lambda t: t.replace(
        '"step": 10,', '"step": 10,\n "step": 11,', 1))


@inv("invalid-nan", "manifest.json contains NaN", "PCK-JSON-INVALID")
def _(root: Path) -> None:
    def mm(m: dict[str, Any]) -> None:
        m["extensions"] = {"org.example.x": {"value": "NANMARK"}}
    write_version(root, basic(), mutate_manifest=mm,
                  manifest_text=lambda t: t.replace('"NANMARK"', "NaN"))


@inv("invalid-entry-nan", "an entry value contains Infinity", "PCK-JSON-INVALID")
def _(root: Path) -> None:
    def mf(files: dict[str, bytes]) -> None:
        files["entries/meta.g.json"] = b'{"epoch": Infinity}'
    write_version(root, basic(), mutate_files=mf)


@inv("invalid-entry-duplicate-keys", "an entry value has a duplicate key", "PCK-JSON-INVALID")
def _(root: Path) -> None:
    def mf(files: dict[str, bytes]) -> None:
        files["entries/meta.g.json"] = b'{"epoch": 1, "epoch": 2}'
    write_version(root, basic(), mutate_files=mf)


def _hdr_mutation(fn: Callable[[bytes], bytes]) -> Callable[[dict[str, bytes]], None]:
    def mf(files: dict[str, bytes]) -> None:
        files["data/w00000-0000.safetensors"] = fn(files["data/w00000-0000.safetensors"])
    return mf


@inv("invalid-header-length", "safetensors header length larger than the file",
     "PCK-SHARD-HEADER")
def _(root: Path) -> None:
    write_version(root, basic(), mutate_files=_hdr_mutation(
        lambda b: struct.pack("<Q", 10**12) + b[8:]))


def _rewrite_header(b: bytes, fn: Callable[[dict[str, Any]], None]) -> bytes:
    n = struct.unpack("<Q", b[:8])[0]
    hdr = json.loads(b[8:8 + n])
    fn(hdr)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b[8 + n:]


@inv("invalid-header-offsets", "safetensors data_offsets beyond the end of the file",
     "PCK-SHARD-HEADER")
def _(root: Path) -> None:
    def fn(h: dict[str, Any]) -> None:
        h["model.w@2,0"]["data_offsets"] = [24, 4000]
    write_version(root, basic(), mutate_files=_hdr_mutation(lambda b: _rewrite_header(b, fn)))


@inv("invalid-dtype-mismatch", "range says float32, safetensors header says I32",
     "PCK-SHARD-MISMATCH")
def _(root: Path) -> None:
    def fn(h: dict[str, Any]) -> None:
        h["model.w@0,0"]["dtype"] = "I32"
    write_version(root, basic(), mutate_files=_hdr_mutation(lambda b: _rewrite_header(b, fn)))


@inv("invalid-shape-mismatch", "range lengths [2,3], safetensors shape [3,2]",
     "PCK-SHARD-MISMATCH")
def _(root: Path) -> None:
    def fn(h: dict[str, Any]) -> None:
        h["model.w@0,0"]["shape"] = [3, 2]
    write_version(root, basic(), mutate_files=_hdr_mutation(lambda b: _rewrite_header(b, fn)))


@inv("invalid-missing-tensor-name", "range names a tensor absent from the safetensors file",
     "PCK-SHARD-MISMATCH")
def _(root: Path) -> None:
    def mm(m: dict[str, Any]) -> None:
        _tensor(m)["ranges"][0]["name"] = "model.w@9,9"
    write_version(root, basic(), mutate_manifest=mm)


@inv("invalid-unknown-dtype", "dtype complex64 is not in the table", "PCK-DTYPE-UNSUPPORTED")
def _(root: Path) -> None:
    def mm(m: dict[str, Any]) -> None:
        _tensor(m)["dtype"] = "complex64"
    write_version(root, basic(), mutate_manifest=mm)


@inv("invalid-zstd-size", "zstd frame decompresses to fewer bytes than the box needs",
     "PCK-CODEC", deep=True)
def _(root: Path) -> None:
    v = V()
    v.tensor("model.w", "float32", [2, 2], [1.0, 2.0, 3.0, 4.0], codec="zstd")
    short = zstandard.ZstdCompressor(write_content_size=True).compress(encode("float32", [1.0]
                                                                              * 3))
    v.st["data/w00000-0000.safetensors"][0] = ("model.w@0,0", "U8", [len(short)], short)
    write_version(root, v)


@inv("invalid-zstd-corrupt", "zstd range holds bytes that are not a zstd frame", "PCK-CODEC",
     deep=True)
def _(root: Path) -> None:
    v = V()
    v.tensor("model.w", "float32", [2, 2], [1.0, 2.0, 3.0, 4.0], codec="zstd")
    junk = b"not a zstd frame"
    v.st["data/w00000-0000.safetensors"][0] = ("model.w@0,0", "U8", [len(junk)], junk)
    write_version(root, v)


@inv("invalid-unknown-codec", "codec lz4 is not defined", "PCK-CODEC")
def _(root: Path) -> None:
    def mm(m: dict[str, Any]) -> None:
        _tensor(m)["ranges"][0]["codec"] = "lz4"
    write_version(root, basic(), mutate_manifest=mm)


@inv("invalid-per-rank-missing", "per_rank entry lacks the value of rank 1 (world size 2)",
     "PCK-ENTRY-MISSING")
def _(root: Path) -> None:
    v = V(world_size=2)
    v.tensor("w", "float32", [2], [1.0, 2.0], [([0], [1], 0), ([1], [1], 1)])
    v.entry("rank_state", [{"r": 0}, {"r": 1}], scope="per_rank", policy="require_same")

    def mf(files: dict[str, bytes]) -> None:
        del files["entries/rank_state.r00001.json"]

    def mm(m: dict[str, Any]) -> None:
        m["entries"]["rank_state"]["values"].pop()
    write_version(root, v, mutate_files=mf, mutate_manifest=mm)


@inv("invalid-entry-schema", "a value violates its inline json_schema", "PCK-ENTRY-SCHEMA")
def _(root: Path) -> None:
    v = basic()
    v.entry("config", {"lr": "fast"}, schema={"json_schema": {
        "type": "object", "properties": {"lr": {"type": "number"}}}})
    write_version(root, v)


@inv("invalid-unknown-schema-id", "an entry declares the unknown builtin schema pck:nope/1",
     "PCK-ENTRY-SCHEMA")
def _(root: Path) -> None:
    v = basic()
    v.entry("thing", {"a": 1}, schema={"id": "pck:nope/1"})
    write_version(root, v)


@inv("invalid-attempt-id-dir", "attempt_id differs from the directory name", "PCK-ATTEMPT-ID")
def _(root: Path) -> None:
    write_version(root, basic(), dirname=aid(10, 9))


@inv("invalid-attempt-id-step", "attempt_id encodes step 10, manifest step is 11",
     "PCK-ATTEMPT-ID")
def _(root: Path) -> None:
    write_version(root, basic(), mutate_manifest=lambda m: m.update(step=11))


@inv("invalid-limit-dim", "a (zero-size) tensor with a dimension of 2^53, above MAXINT",
     "PCK-LIMIT")
def _(root: Path) -> None:
    def mm(m: dict[str, Any]) -> None:
        m["tensors"]["huge"] = {"dtype": "uint8", "shape": [0, 2**53], "ranges": []}
    write_version(root, basic(), mutate_manifest=mm)


@inv("invalid-mesh-world-size", "continuation.mesh [2, 2] for world_size 1", "PCK-SCHEMA")
def _(root: Path) -> None:
    def mm(m: dict[str, Any]) -> None:
        m["continuation"]["mesh"] = {"shape": [2, 2], "dim_names": ["dp", "tp"]}
    write_version(root, basic(), mutate_manifest=mm)


@inv("invalid-json-surrogate", "manifest.json contains an escaped unpaired surrogate",
     "PCK-JSON-INVALID")
def _(root: Path) -> None:
    def mm(m: dict[str, Any]) -> None:
        m["producer"]["name"] = "SURROGATE"
    write_version(root, basic(), mutate_manifest=mm,
                  manifest_text=lambda t: t.replace("SURROGATE", "x\\ud800y"))


@inv("invalid-json-bom", "manifest.json starts with a UTF-8 byte-order mark", "PCK-JSON-INVALID")
def _(root: Path) -> None:
    write_version(root, basic(), manifest_text=lambda t: "\ufeff" + t)


@inv("invalid-entry-number-overflow", "an entry value holds 1e400 (overflows a double)",
     "PCK-JSON-INVALID")
def _(root: Path) -> None:
    def mf(files: dict[str, bytes]) -> None:
        files["entries/meta.g.json"] = b'{"epoch": 1e400}'
    write_version(root, basic(), mutate_files=mf)


@inv("invalid-entry-too-deep", "an entry value nested 65 levels deep", "PCK-JSON-INVALID")
def _(root: Path) -> None:
    def mf(files: dict[str, bytes]) -> None:
        files["entries/meta.g.json"] = b"[" * 65 + b"]" * 65
    write_version(root, basic(), mutate_files=mf)


@inv("invalid-entry-not-utf8", "an entry value file is not UTF-8", "PCK-JSON-INVALID")
def _(root: Path) -> None:
    def mf(files: dict[str, bytes]) -> None:
        files["entries/meta.g.json"] = b'{"name": "caf\xe9"}'
    write_version(root, basic(), mutate_files=mf)


@inv("invalid-step-mismatch", "a pck:step/1 value says step 9, the manifest step 10",
     "PCK-STEP-MISMATCH")
def _(root: Path) -> None:
    v = basic()
    v.entry("progress", {"step": 9}, schema={"id": "pck:step/1"})
    write_version(root, v)


@inv("invalid-builtin-schema-value", "a pck:step/1 value without 'step'", "PCK-ENTRY-SCHEMA")
def _(root: Path) -> None:
    v = basic()
    v.entry("progress", {"tokens_seen": 5}, schema={"id": "pck:step/1"})
    write_version(root, v)


@inv("invalid-per-rank-duplicate", "a per_rank entry stores rank 0 twice", "PCK-SCHEMA")
def _(root: Path) -> None:
    v = V(world_size=1)
    v.tensor("w", "float32", [2], [1.0, 2.0])
    v.entry("rank_state", [{"r": 0}], scope="per_rank", policy="modulo")

    def mm(m: dict[str, Any]) -> None:
        m["entries"]["rank_state"]["values"].append({"rank": 0,
                                                     "file": "entries/rank_state.r00000.json"})
    write_version(root, v, mutate_manifest=mm)


@inv("invalid-file-not-listed", "a range refers to a file that files does not list (R-FILES-2)",
     "PCK-SCHEMA")
def _(root: Path) -> None:
    def mm(m: dict[str, Any]) -> None:
        _tensor(m)["ranges"][0]["file"] = "data/w00007-0000.safetensors"
    write_version(root, basic(), mutate_manifest=mm)


def main(argv: list[str] | None = None) -> int:
    """Write every case below ``--out`` (default: next to this script)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "1.0"))
    ap.add_argument("--force", action="store_true", help="overwrite existing vectors")
    args = ap.parse_args(argv)
    out = Path(args.out)
    existing = [p for p in out.iterdir()] if out.is_dir() else []
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
        if c["target"] == "root":
            target = "root"
        else:
            target = f"root/{versions[0]}"
        setup = [dict(s, path=s["path"].replace("VERSION", target)) for s in c["setup"]]
        rec: dict[str, Any] = {"name": c["name"], "feature": c["feature"],
                               "valid": c["code"] is None, "target": target}
        if c["code"]:
            rec["code"] = c["code"]
            rec["deep"] = c["deep"]
        else:
            (cdir / "expected.json").write_text(json.dumps(v.expected(), indent=1) + "\n")
            rec["expected"] = f"{c['name']}/expected.json"
        if setup:
            rec["setup"] = setup
        index.append(rec)
    doc = {"format_version": "1.0",
           "description": "Golden vectors of portable-ckpt format 1.0. 'target' is relative to "
                          "the case directory; apply 'setup' operations before use.",
           "cases": index}
    (out / "cases.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(index)} cases to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
