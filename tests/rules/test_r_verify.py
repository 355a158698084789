"""Verification (§10.1), bool bytes (R-DTYPE-4) and packed shard data areas (R-SHARD-9).

Each of these was accepted by at least one reference tool before (issue 16): ``verify --deep``
passed trailing bytes after a zstd frame and a ``pck:step/1`` value with the wrong step, every
tool accepted a bool byte 0x02 and a hole in a shard's data area, and ``verify --sample`` could
report one bad block twice and had no seed.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from conformance.checker import check
from portable_ckpt.format.manifest import Continuation
from portable_ckpt.io.commit import commit
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage

from ._util import expect_code, read_manifest, rewrite_file, shard_header


def _version(
    root: Path,
    tensors: dict[str, tuple[np.ndarray, list[tuple[int, ...]]]],
    *,
    codec: str = "none",
    step: int = 3,
    entries: dict[str, tuple[Any, str]] | None = None,
) -> Path:
    """Two writers; tensor ``key`` is cut into rows at ``cuts`` and dealt out alternately."""
    storage = open_storage(root, create=True)
    attempt = new_attempt_id(step)
    ws = [ShardWriter(storage, attempt, w, codec=codec, block_size=4096) for w in range(2)]
    n = 0
    for key, (arr, boxes) in tensors.items():
        for offs in boxes:
            lo = offs[0]
            hi = next((b[0] for b in boxes if b[0] > lo), arr.shape[0])
            ws[n % 2].add_tensor(key, arr[lo:hi], offsets=(lo,) + (0,) * (arr.ndim - 1),
                                 global_shape=arr.shape)
            n += 1
    for name, (value, schema) in (entries or {}).items():
        ws[0].add_entry(name, value, schema)
    idx = [w.finish() for w in ws]
    commit(storage, attempt, step=step, indexes=idx, expected_writers=[0, 1],
           continuation=Continuation("exact", 2, None))
    return root / attempt


def _codes(errors: list[portable_ckpt.CheckpointError]) -> list[str]:
    return [e.code for e in errors]


def _range_file(vdir: Path, key: str, i: int = 0) -> tuple[str, str]:
    r = read_manifest(vdir)["tensors"][key]["ranges"][i]
    return r["file"], r["name"]


def _edit_tensor_bytes(vdir: Path, rel: str, name: str, new: bytes, st_dtype: str,
                       shape: list[int]) -> None:
    """Replace one tensor's bytes in a shard (the others are kept, packed, in order)."""
    _, header, data = shard_header(vdir / rel)
    header.pop("__metadata__", None)
    items = []
    for n, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = t["data_offsets"]
        if n == name:
            items.append((n, st_dtype, shape, new))
        else:
            items.append((n, t["dtype"], t["shape"], data[b:e]))
    from ._util import rebuild_shard

    rebuild_shard(vdir, rel, items)


# -- tool fix 1: trailing bytes after a range's zstd frame (R-TENSOR-7, R-VERIFY-3) -----------
def test_deep_verify_reports_trailing_bytes_after_a_zstd_frame(tmp_path: Path) -> None:
    vdir = _version(tmp_path, {"w": (np.arange(32, dtype=np.float32).reshape(4, 8), [(0,), (2,)])},
                    codec="zstd")
    rel, name = _range_file(vdir, "w")
    _, header, data = shard_header(vdir / rel)
    b, e = header[name]["data_offsets"]
    frame = data[b:e] + b"\x00\x00\x00"
    _edit_tensor_bytes(vdir, rel, name, frame, "U8", [len(frame)])
    ck = portable_ckpt.open(vdir)
    assert ck.verify() == []  # the frame header still declares the right size
    assert _codes(ck.verify(deep=True)) == ["PCK-CODEC"]
    assert _codes(portable_ckpt.open(vdir).verify(sample=1.0, seed=0)) == ["PCK-CODEC"]
    expect_code("PCK-CODEC", portable_ckpt.open(vdir).read, "w")
    assert check(vdir, deep=True).codes == {"PCK-CODEC"}


# -- tool fix 2: a pck:step/1 value that disagrees with the manifest (R-ENTRY-13) ---------------
def test_verify_reports_a_step_entry_that_disagrees_with_the_manifest(tmp_path: Path) -> None:
    vdir = _version(tmp_path, {"w": (np.zeros((2, 2), np.float32), [(0,)])}, step=3,
                    entries={"progress": ({"step": 4}, "pck:step/1")})
    for kwargs in ({}, {"deep": True}, {"sample": 1.0, "seed": 1}):
        errs = portable_ckpt.open(vdir).verify(**kwargs)
        assert _codes(errs) == ["PCK-STEP-MISMATCH"], kwargs
        assert "progress" in errs[0].message and "R-ENTRY-13" in errs[0].message
    expect_code("PCK-STEP-MISMATCH", portable_ckpt.open(vdir).entry, "progress")
    assert check(vdir, deep=True).codes == {"PCK-STEP-MISMATCH"}


# -- tool fix 5: bool bytes other than 0x00/0x01 (R-DTYPE-2, R-DTYPE-4) --------------------------
@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_a_bool_byte_other_than_0_or_1_is_rejected_by_every_tool(tmp_path: Path,
                                                                codec: str) -> None:
    """R-DTYPE-2, R-DTYPE-4: a bool byte other than 0x00/0x01 is refused by every tool."""
    mask = np.array([[True, False, True], [False, False, True]])
    vdir = _version(tmp_path, {"m": (mask, [(0,), (1,)])}, codec=codec)
    rel, name = _range_file(vdir, "m", 1)
    raw = bytes([0, 2, 1])
    if codec == "zstd":
        import zstandard

        frame = zstandard.ZstdCompressor(write_content_size=True).compress(raw)
        _edit_tensor_bytes(vdir, rel, name, frame, "U8", [len(frame)])
    else:
        _edit_tensor_bytes(vdir, rel, name, raw, "BOOL", [1, 3])
    ck = portable_ckpt.open(vdir)
    with pytest.raises(portable_ckpt.CheckpointError) as ei:
        ck.read("m")
    assert ei.value.code == "PCK-DTYPE-VALUE"
    assert "element [1, 1]" in ei.value.message and name in ei.value.message
    # A read that does not touch the bad byte is served.
    assert ck.read("m", [0, 0], [1, 3]).tolist() == [[True, False, True]]
    assert ck.read("m", [1, 0], [1, 1]).tolist() == [[False]]
    assert portable_ckpt.open(vdir).verify() == []  # metadata verification reads no data
    assert _codes(portable_ckpt.open(vdir).verify(deep=True)) == ["PCK-DTYPE-VALUE"]
    assert _codes(portable_ckpt.open(vdir).verify(sample=1.0, seed=5)) == ["PCK-DTYPE-VALUE"]
    assert check(vdir).ok
    assert check(vdir, deep=True).codes == {"PCK-DTYPE-VALUE"}


def test_bool_values_read_into_a_strided_destination_are_checked(tmp_path: Path) -> None:
    vdir = _version(tmp_path, {"m": (np.ones((4, 4), bool), [(0,), (2,)])})
    ck = portable_ckpt.open(vdir)
    big = np.zeros((4, 8), bool)
    ck.read("m", out=big[:, ::2])
    assert big[:, ::2].all() and not big[:, 1::2].any()
    rel, name = _range_file(vdir, "m", 1)
    _edit_tensor_bytes(vdir, rel, name, bytes([1] * 7 + [255]), "BOOL", [2, 4])
    ck = portable_ckpt.open(vdir)
    expect_code("PCK-DTYPE-VALUE", ck.read, "m", out=big[:, ::2])


# -- shard data areas: no hole, overlap or trailing byte (R-SHARD-1, R-SHARD-9) -----------------
def _shard_with(vdir: Path, rel: str, spans: dict[str, tuple[int, int]], data: bytes) -> None:
    """Rewrite ``rel``'s header with new data_offsets per tensor and a new data area."""
    import struct

    _, header, _ = shard_header(vdir / rel)
    for name, (b, e) in spans.items():
        header[name]["data_offsets"] = [b, e]
    body = json.dumps(header).encode()
    body += b" " * (-(len(body) + 8) % 8)
    rewrite_file(vdir, rel, struct.pack("<Q", len(body)) + body + data)


@pytest.mark.parametrize("damage", ["hole", "overlap", "trailing"])
def test_a_data_area_the_tensors_do_not_tile_is_rejected(tmp_path: Path, damage: str) -> None:
    """R-SHARD-1, R-SHARD-9: the tensors of a shard tile its data area exactly."""
    a = np.arange(4, dtype=np.int32)
    vdir = _version(tmp_path, {"a": (a, [(0,)]), "pad": (a, [(0,)]), "b": (a + 10, [(0,)])})
    rel, _ = _range_file(vdir, "a")
    names = {t: _range_file(vdir, t)[1] for t in ("a", "b")}
    assert _range_file(vdir, "b")[0] == rel  # writer 0 holds a and b
    _, header, data = shard_header(vdir / rel)
    first, second = sorted(names.values(), key=lambda n: header[n]["data_offsets"][0])
    one = data[:16]
    two = data[16:32]
    if damage == "hole":
        _shard_with(vdir, rel, {first: (0, 16), second: (24, 40)}, one + b"\0" * 8 + two)
    elif damage == "overlap":
        _shard_with(vdir, rel, {first: (0, 16), second: (8, 24)}, one + two[8:])
    else:
        _shard_with(vdir, rel, {first: (0, 16), second: (16, 32)}, one + two + b"\0" * 4)
    expect_code("PCK-SHARD-HEADER", portable_ckpt.open(vdir).read, "a")
    assert _codes(portable_ckpt.open(vdir).verify()) == ["PCK-SHARD-HEADER"]  # once, not per range
    assert _codes(portable_ckpt.open(vdir).verify(deep=True)) == ["PCK-SHARD-HEADER"]
    assert check(vdir, deep=True).codes == {"PCK-SHARD-HEADER"}


def test_tensors_listed_out_of_order_and_zero_size_tensors_are_a_valid_shard(
        tmp_path: Path) -> None:
    """R-SHARD-1 rule 4 sorts the spans: header order is free, empty spans sit anywhere."""
    a = np.arange(4, dtype=np.int32)
    vdir = _version(tmp_path, {"a": (a, [(0,)]), "pad": (a, [(0,)]), "b": (a + 10, [(0,)])})
    rel, _ = _range_file(vdir, "a")
    assert _range_file(vdir, "b")[0] == rel  # writer 0 holds a and b
    import struct

    _, header, data = shard_header(vdir / rel)
    meta = header.pop("__metadata__")
    items = sorted(header.items(), key=lambda kv: -kv[1]["data_offsets"][0])
    doc = {"__metadata__": meta, **dict(items),
           "extra.empty": {"dtype": "F32", "shape": [0, 3], "data_offsets": [16, 16]}}
    body = json.dumps(doc).encode()
    body += b" " * (-(len(body) + 8) % 8)
    rewrite_file(vdir, rel, struct.pack("<Q", len(body)) + body + data)
    ck = portable_ckpt.open(vdir)
    assert ck.read("a").tolist() == a.tolist() and ck.read("b").tolist() == (a + 10).tolist()
    assert ck.verify(deep=True) == []
    assert check(vdir, deep=True).ok
    from safetensors.numpy import load_file

    assert set(load_file(vdir / rel)) == {*header, "extra.empty"}


# -- sampled verification (R-VERIFY-4, R-VERIFY-5) --------------------------------------------------
def _many_ranges(tmp_path: Path) -> Path:
    arr = np.arange(64 * 1024, dtype=np.int32).reshape(64, 1024)  # 16 ranges of 16 KiB
    return _version(tmp_path, {"w": (arr, [(4 * i,) for i in range(16)])})


def _corrupt(vdir: Path, rel: str, offset: int) -> None:
    p = vdir / rel
    raw = bytearray(p.read_bytes())
    raw[offset] ^= 0xFF
    p.write_bytes(bytes(raw))


def test_a_sample_is_drawn_without_replacement_from_its_seed(tmp_path: Path) -> None:
    vdir = _many_ranges(tmp_path)
    ranges = read_manifest(vdir)["tensors"]["w"]["ranges"]
    for r in ranges:  # one flipped byte in the middle of every range's data
        n, header, _ = shard_header(vdir / r["file"])
        b, e = header[r["name"]]["data_offsets"]
        _corrupt(vdir, r["file"], 8 + n + (b + e) // 2)
    for seed in (0, 1, 2):
        errs = portable_ckpt.open(vdir).verify(sample=0.25, seed=seed)
        again = portable_ckpt.open(vdir).verify(sample=0.25, seed=seed)
        assert [e.message for e in errs] == [e.message for e in again]
        # The draw of R-VERIFY-4: random.Random(seed).sample over the records in manifest order.
        picked = random.Random(seed).sample(ranges, 4)
        files = {r["file"] for r in picked}
        assert len(errs) == len(files) and all(e.code == "PCK-CHECKSUM" for e in errs)
        assert {e.path.split("/", 1)[1] for e in errs if e.path} == files
    every = portable_ckpt.open(vdir).verify(sample=1.0, seed=9)
    assert len(every) == 2  # one per file: the first bad block; the file is not used again


@pytest.mark.parametrize(("fraction", "n", "k"), [
    (0.07, 100, 7), (0.2000000001, 5, 2), (0.30000001, 10, 4), (0.5000000001, 2, 2),
    (0.25, 16, 4), (1.0, 3, 3), (1e-9, 10, 1), (0.1, 0, 0),
])
def test_a_sample_draws_the_exact_ceiling_of_the_decimal_fraction(
    fraction: float, n: int, k: int
) -> None:
    """R-VERIFY-4 (traceability audit F6): ``ceil(F × n)`` on the decimal F the record holds,
    exactly: binary floating point gives 8 for 0.07 × 100, and the former rounding to 1e-6
    gave 1 for 0.2000000001 × 5."""
    from portable_ckpt.io.annotations import sampled_chunks

    assert sampled_chunks(n, fraction) == k


@pytest.mark.parametrize("defect", ["name-absent", "dtype-differs"])
def test_each_problem_is_reported_once_at_every_level(tmp_path: Path, defect: str) -> None:
    """R-VERIFY-5 (traceability audit F9): a range record that fails its check is reported once
    by a metadata, a sampled and a deep verification, though its data is met again."""
    from ._util import edit_manifest

    arr = np.arange(64, dtype=np.int32).reshape(8, 8)
    vdir = _version(tmp_path, {"w": (arr, [(0,), (4,)])})

    def break_it(doc: dict[str, Any]) -> None:
        rec = doc["tensors"]["w"]["ranges"][0]
        if defect == "name-absent":
            rec["name"] = "absent@0"
        else:
            doc["tensors"]["w"]["dtype"] = "float32"

    edit_manifest(vdir, break_it)
    bad = 1 if defect == "name-absent" else 2  # one record, or both (the tensor's dtype)
    for kwargs in ({}, {"sample": 1.0, "seed": 0}, {"deep": True}):
        errors = portable_ckpt.open(vdir).verify(**kwargs)
        assert _codes(errors) == ["PCK-SHARD-MISMATCH"] * bad, (kwargs, errors)
        assert len({e.message for e in errors}) == bad


def test_a_bad_block_shared_by_two_ranges_is_reported_once(tmp_path: Path) -> None:
    arr = np.arange(64, dtype=np.int32).reshape(8, 8)  # 4 ranges of 64 bytes in 2 files
    vdir = _version(tmp_path, {"w": (arr, [(0,), (2,), (4,), (6,)])})
    rel = _range_file(vdir, "w")[0]
    _corrupt(vdir, rel, (vdir / rel).stat().st_size - 1)
    for kwargs in ({"sample": 1.0, "seed": 0}, {"deep": True}):
        errs = portable_ckpt.open(vdir).verify(**kwargs)
        assert _codes(errs) == ["PCK-CHECKSUM"], (kwargs, [e.message for e in errs])


def test_cli_sample_seed_is_reported_and_reproducible(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from portable_ckpt.cli.main import main

    vdir = _many_ranges(tmp_path)
    assert main(["verify", str(vdir), "--sample", "0.5", "--seed", "7", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sample"] == {"fraction": 0.5, "seed": 7}
    assert main(["verify", str(vdir), "--sample", "0.5"]) == 0
    out = capsys.readouterr().out
    seed = int(out.rsplit("seed ", 1)[1].split(")")[0])
    _corrupt(vdir, _range_file(vdir, "w")[0], 9000)
    assert main(["verify", str(vdir), "--sample", "1", "--seed", str(seed)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("PCK-CHECKSUM ") and out[-1].startswith("FAIL (1 problem)")
    assert main(["verify", str(vdir), "--seed", "7"]) == 2
    got = capsys.readouterr()
    assert "--seed needs --sample" in got.err and not got.out


# -- verify agrees with the reader on every rule the reader enforces (R-VERIFY-1 … R-VERIFY-3) ----
from conformance.vectors import all_cases, materialize  # noqa: E402

VECTORS = all_cases()


def _read_all(ck: portable_ckpt.Checkpoint) -> None:
    for key in ck.tensors:
        ck.read(key)
    ws = ck.continuation.world_size
    for name, e in ck.entries.items():
        for r in [None] if e.scope == "global" else range(ws):
            ck.entry(name, rank=r, world_size=None if r is None else ws)


@pytest.mark.parametrize(("vdir", "case"), [(d, c) for _, d, c in VECTORS],
                         ids=[f"{v}/{c['name']}" for v, _, c in VECTORS])
def test_verify_reports_what_reading_everything_reports(vdir: Path, case: dict[str, Any],
                                                        tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Every golden vector: a reader's failure is verify's finding, at the level that sees it.

    R-VERIFY-1: a version that does not open is reported with the code of the failure.
    R-VERIFY-2: a defect visible without reading data blocks is found by a metadata verify.
    R-VERIFY-3: every defect a reader meets when it reads everything is found by a deep verify.
    """
    from portable_ckpt.cli.main import main

    target = materialize(case, tmp_path, vdir)
    try:
        ck = portable_ckpt.open(target)
    except portable_ckpt.CheckpointError as exc:
        assert not case["valid"] and exc.code == case["code"]
        assert main(["verify", str(target), "--deep", "--json"]) == 1
        assert [e["code"] for e in json.loads(capsys.readouterr().out)["errors"]] == [exc.code]
        return
    try:
        _read_all(ck)
        read_code = None
    except portable_ckpt.CheckpointError as exc:
        read_code = exc.code
    deep = _codes(portable_ckpt.open(target).verify(deep=True))
    if read_code is None:
        assert deep == [], (case["name"], deep)
        return
    assert read_code == case["code"] and read_code in deep, (case["name"], deep)
    if not case.get("deep"):
        assert read_code in _codes(portable_ckpt.open(target).verify()), case["name"]


#: Codes the read path can raise that are not properties of a stored version.
NOT_VERSION_RULES = {
    "PCK-USAGE": "a caller's request (a box outside the tensor, a rank outside the world)",
    "PCK-TENSOR-MISSING": "a request for a key the version does not have (R-READ-5)",
    "PCK-ENTRY-MISSING": "a request for a missing entry; missing ranks fail at open (R-ENTRY-9)",
    "PCK-CONTRACT": "a restore onto another world size under require_same (R-ENTRY-11)",
    "PCK-LIMIT": "a box too large to allocate in this process; R-TENSOR-1 is checked at open",
    "PCK-STORAGE": "the storage backend failed, not the version",
    "PCK-SCHEMA": "raised for drill and copy records and at open (R-COMMIT-15)",
}
READ_PATH = ["io/reader.py", "io/_read_plan.py", "io/_entries.py", "io/_verify.py",
             "io/safetensors_io.py", "io/codec.py", "io/checksum.py",
             "io/_zstd_box.py", "ranges/coverage.py", "ranges/planning.py", "format/schemas.py",
             "format/regex.py", "format/jsonio.py", "storage/local.py"]


def test_every_rule_the_read_path_enforces_has_a_vector_checked_against_verify() -> None:
    """The codes raised by the modules a read goes through, enumerated from their source."""
    import ast

    from portable_ckpt import errors

    src = Path(portable_ckpt.__file__).parent
    raised: set[str] = set()
    for rel in READ_PATH:
        path = src / rel
        if not path.is_file():
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                cls = getattr(errors, node.func.id, None)
                if isinstance(cls, type) and issubclass(cls, errors.CheckpointError):
                    raised.add(cls.code)
    assert {"PCK-CHECKSUM", "PCK-CODEC", "PCK-DTYPE-VALUE", "PCK-SHARD-HEADER"} <= raised
    vectors = {c["code"] for _, _, c in VECTORS if not c["valid"] and c.get("reader") != "accept"}
    missing = sorted(raised - set(NOT_VERSION_RULES) - vectors)
    assert not missing, f"read-path rules without a golden vector (and so unchecked): {missing}"
