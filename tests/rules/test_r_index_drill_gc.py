"""Writer indexes, drill and copy records (§14) and garbage collection (§15)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.format.manifest import Continuation, WriterIndex
from portable_ckpt.format.naming import new_attempt_id
from portable_ckpt.format.schemas import validate_document
from portable_ckpt.io.annotations import write_drill_record
from portable_ckpt.io.commit import commit
from portable_ckpt.io.writer import ShardWriter
from portable_ckpt.storage import open_storage

from ._trace import trace_posix
from ._util import RecordingStorage, build_version, expect_code, open_recorded, read_manifest


def _writers(root: Path, n: int, step: int = 1) -> tuple[Any, str, list[ShardWriter]]:
    storage = open_storage(root, create=True)
    attempt = new_attempt_id(step)
    return storage, attempt, [ShardWriter(storage, attempt, w) for w in range(n)]


def test_one_index_per_writer_after_its_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """R-INDEX-1: each writer writes exactly one index/w<writer:05d>.json, after its files."""
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    numbers = [0, 7, 12345, 123456]
    ws = [ShardWriter(storage, attempt, n) for n in numbers]
    for i, w in enumerate(ws):
        w.add_tensor("t", np.ones((1, 3), np.float32), offsets=[i, 0], global_shape=[4, 3])
    log = trace_posix(monkeypatch)
    idx = [w.finish() for w in ws]
    monkeypatch.undo()
    names = sorted(p.name for p in (tmp_path / attempt / "index").iterdir())
    assert names == ["w00000.json", "w00007.json", "w12345.json", "w123456.json"]
    for n in numbers:
        created = log.index("open", lambda p, n=n: p.endswith(f"index/w{n:05d}.json"))
        data_fsync = log.index("fsync", lambda p, n=n: f"data/w{n:05d}-" in p)
        assert data_fsync < created
    commit(storage, attempt, step=1, expected_writers=numbers)
    assert {i.writer for i in idx} == set(numbers)


def test_index_lists_own_files_tensors_and_entries(tmp_path: Path) -> None:
    """R-INDEX-2: an index lists its files (size, checksum), its ranges only, its values only."""
    storage, attempt, ws = _writers(tmp_path, 2)
    ws[0].add_tensor("t", np.ones((2, 3), np.float32), offsets=[0, 0], global_shape=[4, 3])
    ws[1].add_tensor("t", np.ones((2, 3), np.float32), offsets=[2, 0], global_shape=[4, 3])
    ws[0].declare_tensor("z", "int8", [0, 5])
    for r, w in enumerate(ws):
        w.add_entry("rng", {"r": r}, scope="per_rank", rank=r, world_size_policy="modulo")
    ws[1].add_entry("cfg", {"k": 1})
    for w in ws:
        w.finish()
    vdir = tmp_path / attempt
    for n in (0, 1):
        doc = json.loads((vdir / "index" / f"w{n:05d}.json").read_text())
        validate_document(doc, "writer-index.schema.json", what="index")
        own = {str(p.relative_to(vdir)) for p in vdir.rglob("*") if p.is_file()
               and (f"w{n:05d}-" in p.name or f".r{n:05d}." in p.name or
                    (n == 1 and ".g." in p.name))}
        assert set(doc["files"]) == own
        for rel, rec in doc["files"].items():
            assert rec["size"] == (vdir / rel).stat().st_size
        assert [r["offsets"] for r in doc["tensors"]["t"]["ranges"]] == [[2 * n, 0]]
        assert all(r["file"] in doc["files"] for r in doc["tensors"]["t"]["ranges"])
        assert [v["rank"] for v in doc["entries"]["rng"]["values"]] == [n]
        assert doc["entries"]["rng"]["world_size_policy"] == "modulo"
    assert json.loads((vdir / "index/w00000.json").read_text())["tensors"]["z"] == {
        "dtype": "int8", "shape": [0, 5], "ranges": []}
    commit(storage, attempt, step=1, expected_writers=[0, 1],
           continuation=Continuation("exact", 2, None))


def _index_on_disk(tmp_path: Path, fn: Any) -> tuple[Any, str]:
    storage, attempt, ws = _writers(tmp_path, 2)
    ws[0].add_tensor("t", np.ones(3, np.float32))
    for w in ws:
        w.finish()
    p = tmp_path / attempt / "index" / "w00001.json"
    doc = json.loads(p.read_text())
    fn(doc)
    p.write_text(json.dumps(doc))
    return storage, attempt


@pytest.mark.parametrize("source", ["storage", "memory"])
def test_index_of_another_attempt_is_attempt_id_error(tmp_path: Path, source: str) -> None:
    """R-INDEX-3: an index whose attempt_id differs from the attempt is PCK-ATTEMPT-ID."""
    other = new_attempt_id(1)
    storage, attempt = _index_on_disk(tmp_path, lambda d: d.__setitem__("attempt_id", other))
    if source == "storage":
        expect_code("PCK-ATTEMPT-ID", commit, storage, attempt, step=1, expected_writers=[0, 1])
    else:
        docs = [json.loads((tmp_path / attempt / f"index/w0000{n}.json").read_text())
                for n in (0, 1)]
        expect_code("PCK-ATTEMPT-ID", commit, storage, attempt, step=1,
                    indexes=[WriterIndex.from_json(d) for d in docs], expected_writers=[0, 1])
    assert not (tmp_path / attempt / "manifest.json").exists()


def test_index_writer_must_match_its_file_name(tmp_path: Path) -> None:
    """R-INDEX-3: an index whose writer differs from its file name is PCK-SCHEMA."""
    storage, attempt = _index_on_disk(tmp_path, lambda d: d.__setitem__("writer", 2))
    expect_code("PCK-SCHEMA", commit, storage, attempt, step=1, expected_writers=[0, 1])
    assert not (tmp_path / attempt / "manifest.json").exists()


def _conflict(tmp_path: Path, kind: str) -> tuple[Any, str, list[WriterIndex]]:
    storage, attempt, ws = _writers(tmp_path, 2)
    if kind == "dtype":
        ws[0].add_tensor("t", np.ones(2, np.float32), offsets=[0], global_shape=[4])
        ws[1].add_tensor("t", np.ones(2, np.int32), offsets=[2], global_shape=[4])
    elif kind == "shape":
        ws[0].add_tensor("t", np.ones(2, np.float32), offsets=[0], global_shape=[4])
        ws[1].add_tensor("t", np.ones(2, np.float32), offsets=[2], global_shape=[5])
    elif kind in ("schema", "scope", "policy", "encoding"):
        kw0: dict[str, Any] = {"scope": "per_rank", "rank": 0, "world_size_policy": "modulo"}
        kw1 = dict(kw0, rank=1)
        if kind == "policy":
            kw1["world_size_policy"] = "drop"
        if kind == "encoding":
            kw1["compress"] = True
        if kind == "scope":
            kw1 = {}
        ws[0].add_entry("e", 1, **kw0)
        ws[1].add_entry("e", 1, schema="pck:step/1" if kind == "schema" else "pck:json/1",
                        **kw1) if kind != "schema" else ws[1].add_entry(
                            "e", {"step": 1}, schema="pck:step/1", **kw1)
    if kind == "file":
        ws[0].add_tensor("t", np.ones(2, np.float32))
    idx = [w.finish() for w in ws]
    if kind == "file":
        doc = idx[1].to_json()
        doc["files"].update(idx[0].to_json()["files"])
        idx[1] = WriterIndex.from_json(doc)
    if kind in ("global_value", "rank_value"):
        d0, d1 = idx[0].to_json(), idx[1].to_json()
        for d, n in ((d0, 0), (d1, 1)):
            f = f"entries/e-{n}.json"
            (tmp_path / attempt / f).parent.mkdir(exist_ok=True)
            (tmp_path / attempt / f).write_text("1")
            d["files"][f] = {"size": 1, "checksum": {"algorithm": "crc32c", "block_size": 4096,
                                                     "blocks": "90f599e3"}}
            decl: dict[str, Any] = {"schema": {"id": "pck:json/1"}, "encoding": "json"}
            if kind == "global_value":
                decl.update(scope="global", values=[{"file": f}])
            else:
                decl.update(scope="per_rank", world_size_policy="modulo",
                            values=[{"rank": 0, "file": f}])
            d["entries"]["e"] = decl
        idx = [WriterIndex.from_json(d0), WriterIndex.from_json(d1)]
    return storage, attempt, idx


@pytest.mark.parametrize("kind", [
    "dtype", "shape", "schema", "scope", "policy", "encoding", "file",
    pytest.param("global_value"),
    pytest.param("rank_value"),
])
def test_conflicting_indexes_are_metadata_conflicts(tmp_path: Path, kind: str) -> None:
    """R-INDEX-4: disagreements between indexes make the commit fail with PCK-METADATA-CONFLICT."""
    storage, attempt, idx = _conflict(tmp_path, kind)
    expect_code("PCK-METADATA-CONFLICT", commit, storage, attempt, step=1, indexes=idx,
                expected_writers=[0, 1], continuation=Continuation("exact", 2, None))
    assert not (tmp_path / attempt / "manifest.json").exists()


def test_reader_never_needs_writer_indexes(tmp_path: Path) -> None:
    """R-INDEX-5: a version is opened and read without reading any writer index."""
    vdir, m = build_version(tmp_path)
    st, ck = open_recorded(tmp_path, m.attempt_id)
    for k in ck.tensors:
        ck.read(k)
    ck.entry("cfg")
    assert st.reads() and not [p for p, *_ in st.reads() if "/index/" in p]
    for p in (vdir / "index").iterdir():
        p.unlink()
    ck2 = portable_ckpt.open(vdir)
    np.testing.assert_array_equal(ck2.read("a"), np.arange(64, dtype=np.float32).reshape(8, 8))
    assert ck2.entry("cfg") == {"x": 1}


def _drill_record(ok: bool = True, **kw: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"ok": ok, "started_at": "2030-01-01T00:00:00Z",
                           "finished_at": "2030-01-01T00:00:01Z", "world_size": 1,
                           "saved_world_size": 1, "contract": "exact", "measurements": {},
                           "error": None if ok else {"code": "PCK-CHECKSUM", "message": "x"}}
    rec.update(kw)
    return rec


def test_drill_record_is_created_once_and_never_modified(tmp_path: Path) -> None:
    """R-DRILL-1: drills/<drill_id>.json, create-if-absent, never modified."""
    vdir, m = build_version(tmp_path)
    storage = open_storage(tmp_path)
    rel = write_drill_record(storage, m.attempt_id, _drill_record())
    path = tmp_path / rel
    doc = json.loads(path.read_text())
    assert rel == f"{m.attempt_id}/drills/{doc['drill_id']}.json"
    validate_document(doc, "drill.schema.json", what=rel)
    before = (path.read_bytes(), path.stat().st_ino)
    with pytest.raises(portable_ckpt.CheckpointError):
        write_drill_record(storage, m.attempt_id, _drill_record(ok=False,
                                                                drill_id=doc["drill_id"]))
    assert (path.read_bytes(), path.stat().st_ino) == before


def test_annotations_never_edit_the_manifest(tmp_path: Path) -> None:
    """R-DRILL-2: drill and copy records are added without touching manifest.json."""
    from portable_ckpt.io.copy import copy_version

    vdir, m = build_version(tmp_path / "src")
    man = vdir / "manifest.json"
    before = (man.read_bytes(), man.stat().st_ino, man.stat().st_mtime_ns)
    write_drill_record(open_storage(tmp_path / "src"), m.attempt_id, _drill_record())
    res = copy_version(vdir, tmp_path / "dst")
    assert res.record is not None
    assert (man.read_bytes(), man.stat().st_ino, man.stat().st_mtime_ns) == before
    assert (tmp_path / "dst" / m.attempt_id / "manifest.json").read_bytes() == before[0]


def test_drill_of_a_damaged_version_is_not_ok(tmp_path: Path) -> None:
    """R-DRILL-3: ok: true is only written after every tensor and entry loaded with checksums."""
    pytest.importorskip("torch")
    from portable_ckpt.torch.drill import drill

    m = portable_ckpt.save_arrays(tmp_path, {"w": np.arange(4096, dtype=np.float32)}, step=2,
                                  entries={"cfg": {"a": 1}})
    vdir = tmp_path / m.attempt_id
    f = next((vdir / "data").iterdir())
    with open(f, "r+b") as fh:
        fh.seek(-3, os.SEEK_END)
        fh.write(b"\x7f")
    out = drill(str(vdir), 1, timeout=120)
    assert out["ok"] is False and out["error"]["code"] == "PCK-CHECKSUM"
    recs = [json.loads(p.read_text()) for p in (vdir / "drills").iterdir()]
    assert [r["ok"] for r in recs] == [False]
    assert not portable_ckpt.list_versions(tmp_path)[0].drilled


def _drilled(root: Path, attempt: str) -> bool:
    [v] = [v for v in portable_ckpt.list_versions(root) if v.id == attempt]
    return v.drilled


def test_only_valid_own_ok_drill_records_count(tmp_path: Path) -> None:
    """R-DRILL-4: ok: false and records naming another attempt do not make a version drilled."""
    vdir, m = build_version(tmp_path)
    storage = open_storage(tmp_path)
    write_drill_record(storage, m.attempt_id, _drill_record(ok=False))
    assert not _drilled(tmp_path, m.attempt_id)
    other = dict(_drill_record(), format="portable-ckpt-drill", format_version="1.0",
                 attempt_id=new_attempt_id(1), drill_id="d20300101T000000000000Z-0000abcd")
    (vdir / "drills" / "d20300101T000000000000Z-0000abcd.json").write_text(json.dumps(other))
    assert not _drilled(tmp_path, m.attempt_id)
    write_drill_record(storage, m.attempt_id, _drill_record())
    assert _drilled(tmp_path, m.attempt_id)


@pytest.mark.parametrize("spoil", ["name", "schema"])
def test_invalid_or_misfiled_drill_records_do_not_count(tmp_path: Path, spoil: str) -> None:
    """R-DRILL-4: a record that does not validate or is not stored under its drill_id is ignored."""
    vdir, m = build_version(tmp_path)
    rec = dict(_drill_record(), format="portable-ckpt-drill", format_version="1.0",
               attempt_id=m.attempt_id, drill_id="d20300101T000000000000Z-0000abcd")
    name = "d20300101T000000000000Z-0000abcd.json"
    if spoil == "name":
        name = "d20300101T000000000000Z-ffffffff.json"
    else:
        del rec["started_at"]
    (vdir / "drills").mkdir()
    (vdir / "drills" / name).write_text(json.dumps(rec))
    assert not _drilled(tmp_path, m.attempt_id)


def test_copy_keeps_id_copies_files_first_and_publishes_atomically(tmp_path: Path) -> None:
    """R-DRILL-5: same attempt id; every listed file before the manifest; create-if-absent."""
    from portable_ckpt.io.copy import copy_version

    vdir, m = build_version(tmp_path / "src")
    dst = RecordingStorage(tmp_path / "dst", create=True)
    copy_version(vdir, dst)
    creates = [(op, p) for op, p, *_ in dst.ops if op in ("create", "create_if_absent")]
    assert creates[-1] == ("create_if_absent", f"{m.attempt_id}/manifest.json")
    copied = {p for op, p in creates[:-1]}
    assert copied == {f"{m.attempt_id}/{rel}" for rel in read_manifest(vdir)["files"]}
    assert portable_ckpt.open(tmp_path / "dst").id == m.attempt_id
    assert (tmp_path / "dst" / m.attempt_id / "manifest.json").read_bytes() == (
        vdir / "manifest.json").read_bytes()


def test_copy_makes_its_files_durable_before_the_destination_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """R-COMMIT-17 for a copy (R-DRILL-5): every copied file and every directory holding a new
    name is fsynced before the destination's manifest.json is linked."""
    from portable_ckpt.io.copy import copy_version

    vdir, m = build_version(tmp_path / "src")
    log = trace_posix(monkeypatch)
    copy_version(vdir, tmp_path / "dst")
    monkeypatch.undo()
    ddir = tmp_path / "dst" / m.attempt_id
    i_link = log.index("link", lambda p: p.endswith(f" -> {ddir}/manifest.json"))
    synced = {p for c, p, _ in log.events[:i_link] if c == "fsync"}
    for rel in read_manifest(vdir)["files"]:
        f = ddir / rel
        assert str(f) in synced, f"{rel}: copied data not fsynced before the record"
        assert str(f.parent) in synced, f"{rel}: its name not made durable before the record"
    assert str(ddir) in synced and str(tmp_path / "dst") in synced


def test_copy_record_only_after_verified_copy(tmp_path: Path) -> None:
    """R-DRILL-6: copies/<copy_id>.json, create-if-absent; no ok record for a failed copy."""
    from portable_ckpt.io.copy import copy_version

    vdir, m = build_version(tmp_path / "src")
    res = copy_version(vdir, tmp_path / "dst")
    rec_path = tmp_path / "src" / res.record  # type: ignore[operator]
    rec = json.loads(rec_path.read_text())
    assert rec_path.name == f"{rec['copy_id']}.json" and rec["ok"] is True
    validate_document(rec, "copy.schema.json", what=str(rec_path))
    # A corrupt source: nothing published, no ok record.
    vdir2, m2 = build_version(tmp_path / "src", step=2)
    f = next((vdir2 / "data").iterdir())
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(portable_ckpt.CheckpointError):
        copy_version(vdir2, tmp_path / "dst")
    assert not (vdir2 / "copies").exists()
    assert not (tmp_path / "dst" / m2.attempt_id / "manifest.json").exists()


def test_copy_onto_damaged_destination_is_not_ok(tmp_path: Path) -> None:
    """R-DRILL-6: ok: true needs every destination file checked against size AND checksum."""
    from portable_ckpt.io.copy import copy_version

    vdir, m = build_version(tmp_path / "src")
    copy_version(vdir, tmp_path / "dst", record=False)
    f = next((tmp_path / "dst" / m.attempt_id / "data").iterdir())
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    try:
        res = copy_version(vdir, tmp_path / "dst")
    except portable_ckpt.CheckpointError:
        res = None
    recs = [json.loads(p.read_text()) for p in (vdir / "copies").glob("*.json")] if (
        vdir / "copies").exists() else []
    assert not [r for r in recs if r["ok"] is True], res


def _versions(root: Path, steps: list[int]) -> list[str]:
    return [build_version(root, step=s)[1].attempt_id for s in steps]


def _alive(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if (p / "manifest.json").exists()}


def test_gc_keeps_the_keep_greatest_versions(tmp_path: Path) -> None:
    """R-GC-1: the `keep` greatest versions in the order of §3 are never deleted."""
    ids = _versions(tmp_path, [5, 1, 9, 3, 9, 7])
    order = [v.id for v in portable_ckpt.list_versions(tmp_path)]
    for keep in (3, 2):
        rep = portable_ckpt.gc(tmp_path, keep=keep, grace_seconds=0)
        assert set(order[-keep:]) <= _alive(tmp_path)
        # Step 7 was committed after the latest (the second 9): a rollback's branch, kept too.
        assert rep.newer_branch == [ids[5]]
        assert _alive(tmp_path) == set(order[-keep:]) | {ids[5]}
    assert set(ids) >= _alive(tmp_path)


def test_versions_of_one_step_are_ordered_by_commit_time_not_start_time(tmp_path: Path) -> None:
    """mutation audit 22 A-76: within a step, versions are ordered by commit time before their
    id (R-ID-4): an attempt that started first but committed last is the newest, what
    list_versions ends with and what gc --keep 1 keeps."""
    import datetime as dt

    storage = open_storage(tmp_path, create=True)
    t0 = dt.datetime.now(dt.UTC)
    first = new_attempt_id(4, now=t0 - dt.timedelta(seconds=10))  # started first ...
    second = new_attempt_id(4, now=t0)
    assert first < second
    idx = {}
    for a in (first, second):
        w = ShardWriter(storage, a, 0)
        w.add_tensor("t", np.full((2, 2), float(a == first), np.float32))
        idx[a] = w.finish()
    for a in (second, first):  # ... committed last
        commit(storage, a, step=4, indexes=[idx[a]], expected_writers=[0],
               continuation=Continuation("exact", 1, None))
        time.sleep(0.002)
    vs = portable_ckpt.list_versions(tmp_path)
    assert [v.id for v in vs] == [second, first]
    assert portable_ckpt.open(tmp_path).id == first
    portable_ckpt.gc(tmp_path, keep=1, grace_seconds=0)
    assert first in _alive(tmp_path)


def test_gc_protects_the_newest_drilled_version(tmp_path: Path) -> None:
    """R-GC-2: the newest drilled version survives until a newer one is drilled."""
    ids = _versions(tmp_path, [1, 2, 3, 4])
    storage = open_storage(tmp_path)
    write_drill_record(storage, ids[1], _drill_record())
    write_drill_record(storage, ids[2], _drill_record(ok=False))
    portable_ckpt.gc(tmp_path, keep=1)
    assert _alive(tmp_path) == {ids[1], ids[3]}
    write_drill_record(storage, ids[3], _drill_record())
    portable_ckpt.gc(tmp_path, keep=1)
    assert _alive(tmp_path) == {ids[3]}
    # No drilled version at all: the newest one is kept.
    root2 = tmp_path / "r2"
    ids2 = _versions(root2, [1, 2])
    portable_ckpt.gc(root2, keep=1)
    assert _alive(root2) == {ids2[1]}


@pytest.mark.parametrize("left", ["empty directories", "a data file"])
def test_records_and_nothing_else_count_files_not_directories(tmp_path: Path, left: str) -> None:
    """§15.1 (errata 19; spec implementer 25, 2): an attempt without commit record that holds
    records and nothing else is incomplete; directories left empty (a disk's, which an object
    store never shows) are not "anything else". A file is: the attempt is then invalid, kept."""
    ids = _versions(tmp_path, [1, 2])
    write_drill_record(open_storage(tmp_path), ids[0], _drill_record())
    v = tmp_path / ids[0]
    (v / "manifest.json").unlink()
    for p in sorted(v.rglob("*"), reverse=True):
        if p.is_file() and p.parent.name not in ("drills",):
            if not (left == "a data file" and p.parent.name == "data"):
                p.unlink()
    assert (v / "data").is_dir() and (v / "index").is_dir()
    status = next(x.status for x in portable_ckpt.list_versions(tmp_path) if x.id == ids[0])
    report = portable_ckpt.gc(tmp_path, keep=1, grace_seconds=0)
    if left == "empty directories":
        assert status == "incomplete" and ids[0] in report.abandoned and not v.exists()
    else:
        assert status == "invalid" and [d["id"] for d in report.damaged] == [ids[0]]
        assert v.exists()


def test_gc_keeps_versions_that_did_not_fail_verification(tmp_path: Path) -> None:
    """R-GC-9: a version that failed verification takes no place of the `keep` newest and no
    protection: `gc --keep 1` used to keep only it (never restorable) and delete the rest."""
    from portable_ckpt.io.annotations import write_verification_record

    ids = _versions(tmp_path, [10, 20, 30])
    bad = [{"code": "PCK-CHECKSUM", "message": "block 0"}]
    write_verification_record(open_storage(tmp_path), ids[2], ok=False, mode="deep",
                              fraction=None, chunks=1, errors=bad)
    report = portable_ckpt.gc(tmp_path, keep=1)
    # R-GC-1/R-GC-2 keep the failed newest; R-GC-9 keeps the newest that can be restored
    assert _alive(tmp_path) == {ids[1], ids[2]} and report.deleted == [ids[0]]
    write_verification_record(open_storage(tmp_path), ids[1], ok=False, mode="deep",
                              fraction=None, chunks=1, errors=bad)
    portable_ckpt.gc(tmp_path, keep=1)
    assert _alive(tmp_path) == {ids[2]}  # nothing restorable is left to keep


def test_gc_keeps_the_keep_greatest_versions_that_did_not_fail(tmp_path: Path) -> None:
    """R-GC-9 with keep >= 2: gc keeps the `keep` greatest versions that did not fail
    verification, besides the `keep` greatest of all. Test audit 21, finding 3: with keep=1
    the newest good version is also R-GC-2's protected one, so dropping R-GC-9 went unseen."""
    from portable_ckpt.io.annotations import write_verification_record

    bad = [{"code": "PCK-CHECKSUM", "message": "block 0"}]
    for root, steps, failed in [(tmp_path / "a", [10, 20, 30, 40], 1),
                                (tmp_path / "b", [10, 20, 30, 40, 50], 2)]:
        ids = _versions(root, steps)
        for v in ids[-failed:]:
            write_verification_record(open_storage(root), v, ok=False, mode="deep",
                                      fraction=None, chunks=1, errors=bad)
        report = portable_ckpt.gc(root, keep=2)
        # a: the 2 greatest (40 failed, 30) and the 2 greatest good (30, 20): 10 goes.
        # b: the 2 greatest (50, 40 both failed) and the 2 greatest good (30, 20): 10 goes.
        assert _alive(root) == set(ids[1:]), report.to_json()
        assert report.deleted == [ids[0]], report.to_json()
        assert report.failed_verification == ids[-failed:][::-1]


def test_gc_deletes_the_manifest_first(tmp_path: Path) -> None:
    """R-GC-3: a version's manifest.json is deleted before any of its other files."""
    ids = _versions(tmp_path, [1, 2, 3])
    write_drill_record(open_storage(tmp_path), ids[0], _drill_record())
    write_drill_record(open_storage(tmp_path), ids[0], _drill_record())
    # Make the drill protection move on, so ids[0] (with drill records) is deleted too.
    write_drill_record(open_storage(tmp_path), ids[2], _drill_record())
    bad = build_version(tmp_path, step=9)[0]
    (bad / "manifest.json").write_text("{invalid")
    st = RecordingStorage(tmp_path)
    portable_ckpt.gc(st, keep=1, grace_seconds=0, now=lambda: time.time() + 10**6,
                     delete_invalid=True)
    for attempt in (ids[0], ids[1], bad.name):
        deletes = [p for op, p, *_ in st.ops if op == "delete" and p.startswith(attempt + "/")]
        assert deletes and deletes[0] == f"{attempt}/manifest.json", deletes[:3]
        assert not (tmp_path / attempt).exists()
    assert _alive(tmp_path) == {ids[2]}


def test_gc_grace_period_for_uncommitted_attempts(tmp_path: Path) -> None:
    """R-GC-4: attempts without a commit record survive until the grace period passes, and so
    do those with an invalid one that gc was asked to delete (R-GC-10)."""
    storage = open_storage(tmp_path, create=True)
    old_id = new_attempt_id(1)
    old_id = "s000000000001-20000101T000000000000Z-" + old_id[-16:]  # created long ago...
    w = ShardWriter(storage, old_id, 0)
    w.add_tensor("t", np.ones(2, np.float32))
    w.finish()  # ...but written to just now
    invalid = build_version(tmp_path, step=3)[0]
    (invalid / "manifest.json").write_text("{}")
    keep_id = build_version(tmp_path, step=2)[1].attempt_id
    now = time.time()
    for t in (now, now + 3000):
        portable_ckpt.gc(tmp_path, keep=1, grace_seconds=3600, now=lambda t=t: t, delete_invalid=True)
        assert (tmp_path / old_id).exists() and invalid.exists()
    report = portable_ckpt.gc(tmp_path, keep=1, grace_seconds=3600, now=lambda: now + 3700,
                              delete_invalid=True)
    assert set(report.abandoned) == {old_id, invalid.name}
    assert not (tmp_path / old_id).exists() and not invalid.exists()
    assert (tmp_path / keep_id / "manifest.json").exists()
    assert inspect_default_grace() == [3600.0] * 3


def inspect_default_grace() -> list[float]:
    """The default of the library's gc, the manager and the CLI: the spec's one value (a change
    made in one of them left the others deleting sooner, every test green; maintainer review)."""
    import inspect

    from portable_ckpt.cli.main import build_parser
    from portable_ckpt.torch.manager import CheckpointManager

    parser = build_parser()
    gc_cmd = next(a for a in parser._actions if a.dest == "command").choices["gc"]  # type: ignore[union-attr]
    return [
        float(inspect.signature(portable_ckpt.gc).parameters["grace_seconds"].default),
        float(inspect.signature(CheckpointManager).parameters["grace_seconds"].default),
        float(gc_cmd.get_default("grace")),
    ]


def test_gc_touches_nothing_outside_removed_attempts(tmp_path: Path) -> None:
    """R-GC-5: non-attempt children of the root and targets of links are never deleted."""
    root = tmp_path / "root"
    ids = _versions(root, [1, 2])
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"precious")
    (root / ids[0] / "link-out").symlink_to(outside)
    (root / "notes").mkdir()
    (root / "notes" / "manifest.json").write_text("{}")
    (root / "s000000000001-not-an-attempt").mkdir()
    (root / "s000000000001-not-an-attempt" / "x").write_text("x")
    (root / "README").write_text("r")
    abandoned = "s000000000000-20000101T000000000000Z-0123456789abcdef"
    (root / abandoned).mkdir()
    (root / abandoned / "f").write_text("f")
    os.utime(root / abandoned / "f", (0, 0))
    portable_ckpt.gc(root, keep=1, grace_seconds=0)
    assert outside.read_bytes() == b"precious"
    assert (root / "notes" / "manifest.json").exists()
    assert (root / "s000000000001-not-an-attempt" / "x").exists()
    assert (root / "README").exists()
    assert not (root / abandoned).exists()
    assert (root / ids[1] / "manifest.json").exists()


def test_gc_leaves_attempts_it_could_not_classify(tmp_path: Path) -> None:
    """R-GC-6: a storage error while classifying is never absence; the attempt is reported."""
    from portable_ckpt.storage.faults import Fault, FaultyStorage

    ids = _versions(tmp_path, [1, 2])
    bare = new_attempt_id(3)
    (tmp_path / bare).mkdir()
    (tmp_path / bare / "x").write_text("x")
    faults = [Fault(op="read", path=f"{ids[1]}/manifest.json"),
              Fault(op="exists", path=f"{bare}/manifest.json")]
    st = FaultyStorage(open_storage(tmp_path), faults)
    report = portable_ckpt.gc(st, keep=1, grace_seconds=0, now=lambda: time.time() + 10**6)
    assert not report.complete
    assert {u["id"] for u in report.unknown} == {ids[1], bare}
    assert {u["code"] for u in report.unknown} == {"PCK-STORAGE"}
    assert (tmp_path / ids[1] / "manifest.json").exists() and (tmp_path / bare / "x").exists()
    assert report.deleted == [] and report.abandoned == []  # ids[0] is the newest readable one


def test_gc_never_deletes_or_counts_foreign_versions(tmp_path: Path) -> None:
    """R-GC-7: a foreign version is kept, not abandoned, and takes no place among `keep`."""
    ids = _versions(tmp_path, [1, 2, 3, 4])
    doc = json.loads((tmp_path / ids[3] / "manifest.json").read_text())
    doc["format_version"] = "3.0"
    (tmp_path / ids[3] / "manifest.json").write_text(json.dumps(doc))
    report = portable_ckpt.gc(tmp_path, keep=2, grace_seconds=0, now=lambda: time.time() + 10**6)
    assert report.foreign == [ids[3]] and report.abandoned == []
    assert report.kept == [ids[2], ids[1]] and report.deleted == [ids[0]]
    assert _alive(tmp_path) == {ids[1], ids[2], ids[3]}
