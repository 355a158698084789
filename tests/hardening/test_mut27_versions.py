"""Mutation audit 27, which version a tool that restores automatically takes (spec §3, R-ID-4,
R-ID-5, R-DRILL-8, R-COMMIT-1; ``io/versions.py``): ``restore_decision``, ``newest_first`` and
the order of versions, on real roots.

Each test names the mutant it kills.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.cli.main import main
from portable_ckpt.errors import PassedOverWarning, StorageError
from portable_ckpt.format import jsonio
from portable_ckpt.format.naming import new_attempt_id
from portable_ckpt.io.annotations import write_verification_record
from portable_ckpt.io.commit import commit
from portable_ckpt.io.gc import gc
from portable_ckpt.io.pins import pin
from portable_ckpt.io.versions import (
    classify_attempt,
    latest,
    list_versions,
    newest_first,
    restore_decision,
)
from portable_ckpt.io.writer import ShardWriter
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage
from portable_ckpt.storage.local import LocalStorage
from tests.hardening._util import make_version


def _foreign(root: Path, attempt: str) -> None:
    p = root / attempt / "manifest.json"
    doc = json.loads(p.read_text())
    doc["format_version"] = "2.0"
    p.write_text(json.dumps(doc))


def _stray(root: Path, attempt: str) -> None:
    rec = root / attempt / "manifest.json"
    rec.rename(root / attempt / "moved.json")
    rec.mkdir()  # a directory under the commit record's name (R-LAYOUT-7)


@pytest.mark.parametrize("what", ["foreign", "stray"])
def test_a_newer_attempt_that_is_no_version_for_this_reader_is_never_taken(
    tmp_path: Path, what: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-COMMIT-1 and R-ID-5: a foreign version (a format this reader does not implement) and
    a stray attempt (its ``manifest.json`` a directory) are skipped, not taken and not a stop:
    ``ls --latest`` (the rule of a manager's restore, ``drill ROOT``, ``verify ROOT --all``)
    answers the newest version this reader can restore. Mutant V05 (``take`` for every status
    but invalid and incomplete): the foreign or stray attempt was "the latest"."""
    root = tmp_path / "r"
    ids = [make_version(str(root), s, nwriters=1) for s in (1, 2)]
    (_foreign if what == "foreign" else _stray)(root, ids[1])
    decided = {v.id: (v.status, restore_decision(v)) for v in list_versions(root)}
    assert decided == {ids[0]: ("committed", "take"), ids[1]: (what, "skip")}
    assert [v.id for v in newest_first(root)] == [ids[1], ids[0]]
    assert main(["ls", str(root), "--latest"]) == 0
    assert capsys.readouterr().out == f"{root / ids[0]}\n"
    if what == "foreign":  # said (a newer release reads it); a stray one is logged
        with pytest.warns(PassedOverWarning, match="does not implement"):
            assert portable_ckpt.open(root).id == ids[0]
    else:
        assert portable_ckpt.open(root).id == ids[0]


def _started_first_committed_last(root: Path, step: int) -> tuple[str, str]:
    """Two versions of ``step``: the one created first is committed last (a retried save)."""
    storage = open_storage(root, create=True)
    t0 = dt.datetime.now(dt.UTC)
    first = new_attempt_id(step, now=t0 - dt.timedelta(seconds=10))
    second = new_attempt_id(step, now=t0)
    idx = {}
    for a in (first, second):
        w = ShardWriter(storage, a, 0)
        w.add_tensor("t", np.full((2, 2), float(a == first), np.float32))
        idx[a] = w.finish()
    for a in (second, first):
        commit(storage, a, step=step, indexes=[idx[a]], expected_writers=[0],
               continuation=portable_ckpt.Continuation("exact", 1, None))
        time.sleep(0.002)
    return first, second


def test_newest_first_orders_a_step_by_commit_time_not_by_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-ID-4: versions of one step are ordered by ``committed_at`` before the id, which
    carries the creation time: a save created first and committed last is the newest.
    ``newest_first`` (what ``ls --latest``, ``drill ROOT``, ``verify ROOT --all`` and ``copy``
    walk) must yield it first, as ``latest`` answers. Mutant V11 (a level sorted by id): the
    earlier commit was yielded first and ``ls --latest`` printed it, not what
    ``portable_ckpt.open(root)`` opens."""
    root = tmp_path / "r"
    make_version(str(root), 3, nwriters=1)
    first, second = _started_first_committed_last(root, 5)
    assert first < second
    assert [v.id for v in newest_first(root)][:2] == [first, second]
    assert portable_ckpt.open(root).id == first
    assert main(["ls", str(root), "--latest"]) == 0
    assert capsys.readouterr().out == f"{root / first}\n"


def _lost_record(root: Path) -> str:
    """Step 1, then step 2 whose commit record was lost after a verification was recorded."""
    make_version(str(root), 1, nwriters=1)
    aid = make_version(str(root), 2, nwriters=1)
    write_verification_record(open_storage(root), aid, ok=True, mode="deep", fraction=None,
                              chunks=1, verifier="test", errors=[])
    (root / aid / "manifest.json").unlink()
    return aid


def test_records_beside_a_file_at_the_top_of_the_attempt_are_a_lost_record(
    tmp_path: Path,
) -> None:
    """§15.1 (errata 19): an attempt without commit record that holds drill, copy or
    verification records "and nothing else (no file outside ``drills/``, ``copies/`` and
    ``verifications/``)" is incomplete; a file anywhere else, at the top of the attempt too,
    makes it invalid (a version whose record was lost), kept. Mutant V24 (files at the top
    of the attempt not looked at): with only its records in directories and one file at its
    top, the attempt was incomplete and gc deleted it."""
    root = tmp_path / "r"
    aid = _lost_record(root)
    for part in (root / aid).iterdir():
        if part.name == "verifications":
            continue
        if part.is_dir():
            shutil.rmtree(part)
        else:
            part.unlink()
    (root / aid / "model.bin").write_bytes(b"\0" * 64)  # what a person put there
    assert classify_attempt(open_storage(root), aid).status == "invalid"
    rep = gc(str(root), keep=1, grace_seconds=0.0)
    assert aid not in rep.deleted and (root / aid / "model.bin").exists(), rep.to_json()
    (root / aid / "model.bin").unlink()  # records and nothing else: incomplete (errata 19)
    assert classify_attempt(open_storage(root), aid).status == "incomplete"


def test_a_record_answered_absent_while_the_listing_shows_it_is_read_again(
    tmp_path: Path,
) -> None:
    """R-ID-5: "An answer that ``manifest.json`` does not exist while a listing of the
    attempt shows it is such an error once asked again" (replication lag, a caching gateway):
    the record is read once more, never taken as absent. Here the test for the newest
    version's record answers "no" every time while the listing and the read work: it is
    committed, ``latest`` returns it and gc keeps it. Mutant V25 (the re-read dropped): the
    newest version was "incomplete", ``latest`` returned step 1 and ``gc --keep 1`` with no
    grace deleted step 2."""
    root = tmp_path / "r"
    old, new = (make_version(str(root), s, nwriters=1) for s in (1, 2))
    record = f"{new}/manifest.json"

    class SaysAbsent(LocalStorage):
        def exists(self, path: str) -> bool:
            return False if path == record else super().exists(path)

    st = SaysAbsent(str(root))
    assert classify_attempt(st, new).status == "committed"
    assert latest(st)[0] == new
    rep = gc(st, keep=1, grace_seconds=0.0)
    assert rep.deleted == [old] and (root / new / "manifest.json").exists(), rep.to_json()


@pytest.mark.parametrize(("claimed", "status"), [("1.2", "invalid"), ("1.10", "foreign"),
                                                   ("2.0", "foreign")])
def test_a_record_that_fails_its_checks_is_foreign_only_when_it_claims_a_newer_version(
    tmp_path: Path, claimed: str, status: str
) -> None:
    """R-VERSION-10 and §15.1: a record that fails the checks is foreign (kept, skipped with a
    warning) only when it claims a format version newer than every one this reader
    implements (1.2 is the newest here; 1.10 is newer, compared as numbers); one of a version
    it implements is invalid (damage: named, and gone under ``--delete-invalid``). Mutant V27
    (``>=``): a damaged record claiming 1.2 was foreign, and gc ``delete_invalid`` never
    removed it nor said it was invalid."""
    root = tmp_path / "r"
    make_version(str(root), 1, nwriters=1)
    aid = make_version(str(root), 2, nwriters=1)
    rec = root / aid / "manifest.json"
    doc = json.loads(rec.read_text())
    doc["format_version"] = claimed
    doc["tensors"] = {"t": {"layout": "new"}}  # fails the checks of every version we know
    rec.write_text(json.dumps(doc))
    c = classify_attempt(open_storage(root), aid)
    assert c.status == status, c
    rep = gc(str(root), keep=1, grace_seconds=0.0, delete_invalid=True)
    assert (aid in rep.abandoned) is (status == "invalid"), rep.to_json()
    assert (root / aid / "manifest.json").exists() is (status != "invalid")


def test_records_read_one_by_one_when_the_attempt_cannot_be_listed(tmp_path: Path) -> None:
    """R-DRILL-8, R-DRILL-12: the listing of a version's directory (which says which kinds of
    records it holds) fails; each kind is then asked for on its own, never taken as "no
    records": the failed verification of step 2 is still read, and ``ls --latest`` (a
    restore's rule) passes over step 2. Mutant V31 (a failed listing taken as no records):
    step 2 looked never verified and was "the latest"."""
    root = tmp_path / "r"
    old, new = (make_version(str(root), s, nwriters=1) for s in (1, 2))
    write_verification_record(open_storage(root), new, ok=False, mode="deep", fraction=None,
                              chunks=1, verifier="test",
                              errors=[{"code": "PCK-CHECKSUM", "message": "x"}])
    st = FaultyStorage(open_storage(root), [Fault(op="list", path=f"{new}/", error="EIO")])
    versions = {v.id: v for v in list_versions(st)}
    assert versions[new].verification_failed and restore_decision(versions[new]) == "skip"
    assert [v.id for v in newest_first(st) if restore_decision(v) == "take"][:1] == [old]
    assert any(r.path == f"{new}/" and r.failed for r in st.ops_for("list"))


def test_a_record_above_the_size_limit_is_invalid_never_incomplete(tmp_path: Path) -> None:
    """R-SEC-11 and §15.1: a ``manifest.json`` above the 1 GiB limit is refused unread; it
    exists, so the attempt is not "incomplete" (garbage after the grace period) but invalid,
    kept and named (R-GC-10). A sparse file: nothing of it is read. Mutant V40 (an oversized
    record classified incomplete): gc with no grace deleted step 2."""
    root = tmp_path / "r"
    make_version(str(root), 1, nwriters=1)
    aid = make_version(str(root), 2, nwriters=1)
    with open(root / aid / "manifest.json", "r+b") as fh:
        fh.truncate(jsonio.MAX_MANIFEST_BYTES + 1)
    assert classify_attempt(open_storage(root), aid).status == "invalid"
    rep = gc(str(root), keep=1, grace_seconds=0.0)
    assert aid not in rep.deleted + rep.abandoned and (root / aid / "data").is_dir()
    assert aid in {d["id"] for d in rep.damaged}, rep.to_json()


def test_pins_that_cannot_be_read_leave_every_pinned_unknown(tmp_path: Path) -> None:
    """§15.3 (R-GC-11): a pin record that could not be read may be a pin of any version:
    ``list_versions(pins=True)`` says so with ``pinned`` None (``ls``: "?") for every attempt
    and hands back the error, never "not pinned". Mutant V38 (unread pins as False): every
    version showed as not pinned."""
    root = tmp_path / "r"
    ids = [make_version(str(root), s, nwriters=1) for s in (1, 2)]
    pin(str(root), ids[0], reason="paper")
    st = FaultyStorage(open_storage(root), [Fault(op="read", path="pins/*", error="EIO")])
    errors: list[Exception] = []
    versions = list_versions(st, pins=True, errors=errors)
    assert [v.pinned for v in versions] == [None, None] and len(errors) == 1, errors
    assert [v.pinned for v in list_versions(root, pins=True)] == [True, False]


def test_a_commit_whose_same_step_record_cannot_be_read_publishes_nothing(
    tmp_path: Path,
) -> None:
    """R-COMMIT-16: a commit takes a ``committed_at`` after every version of its step; when the
    record of one of them cannot be read, the commit cannot be ordered and publishes nothing
    (it could otherwise sort before that version, which ``gc --keep 1`` would then keep in
    its place). Mutant V33 (an unreadable same-step record skipped by ``commit_time``): the
    second save of step 5 was published."""
    root = tmp_path / "r"
    first = make_version(str(root), 5, nwriters=1)
    st = FaultyStorage(open_storage(root),
                       [Fault(op="read", path=f"{first}/manifest.json", error="EIO")])
    with pytest.raises(StorageError, match="cannot order the commit"):
        make_version(st, 5, nwriters=1)
    assert [v.id for v in list_versions(root) if v.status == "committed"] == [first]
