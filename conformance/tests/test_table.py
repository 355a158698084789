"""Tensor tables (format 1.1, spec §8.5) in the checker: R-TABLE-1 … R-TABLE-9, properties.

The golden vectors (test_vectors.py) pin one broken rule each; here hypothesis checks that random
tables survive an encode/decode round trip, that the checker's coverage verdict on a table equals
a brute-force count of every element, and the checker's handling of limits, writer-index tables
and large tables.
"""

from __future__ import annotations

import json
import math
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.checker import check_version
from conformance.coverage import check_coverage
from conformance.spec import DTYPE_CODES, DTYPES, TABLE_COLUMNS
from conformance.store import Problem, crc32c, zstd_decode
from conformance.table import decode_table, encode_table, implied_name

AID = "s000000000005-20260201T000000000000Z-00000000000000aa"
DATA = "data/w00000-0000.safetensors"
_CONTROL = "".join(chr(i) for i in range(32)) + "\x7f"


# ------------------------------------------------------------------------------------ helpers
def _record(data: bytes, bs: int = 4096) -> dict[str, Any]:
    blocks = "".join(f"{crc32c(data[i:i + bs]):08x}" for i in range(0, len(data), bs))
    return {"size": len(data), "checksum": {"algorithm": "crc32c", "block_size": bs,
                                            "blocks": blocks}}


def _st(items: list[tuple[str, str, list[int], bytes]]) -> bytes:
    hdr: dict[str, Any] = {}
    pos = 0
    for name, dt, shape, data in items:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(i[3] for i in items)


def _zstd(data: bytes, **kw: Any) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(write_content_size=True, **kw).compress(data)


def write_table_version(base: Path, tensors: dict[str, dict[str, Any]], *,
                        table_codec: str = "none", table_bytes: bytes | None = None,
                        extra: dict[str, Any] | None = None,
                        extra_files: dict[str, bytes] | None = None) -> Path:
    """A committed version whose tensors (JSON-shaped, ranges in DATA) are in a table.

    Every range is stored under its implied name with zero bytes of the right size.
    """
    vdir = base / AID
    items = []
    names: set[str] = set()
    for key, t in tensors.items():
        st_dt, isz = DTYPES[t["dtype"]]
        for r in t["ranges"]:
            r.setdefault("file", DATA)
            r.setdefault("codec", "none")
            name = implied_name(key, r["offsets"])
            if name in names:
                continue  # two records of one box (an overlap case): one stored tensor
            names.add(name)
            items.append((name, st_dt, list(r["lengths"]),
                          bytes(math.prod(r["lengths"]) * isz)))
    files: dict[str, bytes] = {DATA: _st(items)} if items else {}
    raw = encode_table(tensors) if table_bytes is None else table_bytes
    rel = "tensor-table.safetensors" + (".zst" if table_codec == "zstd" else "")
    files[rel] = _zstd(raw) if table_codec == "zstd" else raw
    files.update(extra_files or {})
    m = {"format": "portable-ckpt", "format_version": "1.1", "attempt_id": AID, "step": 5,
         "created_at": "2026-02-01T00:00:00Z", "committed_at": "2026-02-01T00:00:01Z",
         "producer": {"name": "test", "version": "0"},
         "continuation": {"contract": "exact", "world_size": 1, "mesh": None},
         "files": {k: _record(v) for k, v in sorted(files.items())}, "tensors": {},
         "entries": {}, "must_understand": ["tensor-table"], "extensions": {},
         "tensor_table": {"file": rel, "codec": table_codec}}
    m.update(extra or {})
    for k, v in files.items():
        (vdir / k).parent.mkdir(parents=True, exist_ok=True)
        (vdir / k).write_bytes(v)
    (vdir / "manifest.json").write_text(json.dumps(m))
    return vdir


def _fresh(tmp: Path) -> Path:
    n = sum(1 for _ in tmp.iterdir())
    d = tmp / f"e{n:05d}"
    d.mkdir()
    return d


def brute_force(shape: list[int], boxes: list[tuple[list[int], list[int]]]) -> str | None:
    """The §9 verdict by counting every element."""
    for o, n in boxes:
        if len(o) != len(shape) or any(o[d] < 0 or n[d] < 1 or o[d] + n[d] > shape[d]
                                       for d in range(len(shape))):
            return "PCK-RANGE-BOUNDS"
    count = np.zeros(shape, dtype=np.int64)
    for o, n in boxes:
        count[tuple(slice(a, a + b) for a, b in zip(o, n, strict=True))] += 1
    if count.size == 0:
        return "PCK-RANGE-BOUNDS" if boxes else None
    if count.max() > 1:
        return "PCK-COVERAGE-OVERLAP"
    if count.min() == 0:
        return "PCK-COVERAGE-GAP"
    return None


# --------------------------------------------------------------------------------- strategies
@st.composite
def boxes_in(draw: Any, shape: list[int], max_boxes: int = 6
             ) -> list[tuple[list[int], list[int]]]:
    """In-bounds non-empty boxes of ``shape``: an exact partition, perhaps with one box dropped
    or one random box added, or random boxes (overlaps and gaps allowed)."""
    if draw(st.booleans()):
        from conformance.cases import _partition

        part = _partition(draw, shape)
        how = draw(st.sampled_from(["exact", "drop", "add"]))
        if how == "drop" and len(part) > 1:
            part.pop(draw(st.integers(0, len(part) - 1)))
        elif how == "add" and part:
            part += draw(boxes_in(shape, 1).filter(lambda b: len(b) == 1))
        return part
    out = []
    for _ in range(draw(st.integers(0 if 0 in shape else 1, max_boxes))):
        if 0 in shape:
            break
        o = [draw(st.integers(0, d - 1)) for d in shape]
        n = [draw(st.integers(1, d - a)) for a, d in zip(o, shape, strict=True)]
        out.append((o, n))
    return out


@st.composite
def tables(draw: Any) -> dict[str, dict[str, Any]]:
    keys = draw(st.lists(st.text(st.characters(exclude_categories=["Cs"],
                                               exclude_characters=_CONTROL),
                                 min_size=1, max_size=8), max_size=5, unique=True))
    paths = ["data/a.safetensors", "data/b.safetensors", "x"]
    out = {}
    for key in keys:
        shape = draw(st.lists(st.integers(0, 2**53 - 1) if draw(st.booleans())
                              else st.integers(0, 5), max_size=4))
        ranges = [{"offsets": draw(st.lists(st.integers(0, 2**53 - 1), min_size=len(shape),
                                            max_size=len(shape))),
                   "lengths": draw(st.lists(st.integers(0, 2**53 - 1), min_size=len(shape),
                                            max_size=len(shape))),
                   "file": draw(st.sampled_from(paths)),
                   "codec": draw(st.sampled_from(["none", "zstd"]))}
                  for _ in range(draw(st.integers(0, 3)))]
        out[key] = {"dtype": draw(st.sampled_from(DTYPE_CODES)), "shape": shape,
                    "ranges": ranges}
    return out


# ------------------------------------------------------------------------------ properties
@settings(max_examples=150, deadline=None)
@given(tables())
def test_encode_decode_round_trip(tensors: dict[str, dict[str, Any]]) -> None:
    """R-TABLE-5/-7: any table decodes to exactly the tensors it encodes, implied names added."""
    table = decode_table(encode_table(tensors), {"data/a.safetensors", "data/b.safetensors",
                                                 "x"}, "t")
    assert table.keys == list(tensors)
    for key, got in table.items():
        want = tensors[key]
        assert got["dtype"] == want["dtype"] and got["shape"] == want["shape"]
        assert got["ranges"] == [dict(r, name=implied_name(key, r["offsets"]))
                                 for r in want["ranges"]]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=0, max_size=4).flatmap(
    lambda s: st.tuples(st.just(s), boxes_in(s, 8))))
def test_coverage_equals_brute_force(case: tuple[list[int], Any]) -> None:
    """The checker's box arithmetic (1-d, 2-d and n-d sweeps) against counting elements."""
    shape, boxes = case
    want = brute_force(shape, boxes)
    try:
        check_coverage(shape, [(tuple(o), tuple(n)) for o, n in boxes])
        got = None
    except Problem as exc:
        got = exc.code
    assert got == want


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=st.lists(st.integers(0, 4), min_size=0, max_size=3).flatmap(
    lambda s: st.tuples(st.just(s), boxes_in(s, 5), st.sampled_from(["none", "zstd"]))))
def test_checker_verdict_on_tables_equals_brute_force(case: tuple[list[int], Any, str],
                                                      tmp_path: Path) -> None:
    """R-TABLE-8 + §9: check_version of a table-backed version reports the brute-force verdict."""
    shape, boxes, codec = case
    seen: set[tuple[int, ...]] = set()
    uniq = []
    for o, n in boxes:  # one implied name per offsets: keep the first box at each offset
        if tuple(o) not in seen:
            seen.add(tuple(o))
            uniq.append((o, n))
    tensors = {"t": {"dtype": "int16", "shape": shape,
                     "ranges": [{"offsets": o, "lengths": n} for o, n in uniq]}}
    rep = check_version(write_table_version(_fresh(tmp_path), tensors, table_codec=codec))
    want = brute_force(shape, uniq)
    assert rep.codes == (set() if want is None else {want}), [e.to_json() for e in rep.errors]


# ----------------------------------------------------------------------------- unit checks
def test_columns_and_codes_are_transcribed_from_the_spec() -> None:
    assert len(TABLE_COLUMNS) == 10
    assert DTYPE_CODES[0] == "float64" and DTYPE_CODES[14] == "float8_e5m2"
    assert list(DTYPE_CODES) == list(DTYPES)  # §7's row order


def test_declared_size_above_2_32_is_limit(tmp_path: Path) -> None:
    """R-TABLE-3: the declared decoded size is checked before anything is allocated."""
    raw = encode_table({})
    frame = bytearray(b"\x28\xb5\x2f\xfd\xc0\x38") + struct.pack("<Q", 2**32 + 1)
    frame += ((len(raw) << 3) | 1).to_bytes(3, "little") + raw
    vdir = write_table_version(tmp_path, {}, table_codec="zstd")
    rel = "tensor-table.safetensors.zst"
    (vdir / rel).write_bytes(bytes(frame))
    m = json.loads((vdir / "manifest.json").read_text())
    m["files"][rel] = _record(bytes(frame))
    (vdir / "manifest.json").write_text(json.dumps(m))
    rep = check_version(vdir)
    assert rep.codes == {"PCK-LIMIT"}, [e.to_json() for e in rep.errors]


def test_zstd_decode_rules() -> None:
    """R-SEC-5 / R-TENSOR-7 as applied to tables: one frame, no trailing bytes, bounded."""
    data = bytes(range(256)) * 64
    frame = _zstd(data)
    assert zstd_decode(frame, where="x", limit=len(data), need_content_size=True) == data
    bad_frames: list[tuple[bytes, dict[str, Any]]] = [
        (frame + b"\x00", {}), (frame[:-3], {}),  # trailing bytes, truncated
        (frame[:4] + bytes([frame[4] | 0x01]) + frame[5:], {}),  # a dictionary id
        (frame, {"exact": len(data) - 1}),  # declared size differs from the box
        (b"\x50\x2a\x4d\x18" + frame, {}),  # a skippable frame's magic
    ]
    for bad, kw in bad_frames:
        with pytest.raises(Problem) as ei:
            zstd_decode(bad, where="x", limit=len(data), **kw)
        assert ei.value.code == "PCK-CODEC"
    with pytest.raises(Problem) as ei:
        zstd_decode(frame, where="x", limit=len(data) - 1, limit_code="PCK-LIMIT")
    assert ei.value.code == "PCK-LIMIT"
    import zstandard

    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    assert zstd_decode(no_size, where="x", limit=len(data)) == data
    with pytest.raises(Problem) as ei:
        zstd_decode(no_size, where="x", limit=len(data) - 1)  # stops once past the bound
    assert ei.value.code == "PCK-CODEC"
    with pytest.raises(Problem):
        zstd_decode(no_size, where="x", limit=2**32, need_content_size=True)


def test_unknown_extension_next_to_tensor_table(tmp_path: Path) -> None:
    """R-VERSION-5: tensor-table is understood, any other extension is not."""
    t = {"w": {"dtype": "float32", "shape": [2], "ranges": [{"offsets": [0], "lengths": [2]}]}}
    ok = check_version(write_table_version(tmp_path / "a", t))
    assert ok.ok, [e.to_json() for e in ok.errors]
    bad = check_version(write_table_version(
        tmp_path / "b", t, extra={"must_understand": ["tensor-table", "org.example.x"]}))
    assert bad.codes == {"PCK-FEATURE-UNSUPPORTED"}


def test_version_use_warnings(tmp_path: Path) -> None:
    """R-VERSION-2 is a writer rule: 1.1 without a 1.1 feature is accepted with a warning."""
    t = {"w": {"dtype": "float32", "shape": [2], "ranges": [{"offsets": [0], "lengths": [2]}]}}
    vdir = write_table_version(tmp_path, t)
    m = json.loads((vdir / "manifest.json").read_text())
    table = m.pop("tensor_table")
    m["files"].pop(table["file"])
    (vdir / table["file"]).unlink()
    m["tensors"] = {"w": {"dtype": "float32", "shape": [2], "ranges": [
        {"offsets": [0], "lengths": [2], "file": DATA, "name": "w@0", "codec": "none"}]}}
    (vdir / "manifest.json").write_text(json.dumps(m))
    rep = check_version(vdir)
    assert rep.ok, [e.to_json() for e in rep.errors]
    msgs = " ".join(w.message for w in rep.warnings)
    assert "R-VERSION-2" in msgs and "tensor_table" in msgs


def _index(vdir: Path, *, table_rel: str, list_table: bool, table: bytes) -> None:
    """Add a 1.1 writer index with a table to a version and relist the manifest's files."""
    m = json.loads((vdir / "manifest.json").read_text())
    (vdir / table_rel).parent.mkdir(parents=True, exist_ok=True)
    (vdir / table_rel).write_bytes(table)
    own = {DATA: m["files"][DATA]}
    if list_table:
        own[table_rel] = _record(table)
    idx = {"format": "portable-ckpt-writer-index", "format_version": "1.1", "attempt_id": AID,
           "writer": 0, "files": own, "tensors": {}, "entries": {},
           "tensor_table": {"file": table_rel, "codec": "none"}}
    raw = json.dumps(idx).encode()
    (vdir / "index" / "w00000.json").write_bytes(raw)
    m["files"]["index/w00000.json"] = _record(raw)
    m["files"][table_rel] = _record(table)
    m["files"] = dict(sorted(m["files"].items()))
    (vdir / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize(("list_table", "damage", "code"), [
    (True, None, None),
    (False, None, "PCK-SCHEMA"),  # R-TABLE-1: the index's files must list its table
    (True, "column", "PCK-SCHEMA"),  # R-TABLE-4 in an index table
    (True, "bounds", "PCK-RANGE-BOUNDS"),  # R-TENSOR-2 for an index table's records
])
def test_writer_index_tables(list_table: bool, damage: str | None, code: str | None,
                             tmp_path: Path) -> None:
    t = {"w": {"dtype": "float32", "shape": [4], "ranges": [{"offsets": [0], "lengths": [4]}]}}
    vdir = write_table_version(tmp_path, t)
    it = json.loads(json.dumps(t))
    if damage == "bounds":
        it["w"]["shape"] = [3]
    table = encode_table(it)
    if damage == "column":
        table = table.replace(b'"range.codec"', b'"range.codex"')
    _index(vdir, table_rel="index/w00000.tensors.safetensors", list_table=list_table,
           table=table)
    rep = check_version(vdir, deep=True)
    assert rep.codes == (set() if code is None else {code}), [e.to_json() for e in rep.errors]


def test_many_records_and_shared_layouts_are_fast(tmp_path: Path) -> None:
    """1,000 tensors × 16 records (16,000) with one layout, plus one 4,096-box grid: seconds."""
    grid = [{"offsets": [i * 4, j * 4], "lengths": [4, 4]} for i in range(4) for j in range(4)]
    tensors = {f"layers.{k}.w": {"dtype": "uint8", "shape": [16, 16],
                                 "ranges": [dict(r) for r in grid]} for k in range(1000)}
    tensors["big"] = {"dtype": "uint8", "shape": [64, 64], "ranges": [
        {"offsets": [i, j], "lengths": [1, 1]} for i in range(64) for j in range(64)]}
    vdir = write_table_version(tmp_path, tensors, table_codec="zstd")
    t0 = time.monotonic()
    rep = check_version(vdir)
    took = time.monotonic() - t0
    assert rep.ok, [e.to_json() for e in rep.errors[:3]]
    assert took < 30, took


def test_coverage_grids_are_not_quadratic() -> None:
    """2-d sweep: 65,536 boxes of a 256×256 grid, and 100,000 1-d boxes, each in seconds."""
    boxes = [((i * 4, j * 4), (4, 4)) for i in range(256) for j in range(256)]
    t0 = time.monotonic()
    check_coverage([1024, 1024], boxes)
    check_coverage([100_000, 3], [((i, 0), (1, 3)) for i in range(100_000)])
    assert time.monotonic() - t0 < 10
    with pytest.raises(Problem) as ei:
        check_coverage([1024, 1024], [*boxes[:-1], ((1020, 1020), (4, 3))])
    assert ei.value.code == "PCK-COVERAGE-GAP"
    with pytest.raises(Problem) as ei:
        check_coverage([1024, 1024], [*boxes, ((511, 3), (2, 2))])
    assert ei.value.code == "PCK-COVERAGE-OVERLAP"


def test_damaged_tables_give_spec_codes_only(tmp_path: Path) -> None:
    """R-ERR-4 for tables: random damage to the decoded table or the reference gives PCK codes,
    never an exception."""
    import random

    rnd = random.Random(1)
    tensors: dict[str, dict[str, Any]] = {
        "s": {"dtype": "float64", "shape": [], "ranges": [{"offsets": [], "lengths": []}]},
        "e": {"dtype": "bool", "shape": [0, 3], "ranges": []},
        "w": {"dtype": "int32", "shape": [4, 3], "ranges": [
            {"offsets": [0, 0], "lengths": [2, 3]}, {"offsets": [2, 0], "lengths": [2, 3]}]},
    }
    for t in tensors.values():
        for r in t["ranges"]:
            r.update(file=DATA, codec="none")
    good = encode_table(tensors)
    junk: list[Any] = [None, 0, "x", "", [], {}, {"file": "../x", "codec": "none"},
                       {"file": "tensor-table.safetensors", "codec": "none"}]
    for i in range(150):
        raw = bytearray(good)
        for _ in range(rnd.randint(1, 4)):
            raw[rnd.randrange(len(raw))] = rnd.randrange(256)
        if i % 10 == 0:
            raw = raw[:rnd.randrange(len(raw))]
        extra = {"tensor_table": rnd.choice(junk)} if i % 15 == 0 else None
        vdir = write_table_version(tmp_path / str(i), json.loads(json.dumps(tensors)),
                                   table_codec=rnd.choice(["none", "zstd"]),
                                   table_bytes=bytes(raw), extra=extra)
        rep = check_version(vdir, deep=True)
        for e in rep.errors:
            assert e.code.startswith("PCK-"), e
