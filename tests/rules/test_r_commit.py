"""Commit record and publish protocol (§4, §5)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.format.manifest import Continuation, WriterIndex
from portable_ckpt.format.naming import new_attempt_id
from portable_ckpt.io.commit import commit
from portable_ckpt.io.writer import ShardWriter
from portable_ckpt.storage import LocalStorage, open_storage
from portable_ckpt.storage.base import Capabilities

from ._trace import trace_posix
from ._util import (
    build_version,
    edit_manifest,
    expect_code,
    open_and_read_all,
    read_manifest,
)


def _two_writers(root: Path, *, step: int = 1) -> tuple[Any, str, list[ShardWriter]]:
    storage = open_storage(root, create=True)
    attempt = new_attempt_id(step)
    return storage, attempt, [ShardWriter(storage, attempt, w, block_size=4096) for w in (0, 1)]


def _nothing_published(root: Path, attempt: str) -> None:
    vdir = root / attempt
    assert not (vdir / "manifest.json").exists()
    assert not list(vdir.glob("manifest.json*")), "a temporary commit record was left behind"
    assert not [v for v in portable_ckpt.list_versions(root) if v.status == "committed"]


def test_invalid_commit_records_never_make_a_version(tmp_path: Path) -> None:
    """R-COMMIT-1: attempts with an invalid commit record are never versions nor the latest."""
    good = build_version(tmp_path, step=1)[1]
    bad_docs: list[Callable[[Path], None]] = [
        lambda v: (v / "manifest.json").write_bytes(b'{"format": "portable-ckpt"'),
        lambda v: edit_manifest(v, lambda d: d.pop("files")),
        lambda v: edit_manifest(v, lambda d: d.__setitem__("must_understand", ["x-new"])),
        lambda v: edit_manifest(v, lambda d: d.__setitem__("format_version", "2.0")),
        lambda v: edit_manifest(v, lambda d: d.__setitem__("attempt_id", new_attempt_id(9))),
    ]
    for i, spoil in enumerate(bad_docs):
        vdir = build_version(tmp_path, step=10 + i)[0]
        spoil(vdir)
    assert portable_ckpt.open(tmp_path).id == good.attempt_id
    versions = portable_ckpt.list_versions(tmp_path)
    assert [v.id for v in versions if v.status == "committed"] == [good.attempt_id]
    for s in range(10, 15):
        expect_code("PCK-NOT-FOUND", portable_ckpt.open, tmp_path, step=s)


def test_missing_manifest_and_missing_version_codes(tmp_path: Path) -> None:
    """R-COMMIT-2: attempt without manifest: PCK-MANIFEST-MISSING; root without version: PCK-NOT-FOUND."""
    expect_code("PCK-NOT-FOUND", portable_ckpt.open, tmp_path)
    vdir, m = build_version(tmp_path, step=2)
    expect_code("PCK-NOT-FOUND", portable_ckpt.open, tmp_path, step=3)
    os.unlink(vdir / "manifest.json")
    expect_code("PCK-MANIFEST-MISSING", portable_ckpt.open, vdir)
    expect_code("PCK-NOT-FOUND", portable_ckpt.open, tmp_path)
    expect_code("PCK-NOT-FOUND", portable_ckpt.open, tmp_path, step=2)


def test_files_and_markers_are_no_evidence_of_a_version(tmp_path: Path) -> None:
    """R-COMMIT-3: complete data, indexes and marker files without a commit record: no version."""
    storage, attempt, ws = _two_writers(tmp_path)
    ws[0].add_tensor("x", np.ones(4, dtype=np.float32))
    ws[1].add_entry("cfg", {"a": 1})
    for w in ws:
        w.finish()
    vdir = tmp_path / attempt
    for marker in ("_SUCCESS", "COMMITTED", "manifest.json.done", ".complete", "manifest.json.bak"):
        (vdir / marker).write_text("{}")
    (vdir / "manifest").mkdir()
    expect_code("PCK-NOT-FOUND", portable_ckpt.open, tmp_path)
    expect_code("PCK-MANIFEST-MISSING", portable_ckpt.open, vdir)
    [info] = portable_ckpt.list_versions(tmp_path)
    assert info.status == "incomplete"
    # The same files committed by the committer do make it a version.
    commit(storage, attempt, step=1, expected_writers=[0, 1])
    assert portable_ckpt.open(tmp_path).id == attempt


def _idx_doc(idx: WriterIndex) -> dict[str, Any]:
    return json.loads(json.dumps(idx.to_json()))


def _case_writer_missing(root: Path) -> tuple[str, Callable[[], Any]]:
    storage, attempt, ws = _two_writers(root)
    ws[0].add_tensor("x", np.ones(4, dtype=np.float32))
    idx0 = ws[0].finish()
    return attempt, lambda: commit(storage, attempt, step=1, indexes=[idx0],
                                   expected_writers=[0, 1])


def _case_writer_missing_from_storage(root: Path) -> tuple[str, Callable[[], Any]]:
    storage, attempt, ws = _two_writers(root)
    ws[0].add_tensor("x", np.ones(4, dtype=np.float32))
    ws[0].finish()
    return attempt, lambda: commit(storage, attempt, step=1, expected_writers=[0, 1])


def _case_shape_conflict(root: Path) -> tuple[str, Callable[[], Any]]:
    storage, attempt, ws = _two_writers(root)
    ws[0].add_tensor("x", np.ones(2, dtype=np.float32), offsets=[0], global_shape=[4])
    ws[1].add_tensor("x", np.ones(2, dtype=np.float32), offsets=[2], global_shape=[5])
    idx = [w.finish() for w in ws]
    return attempt, lambda: commit(storage, attempt, step=1, indexes=idx, expected_writers=[0, 1])


def _case_dtype_conflict(root: Path) -> tuple[str, Callable[[], Any]]:
    storage, attempt, ws = _two_writers(root)
    ws[0].add_tensor("x", np.ones(2, dtype=np.float32), offsets=[0], global_shape=[4])
    ws[1].add_tensor("x", np.ones(2, dtype=np.float16), offsets=[2], global_shape=[4])
    idx = [w.finish() for w in ws]
    return attempt, lambda: commit(storage, attempt, step=1, indexes=idx, expected_writers=[0, 1])


def _case_file_claimed_twice(root: Path) -> tuple[str, Callable[[], Any]]:
    storage, attempt, ws = _two_writers(root)
    ws[0].add_tensor("x", np.ones(4, dtype=np.float32))
    idx0 = ws[0].finish()
    doc = _idx_doc(idx0)
    doc["writer"] = 1
    doc["tensors"] = {}
    idx1 = WriterIndex.from_json(doc)
    return attempt, lambda: commit(storage, attempt, step=1, indexes=[idx0, idx1],
                                   expected_writers=[0, 1])


def _case_gap(root: Path) -> tuple[str, Callable[[], Any]]:
    storage, attempt, ws = _two_writers(root)
    ws[0].add_tensor("x", np.ones((2, 4), dtype=np.float32), offsets=[0, 0], global_shape=[4, 4])
    ws[1].add_tensor("x", np.ones((1, 4), dtype=np.float32), offsets=[3, 0], global_shape=[4, 4])
    idx = [w.finish() for w in ws]
    return attempt, lambda: commit(storage, attempt, step=1, indexes=idx, expected_writers=[0, 1])


def _case_overlap(root: Path) -> tuple[str, Callable[[], Any]]:
    storage, attempt, ws = _two_writers(root)
    ws[0].add_tensor("x", np.ones((3, 4), dtype=np.float32), offsets=[0, 0], global_shape=[4, 4])
    ws[1].add_tensor("x", np.ones((2, 4), dtype=np.float32), offsets=[2, 0], global_shape=[4, 4])
    idx = [w.finish() for w in ws]
    return attempt, lambda: commit(storage, attempt, step=1, indexes=idx, expected_writers=[0, 1])


def _case_bounds(root: Path) -> tuple[str, Callable[[], Any]]:
    storage, attempt, ws = _two_writers(root)
    ws[0].add_tensor("x", np.ones(4, dtype=np.float32))
    ws[1].add_entry("e", 1)
    for w in ws:
        w.finish()
    p = root / attempt / "index" / "w00000.json"
    doc = json.loads(p.read_text())
    doc["tensors"]["x"]["ranges"][0]["offsets"] = [1]
    p.write_text(json.dumps(doc))
    return attempt, lambda: commit(storage, attempt, step=1, expected_writers=[0, 1])


def _case_entry_missing(root: Path) -> tuple[str, Callable[[], Any]]:
    storage, attempt, ws = _two_writers(root)
    ws[0].add_entry("rng", {"s": 0}, scope="per_rank", rank=0, world_size_policy="modulo")
    idx = [w.finish() for w in ws]
    return attempt, lambda: commit(storage, attempt, step=1, indexes=idx, expected_writers=[0, 1],
                                   continuation=Continuation("exact", 2, None))


def _case_file_missing(root: Path) -> tuple[str, Callable[[], Any]]:
    storage, attempt, ws = _two_writers(root)
    ws[0].add_tensor("x", np.ones(4, dtype=np.float32))
    ws[1].add_tensor("y", np.ones(4, dtype=np.float32))
    idx = [w.finish() for w in ws]
    os.unlink(root / attempt / "data" / "w00001-0000.safetensors")
    return attempt, lambda: commit(storage, attempt, step=1, indexes=idx, expected_writers=[0, 1])


def _case_file_size(root: Path) -> tuple[str, Callable[[], Any]]:
    storage, attempt, ws = _two_writers(root)
    ws[0].add_tensor("x", np.ones(4, dtype=np.float32))
    ws[1].add_entry("e", {"k": 1})
    idx = [w.finish() for w in ws]
    entry = next((root / attempt / "entries").iterdir())
    with open(entry, "ab") as f:
        f.write(b" ")
    return attempt, lambda: commit(storage, attempt, step=1, indexes=idx, expected_writers=[0, 1])


@pytest.mark.parametrize(
    "case, code",
    [
        (_case_writer_missing, "PCK-WRITER-MISSING"),
        (_case_writer_missing_from_storage, "PCK-WRITER-MISSING"),
        (_case_shape_conflict, "PCK-METADATA-CONFLICT"),
        (_case_dtype_conflict, "PCK-METADATA-CONFLICT"),
        (_case_file_claimed_twice, "PCK-METADATA-CONFLICT"),
        (_case_bounds, "PCK-RANGE-BOUNDS"),
        (_case_gap, "PCK-COVERAGE-GAP"),
        (_case_overlap, "PCK-COVERAGE-OVERLAP"),
        (_case_entry_missing, "PCK-ENTRY-MISSING"),
        (_case_file_missing, "PCK-FILE-MISSING"),
        (_case_file_size, "PCK-FILE-SIZE"),
    ],
)
def test_committer_checks_everything_and_publishes_nothing(
    tmp_path: Path, case: Callable[[Path], tuple[str, Callable[[], Any]]], code: str
) -> None:
    """R-COMMIT-4: each failed committer check reports its code and publishes no commit record."""
    attempt, do_commit = case(tmp_path)
    expect_code(code, do_commit)
    _nothing_published(tmp_path, attempt)


def _case_index_of_another_attempt(root: Path) -> tuple[str, Callable[[], Any]]:
    """C01: an index that reports another attempt (a writer of an earlier try, its in-memory
    index sent late) is not merged into this one."""
    storage, attempt, ws = _two_writers(root)
    ws[0].add_tensor("x", np.ones(4, dtype=np.float32))
    idx = ws[0].finish()
    other = WriterIndex.from_json({**_idx_doc(idx), "attempt_id": new_attempt_id(1)})
    return attempt, lambda: commit(storage, attempt, step=1, indexes=[other],
                                   expected_writers=[0])


def _case_entry_declared_differently(root: Path) -> tuple[str, Callable[[], Any]]:
    """C05: two writers declare one per-rank entry with different world-size policies; merged,
    one declaration would be silently lost."""
    storage, attempt, ws = _two_writers(root)
    ws[0].add_entry("pos", {"i": 0}, scope="per_rank", rank=0, world_size_policy="modulo")
    ws[1].add_entry("pos", {"i": 1}, scope="per_rank", rank=1, world_size_policy="rank0")
    idx = [w.finish() for w in ws]
    return attempt, lambda: commit(storage, attempt, step=1, indexes=idx, expected_writers=[0, 1])


def _case_entry_value_stored_twice(root: Path) -> tuple[str, Callable[[], Any]]:
    """C06: writer 1's index claims rank 0's value of an entry (in its own file), as writer 0's
    does: two values for one (entry, rank)."""
    storage, attempt, ws = _two_writers(root)
    ws[0].add_entry("pos", {"i": 0}, scope="per_rank", rank=0, world_size_policy="modulo")
    ws[1].add_entry("pos", {"i": 1}, scope="per_rank", rank=1, world_size_policy="modulo")
    idx0, idx1 = (w.finish() for w in ws)
    doc = _idx_doc(idx1)
    [value] = doc["entries"]["pos"]["values"]
    value["rank"] = 0
    idx1 = WriterIndex.from_json(doc)
    return attempt, lambda: commit(storage, attempt, step=1, indexes=[idx0, idx1],
                                   expected_writers=[0, 1])


def _case_unexpected_writer(root: Path) -> tuple[str, Callable[[], Any]]:
    """C08: a writer the job does not have (writer 1 of a job of one) reports an index; its
    half of ``x`` makes the tensor whole, so nothing later would notice."""
    storage, attempt, ws = _two_writers(root)
    ws[0].add_tensor("x", np.ones(2, dtype=np.float32), offsets=[0], global_shape=[4])
    ws[1].add_tensor("x", np.ones(2, dtype=np.float32), offsets=[2], global_shape=[4])
    idx = [w.finish() for w in ws]
    return attempt, lambda: commit(storage, attempt, step=1, indexes=idx, expected_writers=[0])


def _case_step_of_another_attempt(root: Path) -> tuple[str, Callable[[], Any]]:
    """C12: the step asked for is not the step in the attempt id."""
    storage, attempt, ws = _two_writers(root)
    ws[0].add_tensor("x", np.ones(4, dtype=np.float32))
    idx = [w.finish() for w in ws]
    return attempt, lambda: commit(storage, attempt, step=2, indexes=idx, expected_writers=[0, 1])


@pytest.mark.parametrize(
    "case, code, says",
    [
        (_case_index_of_another_attempt, "PCK-ATTEMPT-ID", "reported attempt s000000000001-"),
        (_case_entry_declared_differently, "PCK-METADATA-CONFLICT",
         "entry 'pos': writer 1 declares a different schema, scope, encoding or policy"),
        (_case_entry_value_stored_twice, "PCK-METADATA-CONFLICT",
         "entry 'pos': writer 1 and another writer both stored the value of rank 0"),
        (_case_unexpected_writer, "PCK-METADATA-CONFLICT", "unexpected writer(s) [1]"),
        (_case_step_of_another_attempt, "PCK-USAGE", "step 2 differs from the step in attempt"),
    ],
    ids=["another-attempt", "entry-declaration", "entry-value-twice", "unexpected-writer",
         "step"],
)
def test_committer_merge_checks_refuse_with_their_own_code_and_publish_nothing(
    tmp_path: Path, case: Callable[[Path], tuple[str, Callable[[], Any]]], code: str, says: str
) -> None:
    """R-COMMIT-4 (2): indexes that disagree on an attempt, an entry's declaration or value, or
    come from a writer outside the job are refused by the check made for it, with its code and
    message, and nothing is published. Test audit 21b, C01, C05, C08: each of these checks could
    be deleted with the suite green (a version published that must be refused); C06 and C12:
    refused later with another code, so their own checks were untested."""
    attempt, do_commit = case(tmp_path)
    err = expect_code(code, do_commit)
    assert says in err.message, err.message
    _nothing_published(tmp_path, attempt)


def test_expected_writers_come_from_the_job_not_a_listing(tmp_path: Path) -> None:
    """R-COMMIT-5: the committer never derives the writer set from index/ listings."""
    storage, attempt, ws = _two_writers(tmp_path)
    ws[0].add_tensor("x", np.ones(4, dtype=np.float32))
    ws[0].finish()
    expect_code("PCK-USAGE", commit, storage, attempt, step=1)
    expect_code("PCK-WRITER-MISSING", commit, storage, attempt, step=1, expected_writers=[0, 1])
    _nothing_published(tmp_path, attempt)


def test_writer_files_are_durable_before_its_index(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """R-COMMIT-6: every file and created directory is fsynced before the index is written."""
    storage, attempt, ws = _two_writers(tmp_path)
    w = ws[0]
    w.add_tensor("x", np.ones(4, dtype=np.float32))
    w.add_entry("cfg", {"a": 1})
    w.add_entry("big", list(range(100)), compress=True)
    log = trace_posix(monkeypatch)
    w.finish()
    monkeypatch.undo()
    vdir = str(tmp_path / attempt)
    index_open = log.index("open", lambda p: p.endswith("index/w00000.json"))
    fsynced_before = set(p for c, p, _ in log.events[:index_open] if c == "fsync")
    files = [str(p) for p in Path(vdir).rglob("*") if p.is_file() and "index" not in p.parts]
    assert files
    for f in files:
        assert f in fsynced_before, f"{f} not fsynced before the index was created"
    for d in ("data", "entries"):
        assert f"{vdir}/{d}" in fsynced_before, f"directory {d} not fsynced before the index"
    assert vdir in fsynced_before and str(tmp_path) in fsynced_before
    # The index itself is durable before finish() returns.
    assert f"{vdir}/index/w00000.json" in log.names("fsync")


def _publish_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str]:
    storage, attempt, ws = _two_writers(tmp_path)
    ws[0].add_tensor("x", np.ones(4, dtype=np.float32))
    idx = [w.finish() for w in ws]
    log = trace_posix(monkeypatch)
    commit(storage, attempt, step=1, indexes=idx, expected_writers=[0, 1])
    monkeypatch.undo()
    return log, str(tmp_path / attempt)


def test_posix_publish_steps_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """R-COMMIT-7: write tmp, fsync it, link() to manifest.json, unlink tmp, fsync the directory."""
    log, vdir = _publish_trace(tmp_path, monkeypatch)
    man = f"{vdir}/manifest.json"
    tmp_re = re.compile(re.escape(man) + r"\.[0-9a-f]+\.tmp$")
    i_open = log.index("open", lambda p: bool(tmp_re.match(p)))
    tmp = log.events[i_open][1]
    i_write = log.index("write", lambda p: p == tmp)
    i_fsync = log.index("fsync", lambda p: p == tmp)
    i_link = log.index("link", lambda p: p == f"{tmp} -> {man}")
    i_unlink = log.index("unlink", lambda p: p == tmp)
    i_dsync = max(i for i, (c, p, _) in enumerate(log.events) if c == "fsync" and p == vdir)
    assert i_open < i_write < i_fsync < i_link < i_unlink < i_dsync
    assert log.events[i_open][2] & os.O_EXCL
    assert not os.path.exists(tmp)
    assert json.loads(Path(man).read_text())["attempt_id"] == os.path.basename(vdir)


def test_posix_publish_temp_name_has_16_hex_digits(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """R-COMMIT-7: the temporary manifest is named manifest.json.<16 hex digits>.tmp."""
    log, vdir = _publish_trace(tmp_path, monkeypatch)
    tmps = [p for c, p, _ in log.events if c == "open" and ".tmp" in p]
    assert tmps and all(re.fullmatch(re.escape(vdir) + r"/manifest\.json\.[0-9a-f]{16}\.tmp", p)
                        for p in tmps), tmps


def test_never_publishes_by_rename_or_direct_write(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """R-COMMIT-8: no rename()/replace() onto manifest.json and no direct open of it for writing."""
    log, vdir = _publish_trace(tmp_path, monkeypatch)
    man = f"{vdir}/manifest.json"
    assert not [p for c, p, _ in log.events if c in ("rename", "replace") and p.endswith(man)]
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    assert not [p for c, p, f in log.events if c == "open" and p == man and f & writes]
    assert [p for c, p, _ in log.events if c == "link" and p.endswith(" -> " + man)]


def test_committer_files_are_durable_before_the_commit_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """R-COMMIT-17: a file the committer writes (a tensor table) is fsynced, and so is the
    directory that holds its name, before manifest.json is linked."""
    storage, attempt, ws = _two_writers(tmp_path)
    ws[0].add_tensor("x", np.ones(4, dtype=np.float32))
    idx = [w.finish() for w in ws]
    log = trace_posix(monkeypatch)
    m = commit(storage, attempt, step=1, indexes=idx, expected_writers=[0, 1], tensor_table=True)
    monkeypatch.undo()
    assert m.tensor_table is not None
    vdir = str(tmp_path / attempt)
    table = f"{vdir}/{m.tensor_table.file}"
    i_link = log.index("link", lambda p: p.endswith(" -> " + f"{vdir}/manifest.json"))
    i_create = log.index("open", lambda p: p == table)
    assert log.events[i_create][2] & os.O_CREAT
    before = [p for c, p, _ in log.events[i_create:i_link] if c == "fsync"]
    assert table in before, "the tensor table's data was not fsynced before the commit record"
    assert vdir in before, "the tensor table's name was not made durable before the commit record"


def test_existing_manifest_is_a_conflict_and_left_untouched(tmp_path: Path) -> None:
    """R-COMMIT-9: a second commit fails with PCK-COMMIT-CONFLICT; the record is unchanged."""
    storage, attempt, ws = _two_writers(tmp_path)
    ws[0].add_tensor("x", np.ones(4, dtype=np.float32))
    idx = [w.finish() for w in ws]
    commit(storage, attempt, step=1, indexes=idx, expected_writers=[0, 1])
    man = tmp_path / attempt / "manifest.json"
    before = (man.read_bytes(), man.stat().st_ino, man.stat().st_mtime_ns)
    expect_code("PCK-COMMIT-CONFLICT", commit, storage, attempt, step=1, indexes=idx,
                expected_writers=[0, 1], continuation=Continuation("statistical", 1, None))
    assert (man.read_bytes(), man.stat().st_ino, man.stat().st_mtime_ns) == before
    assert not list((tmp_path / attempt).glob("manifest.json.*"))
    open_and_read_all(tmp_path / attempt)
    # Also when a foreign (different, even invalid) record is already there.
    storage2, attempt2, ws2 = _two_writers(tmp_path, step=2)
    idx2 = [w.finish() for w in ws2]
    (tmp_path / attempt2).mkdir(exist_ok=True)
    (tmp_path / attempt2 / "manifest.json").write_bytes(b"foreign")
    expect_code("PCK-COMMIT-CONFLICT", commit, storage2, attempt2, step=2, indexes=idx2,
                expected_writers=[0, 1])
    assert (tmp_path / attempt2 / "manifest.json").read_bytes() == b"foreign"


def test_readers_ignore_temporary_manifests(tmp_path: Path) -> None:
    """R-COMMIT-10: files named manifest.json.*.tmp are ignored by readers."""
    vdir, m = build_version(tmp_path, step=1)
    body = (vdir / "manifest.json").read_bytes()
    # An uncommitted attempt with only a complete temporary manifest is not a version.
    storage, attempt, ws = _two_writers(tmp_path, step=5)
    ws[0].add_tensor("x", np.ones(4, dtype=np.float32))
    idx = [w.finish() for w in ws]
    doc = json.loads(body)
    doc["attempt_id"] = attempt
    doc["step"] = 5
    for name in (f"manifest.json.{'ab' * 8}.tmp", "manifest.json.x.tmp"):
        (tmp_path / attempt / name).write_text(json.dumps(doc))
    (vdir / f"manifest.json.{'cd' * 8}.tmp").write_text("{broken")
    assert portable_ckpt.open(tmp_path).id == m.attempt_id
    expect_code("PCK-MANIFEST-MISSING", portable_ckpt.open, tmp_path / attempt)
    open_and_read_all(vdir)
    # ...and a real commit of that attempt still succeeds.
    commit(storage, attempt, step=5, indexes=idx, expected_writers=[0, 1])
    assert portable_ckpt.open(tmp_path).id == attempt


def test_after_commit_files_are_never_modified_by_our_tools(tmp_path: Path) -> None:
    """R-COMMIT-14: reads, verify, annotations, copies, ls and gc leave the version unchanged."""
    from portable_ckpt.io.annotations import write_drill_record
    from portable_ckpt.io.copy import copy_version

    vdir, m = build_version(tmp_path / "src", step=1)

    def snapshot() -> dict[str, tuple[str, int, int]]:
        out = {}
        for p in vdir.rglob("*"):
            if p.is_file() and p.parts[-2] not in ("drills", "copies"):
                st = p.stat()
                out[str(p)] = (hashlib.sha256(p.read_bytes()).hexdigest(), st.st_ino,
                               st.st_mtime_ns)
        return out

    before = snapshot()
    open_and_read_all(vdir)
    write_drill_record(open_storage(tmp_path / "src"), m.attempt_id, {
        "ok": True, "started_at": "2030-01-01T00:00:00Z", "finished_at": "2030-01-01T00:00:01Z",
        "world_size": 1, "saved_world_size": 1, "contract": "exact", "measurements": {},
        "error": None})
    copy_version(vdir, tmp_path / "dst")
    portable_ckpt.list_versions(tmp_path / "src")
    build_version(tmp_path / "src", step=2)
    portable_ckpt.gc(tmp_path / "src", keep=2)
    assert snapshot() == before
    # A writer reusing the attempt cannot replace a listed file.
    w = ShardWriter(open_storage(tmp_path / "src"), m.attempt_id, 0, block_size=4096)
    w.add_tensor("a", np.zeros((8, 8), dtype=np.float32))
    expect_code("PCK-STORAGE", w.finish)
    assert snapshot() == before


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("producer"),
        lambda d: d.pop("created_at"),
        lambda d: d.__setitem__("committed_at", "yesterday"),
        lambda d: d.__setitem__("step", "1"),
        lambda d: d.__setitem__("format", "portable-ckpt-drill"),
        lambda d: d["continuation"].__setitem__("contract", "approximate"),
        lambda d: d["continuation"].__setitem__("world_size", 0),
        lambda d: d["tensors"]["a"].__setitem__("extra", 1),
        lambda d: d["tensors"]["a"]["ranges"][0].pop("name"),
        lambda d: d["entries"]["cfg"].__setitem__("scope", "everyone"),
        lambda d: d["entries"]["cfg"].__setitem__("encoding", "msgpack"),
        lambda d: d.__setitem__("tensors", []),
        lambda d: d.__setitem__("extensions", []),
        lambda d: next(iter(d["files"].values()))["checksum"].__setitem__("algorithm", "md5"),
    ],
)
def test_manifest_that_does_not_validate_is_schema_error(tmp_path: Path,
                                                        mutate: Callable[[Any], Any]) -> None:
    """R-COMMIT-15: a manifest that fails the schema is rejected with PCK-SCHEMA."""
    vdir, _ = build_version(tmp_path)
    edit_manifest(vdir, mutate)
    expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)


class _NoConditionalCreate(LocalStorage):
    """A backend that cannot create an object conditionally (it can only check, then write)."""

    capabilities = Capabilities(atomic_create=False, ranged_read=True, durable_fsync=True,
                                local_path=True)

    def create_if_absent(self, path: str, data: bytes) -> bool:
        if self.exists(path):
            return False
        self.put(path, data)
        return True


def test_backend_without_conditional_create_refuses_to_commit(tmp_path: Path) -> None:
    """R-COMMIT-13: no conditional create: the commit is refused with PCK-STORAGE, and a
    writer before its first byte (backend review 27, L12: refused only at the commit, after
    every file was written and deleted again)."""
    storage = _NoConditionalCreate(tmp_path, create=True)
    attempt = new_attempt_id(1)
    w = ShardWriter(LocalStorage(tmp_path), attempt, 0)  # written where commits are atomic
    w.add_tensor("x", np.ones(4, dtype=np.float32))
    idx = w.finish()
    expect_code("PCK-STORAGE", commit, storage, attempt, step=1, indexes=[idx],
                expected_writers=[0])
    assert not (tmp_path / attempt / "manifest.json").exists()
    other = new_attempt_id(2)
    expect_code("PCK-STORAGE", ShardWriter, storage, other, 0)
    assert not (tmp_path / other).exists()


def test_committed_at_is_after_every_version_of_the_step(tmp_path: Path) -> None:
    """R-COMMIT-16: committed_at > every readable committed_at of the step, whatever the clock."""
    from portable_ckpt.io.annotations import timestamp_key
    from portable_ckpt.io.versions import commit_time
    from portable_ckpt.storage.faults import Fault, FaultyStorage

    first = build_version(tmp_path, step=4)[0]
    other_step = build_version(tmp_path, step=5)[0]
    edit_manifest(first, lambda d: d.__setitem__("committed_at", "2999-01-01T00:00:00.999999Z"))
    edit_manifest(other_step, lambda d: d.__setitem__("committed_at", "3999-01-01T00:00:00Z"))
    storage = open_storage(tmp_path)
    attempt = new_attempt_id(4)
    assert commit_time(storage, attempt) == "2999-01-01T00:00:01.000000Z"  # step 5 plays no part
    assert timestamp_key(commit_time(storage, new_attempt_id(6))) < timestamp_key("2999-01-01T00:00:00Z")
    _, m = build_version(tmp_path, step=4)
    assert m.committed_at == "2999-01-01T00:00:01.000000Z"
    assert portable_ckpt.open(tmp_path, step=4).id == m.attempt_id
    # A record of the step that cannot be read: the commit cannot be ordered, nothing is published.
    faulty = FaultyStorage(storage, [Fault(op="read", path=f"{first.name}/manifest.json")])
    storage2, attempt2, ws = _two_writers(tmp_path, step=4)
    for w in ws:
        w.add_tensor(f"t{w.writer}", np.ones(2, dtype=np.float32))
        w.finish()
    expect_code("PCK-STORAGE", commit, faulty, attempt2, step=4, expected_writers=[0, 1])
    assert not (tmp_path / attempt2 / "manifest.json").exists()


@pytest.mark.parametrize(
    "times",
    [
        {"committed_at": "2026-02-31T00:00:00.000001Z"},
        {"created_at": "2026-02-30T23:59:60Z"},
        {"created_at": "2030-01-01T00:00:00Z", "committed_at": "2020-01-01T00:00:00Z"},
    ],
    ids=["feb-31", "feb-30-leap-second", "committed-before-created"],
)
def test_timestamps_are_patterns_not_calendar_dates(tmp_path: Path, times: dict[str, str]) -> None:
    """R-COMMIT-18: every timestamp the pattern accepts is accepted, in any order."""
    vdir, _ = build_version(tmp_path)
    edit_manifest(vdir, lambda d: d.update(times))
    ck = open_and_read_all(vdir)
    assert ck.manifest.committed_at == read_manifest(vdir)["committed_at"]
    assert [v.status for v in portable_ckpt.list_versions(tmp_path)] == ["committed"]
