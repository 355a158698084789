"""Deletion marks (R-GC-13, errata 18): what a gc stopped after the commit record went leaves.

On-call review 23, F1 and N2: a gc (or a job's retention) killed between deleting a version's
``manifest.json`` and deleting its records left a directory with drill, copy and verification
records, writer indexes and data and no commit record. Every tool took it for a committed version
whose record was lost: gc kept it and exited 1 at every run, a restore named it, and ``recommit``
brought back what retention had deleted (1 kill in 25 after errata 17's deletion order). gc now
stores a deletion mark first; such a directory is a version being deleted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from portable_ckpt.errors import CommitConflictError
from portable_ckpt.format.schemas import validate_document
from portable_ckpt.io.annotations import write_drill_record, write_verification_record
from portable_ckpt.io.deletion import DELETION_DIR, deletion_marks, mark_deletion
from portable_ckpt.io.gc import gc
from portable_ckpt.io.recommit import every_writer_indexed, recommit
from portable_ckpt.io.versions import classify_attempt, list_versions
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage
from tests.hardening._util import check_restores, make_version

REPO = Path(__file__).resolve().parents[2]


def _drill() -> dict[str, Any]:
    return {"ok": True, "started_at": "2030-01-01T00:00:00Z", "finished_at": "2030-01-01T00:00:01Z",
            "world_size": 1, "saved_world_size": 2, "contract": "exact", "measurements": {},
            "error": None}


def _root(tmp_path: Path) -> tuple[str, str]:
    """Two versions with drill and verification records; ``keep=1`` deletes the older."""
    old, new = make_version(str(tmp_path), 1), make_version(str(tmp_path), 2)
    storage = open_storage(tmp_path)
    for v in (old, new):  # (the newest drilled version is kept: R-GC-2)
        write_drill_record(storage, v, _drill())
    write_verification_record(storage, old, ok=True, mode="deep", fraction=None, chunks=4)
    return old, new


_KILL_GC = """
import os, signal, sys
from portable_ckpt.io.gc import gc
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage

root, old = sys.argv[1], sys.argv[2]
# kill -9 right after the commit record went, before any other file of the version did
die = Fault(op="delete", path=f"{old}/*", after_ops=1,
            callback=lambda op, path: os.kill(os.getpid(), signal.SIGKILL))
gc(FaultyStorage(open_storage(root), [die]), keep=1, grace_seconds=0.0)
"""


def test_a_gc_killed_after_the_commit_record_went_leaves_a_version_being_deleted(
    tmp_path: Path,
) -> None:
    """The process is killed by SIGKILL just after ``manifest.json`` was deleted: the records,
    indexes and data are all there. Before errata 18 that was ``invalid`` (a lost record): kept
    for good, exit 1 at every gc, rebuilt by ``recommit``."""
    from portable_ckpt.cli.main import main

    old, new = _root(tmp_path)
    proc = subprocess.run([sys.executable, "-c", _KILL_GC, str(tmp_path), old], cwd=REPO,
                          env=os.environ | {"PYTHONPATH": str(REPO / "src")}, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    here = {p.relative_to(tmp_path / old).parts[0] for p in (tmp_path / old).rglob("*")
            if p.is_file()}
    assert "manifest.json" not in here and {"drills", "verifications", "index", "data",
                                            DELETION_DIR} <= here, here
    storage = open_storage(tmp_path)
    c = classify_attempt(storage, old)
    assert (c.status, c.being_deleted) == ("incomplete", True)
    (v,) = [v for v in list_versions(storage) if v.id == old]
    assert v.status == "incomplete" and v.being_deleted and v.to_json()["being_deleted"]
    assert not every_writer_indexed(storage, old)  # no restore or `ls` offers to rebuild it
    with pytest.raises(CommitConflictError, match="is being deleted"):
        recommit(storage, old, was_committed=True, copies_lost=True, newest_of_step=True)
    assert not (tmp_path / old / "manifest.json").exists()  # nothing was published
    # Within the grace period: kept, and no problem (exit 0); after it: deleted.
    assert main(["gc", str(tmp_path), "--keep", "1"]) == 0
    rep = gc(storage, keep=1)
    assert rep.complete and not rep.damaged
    assert [(g["id"], g.get("being_deleted")) for g in rep.in_grace] == [(old, True)]
    rep = gc(storage, keep=1, grace_seconds=0.0)
    assert rep.complete and old in rep.abandoned and not (tmp_path / old).exists()
    check_restores(storage, new)


def test_ls_and_latest_say_a_version_is_being_deleted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ls`` names such an attempt "being deleted", and no recommit is offered for it."""
    from portable_ckpt.cli.main import main

    old, new = _root(tmp_path)
    storage = open_storage(tmp_path)
    mark_deletion(storage, new, reason="retention")  # the newest: `ls --latest` passes over it
    storage.delete(f"{new}/manifest.json")
    assert main(["ls", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "incomplete, being deleted" in out and "recommit" not in err, (out, err)
    assert main(["ls", str(tmp_path), "--latest"]) == 0
    out, err = capsys.readouterr()
    assert out.strip().endswith(old) and "a gc was deleting it" in err, (out, err)
    assert main(["verify", f"{tmp_path}/{new}"]) == 1
    out, err = capsys.readouterr()
    assert "is being deleted: a gc marked it" in out + err, (out, err)


class _Watch(FaultyStorage):
    """Records every create-if-absent (with its document) and delete, in order."""

    def __init__(self, inner: Any, faults: list[Fault]) -> None:
        super().__init__(inner, faults)
        self.stored: list[tuple[str, str, dict[str, Any] | None]] = []

    def create_if_absent(self, path: str, data: bytes) -> bool:
        self.stored.append(("create", path, json.loads(data)))
        return super().create_if_absent(path, data)

    def delete(self, path: str) -> bool | None:
        self.stored.append(("delete", path, None))
        return super().delete(path)


def test_the_mark_is_stored_before_the_commit_record_is_deleted(tmp_path: Path) -> None:
    """R-GC-13: one mark per deleted version, created before its ``manifest.json`` goes, valid
    against ``deletion.schema.json``, naming the version and stored under its own id."""
    old, new = _root(tmp_path)
    watch = _Watch(open_storage(tmp_path), [])
    stored = watch.stored
    rep = gc(watch, keep=1, grace_seconds=0.0)
    assert rep.deleted == [old] and not (tmp_path / old).exists()
    ops = [(op, p) for op, p, _ in stored if p.startswith(f"{old}/")]
    assert ops[0][0] == "create" and ops[0][1].startswith(f"{old}/{DELETION_DIR}/g")
    assert ops[1] == ("delete", f"{old}/manifest.json"), ops[:3]
    doc = stored[[p for _, p, _ in stored].index(ops[0][1])][2]
    validate_document(doc, "deletion.schema.json", what="mark")
    assert doc is not None and doc["attempt_id"] == old and doc["reason"] == "retention"
    assert ops[0][1] == f"{old}/{DELETION_DIR}/{doc['deletion_id']}.json"
    assert not any(p.startswith(f"{new}/") for _, p, _ in stored)
    # the records and indexes, then the data and entries, then the mark: a gc stopped at any
    # point leaves its mark with whatever is left (S3 review 24, L4)
    gone = [p.removeprefix(f"{old}/").split("/")[0] for op, p in ops[2:] if op == "delete"]
    last = {part: max(i for i, q in enumerate(gone) if q == part) for part in set(gone)}
    first = {part: gone.index(part) for part in set(gone)}
    assert max(last[k] for k in ("drills", "verifications", "index")) < first["data"], gone
    assert first[DELETION_DIR] > max(last["data"], last.get("entries", -1)), gone


def test_retired_versions_are_marked_before_their_record_goes(tmp_path: Path) -> None:
    """R-GC-13 for ``retire_abandoned``: the versions a rollback abandoned went without a mark
    (they had left the list gc took its marks from; found by the conformance suite's trace of
    the retention vectors). Each now gets its mark, with the reason, before its record."""
    first10 = make_version(tmp_path, 10)
    first20 = make_version(tmp_path, 20)
    again10 = make_version(tmp_path, 10)  # the job resumed from step 10 and saved it again
    watch = _Watch(open_storage(tmp_path), [])
    stored = watch.stored
    rep = gc(watch, keep=1, grace_seconds=0.0, retire_abandoned=True)
    assert sorted(rep.retired) == sorted([first10, first20]), rep.to_json()
    assert [v.id for v in list_versions(tmp_path)] == [again10]
    for old in (first10, first20):
        ops = [(op, p, doc) for op, p, doc in stored if p.startswith(f"{old}/")]
        assert ops[0][0] == "create" and ops[0][1].startswith(f"{old}/{DELETION_DIR}/g"), ops
        assert ops[0][2] is not None and ops[0][2]["reason"].startswith("retired")
        assert (ops[1][0], ops[1][1]) == ("delete", f"{old}/manifest.json"), ops[:3]


def test_a_store_that_says_deleted_and_keeps_the_record_loses_no_data(tmp_path: Path) -> None:
    """Left open by stop 25 (a DeleteObjects "deleted" trusted): a store that answers that it
    deleted a commit record and keeps it. gc deleted the version's data next, leaving a
    committed record without its files. It now looks, stops there, removes its own mark (the
    record is known to be there) and reports the version; the version still restores."""
    old, new = _root(tmp_path)

    class Lies(FaultyStorage):
        def delete(self, path: str) -> bool | None:
            if path.endswith("/manifest.json"):
                return True  # "deleted"
            return super().delete(path)

    rep = gc(Lies(open_storage(tmp_path), []), keep=1, grace_seconds=0.0)
    assert old not in rep.deleted and [u["id"] for u in rep.unknown] == [old]
    assert "still there" in rep.unknown[0]["message"]
    assert deletion_marks(open_storage(tmp_path), old) == []
    check_restores(open_storage(tmp_path), old)


def test_no_mark_no_deletion(tmp_path: Path) -> None:
    """A mark that cannot be stored stops the version's deletion: its record stays."""
    old, new = _root(tmp_path)
    st = FaultyStorage(open_storage(tmp_path), [Fault(op="create", path=f"*/{DELETION_DIR}/*",
                                                      error="EACCES")])
    rep = gc(st, keep=1, grace_seconds=0.0)
    assert not rep.complete and old not in rep.deleted
    assert [u["id"] for u in rep.unknown] == [old]
    check_restores(open_storage(tmp_path), old)


def test_a_record_that_cannot_be_deleted_leaves_no_mark(tmp_path: Path) -> None:
    """A store that refuses deletes (a permission) made every gc run fail on the version: it
    stays committed, and its mark is removed again, so none piles up, run after run."""
    old, _ = _root(tmp_path)
    st = FaultyStorage(open_storage(tmp_path), [Fault(op="delete", path=f"{old}/manifest.json",
                                                      error="EACCES")])
    for _ in range(3):
        rep = gc(st, keep=1, grace_seconds=0.0)
        assert [u["id"] for u in rep.unknown] == [old]
    assert not (tmp_path / old / DELETION_DIR).exists() or not any(
        (tmp_path / old / DELETION_DIR).iterdir())
    assert classify_attempt(open_storage(tmp_path), old).status == "committed"


@pytest.mark.parametrize("junk", ["not-a-mark", "other-attempt", "bad-name", "not-json"])
def test_only_a_gc_mark_makes_a_lost_record_deletable(tmp_path: Path, junk: str) -> None:
    """Anything under ``deleting/`` that is no mark of this attempt under its own name leaves
    the attempt what it was: a version whose record was lost, kept (R-GC-10)."""
    old, _ = _root(tmp_path)
    storage = open_storage(tmp_path)
    rel = mark_deletion(storage, old, reason="retention")
    doc = json.loads((tmp_path / rel).read_text())
    (tmp_path / rel).unlink()
    if junk == "not-a-mark":
        doc["format"] = "portable-ckpt-pin"
    elif junk == "other-attempt":
        doc["attempt_id"] = old[:-1] + ("0" if old[-1] != "0" else "1")
    elif junk == "bad-name":
        rel = rel.replace(".json", "0.json")
    (tmp_path / rel).write_text("{" if junk == "not-json" else json.dumps(doc))
    (tmp_path / old / "manifest.json").unlink()
    c = classify_attempt(storage, old)
    assert (c.status, c.being_deleted) == ("invalid", False)
    assert deletion_marks(storage, old) == []
    rep = gc(storage, keep=1, grace_seconds=0.0)
    assert [d["id"] for d in rep.damaged] == [old] and (tmp_path / old).exists()


def test_a_stale_mark_of_a_kept_version_is_cleared_after_the_grace_period(
    tmp_path: Path,
) -> None:
    """A gc stopped between its mark and the record's deletion left a committed version with a
    mark. A gc that keeps it removes the mark once older than its grace period (a younger one
    may be another gc's at work): a record lost later is then a lost record again, kept."""
    old, new = _root(tmp_path)
    storage = open_storage(tmp_path)
    rel = mark_deletion(storage, old, reason="retention")
    rep = gc(storage, keep=2, grace_seconds=3600.0)
    assert rep.marks_cleared == [] and (tmp_path / rel).exists()
    assert next(v for v in list_versions(storage) if v.id == old).being_deleted
    rep = gc(storage, keep=2, grace_seconds=3600.0, now=lambda: time.time() + 7200)
    assert rep.marks_cleared == [rel] and not (tmp_path / rel).exists()
    assert rep.to_json()["marks_cleared"] == [rel]
    (tmp_path / old / "manifest.json").unlink()
    assert classify_attempt(storage, old).status == "invalid"


def test_readers_ignore_the_mark_of_a_committed_version(tmp_path: Path) -> None:
    """While its commit record is there, a version with a mark is committed and reads as
    before (R-LAYOUT-4); a gc that deletes it stores its own mark where the one there may be
    cleared by another gc meanwhile (mark review 24, F4), and reuses a young one."""
    old, _ = _root(tmp_path)
    storage = open_storage(tmp_path)
    mark_deletion(storage, old, reason="retention")
    check_restores(storage, old)
    assert classify_attempt(storage, old).status == "committed"
    created: list[str] = []

    class Watch(FaultyStorage):
        def create_if_absent(self, path: str, data: bytes) -> bool:
            created.append(path)
            return super().create_if_absent(path, data)

    # (half an hour on: a mark that old may be cleared by a gc that keeps the version)
    rep = gc(Watch(storage, []), keep=1, grace_seconds=0.0, now=lambda: time.time() + 2000)
    assert rep.deleted == [old] and [p.split("/")[1] for p in created] == [DELETION_DIR]


def test_the_mark_gives_the_reason_of_the_deletion(tmp_path: Path) -> None:
    """Retention and an invalid record deleted as asked each give a mark with its reason (read
    through the callback, before the record goes)."""
    reasons: list[str] = []

    def seen(op: str, path: str) -> None:
        marks = sorted((Path(tmp_path) / path.split("/")[0] / DELETION_DIR).glob("*.json"))
        if path.endswith("/manifest.json") and marks:
            reasons.append(json.loads(marks[-1].read_text())["reason"])

    ids = [make_version(str(tmp_path), s) for s in (1, 2, 3)]
    (tmp_path / ids[1] / "manifest.json").write_text("{}")  # invalid, deleted as asked
    st = FaultyStorage(open_storage(tmp_path), [Fault(op="delete", path="*/manifest.json",
                                                      error=None, callback=seen)])
    rep = gc(st, keep=1, grace_seconds=0.0, delete_invalid=True)
    assert set(rep.deleted) | set(rep.abandoned) == {ids[0], ids[1]}
    assert sorted(reasons) == ["invalid commit record, deleted as asked (delete_invalid)",
                               "retention"], reasons
    assert not (tmp_path / ids[0]).exists() and not (tmp_path / ids[1]).exists()


def _kill_after_the_record(tmp_path: Path, old: str, *extra: str) -> None:
    """Run gc (keep 1) in a process killed right after ``old``'s commit record went."""
    code = _KILL_GC.replace("keep=1, grace_seconds=0.0", "keep=1, grace_seconds=0.0" + "".join(
        extra))
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path), old], cwd=REPO,
                          env=os.environ | {"PYTHONPATH": str(REPO / "src")}, timeout=120)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("left", ["empty", "junk", "stale-cleared"])
def test_a_deletion_dir_without_a_mark_does_not_stop_the_next_mark(
    tmp_path: Path, left: str
) -> None:
    """Mark review 24, F1: ``being_deleted`` followed the directory, not a mark. An empty
    ``deleting/`` (a mark cleared, a mark removed again, a create that failed on a full disk)
    or junk in it made every later gc store no mark: killed after the record went, it left a
    lost record again (kept for good, rebuilt by recommit)."""
    old, _ = _root(tmp_path)
    storage = open_storage(tmp_path)
    if left == "empty":
        (tmp_path / old / DELETION_DIR).mkdir()
    elif left == "junk":
        (tmp_path / old / DELETION_DIR).mkdir()
        (tmp_path / old / DELETION_DIR / "notes.json").write_text("{}")
    else:  # a stale mark cleared by a gc that kept the version: nothing of it stays
        rel = mark_deletion(storage, old, reason="retention")
        rep = gc(storage, keep=2, grace_seconds=0.0, now=lambda: time.time() + 7200)
        assert rep.marks_cleared == [rel] and not (tmp_path / old / DELETION_DIR).exists()
    (v,) = [v for v in list_versions(storage) if v.id == old]
    assert v.status == "committed" and not v.being_deleted
    _kill_after_the_record(tmp_path, old)
    c = classify_attempt(storage, old)
    assert (c.status, c.being_deleted) == ("incomplete", True)


@pytest.mark.parametrize("error", ["ENOSPC", "EDQUOT", "QuotaExceeded", "XMinioStorageFull"])
def test_a_full_disk_is_freed_without_a_mark(tmp_path: Path, error: str) -> None:
    """Mark review 24, F2: on a full disk every mark's create failed (ENOSPC), gc deleted
    nothing and exited 75 at every run: the disk stayed full. There, gc deletes without the
    mark, the records, then the indexes, then the data (errata 17's order: a kill between
    leaves no lost record; maintainer review 24, 2: one call deleted them in listing order,
    indexes first); any other failure still stops it. Object stores say so with a code (Ceph's
    QuotaExceeded, MinIO's XMinioStorageFull: re-attack 24, N2)."""
    from portable_ckpt.errors import StorageError

    old, new = _root(tmp_path)
    (tmp_path / old / "index").rename(tmp_path / old / "aaa")  # listed before drills/ ...
    (tmp_path / old / "aaa").rename(tmp_path / old / "index")  # (same names, same order)
    deletes: list[str] = []

    class Full(FaultyStorage):
        def create_if_absent(self, path: str, data: bytes) -> bool:
            if f"/{DELETION_DIR}/" in path and not error.startswith("E"):
                raise StorageError(f"PUT s3://b/{path}: {error}: the bucket is full", path=path)
            return super().create_if_absent(path, data)

        def list(self, prefix: str = "", **kwargs: Any) -> Any:
            return sorted(super().list(prefix, **kwargs), key=lambda i: i.path)  # index < vers..

        def delete(self, path: str) -> bool | None:
            deletes.append(path.removeprefix(f"{old}/").split("/")[0])
            return super().delete(path)

    faults = [Fault(op="create", path=f"*/{DELETION_DIR}/*", error=error)] if error.startswith(
        "E") else []
    rep = gc(Full(open_storage(tmp_path), faults), keep=1, grace_seconds=0.0)
    assert rep.complete and rep.deleted == [old] and not (tmp_path / old).exists()
    order = [d for d in deletes if d in ("drills", "verifications", "index", "data")]
    last_record = max(i for i, d in enumerate(order) if d in ("drills", "verifications"))
    assert last_record < order.index("index") < order.index("data"), order
    check_restores(open_storage(tmp_path), new)


def test_a_store_refusing_deletes_gets_no_mark_more_per_run(tmp_path: Path) -> None:
    """Maintainer review 24, 1: a store that refuses deletes (a role without DeleteObject)
    refused the record's delete and then the mark's: every run added a mark to every old
    version (five runs, five marks). A mark too young for any gc to clear is reused."""
    old, _ = _root(tmp_path)
    refusing = FaultyStorage(open_storage(tmp_path), [Fault(op="delete", path="*",
                                                            error="EACCES")])
    for _ in range(5):
        rep = gc(refusing, keep=1, grace_seconds=0.0)
        assert [u["id"] for u in rep.unknown] == [old]
    assert len(list((tmp_path / old / DELETION_DIR).iterdir())) == 1
    assert classify_attempt(open_storage(tmp_path), old).status == "committed"


def test_marks_that_cannot_be_read_leave_the_attempt_unknown(tmp_path: Path) -> None:
    """R-GC-13: a storage error while reading the marks of an attempt without commit record
    leaves it unknown: gc deletes nothing of it and says so, and a reader does not take an
    older version for the newest (maintainer review 24, 4: the MUST had no test)."""
    from portable_ckpt.errors import StorageError

    old, new = _root(tmp_path)
    storage = open_storage(tmp_path)
    mark_deletion(storage, new, reason="retention")
    (tmp_path / new / "manifest.json").unlink()
    eio = FaultyStorage(storage, [Fault(op="read", path=f"*/{DELETION_DIR}/*", error="EIO")])
    assert classify_attempt(eio, new).status == "unreadable"
    rep = gc(eio, keep=1, grace_seconds=0.0)
    assert [u["id"] for u in rep.unknown] == [new] and not rep.deleted and not rep.abandoned
    assert (tmp_path / new).exists()
    import portable_ckpt

    with pytest.raises(StorageError):
        portable_ckpt.open(eio)


class _LostAnswer(FaultyStorage):
    """The DELETE of a commit record takes effect, and its answer is lost (a timeout)."""

    def delete(self, path: str) -> bool | None:
        done = super().delete(path)
        if path.endswith("/manifest.json"):
            from portable_ckpt.errors import StorageError

            raise StorageError(f"delete {path!r}: timed out", path=path)
        return done


def test_a_lost_answer_to_the_records_delete_keeps_the_mark(tmp_path: Path) -> None:
    """Mark review 24, F3: the record's DELETE took effect but its answer was lost; gc took it
    for "not deleted" and removed its mark: no record and no mark, a lost record again. The
    mark goes again only where the record is known to be there still."""
    old, _ = _root(tmp_path)
    storage = open_storage(tmp_path)
    rep = gc(_LostAnswer(storage, []), keep=1, grace_seconds=0.0)
    assert [u["id"] for u in rep.unknown] == [old]
    c = classify_attempt(storage, old)
    assert (c.status, c.being_deleted) == ("incomplete", True)
    assert gc(storage, keep=1, grace_seconds=0.0).abandoned == [old]


def test_a_young_mark_is_not_cleared_whatever_the_grace(tmp_path: Path) -> None:
    """Mark review 24, F5: a gc with ``--grace 0`` that kept a version cleared the mark another
    gc had stored a moment before (it was about to delete the record): marks younger than an
    hour stay, and none is cleared once the record is gone."""
    old, _ = _root(tmp_path)
    storage = open_storage(tmp_path)
    rel = mark_deletion(storage, old, reason="retention")
    rep = gc(storage, keep=2, grace_seconds=0.0)
    assert rep.marks_cleared == [] and (tmp_path / rel).exists()
    rep = gc(storage, keep=2, grace_seconds=0.0, now=lambda: time.time() + 3700)
    assert rep.marks_cleared == [rel]


@pytest.mark.parametrize("version", ["2.0", "10.3", "9" * 5000 + ".1"])
def test_a_mark_of_a_newer_major_counts(tmp_path: Path, version: str) -> None:
    """A mark a newer tool wrote (format_version 2.0, which 1.x cannot validate) counts when
    it names the attempt under its own id, as a pin of a newer major pins: that tool's gc
    deleted the record on purpose."""
    old, _ = _root(tmp_path)
    storage = open_storage(tmp_path)
    rel = mark_deletion(storage, old, reason="retention")
    doc = json.loads((tmp_path / rel).read_text())
    doc.update(format_version=version, started_at=12345, new_member=[1])
    (tmp_path / rel).write_text(json.dumps(doc))
    (tmp_path / old / "manifest.json").unlink()
    c = classify_attempt(storage, old)
    assert (c.status, c.being_deleted) == ("incomplete", True)
    doc["attempt_id"] = "s" + "0" * 12 + old[13:]  # another attempt's
    (tmp_path / rel).write_text(json.dumps(doc))
    assert classify_attempt(storage, old).status == "invalid"


@pytest.mark.parametrize("version", ["0.9", "1.0", "01.0", "1.7"])
def test_a_mark_of_major_1_or_below_must_validate(tmp_path: Path, version: str) -> None:
    """Only a newer major escapes validation: a 1.x (or 0.x) mark that breaks the schema is no
    mark, and the version whose record was lost is kept (R-GC-10)."""
    old, _ = _root(tmp_path)
    storage = open_storage(tmp_path)
    rel = mark_deletion(storage, old, reason="retention")
    doc = json.loads((tmp_path / rel).read_text())
    doc.update(format_version=version, started_at=12345)
    (tmp_path / rel).write_text(json.dumps(doc))
    (tmp_path / old / "manifest.json").unlink()
    assert classify_attempt(storage, old).status == "invalid"


def test_the_cli_says_which_marks_it_cleared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gc`'s text names the stale marks it removed (they were in --json only)."""
    from portable_ckpt.cli.main import main

    old, _ = _root(tmp_path)
    rel = mark_deletion(open_storage(tmp_path), old, reason="retention")
    two_hours_ago = time.time() - 7200
    os.utime(tmp_path / rel, (two_hours_ago, two_hours_ago))
    assert main(["gc", str(tmp_path), "--keep", "2"]) == 0
    assert "removed 1 deletion mark(s)" in capsys.readouterr().out
    assert not (tmp_path / rel).exists()


def test_an_empty_attempt_in_grace_is_not_called_a_save(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Re-attack 24, N6: a gc killed in its last step (the mark deleted, the directories not)
    left an empty attempt, which gc called "a save may be in progress" for the grace period."""
    from portable_ckpt.cli.main import main

    old, _ = _root(tmp_path)
    for p in sorted((tmp_path / old).rglob("*"), reverse=True):
        if p.is_file():
            p.unlink()
    assert main(["gc", str(tmp_path), "--keep", "1"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if old in x)
    assert "empty: a save that wrote nothing yet, or what a stopped gc left" in line, line
    assert gc(open_storage(tmp_path), keep=1).in_grace[0]["empty"] is True


def _paused_past_the_clearing_age(storage: Any, old: str) -> FaultyStorage:
    """A storage on which gc's delete of ``old``'s commit record comes after another gc, run
    meanwhile with the storage's clock two hours on, kept ``old`` and cleared its marks: what a
    gc stopped (SIGSTOP, a suspended VM) for over an hour between its mark and the record's
    delete meets."""
    def other_gc(op: str, path: str) -> None:
        rep = gc(storage, keep=2, grace_seconds=0.0, now=lambda: time.time() + 7200)
        assert rep.marks_cleared and not deletion_marks(storage, old)

    return FaultyStorage(storage, [Fault(op="delete", path=f"{old}/manifest.json", error=None,
                                         times=1, callback=other_gc)])


@pytest.mark.parametrize("reused", [False, True])
def test_a_gc_whose_mark_was_cleared_meanwhile_marks_again(tmp_path: Path, reused: bool) -> None:
    """Re-attack 24, N3: a gc paused past a mark's clearing age between its mark (its own, or a
    young one it reused) and the record's delete found its mark cleared by a gc that kept the
    version, and deleted the record: a lost record again, kept for good and rebuilt by
    ``recommit``. It looks for its mark right after the record went and stores one again."""
    old, new = _root(tmp_path)
    storage = open_storage(tmp_path)
    if reused:
        mark_deletion(storage, old, reason="retention")
    stop = _KillAfterRecord(_paused_past_the_clearing_age(storage, old), old)
    with pytest.raises(_Stopped):
        gc(stop, keep=1, grace_seconds=0.0)
    c = classify_attempt(storage, old)
    assert (c.status, c.being_deleted) == ("incomplete", True)
    with pytest.raises(CommitConflictError, match="is being deleted"):
        recommit(storage, old, was_committed=True, copies_lost=True, newest_of_step=True)
    assert gc(storage, keep=1, grace_seconds=0.0).abandoned == [old]
    check_restores(storage, new)


def test_a_gc_that_cleared_a_mark_marks_again_when_the_record_went_meanwhile(
    tmp_path: Path,
) -> None:
    """The other half of N3: the paused gc deleted the record after the clearing gc looked for
    it, and was stopped before it could look for its mark. The clearing gc looks for the record
    right after it cleared the marks, and stores a mark again."""
    old, new = _root(tmp_path)
    storage = open_storage(tmp_path)
    mark_deletion(storage, old, reason="retention")

    def paused_gc_deletes_the_record(op: str, path: str) -> None:
        (tmp_path / old / "manifest.json").unlink()

    # (exists: when classified, right before the marks are cleared, then right after)
    late = FaultyStorage(storage, [Fault(op="exists", path=f"{old}/manifest.json", error=None,
                                         after_ops=2, times=1,
                                         callback=paused_gc_deletes_the_record)])
    rep = gc(late, keep=2, grace_seconds=0.0, now=lambda: time.time() + 7200)
    assert len(rep.marks_cleared) == 1
    c = classify_attempt(storage, old)
    assert (c.status, c.being_deleted) == ("incomplete", True)
    assert gc(storage, keep=1, grace_seconds=0.0).abandoned == [old]
    check_restores(storage, new)


class _Stopped(Exception):
    """gc stopped right after its checks that follow the record's delete."""


class _KillAfterRecord(FaultyStorage):
    """Stops gc at its first delete after the commit record's (as a kill there would)."""

    def __init__(self, inner: Any, old: str) -> None:
        super().__init__(inner, [])
        self.old, self.record_gone = old, False

    def delete(self, path: str) -> bool | None:
        if self.record_gone:
            raise _Stopped(path)
        done = super().delete(path)
        self.record_gone = path == f"{self.old}/manifest.json"
        return done

    def delete_many(self, paths: Any) -> None:
        if self.record_gone:
            raise _Stopped(paths)
        super().delete_many(paths)
