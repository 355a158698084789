"""Mutation audit 25, deleting one attempt (R-GC-3, R-GC-13, errata 18): the deletion mark
around a commit record whose delete fails, a full storage told from another failure, and the
order of what goes after the record."""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from portable_ckpt.errors import StorageError
from portable_ckpt.io.deletion import DELETION_DIR, deletion_marks, storage_full
from portable_ckpt.io.gc import gc
from portable_ckpt.io.versions import classify_attempt
from portable_ckpt.storage import Storage, open_storage
from portable_ckpt.storage.faults import FaultyStorage
from tests.hardening._util import check_restores, make_version
from tests.hardening.test_gc_deletion_mark import _root


class _LostAnswerThenBlind(FaultyStorage):
    """The commit record's DELETE takes effect and its answer is lost (a timeout); asked
    afterwards whether the record is there, the store does not answer either."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner, [])
        self.gone: set[str] = set()

    def delete(self, path: str) -> bool | None:
        done = super().delete(path)
        if path.endswith("/manifest.json"):
            self.gone.add(path)
            raise StorageError(f"delete {path!r}: timed out", path=path, retryable=True)
        return done

    def exists(self, path: str) -> bool:
        if path in self.gone:
            raise StorageError(f"HEAD {path!r}: 503 Slow Down", path=path, retryable=True)
        return super().exists(path)


def test_a_record_that_may_be_gone_keeps_its_mark(tmp_path: Path) -> None:
    """R-GC-13: the mark goes again only where the record is *known* to be there still. The
    DELETE's answer was lost and the look that followed failed too: the record is gone, so a
    removed mark would leave a version whose record was lost (kept for good, rebuilt by
    ``recommit``). The mark stays and the next gc removes the rest as a version being deleted."""
    old, new = _root(tmp_path)
    storage = open_storage(tmp_path)
    rep = gc(_LostAnswerThenBlind(storage), keep=1, grace_seconds=0.0)
    assert [u["id"] for u in rep.unknown] == [old]
    assert not (tmp_path / old / "manifest.json").exists()
    assert len(deletion_marks(storage, old)) == 1
    c = classify_attempt(storage, old)
    assert (c.status, c.being_deleted) == ("incomplete", True)
    rep = gc(storage, keep=1, grace_seconds=0.0)
    assert rep.abandoned == [old] and rep.complete and not (tmp_path / old).exists()
    check_restores(storage, new)


Refusal = Callable[[str], None]


class _MarkRefused(FaultyStorage):
    """Creating a deletion mark fails as ``refuse`` says (a storage error that wraps an
    OSError)."""

    def __init__(self, inner: Storage, refuse: Refusal) -> None:
        super().__init__(inner, [])
        self.refuse = refuse

    def create_if_absent(self, path: str, data: bytes) -> bool:
        if f"/{DELETION_DIR}/" in path:
            self.refuse(path)
        return super().create_if_absent(path, data)


def _from_cause(code: int) -> Refusal:
    def refuse(path: str) -> None:
        try:
            raise OSError(code, "refused")
        except OSError as exc:
            raise StorageError(f"create {path!r}: the store said no", path=path) from exc
    return refuse


def _from_context(code: int) -> Refusal:
    def refuse(path: str) -> None:
        try:
            raise OSError(code, "refused")
        except OSError:
            raise StorageError(f"create {path!r}: the store said no", path=path)  # noqa: B904
    return refuse


@pytest.mark.parametrize("chain", [_from_cause, _from_context])
def test_a_full_disk_is_told_by_the_oserror_behind_the_error(
    tmp_path: Path, chain: Callable[[int], Refusal]
) -> None:
    """``storage_full`` follows the chain of causes (``raise ... from``, and an error raised
    while handling another): a wrapped ENOSPC or EDQUOT frees the disk without a mark (R-GC-13
    allows it there only), a wrapped EACCES or EIO stops the deletion, the version intact."""
    for code, full in ((errno.ENOSPC, True), (errno.EDQUOT, True), (errno.EACCES, False),
                       (errno.EIO, False)):
        with pytest.raises(StorageError) as info:
            chain(code)("x")
        assert storage_full(info.value) is full, code

    old, new = _root(tmp_path)
    storage = open_storage(tmp_path)
    rep = gc(_MarkRefused(storage, chain(errno.EACCES)), keep=1, grace_seconds=0.0)
    assert [u["id"] for u in rep.unknown] == [old] and not rep.deleted
    check_restores(storage, old)
    rep = gc(_MarkRefused(storage, chain(errno.ENOSPC)), keep=1, grace_seconds=0.0)
    assert rep.complete and rep.deleted == [old] and not (tmp_path / old).exists()
    check_restores(storage, new)


def test_a_newer_major_file_not_named_like_a_mark_is_no_mark(tmp_path: Path) -> None:
    """Only a file named like a mark (``<deletion_id>.json``: ``g``, the timestamp, 8 hex) is
    read: a newer major's document under another name (9 hex digits), whose ``deletion_id``
    matches that name, is no mark; the version whose record was lost stays what it is, kept
    (R-GC-10), where counting it would delete it as a version being deleted."""
    import json

    old, _ = _root(tmp_path)
    storage = open_storage(tmp_path)
    ident = "g20300101T000000000000Z-0123456789"
    doc = {"format": "portable-ckpt-deletion", "format_version": "2.0", "deletion_id": ident,
           "attempt_id": old, "started_at": "2030-01-01T00:00:00Z"}
    (tmp_path / old / DELETION_DIR).mkdir()
    (tmp_path / old / DELETION_DIR / f"{ident}.json").write_text(json.dumps(doc))
    (tmp_path / old / "manifest.json").unlink()
    assert deletion_marks(storage, old) == []
    assert classify_attempt(storage, old).status == "invalid"
    rep = gc(storage, keep=1, grace_seconds=0.0)
    assert [d["id"] for d in rep.damaged] == [old] and (tmp_path / old / "data").exists()


def test_a_mark_that_cannot_be_dated_is_not_reused(tmp_path: Path) -> None:
    """A version holds a mark from an earlier gc; the listing that would tell whether that mark
    is young enough to reuse fails. Then this gc stores its own mark (R-GC-13: its own, unless
    the one there is known to be younger than half an hour): the old one may be cleared by
    another gc meanwhile, and a gc stopped after the record went would leave a lost record."""
    from portable_ckpt.io.deletion import mark_deletion
    from portable_ckpt.storage.faults import Fault

    old, new = _root(tmp_path)
    storage = open_storage(tmp_path)
    mark_deletion(storage, old, reason="retention")
    created: list[str] = []

    class Watch(FaultyStorage):
        def create_if_absent(self, path: str, data: bytes) -> bool:
            created.append(path)
            return super().create_if_absent(path, data)

    # the first listing of deleting/ classifies the version, the second dates its mark
    st = Watch(storage, [Fault(op="list", path=f"{old}/{DELETION_DIR}/", after_ops=1, times=1,
                               error="EIO")])
    rep = gc(st, keep=1, grace_seconds=0.0)
    assert rep.deleted == [old] and rep.complete and not (tmp_path / old).exists()
    assert [p.split("/")[:2] for p in created] == [[old, DELETION_DIR]]
    check_restores(storage, new)


def test_a_version_another_gc_removed_before_the_mark_is_gone_once(tmp_path: Path) -> None:
    """An overlapping gc (a manager's retention) removed the whole version while this one was
    storing its mark, which failed for that: the version is reported ``gone`` once, not
    deleted by this run, and nothing else is tried on it (scripting review F7's counts)."""
    import shutil

    from portable_ckpt.storage.faults import Fault

    old, new = _root(tmp_path)

    def other_gc(op: str, path: str) -> None:
        shutil.rmtree(tmp_path / old)

    st = FaultyStorage(open_storage(tmp_path), [Fault(op="create", path=f"{old}/{DELETION_DIR}/*",
                                                      error="EIO", callback=other_gc)])
    rep = gc(st, keep=1, grace_seconds=0.0)
    assert rep.gone == [old] and rep.deleted == [] and rep.complete, rep.to_json()
    assert not (tmp_path / old).exists()
    check_restores(open_storage(tmp_path), new)


def test_a_store_that_claims_a_fresh_mark_exists_deletes_nothing(tmp_path: Path) -> None:
    """A mark is created exclusively under a fresh random name: a store that answers "exists
    already" stores no mark (it is not what it says), so the record must not go (R-GC-13: no
    mark, no deletion)."""
    old, _ = _root(tmp_path)

    class Claims(FaultyStorage):
        def create_if_absent(self, path: str, data: bytes) -> bool:
            if f"/{DELETION_DIR}/" in path:
                return False
            return super().create_if_absent(path, data)

    rep = gc(Claims(open_storage(tmp_path), []), keep=1, grace_seconds=0.0)
    assert [u["id"] for u in rep.unknown] == [old] and rep.deleted == []
    check_restores(open_storage(tmp_path), old)


def test_an_abandoned_attempt_that_cannot_be_deleted_is_a_failure(tmp_path: Path) -> None:
    """An abandoned attempt whose files cannot be deleted (a permission) is named in
    ``report.unknown`` ("delete failed", exit non-zero), not taken for a save that committed
    meanwhile (which would read as no problem)."""
    import numpy as np

    from portable_ckpt.io.writer import ShardWriter, new_attempt_id
    from portable_ckpt.storage.faults import Fault

    make_version(str(tmp_path), 1)
    storage = open_storage(tmp_path)
    stale = new_attempt_id(2)
    w = ShardWriter(storage, stale, 0)
    w.add_tensor("w", np.zeros((4, 4), np.float32))
    w.finish()
    st = FaultyStorage(storage, [Fault(op="delete", path=f"{stale}/*", error="EACCES")])
    # (a minute on: the attempt id's time, from this host's clock, may be ahead of the file
    # system's by a few milliseconds, and a grace of 0 then keeps it)
    rep = gc(st, keep=1, grace_seconds=0.0, now=lambda: time.time() + 60)
    assert rep.committed_meanwhile == [] and rep.abandoned == [], rep.to_json()
    assert [(u["id"], u["status"]) for u in rep.unknown] == [(stale, "delete failed")]
