"""Mutation audit 31a, reading a version's post-commit records (spec §14.3-14.5, R-DRILL-4,
R-DRILL-8, R-DRILL-12; ``io/annotations.py``): which records count, and a records directory
or record that cannot be read is never "no record".

Each test names the mutant it kills.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from portable_ckpt.errors import CheckpointError, ChecksumError, StorageError, UsageError
from portable_ckpt.format import jsonio
from portable_ckpt.io.annotations import (
    cleared_ids,
    failed_verifications,
    move_cleared,
    prune_annotations,
    read_annotations,
    record_verification,
    write_verification_record,
)
from portable_ckpt.storage import Storage, open_storage
from portable_ckpt.storage.faults import FaultyStorage

from ..rules.test_r_drill_10 import _cli, _failed_and_a_passed_record_clearing_it, _root
from .test_gc_classification import Flips
from .test_review12_records import FAILED, _record


def test_a_verifications_entry_that_is_a_file_is_no_verification_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A regular file named ``verifications`` hides the version's records (it may stand for a
    failed one): reading them raises, or reports, a storage error naming it, and ``verify``
    says so. Mutant A11 (the look for such an entry made for ``copies`` only): no record and
    no error, the version's status "never verified", and ``verify`` silent about it."""
    root, (_, v2) = _root(tmp_path)
    (v2 / "verifications").write_text("x")
    storage = open_storage(root)
    with pytest.raises(StorageError, match="verifications is no directory") as got:
        read_annotations(storage, v2.name, "verifications")
    assert got.value.path == f"{v2.name}/verifications"
    errors: list[CheckpointError] = []
    assert read_annotations(storage, v2.name, "verifications", errors=errors) == []
    assert [e.path for e in errors] == [f"{v2.name}/verifications"]
    _, _, err = _cli(capsys, "verify", str(v2), "--no-record")
    assert "could not all be read" in err and "verifications is no directory" in err


def _same_size(path: Path, doc: dict[str, object], size: int, mtime_ns: int) -> None:
    """Write ``doc`` at ``path`` padded to ``size`` bytes (JSON allows trailing blanks), dated
    ``mtime_ns``: a record replaced with nothing a listing shows changed but its bytes."""
    text = json.dumps(doc).encode()
    assert len(text) <= size
    path.write_bytes(text + b" " * (size - len(text)))
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_the_records_cache_sees_a_record_replaced_under_its_name(tmp_path: Path) -> None:
    """The records a listing read are kept by (root, path, size, time): a record replaced under
    its name is read again when any of them differs. Mutants A20 (the time left out of the
    key), A21 (the size) and A22 (the root: a ``cp -a`` copy of the root, its record another
    one): the old record was answered, and a version failed or passed by a record that is no
    longer there."""
    root, (_, v2) = _root(tmp_path)
    path = v2 / "verifications" / f"{FAILED}.json"
    failed = _record(v2, FAILED)
    passed = {**failed, "ok": True, "errors": []}
    st = path.stat()
    size = st.st_size + 64

    def ok(r: Path) -> list[object]:
        return [d["ok"] for d in read_annotations(open_storage(r), v2.name, "verifications")]

    _same_size(path, failed, size, st.st_mtime_ns)
    assert ok(root) == [False]
    _same_size(path, passed, size, st.st_mtime_ns + 10**9)  # same size, a new time (A20)
    assert ok(root) == [True]
    _same_size(path, failed, size + 1, st.st_mtime_ns + 10**9)  # same time, a new size (A21)
    assert ok(root) == [False]
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)  # (copy2: times kept)
    _same_size(copy / v2.name / "verifications" / path.name, passed, size + 1,
               st.st_mtime_ns + 10**9)  # path, size and time of the original's (A22)
    assert ok(copy) == [True] and ok(root) == [False]




def test_a_record_misread_alike_twice_is_not_remembered(tmp_path: Path) -> None:
    """Two reads alike that do not count make the record "no record" for that listing only:
    the next listing reads it again (attack review 3 F19). Mutant A23 (what did not count kept
    in the records cache too): the failed verification stayed hidden for the life of the
    process, and each restore took the version it had failed."""
    root, (_, v2) = _root(tmp_path)
    _record(v2, FAILED)
    flaky = Flips(open_storage(root), f"{v2.name}/verifications/{FAILED}.json", 2, same=True)
    assert read_annotations(flaky, v2.name, "verifications") == []
    assert [r["ok"] for r in read_annotations(flaky, v2.name, "verifications")] == [False]


def test_files_not_named_like_records_are_never_read(tmp_path: Path) -> None:
    """Only ``<id>.json`` can be a record: other files of a records directory (an editor's
    backup, a junk file, a large dump) are passed over unread. Mutant A27 (every listed file
    read, twice when it does not count): each listing read every such file again."""
    root, (_, v2) = _root(tmp_path)
    _record(v2, FAILED)
    for name in ("notes.txt", f"{FAILED}.json~", "dump.bin"):
        (v2 / "verifications" / name).write_bytes(b"x" * 100_000)
    storage = FaultyStorage(open_storage(root), [])
    assert [r["verification_id"] for r in
            read_annotations(storage, v2.name, "verifications")] == [FAILED]
    read = {op.path for op in storage.ops_for("read", f"{v2.name}/verifications/*")}
    assert read <= {f"{v2.name}/verifications/{FAILED}.json"}, read


class _GrowsWhenRead(FaultyStorage):
    """The record at ``path`` grows past the documents' bound between the listing and the
    read (another process replaced it): the read refuses it (PCK-LIMIT)."""

    def __init__(self, storage: Storage, local: Path, path: str) -> None:
        super().__init__(storage, [])
        self._local, self._path = local, path

    def read_all(self, path: str, *, max_size: int) -> bytes:
        if path == self._path:
            os.truncate(self._local / path, jsonio.MAX_DOCUMENT_BYTES + 1)  # sparse
        return super().read_all(path, max_size=max_size)


def test_a_record_that_grew_past_the_bound_since_the_listing_is_no_record(
    tmp_path: Path,
) -> None:
    """A record replaced after the listing by a file larger than any record is not one of
    this version's (as one deleted since): the others are read, and nothing raises. Mutant
    A28 (the refused read let through): PCK-LIMIT escaped the listing of the version's
    records, even with a list for its errors."""
    root, (_, v2) = _root(tmp_path)
    _record(v2, FAILED)
    other = "v20260102T000000000000Z-00000002"
    _record(v2, other)
    storage = _GrowsWhenRead(open_storage(root), root, f"{v2.name}/verifications/{FAILED}.json")
    errors: list[CheckpointError] = []
    got = read_annotations(storage, v2.name, "verifications", errors=errors)
    assert [r["verification_id"] for r in got] == [other] and errors == []


def test_clears_is_kept_in_memory_only_where_it_counts(tmp_path: Path) -> None:
    """``clears`` counts only in a passed deep record of format 1.2 (§14.5), where the schema
    bounds it to 1,024 ids; in a 1.0 record it is an unknown member, unbounded, and a listing
    keeps no unknown member (attack review 12, A2). Mutant A37: the 1.0 record's 100,000 ids
    were kept for every listing of the root."""
    root, (_, v2) = _root(tmp_path)
    ids = [f"v20260101T000000000000Z-{i:08x}" for i in range(100_000)]
    _record(v2, FAILED, ok=True, errors=[], clears=ids)
    [rec] = read_annotations(open_storage(root), v2.name, "verifications")
    assert rec["ok"] is True and rec["verification_id"] == FAILED
    assert "clears" not in rec


def test_a_failed_record_with_clears_clears_nothing(tmp_path: Path) -> None:
    """Only a *passed* deep record of 1.2 clears (§14.5): ``clears`` in a failed one is a
    writer's mistake, and the record still counts as the failure it says. Mutant A41 (``ok``
    not looked at): the failure it listed counted as cleared, and pruning moved it out of
    ``verifications/`` to the history."""
    root, v2, failed, planted = _failed_and_a_passed_record_clearing_it(
        tmp_path, "1.2", "deep", 1.0)
    rec = json.loads(planted.read_text())
    planted.write_text(json.dumps(
        {**rec, "ok": False, "errors": [{"code": "PCK-CHECKSUM", "message": "block 1"}]}))
    storage = open_storage(root)
    recs = read_annotations(storage, v2.name, "verifications")
    assert cleared_ids(recs) == set()
    assert sorted(r["verification_id"] for r in failed_verifications(recs)) == sorted(
        [failed, rec["verification_id"]])
    prune_annotations(storage, v2.name, "verifications")
    assert (v2 / "verifications" / f"{failed}.json").is_file()
    assert not (v2 / "verifications" / "cleared").exists()


def test_a_move_cut_short_after_its_copy_is_finished_by_the_next_move(tmp_path: Path) -> None:
    """A move killed after the copy in ``verifications/cleared/`` was made and before the
    original was deleted: the history holds exactly its bytes, so the next move deletes the
    original and reports nothing (R-DRILL-10: running it again, as every prune does, finishes it). Mutant A46 (any
    file there an obstacle): the move could never be finished, and releases before 1.2 kept
    counting the repaired version as failed."""
    root, v2, failed, _ = _failed_and_a_passed_record_clearing_it(tmp_path, "1.2", "deep", 1.0)
    src = v2 / "verifications" / f"{failed}.json"
    storage = open_storage(root)
    moved, errors = move_cleared(storage, v2.name, read_annotations(
        storage, v2.name, "verifications"))
    assert moved == [failed] and errors == [] and not src.exists()
    shutil.copyfile(v2 / "verifications" / "cleared" / src.name, src)  # the delete not made
    moved, errors = move_cleared(storage, v2.name, read_annotations(
        storage, v2.name, "verifications"))
    assert (moved, errors) == ([failed], []) and not src.exists()


def test_a_failed_record_keeps_at_most_64_problems(tmp_path: Path) -> None:
    """A verification that found damage in every block of a large version records the first
    64 problems (the record is read by every listing). Mutant A70: all 1,000 were stored."""
    root, (_, v2) = _root(tmp_path)
    rel = write_verification_record(
        open_storage(root), v2.name, ok=False, mode="deep", fraction=None, chunks=1,
        errors=[{"code": "PCK-CHECKSUM", "message": f"block {i}"} for i in range(1000)])
    doc = json.loads((root / rel).read_text())
    assert [e["message"] for e in doc["errors"]] == [f"block {i}" for i in range(64)]


@pytest.mark.parametrize(("ok", "mode"), [(True, "sample"), (False, "deep")])
def test_only_a_passed_deep_verification_may_write_clears(
    tmp_path: Path, ok: bool, mode: str
) -> None:
    """R-DRILL-10: ``clears`` in any other record is a writer's mistake a checker reports
    (PCK-SCHEMA); this writer refuses it and stores nothing. Mutant A71 (a passed sample
    allowed): a sample record with ``clears`` was stored."""
    root, (_, v2) = _root(tmp_path)
    with pytest.raises(UsageError, match="R-DRILL-10"):
        write_verification_record(
            open_storage(root), v2.name, ok=ok, mode=mode, fraction=0.5 if mode == "sample"
            else None, chunks=1, clears=[FAILED],
            errors=[] if ok else [{"code": "PCK-CHECKSUM", "message": "block 0"}])
    assert not (v2 / "verifications").exists()


class _AnswersAbsent(FaultyStorage):
    """``exists`` of every commit record answers no (one spurious 404 of an S3-compatible
    store) while listings still show it."""

    def exists(self, path: str) -> bool:
        return False if path.endswith("/manifest.json") else super().exists(path)


def test_a_record_is_kept_when_the_store_says_absent_but_lists_the_version(
    tmp_path: Path,
) -> None:
    """R-DRILL-11: the record is removed only when the commit record is gone beyond doubt,
    and a store that answers "absent" but lists it is not that. Mutant A67 (the answer alone
    decides): the record just written was removed and VersionDeletedError raised."""
    root, (_, v2) = _root(tmp_path)
    rel = write_verification_record(_AnswersAbsent(open_storage(root), []), v2.name, ok=True,
                                    mode="deep", fraction=None, chunks=1)
    assert (root / rel).is_file()


def test_clears_are_stored_once_each_in_order(tmp_path: Path) -> None:
    """Mutant A72 (the ids as given): a repeated id made the record fail its own schema
    (``uniqueItems``), and the clearing was not stored."""
    root, v2, failed, planted = _failed_and_a_passed_record_clearing_it(
        tmp_path, "1.2", "deep", 1.0)
    planted.unlink()
    other = "v20250101T000000000000Z-0000000f"
    rel = write_verification_record(open_storage(root), v2.name, ok=True, mode="deep",
                                    fraction=None, chunks=1, clears=[failed, other, failed])
    assert json.loads((root / rel).read_text())["clears"] == sorted([failed, other])


def test_a_verification_that_found_damage_records_it_even_when_asked_to_clear(
    tmp_path: Path,
) -> None:
    """A clearing asked for, and the deep verification found damage: the failure is recorded
    and nothing cleared. Mutant A78 (``clears`` passed on whatever was found): the write
    refused the record (UsageError), and the damage found was not recorded."""
    root, v2, failed, planted = _failed_and_a_passed_record_clearing_it(
        tmp_path, "1.2", "deep", 1.0)
    planted.unlink()
    rel = record_verification(
        open_storage(root), v2.name, [ChecksumError("block 3 damaged", path=f"{v2.name}/x")],
        chunks=1, mode="deep", clears=[failed])
    assert rel is not None
    doc = json.loads((root / rel).read_text())
    assert doc["ok"] is False and "clears" not in doc


class _MovedMeanwhile(FaultyStorage):
    """Another run's move takes the record at ``path`` away just before this one reads it."""

    def __init__(self, storage: Storage, local: Path, path: str) -> None:
        super().__init__(storage, [])
        self._local, self._path = local, path

    def read_all(self, path: str, *, max_size: int) -> bytes:
        if path == self._path and (self._local / path).exists():
            (self._local / path).unlink()
        return super().read_all(path, max_size=max_size)


def test_a_record_another_run_moved_meanwhile_is_no_failed_move(tmp_path: Path) -> None:
    """Two clearings finishing the same move: the record gone when this one reads it was
    moved by the other (R-DRILL-10). Mutant A82 (reported as an error): the clearing reported
    a cleared record it could not move, and that older releases still counted the version
    as failed."""
    root, v2, failed, _ = _failed_and_a_passed_record_clearing_it(tmp_path, "1.2", "deep", 1.0)
    storage = open_storage(root)
    records = read_annotations(storage, v2.name, "verifications")
    racing = _MovedMeanwhile(storage, root, f"{v2.name}/verifications/{failed}.json")
    assert move_cleared(racing, v2.name, records) == ([], [])
