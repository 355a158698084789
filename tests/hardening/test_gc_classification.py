"""gc, ``ls`` and ``latest`` never act on what they could not read (issue 12, items 1, 2 and 6).

Classification of an attempt is at least three-way: committed, positively without a commit record
(the storage said "absent"), and unknown (a storage error, or a record that exists but could not
be read). Versions written by a newer format are foreign: never garbage. A newer save of a step
always sorts after the older ones, even after the clock stepped back.
"""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

import portable_ckpt
from portable_ckpt.errors import StorageError
from portable_ckpt.io import annotations
from portable_ckpt.io.annotations import write_drill_record
from portable_ckpt.io.gc import gc
from portable_ckpt.io.versions import latest, list_versions
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage
from tests.hardening._util import check_restores, make_version


def _alive(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if (p / "manifest.json").exists()}


def _drill(ok: bool = True) -> dict[str, Any]:
    return {"ok": ok, "started_at": "2030-01-01T00:00:00Z", "finished_at": "2030-01-01T00:00:01Z",
            "world_size": 1, "saved_world_size": 2, "contract": "exact", "measurements": {},
            "error": None}


def _edit(root: Path, attempt: str, **changes: Any) -> None:
    p = root / attempt / "manifest.json"
    doc = json.loads(p.read_text())
    doc.update(changes)
    p.write_text(json.dumps(doc))


@pytest.mark.parametrize(("op", "err"), [("exists", "EIO"), ("size", "EIO"), ("read", "EIO"),
                                         ("read", "EACCES"), ("exists", "EACCES")])
def test_one_transient_error_on_the_newest_manifest_deletes_nothing_unclassified(
    tmp_path: Path, op: str, err: str
) -> None:
    """Item 1: one EIO/EACCES while gc reads the newest manifest: that version survives."""
    ids = [make_version(str(tmp_path), s) for s in (1, 2, 3)]
    st = FaultyStorage(open_storage(tmp_path),
                       [Fault(op=op, path=f"{ids[2]}/manifest.json", error=err, times=1)])
    rep = gc(st, keep=1, grace_seconds=0.0)
    assert ids[2] in _alive(tmp_path), "the newest committed version was deleted"
    assert [u["id"] for u in rep.unknown] == [ids[2]] and rep.unknown[0]["code"] == "PCK-STORAGE"
    assert ids[2] not in rep.abandoned and ids[2] not in rep.deleted
    # Deleting the older one is still right: the newest readable version is kept.
    assert rep.kept == [ids[1]] and rep.deleted == [ids[0]] and not rep.complete
    check_restores(open_storage(tmp_path), ids[2])
    # The next run, with the error gone, sees everything again.
    rep2 = gc(str(tmp_path), keep=1, grace_seconds=0.0)
    assert rep2.complete and rep2.kept == [ids[2]] and rep2.deleted == [ids[1]]


def test_eacces_from_the_file_system_is_unknown_not_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 1: a real PermissionError from lstat is a storage error, never "no manifest.json"."""
    ids = [make_version(str(tmp_path), s) for s in (1, 2)]
    real = os.lstat
    target = str(tmp_path / ids[1] / "manifest.json")

    def lstat(path: Any, *a: Any, **k: Any) -> os.stat_result:
        if os.fspath(path) == target:
            raise PermissionError(errno.EACCES, "Permission denied", target)
        return real(path, *a, **k)

    monkeypatch.setattr(os, "lstat", lstat)
    [v1, v2] = list_versions(str(tmp_path))
    assert (v1.status, v2.status) == ("committed", "unreadable")
    assert v2.error is not None and "Permission denied" in v2.error
    rep = gc(str(tmp_path), keep=1, grace_seconds=0.0)
    assert rep.unknown and rep.unknown[0]["id"] == ids[1]
    monkeypatch.undo()
    assert _alive(tmp_path) == set(ids)


def test_ls_shows_an_unreadable_manifest_as_unreadable(tmp_path: Path) -> None:
    """Item 1: ``ls`` says ``unreadable`` (with the error), not ``incomplete``."""
    ids = [make_version(str(tmp_path), s) for s in (1, 2)]
    st = FaultyStorage(open_storage(tmp_path),
                       [Fault(op="read", path=f"{ids[1]}/manifest.json", error="EIO")])
    statuses = {v.id: (v.status, v.error) for v in list_versions(st)}
    assert statuses[ids[0]] == ("committed", None)
    assert statuses[ids[1]][0] == "unreadable" and "EIO" in str(statuses[ids[1]][1])


@pytest.mark.parametrize("op", ["exists", "read"])
def test_latest_never_falls_back_past_an_unreadable_newer_manifest(tmp_path: Path, op: str) -> None:
    """Item 1: a transient error is not "no version": PCK-STORAGE, not the older step."""
    ids = [make_version(str(tmp_path), s) for s in (1, 2)]
    st = FaultyStorage(open_storage(tmp_path),
                       [Fault(op=op, path=f"{ids[1]}/manifest.json", error="EIO")])
    with pytest.raises(StorageError, match=ids[1]):
        latest(st)
    # An explicit older step is unaffected, and the newest once the storage answers.
    assert latest(st, step=1)[0] == ids[0]
    assert latest(open_storage(tmp_path))[0] == ids[1]


def test_unreadable_drill_record_does_not_move_the_drill_protection(tmp_path: Path) -> None:
    """Item 1: a drill record that cannot be read makes the version unknown to gc, not undrilled."""
    ids = [make_version(str(tmp_path), s) for s in (1, 2, 3)]
    storage = open_storage(tmp_path)
    write_drill_record(storage, ids[0], _drill())
    rel = write_drill_record(storage, ids[1], _drill())
    st = FaultyStorage(storage, [Fault(op="read", path=rel, error="EIO")])
    annotations._RECORDS.clear()  # a fresh process (a cron gc): the record is read, and fails
    rep = gc(st, keep=1, grace_seconds=0.0)
    assert ids[1] in _alive(tmp_path), "the newest drilled version was deleted"
    assert [u["id"] for u in rep.unknown] == [ids[1]]
    rep2 = gc(str(tmp_path), keep=1, grace_seconds=0.0)
    assert rep2.protected == ids[1] and _alive(tmp_path) == {ids[1], ids[2]}


def test_listing_error_inside_an_attempt_skips_it(tmp_path: Path) -> None:
    """Item 1: gc cannot date an incomplete attempt it cannot list: it keeps it and says so."""
    make_version(str(tmp_path), 1)
    aid = make_version(str(tmp_path), 2)
    (tmp_path / aid / "manifest.json").unlink()  # an attempt without a commit record
    st = FaultyStorage(open_storage(tmp_path), [Fault(op="list", path=f"{aid}/", error="EIO")])
    rep = gc(st, keep=1, grace_seconds=0.0)
    assert (tmp_path / aid).is_dir() and [u["id"] for u in rep.unknown] == [aid]


_FOREIGN = {
    "major": {"format_version": "2.0"},
    "must-understand": {"format_version": "1.9", "must_understand": ["sparse-tensors"]},
    "newer-minor-unvalidated": {"format_version": "1.9", "tensors": {"t": {"layout": "new"}}},
}


@pytest.mark.parametrize("kind", sorted(_FOREIGN))
def test_foreign_versions_are_never_garbage(tmp_path: Path, kind: str) -> None:
    """Item 2: a version of a newer format is foreign: kept, not counted as abandoned, not in keep."""
    ids = [make_version(str(tmp_path), s) for s in (1, 2, 3)]
    _edit(tmp_path, ids[2], **_FOREIGN[kind])
    os.utime(tmp_path / ids[2] / "manifest.json", (0, 0))
    [*_, newest] = list_versions(str(tmp_path))
    assert newest.id == ids[2] and newest.status == "foreign" and newest.error
    rep = gc(str(tmp_path), keep=1, grace_seconds=0.0)
    assert ids[2] in _alive(tmp_path) and ids[2] not in rep.abandoned + rep.deleted
    assert rep.foreign == [ids[2]] and rep.complete
    # The foreign version does not take a keep slot: the newest understood one stays.
    assert rep.kept == [ids[1]] and _alive(tmp_path) == {ids[1], ids[2]}


def test_latest_skips_a_foreign_version_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Item 2: a foreign version is no version for this reader (R-COMMIT-1), but not silently."""
    ids = [make_version(str(tmp_path), s) for s in (1, 2)]
    _edit(tmp_path, ids[1], format_version="1.9", must_understand=["sparse-tensors"])
    with caplog.at_level("WARNING", logger="portable_ckpt"):
        assert portable_ckpt.open(tmp_path).id == ids[0]
    assert ids[1] in caplog.text and "does not implement" in caplog.text


def test_invalid_manifest_is_kept_unless_deleting_it_is_asked_for(tmp_path: Path) -> None:
    """R-GC-10: a record that was read in full and is invalid is no version, but a save never
    publishes one: one flipped byte of a committed version's record made gc delete the whole
    version after the grace period (shards and writer indexes too). It is kept and reported;
    ``delete_invalid`` deletes it once the grace period has passed (R-GC-4)."""
    ids = [make_version(str(tmp_path), s) for s in (1, 2, 3)]
    record = tmp_path / ids[2] / "manifest.json"
    raw = bytearray(record.read_bytes())
    raw[len(raw) // 2] ^= 0x20  # a flipped bit in the middle of the record, as storage rot does
    record.write_bytes(bytes(raw))
    v = {x.id: x for x in list_versions(str(tmp_path))}[ids[2]]
    assert v.status == "invalid"
    later = time.time() + 2 * 86400
    rep = gc(str(tmp_path), keep=3, now=lambda: later)
    assert rep.abandoned == [] and _alive(tmp_path) == set(ids)
    assert [d["id"] for d in rep.damaged] == [ids[2]] and rep.damaged[0]["code"].startswith("PCK-")
    assert rep.to_json()["damaged"] == rep.damaged
    rep = gc(str(tmp_path), keep=1, now=lambda: later)  # it takes no place of the keep newest
    assert _alive(tmp_path) == {ids[1], ids[2]} and rep.deleted == [ids[0]]
    now = time.time()
    assert gc(str(tmp_path), keep=1, delete_invalid=True, now=lambda: now).abandoned == []
    rep = gc(str(tmp_path), keep=1, delete_invalid=True, now=lambda: now + 7200)
    assert rep.abandoned == [ids[2]] and rep.damaged == [] and _alive(tmp_path) == {ids[1]}


class _FlipsFirstRead(FaultyStorage):
    """The first read of one commit record is damaged on the way (a proxy, a flaky link); the
    record as stored is intact."""

    def __init__(self, inner: Any, rel: str) -> None:
        super().__init__(inner, [])
        self.rel, self.flipped = rel, False

    def read_all(self, path: str, *, max_size: int) -> bytes:
        data = super().read_all(path, max_size=max_size)
        if path == self.rel and not self.flipped:
            self.flipped = True
            return data[:10] + bytes([data[10] ^ 0x20]) + data[11:]
        return data


def test_delete_invalid_reads_the_record_again_before_deleting(tmp_path: Path) -> None:
    """S3 attack 25, H2: one GET of the newest ``manifest.json`` damaged on the way made
    ``gc --delete-invalid --grace 0`` delete that intact version (exit 0), and the root went
    back a step. A record is deleted as invalid only when read again it is invalid too."""
    ids = [make_version(str(tmp_path), s) for s in (1, 2)]
    storage = open_storage(tmp_path)
    flaky = _FlipsFirstRead(storage, f"{ids[1]}/manifest.json")
    rep = gc(flaky, keep=1, delete_invalid=True, grace_seconds=0.0)
    assert flaky.flipped and _alive(tmp_path) == set(ids)
    assert [u["id"] for u in rep.unknown] == [ids[1]] and "read again it is committed" in (
        rep.unknown[0]["message"])
    check_restores(storage, ids[1])
    # an invalid record as stored still goes, as asked
    record = tmp_path / ids[1] / "manifest.json"
    record.write_bytes(record.read_bytes()[:-5])
    rep = gc(storage, keep=1, delete_invalid=True, grace_seconds=0.0)
    assert rep.abandoned == [ids[1]] and _alive(tmp_path) == {ids[0]}


def test_gc_command_keeps_a_damaged_record_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-GC-10 on the command line: kept, named, exit 1 (it needs a person); --delete-invalid."""
    from portable_ckpt.cli.main import main

    ids = [make_version(str(tmp_path), s) for s in (1, 2)]
    (tmp_path / ids[1] / "manifest.json").write_text("")  # a lost block: the record is empty
    assert main(["gc", str(tmp_path), "--keep", "1", "--grace", "0"]) == 1
    out, err = capsys.readouterr()
    assert f"kept    {ids[1]}  (damaged" in out and "--delete-invalid" in err
    assert _alive(tmp_path) == set(ids)
    assert main(["gc", str(tmp_path), "--keep", "1", "--grace", "0", "--delete-invalid"]) == 0
    assert _alive(tmp_path) == {ids[0]}


def test_a_newer_save_of_a_step_wins_after_the_clock_stepped_back(tmp_path: Path) -> None:
    """Item 6: committed_at of a new commit is above every existing version of its step."""
    old = make_version(str(tmp_path), 5)
    # The first save committed one hour "in the future": NTP has since stepped the clock back.
    ahead = time.gmtime(time.time() + 3600)
    _edit(tmp_path, old, committed_at=time.strftime("%Y-%m-%dT%H:%M:%S.123456Z", ahead))
    new = make_version(str(tmp_path), 5)
    ts = {v.id: v.committed_at for v in list_versions(str(tmp_path))}
    assert str(ts[new]) > str(ts[old]), ts
    assert portable_ckpt.open(tmp_path).id == new
    gc(str(tmp_path), keep=1, grace_seconds=0.0)
    assert _alive(tmp_path) == {new}


def test_verify_records_damage_so_gc_keeps_a_version_that_restores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-GC-9, R-DRILL-7: ``verify --deep`` found the newest version damaged and ``gc --keep 1``
    then deleted every good version, keeping only the damaged one (nothing was left to restore).
    verify now records what it found beside the version; gc keeps the newest that did not fail."""
    from portable_ckpt.cli.main import main

    ids = [make_version(str(tmp_path), s) for s in (1, 2, 3)]
    shard = next((tmp_path / ids[2] / "data").iterdir())
    raw = bytearray(shard.read_bytes())
    raw[-7] ^= 0xFF  # a flipped byte in the data area
    shard.write_bytes(bytes(raw))
    assert main(["verify", str(tmp_path), "--deep"]) == 1
    out, err = capsys.readouterr()
    assert "PCK-CHECKSUM" in out and f"{ids[2]}/verifications/v" in err and "never restored" in err
    [v3] = [v for v in list_versions(str(tmp_path), annotations=True) if v.id == ids[2]]
    assert v3.verification_failed
    assert main(["gc", str(tmp_path), "--keep", "1"]) == 0
    capsys.readouterr()
    assert _alive(tmp_path) == {ids[1], ids[2]}  # the damaged newest (R-GC-1) and step 2
    check_restores(open_storage(str(tmp_path)), ids[1])
    # A version that verifies gets an ok record (json names it); --no-record writes none.
    assert main(["verify", f"{tmp_path}/{ids[1]}", "--sample", "0.5", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["record"].startswith(f"{ids[1]}/verifications/v")
    assert doc["record_error"] is None
    before = sorted((tmp_path / ids[1]).rglob("verifications/*"))
    assert main(["verify", f"{tmp_path}/{ids[1]}", "--deep", "--no-record"]) == 0
    assert sorted((tmp_path / ids[1]).rglob("verifications/*")) == before and len(before) == 1


def test_verify_records_nothing_for_an_error_that_proves_no_damage(tmp_path: Path) -> None:
    """Could not read is not damaged: a storage error during a deep verify writes no record."""
    from portable_ckpt.io.annotations import record_verification

    [attempt] = [make_version(str(tmp_path), 1)]
    from portable_ckpt.io.reader import Checkpoint
    from portable_ckpt.io.versions import load_manifest

    st = FaultyStorage(open_storage(str(tmp_path)), [Fault(op="read", path="*/data/*", error="EIO")])
    ck = Checkpoint(st, attempt, load_manifest(st, attempt))
    errors = ck.verify(deep=True)
    assert errors and {e.code for e in errors} == {"PCK-STORAGE"}
    assert record_verification(st, attempt, errors, mode="deep", fraction=1.0, chunks=2) is None
    assert not (tmp_path / attempt / "verifications").exists()


@pytest.mark.parametrize("damage", ["file-gone", "table-flipped"])
def test_verify_records_damage_found_by_listing_or_while_opening(
    tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A data file gone (PCK-FILE-MISSING) or a tensor table's flipped byte (found while the
    version is opened) failed verify but wrote no record, and ``gc --keep 1`` then kept only
    that version, deleting every restorable one (attack review F10, F13)."""
    import numpy as np

    from portable_ckpt.cli.main import main
    from tests.core.helpers import save_sharded

    ids = []
    for step in (1, 2):
        if damage == "table-flipped":  # the committer describes the tensors in a tensor table
            arrays = {f"t{i}": (np.full(4, i, np.float32), (2,)) for i in range(4)}
            ids.append(save_sharded(tmp_path, arrays, step=step, tensor_table=True).attempt_id)
        else:
            ids.append(make_version(str(tmp_path), step))
    newest = tmp_path / ids[1]
    if damage == "file-gone":
        next((newest / "data").iterdir()).unlink()
    else:
        [table] = [p for p in newest.iterdir() if p.name.startswith("tensor-table-")]
        raw = bytearray(table.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        table.write_bytes(bytes(raw))
    assert main(["verify", str(tmp_path), "--deep"]) == 1
    out, err = capsys.readouterr()
    code = "PCK-FILE-MISSING" if damage == "file-gone" else "PCK-CHECKSUM"
    assert code in out and f"{ids[1]}/verifications/v" in err, (out, err)
    assert main(["gc", str(tmp_path), "--keep", "1"]) == 0
    assert _alive(tmp_path) == {ids[0], ids[1]}  # the failed newest is kept (R-GC-1), step 1 too


def test_a_verification_record_keeps_long_messages_short(tmp_path: Path) -> None:
    """A message quoting long keys broke the record's schema (65,536 characters), so the damaged
    version went unmarked (attack review F6): messages are cut to MESSAGE_CHARS."""
    from portable_ckpt.io.annotations import MESSAGE_CHARS, record_verification

    attempt = make_version(str(tmp_path), 1)
    long = {"code": "PCK-CHECKSUM", "message": "\U000e0041" * 10_000}
    path = record_verification(open_storage(str(tmp_path)), attempt, [long], mode="deep",
                               fraction=1.0, chunks=2)
    assert path is not None
    doc = json.loads((tmp_path / path).read_text())
    assert not doc["ok"] and len(doc["errors"][0]["message"]) == MESSAGE_CHARS
    [v] = list_versions(str(tmp_path), annotations=True)
    assert v.verification_failed


class Flips(FaultyStorage):
    """Reads of ``path`` return one flipped bit the first ``times`` times: each read flips
    another bit (a flaky NIC or DIMM), or with ``same`` the same one (a client cache that
    kept a bad copy)."""

    def __init__(self, storage: Any, path: str, times: int, *, same: bool = False) -> None:
        super().__init__(storage, [])
        self._path, self._left, self._same = path, times, same

    def read_all(self, path: str, *, max_size: int) -> bytes:
        data = super().read_all(path, max_size=max_size)
        if path != self._path or self._left <= 0:
            return data
        self._left -= 1
        blob = bytearray(data)
        blob[20 if self._same else 20 + self._left] ^= 0x04
        return bytes(blob)


@pytest.mark.parametrize("kind", ["verification", "drill"])
def test_a_record_misread_once_is_read_again_and_never_cached_as_absent(
    tmp_path: Path, kind: str
) -> None:
    """Attack review 3 F19: one read of a failed verification (or of the drill record) with a
    flipped bit made it "no record"; the listing cache kept that for the life of the process,
    and the next retention pass deleted the only restorable (the drilled) version."""
    from portable_ckpt.io.annotations import write_verification_record

    ids = [make_version(str(tmp_path), s) for s in (1, 2, 3)]
    storage = open_storage(tmp_path)
    if kind == "verification":  # step 3 failed: step 2 is the one a restore takes
        rel = write_verification_record(storage, ids[2], ok=False, mode="deep", fraction=None,
                                        chunks=1, seed=None,
                                        errors=[{"code": "PCK-CHECKSUM", "message": "x"}])
    else:  # step 1 is the drilled one (R-GC-2)
        rel = write_drill_record(storage, ids[0], _drill())
    annotations._RECORDS.clear()
    once = Flips(storage, rel, 1)
    seen = {v.id: v for v in list_versions(once)}
    assert seen[ids[2]].verification_failed is (kind == "verification")
    assert seen[ids[0]].drilled is (kind == "drill")
    gc(storage, keep=1, grace_seconds=0.0)  # the manager's next retention, storage healthy
    assert (ids[1] if kind == "verification" else ids[0]) in _alive(tmp_path)
    # Two reads that differ: a storage error, the version unknown (nothing decided on it).
    annotations._RECORDS.clear()  # a fresh process
    twice = Flips(storage, rel, 2)
    rep = gc(twice, keep=1, grace_seconds=0.0, dry_run=True)
    assert ids[2 if kind == "verification" else 0] in [u["id"] for u in rep.unknown]


class _FlipThen404(FaultyStorage):
    """The first read of ``path`` flips a bit, the second answers 404 while it is listed."""

    def __init__(self, storage: Any, path: str) -> None:
        super().__init__(storage, [])
        self._path, self._n = path, 0

    def read_all(self, path: str, *, max_size: int) -> bytes:
        if path != self._path:
            return super().read_all(path, max_size=max_size)
        self._n += 1
        if self._n == 2:
            from portable_ckpt.errors import FileMissingError

            raise FileMissingError(f"{path}: 404", path=path)
        data = super().read_all(path, max_size=max_size)
        return data[:20] + bytes([data[20] ^ 0x04]) + data[21:] if self._n == 1 else data


def test_a_record_misread_then_answered_absent_while_listed_is_unknown(tmp_path: Path) -> None:
    """Review of the change D3: the second read took a 404 of a listed record as "no record",
    and gc kept only the failed version."""
    from portable_ckpt.io.annotations import write_verification_record

    ids = [make_version(str(tmp_path), s) for s in (1, 2, 3)]
    storage = open_storage(tmp_path)
    rel = write_verification_record(storage, ids[2], ok=False, mode="deep", fraction=None,
                                    chunks=1, errors=[{"code": "PCK-CHECKSUM", "message": "x"}])
    annotations._RECORDS.clear()
    st = _FlipThen404(storage, rel)
    gc(st, keep=1, grace_seconds=0.0)
    assert {ids[1], ids[2]} <= _alive(tmp_path)


def test_a_gc_stopped_while_deleting_data_leaves_no_version_whose_record_was_lost(tmp_path: Path) -> None:
    """On-call review 23, F1: a gc (or a job's retention) stopped after the commit record went,
    while it deleted the data, left the drill, copy and verification records and the writer
    indexes: every tool took the directory for a version whose record was lost (`invalid`,
    `PCK-MANIFEST-MISSING`), gc kept it for good and exited 1, and `recommit` brought back what
    retention had deleted. The records and indexes go first now: what a stopped gc leaves is
    data files, an abandoned attempt the next gc removes."""
    from portable_ckpt.errors import CheckpointError
    from portable_ckpt.io.annotations import write_verification_record
    from portable_ckpt.io.recommit import recommit

    old, new = make_version(str(tmp_path), 1), make_version(str(tmp_path), 2)
    storage = open_storage(tmp_path)
    for v in (old, new):  # (the newest drilled version is kept: R-GC-2)
        write_drill_record(storage, v, _drill())
    write_verification_record(storage, old, ok=True, mode="deep", fraction=None, chunks=4)
    class Sorted(FaultyStorage):
        """Lists in key order, as an object store does (`data/` before the records)."""

        def list(self, prefix: str = "", **kwargs: Any) -> Any:
            return sorted(super().list(prefix, **kwargs), key=lambda info: info.path)

    # the data files cannot be deleted (the process "stops" there); every delete is recorded
    stopped = Sorted(storage, [Fault(op="delete", path=f"{old}/data/*", error="EIO")], record=True)
    rep = gc(stopped, keep=1, grace_seconds=0.0)
    assert old in rep.deleted and [x["id"] for x in rep.left_behind] == [old]
    order = [r.path.removeprefix(f"{old}/") for r in stopped.ops_for("delete", f"{old}/*")]
    first_data = next(i for i, p in enumerate(order) if p.startswith("data/"))
    assert order[0] == "manifest.json" and {p.split("/")[0] for p in order[1:first_data]} >= {
        "drills", "verifications", "index"}, order  # whatever order the directory lists
    left = sorted(p.relative_to(tmp_path / old).as_posix() for p in (tmp_path / old).rglob("*") if p.is_file())
    # (and the deletion mark stored before the commit record went, R-GC-13, errata 18)
    assert left and all(p.startswith(("data/", "entries/", "deleting/")) for p in left), left
    (v,) = [v for v in list_versions(storage) if v.id == old]
    assert v.status == "incomplete", (v.status, v.error_code)
    with pytest.raises(CheckpointError):  # nothing to rebuild a version from
        recommit(storage, old, was_committed=True)
    rep2 = gc(storage, keep=1, grace_seconds=0.0)  # the next gc removes the leftover
    assert rep2.complete and not rep2.damaged and old in rep2.abandoned and not (tmp_path / old).exists()
    assert _alive(tmp_path) == {new}


def test_a_save_that_commits_while_gc_lists_it_is_no_problem(tmp_path: Path) -> None:
    """On-call review 23, N7: a save whose commit record appeared while gc listed its attempt
    (classified without one a moment before) made gc skip it as unknown: exit 75, "run it
    again once the cause named there is fixed (a storage that did not answer, or
    permissions)". A record that is there and valid now is a new version: kept, no problem."""
    from portable_ckpt.cli.main import main as cli_main
    from portable_ckpt.io.commit import commit
    from portable_ckpt.io.writer import new_attempt_id
    from tests.hardening._util import write_share

    make_version(str(tmp_path), 1)
    storage = open_storage(tmp_path)
    aid = new_attempt_id(2)
    idx = [write_share(storage, aid, 2, w, 2) for w in range(2)]  # written, not committed yet

    def commit_now(op: str, path: str) -> None:
        import inspect

        # when gc lists the attempt to date it, after it classified it without a record
        if not committed and any(f.function == "_last_activity" for f in inspect.stack()):
            commit(storage, aid, step=2, indexes=idx, expected_writers=[0, 1],
                   continuation=portable_ckpt.Continuation("exact", 2, None))
            committed.append(aid)

    committed: list[str] = []
    racing = FaultyStorage(storage, [Fault(op="list", path=f"{aid}/", error=None,
                                           callback=commit_now)])
    rep = gc(racing, keep=5, grace_seconds=0.0)
    assert rep.committed_meanwhile == [aid] and rep.complete and aid not in rep.abandoned, rep
    assert aid in _alive(tmp_path)
    check_restores(storage, aid)
    assert cli_main(["gc", str(tmp_path), "--keep", "5"]) == 0  # and the next gc keeps it


def test_a_save_that_commits_just_before_gc_deletes_it_is_no_problem(tmp_path: Path) -> None:
    """Review of stop 23, E5: the other moment of N7, after gc dated the attempt and just before
    it deletes it (its last look for a record finds one): kept, named, not a failed delete."""
    import inspect

    from portable_ckpt.io.commit import commit
    from portable_ckpt.io.writer import new_attempt_id
    from tests.hardening._util import write_share

    make_version(str(tmp_path), 1)
    storage = open_storage(tmp_path)
    aid = new_attempt_id(2)
    idx = [write_share(storage, aid, 2, w, 2) for w in range(2)]
    committed: list[str] = []

    def commit_now(op: str, path: str) -> None:
        if not committed and any(f.function == "_still_unrecorded" for f in inspect.stack()):
            commit(storage, aid, step=2, indexes=idx, expected_writers=[0, 1],
                   continuation=portable_ckpt.Continuation("exact", 2, None))
            committed.append(aid)

    racing = FaultyStorage(storage, [Fault(op="exists", path=f"{aid}/manifest.json", error=None,
                                           callback=commit_now)])
    rep = gc(racing, keep=5, grace_seconds=0.0)
    assert committed and rep.committed_meanwhile == [aid] and rep.complete, rep
    assert aid not in rep.abandoned and aid in _alive(tmp_path)
    check_restores(storage, aid)
