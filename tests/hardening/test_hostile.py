"""Specific hostile inputs: each is rejected with its spec code in well under a second.

Regression tests at the end cover core bugs this suite found (all fixed); the
lead flips them when the core is fixed.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import portable_ckpt
from portable_ckpt.errors import CheckpointError
from portable_ckpt.format import jsonio
from portable_ckpt.io.safetensors_io import parse_header
from portable_ckpt.ranges.box import Box
from portable_ckpt.ranges.coverage import check_coverage
from tests.hardening._util import Hang, make_version, rechecksum, time_bound

FAST = 1.0  # seconds: "well under a second" with slack for a loaded CI machine


def expect_code(code: str | set[str], fn: Callable[..., Any], *args: Any, **kwargs: Any) -> CheckpointError:
    t0 = time.perf_counter()
    with time_bound(FAST * 3):
        with pytest.raises(CheckpointError) as info:
            fn(*args, **kwargs)
    took = time.perf_counter() - t0
    codes = {code} if isinstance(code, str) else code
    assert info.value.code in codes, f"expected {code}, got {info.value}"
    assert took < FAST, f"{code} took {took:.2f} s"
    return info.value


@pytest.fixture
def version(tmp_path: Path) -> tuple[Path, str]:
    root = tmp_path / "root"
    a = make_version(str(root), 5)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.bin").write_bytes(b"SECRET" * 1000)
    return root, a


def edit_manifest(root: Path, a: str, fn: Callable[[dict[str, Any]], Any]) -> None:
    p = root / a / "manifest.json"
    doc = json.loads(p.read_bytes())
    fn(doc)
    p.write_bytes(json.dumps(doc).encode())


def open_and_read(root: Path, a: str, key: str = "model.w") -> None:
    ck = portable_ckpt.open(str(root / a))
    ck.read(key)


# -- paths ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad", ["../x.safetensors", "/etc/passwd", "data\\w.safetensors", "data/../../x", "data/./w",
            "data//w", "", "a/" * 9 + "x", "dätä/w"],
)
def test_unsafe_paths_rejected(version: tuple[Path, str], bad: str) -> None:
    root, a = version

    def put(doc: dict[str, Any]) -> None:
        rec = doc["files"].pop("data/w00000-0000.safetensors")
        doc["files"][bad] = rec
        for t in doc["tensors"].values():
            for r in t["ranges"]:
                if r["file"] == "data/w00000-0000.safetensors":
                    r["file"] = bad

    edit_manifest(root, a, put)
    expect_code("PCK-PATH-UNSAFE", portable_ckpt.open, str(root / a))


def test_unsafe_path_in_range_only(version: tuple[Path, str]) -> None:
    root, a = version
    edit_manifest(root, a, lambda d: d["tensors"]["model.w"]["ranges"][0].update(file="../../etc/passwd"))
    expect_code("PCK-PATH-UNSAFE", portable_ckpt.open, str(root / a))


def test_file_symlink_out_of_attempt(version: tuple[Path, str]) -> None:
    root, a = version
    f = root / a / "data" / "w00000-0000.safetensors"
    size = f.stat().st_size
    secret = root.parent / "outside" / "secret.bin"
    secret.write_bytes(f.read_bytes())  # same bytes: only the link itself can be the reason to refuse
    f.unlink()
    f.symlink_to(secret)
    assert secret.stat().st_size == size
    expect_code("PCK-PATH-UNSAFE", open_and_read, root, a)
    ck = portable_ckpt.open(str(root / a))
    codes = {e.code for e in ck.verify(deep=True)}
    assert codes == {"PCK-PATH-UNSAFE"}, codes


def test_directory_symlink_out_of_attempt(version: tuple[Path, str]) -> None:
    root, a = version
    data = root / a / "data"
    moved = root.parent / "outside" / "data"
    shutil.move(str(data), str(moved))
    data.symlink_to(moved, target_is_directory=True)
    expect_code("PCK-PATH-UNSAFE", open_and_read, root, a)


def test_version_directory_symlink(version: tuple[Path, str], tmp_path: Path) -> None:
    root, a = version
    other = tmp_path / "other"
    other.mkdir()
    shutil.move(str(root / a), str(other / a))
    (root / a).symlink_to(other / a, target_is_directory=True)
    expect_code("PCK-PATH-UNSAFE", portable_ckpt.open, str(root / a))
    assert portable_ckpt.list_versions(str(root)) == []  # a linked attempt is not a version
    expect_code("PCK-NOT-FOUND", portable_ckpt.open, str(root))


def test_manifest_symlink(version: tuple[Path, str]) -> None:
    root, a = version
    m = root / a / "manifest.json"
    target = root.parent / "outside" / "manifest.json"
    shutil.move(str(m), str(target))
    m.symlink_to(target)
    with pytest.raises(CheckpointError) as info:
        portable_ckpt.open(str(root / a))
    assert info.value.code in {"PCK-MANIFEST-MISSING", "PCK-PATH-UNSAFE"}


# -- shapes, lengths, sizes -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("shape", "code"),
    [([2**40, 2**40], "PCK-LIMIT"), ([2**62], "PCK-LIMIT"), ([2**64], "PCK-LIMIT"),
     ([2**27, 2**27], "PCK-LIMIT"), ([1] * 65, "PCK-LIMIT"), ([-1], "PCK-SCHEMA"), ([1.5], "PCK-SCHEMA"),
     ([True], "PCK-SCHEMA")],
)
def test_absurd_shapes(version: tuple[Path, str], shape: list[Any], code: str) -> None:
    root, a = version
    edit_manifest(root, a, lambda d: d["tensors"]["model.w"].update(shape=shape))
    expect_code(code, portable_ckpt.open, str(root / a))


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [("lengths", [0, 48], {"PCK-SCHEMA", "PCK-RANGE-BOUNDS"}), ("lengths", [2**62, 48], "PCK-LIMIT"),
     ("lengths", [2**40, 48], "PCK-RANGE-BOUNDS"), ("offsets", [2**62, 0], "PCK-LIMIT"),
     ("offsets", [2**40, 0], "PCK-RANGE-BOUNDS"), ("offsets", [0], "PCK-RANGE-BOUNDS"),
     ("offsets", [2**64, 0], "PCK-LIMIT"), ("codec", "lz4", {"PCK-CODEC", "PCK-SCHEMA"})],
)
def test_absurd_ranges(version: tuple[Path, str], field: str, value: Any, code: str | set[str]) -> None:
    root, a = version
    edit_manifest(root, a, lambda d: d["tensors"]["model.w"]["ranges"][0].update({field: value}))
    expect_code(code, portable_ckpt.open, str(root / a))


@pytest.mark.parametrize(("size", "code"), [(2**53, "PCK-LIMIT"), (2**62, "PCK-LIMIT"), (-1, "PCK-SCHEMA")])
def test_absurd_file_sizes(version: tuple[Path, str], size: int, code: str) -> None:
    root, a = version
    edit_manifest(root, a, lambda d: d["files"]["data/w00000-0000.safetensors"].update(size=size))
    expect_code(code, portable_ckpt.open, str(root / a))


def test_block_count_mismatch(version: tuple[Path, str]) -> None:
    root, a = version
    edit_manifest(root, a, lambda d: d["files"]["data/w00000-0000.safetensors"]["checksum"].update(blocks=""))
    expect_code("PCK-SCHEMA", portable_ckpt.open, str(root / a))


@pytest.mark.parametrize("block_size", [0, 4095, 4097, 2**31, 2**62])
def test_absurd_block_sizes(version: tuple[Path, str], block_size: int) -> None:
    root, a = version
    edit_manifest(root, a, lambda d: d["files"]["data/w00000-0000.safetensors"]["checksum"].update(block_size=block_size))
    with time_bound(FAST * 3), pytest.raises(CheckpointError) as info:
        portable_ckpt.open(str(root / a))
    assert info.value.code in {"PCK-SCHEMA", "PCK-LIMIT"}


# -- JSON ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [b'{"a":1,"a":2}', b'{"a":{"b":1,"b":1}}', b"[NaN]", b"[Infinity]", b"[-Infinity]", b'{"a":NaN}',
     b"\xff\xfe{}", b'{"a":"\xc0\x80"}', b'"\xed\xa0\x80"', b"[" * 100 + b"]" * 100,
     b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 65 + b"1" + b"}" * 65, b"", b"{", b"1" * 5000],
)
def test_strict_json_rejections(text: bytes) -> None:
    expect_code("PCK-JSON-INVALID", jsonio.loads, text, what="doc")


def test_json_too_large() -> None:
    # Spec §18.3 / §17.1: an oversized JSON document is PCK-JSON-INVALID, refused before parsing.
    expect_code("PCK-JSON-INVALID", jsonio.loads, b" " * 2000, what="doc", max_bytes=1000)


def test_manifest_duplicate_keys_and_nan(version: tuple[Path, str]) -> None:
    root, a = version
    p = root / a / "manifest.json"
    text = p.read_bytes()
    p.write_bytes(text.replace(b'"step":5', b'"step":5,"step":6', 1))
    expect_code("PCK-JSON-INVALID", portable_ckpt.open, str(root / a))
    p.write_bytes(text.replace(b'"step":5', b'"step":NaN', 1))
    expect_code("PCK-JSON-INVALID", portable_ckpt.open, str(root / a))
    p.write_bytes(b"\xff" + text)
    expect_code("PCK-JSON-INVALID", portable_ckpt.open, str(root / a))
    p.write_bytes(text.replace(b'"extensions":{}', b'"extensions":' + b"[" * 200 + b"]" * 200, 1))
    expect_code("PCK-JSON-INVALID", portable_ckpt.open, str(root / a))


def test_entry_value_nan_and_duplicates(version: tuple[Path, str]) -> None:
    """Entry files are checksummed; a tampered one fails its checksum before it is parsed."""
    root, a = version
    ck = portable_ckpt.open(str(root / a))
    f = root / a / ck.entries["step"].values[0].file
    f.write_bytes(b'{"step":5,"step":5}'[: f.stat().st_size].ljust(f.stat().st_size, b" "))
    expect_code("PCK-CHECKSUM", portable_ckpt.open(str(root / a)).entry, "step")


@pytest.mark.parametrize(
    ("mutate", "code"),
    [(lambda d: d.update(format_version="2.0"), "PCK-VERSION-UNSUPPORTED"),
     (lambda d: d.update(must_understand=["x-sparse"]), "PCK-FEATURE-UNSUPPORTED"),
     (lambda d: d.update(attempt_id="s000000000005-20200101T000000000000Z-0000000000000000"), "PCK-ATTEMPT-ID"),
     (lambda d: d["tensors"]["model.w"].update(dtype="complex64"), "PCK-DTYPE-UNSUPPORTED"),
     (lambda d: d["tensors"]["model.w"]["ranges"].append(d["tensors"]["model.w"]["ranges"][0]), None)],
)
def test_manifest_semantic_rejections(version: tuple[Path, str], mutate: Callable[[dict[str, Any]], Any], code: str | None) -> None:
    root, a = version
    edit_manifest(root, a, mutate)
    if code is not None:
        expect_code(code, portable_ckpt.open, str(root / a))
    else:
        expect_code("PCK-COVERAGE-OVERLAP", open_and_read, root, a)


# -- safetensors headers -------------------------------------------------------------------------
def _rewrite_header(root: Path, a: str, fn: Callable[[bytes], bytes]) -> None:
    f = root / a / "data" / "w00000-0000.safetensors"
    data = f.read_bytes()
    new = fn(data)
    assert len(new) == len(data)
    f.write_bytes(new)
    rechecksum(str(root / a), "data/w00000-0000.safetensors")  # the attacker fixes the checksums


@pytest.mark.parametrize("n", [2**62, 2**64 - 1, 100_000_001, 0])
def test_header_length_absurd(version: tuple[Path, str], n: int) -> None:
    root, a = version
    _rewrite_header(root, a, lambda d: struct.pack("<Q", n) + d[8:])
    expect_code("PCK-SHARD-HEADER", open_and_read, root, a)


@pytest.mark.parametrize("offsets", [[0, 2**40], [2**64 - 8, 2**64], [5, 4], [-4, 0]])
def test_data_offsets_beyond_file(version: tuple[Path, str], offsets: list[int]) -> None:
    root, a = version

    def fix(d: bytes) -> bytes:
        n = struct.unpack("<Q", d[:8])[0]
        hdr = json.loads(d[8 : 8 + n])
        name = next(k for k in hdr if k.startswith("model.w"))
        hdr[name]["data_offsets"] = offsets
        hdr.pop("__metadata__", None)  # make room: the header keeps its length
        body = json.dumps(hdr, separators=(",", ":")).encode()
        assert len(body) <= n
        return d[:8] + body.ljust(n, b" ") + d[8 + n :]

    _rewrite_header(root, a, fix)
    expect_code("PCK-SHARD-HEADER", open_and_read, root, a)


def test_header_shape_mismatch(version: tuple[Path, str]) -> None:
    root, a = version

    def fix(d: bytes) -> bytes:
        n = struct.unpack("<Q", d[:8])[0]
        hdr = json.loads(d[8 : 8 + n])
        name = next(k for k in hdr if k.startswith("model.w"))
        hdr[name]["shape"] = [2**40, 1]
        hdr.pop("__metadata__", None)
        body = json.dumps(hdr, separators=(",", ":")).encode()
        return d[:8] + body.ljust(n, b" ") + d[8 + n :]

    _rewrite_header(root, a, fix)
    # The entry's span no longer equals shape x itemsize: the header itself is invalid (R-SHARD-6).
    expect_code("PCK-SHARD-HEADER", open_and_read, root, a)


def test_truncated_and_extended_files(version: tuple[Path, str]) -> None:
    root, a = version
    f = root / a / "data" / "w00000-0000.safetensors"
    size = f.stat().st_size
    os.truncate(f, size - 1)
    expect_code("PCK-FILE-SIZE", open_and_read, root, a)
    os.truncate(f, size + 4096)
    expect_code("PCK-FILE-SIZE", open_and_read, root, a)


# -- core bugs found by this suite, fixed in the core (regression tests) ----------------------
def test_json_overflowing_number_is_infinity() -> None:
    """1e999 parses as Infinity in most JSON libraries: strict loading refuses it."""
    expect_code("PCK-JSON-INVALID", jsonio.loads, b"[1e999]", what="doc")
    expect_code("PCK-JSON-INVALID", jsonio.loads, b'{"a":-1e400}', what="doc")


def test_parse_header_short_prefix() -> None:
    expect_code("PCK-SHARD-HEADER", parse_header, b"\x01\x00", b"{}", path="p", file_size=10)


def test_coverage_many_unit_dims_is_fast() -> None:
    t0 = time.process_time()  # (CPU: other processes do not count)
    try:
        with time_bound(FAST):
            check_coverage([1] * 22, [Box((0,) * 22, (1,) * 22)], key="k")
    except Hang:
        raise AssertionError("check_coverage on a 22-d [1,...,1] tensor did not finish in 1 s") from None
    assert time.process_time() - t0 < FAST


def test_read_validates_before_allocating(version: tuple[Path, str]) -> None:
    root, a = version

    def huge(d: dict[str, Any]) -> None:
        t = d["tensors"]["model.b"]
        t["shape"] = [2**50]
        t["dtype"] = "uint8"
        t["ranges"] = [dict(t["ranges"][0], offsets=[0], lengths=[2**50])]

    edit_manifest(root, a, huge)
    expect_code("PCK-SHARD-MISMATCH", open_and_read, root, a, "model.b")


def test_zero_size_tensor_huge_dims(version: tuple[Path, str]) -> None:
    root, a = version
    edit_manifest(root, a, lambda d: d["tensors"]["model.b"].update(shape=[0, 2**53 - 1, 2**53 - 1], ranges=[]))
    expect_code("PCK-LIMIT", open_and_read, root, a, "model.b")


def _entry_schema_attack(root: Path, a: str, schema: dict[str, Any], value: Any) -> None:
    """Replace entry 'sched' with a crafted value and schema (value file checksummed correctly)."""
    from portable_ckpt.io.checksum import BlockHasher

    def edit(d: dict[str, Any]) -> None:
        e = d["entries"]["sched"]
        payload = json.dumps(value).encode()
        rel = "entries/attack.g.json"
        (root / a / rel).write_bytes(payload)
        h = BlockHasher(4096)
        h.update(payload)
        d["files"][rel] = {"size": len(payload), "checksum": {"algorithm": "crc32c", "block_size": 4096, "blocks": h.blocks()}}
        e.update(schema={"json_schema": schema}, encoding="json", values=[{"file": rel}])

    edit_manifest(root, a, edit)


def test_entry_schema_redos(version: tuple[Path, str]) -> None:
    """R-ENTRY-15: embedded patterns run in linear time (RE2)."""
    root, a = version
    _entry_schema_attack(root, a, {"type": "string", "pattern": "^(a+)+$"}, "a" * 22 + "!")
    ck = portable_ckpt.open(str(root / a))
    t0 = time.process_time()  # (CPU: other processes do not count)
    with pytest.raises(CheckpointError):
        ck.entry("sched")
    assert time.process_time() - t0 < 0.1, "entry schema validation took too long (ReDoS)"


def test_entry_schema_unique_items_quadratic(version: tuple[Path, str]) -> None:
    """R-ENTRY-15: uniqueItems without quadratic cost."""
    root, a = version
    _entry_schema_attack(root, a, {"type": "array", "uniqueItems": True}, [{"i": i} for i in range(700)])
    ck = portable_ckpt.open(str(root / a))
    t0 = time.process_time()  # (CPU: other processes do not count)
    try:
        ck.entry("sched")
    except CheckpointError:
        pass
    assert time.process_time() - t0 < 0.2, "entry schema validation took too long (uniqueItems)"


def test_commit_from_stored_indexes_with_declared_scalar(tmp_path: Path) -> None:
    import numpy as np

    from portable_ckpt.io.commit import commit
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id
    from portable_ckpt.storage import open_storage

    storage = open_storage(str(tmp_path), create=True)
    a = new_attempt_id(3)
    w0 = ShardWriter(storage, a, 0)
    w0.add_tensor("scalar", np.array(3, dtype=np.int64))
    w0.finish()
    w1 = ShardWriter(storage, a, 1)
    w1.declare_tensor("scalar", "int64", ())  # rank 1 holds no shard of it: the documented API
    w1.finish()
    commit(storage, a, step=3, indexes=None, expected_writers=[0, 1],
           continuation=portable_ckpt.Continuation("exact", 2, None))
    assert portable_ckpt.open(str(tmp_path)).read("scalar") == 3
