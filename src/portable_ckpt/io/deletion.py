"""How gc deletes one attempt, and the deletion mark it writes first (spec §15.2).

:func:`delete_attempt` stores a deletion mark, deletes the commit record, then the records and
writer indexes, then the data and entries, and the mark last (R-GC-3, R-GC-13).

gc deletes a version's ``manifest.json`` first (R-GC-3). A gc stopped right after that (kill -9,
a node lost, the job whose retention it was) left the version's drill, copy and verification
records and its writer indexes without a commit record: every tool took that for a committed
version whose record was lost, gc kept it and exited non-zero at every run, and ``recommit``
brought back what retention had deleted (on-call review 23, F1 and N2). A deletion mark
``<attempt>/deleting/<deletion_id>.json``, written before the commit record is deleted, tells
the two apart: without a commit record, an attempt that holds one is a version being deleted
(``incomplete``, removed by a later gc once the grace period has passed), and no tool rebuilds
its commit record (R-GC-13, errata 18).

While the commit record is there a mark changes nothing: the version is committed (a gc was
stopped between the two, or could not delete the record), and readers ignore the directory
(R-LAYOUT-4). gc removes the marks of a version it keeps once they are older than its grace
period and an hour, the record seen, so that a record lost later is again a version whose
record was lost, kept.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from portable_ckpt.errors import CheckpointError, FileMissingError, LimitError, StorageError
from portable_ckpt.format import jsonio
from portable_ckpt.format.naming import utc_now_iso
from portable_ckpt.io.annotations import (
    ANNOTATION_KINDS,
    annotation_id,
    parse_record,
    read_listed_record,
    version_gone,
)
from portable_ckpt.storage import ObjectInfo, Storage

if TYPE_CHECKING:
    from portable_ckpt.io.gc import GcReport

_log = logging.getLogger("portable_ckpt.io.gc")  # (gc's deletions: gc's logger)

__all__ = [
    "DELETION_DIR", "delete_attempt", "deletion_marks", "mark_deletion", "remark_if_record_gone",
    "storage_full"]

#: The directory of deletion marks inside an attempt.
DELETION_DIR = "deleting"
#: The name of a mark: its ``deletion_id`` (deletion.schema.json) and ``.json``.
_NAME = re.compile(r"g[0-9]{8}T[0-9]{12}Z-[0-9a-f]{8}\.json\Z")


def mark_deletion(storage: Storage, attempt_id: str, *, reason: str) -> str:
    """Store a deletion mark in ``attempt_id`` (before its commit record is deleted).

    Returns the mark's path, relative to the root.

    Raises:
        CheckpointError: it could not be stored: the version must not be deleted then.

    """
    from portable_ckpt import __version__
    from portable_ckpt.format.schemas import validate_document

    ident = annotation_id("g")
    rec: dict[str, Any] = {
        "format": "portable-ckpt-deletion", "format_version": "1.0", "deletion_id": ident,
        "attempt_id": attempt_id, "started_at": utc_now_iso(), "reason": reason[:1024],
        "by": f"portable-ckpt {__version__} gc on {socket.gethostname()}, pid {os.getpid()}"[
            :256],
    }
    rel = f"{attempt_id}/{DELETION_DIR}/{ident}.json"
    validate_document(rec, "deletion.schema.json", what=rel)
    if not storage.create_if_absent(rel, jsonio.dumps(rec, indent=2)):
        raise StorageError(f"{storage.url}/{rel} exists already (a fresh random name): the "
                           "storage is not what it says; nothing was deleted", path=rel)
    return rel


def deletion_marks(
    storage: Storage, attempt_id: str, *, first: bool = False,
    younger_than: float | None = None, now: float = 0.0,
) -> list[ObjectInfo]:
    """The deletion marks ``attempt_id`` holds: records named by their own ``deletion_id``.

    ``first``: stop at the first that counts (whether there is one). ``younger_than``: only
    marks whose modification time is less than that many seconds before ``now`` are read.

    A file under ``deleting/`` counts only when it validates, names this attempt and is stored
    under its own id: a mark makes a version whose commit record is gone deletable, so only what
    a gc wrote counts (anything else leaves the attempt what it was, a version whose record was
    lost, kept). Never more than one document's size is read per file, and only files named
    like a mark are read.

    Raises:
        CheckpointError: a storage error while listing or reading (the attempt is unknown then).

    """
    out = []
    for info in storage.list(f"{attempt_id}/{DELETION_DIR}/", recursive=False):
        name = info.path.rsplit("/", 1)[-1]
        if not _NAME.match(name) or info.size > jsonio.MAX_DOCUMENT_BYTES:
            continue
        if younger_than is not None and now - info.mtime >= younger_than:
            continue
        try:
            data = read_listed_record(storage, info.path)
        except (FileMissingError, LimitError):
            continue  # deleted since the listing (a gc finishing its work)
        if _counts(data, attempt_id, name, info.path):
            out.append(info)
            if first:
                break
    return out


def _counts(data: bytes, attempt_id: str, name: str, rel: str) -> bool:
    from portable_ckpt.format.manifest import is_newer_major
    from portable_ckpt.format.schemas import validate_document

    parsed = parse_record(data, rel, "portable-ckpt-deletion")
    if parsed is None:
        return False
    doc = parsed[0]
    own = doc.get("attempt_id") == attempt_id and f"{doc.get('deletion_id')}.json" == name
    # (well-formed only, as for drill, copy and verification records: "01.0" is no version)
    if is_newer_major(doc.get("format_version")):
        # A newer tool's mark: it cannot be validated here, and a gc of that tool deleted the
        # commit record on purpose; it counts under its own name, for this attempt (as a pin
        # of a newer major pins).
        return own
    try:
        validate_document(doc, "deletion.schema.json", what=rel)
    except CheckpointError:
        return False
    return own


def _any_file(storage: Storage, prefix: str) -> bool:
    """Whether anything is stored under ``prefix`` (the listing's first entry only)."""
    return next(iter(storage.list(prefix)), None) is not None


def _still_there(storage: Storage, record: str) -> bool:
    """Whether ``record`` is there beyond doubt (False where the storage cannot tell)."""
    try:
        return storage.exists(record)
    except CheckpointError:
        return False


#: errno values of a storage that is full (a disk, a quota).
_FULL = {errno.ENOSPC, errno.EDQUOT}


def _young_mark(
    storage: Storage, attempt_id: str, storage_now: Callable[[], float],
) -> str | None:
    """A mark of the version no gc clears for a while (:data:`REUSE_MARK_SECONDS`), or None.

    Dated on the storage's clock, as a clearing gc dates it (re-attack 24: on this host's, a
    clock half an hour behind reused a mark that another gc cleared at once). A storage error
    answers none (a mark of its own is stored).
    """
    try:
        found = deletion_marks(storage, attempt_id, first=True,
                               younger_than=REUSE_MARK_SECONDS, now=storage_now())
    except CheckpointError:
        return None
    return found[0].path if found else None


def _keep_marked(storage: Storage, attempt_id: str, mark: str, reason: str) -> None:
    """After the commit record went: store a mark again where ``mark`` is no longer there.

    A gc paused for longer than a mark's clearing age between its mark and the record's
    deletion (SIGSTOP, a suspended VM) found it cleared by a gc that kept the version: the
    record gone without a mark is a lost record again (re-attack 24, N3). A clearing gc looks
    for the record right after it cleared (:func:`remark_if_record_gone`): of the two, one
    sees the other's deletion.
    """
    if _still_there(storage, mark):
        return
    with contextlib.suppress(CheckpointError):  # (the first mark's failure path: said by gc)
        mark_deletion(storage, attempt_id, reason=reason)
        _log.warning("%s: the deletion mark %s went while gc deleted %s (another gc cleared "
                     "it): stored again", storage.url, mark, attempt_id)


def _directory_left(storage: Storage, attempt_id: str) -> bool:
    """Whether the attempt's directory is there still, with nothing in it that is listed.

    Removed once more first: another gc deleting the attempt at once held its deletion mark
    there when this one's removal ran, and had not removed the emptied directory yet when this
    one looked (re-attack 27, 4: "could not be removed", exit 1, the directory gone).
    """
    try:
        for wait in (0.0, 0.05, 0.2):  # the other gc removes its mark, then the directory
            time.sleep(wait)
            storage.remove_empty_dirs(f"{attempt_id}/")
            if attempt_id not in storage.list_dirs("") or _any_file(storage, f"{attempt_id}/"):
                return False
    except CheckpointError:
        return False
    return True


def _nothing_removed(storage: Storage, prefix: str, listed: list[str] | None) -> bool:
    """Whether every file listed under ``prefix`` before the deletions is there still."""
    if not listed:
        return False
    try:
        return set(listed) <= {o.path for o in storage.list(prefix)}
    except CheckpointError:
        return False  # cannot tell: reported as left behind


def remark_if_record_gone(storage: Storage, attempt_id: str) -> bool:
    """After clearing a version's marks: mark it again if its commit record went meanwhile.

    The other half of :func:`_keep_marked`: a gc that stored its mark, paused past the
    clearing age and deleted the record after this one looked for it. Returns whether a mark
    was stored.
    """
    try:
        if storage.exists(f"{attempt_id}/manifest.json"):
            return False
        mark_deletion(storage, attempt_id,
                      reason="its commit record went while a gc cleared its deletion mark")
    except CheckpointError as exc:
        _log.warning("%s: could not tell whether the commit record of %s is still there after "
                     "its deletion mark was cleared (%s)", storage.url, attempt_id, exc)
        return False
    return True


#: What object stores answer when a bucket is full or over quota (Ceph RGW's QuotaExceeded,
#: MinIO's XMinioStorageFull, HTTP 507): a store where deleting still frees room (re-attack
#: 24, N2: every run failed on a full bucket, "access was denied").
_FULL_CODES = re.compile(r"\b(QuotaExceeded|XMinioStorageFull|XMinioAdminBucketQuotaExceeded|"
                         r"InsufficientStorage|507)\b")


def storage_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the storage is full: ENOSPC, EDQUOT, or an object store's quota."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _FULL:
            return True
        seen = seen.__cause__ or seen.__context__
    found = re.search(r"errno (\d+)\)", str(exc))
    return (found is not None and int(found[1]) in _FULL) or bool(_FULL_CODES.search(str(exc)))


#: What gc deletes of a version right after its commit record, in this order, before the data
#: (R-GC-3: the records, then the writer indexes).
_FIRST_GONE = (frozenset(ANNOTATION_KINDS), frozenset(("index",)))
#: A mark this much younger than a gc's own clearing age is one no gc clears before this one
#: is done: the next run reuses it rather than adding one (a store that refuses deletes left
#: one more mark per run: maintainer review 24, 1).
REUSE_MARK_SECONDS = 1800.0


def delete_attempt(
    storage: Storage, attempt_id: str, report: GcReport, recorded: bool, *,
    mark: str | None = None, marked_before: bool = False,
    storage_now: Callable[[], float] = time.time,
) -> None:
    """Delete one attempt, commit record first (R-GC-3), and abort its unfinished uploads.

    ``mark``: the reason of the deletion mark stored before the commit record is deleted
    (R-GC-13); if the record cannot be deleted, the mark is removed again. ``marked_before``:
    the listing showed a mark, which is reused when younger than :data:`REUSE_MARK_SECONDS` on
    ``storage_now`` (the storage's clock: the one a clearing gc dates marks on).

    Once its record is gone the version no longer exists: a failure after that leaves files,
    not a version, and is reported as such (``report.left_behind``), never as "not deleted"
    (multi-job review F3: an operator read that the versions were intact). An attempt another
    process deleted first (an overlapping gc, a manager's retention) is deleted all the same
    and reported in ``report.gone``, not counted (scripting review F7, SRE review S7).
    """
    record, prefix = f"{attempt_id}/manifest.json", f"{attempt_id}/"
    # What was there before this run deleted anything: the fallback where a store cannot
    # tell who deleted what (an object store's DELETE answers alike).
    there = storage.exists(record) if recorded else _any_file(storage, prefix)
    # Marked first, by every gc its own mark (another's may be cleared meanwhile: mark review
    # 24, F4): a gc stopped after the record went leaves a version being deleted, not one
    # whose record was lost (on-call review 23, F1 and N2). No mark, no deletion; but a full
    # disk is freed without one (mark review F2: every run failed, "retry", disk still full).
    marked = reused = None
    try:
        if mark is not None:
            reused = _young_mark(storage, attempt_id, storage_now) if marked_before else None
            if reused is None:
                marked = mark_deletion(storage, attempt_id, reason=mark)
    except CheckpointError as exc:
        if not version_gone(storage, attempt_id):
            if not storage_full(exc):
                raise  # still there: not deleted, and said
            _log.warning("%s: no room for the deletion mark of %s (%s): deleted without it, "
                         "records and indexes first (R-GC-13)", storage.url, attempt_id, exc)
        else:
            # An overlapping gc (a manager's retention) removed it first, directory and all.
            report.deleted_by_other(attempt_id)
            return
    try:
        removed_record = storage.delete(record)
        if storage.exists(record):
            # A store that answers "deleted" and keeps the object (an S3-compatible one, a
            # proxy): deleting the data next would leave a committed record without its files.
            raise StorageError(
                f"{storage.url}/{record}: the store answered that it deleted this commit "
                "record, but it is still there; nothing else of the version was deleted "
                "(retry later, or look at the store)", path=record, retryable=True)
    except CheckpointError:
        # Its mark goes again only where the record is known to be there still: a DELETE whose
        # answer was lost took effect (mark review F3: no record and no mark, a lost record).
        if marked is not None and _still_there(storage, record):
            with contextlib.suppress(CheckpointError):
                storage.delete(marked)  # still committed: no mark left behind
                storage.remove_empty_dirs(f"{attempt_id}/{DELETION_DIR}/")
        raise
    kept_mark = marked or reused
    if mark is not None and kept_mark is not None:
        _keep_marked(storage, attempt_id, kept_mark, mark)
    listed_paths: list[str] | None = None
    try:
        aborted = storage.abort_uploads(prefix)
        report.aborted_uploads += aborted
        # One listing, then the records, then the writer indexes, then data and entries, each
        # in as few requests as the store allows (bulk deletes on an object store), and the
        # mark last. A gc stopped half-way leaves its mark with what is left (S3 review 24,
        # L4), and without a mark (a full disk) no record beside indexes: what only a lost
        # record looks like, kept for good and rebuilt by `recommit` (on-call review 23, F1;
        # maintainer review 24, 2).
        listed = [(o.path, o.path[len(prefix):].split("/", 1)[0]) for o in storage.list(prefix)]
        listed_paths = [p for p, _ in listed]
        for parts in _FIRST_GONE:
            storage.delete_many([p for p, top in listed if top in parts])
        first = frozenset().union(*_FIRST_GONE)
        storage.delete_many([p for p, top in listed
                             if top not in first and top != DELETION_DIR])
        removed_dir = storage.delete_prefix(prefix)
    except CheckpointError as exc:
        if not recorded and _nothing_removed(storage, prefix, listed_paths):
            # No record, no file gone (a read-only file system): not deleted, and said so,
            # not "deleted, files left" (fault review 27, F5).
            raise
        report.left_behind.append({"id": attempt_id, "code": exc.code, "message": str(exc),
                                   "retryable": exc.retryable, "had_record": recorded})
        aborted, removed_dir, foreign = 0, None, []
    else:
        foreign = storage.list_foreign(prefix)  # never deleted
        report.foreign_keys.extend(foreign)
        if removed_dir is False and not foreign and _directory_left(storage, attempt_id):
            # Emptied, but the process may not remove it (another user's root, a read-only
            # parent): "deleted", exit 0, and `ls` listed it again (fault review 27, F8).
            report.left_behind.append({
                "id": attempt_id, "code": StorageError.code, "retryable": False,
                "had_record": recorded,
                "message": f"{storage.url.rstrip('/')}/{attempt_id}/: its files are deleted, "
                           "but the directory could not be removed (a permission or a "
                           "read-only file system: the root's owner removes it)"})
    # Of two runs deleting one attempt at once, exactly one removed its record (a version) or
    # its directory (an attempt without a record, unless foreign entries keep it).
    if recorded:
        mine = there if removed_record is None else removed_record
    else:
        mine = there if removed_dir is None or foreign else removed_dir
    if not (mine or aborted):
        report.deleted_by_other(attempt_id)
