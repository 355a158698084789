"""Mutation audit 25, the deletion marks a gc clears (R-GC-13): beside a commit record, only
marks older than the grace period *and* than one hour go, only those, and only once the record
is seen there."""

from __future__ import annotations

import os
import time
from pathlib import Path

from portable_ckpt.io.deletion import DELETION_DIR, deletion_marks, mark_deletion
from portable_ckpt.io.gc import gc
from portable_ckpt.io.versions import classify_attempt
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage
from tests.hardening._util import make_version


def _marked(tmp_path: Path, *ages: float) -> tuple[str, list[str]]:
    """A committed version (kept with ``keep=2``) holding marks ``ages`` seconds old."""
    old = make_version(str(tmp_path), 1)
    make_version(str(tmp_path), 2)
    storage = open_storage(tmp_path)
    rels = []
    for age in ages:
        rel = mark_deletion(storage, old, reason="retention")
        os.utime(tmp_path / rel, (time.time() - age, time.time() - age))
        rels.append(rel)
    return old, rels


def test_a_mark_younger_than_an_hour_stays_past_the_reuse_age(tmp_path: Path) -> None:
    """A mark 50 minutes old is past the half hour after which a deleting gc stores a mark of
    its own, but may still be the one a gc is deleting under (it reused it): a gc that keeps
    the version, even with a grace of 0, clears marks only once an hour old."""
    _, (rel,) = _marked(tmp_path, 3000.0)
    rep = gc(tmp_path, keep=2, grace_seconds=0.0)
    assert rep.marks_cleared == [] and (tmp_path / rel).exists()
    os.utime(tmp_path / rel, (time.time() - 3700, time.time() - 3700))
    assert gc(tmp_path, keep=2, grace_seconds=0.0).marks_cleared == [rel]


def test_a_long_grace_period_keeps_marks_longer(tmp_path: Path) -> None:
    """The age is the greater of the grace period and an hour: with ``--grace`` of two hours a
    mark 70 minutes old stays (another gc of that grace may be at work), one of 2 h 10 min goes."""
    _, (rel,) = _marked(tmp_path, 4200.0)
    assert gc(tmp_path, keep=2, grace_seconds=7200.0).marks_cleared == []
    assert (tmp_path / rel).exists()
    os.utime(tmp_path / rel, (time.time() - 7800, time.time() - 7800))
    assert gc(tmp_path, keep=2, grace_seconds=7200.0).marks_cleared == [rel]


def test_only_the_stale_marks_go(tmp_path: Path) -> None:
    """A stale mark (a gc stopped long ago) and a fresh one (a gc about to delete the record,
    which it reused or just stored): the stale one is cleared, the fresh one stays."""
    old, (stale, fresh) = _marked(tmp_path, 7200.0, 10.0)
    rep = gc(tmp_path, keep=2, grace_seconds=0.0)
    assert rep.marks_cleared == [stale]
    assert [m.path for m in deletion_marks(open_storage(tmp_path), old)] == [fresh]


def test_no_mark_is_cleared_once_the_record_went(tmp_path: Path) -> None:
    """gc listed the version committed; by the time it clears its stale mark, another gc has
    deleted the commit record (under that mark). Clearing it then would leave a version whose
    record was lost: the record is looked for right before, and the mark stays."""
    old, (rel,) = _marked(tmp_path, 7200.0)

    def other_gc(op: str, path: str) -> None:
        (tmp_path / old / "manifest.json").unlink()

    # the first listing of deleting/ classifies the version, the second is the clearing's
    st = FaultyStorage(open_storage(tmp_path), [Fault(op="list", path=f"{old}/{DELETION_DIR}/",
                                                      error=None, after_ops=1, times=1,
                                                      callback=other_gc)])
    rep = gc(st, keep=2, grace_seconds=0.0)
    assert rep.marks_cleared == [] and (tmp_path / rel).exists()
    c = classify_attempt(open_storage(tmp_path), old)
    assert (c.status, c.being_deleted) == ("incomplete", True)


def test_a_stale_mark_of_a_version_whose_deletion_failed_is_cleared(tmp_path: Path) -> None:
    """A version still holds a mark an earlier gc left two hours ago; this gc's deletion of it
    fails (its commit record cannot be deleted), so the version stays committed: its stale
    mark is cleared as a kept version's is (a record lost later is then kept, R-GC-10)."""
    old, (rel,) = _marked(tmp_path, 7200.0)
    st = FaultyStorage(open_storage(tmp_path), [Fault(op="delete", path=f"{old}/manifest.json",
                                                      error="EACCES")])
    rep = gc(st, keep=1, grace_seconds=0.0)
    assert [u["id"] for u in rep.unknown] == [old] and rep.marks_cleared == [rel]
    assert deletion_marks(open_storage(tmp_path), old) == []


def test_a_dry_run_clears_no_mark(tmp_path: Path) -> None:
    """A dry run deletes nothing: a stale mark of a kept version stays where it is."""
    old, (rel,) = _marked(tmp_path, 7200.0)
    rep = gc(tmp_path, keep=2, grace_seconds=0.0, dry_run=True)
    assert rep.marks_cleared == [] and (tmp_path / rel).exists()
    assert gc(tmp_path, keep=2, grace_seconds=0.0).marks_cleared == [rel]
