"""Deletion marks: what gc writes into a version before its commit record goes (spec §15.2).

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
period, so that a record lost later is again a version whose record was lost, kept.
"""

from __future__ import annotations

import os
import re
import socket
from typing import Any

from portable_ckpt.errors import CheckpointError, FileMissingError, LimitError, StorageError
from portable_ckpt.format import jsonio
from portable_ckpt.format.naming import utc_now_iso
from portable_ckpt.io.annotations import annotation_id, parse_record, read_listed_record
from portable_ckpt.storage import ObjectInfo, Storage

__all__ = ["DELETION_DIR", "deletion_marks", "mark_deletion"]

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


def deletion_marks(storage: Storage, attempt_id: str) -> list[ObjectInfo]:
    """The deletion marks ``attempt_id`` holds: records named by their own ``deletion_id``.

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
        try:
            data = read_listed_record(storage, info.path)
        except (FileMissingError, LimitError):
            continue  # deleted since the listing (a gc finishing its work)
        if _counts(data, attempt_id, name, info.path):
            out.append(info)
    return out


def _counts(data: bytes, attempt_id: str, name: str, rel: str) -> bool:
    from portable_ckpt.format.schemas import validate_document

    parsed = parse_record(data, rel, "portable-ckpt-deletion")
    if parsed is None:
        return False
    doc, major = parsed
    own = doc.get("attempt_id") == attempt_id and f"{doc.get('deletion_id')}.json" == name
    digits = (major or "").lstrip("0")  # compared as text: CPython refuses huge int()s
    if len(digits) > 1 or digits > "1":
        # A newer tool's mark: it cannot be validated here, and a gc of that tool deleted the
        # commit record on purpose; it counts under its own name, for this attempt (as a pin
        # of a newer major pins).
        return own
    try:
        validate_document(doc, "deletion.schema.json", what=rel)
    except CheckpointError:
        return False
    return own
