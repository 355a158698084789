"""Versions of a root: discovery through commit records, ``latest``, annotations and retention.

Every attempt is classified by its commit record (spec §4.1, §15.1):

* ``committed`` — a valid commit record: a version;
* ``incomplete`` — the storage answered that ``manifest.json`` does not exist;
* ``invalid`` — a commit record was read in full and is not a valid record of any format version;
* ``foreign`` — a commit record of a format version this implementation does not implement;
* ``unreadable`` — the storage failed while the record (or the version's drill and copy
  records) was read: nothing is known about the attempt;
* ``stray`` — something that is not a regular file (a symlink, FIFO, device or directory) has
  the record's name: a foreign entry (R-LAYOUT-7) that no writer of the format creates. Readers
  skip the attempt (with a warning naming it); gc neither deletes nor counts it, and reports the
  entry in ``foreign_keys``.

Only ``incomplete`` and ``invalid`` attempts are garbage, after the grace period. A storage error
is never evidence of absence: gc skips what it could not classify (and says so), and ``latest``
fails rather than return an older version than one it could not read.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import datetime as _dt
import fractions
import hashlib
import logging
import math
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from portable_ckpt.errors import (
    DAMAGE_CODES,
    CheckpointError,
    CommitConflictError,
    FeatureUnsupportedError,
    FileMissingError,
    JsonInvalidError,
    LimitError,
    ManifestMissingError,
    NotFoundError,
    PathUnsafeError,
    StorageError,
    UsageError,
    VersionUnsupportedError,
)
from portable_ckpt.format import jsonio, usage
from portable_ckpt.format.manifest import (
    FORMAT_VERSION,
    FORMAT_VERSION_RE,
    FORMAT_VERSIONS,
    FileRecord,
    Manifest,
    parse_manifest,
)
from portable_ckpt.format.naming import (
    ATTEMPT_ID_RE,
    attempt_time,
    check_attempt_id,
)
from portable_ckpt.format.vocab import DEFAULT_GRACE_SECONDS
from portable_ckpt.logs import Progress, log_event
from portable_ckpt.storage import ObjectInfo, Storage, open_storage

__all__ = [
    "RECORDS_KEPT",
    "STATUSES",
    "Classification",
    "GcReport",
    "VersionInfo",
    "attempt_names",
    "check_grace",
    "check_record_absent",
    "check_retention",
    "classify_attempt",
    "commit_time",
    "foreign_keys",
    "gc",
    "latest",
    "likely_record",
    "list_versions",
    "load_manifest",
    "read_annotations",
    "read_file_again",
    "write_drill_record",
    "confirm_damage",
    "record_verification",
    "verification_verdict",
    "sampled_chunks",
    "upload_only_attempts",
    "write_verification_record",
    "prune_annotations",
    "prune_quietly",
    "superseded",
]

COMMITTED, INCOMPLETE, INVALID, FOREIGN, UNREADABLE, STRAY = (
    "committed",
    "incomplete",
    "invalid",
    "foreign",
    "unreadable",
    "stray",
)
#: Every status an attempt can have (``ls``, ``gc``).
STATUSES = (COMMITTED, INCOMPLETE, INVALID, FOREIGN, UNREADABLE, STRAY)
#: Post-commit record kinds: directory -> (id member, schema file, time member).
ANNOTATION_KINDS = {
    "drills": ("drill_id", "drill.schema.json", "finished_at"),
    "copies": ("copy_id", "copy.schema.json", "verified_at"),
    "verifications": ("verification_id", "verification.schema.json", "verified_at"),
}
_log = logging.getLogger(__name__)


def _version_key(text: str) -> tuple[tuple[int, str], tuple[int, str]]:
    """An order of well-formed versions (``FORMAT_VERSION_RE``) that never converts to int.

    Decimals without leading zeros order by length, then as text; a MINOR of any number of
    digits is well-formed (spec §16.1, errata 6), and CPython refuses to convert more than
    4,300 digits.
    """
    major, _, minor = text.partition(".")
    return (len(major), major), (len(minor), minor)


#: The newest format version this implementation reads.
IMPLEMENTED = max(_version_key(v) for v in FORMAT_VERSIONS)


@dataclass
class VersionInfo:
    """One attempt of a root as ``ls`` shows it.

    ``status`` is one of :data:`STATUSES`; ``error`` says why an attempt is not ``committed``
    (or why its drill and copy records could not be read). ``committed_at`` of a ``foreign``
    version is the time its record claims.
    """

    id: str
    step: int
    status: str
    path: str
    committed_at: str | None = None
    drills: list[dict[str, Any]] = field(default_factory=list)
    copies: list[dict[str, Any]] = field(default_factory=list)
    verifications: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    bytes: int = 0
    error_code: str | None = None
    annotations_unreadable: bool = False

    @property
    def drilled(self) -> bool:
        """Whether a restore drill of this version passed."""
        return any(d.get("ok") is True for d in self.drills)

    @property
    def verification_failed(self) -> bool:
        """Whether a sampled verification of this version failed (it is never restored)."""
        return any(v.get("ok") is False for v in self.verifications)

    @property
    def verified(self) -> bool:
        """Whether a verification of this version passed (and none failed)."""
        ok = any(v.get("ok") is True for v in self.verifications)
        return ok and not self.verification_failed

    @property
    def copied(self) -> bool:
        """Whether a verified copy on another root exists."""
        return any(c.get("ok") is True for c in self.copies)

    @property
    def known(self) -> bool:
        """Whether everything gc needs about this attempt was read (no storage error)."""
        return self.status != UNREADABLE and not self.annotations_unreadable

    def to_json(self) -> dict[str, Any]:
        """JSON form used by ``ls --json``."""
        return {
            "id": self.id,
            "step": self.step,
            "status": self.status,
            "path": self.path,
            "committed_at": self.committed_at,
            "bytes": self.bytes,
            "drilled": self.drilled,
            "drills": self.drills,
            "copies": [c.get("destination") for c in self.copies if c.get("ok") is True],
            "verified": self.verified,
            "verification_failed": self.verification_failed,
            "error": self.error,
            "error_code": self.error_code,
        }


_TIMESTAMP = re.compile(
    r"^([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?Z\Z"
)


def timestamp_key(ts: str | None) -> tuple[int, ...]:
    """Sort key of a format timestamp: its fields, the fraction as nanoseconds (spec §5).

    Fields, not a calendar conversion (R-COMMIT-18): ``2026-02-31`` is a timestamp the pattern
    accepts, and sorts between ``02-30`` and ``03-01``. Text order would be wrong too:
    ``"...00Z"`` sorts before ``"...00.5Z"``. ``(-1,)`` (before every timestamp) for none.
    """
    m = _TIMESTAMP.match(ts) if ts else None
    if m is None:
        return (-1,)
    frac = m.group(7) or ""
    return (*(int(g) for g in m.groups()[:6]), int((frac + "000000000")[:9]))


def _epoch_us(key: tuple[int, ...]) -> int:
    """Microseconds since 1970 of a :func:`timestamp_key` (proleptic Gregorian, any year).

    Days past a month's end roll over into the next month; no calendar library is involved,
    so no record can make it fail.
    """
    year, month, day, hour, minute, sec, ns = key
    y = year - (month <= 2)
    era, yoe = divmod(y, 400)
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    days = era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468
    return ((days * 24 + hour) * 60 + minute) * 60_000_000 + sec * 1_000_000 + ns // 1000


def load_manifest(
    storage: Storage, attempt_id: str, *, known: Mapping[str, bytes] | None = None
) -> Manifest:
    """Read, parse and validate ``<attempt_id>/manifest.json``.

    ``known`` maps attempt ids to the bytes of their record, read already (they are not read
    again, and are checked exactly as bytes read here).
    """
    check_attempt_id(attempt_id, what="version directory")
    rel = f"{attempt_id}/manifest.json"
    data = _read_record(storage, attempt_id, known)
    man = _parse_record(
        jsonio.loads(data, what=rel, max_bytes=jsonio.MAX_MANIFEST_BYTES), rel, attempt_id
    )
    man.source = data
    return man


def _read_record(
    storage: Storage, attempt_id: str, known: Mapping[str, bytes] | None = None
) -> bytes:
    """The bytes of ``<attempt_id>/manifest.json``, refused above the 1 GiB limit (R-SEC-11).

    Raises:
        ManifestMissingError: the storage says there is none.
        JsonInvalidError: it is larger than the limit (nothing is read).
        CheckpointError: a storage error (never taken as absence).

    """
    if known is not None and attempt_id in known:
        data = known[attempt_id]
        if len(data) <= jsonio.MAX_MANIFEST_BYTES:
            return data
    rel = f"{attempt_id}/manifest.json"
    if not storage.capabilities.local_path:
        # An object store answers a GET with the size before the body (refused above the
        # limit): one request, where a test, a size and a read were three (S3 review F4).
        # Locally the test comes first: only a regular file is read (never a FIFO).
        try:
            return storage.read_all(rel, max_size=jsonio.MAX_MANIFEST_BYTES)
        except FileMissingError:
            pass
        except LimitError as exc:
            raise JsonInvalidError(
                f"{rel}: exceeds the manifest limit of {jsonio.MAX_MANIFEST_BYTES} bytes",
                path=rel,
            ) from exc
    elif storage.exists(rel):
        return _read_existing(storage, rel)
    if lists_file(storage, rel):
        return reread_record(storage, rel)
    check_record_absent(storage, attempt_id)
    raise ManifestMissingError(
        f"{storage.url}/{attempt_id} has no manifest.json: the attempt was never committed "
        "(or was interrupted) and does not exist for readers",
        path=rel,
    )


def _read_existing(storage: Storage, rel: str) -> bytes:
    size = storage.size(rel)
    if size > jsonio.MAX_MANIFEST_BYTES:
        raise JsonInvalidError(
            f"{rel}: {size} bytes exceeds the manifest limit of {jsonio.MAX_MANIFEST_BYTES}",
            path=rel,
        )
    return storage.read_all(rel, max_size=jsonio.MAX_MANIFEST_BYTES)


def lists_file(storage: Storage, rel: str) -> bool:
    """Whether a listing of ``rel``'s directory shows it as a regular file."""
    return _listed_info(storage, rel) is not None


def _listed_info(storage: Storage, rel: str) -> ObjectInfo | None:
    """``rel`` as a listing of its directory shows it (size, the storage's time), or ``None``."""
    parent = rel.rsplit("/", 1)[0] + "/"
    return next((info for info in storage.list(parent, recursive=False) if info.path == rel), None)


def reread_record(storage: Storage, rel: str, max_size: int = jsonio.MAX_MANIFEST_BYTES) -> bytes:
    """The record a store answered "absent" for but lists: asked once more, never taken as absent.

    One spurious 404 (an S3-compatible store's replication lag, a caching gateway, a misrouted
    request) made the attempt ``incomplete``: gc deleted the committed version, and readers
    restored the one before without a word (S3 latency review F1, F2). A record that commits
    between the two answers is read here too.

    Raises:
        StorageError: it is absent again: the store contradicts itself; nothing is decided.

    """
    try:
        return storage.read_all(rel, max_size=max_size)
    except FileMissingError as exc:
        raise StorageError(
            f"{storage.url}/{rel}: the storage answers that it does not exist, yet lists it (an "
            "inconsistent store: replication lag, a caching gateway, a misrouted request); the "
            "attempt is left unclassified: nothing deletes it and no reader skips it. Retry "
            "once the store answers consistently",
            path=rel,
        ) from exc


def check_record_absent(storage: Storage, attempt_id: str) -> None:
    """Raise unless nothing at all is at ``<attempt_id>/manifest.json`` (it is no file).

    :meth:`Storage.exists` answers for regular files only. A symlink, FIFO, device or directory
    under the commit record's name is not evidence that the attempt was never committed: an
    attempt classified so would be deleted by gc (its foreign entry with it, R-LAYOUT-7) or
    cleared by a copy. Called only when ``exists`` said no (two listings of one directory).

    Raises:
        PathUnsafeError: something that is not a regular file has the record's name.
        CheckpointError: a storage error (never taken as absence).

    """
    rel = f"{attempt_id}/manifest.json"
    odd = rel in storage.list_foreign(f"{attempt_id}/", recursive=False)
    if odd or "manifest.json" in storage.list_dirs(f"{attempt_id}/"):
        raise PathUnsafeError(
            f"{storage.url}/{rel} is not a regular file (a symlink, FIFO, device or directory): "
            "the attempt cannot be classified, and no tool of this format deletes or replaces it; "
            "inspect it and remove it by hand if it is garbage",
            path=rel,
        )


def read_annotations(
    storage: Storage,
    attempt_id: str,
    kind: str,
    *,
    errors: list[CheckpointError] | None = None,
) -> list[dict[str, Any]]:
    """Read the post-commit records of an attempt: ``drills``, ``copies`` or ``verifications``.

    Only records that validate, name this attempt and are stored under their own id count. A storage error
    or a record of a newer major format version is not "no record": it is raised, or appended
    to ``errors`` when a list is given (the records that could be read are returned).
    """
    out: list[dict[str, Any]] = []
    try:
        listed = list(storage.list(f"{attempt_id}/{kind}/", recursive=False))
    except StorageError as exc:
        if errors is None:
            raise
        errors.append(exc)
        return out
    for info in listed:
        try:
            doc = _annotation(storage, attempt_id, kind, info)
        except (StorageError, VersionUnsupportedError) as exc:
            if errors is None:
                raise
            errors.append(exc)
            continue
        if doc is not None:
            out.append(doc)
    time_member = ANNOTATION_KINDS[kind][2]
    out.sort(key=lambda d: timestamp_key(str(d.get(time_member) or "")))
    return out


#: Records read by listings, by ``(root, path, size, mtime)``: a record is created once and
#: never modified (R-DRILL-7), and every listing (ls, gc, a manager's retention after each save)
#: read and validated every record of every version again (soak review F2). Only records that
#: count are kept, and only small ones: a read that did not give one is never remembered (one
#: flipped bit would have hidden a failed verification for the life of the process, attack
#: review 3 F19), and a parsed document costs up to ~45x its bytes (F9).
_RECORDS: collections.OrderedDict[tuple[str, str, int, float], dict[str, Any]] = (
    collections.OrderedDict()
)
#: Bytes of one cached record at most (the library's records are a few KiB), and of all.
_RECORD_CACHED_MAX = 64 << 10
_RECORDS_BYTES_MAX = 8 << 20
_records_bytes = 0


def _annotation(
    storage: Storage, attempt_id: str, kind: str, info: ObjectInfo
) -> dict[str, Any] | None:
    """One drill or copy record, or ``None`` when it does not count (storage errors raise)."""
    global _records_bytes
    key = (storage.url, info.path, info.size, info.mtime)
    with _SUMMARIES_LOCK:
        if key in _RECORDS:
            _RECORDS.move_to_end(key)
            return copy.deepcopy(_RECORDS[key])  # the caller's own: the cache stays as read
    doc = _read_annotation(storage, attempt_id, kind, info)
    if doc is None or info.size > _RECORD_CACHED_MAX:
        return doc
    with _SUMMARIES_LOCK:
        if key not in _RECORDS:
            _RECORDS[key] = copy.deepcopy(doc)
            _records_bytes += info.size
        while _records_bytes > _RECORDS_BYTES_MAX and _RECORDS:
            _records_bytes -= _RECORDS.popitem(last=False)[0][2]
        if not _RECORDS:
            _records_bytes = 0  # (a test cleared the cache)
    return doc


def _read_annotation(
    storage: Storage, attempt_id: str, kind: str, info: ObjectInfo
) -> dict[str, Any] | None:
    """A record that counts, or None; one that does not is read a second time first.

    Bytes damaged on their way (a flipped bit) made a failed verification or a drill "not a
    record" for that listing, and its gc deleted the only restorable version (attack review 3
    F19): a second read that counts decides, two alike that do not count do not, and two that
    differ with neither counting are a storage error.
    """
    if not info.path.endswith(".json") or info.size > jsonio.MAX_DOCUMENT_BYTES:
        return None
    try:
        first = _annotation_bytes(storage, info.path)
    except (FileMissingError, LimitError):
        return None  # deleted or replaced since the listing: not a record of this version
    doc = _counting_record(first, attempt_id, kind, info.path)
    if doc is not None:
        return doc
    try:  # the same rule as the first read: absent while listed is a storage error (D3)
        again = _annotation_bytes(storage, info.path)
    except (FileMissingError, LimitError):
        return None
    if again == first:
        return None  # read twice alike: it is not a record that counts
    doc = _counting_record(again, attempt_id, kind, info.path)
    if doc is None:
        raise StorageError(
            f"{info.path}: two reads of the record gave different bytes (it is never "
            "modified, R-DRILL-7): the storage or this host's reads are unreliable; try again"
        )
    return doc


def _counting_record(
    data: bytes, attempt_id: str, kind: str, path: str
) -> dict[str, Any] | None:
    """The record in ``data`` if it counts for ``attempt_id`` (R-DRILL-4), else None."""
    from portable_ckpt.format.schemas import validate_document

    id_member, schema_file, _ = ANNOTATION_KINDS[kind]
    try:
        doc = jsonio.loads(data, what=path)
    except StorageError:
        raise
    except CheckpointError:
        return None
    if not isinstance(doc, dict) or doc.get("attempt_id") != attempt_id:
        return None
    if f"{doc.get(id_member)}.json" != path.rsplit("/", 1)[-1]:
        return None  # a record counts only under its own name
    fv = doc.get("format_version")
    if isinstance(fv, str) and fv.split(".", 1)[0] != "1" and re.fullmatch(r"[0-9]+\.[0-9]+", fv):
        # A newer major version's record of this version (a failed verification, perhaps):
        # not "no record" (compatibility review F3), as a foreign version is not abandoned.
        raise VersionUnsupportedError(
            f"{path}: a record of format version {fv}, newer than this tool implements: the "
            "version's records are unknown to it; upgrade portable_ckpt", path=path
        )
    try:
        validate_document(doc, schema_file, what=path)
    except CheckpointError:
        return None
    return doc


def _annotation_bytes(storage: Storage, rel: str) -> bytes:
    """A listed record's bytes; "absent" only when a second listing agrees (§15.1).

    Records are pruned (R-DRILL-9), so one listed and then gone is normal; one answered absent
    that the listing still shows is an inconsistent store, and a failed verification taken as
    "no record" made a manager restore the version it had failed (attack review 2 F13).

    Raises:
        FileMissingError: it is gone, and no longer listed.
        StorageError: answered absent twice while listed.

    """
    try:
        return storage.read_all(rel, max_size=jsonio.MAX_DOCUMENT_BYTES)
    except FileMissingError:
        if not lists_file(storage, rel):
            raise
    return reread_record(storage, rel, max_size=jsonio.MAX_DOCUMENT_BYTES)


def annotation_id(letter: str) -> str:
    """A fresh post-commit record id: ``<letter><YYYYMMDD>T<HHMMSS><micro:06d>Z-<8 hex>`` (UTC)."""
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
    return f"{letter}{stamp}{int(now * 1e6) % 1_000_000:06d}Z-{secrets.token_hex(4)}"


def _write_annotation(
    storage: Storage, attempt_id: str, kind: str, ident: str, record: dict[str, Any]
) -> str:
    load_manifest(storage, attempt_id)  # annotations only exist for committed versions
    rel = f"{attempt_id}/{kind}/{ident}.json"
    if not storage.create_if_absent(rel, jsonio.dumps(record, indent=2)):
        raise UsageError(f"{rel} already exists")
    prune_quietly(storage, attempt_id, kind)
    return rel


#: Records of one kind a version keeps beyond those that decide its status (R-DRILL-9): the
#: newest few, as history for ``inspect``.
RECORDS_KEPT = 4


def superseded(kind: str, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of ``kind`` whose removal changes nothing a tool reads from them (R-DRILL-9).

    ``records`` are the ones that count (:func:`read_annotations`: valid, under their own id,
    naming the attempt), oldest first. Kept: the :data:`RECORDS_KEPT` newest; every failed
    verification (it keeps the version from being restored, R-DRILL-8); the newest passed
    verification of each mode; the newest passed drill; for each destination its newest
    record and its newest passed one. So ``drilled``, ``verified``, ``verification_failed`` and
    the destinations with a verified copy stay what they were, whoever prunes when: a record
    is only ever removed for a newer one of its kind that stays.
    """
    keep: set[int] = {id(r) for r in records[-RECORDS_KEPT:]}

    def newest(pred: Callable[[dict[str, Any]], bool], by: str | None = None) -> None:
        seen: set[str] = set()
        for r in reversed(records):
            group = str(r.get(by)) if by is not None else ""
            if group not in seen and pred(r):
                seen.add(group)
                keep.add(id(r))

    def passed(r: dict[str, Any]) -> bool:
        return r.get("ok") is True

    if kind == "verifications":
        keep |= {id(r) for r in records if not passed(r)}
        newest(passed, "mode")
    elif kind == "copies":
        newest(lambda r: True, "destination")
        newest(passed, "destination")
    else:
        newest(passed)
    return [r for r in records if id(r) not in keep]


def prune_annotations(
    storage: Storage,
    attempt_id: str,
    kind: str,
    records: Sequence[dict[str, Any]] | None = None,
) -> list[str]:
    """Delete the :func:`superseded` records of ``kind`` of a version; return their paths.

    Every verify, copy or drill adds a record, and a cron job adds one an hour for as long as a
    milestone is kept: listings read every one (ops review F12). Only records that count are
    removed, each for a newer one that stays; other files of the directory are never touched.

    ``records``: the ones :func:`read_annotations` returned, when the caller has them.

    Raises:
        CheckpointError: a storage error (what was deleted before it stays deleted).

    """
    if records is None:
        records = read_annotations(storage, attempt_id, kind)
    doomed = superseded(kind, records)
    id_member = ANNOTATION_KINDS[kind][0]
    out = []
    for r in doomed:
        rel = f"{attempt_id}/{kind}/{r[id_member]}.json"
        storage.delete(rel)
        out.append(rel)
    return out


def prune_quietly(
    storage: Storage,
    attempt_id: str,
    kind: str,
    records: Sequence[dict[str, Any]] | None = None,
) -> int:
    """:func:`prune_annotations`, a failure logged, not raised; return how many were removed.

    After a record was written (it stands), or in gc (the version is kept either way): the
    next writer or gc prunes again.
    """
    try:
        return len(prune_annotations(storage, attempt_id, kind, records))
    except CheckpointError as exc:
        log_event(
            _log, "records.prune_failed", {"attempt_id": attempt_id, "kind": kind},
            "older %s records of %s not pruned: %s", kind, attempt_id, exc,
            level=logging.WARNING,
        )
        return 0


def write_drill_record(storage: Storage, attempt_id: str, record: dict[str, Any]) -> str:
    """Store a restore-drill record beside the manifest (never editing the manifest).

    Fills ``format``, ``format_version``, ``attempt_id`` and ``drill_id`` when absent and
    validates the record against ``drill.schema.json``. Returns the record's path.
    """
    from portable_ckpt.format.schemas import validate_document

    rec = {
        "format": "portable-ckpt-drill",
        "format_version": FORMAT_VERSION,
        "attempt_id": attempt_id,
        "drill_id": annotation_id("d"),
        **record,
    }
    validate_document(rec, "drill.schema.json", what=f"{attempt_id}/drills/{rec['drill_id']}.json")
    return _write_annotation(storage, attempt_id, "drills", str(rec["drill_id"]), rec)


def write_verification_record(
    storage: Storage,
    attempt_id: str,
    *,
    ok: bool,
    mode: str,
    fraction: float | None,
    chunks: int,
    seed: int | None = None,
    errors: list[dict[str, str]] | None = None,
    verifier: str | None = None,
) -> str:
    """Record a verification of a committed version in ``verifications/<id>.json`` (spec §14.5).

    ``mode`` is ``"sample"`` (``fraction`` of the stored chunks, chosen with ``seed``) or
    ``"deep"``; ``errors`` are the problems found (``{"code", "message"}``), required when
    ``ok`` is false. A version with a failed verification is never restored by a manager.
    Returns the record's path.
    """
    from portable_ckpt.format.naming import utc_now_iso
    from portable_ckpt.format.schemas import validate_document

    ident = annotation_id("v")
    rec: dict[str, Any] = {
        "format": "portable-ckpt-verification",
        "format_version": FORMAT_VERSION,
        "attempt_id": attempt_id,
        "verification_id": ident,
        "verified_at": utc_now_iso(),
        "ok": ok,
        "mode": mode,
        "fraction": fraction,
        "chunks": chunks,
        "seed": seed,
        # A message quoting long keys (1,024 characters, each escaped) can pass the schema's
        # 65,536: cut, or the record that marks a damaged version would not validate.
        "errors": [{**e, "message": str(e.get("message", ""))[:MESSAGE_CHARS]}
                   for e in (errors or [])[:64]],
    }
    if verifier is not None:
        rec["verifier"] = verifier
    validate_document(
        rec, "verification.schema.json", what=f"{attempt_id}/verifications/{ident}.json"
    )
    return _write_annotation(storage, attempt_id, "verifications", ident, rec)


#: Longest error message a verification record keeps (characters).
MESSAGE_CHARS = 4096


def sampled_chunks(chunks: int, fraction: float) -> int:
    """How many of ``chunks`` range records a sample of ``fraction`` reads: ``ceil(F × n)``.

    R-VERIFY-4: computed exactly on the decimal the record stores (``repr`` of the float, its
    shortest decimal form): binary floating point made ``ceil(0.07 × 100)`` 8, and the former
    rounding to 1e-6 made ``ceil(0.2000000001 × 5)`` 1 (traceability audit F6).
    """
    if not chunks:
        return 0
    exact = fractions.Fraction(repr(float(fraction))) * chunks
    return min(chunks, max(1, math.ceil(exact)))


def verification_verdict(
    errors: Sequence[CheckpointError | dict[str, str]],
) -> tuple[bool | None, list[dict[str, str]]]:
    """What a verification that found ``errors`` may record: ``(ok, damage)``.

    ``(True, [])`` when nothing was found; ``(False, damage)`` with the errors that prove damage
    (:data:`~portable_ckpt.errors.DAMAGE_CODES`); ``(None, [])`` when every error is of another
    kind: a storage that did not answer proves nothing about the bytes, and a version recorded
    as failed is never restored and loses its place among gc's ``keep`` (R-DRILL-8, R-GC-9).
    Every verifier (the CLI, the manager after a save, a node-local tier, a restore) decides
    through this one function.
    """
    found = [e.to_json() if isinstance(e, CheckpointError) else dict(e) for e in errors]
    damage = [e for e in found if e.get("code") in DAMAGE_CODES]
    if not found:
        return True, []
    return (False, damage) if damage else (None, [])


def confirm_damage(
    storage: Storage,
    attempt_id: str,
    files: Mapping[str, FileRecord],
    errors: Sequence[CheckpointError],
) -> list[CheckpointError]:
    """``errors`` with each finding of damage that a second look does not reproduce replaced.

    A verification's verdict is kept for ever (R-DRILL-8): one bit flipped on its way (a flaky
    NIC, a bad DIMM, a client cache), or one 404 of an inconsistent store, must not condemn an
    intact version (multi-job review F10, attack review 2 F12). So the file of each finding is
    read and checked once more (a local file's cached pages dropped first); a file answered
    absent must also be absent from a listing of its directory. A finding that does not come
    back becomes a ``StorageError`` saying so: a problem of this read, not of the version.
    A finding that names no file of the version, or that comes from checksum-verified bytes
    (a codec, header or dtype error), is kept as it is.
    """
    out: list[CheckpointError] = []
    again: dict[str, CheckpointError | None] = {}
    listed: dict[str, set[str] | CheckpointError] = {}  # one listing per directory (F17)
    for e in errors:
        rel = _file_of(e, attempt_id, files) if e.code in _READ_AGAIN else None
        if rel is None:
            out.append(e)
            continue
        if rel not in again:
            again[rel] = read_file_again(storage, f"{attempt_id}/{rel}", files[rel], listed)
        second = again[rel]
        first = f"{e.path or rel}: a first read found [{e.code}] {e.message[:300]}"
        if second is None:
            out.append(StorageError(
                f"{first} — not found again when the file was read a second time: a transient "
                "fault of the storage or of this host, not damage of the version (not recorded)",
                path=e.path,
            ))
        elif second.code in DAMAGE_CODES:
            out.append(e)
        else:  # the second look did not happen: nothing is known either way (F8)
            out.append(StorageError(
                f"{first} — and the file could not be read a second time ([{second.code}] "
                f"{second.message[:300]}): not recorded; run the verification again when the "
                "storage answers",
                path=e.path,
            ))
    return out


#: Findings a second read can contradict. The others (a codec, header, dtype or layout error)
#: come from bytes whose checksums were verified first: the committed bytes say so every time.
_READ_AGAIN = frozenset({"PCK-CHECKSUM", "PCK-FILE-SIZE", "PCK-FILE-MISSING"})


def _file_of(e: CheckpointError, attempt_id: str, files: Mapping[str, FileRecord]) -> str | None:
    path = (e.path or "").removeprefix(f"{attempt_id}/")
    return path if path in files else None


def read_file_again(
    storage: Storage,
    full: str,
    rec: FileRecord,
    listed: dict[str, set[str] | CheckpointError] | None = None,
) -> CheckpointError | None:
    """What a second read of ``full`` finds.

    ``None`` (intact), damage (a code of :data:`DAMAGE_CODES`), or the error that kept it from
    being read. ``listed``: the listings of directories made so far (one per directory, not
    one per missing file: 2,000 files took 25 s, attack review 3 F17).
    """
    from portable_ckpt.io.checksum import verify_file

    local = storage.local_root()
    if local is not None:  # read the device again, not the pages the first read cached
        with contextlib.suppress(OSError):
            fd = os.open(os.path.join(local, full), os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    try:
        verify_file(storage, full, rec)  # its size asked again too: a second look
    except FileMissingError as exc:
        parent = full.rsplit("/", 1)[0] + "/"
        listed = {} if listed is None else listed
        if parent not in listed:
            try:
                listed[parent] = {i.path for i in storage.list(parent, recursive=False)}
            except CheckpointError as why:
                listed[parent] = why.with_traceback(None)
        names = listed[parent]
        if isinstance(names, CheckpointError):
            return names
        if full in names:
            return StorageError(f"{full}: answered absent, yet listed")
        return exc.with_traceback(None)
    except CheckpointError as exc:
        return exc.with_traceback(None)
    return None


def record_verification(
    storage: Storage,
    attempt_id: str,
    errors: Sequence[CheckpointError | dict[str, str]],
    *,
    chunks: int,
    mode: str,
    fraction: float | None = None,
    seed: int | None = None,
    verifier: str | None = None,
) -> str | None:
    """Record a verification of ``attempt_id`` that found ``errors``, as far as they prove anything.

    See :func:`verification_verdict`: ``ok: true`` when nothing was found, ``ok: false`` with
    the damage, and nothing at all (``None`` is returned) when no error proves damage. Else
    returns the record's path. ``chunks`` is the number of range records the verification read
    (:func:`sampled_chunks` of the total for a sample).
    """
    ok, damage = verification_verdict(errors)
    if ok is None:
        return None
    return write_verification_record(
        storage, attempt_id, ok=ok, mode=mode, fraction=fraction, chunks=chunks,
        seed=seed, errors=damage, verifier=verifier,
    )


# -- classification ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Classification:
    """What the commit record of one attempt says (see the module docstring).

    ``committed_at`` is the record's own (for a ``foreign`` record: the one it claims, when it
    has a well-formed one).
    """

    status: str
    manifest: Manifest | None = None
    error: CheckpointError | None = None
    committed_at: str | None = None


def classify_attempt(
    storage: Storage, attempt_id: str, *, known: Mapping[str, bytes] | None = None
) -> Classification:
    """Classify an attempt by its commit record; storage errors give ``unreadable``, never raise.

    ``known``: records read already, by attempt id (as for :func:`load_manifest`).
    """
    data = _record_or_status(storage, attempt_id, known)
    return data if isinstance(data, Classification) else classify_record(attempt_id, data)


def _record_or_status(
    storage: Storage, attempt_id: str, known: Mapping[str, bytes] | None
) -> bytes | Classification:
    """The bytes of the attempt's commit record, or what their absence or refusal makes it."""
    try:
        return _read_record(storage, attempt_id, known)
    except (ManifestMissingError, FileMissingError):
        return Classification(INCOMPLETE)  # the storage said "absent" (perhaps deleted since)
    except (JsonInvalidError, LimitError) as exc:
        return Classification(INVALID, error=exc)  # larger than any version allows (R-SEC-11)
    except PathUnsafeError as exc:
        # A symlink, FIFO, device or directory under the record's name: read without a storage
        # error, and not a commit record (no writer creates one): a foreign entry, R-LAYOUT-7.
        return Classification(STRAY, error=exc)
    except CheckpointError as exc:
        return Classification(UNREADABLE, error=exc)


def classify_record(attempt_id: str, data: bytes) -> Classification:
    """Classify the bytes of ``<attempt_id>/manifest.json`` (committed, invalid or foreign)."""
    what = f"{attempt_id}/manifest.json"
    try:
        doc = jsonio.loads(data, what=what, max_bytes=jsonio.MAX_MANIFEST_BYTES)
    except CheckpointError as exc:
        return Classification(INVALID, error=exc)
    try:
        man = _parse_record(doc, what, attempt_id)
    except (VersionUnsupportedError, FeatureUnsupportedError) as exc:
        # A tool cannot tell a broken record of a newer version from one it does not
        # understand: either way it is not garbage to this tool (spec §16.2).
        return Classification(FOREIGN, error=exc, committed_at=_claimed_time(doc))
    except CheckpointError as exc:
        return Classification(INVALID, error=exc)
    man.source = data
    return Classification(COMMITTED, manifest=man, committed_at=man.committed_at)


def _claims_newer_version(doc: Any) -> bool:
    """A record of this format whose well-formed ``format_version`` is newer than ours.

    Well-formed is the text's ``MAJOR.MINOR`` (§16.1), any number of digits: ``1.1234567890``
    breaks the schema's 9-digit MINOR and is newer than every version this tool implements,
    so its record is foreign, not garbage (R-VERSION-10, errata 6).
    """
    if not isinstance(doc, dict) or doc.get("format") != "portable-ckpt":
        return False
    v = doc.get("format_version")
    return (
        isinstance(v, str)
        and FORMAT_VERSION_RE.match(v) is not None
        and _version_key(v) > IMPLEMENTED
    )


def _parse_record(doc: Any, what: str, attempt_id: str) -> Manifest:
    """Parse a commit record; a foreign one (R-VERSION-10) raises its version's code.

    A record of a newer version than this tool implements that fails its checks is foreign:
    opened explicitly it is PCK-VERSION-UNSUPPORTED (or PCK-FEATURE-UNSUPPORTED for an
    unknown ``must_understand``), naming the failure, never the failure's own code.
    """
    try:
        return parse_manifest(doc, what=what, directory_name=attempt_id)
    except (VersionUnsupportedError, FeatureUnsupportedError):
        raise
    except CheckpointError as exc:
        if not _claims_newer_version(doc):
            raise
        fv = doc["format_version"]
        # The failure is named, not its code: the record's one code is this one (scripts that
        # look for PCK-… codes in the output see only it).
        why = exc.message.removeprefix(f"{what}: ")
        raise VersionUnsupportedError(
            f"{what}: format_version {fv:.60} is newer than the versions this reader implements "
            f"({', '.join(FORMAT_VERSIONS)}), and the record fails their checks ({why}); a newer "
            "portable_ckpt may read it (spec §16.2, R-VERSION-10)",
            path=what,
        ) from None


def _claimed_time(doc: Any) -> str | None:
    ts = doc.get("committed_at") if isinstance(doc, dict) else None
    return ts if isinstance(ts, str) and timestamp_key(ts) != (-1,) else None


# -- listing ------------------------------------------------------------------------------------


def _step_of(attempt_id: str) -> int:
    """The step of a name that matches the attempt-id pattern (zero-padded digits 1-12)."""
    return int(attempt_id[1:13])


def attempt_names(storage: Storage, step: int | None = None) -> list[str]:
    """Names of the root's children that are attempt ids (of ``step``), oldest step first."""
    names = [n for n in storage.list_dirs("") if ATTEMPT_ID_RE.match(n)]
    if step is not None:
        names = [n for n in names if _step_of(n) == step]
    return sorted(names)


def _info(
    storage: Storage, name: str, c: Classification, annotations: bool, nbytes: int | None
) -> VersionInfo:
    path = f"{storage.url.rstrip('/')}/{name}"
    step = _step_of(name)
    info = VersionInfo(name, step, c.status, path, c.committed_at)
    if c.error is not None:
        info.error, info.error_code = str(c.error), c.error.code
    if nbytes is None:
        return info
    info.bytes = nbytes
    if annotations:
        errors: list[CheckpointError] = []
        try:  # one listing says which kinds of records exist (three listings were asked)
            present = set(storage.list_dirs(f"{name}/")) & set(ANNOTATION_KINDS)
        except StorageError:
            present = set(ANNOTATION_KINDS)  # each is asked, and its error kept
        for kind in sorted(present):
            setattr(info, kind, read_annotations(storage, name, kind, errors=errors))
        if errors:
            info.annotations_unreadable = True
            info.error, info.error_code = f"drill/copy records unreadable: {errors[0]}", errors[0].code
    return info


def _order_key(v: VersionInfo) -> tuple[int, tuple[int, ...], str]:
    return (v.step, timestamp_key(v.committed_at), v.id)


def list_versions(
    root: str | os.PathLike[str] | Storage,
    *,
    annotations: bool = True,
    uploads: bool = False,
    errors: list[CheckpointError] | None = None,
) -> list[VersionInfo]:
    """List every attempt of a root, oldest first (by step, then commit time).

    Only a valid commit record makes an attempt ``committed``; the files present never do. An
    attempt whose record could not be read is ``unreadable``, never ``incomplete``. With
    ``uploads``, attempts that exist only as unfinished uploads on an object store (a save
    killed while every object was uploading) are listed too, ``incomplete``: what ``ls`` and gc
    show. If the uploads cannot be listed, the error is raised, or appended to ``errors`` when a
    list is given (the attempts that could be listed are returned).
    """
    storage = open_storage(root)
    names = attempt_names(storage)

    def one(name: str) -> VersionInfo:
        c, nbytes = _summary(storage, name)
        return _info(storage, name, c, annotations, nbytes)

    if storage.capabilities.local_path or len(names) < 2:
        out = [one(n) for n in names]
    else:
        # An object store answers each of a version's requests (its record, its drill, copy
        # and verification records) after a round trip: asked one version after another, a
        # root of 1,000 versions took a minute (ops review F4). Several are asked at once.
        with ThreadPoolExecutor(max_workers=LISTING_CONCURRENCY) as pool:
            out = list(pool.map(one, names))
    if uploads:
        try:
            out += _upload_only(storage, storage.list_uploads(""), names)
        except StorageError as exc:
            if errors is None:
                raise
            errors.append(exc)
    out.sort(key=_order_key)
    return out


#: Versions of an object-store root classified at once by :func:`list_versions`.
LISTING_CONCURRENCY = 16


#: Listings' classifications by record bytes: ``(attempt id, size, BLAKE2b)`` → the
#: classification without its manifest, and the version's bytes. Parsing and checking a commit
#: record of thousands of tensors costs a tenth of a second, and ls, gc and a manager's
#: retention after every save listed every version again (ops review F11, F20); a record that
#: changed is a new key.
_SUMMARIES: collections.OrderedDict[tuple[str, int, bytes], tuple[Classification, int | None]] = (
    collections.OrderedDict()
)
_SUMMARIES_MAX = 4096
_SUMMARIES_LOCK = threading.Lock()


def _summary(storage: Storage, name: str) -> tuple[Classification, int | None]:
    """:func:`classify_attempt` for a listing (no manifest kept), cached by the record's bytes."""
    data = _record_or_status(storage, name, None)
    if isinstance(data, Classification):  # absent, unreadable, too large, not a file
        return data, None
    key = (name, len(data), hashlib.blake2b(data, digest_size=16).digest())
    with _SUMMARIES_LOCK:
        hit = _SUMMARIES.get(key)
        if hit is not None:
            _SUMMARIES.move_to_end(key)
            return hit
    c = classify_record(name, data)
    # The error without its traceback and chained errors: their frames hold the record's bytes
    # and parsed document, pinned for the life of the process (attack review 2 F11).
    error = None if c.error is None else _bare(c.error)
    hit = (dataclasses.replace(c, manifest=None, error=error),
           None if c.manifest is None else _files_bytes(c.manifest))
    with _SUMMARIES_LOCK:
        _SUMMARIES[key] = hit
        while len(_SUMMARIES) > _SUMMARIES_MAX:
            _SUMMARIES.popitem(last=False)
    return hit


def _bare(exc: CheckpointError) -> CheckpointError:
    """``exc`` holding nothing but its message: no traceback, no cause, no context."""
    exc.__traceback__ = None
    exc.__cause__ = exc.__context__ = None
    exc.__suppress_context__ = True
    return exc


def _files_bytes(manifest: Manifest) -> int:
    return sum(f.size for f in manifest.files.values())


def root_must_exist(storage: Storage) -> None:
    """Raise ``NotFoundError`` when the root does not exist (a mistyped root is not "empty")."""
    if not storage.root_exists():
        local = storage.local_root()
        if local is not None and os.path.lexists(local):
            raise NotFoundError(
                f"root {storage.url} is not a directory; a root is the directory that holds the "
                "versions",
                path=storage.url,
            )
        raise NotFoundError(
            f"root {storage.url} does not exist (no directory, or no object under the prefix); "
            "check the path",
            path=storage.url,
        )


# -- latest ---------------------------------------------------------------------------------------


def likely_record(
    storage: Storage,
    step: int | None = None,
    *,
    names: Sequence[str] | None = None,
    tries: int = 8,
) -> tuple[str, int] | None:
    """The attempt :func:`latest` most likely returns, and the size of its commit record.

    That is the greatest attempt id (of ``step``) that has a ``manifest.json`` of an allowed
    size, among the ``tries`` greatest; ``None`` when none has, or the storage fails. Nothing is
    decided by it: :func:`latest` classifies every attempt that could be greater. ``names``:
    :func:`attempt_names` of the root, listed already (for ``latest`` too: one listing).
    """
    try:
        listed = attempt_names(storage, step) if names is None else names
        for name in listed[::-1][:tries]:  # ids sort by step, then time
            rel = f"{name}/manifest.json"
            if storage.exists(rel):
                size = storage.size(rel)
                return (name, size) if 0 < size <= jsonio.MAX_MANIFEST_BYTES else None
    except CheckpointError:
        return None
    return None


def latest(
    storage: Storage,
    step: int | None = None,
    *,
    known: Mapping[str, bytes] | None = None,
    names: Sequence[str] | None = None,
) -> tuple[str, Manifest]:
    """Return ``(attempt_id, manifest)`` of the newest committed version (or of ``step``).

    Newest means the greatest ``(step, committed_at, attempt_id)`` (R-ID-4). Step levels are
    inspected from the highest down; every attempt of a level is classified before the level
    decides. When an attempt that could be greater than the answer is ``unreadable``, this
    raises ``PCK-STORAGE`` instead of returning an older version (R-ID-5): a restore that picks
    an older step because of a transient error silently loses training. A ``foreign`` attempt is
    not a version for this reader (R-COMMIT-1); skipping a greater one is logged as a warning.
    ``known``: records read already, by attempt id (a distributed load reads the likely
    answer's record collectively first, :func:`likely_record`); ``names``: the
    :func:`attempt_names` of ``step`` listed already.
    """
    by_step: dict[int, list[str]] = {}
    for name in attempt_names(storage, step) if names is None else names:
        by_step.setdefault(_step_of(name), []).append(name)
    skipped: list[str] = []
    invalid: list[str] = []
    for s in sorted(by_step, reverse=True):
        found = _latest_of_level(storage, by_step[s], skipped, known, invalid)
        if found is not None:
            if invalid:  # R-READ-1: a damaged newest record must not pass unnoticed
                _log.warning(
                    "%s: the newer attempt(s) %s have a commit record that is not valid and are "
                    "skipped; returning %s. `portable-ckpt ls` says why (gc keeps them and names "
                    "them; `portable-ckpt gc --delete-invalid` removes them)",
                    storage.url, ", ".join(invalid), found[0],
                )
            return found
    if not by_step:
        root_must_exist(storage)  # a mistyped root is not a root without versions
    what = f"step {step}" if step is not None else "any step"
    seen = sum(len(v) for v in by_step.values())
    others = (
        f" ({seen} attempt(s) there hold no commit record, one that is not valid, or a "
        "foreign one: "
        "`portable-ckpt ls` shows each one's status)"
        if seen
        else ""
    )
    raise NotFoundError(f"no committed version for {what} under {storage.url}{others}")


def _latest_of_level(
    storage: Storage,
    names: list[str],
    skipped: list[str],
    known: Mapping[str, bytes] | None,
    invalid: list[str],
) -> tuple[str, Manifest] | None:
    """The greatest version among attempts of one step, ``None`` when none is a version.

    Adds the foreign attempts greater than the answer to ``skipped``, the invalid ones to
    ``invalid``.
    """
    level = [(name, classify_attempt(storage, name, known=known)) for name in names]
    best: tuple[tuple[int, ...], str, Manifest] | None = None
    for name, c in level:
        if c.manifest is not None:
            key = (timestamp_key(c.committed_at), name, c.manifest)
            if best is None or key[:2] > best[:2]:
                best = key
    for name, c in level:
        claimed = (timestamp_key(c.committed_at), name) if c.committed_at else None
        if best is not None and claimed is not None and claimed < best[:2]:
            continue  # older than the answer: whatever it is, it does not change it
        if c.status == UNREADABLE:
            raise StorageError(
                f"cannot tell whether {storage.url.rstrip('/')}/{name} is the latest version: "
                f"reading its commit record failed ({c.error}); a storage error is not 'no "
                "version' — retry, or open a version explicitly",
                path=f"{name}/manifest.json",
            )
        if c.status == FOREIGN:
            skipped.append(name)
        elif c.status == INVALID:
            invalid.append(name)
    for name, c in level:
        if c.status == STRAY:
            _log.warning(
                "%s/%s is skipped: %s (R-LAYOUT-7)", storage.url.rstrip("/"), name, c.error
            )
    if best is not None and skipped:
        _log.warning(
            "%s: the newer attempt(s) %s were written by a format version this reader does not "
            "implement and are skipped; returning %s",
            storage.url,
            ", ".join(skipped),
            best[1],
        )
    return None if best is None else (best[1], best[2])


# -- commit ordering ------------------------------------------------------------------------------


def commit_time(storage: Storage, attempt_id: str, now: _dt.datetime | None = None) -> str:
    """``committed_at`` for a new commit of ``attempt_id`` (R-COMMIT-16).

    The current UTC time, but at least one microsecond after the ``committed_at`` of every
    version of the same step already under the root, so a new save of a step is never ordered
    before an older one, even after the clock stepped back. Only versions of the same step are
    read: the order of §3 compares ``committed_at`` only between them.

    Raises:
        StorageError: a commit record of that step could not be read (the commit cannot be
            ordered; nothing is published).
        CommitConflictError: a version of that step claims a ``committed_at`` at the end of the
            timestamps the format can write: nothing can be ordered after it.

    """
    floor_us, floor_of = -1, ""
    for name in attempt_names(storage, _step_of(attempt_id)):
        if name == attempt_id:
            continue
        c = classify_attempt(storage, name)
        if c.status == UNREADABLE:
            raise StorageError(
                f"cannot order the commit of {attempt_id}: the commit record of {name} (same "
                f"step) could not be read: {c.error}",
                path=f"{name}/manifest.json",
            )
        key = timestamp_key(c.committed_at)
        if len(key) > 1 and _epoch_us(key) > floor_us:
            floor_us, floor_of = _epoch_us(key), name
    epoch = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
    tick = _dt.timedelta(microseconds=1)
    now_us = ((now or _dt.datetime.now(_dt.UTC)) - epoch) // tick
    chosen_us = max(now_us, floor_us + 1)
    if chosen_us > (_dt.datetime.max.replace(tzinfo=_dt.UTC) - epoch) // tick:
        # No clamping: R-COMMIT-16 asks for a time after every version of the step, and no
        # timestamp of the pattern (years up to 9999) is; an earlier one would order this save
        # before that version, and gc --keep 1 would then delete it.
        raise CommitConflictError(
            f"cannot order the commit of {attempt_id} after version {floor_of} of the same step: "
            f"its committed_at is at the end of the timestamps the format can write (year 9999), "
            "so no commit of this step can be ordered after it (R-COMMIT-16); nothing is "
            f"published. That record's clock was wrong: inspect {storage.url.rstrip('/')}/"
            f"{floor_of} and delete it by hand if it is not a version you need, or save under "
            "another step",
            path=f"{floor_of}/manifest.json",
        )
    return (epoch + chosen_us * tick).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- retention ------------------------------------------------------------------------------------


@dataclass
class GcReport:
    """What gc removed or would remove (``dry_run``), and what it left alone and why.

    ``unknown`` lists the attempts gc could not classify (``{"id", "status", "code",
    "message"}``): they were not touched, and ``complete`` is False. ``foreign`` lists versions
    of a format this implementation does not implement: never garbage, never counted in
    ``keep``. ``foreign_keys`` lists entries that are not the format's (e.g. ``<attempt>//x`` on
    an object store, a FIFO in a local attempt) that gc found and left where they are.
    """

    deleted: list[str] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    protected: str | None = None
    kept_for_copy: list[str] = field(default_factory=list)
    #: Destinations of copy records that could not be asked whether they hold the copy.
    copy_unasked: list[str] = field(default_factory=list)
    aborted_uploads: int = 0
    dry_run: bool = False
    unknown: list[dict[str, Any]] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    foreign_keys: list[str] = field(default_factory=list)
    #: Attempts without a commit record left alone because something was written to them
    #: within the grace period (a save may be in progress): ``{"id", "status", "age_seconds"}``.
    in_grace: list[dict[str, Any]] = field(default_factory=list)
    #: Attempts whose commit record is there but invalid, kept (R-GC-10): committed versions
    #: damaged after their commit. ``{"id", "code", "message"}``; ``delete_invalid`` deletes them.
    damaged: list[dict[str, Any]] = field(default_factory=list)
    #: Committed versions of lower steps than the latest but committed after it (a job resumed
    #: from an older step: a rollback's new branch), kept: readers restore the latest, not them.
    newer_branch: list[str] = field(default_factory=list)
    #: Committed versions a later commit at the same or a lower step abandoned, deleted by
    #: ``retire_abandoned`` (or to be deleted).
    retired: list[str] = field(default_factory=list)
    #: Superseded drill, copy and verification records removed from kept versions (R-DRILL-9).
    pruned_records: int = 0
    #: Versions ``retire_abandoned`` did not retire because the store's clock does not confirm
    #: the writers' (``{"id", "reason"}``).
    retire_doubted: list[dict[str, Any]] = field(default_factory=list)
    #: Seconds this host's clock is ahead of the storage's (negative: behind), when more than a
    #: minute; attempts were dated on the storage's clock.
    clock_skew: float | None = None
    #: Deleted attempts (their commit record is gone) whose other files could not all be
    #: deleted: ``{"id", "code", "message"}``; the next gc removes them as abandoned.
    left_behind: list[dict[str, Any]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Whether every attempt was classified (nothing skipped for a storage error)."""
        return not self.unknown

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "deleted": self.deleted,
            "abandoned": self.abandoned,
            "kept": self.kept,
            "protected": self.protected,
            "kept_for_copy": self.kept_for_copy,
            "copy_unasked": self.copy_unasked,
            "aborted_uploads": self.aborted_uploads,
            "dry_run": self.dry_run,
            "foreign": self.foreign,
            "foreign_keys": self.foreign_keys,
            "in_grace": self.in_grace,
            "damaged": self.damaged,
            "newer_branch": self.newer_branch,
            "retired": self.retired,
            "pruned_records": self.pruned_records,
            "retire_doubted": self.retire_doubted,
            "clock_skew": self.clock_skew,
            "left_behind": self.left_behind,
            "unknown": self.unknown,
            "complete": self.complete,
        }

    def damage(self, v: VersionInfo) -> None:
        """Record a kept attempt whose commit record is invalid (R-GC-10)."""
        code = v.error_code or "PCK-SCHEMA"
        message = (v.error or "invalid commit record").removeprefix(f"[{code}] ")[:2000]
        self.damaged.append({"id": v.id, "code": code, "message": message})

    def skip(
        self,
        attempt_id: str | None,
        status: str,
        exc: CheckpointError | str | None,
        code: str | None = None,
    ) -> None:
        """Record an attempt gc leaves alone because it could not classify it.

        ``attempt_id`` is ``None`` when the unfinished uploads of the root could not be listed
        (attempts known only by their uploads are then unknown). ``code``: the error's code
        when ``exc`` is its message only.
        """
        code = exc.code if isinstance(exc, CheckpointError) else (code or "PCK-STORAGE")
        self.unknown.append(
            {"id": attempt_id, "status": status, "code": code, "message": str(exc)}
        )

    def failed(self, attempt_id: str, exc: CheckpointError) -> None:
        """Record an attempt whose deletion failed part way: not deleted, and named."""
        for done in (self.deleted, self.abandoned):
            if attempt_id in done:
                done.remove(attempt_id)
        self.skip(attempt_id, "delete failed", exc)


def check_retention(keep: int, grace_seconds: float) -> None:
    """Refuse retention arguments that could delete a save in progress (``UsageError``)."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise UsageError(f"keep must be an integer >= 1, got {keep!r}")
    check_grace(grace_seconds)


def check_grace(seconds: float, what: str = "grace period") -> None:
    """Refuse a grace period that is not a finite number of seconds >= 0 (``UsageError``).

    NaN, a negative or an infinite value would make "younger than the grace period" false for
    files being written: gc would delete a save in progress, a copy a copy in progress.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
        math.isfinite(seconds) and seconds >= 0
    ):
        raise UsageError(f"{what} must be a finite number of seconds >= 0, got {seconds!r}")


def gc(
    root: str | os.PathLike[str] | Storage,
    *,
    keep: int,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    dry_run: bool = False,
    require_copy: bool | str = False,
    now: Callable[[], float] | None = None,
    keep_ids: Collection[str] = (),
    progress: Progress | None = None,
    delete_invalid: bool = False,
    retire_abandoned: bool = False,
    spare_since: float | None = None,
) -> GcReport:
    """Apply retention to a root.

    Keeps the ``keep`` newest committed versions and, in addition, the newest version that passed
    a restore drill (or, when none ever did, the newest committed version). With
    ``require_copy``, older committed versions are only deleted once a kept version has a
    verified copy on another root (any root when ``True``; the given root URL when a string)
    whose commit record is still there (the copy record alone is not trusted).
    ``keep_ids`` are kept as well (a retention policy's choice, e.g. the manager's keep_best).
    Attempts without a commit record (or with an invalid one) are removed once nothing was
    written to them for ``grace_seconds`` (a save in progress is never touched as long as it
    writes more often than that: a grace of 0 deletes saves that are running). A deleted
    version's commit record is removed first, so it stops existing before any data goes; only
    the unfinished uploads of attempts being deleted are aborted.

    Nothing is deleted that was not positively classified: attempts whose records could not be
    read are listed in ``report.unknown`` and left alone, versions of a newer format in
    ``report.foreign`` (spec §15). An attempt whose commit record is there but invalid is a
    committed version damaged after its commit (the protocol publishes only checked records):
    it is kept and listed in ``report.damaged`` unless ``delete_invalid`` asks for its deletion
    (R-GC-10), its data and writer indexes may still restore it. ``progress(done, total)``
    follows the attempts deleted.

    A committed version of a lower step than the latest but committed after it (a job resumed
    from an older step, a rollback: its new saves sort below the abandoned steps) is kept and
    listed in ``report.newer_branch``, the ``keep`` newest of them by commit time: the ``keep``
    greatest by step are the abandoned branch's. ``retire_abandoned`` deletes first (commit record first) every
    committed version that a later commit at the same or a lower step abandoned, so that the
    rollback's branch becomes the latest; retention then applies to the rest
    (``report.retired``).

    ``now`` is a clock of the caller's, taken as it is; by default (this host's clock) attempts
    are dated on the storage's
    (:func:`storage_clock`: a host whose clock is ahead would delete saves in progress), and an
    offset of more than a minute is ``report.clock_skew``.

    ``spare_since`` (epoch seconds): attempts without a commit record created at or after this
    time are left alone, whatever the grace period (listed in ``report.in_grace``): a job's own
    retention passes its start, so that it never deletes its next save while that is being
    written (chaos review F1: with a short grace, retention after one async save deleted the
    next one's files under its writers). An attempt whose commit record appears while gc runs
    is never deleted as abandoned.

    Raises:
        UsageError: ``keep`` < 1 or a grace period that is negative or not finite.
        NotFoundError: the root does not exist.

    """
    check_retention(keep, grace_seconds)
    ask_storage = now is None  # a caller's own clock is taken as it is
    now = time.time if now is None else now
    keep_ids = usage.name_collection(keep_ids, "gc: keep_ids")
    if isinstance(require_copy, str) and require_copy:
        require_copy = _copy_destination(require_copy, strict=True)
    storage = open_storage(root)
    root_must_exist(storage)
    report = GcReport(dry_run=dry_run)
    try:
        uploads: list[ObjectInfo] = storage.list_uploads("")
    except StorageError as exc:
        uploads = []
        report.skip(None, UNREADABLE, exc)  # attempts seen only as uploads stay unknown
    listed = list_versions(storage)
    extra = _upload_only(storage, uploads, [v.id for v in listed])
    versions = _known_versions(storage, sorted(listed + extra, key=_order_key), report)
    if retire_abandoned:
        retired = _abandoned_branch(storage, versions, report)
        report.retired = [v.id for v in retired]
        report.deleted += report.retired
        versions = [v for v in versions if v not in retired]
    doomed = list(report.retired)
    doomed += _retention(
        versions, keep, require_copy, report, keep_ids, own=_copy_destination(storage.url)
    )
    abandoned = _abandoned(
        storage, versions, grace_seconds, now(), report, delete_invalid, spare_since,
        ask_storage=ask_storage,
    )
    doomed += abandoned
    unrecorded = {v.id for v in versions if v.status == INCOMPLETE}
    if not dry_run:
        for i, attempt_id in enumerate(doomed):
            try:
                if attempt_id in abandoned and attempt_id in unrecorded:
                    _still_unrecorded(storage, attempt_id)
                _delete_attempt(storage, attempt_id, report)
            except CheckpointError as exc:
                # Go on with the others; the report says what was deleted and what was not.
                report.failed(attempt_id, exc)
            if progress is not None:
                progress(i + 1, len(doomed))
    kept = [v for v in versions if v.id not in doomed]
    _abort_orphan_uploads(storage, kept, uploads, grace_seconds, now(), report)
    _prune_kept(storage, kept, report)
    _log_gc(storage, report)
    return report


def _prune_kept(storage: Storage, versions: list[VersionInfo], report: GcReport) -> None:
    """Remove the superseded drill, copy and verification records of kept versions (R-DRILL-9).

    A version's records piled up before writers pruned them (and a writer's prune can fail):
    gc, which read them all, counts them in ``report.pruned_records`` (a dry run deletes none).
    """
    for v in versions:
        if v.status != COMMITTED or v.annotations_unreadable:
            continue
        for kind in ANNOTATION_KINDS:
            records: list[dict[str, Any]] = getattr(v, kind)
            report.pruned_records += (
                len(superseded(kind, records)) if report.dry_run
                else prune_quietly(storage, v.id, kind, records)
            )


def _log_gc(storage: Storage, report: GcReport) -> None:
    """One ``gc.finished`` line (INFO) for the job log; ``gc.damaged`` (WARNING) per kept damage.

    Skipped attempts are in the report.
    """
    for d in report.damaged:
        log_event(
            _log, "gc.damaged", {"root": storage.url, **d},
            "gc of %s kept %s: its commit record is invalid ([%s] %s): a committed version "
            "damaged after its commit; verify it, restore the record from a copy, or delete it "
            "with delete_invalid=True (--delete-invalid)",
            storage.url, d["id"], d["code"], d["message"], level=logging.WARNING,
        )
    if report.newer_branch:
        log_event(
            _log, "gc.branch", {"root": storage.url, "newer_branch": report.newer_branch},
            "gc of %s kept %s: committed after the latest version at lower steps (a job resumed "
            "from an older step?); readers restore the latest, not them. To make them the "
            "latest, delete the steps they abandoned: gc --retire-abandoned",
            storage.url, ", ".join(report.newer_branch[:8]), level=logging.WARNING,
        )
    verb = "would delete" if report.dry_run else "deleted"
    fields = {k: report.to_json()[k] for k in ("deleted", "abandoned", "kept", "dry_run")}
    log_event(
        _log, "gc.finished", {"root": storage.url, **fields},
        "gc of %s: %s %d version(s) and %d abandoned attempt(s); kept %d",
        storage.url, verb, len(report.deleted), len(report.abandoned), len(report.kept),
    )


def _known_versions(
    storage: Storage, versions: list[VersionInfo], report: GcReport
) -> list[VersionInfo]:
    """Drop what gc must not act on (unknown, foreign)."""
    out = []
    for v in versions:
        if not v.known:
            report.skip(v.id, v.status, v.error, v.error_code)
        elif v.status == FOREIGN:
            report.foreign.append(v.id)
        elif v.status == STRAY:
            # A foreign entry has the record's name: neither a version nor garbage (R-LAYOUT-7).
            report.foreign_keys.append(f"{v.id}/manifest.json")
        else:
            out.append(v)
    return out


def upload_only_attempts(storage: Storage, listed: Collection[str]) -> list[VersionInfo]:
    """Attempts not in ``listed`` that exist only as unfinished uploads (status incomplete).

    On an object store a save whose objects are all still being uploaded is invisible to
    listings: a killed writer's parts stay stored (and billed) until gc aborts them.
    :func:`list_versions` with ``uploads=True`` lists them with the others.

    Raises:
        StorageError: the unfinished uploads could not be listed.

    """
    return _upload_only(storage, storage.list_uploads(""), listed)


def _upload_only(
    storage: Storage, uploads: Sequence[ObjectInfo], listed: Collection[str]
) -> list[VersionInfo]:
    # Only uploads inside an attempt directory: a root-level key named like an attempt is no
    # attempt's (gc would report a deletion its abort of "<id>/" never makes).
    names = {u.path.split("/", 1)[0] for u in uploads if "/" in u.path} - set(listed)
    base = storage.url.rstrip("/")
    return [
        VersionInfo(n, _step_of(n), INCOMPLETE, f"{base}/{n}")
        for n in sorted(names)
        if ATTEMPT_ID_RE.match(n)
    ]


def _abort_orphan_uploads(
    storage: Storage,
    versions: list[VersionInfo],
    uploads: Sequence[ObjectInfo],
    grace: float,
    t_now: float,
    report: GcReport,
) -> None:
    """Abort unfinished uploads of files that kept committed versions list (R-GC-8).

    A writer whose CreateMultipartUpload answer was lost retried it; the server had started
    both, and the first stayed under the version for as long as it was kept, billed (ops review
    F9). Such an upload belongs to nobody: every listed file was complete before the commit,
    and completed it would replace a committed file. Only those whose newest activity is older
    than the grace period are aborted, each by its exact key.
    """
    attempts = {u.path.split("/", 1)[0] for u in uploads if "/" in u.path}
    for v in versions:
        if v.status != COMMITTED or v.id not in attempts:
            continue
        try:
            files = load_manifest(storage, v.id).files
            dated = storage.list_uploads(f"{v.id}/", activity=True)
        except CheckpointError as exc:  # left for the next run; the version is kept either way
            report.skip(v.id, "uploads not checked", exc)
            continue
        orphans = {
            u.path for u in dated
            if u.path.split("/", 1)[1] in files and t_now - u.mtime >= grace
        }
        if not orphans:
            continue
        if report.dry_run:
            report.aborted_uploads += len(orphans)
            continue
        try:
            report.aborted_uploads += storage.abort_uploads(f"{v.id}/", only=orphans)
        except CheckpointError as exc:
            report.skip(v.id, "uploads not checked", exc)


#: How far the store's time between two commit records may differ from the writers' before a
#: retirement is doubted (the time between a record's timestamp and its write, NTP drift).
RETIRE_TOLERANCE_SECONDS = 60.0


def _abandoned_branch(
    storage: Storage, versions: list[VersionInfo], report: GcReport
) -> list[VersionInfo]:
    """Committed versions that a later commit at the same or a lower step abandoned.

    A job resumed from step S and saved S+1, S+2 ... again: the first run's versions above S
    were committed before a version at their step or below, and readers (by step first) still
    return them. In a run that never went back no version is abandoned.

    ``committed_at`` comes from the clock of the host that committed: one writer whose clock
    was ahead (or behind) looked like a rollback, and every later version (or the latest) was
    retired (multi-job review F1). So a version is retired only when the storage's own times
    of the two commit records (their listed modification times: one clock, the store's) agree
    that the later commit came later, and by as much (within
    :data:`RETIRE_TOLERANCE_SECONDS`); where they disagree, or a time is unknown, it is kept
    and named in ``report.retire_doubted``.
    """
    committed = sorted((v for v in versions if v.status == COMMITTED), key=lambda v: v.step)
    times = {v.id: timestamp_key(v.committed_at) for v in committed}
    stored: dict[str, float | None] = {}

    def stored_time(v: VersionInfo) -> float | None:
        if v.id not in stored:
            try:
                info = _listed_info(storage, f"{v.id}/manifest.json")
            except CheckpointError:
                info = None
            stored[v.id] = None if info is None else info.mtime
        return stored[v.id]

    candidates: list[VersionInfo] = []  # by the writers' clocks, in one pass
    bound: tuple[int, ...] = ()  # the latest commit time at a step below the current one
    i = 0
    while i < len(committed):
        group = [v for v in committed[i:] if v.step == committed[i].step]
        i += len(group)
        top = max([bound, *(times[v.id] for v in group)])
        candidates += [v for v in group if times[v.id] < top]
        bound = top
    def confirms(w: VersionInfo, v: VersionInfo) -> bool:
        """The store saw ``w``'s record after ``v``'s, as much later as the writers' clocks say.

        Order alone is not enough: in a copied root (a backup, a migration) the store's times
        are the copy's, in whatever order it went (attack review 3 F13). Two records stored when
        they were committed are as far apart on the store's clock as on the writers' (any
        constant offset cancels); a copy, or a skewed writer, breaks that.
        """
        mine, theirs = stored_time(v), stored_time(w)
        if mine is None or theirs is None or theirs <= mine or min(times[v.id], times[w.id]) < (0,):
            return False
        writers = (_epoch_us(times[w.id]) - _epoch_us(times[v.id])) / 1e6
        return abs((theirs - mine) - writers) <= RETIRE_TOLERANCE_SECONDS

    out: list[VersionInfo] = []
    for v in candidates:
        later = [w for w in committed
                 if w is not v and w.step <= v.step and times[w.id] > times[v.id]]
        by = next((w for w in later if confirms(w, v)), None)
        if by is not None:
            out.append(v)
            continue
        w = max(later, key=lambda w: times[w.id])
        report.retire_doubted.append({
            "id": v.id,
            "reason": (
                f"its committed_at {v.committed_at} is earlier than {w.id}'s {w.committed_at} "
                f"(step {w.step}), but the storage's times of the two commit records do not "
                "agree that it came that much later: a writer's clock was off, or the root "
                "was copied (its times are the copy's); kept"
            ),
        })
    return out


def _retention(
    versions: list[VersionInfo],
    keep: int,
    require_copy: bool | str,
    report: GcReport,
    keep_ids: Collection[str] = (),
    *,
    own: str | None = None,
) -> list[str]:
    """Committed versions to delete: all but the ``keep`` newest, ``keep_ids`` and the protected one.

    ``own``: this root as copy records name it (a "copy" there is no copy).

    A version whose verification failed is never restored (R-DRILL-8): it takes no place of the
    ``keep`` newest and no protection from the ones that did not fail (R-GC-9), which are kept
    as well; R-GC-1 and R-GC-2 still keep it where they keep it.
    """
    newest_first = [v for v in reversed(versions) if v.status == COMMITTED]
    good = [v for v in newest_first if not v.verification_failed]
    kept = newest_first[:keep] + [v for v in newest_first[keep:] if v.id in keep_ids]
    kept += [v for v in good[:keep] if v not in kept]
    if newest_first:  # a rollback's new branch: committed after the latest, at lower steps
        latest = timestamp_key(newest_first[0].committed_at)
        branch = [v for v in newest_first[1:] if timestamp_key(v.committed_at) > latest]
        # its own `keep` newest, by commit time: bounded, as the branch grows with every save
        branch.sort(key=lambda v: timestamp_key(v.committed_at), reverse=True)
        report.newer_branch = [v.id for v in branch[:keep]]
        kept += [v for v in branch[:keep] if v not in kept]
    drilled = next((v for v in newest_first if v.drilled), None)
    protected = drilled or (newest_first[0] if newest_first else None)
    for p in (protected, None if drilled else next(iter(good), None)):
        if p is not None and p not in kept:
            kept.append(p)
    report.kept = [v.id for v in kept]
    report.protected = protected.id if protected else None
    want = require_copy if isinstance(require_copy, str) else None
    may_delete = not require_copy or any(_has_copy(v, want, own, report) for v in kept)
    doomed = []
    for v in newest_first:
        if v in kept:
            continue
        if not may_delete:
            report.kept_for_copy.append(v.id)
            continue
        report.deleted.append(v.id)
        doomed.append(v.id)
    return doomed


def _copy_destination(url: str, *, strict: bool = False) -> str:
    """A root URL as copy records name it (``copy``'s normalisation), local paths resolved.

    ``DEST``, ``./DEST``, ``/abs/DEST`` and ``file:///abs/DEST`` name one root; so do two local
    paths whose real paths agree (a symlinked parent). ``strict``: a malformed URL raises
    ``UsageError`` (else it is compared as written).
    """
    from portable_ckpt.io.copy import normalize_root_url

    try:
        text = normalize_root_url(url)
        if text.startswith("file://"):
            return "file://" + os.path.realpath(text[len("file://") :])
    except (CheckpointError, ValueError):  # ValueError: a NUL in a record's path (F10)
        if strict:
            raise
        return url.rstrip("/")
    return text


def _has_copy(
    v: VersionInfo, want: str | None, own: str | None = None, report: GcReport | None = None
) -> bool:
    """Whether a verified copy of ``v`` is still committed (on root ``want``; any when None).

    ``want`` and ``own`` (the root being collected) are :func:`_copy_destination` forms. A copy
    record alone is not trusted: the copy may have been deleted since. A record that names this
    root (a hand-written one, or a decoded name that lands here: attack review 3 F11) or no
    usable root (a NUL: F10) counts for nothing.
    """
    from portable_ckpt.io.copy import url_of_record

    for c in v.copies:
        dest = c.get("destination")
        if c.get("ok") is not True or not isinstance(dest, str):
            continue
        dest = url_of_record(dest)  # "/mnt/nightly%20backup" names "/mnt/nightly backup"
        if "\0" in dest:
            continue
        # A record's destination is compared resolved as well; only a URL is (a bare path in a
        # record would be resolved against this process's directory, not the copier's).
        named = _copy_destination(dest) if "://" in dest else dest.rstrip("/")
        if named == own or (want is not None and named != want):
            continue
        if _copy_committed(dest, v.id, report):
            return True
    # A copier that could not write its record into this root (read-only credentials on the
    # training root: ops review F13) still left a committed copy there: asked directly.
    return want is not None and want != own and _copy_committed(want, v.id, report)


def _copy_committed(dest: str, attempt_id: str, report: GcReport | None = None) -> bool:
    """Whether root ``dest`` holds the commit record of ``attempt_id``.

    ``False`` when it cannot be asked (gc then keeps more, never less); the destination and the
    error are noted in ``report.copy_unasked``: "missing" is not what gc knows then (F16).
    """
    from portable_ckpt.storage import open_storage

    try:
        return open_storage(dest).exists(f"{attempt_id}/manifest.json")
    except (CheckpointError, OSError, ValueError) as e:
        if report is not None and len(report.copy_unasked) < 16:
            note = f"{dest}: {getattr(e, 'message', None) or e}"[:500]
            if note not in report.copy_unasked:
                report.copy_unasked.append(note)
        return False


def _abandoned(
    storage: Storage,
    versions: list[VersionInfo],
    grace: float,
    t_now: float,
    report: GcReport,
    delete_invalid: bool,
    spare_since: float | None = None,
    *,
    ask_storage: bool = True,
) -> list[str]:
    """Attempts without a commit record (or, if asked, an invalid one) quiet for ``grace`` s.

    Quiet is measured on the storage's clock, which set the files' times: a gc host whose clock
    was ahead by more than the grace period deleted saves in progress (multi-job review F2). So
    before the first deletion the storage is asked its time (:func:`storage_clock`), and an
    attempt id stamped after it (a writer whose clock was ahead) is dated by its files alone
    (F8: such an attempt was kept for years, "written to 0 s ago").
    """
    doomed = []
    clock: list[float] = []  # the storage's "now", once asked
    for v in versions:
        if v.status == INVALID and not delete_invalid:
            report.damage(v)  # R-GC-10: a damaged version, not an abandoned save
            continue
        if v.status not in (INCOMPLETE, INVALID):
            continue
        born = attempt_time(v.id)
        if v.status == INCOMPLETE and spare_since is not None and born is not None and (
            born >= spare_since
        ):  # the caller's own save, perhaps still being written
            report.in_grace.append(
                {"id": v.id, "status": v.status, "age_seconds": round(max(0.0, t_now - born), 1)}
            )
            continue
        try:
            if not clock:
                clock.append(_clock_for_ages(storage, t_now, report) if ask_storage else t_now)
            now = clock[0]
            last, anything = _last_activity(
                storage, v.id, record_absent=v.status == INCOMPLETE, not_after=now + 60.0
            )
            foreign = [] if anything else storage.list_foreign(f"{v.id}/")
        except StorageError as exc:
            report.skip(v.id, v.status, exc)  # cannot date it: it may be a save in progress
            continue
        if foreign:  # only what the format never writes is left: not gc's to delete
            report.foreign_keys.extend(foreign)
            continue
        if now - last < grace:
            report.in_grace.append(
                {"id": v.id, "status": v.status, "age_seconds": round(max(0.0, now - last), 1)}
            )
            continue
        report.abandoned.append(v.id)
        doomed.append(v.id)
    return doomed


def _last_activity(
    storage: Storage,
    attempt_id: str,
    *,
    record_absent: bool = False,
    not_after: float = math.inf,
) -> tuple[float, bool]:
    """The latest of the attempt-id time, its file times and its unfinished uploads' activity.

    Also returns whether the attempt has any file or upload at all. An attempt-id time after
    ``not_after`` (the storage's now: a writer's clock was ahead) is not counted.

    Raises:
        StorageError: ``record_absent`` (the attempt was classified without a commit record),
            yet the listing shows one (a store that contradicts itself, or a save that
            committed since): not abandoned.

    """
    t = attempt_time(attempt_id) or 0.0
    t = 0.0 if t > not_after else t
    anything = False
    record = f"{attempt_id}/manifest.json"
    for info in storage.list(f"{attempt_id}/"):
        if record_absent and info.path == record:
            raise StorageError(
                f"{storage.url}/{record} is listed, though the attempt was classified without "
                "it (committed since, or a store that answered \"absent\" for it): left for "
                "the next gc",
                path=record,
            )
        t, anything = max(t, info.mtime), True
    for up in storage.list_uploads(f"{attempt_id}/", activity=True):
        t, anything = max(t, up.mtime), True
    return t, anything


#: A gc host clock further than this from the storage's is reported (``GcReport.clock_skew``).
CLOCK_SKEW_SAID = 60.0


def _clock_for_ages(storage: Storage, t_now: float, report: GcReport) -> float:
    """The "now" attempts are dated against: the storage's when it can be asked, else ours.

    A dry run asks too (a probe written and deleted): on this host's clock it predicted other
    deletions than the run made (attack review 3 F6).
    """
    there = storage_clock(storage, tidy=not report.dry_run)
    if there is None:
        return t_now
    skew = t_now - there
    if abs(skew) > CLOCK_SKEW_SAID:
        report.clock_skew = round(skew, 1)
        _log.warning(
            "%s: this host's clock is %.0f s %s the storage's; attempts are dated on the "
            "storage's clock", storage.url, abs(skew), "ahead of" if skew > 0 else "behind",
        )
    return there


#: A clock probe's name (spec §15.2); one older than an hour is a leftover any gc may delete.
_PROBE = re.compile(r"\.pck-clock-[0-9a-f]{16}\Z")
PROBE_LEFTOVER_SECONDS = 3600.0


def storage_clock(storage: Storage, *, tidy: bool = True) -> float | None:
    """The storage's time now: the modification time it gives a probe file written at its root.

    ``None`` when it cannot be asked (a read-only root, no listing of the probe). The probe
    (``.pck-clock-<16 hex>``, empty, spec §15.2) is deleted again; readers ignore such names
    (R-LAYOUT-4). ``tidy``: also delete probes the same listing shows older than
    :data:`PROBE_LEFTOVER_SECONDS` (a failed delete or a killed gc left them: F15).
    """
    name = f".pck-clock-{secrets.token_hex(8)}"
    try:
        storage.put(name, b"")
    except CheckpointError:
        return None
    try:
        listed = [o for o in storage.list("", recursive=False) if _PROBE.match(o.path)]
    except CheckpointError:
        listed = []
    there = next((o.mtime for o in listed if o.path == name), None)
    stale = [o.path for o in listed if there is not None and o.path != name
             and there - o.mtime > PROBE_LEFTOVER_SECONDS] if tidy else []
    for path in [name, *stale]:
        try:
            storage.delete(path)
        except CheckpointError as exc:
            _log.warning("%s: could not delete the clock probe %s (%s); a later gc deletes it "
                         "once it is an hour old", storage.url, path, exc)
    return there


def _still_unrecorded(storage: Storage, attempt_id: str) -> None:
    """Raise if the commit record of an attempt classified ``incomplete`` exists by now.

    A save that committed between gc's listing and its deletion (a short grace period) would
    lose a version its committer reported as published.
    """
    rel = f"{attempt_id}/manifest.json"
    if storage.exists(rel):
        raise StorageError(
            f"{storage.url}/{rel} exists now: the attempt was committed while gc ran; not "
            "deleted",
            path=rel,
        )


def _delete_attempt(storage: Storage, attempt_id: str, report: GcReport) -> None:
    """Delete one attempt, commit record first (R-GC-3), and abort its unfinished uploads.

    Once its record is gone the version no longer exists: a failure after that leaves files,
    not a version, and is reported as such (``report.left_behind``), never as "not deleted"
    (multi-job review F3: an operator read that the versions were intact).
    """
    storage.delete(f"{attempt_id}/manifest.json")
    try:
        report.aborted_uploads += storage.abort_uploads(f"{attempt_id}/")
        storage.delete_prefix(f"{attempt_id}/")
    except CheckpointError as exc:
        report.left_behind.append({"id": attempt_id, "code": exc.code, "message": str(exc)})
        return
    report.foreign_keys.extend(storage.list_foreign(f"{attempt_id}/"))  # never deleted


def foreign_keys(storage: Storage) -> list[str]:
    """Entries at the top of a root that this format did not write (``ls --json``).

    Children whose names are not attempt ids (directories end in ``/``), and keys that are not
    well-formed paths. Readers ignore them (R-LAYOUT-4); gc never deletes them (R-GC-5).
    """
    names = [f"{n}/" for n in storage.list_dirs("") if not ATTEMPT_ID_RE.match(n)]
    names += [info.path for info in storage.list("", recursive=False)]
    names += storage.list_foreign("", recursive=False)
    return sorted(names)
