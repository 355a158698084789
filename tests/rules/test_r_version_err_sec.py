"""Versioning (§16), errors (§17) and security (§18)."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt import errors
from portable_ckpt.errors import CheckpointError
from portable_ckpt.format.manifest import MAX_SIZE

from ._util import (
    build_version,
    edit_manifest,
    expect_code,
    open_and_read_all,
    read_manifest,
    rewrite_file,
    rewrite_shard_header,
    save_sharded,
    shard_header,
)

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "spec" / "README.md"


def test_every_written_document_says_1_0(tmp_path: Path) -> None:
    """R-VERSION-2: documents that use no 1.1 feature — the manifest and writer indexes of a version
    without tensor tables, drill and copy records — carry format_version 1.0 (a version with
    tables: tests/rules/test_r_table.py)."""
    from portable_ckpt.io.annotations import write_drill_record
    from portable_ckpt.io.copy import copy_version
    from portable_ckpt.storage import open_storage

    vdir, m = build_version(tmp_path / "src")
    write_drill_record(open_storage(tmp_path / "src"), m.attempt_id, {
        "ok": True, "started_at": "2030-01-01T00:00:00Z", "finished_at": "2030-01-01T00:00:01Z",
        "world_size": 1, "saved_world_size": 1, "contract": "exact", "measurements": {},
        "error": None})
    copy_version(vdir, tmp_path / "dst")
    docs = [vdir / "manifest.json", *(vdir / "index").iterdir(), *(vdir / "drills").iterdir(),
            *(vdir / "copies").iterdir()]
    assert len(docs) == 5
    for p in docs:
        assert json.loads(p.read_text())["format_version"] == "1.0", p


@pytest.mark.parametrize("version", ["2.0", "0.9", "10.0", "0.0", "3.1"])
def test_unknown_major_is_rejected(tmp_path: Path, version: str) -> None:
    """R-VERSION-3: a MAJOR other than 1 is PCK-VERSION-UNSUPPORTED (manifest and index)."""
    vdir, _ = build_version(tmp_path)
    edit_manifest(vdir, lambda d: d.__setitem__("format_version", version))
    expect_code("PCK-VERSION-UNSUPPORTED", portable_ckpt.open, vdir)
    from portable_ckpt.io.commit import commit
    from portable_ckpt.storage import open_storage

    from ._util import write_attempt

    attempt, _ = write_attempt(tmp_path / "c", {"x": np.ones(2, np.float32)})
    p = tmp_path / "c" / attempt / "index" / "w00000.json"
    doc = json.loads(p.read_text())
    doc["format_version"] = version
    p.write_text(json.dumps(doc))
    expect_code("PCK-VERSION-UNSUPPORTED", commit, open_storage(tmp_path / "c"), attempt, step=1,
                expected_writers=[0])


@pytest.mark.parametrize("version", ["1.1", "1.99", "1.123456", "1.123456789"])
def test_any_minor_of_major_1_is_accepted(tmp_path: Path, version: str) -> None:
    """R-VERSION-4: any MINOR of major 1 is read."""
    vdir, _ = build_version(tmp_path)
    edit_manifest(vdir, lambda d: d.update(format_version=version, x_new_member={"a": [1]}))
    ck = open_and_read_all(vdir)
    assert ck.entry("cfg") == {"x": 1}


@pytest.mark.parametrize("mu", [["zstd-dict"], ["", "x"], ["sparse-tensors", "sparse-tensors"]])
def test_unknown_must_understand_is_rejected(tmp_path: Path, mu: list[str]) -> None:
    """R-VERSION-5: must_understand naming an unknown extension is PCK-FEATURE-UNSUPPORTED."""
    vdir, _ = build_version(tmp_path)
    edit_manifest(vdir, lambda d: d.__setitem__("must_understand", mu))
    expect_code("PCK-FEATURE-UNSUPPORTED", portable_ckpt.open, vdir)
    edit_manifest(vdir, lambda d: d.__setitem__("must_understand", []))
    open_and_read_all(vdir)


@pytest.mark.parametrize(
    ("change", "status", "code"),
    [
        ({"format_version": "2.0"}, "foreign", "PCK-VERSION-UNSUPPORTED"),
        ({"format_version": "1.1", "must_understand": ["zstd-dict"]}, "foreign",
         "PCK-FEATURE-UNSUPPORTED"),
        ({"format_version": "1.12", "tensors": {"a": {"layout": "future"}}}, "foreign",
         "PCK-VERSION-UNSUPPORTED"),
        ({"format_version": "1.12", "producer": None}, "foreign", "PCK-VERSION-UNSUPPORTED"),
        ({"format_version": "1.1234567890"}, "foreign", "PCK-VERSION-UNSUPPORTED"),
        ({"format_version": "1.1", "tensors": {"a": {"layout": "future"}}}, "invalid",
         "PCK-SCHEMA"),
        ({"format": "other", "format_version": "2.0"}, "invalid", "PCK-SCHEMA"),
        ({"format_version": "2.x"}, "invalid", "PCK-SCHEMA"),
        ({"format_version": "1.12"}, "committed", None),
    ],
)
def test_foreign_commit_records_are_recognised(
    tmp_path: Path, change: dict[str, Any], status: str, code: str | None
) -> None:
    """R-VERSION-10: newer major, unknown must_understand, or a newer version failing the checks.

    Opened explicitly, a foreign record is PCK-VERSION-UNSUPPORTED (PCK-FEATURE-UNSUPPORTED for
    an unknown extension), also when a newer version fails the checks (errata 6): never the
    code of the failure, which the message names.
    """
    from portable_ckpt.io.versions import classify_attempt
    from portable_ckpt.storage import open_storage

    vdir, m = build_version(tmp_path)
    edit_manifest(vdir, lambda d: d.update(change))
    c = classify_attempt(open_storage(tmp_path), m.attempt_id)
    assert c.status == status, c.error
    if status == "committed":
        open_and_read_all(vdir)
        return
    assert code is not None
    expect_code(code, portable_ckpt.open, vdir)
    assert c.error is not None and c.error.code == code
    if status == "foreign":
        assert c.committed_at == m.committed_at
    # The conformance checker judges the version as the reader does (it said PCK-SCHEMA for a
    # newer record that fails the schema).
    from conformance.checker import check

    assert {e.code for e in check(vdir, deep=False).errors} == {code}


def test_unknown_top_level_members_and_extensions_are_ignored(tmp_path: Path) -> None:
    """R-VERSION-6: unknown top-level members and `extensions` contents are ignored."""
    vdir, _ = build_version(tmp_path)
    edit_manifest(vdir, lambda d: d.update(
        x_vendor={"deep": [1, {"k": None}]}, signature="abc", annotations=[1, 2],
        extensions={"acme.sign": {"sig": "00"}, "other": [1, 2, 3]}))
    ck = open_and_read_all(vdir)
    np.testing.assert_array_equal(ck.read("b"), np.arange(5, dtype=np.int32))
    # Writer indexes too (read by the committer).
    from portable_ckpt.io.commit import commit
    from portable_ckpt.storage import open_storage

    from ._util import write_attempt

    attempt, _ = write_attempt(tmp_path / "c", {"x": np.ones(2, np.float32)})
    p = tmp_path / "c" / attempt / "index" / "w00000.json"
    doc = json.loads(p.read_text())
    doc["x_vendor"] = {"a": 1}
    p.write_text(json.dumps(doc))
    m = commit(open_storage(tmp_path / "c"), attempt, step=1, expected_writers=[0])
    assert portable_ckpt.open(tmp_path / "c").id == m.attempt_id


def test_writer_lists_no_extensions_it_does_not_use(tmp_path: Path) -> None:
    """R-VERSION-7: our writer uses only 1.0 features, so must_understand is empty."""
    m = save_sharded(tmp_path, {"a": (np.ones((4, 4), np.float32), (2, 1))}, codec="zstd",
                     entries={"cfg": {"k": 1}})
    doc = read_manifest(tmp_path / m.attempt_id)
    assert doc["must_understand"] == [] and doc["extensions"] == {}
    from portable_ckpt.format.dtypes import DTYPES
    from portable_ckpt.format.manifest import BUILTIN_SCHEMA_IDS

    for t in doc["tensors"].values():
        assert t["dtype"] in DTYPES
        assert all(r["codec"] in ("none", "zstd") for r in t["ranges"])
    for e in doc["entries"].values():
        assert e["schema"].get("id", "pck:json/1") in BUILTIN_SCHEMA_IDS
    assert all(f["checksum"]["algorithm"] == "crc32c" for f in doc["files"].values())


@pytest.mark.parametrize(
    "raw_or_mutation, code",
    [
        (b'{"format": "portable-ckpt", "format_version": "9.0", "x": NaN}', "PCK-JSON-INVALID"),
        (lambda d: d.update(format="other", format_version="2.0"), "PCK-SCHEMA"),
        (lambda d: d.pop("format_version"), "PCK-SCHEMA"),
        (lambda d: d.update(format_version="1"), "PCK-SCHEMA"),
        (lambda d: d.update(format_version="01.0"), "PCK-SCHEMA"),
        (lambda d: d.update(format_version="2.0", must_understand=["x"]),
         "PCK-VERSION-UNSUPPORTED"),
        (lambda d: d.update(format_version="2.0", tensors=5), "PCK-VERSION-UNSUPPORTED"),
        (lambda d: (d.update(must_understand=["x"]), d.pop("tensors")), "PCK-FEATURE-UNSUPPORTED"),
        (lambda d: d.update(must_understand=["x"], attempt_id="nope"), "PCK-FEATURE-UNSUPPORTED"),
    ],
)
def test_checks_are_applied_in_order(tmp_path: Path, raw_or_mutation: Any, code: str) -> None:
    """R-VERSION-8: JSON rules, format, format_version, must_understand, schema, then text."""
    vdir, _ = build_version(tmp_path)
    if isinstance(raw_or_mutation, bytes):
        (vdir / "manifest.json").write_bytes(raw_or_mutation)
    else:
        edit_manifest(vdir, raw_or_mutation)
    expect_code(code, portable_ckpt.open, vdir)


RELEASED_LOCK = Path(__file__).with_name("released-1.0.sha256")


def _released_files() -> list[Path]:
    base = ROOT / "spec"
    return sorted(p for d in ("schemas", "examples") for p in (base / d).rglob("*.json"))


def test_released_schemas_and_examples_are_unchanged() -> None:
    """R-VERSION-9: released 1.0 schemas and examples are never changed or removed.

    ``released-1.0.sha256`` pins their content; a correction needs a new MINOR version.
    """
    pinned = dict(line.split("  ", 1)[::-1] for line in RELEASED_LOCK.read_text().splitlines()
                  if line.strip())
    now = {str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest()
           for p in _released_files()}
    removed = sorted(set(pinned) - set(now))
    changed = sorted(k for k in pinned if k in now and now[k] != pinned[k])
    assert not removed and not changed, f"removed: {removed}, changed: {changed}"


def _spec_codes() -> list[str]:
    text = SPEC.read_text(encoding="utf-8")
    section = text.split("### 17.1 Codes", 1)[1].split("### 17.2", 1)[0]
    return re.findall(r"^\| `(PCK-[A-Z-]+)` \|", section, flags=re.M)


def test_every_code_is_exposed_as_its_exact_string() -> None:
    """R-ERR-1: every spec code is a CheckpointError subclass whose `code` is that exact string."""
    codes = _spec_codes()
    assert len(codes) == 34
    every = [c for c in vars(errors).values()
             if isinstance(c, type) and issubclass(c, CheckpointError) and c is not CheckpointError]
    # One class per code; a refinement (CommitOutcomeUnknownError) keeps its parent's code.
    classes = {c.code: c for c in every if "code" in vars(c)}
    assert len(classes) == len([c for c in every if "code" in vars(c)])
    for c in every:
        assert c.code in classes and issubclass(c, classes[c.code])
    assert set(classes) == set(codes)
    for code, cls in classes.items():
        err = cls("message")
        assert err.code == code and isinstance(err, CheckpointError)
        assert errors.error_for_code(code) is cls


FROZEN_1_0_CODES = (
    "PCK-NOT-FOUND", "PCK-MANIFEST-MISSING", "PCK-JSON-INVALID", "PCK-SCHEMA",
    "PCK-VERSION-UNSUPPORTED", "PCK-FEATURE-UNSUPPORTED", "PCK-ATTEMPT-ID", "PCK-PATH-UNSAFE",
    "PCK-FILE-MISSING", "PCK-FILE-SIZE", "PCK-CHECKSUM", "PCK-DTYPE-UNSUPPORTED",
    "PCK-RANGE-BOUNDS", "PCK-COVERAGE-GAP", "PCK-COVERAGE-OVERLAP", "PCK-SHARD-HEADER",
    "PCK-SHARD-MISMATCH", "PCK-CODEC", "PCK-LIMIT", "PCK-ENTRY-SCHEMA", "PCK-ENTRY-MISSING",
    "PCK-TENSOR-MISSING", "PCK-CONTRACT", "PCK-COMMIT-CONFLICT", "PCK-WRITER-MISSING",
    "PCK-METADATA-CONFLICT", "PCK-STEP-MISMATCH", "PCK-STORAGE", "PCK-DISTRIBUTED",
    "PCK-UNSUPPORTED-VALUE", "PCK-USAGE",
)


def test_codes_are_stable() -> None:
    """R-ERR-2: the 1.0 codes are never renamed or removed (spec table and implementation)."""
    assert set(FROZEN_1_0_CODES) <= set(_spec_codes())
    assert {errors.error_for_code(c).code for c in FROZEN_1_0_CODES} == set(FROZEN_1_0_CODES)


@pytest.mark.parametrize(
    "mutate, code",
    [
        (lambda d: d["files"].__setitem__("../x", next(iter(d["files"].values()))),
         "PCK-PATH-UNSAFE"),
        (lambda d: d["entries"]["cfg"]["values"][0].__setitem__("file", "/abs"),
         "PCK-PATH-UNSAFE"),
        (lambda d: d.__setitem__("attempt_id", "s1-bad"), "PCK-ATTEMPT-ID"),
        (lambda d: d.__setitem__("format_version", "7.0"), "PCK-VERSION-UNSUPPORTED"),
        (lambda d: d["tensors"]["a"].__setitem__("dtype", "complex128"), "PCK-DTYPE-UNSUPPORTED"),
        (lambda d: d["tensors"]["a"]["ranges"][0].__setitem__("codec", "brotli"), "PCK-CODEC"),
        (lambda d: d["tensors"]["a"].__setitem__("shape", [MAX_SIZE + 1, 8]), "PCK-LIMIT"),
        (lambda d: next(iter(d["files"].values())).__setitem__("size", MAX_SIZE + 1), "PCK-LIMIT"),
        (lambda d: d["tensors"]["a"]["ranges"][0].__setitem__("offsets", [MAX_SIZE + 1, 0]),
         "PCK-LIMIT"),
        (lambda d: d["tensors"]["a"]["ranges"][0].__setitem__("lengths", [MAX_SIZE + 1, 8]),
         "PCK-LIMIT"),
        (lambda d: d["entries"]["cfg"]["schema"].__setitem__("id", "pck:foo/9"),
         "PCK-ENTRY-SCHEMA"),
        (lambda d: d["tensors"]["a"]["ranges"][0].__setitem__("offsets", [0]), "PCK-RANGE-BOUNDS"),
        (lambda d: d["tensors"]["a"]["ranges"][0].__setitem__("lengths", [0, 8]),
         "PCK-RANGE-BOUNDS"),
        (lambda d: d["tensors"]["a"]["ranges"][0].__setitem__("offsets", [-1, 0]),
         "PCK-RANGE-BOUNDS"),
    ],
)
def test_specific_codes_before_schema(tmp_path: Path, mutate: Any, code: str) -> None:
    """R-ERR-3: the specific codes of §17.2 are reported instead of PCK-SCHEMA."""
    vdir, _ = build_version(tmp_path)
    edit_manifest(vdir, mutate)
    expect_code(code, portable_ckpt.open, vdir)


_ODD_VALUES: list[Any] = [None, True, -1, 0, 2**64, 1.5, "", "x" * 300, [], {}, [1, "a"],
                          {"k": []}, "../x", 2**53]


def _mutations(doc: Any, rnd: random.Random, n: int) -> list[tuple[list[Any], Any]]:
    paths: list[list[Any]] = []

    def walk(node: Any, path: list[Any]) -> None:
        paths.append(path)
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, [*path, k])
        elif isinstance(node, list):
            for i, v in enumerate(node[:3]):
                walk(v, [*path, i])

    walk(doc, [])
    return [(rnd.choice(paths[1:]), rnd.choice(_ODD_VALUES)) for _ in range(n)]


def test_malformed_input_only_raises_checkpoint_errors(tmp_path: Path) -> None:
    """R-ERR-4: malformed manifests never escape as KeyError/TypeError/ValueError/crashes."""
    vdir, _ = build_version(tmp_path, entries={"cfg": {"x": 1}})
    pristine = read_manifest(vdir)
    rnd = random.Random(20261129)
    failures = []
    for path, value in _mutations(pristine, rnd, 250):
        doc = json.loads(json.dumps(pristine))
        node = doc
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
        (vdir / "manifest.json").write_text(json.dumps(doc))
        try:
            open_and_read_all(vdir)
        except CheckpointError:
            pass
        except Exception as exc:
            failures.append((path, value, repr(exc)[:200]))
    assert not failures, failures[:5]


def test_malformed_shard_and_entry_bytes_only_raise_checkpoint_errors(tmp_path: Path) -> None:
    """R-ERR-4: random damage to data and entry files gives CheckpointErrors only."""
    vdir, _ = build_version(tmp_path, entries={"cfg": {"x": [1, 2, 3]}})
    rnd = random.Random(7)
    originals = {rel: (vdir / rel).read_bytes() for rel in read_manifest(vdir)["files"]
                 if not rel.startswith("index/")}
    manifest = (vdir / "manifest.json").read_bytes()
    failures = []
    for i in range(120):
        rel = rnd.choice(sorted(originals))
        data = bytearray(originals[rel])
        for _ in range(rnd.randint(1, 4)):
            pos = rnd.randrange(min(len(data), 200))
            data[pos] = rnd.randrange(256)
        if i % 3 == 0:
            data = data[: rnd.randrange(len(data))]
        (vdir / "manifest.json").write_bytes(manifest)
        for r, o in originals.items():
            (vdir / r).write_bytes(o)
        rewrite_file(vdir, rel, bytes(data))
        try:
            open_and_read_all(vdir)
        except CheckpointError:
            pass
        except Exception as exc:
            failures.append((rel, repr(exc)[:200]))
    assert not failures, failures[:5]


def test_symlink_out_of_the_attempt_is_refused(tmp_path: Path) -> None:
    """R-SEC-1: symbolic links leading out of the attempt are PCK-PATH-UNSAFE."""
    vdir, _ = build_version(tmp_path / "root")
    outside = tmp_path / "outside"
    outside.mkdir()
    rel = read_manifest(vdir)["entries"]["cfg"]["values"][0]["file"]
    os.rename(vdir / rel, outside / "value.json")
    (vdir / rel).symlink_to(outside / "value.json")
    expect_code("PCK-PATH-UNSAFE", portable_ckpt.open(vdir).entry, "cfg")
    (vdir / rel).unlink()
    os.rename(outside / "value.json", vdir / rel)
    os.rename(vdir / "entries", outside / "entries")
    (vdir / "entries").symlink_to(outside / "entries")
    expect_code("PCK-PATH-UNSAFE", portable_ckpt.open(vdir).entry, "cfg")


def test_writers_create_no_symlinks(tmp_path: Path) -> None:
    """R-SEC-2: nothing a writer, committer, drill or copy creates is a symbolic link."""
    from portable_ckpt.io.copy import copy_version

    m = save_sharded(tmp_path / "src", {"a": (np.ones((6, 4), np.float32), (3, 2))}, writers=3,
                     codec="zstd", entries={"cfg": {"k": 1}}, max_file_bytes=64)
    copy_version(tmp_path / "src" / m.attempt_id, tmp_path / "dst")
    count = 0
    for base in (tmp_path / "src", tmp_path / "dst"):
        for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
            for name in dirnames + filenames:
                count += 1
                assert not os.path.islink(os.path.join(dirpath, name)), name
    assert count > 10


def test_sizes_validated_against_files_before_use(tmp_path: Path) -> None:
    """R-SEC-3: absurd sizes in documents are refused by limits or by the files' actual sizes."""
    vdir, _ = build_version(tmp_path)
    rel = read_manifest(vdir)["tensors"]["b"]["ranges"][0]["file"]
    # A file record claiming more bytes than exist: refused before anything is read.
    edit_manifest(vdir, lambda d: d["files"][rel].update(
        size=2**40, checksum=dict(d["files"][rel]["checksum"], block_size=2**30,
                                  blocks="0" * 8 * 1024)))
    ck = portable_ckpt.open(vdir)
    expect_code("PCK-FILE-SIZE", ck.read, "b")
    assert ck.stats.peak_scratch_bytes < 1 << 20
    # A safetensors header claiming a huge tensor in a small file.
    vdir2, _ = build_version(tmp_path, step=2)
    rel2 = read_manifest(vdir2)["tensors"]["b"]["ranges"][0]["file"]
    name = read_manifest(vdir2)["tensors"]["b"]["ranges"][0]["name"]
    rewrite_shard_header(vdir2, rel2, lambda h: h[name].update(shape=[2**40],
                                                                data_offsets=[0, 2**42]))
    expect_code("PCK-SHARD-HEADER", portable_ckpt.open(vdir2).read, "b")


def test_read_does_not_allocate_by_unvalidated_shape(tmp_path: Path) -> None:
    """R-SEC-3: a huge manifest shape over a tiny file is refused without allocating it."""
    vdir, _ = build_version(tmp_path)

    def huge(d: dict[str, Any]) -> None:
        t = d["tensors"]["b"]
        t.update(shape=[2**46], dtype="uint8")
        t["ranges"] = [dict(t["ranges"][0], offsets=[0], lengths=[2**46])]

    edit_manifest(vdir, huge)
    expect_code("PCK-SHARD-MISMATCH", portable_ckpt.open(vdir).read, "b")


@pytest.mark.parametrize(
    "mutate, code",
    [
        (lambda d: d["tensors"]["a"].__setitem__("shape", [2**31, 2**31, 2**31]), "PCK-LIMIT"),
        (lambda d: d["tensors"]["a"].update(shape=[2**26] * 2, dtype="float64"), "PCK-LIMIT"),
        (lambda d: d["tensors"]["a"].update(shape=[MAX_SIZE, MAX_SIZE]), "PCK-LIMIT"),
        (lambda d: d["tensors"]["a"]["ranges"][0].update(offsets=[MAX_SIZE, 0],
                                                        lengths=[MAX_SIZE, 8]),
         "PCK-RANGE-BOUNDS"),
        (lambda d: next(iter(d["files"].values())).update(size=MAX_SIZE), "PCK-SCHEMA"),
    ],
)
def test_arithmetic_does_not_overflow(tmp_path: Path, mutate: Any, code: str) -> None:
    """R-SEC-4: products and sums beyond 64 bits are caught, never wrapped."""
    vdir, _ = build_version(tmp_path)
    edit_manifest(vdir, mutate)
    expect_code(code, open_and_read_all, vdir)


def test_zstd_content_size_never_sizes_an_allocation(tmp_path: Path) -> None:
    """R-SEC-5: a frame declaring a huge content size is PCK-CODEC without allocating it."""
    import tracemalloc

    import zstandard

    arr = np.arange(64, dtype=np.float32)
    m = save_sharded(tmp_path, {"t": (arr, (1,))}, writers=1, codec="zstd", entries={})
    vdir = tmp_path / m.attempt_id
    r = read_manifest(vdir)["tensors"]["t"]["ranges"][0]
    from ._util import rebuild_shard

    cobj = zstandard.ZstdCompressor(write_content_size=True)
    frame = cobj.compressobj(size=1 << 40).compress(b"") + b""
    c = zstandard.ZstdCompressor(write_content_size=True).compressobj(size=1 << 40)
    frame = c.compress(b"\0" * 1024) + c.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
    rebuild_shard(vdir, r["file"], [(r["name"], "U8", [len(frame)], frame)])
    tracemalloc.start()
    try:
        expect_code("PCK-CODEC", portable_ckpt.open(vdir).read, "t")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20
    # An undeclared size that inflates beyond the range stops at the range's size.
    bomb = zstandard.ZstdCompressor(write_content_size=False).compress(b"\0" * (32 << 20))
    rebuild_shard(vdir, r["file"], [(r["name"], "U8", [len(bomb)], bomb)])
    tracemalloc.start()
    try:
        expect_code("PCK-CODEC", portable_ckpt.open(vdir).read, "t")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


def test_coverage_memory_is_independent_of_element_count(tmp_path: Path) -> None:
    """R-SEC-6: coverage of a 2^40-element tensor is checked with box arithmetic."""
    import time
    import tracemalloc

    from portable_ckpt.ranges import Box, check_coverage

    shape = (2**20, 2**20)
    rows = [Box((i * 2**10, 0), (2**10, 2**20)) for i in range(2**10)]
    tracemalloc.start()
    t0 = time.process_time()  # (CPU: other processes do not count)
    try:
        check_coverage(shape, rows, key="huge")
        expect_code("PCK-COVERAGE-GAP", check_coverage, shape, rows[:-1], key="huge")
        expect_code("PCK-COVERAGE-OVERLAP", check_coverage, shape,
                    [*rows, Box((5, 5), (1, 1))], key="huge")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20 and time.process_time() - t0 < 5
    # Through the reader, on a manifest of such a tensor (plan only, no data needed).
    vdir, _ = build_version(tmp_path)

    def big(d: dict[str, Any]) -> None:
        t = d["tensors"]["a"]
        t["dtype"] = "uint8"
        t["shape"] = list(shape)
        t["ranges"] = [dict(t["ranges"][0], offsets=list(b.offsets), lengths=list(b.lengths),
                            name=f"r{i}") for i, b in enumerate(rows)]

    edit_manifest(vdir, big)
    tracemalloc.start()
    try:
        items = portable_ckpt.open(vdir).plan_read("a", [2**19, 5], [3, 3])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(items) == 1 and peak < 32 << 20


ENCODING_CASES = [b"\xef\xbb\xbf{}", b'{"a": "\xff"}', b'{"a": "\\ud800"}', b'{"a": "\\udc00x"}',
                  b'"\xc0\xaf"', b'{"a": "\xed\xa0\x80"}']


@pytest.mark.parametrize("raw", ENCODING_CASES)
def test_utf8_bom_and_lone_surrogates_rejected(tmp_path: Path, raw: bytes) -> None:
    """R-SEC-7: BOM, invalid UTF-8 and escaped unpaired surrogates: PCK-JSON-INVALID."""
    vdir, _ = build_version(tmp_path)
    (vdir / "manifest.json").write_bytes(raw)
    expect_code("PCK-JSON-INVALID", portable_ckpt.open, vdir)
    vdir2, _ = build_version(tmp_path, step=2)
    rel = read_manifest(vdir2)["entries"]["cfg"]["values"][0]["file"]
    rewrite_file(vdir2, rel, raw)
    expect_code("PCK-JSON-INVALID", portable_ckpt.open(vdir2).entry, "cfg")
    vdir3, _ = build_version(tmp_path, step=3)
    drel = read_manifest(vdir3)["tensors"]["b"]["ranges"][0]["file"]
    rewrite_shard_header(vdir3, drel, lambda h: None, raw_header=raw)
    expect_code("PCK-SHARD-HEADER", portable_ckpt.open(vdir3).read, "b")


def test_valid_surrogate_pairs_are_accepted(tmp_path: Path) -> None:
    """R-SEC-7: a correctly paired surrogate escape is valid JSON."""
    vdir, _ = build_version(tmp_path)
    rel = read_manifest(vdir)["entries"]["cfg"]["values"][0]["file"]
    rewrite_file(vdir, rel, b'{"a": "\\ud83d\\ude00"}')
    assert portable_ckpt.open(vdir).entry("cfg") == {"a": "\U0001f600"}


def _json_targets(tmp_path: Path, raw: bytes, step: int) -> None:
    vdir, _ = build_version(tmp_path, step=step)
    rel = read_manifest(vdir)["entries"]["cfg"]["values"][0]["file"]
    rewrite_file(vdir, rel, raw)
    expect_code("PCK-JSON-INVALID", portable_ckpt.open(vdir).entry, "cfg")


def test_duplicate_names_rejected_everywhere(tmp_path: Path) -> None:
    """R-SEC-8: duplicate member names: manifest, entry value, safetensors header."""
    vdir, _ = build_version(tmp_path)
    text = (vdir / "manifest.json").read_text()
    (vdir / "manifest.json").write_text(text.replace('"step":1', '"step":1,"step":1', 1))
    expect_code("PCK-JSON-INVALID", portable_ckpt.open, vdir)
    (vdir / "manifest.json").write_text(text.replace('"x":', '"x":1,"x":', 0).replace(
        '"contract":', '"contract":"exact","contract":', 1))
    expect_code("PCK-JSON-INVALID", portable_ckpt.open, vdir)
    _json_targets(tmp_path, b'{"x": {"k": 1, "k": 1}}', 2)
    vdir3, _ = build_version(tmp_path, step=3)
    drel = read_manifest(vdir3)["tensors"]["b"]["ranges"][0]["file"]
    _, header, _ = shard_header(vdir3 / drel)
    raw = json.dumps(header).encode()
    raw = raw[:-1] + b', "__metadata__": {}}'
    rewrite_shard_header(vdir3, drel, lambda h: None, raw_header=raw)
    expect_code("PCK-SHARD-HEADER", portable_ckpt.open(vdir3).read, "b")


#: The smallest integer that rounds to infinity as a double (2^1024 - 2^970).
_INT_OVERFLOW = 2**1024 - 2**970


@pytest.mark.parametrize("token", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400",
                                   b"1E+309", b"1" + b"0" * 400, str(_INT_OVERFLOW).encode(),
                                   b"-" + str(_INT_OVERFLOW).encode(), b"7" * 5001])
def test_non_finite_numbers_rejected(tmp_path: Path, token: bytes) -> None:
    """R-SEC-9: NaN, Infinity and numbers overflowing a double are PCK-JSON-INVALID.

    Integer tokens too: ``1`` followed by 400 zeros overflows as ``1e400`` does, whatever
    Python's own limit on digit strings says (5,001 digits was refused by that limit only).
    """
    _json_targets(tmp_path, b'{"v": [1, ' + token + b"]}", 1)
    vdir, _ = build_version(tmp_path, step=2)
    text = (vdir / "manifest.json").read_bytes()
    (vdir / "manifest.json").write_bytes(text.replace(b'"extensions":{}',
                                                      b'"extensions":{"n":' + token + b"}"))
    expect_code("PCK-JSON-INVALID", portable_ckpt.open, vdir)


def test_nesting_limit_is_64(tmp_path: Path) -> None:
    """R-SEC-10: depth 64 (top level counts 1) is accepted; 65 is PCK-JSON-INVALID."""
    vdir, _ = build_version(tmp_path)
    rel = read_manifest(vdir)["entries"]["cfg"]["values"][0]["file"]
    rewrite_file(vdir, rel, b"[" * 64 + b"]" * 64)
    assert portable_ckpt.open(vdir).entry("cfg") is not None
    rewrite_file(vdir, rel, b"[" * 32 + b"{\"a\":" * 33 + b"1" + b"}" * 33 + b"]" * 32)
    expect_code("PCK-JSON-INVALID", portable_ckpt.open(vdir).entry, "cfg")
    rewrite_file(vdir, rel, b"[" * 65 + b"]" * 65)
    expect_code("PCK-JSON-INVALID", portable_ckpt.open(vdir).entry, "cfg")
    rewrite_file(vdir, rel, b"[" * 100000 + b"]" * 100000)
    expect_code("PCK-JSON-INVALID", portable_ckpt.open(vdir).entry, "cfg")
    text = (vdir / "manifest.json").read_bytes()
    deep = b"[" * 63 + b"]" * 63  # inside `extensions` (depth 2): 65 in total
    text = text.replace(b'"extensions": {}', b'"extensions":{}')
    assert b'"extensions":{}' in text
    (vdir / "manifest.json").write_bytes(text.replace(b'"extensions":{}',
                                                      b'"extensions":{"d":' + deep + b"}"))
    expect_code("PCK-JSON-INVALID", portable_ckpt.open, vdir)


def _sparse(path: Path, size: int, head: bytes) -> None:
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)


def test_oversized_manifest_rejected_before_reading(tmp_path: Path) -> None:
    """R-SEC-11: a manifest.json above 1 GiB is refused before it is read in full."""
    vdir, _ = build_version(tmp_path)
    _sparse(vdir / "manifest.json", (1 << 30) + 1, b"{")
    expect_code("PCK-JSON-INVALID", portable_ckpt.open, vdir)


def test_oversized_manifest_is_refused_without_reading(tmp_path: Path) -> None:
    """R-SEC-11: whatever the code, the 1 GiB + 1 manifest is refused without being read."""
    import tracemalloc

    vdir, _ = build_version(tmp_path)
    _sparse(vdir / "manifest.json", (1 << 30) + 1, b"{")
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError):
            portable_ckpt.open(vdir)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_oversized_entry_value_rejected_before_reading(tmp_path: Path) -> None:
    """R-SEC-11: an entry value above 64 MiB is PCK-JSON-INVALID before it is read in full."""
    vdir, _ = build_version(tmp_path)
    rel = read_manifest(vdir)["entries"]["cfg"]["values"][0]["file"]
    size = (64 << 20) + 1
    _sparse(vdir / rel, size, b"[")
    edit_manifest(vdir, lambda d: d["files"][rel].update(
        size=size, checksum={"algorithm": "crc32c", "block_size": 1 << 30, "blocks": "0" * 8}))
    expect_code("PCK-JSON-INVALID", portable_ckpt.open(vdir).entry, "cfg")


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


def test_no_pickle_anywhere() -> None:
    """R-SEC-12: no pickle (or other object-constructing deserialiser) in the implementation."""
    banned_modules = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve",
                      "joblib", "yaml"}
    problems = []
    for path in sorted((ROOT / "src" / "portable_ckpt").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                names = {(node.module or "").split(".")[0]}
            else:
                continue
            if names & banned_modules:
                problems.append(f"{path.name}: imports {sorted(names & banned_modules)}")
        for call in _calls(tree):
            fn = ast.unparse(call.func)
            kw = {k.arg: ast.unparse(k.value) for k in call.keywords}
            if fn.endswith("torch.load") or (fn == "load" and "weights_only" in kw):
                if kw.get("weights_only") != "True":
                    problems.append(f"{path.name}:{call.lineno}: {fn} without weights_only=True")
            if fn.endswith(("np.load", "numpy.load")) and kw.get("allow_pickle") != "False":
                problems.append(f"{path.name}:{call.lineno}: {fn} may unpickle")
            if fn.endswith(("pickletools.dis",)) is False and "Unpickler" in fn:
                problems.append(f"{path.name}:{call.lineno}: {fn}")
    assert not problems, problems


@pytest.mark.parametrize("token", [str(_INT_OVERFLOW - 1), "-" + str(_INT_OVERFLOW - 1),
                                   str(2**64), str(-(2**63))])
def test_integers_inside_the_double_range_are_exact(tmp_path: Path, token: str) -> None:
    """R-SEC-9, R-ENTRY-5: an integer token a double holds is read exactly (no rounding)."""
    vdir, _ = build_version(tmp_path, step=2)
    rel = read_manifest(vdir)["entries"]["cfg"]["values"][0]["file"]
    rewrite_file(vdir, rel, ('{"v": ' + token + "}").encode())
    assert portable_ckpt.open(vdir).entry("cfg") == {"v": int(token)}


def test_integer_verdict_does_not_depend_on_python_settings(tmp_path: Path) -> None:
    """R-SEC-9: with Python's digit limit off, a 5,001-digit integer is still refused."""
    vdir, _ = build_version(tmp_path, step=2)
    text = (vdir / "manifest.json").read_bytes().replace(b'"extensions": {}', b'"extensions":{}')
    (vdir / "manifest.json").write_bytes(
        text.replace(b'"extensions":{}', b'"extensions":{"n":' + b"7" * 5001 + b"}")
    )
    code = (
        "import sys, portable_ckpt\n"
        "sys.set_int_max_str_digits(0)\n"
        "try:\n    portable_ckpt.open(sys.argv[1])\n"
        "except portable_ckpt.CheckpointError as e:\n    print(e.code)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(vdir)], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONINTMAXSTRDIGITS": "0"})
    assert out.stdout.strip() == "PCK-JSON-INVALID"


@pytest.mark.parametrize(
    ("edit", "code"),
    [
        (lambda m: m.__setitem__("step", float(m["step"])), "PCK-SCHEMA"),
        (lambda m: m["continuation"].__setitem__("world_size", 1.0), "PCK-SCHEMA"),
        (lambda m: next(iter(m["files"].values())).__setitem__(
            "size", float(next(iter(m["files"].values()))["size"])), "PCK-SCHEMA"),
        (lambda m: next(iter(m["tensors"].values()))["ranges"][0].__setitem__(
            "offsets", [0.0] * len(next(iter(m["tensors"].values()))["shape"])), "PCK-SCHEMA"),
    ],
    ids=["step", "world_size", "size", "offsets"],
)
def test_integer_members_are_integer_tokens(tmp_path: Path, edit: Any, code: str) -> None:
    """R-SEC-18: ``42.0`` is not an integer in a format document (draft 2020-12 would say it is)."""
    vdir, _ = build_version(tmp_path, step=2)
    edit_manifest(vdir, edit)
    assert b".0" in (vdir / "manifest.json").read_bytes()
    expect_code(code, portable_ckpt.open, vdir)


def test_the_conformance_suite_knows_every_code() -> None:
    """Maintainer review 5, 10: the suite's list of codes lacked PCK-VERIFICATION-FAILED; it is
    the spec's §17.1 table, no more and no less."""
    from conformance.spec import CODES

    assert sorted(CODES) == sorted(_spec_codes())
