"""Pins (spec §15.3, errata 11): R-PIN-1, R-PIN-2 and gc's R-GC-11.

A platform's `gc --keep N` over many roots deleted the versions a job kept on purpose (its best,
its milestones; multi-job review F7): nothing could protect a version from every gc.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.cli.main import main as cli_main
from portable_ckpt.errors import ManifestMissingError, StorageError, UsageError
from portable_ckpt.format.schemas import validate_document
from portable_ckpt.io.gc import gc
from portable_ckpt.io.pins import pin, read_pins, unpin
from portable_ckpt.io.versions import list_versions
from portable_ckpt.storage import Storage, open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage


def _root(tmp_path: Path, steps: int = 5) -> tuple[Path, list[str]]:
    root = tmp_path / "r"
    ids = [portable_ckpt.save_arrays(root, {"w": np.full(4, s, np.int64)}, step=s).attempt_id
           for s in range(1, steps + 1)]
    return root, ids


def _committed(root: Path) -> list[str]:
    return [v.id for v in list_versions(root) if v.status == "committed"]


def test_r_pin_1_a_pin_is_a_record_under_its_own_id_and_unpin_deletes_only_its_records(
    tmp_path: Path,
) -> None:
    """R-PIN-1: pins/<pin_id>.json at the root, valid, created once; unpin deletes every record
    of that version and nothing else of pins/."""
    root, ids = _root(tmp_path, 3)
    a = pin(root, ids[0], reason="paper results", by="alice")
    b = pin(root, ids[0])
    c = pin(root, ids[1])
    assert a != b and all(p.startswith("pins/p") for p in (a, b, c))
    for rel in (a, b, c):
        doc = json.loads((root / rel).read_text())
        validate_document(doc, "pin.schema.json", what=rel)
        assert rel == f"pins/{doc['pin_id']}.json"
    assert json.loads((root / a).read_text())["reason"] == "paper results"
    (root / "pins" / "notes.txt").write_text("an operator's file")
    assert sorted(unpin(root, ids[0])) == sorted([a, b])
    assert sorted(p.name for p in (root / "pins").iterdir()) == sorted(
        [Path(c).name, "notes.txt"])
    assert unpin(root, ids[0]) == []  # not pinned: nothing to delete
    # Only committed versions are pinned; arguments are bounded by the schema.
    with pytest.raises(ManifestMissingError):
        pin(root, "s000000000009-20260101T000000000000Z-0123456789abcdef")
    with pytest.raises(UsageError, match="at most 1024"):
        pin(root, ids[2], reason="x" * 1025)
    # Readers never see pins (R-LAYOUT-4): the latest version reads as before.
    assert portable_ckpt.open(root).id == ids[2]


def test_r_pin_2_only_records_that_count_pin(tmp_path: Path) -> None:
    """R-PIN-2: a record that does not validate, is stored under another name or names another
    attempt pins nothing; a newer major version's pin that names the attempt pins (kept)."""
    root, ids = _root(tmp_path, 4)
    rel = pin(root, ids[0])
    doc = json.loads((root / rel).read_text())
    pins = root / "pins"
    # misnamed (a valid record of ids[1] under another name)
    (pins / "p20200101T000000000000Z-00000000.json").write_text(
        json.dumps({**doc, "attempt_id": ids[1]}))
    # invalid (no pinned_at) under its own name
    bad = {**doc, "attempt_id": ids[2], "pin_id": "p20200101T000000000000Z-11111111"}
    del bad["pinned_at"]
    (pins / f"{bad['pin_id']}.json").write_text(json.dumps(bad))
    (pins / "p20200101T000000000000Z-22222222.json").write_text("{not json")
    assert set(read_pins(root)) == {ids[0]}
    assert [v.pinned for v in list_versions(root, pins=True)] == [True, False, False, False]
    newer = {"format": "portable-ckpt-pin", "format_version": "2.0", "attempt_id": ids[1],
             "pin_id": "p20200101T000000000000Z-33333333", "something": "else"}
    (pins / "p20200101T000000000000Z-33333333.json").write_text(json.dumps(newer))
    assert set(read_pins(root)) == {ids[0], ids[1]}
    rep = gc(root, keep=1, grace_seconds=0)
    assert sorted(rep.pinned) == sorted(ids[:2]) and rep.deleted == [ids[2]]
    assert _committed(root) == [ids[0], ids[1], ids[3]]


def test_r_gc_11_pinned_versions_are_kept_outside_keep(tmp_path: Path) -> None:
    """R-GC-11: gc keeps a pinned version and it takes no place among `keep` (R-GC-1)."""
    root, ids = _root(tmp_path, 5)
    pin(root, ids[1])
    rep = gc(root, keep=2, grace_seconds=0)
    assert rep.pinned == [ids[1]] and sorted(rep.deleted) == sorted([ids[0], ids[2]])
    assert _committed(root) == [ids[1], ids[3], ids[4]]
    assert set(rep.kept) == {ids[1], ids[3], ids[4]}
    unpin(root, ids[1])
    gc(root, keep=2, grace_seconds=0)
    assert _committed(root) == [ids[3], ids[4]]


def test_r_gc_11_a_pinned_drilled_version_releases_no_other_protection(tmp_path: Path) -> None:
    """R-GC-11 with R-GC-2 (errata 19; spec implementer 25, 1): R-GC-2 and R-GC-9 apply to the
    versions that are not pinned. The newest drilled version pinned, the newest drilled one
    that is not stays: a pin is removed at any time, and the version then goes by retention."""
    from portable_ckpt.io.annotations import write_drill_record

    root, ids = _root(tmp_path, 5)
    storage = open_storage(root)
    drill = {"ok": True, "started_at": "2030-01-01T00:00:00Z",
             "finished_at": "2030-01-01T00:00:01Z", "world_size": 1, "saved_world_size": 1,
             "contract": "exact", "measurements": {}, "error": None}
    for v in (ids[1], ids[3]):
        write_drill_record(storage, v, drill)
    pin(root, ids[3])
    rep = gc(root, keep=1, grace_seconds=0)
    assert rep.protected == ids[1] and sorted(rep.deleted) == sorted([ids[0], ids[2]])
    assert _committed(root) == [ids[1], ids[3], ids[4]]
    unpin(root, ids[3])
    gc(root, keep=1, grace_seconds=0)
    assert _committed(root) == [ids[3], ids[4]]  # the newest drilled, and the newest


def test_r_gc_11_a_pinned_attempt_is_never_deleted_whatever_gc_was_asked(tmp_path: Path) -> None:
    """R-GC-11: a pinned version whose commit record was damaged is kept under delete_invalid;
    a pinned version that a rollback abandoned is not retired."""
    root, ids = _root(tmp_path, 3)
    pin(root, ids[0])
    (root / ids[0] / "manifest.json").write_text('{"damaged": true}')
    rep = gc(root, keep=1, grace_seconds=0, delete_invalid=True)
    assert ids[0] in rep.pinned and ids[0] not in rep.deleted + rep.abandoned
    assert (root / ids[0] / "manifest.json").exists()
    # A rollback: step 2 saved again after step 3; pinned step 3 is not retired.
    pin(root, ids[2])
    again = portable_ckpt.save_arrays(root, {"w": np.zeros(4, np.int64)}, step=2).attempt_id
    rep = gc(root, keep=1, grace_seconds=0, retire_abandoned=True, delete_invalid=True)
    assert ids[2] not in rep.retired and ids[2] in _committed(root) and again in _committed(root)


class _FlipOnce(FaultyStorage):
    """The first read of each pin record returns one flipped bit (a flaky NIC)."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner, [])
        self.seen: set[str] = set()

    def read_all(self, path: str, *, max_size: int) -> bytes:
        data = super().read_all(path, max_size=max_size)
        if path.startswith("pins/") and path not in self.seen:
            self.seen.add(path)
            return bytes([data[0] ^ 0x01]) + data[1:]
        return data


def test_r_gc_11_a_flipped_bit_does_not_unpin_and_unreadable_pins_delete_no_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-GC-11: a record that does not count is read again (one flipped bit must not unpin); a
    listing of pins/ that fails, or reads that differ, hold every version: nothing deleted."""
    root, ids = _root(tmp_path, 4)
    pin(root, ids[0])
    rep = gc(_FlipOnce(open_storage(root)), keep=1, grace_seconds=0, dry_run=True)
    assert rep.pinned == [ids[0]] and ids[0] not in rep.deleted
    failing = FaultyStorage(open_storage(root), [Fault(op="list", path="pins*", error="EIO")])
    rep = gc(failing, keep=1, grace_seconds=0)
    assert not rep.complete and rep.deleted == [] and sorted(rep.pinned) == sorted(ids)
    assert [u["status"] for u in rep.unknown] == ["pins unreadable"]
    assert _committed(root) == ids

    class _Differ(FaultyStorage):
        n = 0

        def read_all(self, path: str, *, max_size: int) -> bytes:
            data = super().read_all(path, max_size=max_size)
            if path.startswith("pins/"):
                self.n += 1
                return data[: -self.n]  # never the same twice, never valid
            return data

    with pytest.raises(StorageError, match="two reads of the pin record gave different bytes"):
        read_pins(_Differ(open_storage(root), []))
    rep = gc(_Differ(open_storage(root), []), keep=1, grace_seconds=0)
    assert rep.deleted == [] and not rep.complete
    # The CLI says so, exit 1; ls marks every version '?'.
    gc(root, keep=1, grace_seconds=0)
    assert _committed(root) == [ids[0], ids[3]]


def test_pin_and_unpin_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pin` / `unpin` CKPT (a root and --step, or a version directory); `ls` shows PINNED and
    `gc` says why it kept a version; usage errors exit 2 before anything is touched."""
    root, ids = _root(tmp_path, 3)
    assert cli_main(["pin", str(root), "--step", "1", "--reason", "paper"]) == 0
    assert "pinned " + ids[0] in capsys.readouterr().out
    assert cli_main(["pin", str(root / ids[1]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["attempt_id"] == ids[1]
    assert cli_main(["ls", str(root)]) == 0
    out = capsys.readouterr().out
    assert "PINNED" in out and "not this format's" not in out  # pins/ is the format's
    assert cli_main(["ls", str(root), "--json"]) == 0
    assert [v["pinned"] for v in json.loads(capsys.readouterr().out)["versions"]] == [
        True, True, False]
    assert cli_main(["gc", str(root), "--keep", "1"]) == 0
    out = capsys.readouterr().out
    assert f"kept    {ids[0]}  (pinned)" in out and f"kept    {ids[1]}  (pinned)" in out
    assert cli_main(["unpin", str(root), "--step", "2"]) == 0
    assert "1 pin record(s) removed" in capsys.readouterr().out
    assert cli_main(["unpin", str(root), "--step", "2"]) == 0
    assert "was not pinned" in capsys.readouterr().out
    before = sorted(p.name for p in (root / "pins").iterdir())
    with pytest.raises(SystemExit) as e:
        cli_main(["pin", str(root), "--reason", "x" * 1025])
    assert e.value.code == 2 and "at most 1024" in capsys.readouterr().err
    assert sorted(p.name for p in (root / "pins").iterdir()) == before
    assert cli_main(["pin", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err
    assert cli_main(["pin", str(root), "--step", "7"]) == 1
    assert "no committed version for step 7" in capsys.readouterr().err


def test_unpin_of_a_version_whose_record_is_damaged_or_gone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Attack review 5 F6: `unpin` read the version's commit record first: a pinned version
    whose record was damaged (gc keeps it for ever) could be freed by no tool."""
    root, ids = _root(tmp_path, 3)
    pin(root, ids[0])
    (root / ids[0] / "manifest.json").write_text("{damaged")
    assert cli_main(["unpin", str(root / ids[0]), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["attempt_id"] == ids[0] and doc["step"] == 1 and len(doc["removed"]) == 1
    assert read_pins(root) == {}
    assert cli_main(["unpin", str(root / ids[0]), "--step", "2"]) == 1
    assert "drop --step" in capsys.readouterr().err


def test_r_gc_11_a_pin_taken_while_gc_runs_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack review 5 F2: gc read the pins once, before its plan; a `pin` that returned in
    the window was deleted by that gc ("every gc keeps it"). gc looks at pins/ again before
    each version it deletes."""
    import threading

    import portable_ckpt.io.gc as gc_mod

    root, ids = _root(tmp_path, 3)
    planned, go = threading.Event(), threading.Event()
    real = gc_mod.read_pins

    def first_read_then_wait(storage: Storage) -> Any:
        out = real(storage)
        if not planned.is_set():
            planned.set()
            go.wait(30)  # the plan is made on these pins
        return out

    monkeypatch.setattr(gc_mod, "read_pins", first_read_then_wait)
    rep: dict[str, Any] = {}
    t = threading.Thread(target=lambda: rep.setdefault("r", gc(root, keep=1, grace_seconds=0)))
    t.start()
    assert planned.wait(30)
    pin(root, ids[0], reason="paper")
    go.set()
    t.join(60)
    assert rep["r"].deleted == [ids[1]] and ids[0] in rep["r"].pinned
    assert _committed(root) == [ids[0], ids[2]]


def test_a_pin_of_a_version_deleted_meanwhile_fails_and_leaves_no_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack review 5 F2, the other order: the version goes between pin's check and its
    record: pin fails (nothing is pinned) instead of saying every gc keeps it."""
    import portable_ckpt.io.versions as versions

    root, ids = _root(tmp_path, 2)
    real = versions.load_manifest
    calls = {"n": 0}

    def deleted_after_first_look(storage: Storage, attempt_id: str, **kw: Any) -> Any:
        calls["n"] += 1
        out = real(storage, attempt_id, **kw)  # pin's check: the version is there ...
        # ... and a gc that looked at pins/ before the record deletes it now
        (root / ids[0] / "manifest.json").unlink()  # its commit record goes first (R-GC-3)
        return out

    monkeypatch.setattr(versions, "load_manifest", deleted_after_first_look)
    with pytest.raises(portable_ckpt.NotFoundError, match="deleted while it was being pinned"):
        pin(root, ids[0])
    assert read_pins(root) == {} and not list((root / "pins").iterdir())


def test_r_pin_1_unpin_deletes_only_records_under_their_own_name(tmp_path: Path) -> None:
    """Review of the change F1: a newer-major record naming another version's pin_id counted,
    and unpin deleted the file its pin_id named (alice's pin); gc then deleted her version."""
    root, ids = _root(tmp_path, 3)
    alice = pin(root, ids[0], by="alice")
    alice_id = Path(alice).stem
    (root / "pins" / "p20990101T000000000000Z-deadbeef.json").write_text(json.dumps({
        "format": "portable-ckpt-pin", "format_version": "2.0", "pin_id": alice_id,
        "attempt_id": ids[1]}))
    (root / "pins" / "p20990101T000000000000Z-deadbee0.json").write_text(json.dumps({
        "format": "portable-ckpt-pin", "format_version": "2.0", "attempt_id": ids[1]}))
    assert set(read_pins(root)) == {ids[0]}  # neither is under its own pin_id
    assert unpin(root, ids[1]) == [] and (root / alice).exists()
    gc(root, keep=1, grace_seconds=0)
    assert ids[0] in _committed(root)


@pytest.mark.parametrize("odd", ["symlink", "file"])
def test_r_gc_11_a_pins_that_is_no_directory_holds_every_version(tmp_path: Path,
                                                                  odd: str) -> None:
    """Review of the change F14: a symlinked or non-directory `pins` listed as no pins, and gc
    deleted the pinned version: it is a pin that cannot be read."""
    root, ids = _root(tmp_path, 3)
    pin(root, ids[0])
    if odd == "symlink":
        (root / "pins").rename(tmp_path / "elsewhere")
        (root / "pins").symlink_to(tmp_path / "elsewhere")
    else:
        for f in (root / "pins").iterdir():
            f.unlink()
        (root / "pins").rmdir()
        (root / "pins").write_text("not a directory")
    rep = gc(root, keep=1, grace_seconds=0)
    assert rep.deleted == [] and not rep.complete and _committed(root) == ids


@pytest.mark.parametrize("odd", ["symlink", "fifo", "directory"])
def test_r_gc_11_a_record_that_is_no_file_holds_every_version(tmp_path: Path, odd: str) -> None:
    """Attack review 5 F1: a pin record replaced by a symbolic link (to the same bytes), a
    FIFO or a directory was passed over, and gc deleted the version it pins, exit 0."""
    import os

    root, ids = _root(tmp_path, 3)
    rec = root / pin(root, ids[0])
    if odd == "symlink":
        rec.rename(tmp_path / "kept.json")
        rec.symlink_to(tmp_path / "kept.json")
    elif odd == "fifo":
        rec.unlink()
        os.mkfifo(rec)
    else:
        rec.unlink()
        rec.mkdir()
    with pytest.raises(portable_ckpt.CheckpointError, match="named like a pin record"):
        read_pins(root)
    rep = gc(root, keep=1, grace_seconds=0)
    assert rep.deleted == [] and not rep.complete and _committed(root) == ids


def test_junk_in_pins_is_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review of the change F12: 20,000 junk files in pins/ were each read (twice), and every
    restore and `ls --latest` read them: only files named like a pin record are read, and
    readers (list_versions by default) do not read pins at all."""
    from portable_ckpt.storage.local import LocalStorage

    root, ids = _root(tmp_path, 2)
    pin(root, ids[0])
    for i in range(200):
        (root / "pins" / f"n{i}.json").write_text("{}")
    reads: list[str] = []
    real = LocalStorage.read_all

    def counting(self: Any, path: str, **kw: Any) -> bytes:
        reads.append(path)
        return real(self, path, **kw)

    monkeypatch.setattr(LocalStorage, "read_all", counting)
    assert set(read_pins(root)) == {ids[0]}
    assert [r for r in reads if r.startswith("pins/")] == [pin_path(root)]
    reads.clear()
    list_versions(root)
    assert not [r for r in reads if r.startswith("pins/")]


def pin_path(root: Path) -> str:
    [p] = [p for p in (root / "pins").iterdir() if p.name.startswith("p")]
    return f"pins/{p.name}"


def test_r_gc_11_retire_and_damage_of_pinned_versions_are_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Review of the change F8, F9: --retire-abandoned kept a pinned abandoned step (the latest)
    and exited 0 saying the branch was protected; a pinned invalid version went unreported."""
    root, ids = _root(tmp_path, 4)
    pin(root, ids[3])
    again = portable_ckpt.save_arrays(root, {"w": np.zeros(4, np.int64)}, step=2).attempt_id
    assert cli_main(["gc", str(root), "--keep", "3", "--grace", "0", "--retire-abandoned"]) == 1
    out = capsys.readouterr().out
    assert f"kept    {ids[3]}  (--retire-abandoned: abandoned by a rollback, but pinned" in out
    assert ids[2] not in _committed(root) and again in _committed(root)
    assert portable_ckpt.open(root).id == ids[3]  # as the report says
    pin(root, ids[0])
    (root / ids[0] / "manifest.json").write_text('{"damaged": true}')
    rep = gc(root, keep=1, grace_seconds=0)
    assert [d["id"] for d in rep.damaged] == [ids[0]] and ids[0] in rep.pinned


def test_pinning_a_version_again_by_the_same_party_keeps_one_record(tmp_path) -> None:
    """Scripting review F8: every `portable-ckpt pin` of a pinned version added a record: a
    daily pin job grew pins/ without bound. The same `by` gets its record back; another party
    adds its own."""
    import os

    import numpy as np

    import portable_ckpt
    from portable_ckpt.io.pins import pin, read_pins

    portable_ckpt.save_arrays(tmp_path, {"w": np.zeros(2, np.float32)}, step=1)
    aid = portable_ckpt.open(tmp_path).id
    first = pin(tmp_path, aid, by="cron")
    assert pin(tmp_path, aid, by="cron", reason="again") == first
    assert pin(tmp_path, aid, by="release") != first
    assert len(read_pins(tmp_path)[aid]) == 2
    assert len(os.listdir(tmp_path / "pins")) == 2
