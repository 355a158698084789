"""Pins: versions that every gc keeps until they are unpinned (spec §15.3).

A pin record ``pins/<pin_id>.json`` at the root names one version (R-PIN-1). It belongs to the
root's retention, not to the version: readers never see it (R-LAYOUT-4) and a copy of the
version does not carry it. gc keeps every pinned attempt, and while a pin cannot be read it
deletes no attempt that has a commit record (R-GC-11).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from portable_ckpt.errors import (
    CheckpointError,
    FileMissingError,
    LimitError,
    NotFoundError,
    PathUnsafeError,
    StorageError,
    UsageError,
)
from portable_ckpt.format import jsonio
from portable_ckpt.format.naming import check_attempt_id, utc_now_iso
from portable_ckpt.io.annotations import (
    annotation_id,
    parse_record,
    read_listed_record,
    version_gone,
)
from portable_ckpt.logs import log_event
from portable_ckpt.storage import Storage, open_storage

__all__ = ["PIN_DIR", "pin", "read_pins", "unpin"]

_log = logging.getLogger(__name__)

#: The directory of pin records, directly under the root.
PIN_DIR = "pins"
#: Longest ``reason`` and ``by`` of a record (``pin.schema.json``).
_REASON_CHARS, _BY_CHARS = 1024, 256


def read_pins(root: str | os.PathLike[str] | Storage) -> dict[str, list[dict[str, Any]]]:
    """The pin records of a root that count (R-PIN-2), by the attempt id they name.

    A record counts when it validates, is stored under its own ``pin_id`` and names an attempt
    id; one that does not is read a second time first (a flipped bit must not unpin a version),
    and two reads that differ are a storage error. A record of a newer major format version
    that names an attempt id counts too: a pin this tool cannot validate still pins.

    Raises:
        CheckpointError: a storage error while ``pins/`` was listed or a record read: any
            version may be pinned (gc then deletes no version, R-GC-11).

    """
    storage = open_storage(root)
    listed = list(storage.list(f"{PIN_DIR}/", recursive=False))
    if not listed:  # absent, or something that lists as empty: a symlink, a file (F14)
        _pins_is_a_directory(storage)
    _records_are_files(storage)
    out: dict[str, list[dict[str, Any]]] = {}
    for info in listed:
        name = info.path.rsplit("/", 1)[-1]
        if not _PIN_NAME.match(name) or info.size > jsonio.MAX_DOCUMENT_BYTES:
            # Not a record: one counts under its own pin_id only. Never read (20,000 junk
            # files took every restore 80 s: review of the change F12).
            continue
        doc = _read_pin(storage, info.path)
        if doc is not None:
            out.setdefault(str(doc["attempt_id"]), []).append(doc)
    return out


#: The name of a pin record: its ``pin_id`` (pin.schema.json) and ``.json``.
_PIN_NAME = re.compile(r"p[0-9]{8}T[0-9]{12}Z-[0-9a-f]{8}\.json\Z")


def _pins_is_a_directory(storage: Storage) -> None:
    """Raise unless ``pins`` at the root is absent or a directory of the root's own.

    A symbolic link (to a disk elsewhere), a file or a FIFO named ``pins`` listed as no pins at
    all, and gc deleted pinned versions (review of the change F14): it is a pin record that
    could not be read (R-GC-11).

    Raises:
        PathUnsafeError: ``pins`` is something else than a directory.

    """
    odd = PIN_DIR in storage.list_foreign("", recursive=False) or any(
        o.path == PIN_DIR for o in storage.list("", recursive=False))
    if odd:
        raise PathUnsafeError(
            f"{storage.url.rstrip('/')}/{PIN_DIR} is not a directory (a symbolic link, a file or "
            "a FIFO; on an object store, an object named exactly `pins`): the pins cannot be "
            "read, so any version may be pinned; move it away (look at what it holds first: "
            "pin records belong in the root's own `pins/` directory, or under the `pins/` "
            "prefix of an object store)",
            path=PIN_DIR,
        )


def _records_are_files(storage: Storage) -> None:
    """Raise when an entry named like a pin record is no plain file of the root's own.

    A record replaced by a symbolic link (a "symlink" cache mode, ``cp -s``, a backup restore),
    a FIFO or a directory, or an object key that only looks like one (``pins//<id>.json``,
    ``pins/<id>.json/``), was passed over as no record, and gc deleted the version it pins
    (attack review 5 F1). Its name is the best sign that it is a pin: a pin that cannot be
    read (R-GC-11).

    Raises:
        PathUnsafeError: such an entry is there.

    """
    # Recursive: an object store lists ``pins//<id>.json`` under the "directory" ``pins//``.
    odd = storage.list_foreign(f"{PIN_DIR}/", recursive=True) + [
        f"{PIN_DIR}/{d}/" for d in storage.list_dirs(f"{PIN_DIR}/")]
    for entry in odd:
        if _PIN_NAME.match(entry.rstrip("/").rsplit("/", 1)[-1]):
            raise PathUnsafeError(
                f"{storage.url.rstrip('/')}/{entry} is named like a pin record but is no plain "
                "file (a symbolic link, a FIFO, a directory or an odd object key): the pin "
                "cannot be read, so any version may be pinned; replace it with the record "
                "itself, or remove it to unpin",
                path=entry,
            )


def _read_pin(storage: Storage, rel: str) -> dict[str, Any] | None:
    """The pin record at ``rel`` if it counts, else None (read twice before it is passed over)."""
    try:
        first = read_listed_record(storage, rel)
    except (FileMissingError, LimitError):
        return None  # unpinned since the listing
    doc = _counting_pin(first, rel)
    if doc is not None:
        return doc
    try:
        again = read_listed_record(storage, rel)
    except (FileMissingError, LimitError):
        return None
    if again == first:
        return None
    doc = _counting_pin(again, rel)
    if doc is None:
        raise StorageError(
            f"{storage.url}/{rel}: two reads of the pin record gave different bytes (it is never "
            "modified, R-PIN-1): the storage or this host's reads are unreliable; try again",
            path=rel,
        )
    return doc


def _counting_pin(data: bytes, rel: str) -> dict[str, Any] | None:
    from portable_ckpt.format.schemas import validate_document

    parsed = parse_record(data, rel, "portable-ckpt-pin")
    if parsed is None:
        return None
    doc, major = parsed
    if major is not None and major != "1":
        # A newer tool's pin: it cannot be validated here, and keeping is the safe side; still
        # only under its own name (unpin deletes exactly that file: review of the change F1).
        own = isinstance(doc.get("pin_id"), str) and f"{doc['pin_id']}.json" == rel.rsplit(
            "/", 1)[-1]
        return doc if own and isinstance(doc.get("attempt_id"), str) else None
    try:
        validate_document(doc, "pin.schema.json", what=rel)
    except CheckpointError:
        return None
    return doc if f"{doc['pin_id']}.json" == rel.rsplit("/", 1)[-1] else None


def pin(
    root: str | os.PathLike[str] | Storage,
    attempt_id: str,
    *,
    reason: str | None = None,
    by: str | None = None,
) -> str:
    """Pin the committed version ``attempt_id`` of a root; return the record's path.

    A version this ``by`` pinned already keeps its record (its path is returned). Every gc
    keeps a pinned version, and it takes no place among gc's ``keep`` (R-GC-11),
    until :func:`unpin`. ``reason`` (at most 1,024 characters) and ``by`` (at most 256) are
    stored in the record for whoever lists the root.

    Raises:
        UsageError: ``reason`` or ``by`` is too long or not a string.
        NotFoundError, ManifestMissingError: no committed version ``attempt_id``.
        CheckpointError: a storage error (nothing is pinned).

    """
    from portable_ckpt.format.schemas import validate_document
    from portable_ckpt.io.versions import load_manifest

    check_attempt_id(attempt_id, what="pin: attempt_id")
    for name, value, most in (("reason", reason, _REASON_CHARS), ("by", by, _BY_CHARS)):
        if value is not None and (not isinstance(value, str) or len(value) > most):
            raise UsageError(f"pin: {name} must be a string of at most {most} characters")
    storage = open_storage(root)
    load_manifest(storage, attempt_id)  # only committed versions are pinned
    # Pinned by this `by` already (a cron job pinning again): that record, not one more each
    # run (scripting review F8). Pins that cannot be read: a new record, as before.
    try:
        held = read_pins(storage).get(attempt_id, [])
    except CheckpointError:
        held = []
    for doc in held:
        if doc.get("by") == by and isinstance(doc.get("pin_id"), str):
            return f"{PIN_DIR}/{doc['pin_id']}.json"
    ident = annotation_id("p")
    rec: dict[str, Any] = {
        "format": "portable-ckpt-pin", "format_version": "1.0", "pin_id": ident,
        "attempt_id": attempt_id, "pinned_at": utc_now_iso(),
    }
    rec.update({k: v for k, v in (("reason", reason), ("by", by)) if v is not None})
    rel = f"{PIN_DIR}/{ident}.json"
    validate_document(rec, "pin.schema.json", what=rel)
    if not storage.create_if_absent(rel, jsonio.dumps(rec, indent=2)):
        raise UsageError(f"{storage.url}/{rel} already exists; pin again")
    # A gc that read the pins before this one may have deleted the version meanwhile; gc
    # deletes the commit record first (R-GC-3), so its presence is the question (no re-parse).
    if version_gone(storage, attempt_id):
        storage.delete(rel)
        raise NotFoundError(
            f"{attempt_id} was deleted while it was being pinned (a gc ran at the same time); "
            "nothing is pinned",
            path=f"{attempt_id}/manifest.json",
        )
    log_event(_log, "pin.created", {"root": storage.url, "attempt_id": attempt_id, "pin": rel},
              "pinned %s of %s (%s)", attempt_id, storage.url, rel)
    return rel


def unpin(
    root: str | os.PathLike[str] | Storage, attempt_id: str, *, by: str | None = None
) -> list[str]:
    """Delete every pin record of ``attempt_id`` (R-PIN-1); return their paths ([]: not pinned).

    ``by``: only the records whose ``by`` is this (a manager removes its own pins, never one an
    operator wrote).

    Raises:
        CheckpointError: a storage error (the records deleted before it stay deleted; the
            version may still be pinned: run it again).

    """
    check_attempt_id(attempt_id, what="unpin: attempt_id")
    storage = open_storage(root)
    out = []
    for doc in read_pins(storage).get(attempt_id, []):
        if by is not None and doc.get("by") != by:
            continue
        rel = f"{PIN_DIR}/{doc['pin_id']}.json"
        storage.delete(rel)
        out.append(rel)
    if out:
        log_event(_log, "pin.removed", {"root": storage.url, "attempt_id": attempt_id,
                                        "pins": out},
                  "unpinned %s of %s (%d record(s))", attempt_id, storage.url, len(out))
    return out
