"""Post-commit records of a version: drills, copies and verifications (spec §14).

Records are created once and never modified (R-DRILL-7). Reading them (:func:`read_annotations`)
counts only valid records stored under their own id that name the version, reads a record that
does not count a second time, and caches the ones that do; writing never replaces one; pruning
(:func:`prune_annotations`) removes only records a newer one of their kind supersedes
(R-DRILL-9). A verification records only what proves damage (:func:`verification_verdict`).
Also here: format timestamps' order (§5) and the reads of a record a store answers "absent"
for while listing it, shared with commit records.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import fractions
import itertools
import json
import logging
import math
import re
import secrets
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

from portable_ckpt.errors import (
    DAMAGE_CODES,
    CheckpointError,
    FileMissingError,
    LimitError,
    StorageError,
    UsageError,
    VersionUnsupportedError,
)
from portable_ckpt.format import jsonio
from portable_ckpt.format.manifest import (
    CLEARS_FORMAT_VERSION,
    FORMAT_VERSION,
    is_newer_major,
    minor_at_least,
)
from portable_ckpt.logs import log_event
from portable_ckpt.storage import ObjectInfo, Storage

__all__ = [
    "ANNOTATION_KINDS",
    "CLEARED_DIR",
    "MESSAGE_CHARS",
    "RECORDS_KEPT",
    "annotation_id",
    "cleared_ids",
    "FUTURE_SLACK_US",
    "dated_ahead",
    "epoch_us",
    "evictable",
    "now_us",
    "record_epoch_us",
    "timestamp_us",
    "failed_verifications",
    "failure_order",
    "listed_info",
    "listing_pass",
    "lists_file",
    "move_cleared",
    "prune_annotations",
    "prune_quietly",
    "read_annotations",
    "read_listed_record",
    "record_verification",
    "repeated_failures",
    "reread_record",
    "sampled_chunks",
    "superseded",
    "tick",
    "timestamp_key",
    "unmoved_cleared",
    "verification_verdict",
    "version_gone",
    "write_drill_record",
    "write_verification_record",
]

_log = logging.getLogger(__name__)
#: Guards the records cache (listings of an object store run on threads).
_RECORDS_LOCK = threading.Lock()

#: Post-commit record kinds: directory -> (id member, schema file, time member).
ANNOTATION_KINDS = {
    "drills": ("drill_id", "drill.schema.json", "finished_at"),
    "copies": ("copy_id", "copy.schema.json", "verified_at"),
    # The 1.2 schema: the 1.0 one, and the rules of ``clears`` in records of 1.2 and later.
    "verifications": ("verification_id", "1.2/verification.schema.json", "verified_at"),
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


def epoch_us(key: tuple[int, ...]) -> int:
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


#: How far in the future a record's time may lie before it is taken for a clock ahead.
FUTURE_SLACK_US = 300_000_000


def now_us() -> int:
    """Microseconds since 1970, now (this host's clock)."""
    return time.time_ns() // 1000


def timestamp_us(ts: str | None) -> int:
    """Microseconds since 1970 of a format timestamp (-1 when it is none)."""
    key = timestamp_key(str(ts or ""))
    return epoch_us(key) if len(key) == 7 else -1


def record_epoch_us(record: dict[str, Any] | Any, member: str = "verified_at") -> int:
    """Microseconds since 1970 of a record's ``member`` time (-1 when it has none)."""
    return timestamp_us(record.get(member))


def dated_ahead(ts: str | None) -> bool:
    """Whether a timestamp lies after now (beyond :data:`FUTURE_SLACK_US`): a clock ahead."""
    return timestamp_us(ts) > now_us() + FUTURE_SLACK_US


def lists_file(storage: Storage, rel: str) -> bool:
    """Whether a listing of ``rel``'s directory shows it as a regular file."""
    return listed_info(storage, rel) is not None


def listed_info(storage: Storage, rel: str) -> ObjectInfo | None:
    """``rel`` as a listing of its directory shows it (size, the storage's time), or ``None``.

    Listed anew, even inside :meth:`~portable_ckpt.storage.Storage.one_root_listing`: the
    second look of a record answered absent must see the storage now (a record pruned since the
    listing is gone, not "absent while listed").
    """
    parent = rel.rsplit("/", 1)[0] + "/"
    with storage.fresh_listing():
        return next((info for info in storage.list(parent, recursive=False)
                     if info.path == rel), None)


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
    prefix = f"{attempt_id}/{kind}/"
    try:
        listed = list(storage.list(prefix, recursive=False))
        # (verification records only: the kind that decides a restore, R-DRILL-8)
        odd: CheckpointError | None = (
            _odd_records(storage, prefix) if kind == "verifications" else None)
        if not listed and odd is None and kind == "verifications":
            # Nothing listed: the entry may be no directory (a file, a symbolic link), whose
            # records cannot be read; `verify` said OK of such a version that a restore stops
            # at (left open by stop 27). The kind that decides a restore only: two listings of
            # the version's top level on an object store (re-attack 28, 4).
            odd = odd_record_dirs(storage, attempt_id, (kind,)).get(kind)
    except StorageError as exc:
        if errors is None:
            raise
        errors.append(exc)
        return out
    if odd is not None:
        if errors is None:
            raise odd
        errors.append(odd)
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


def odd_record_dirs(
    storage: Storage, name: str, kinds: Collection[str] = tuple(ANNOTATION_KINDS)
) -> dict[str, CheckpointError]:
    """The kinds of records whose directory in attempt ``name`` is no directory, with why.

    ``verifications`` replaced by a file, a symbolic link or a FIFO (an object of that name on
    an object store) hid its records: a failed version became the one a restore takes, and gc
    deleted the good one before it; ``drills`` so hid the drilled version gc protects
    (re-attack 27, 2). Such a directory holds records that cannot be read (as ``pins``, R-GC-11).
    One listing of the version's top level; ``kinds`` limits which are looked for.
    """
    top = f"{name}/"
    names = {p[len(top):].rstrip("/") for p in storage.list_foreign(top, recursive=False)}
    names |= {o.path[len(top):] for o in storage.list(top, recursive=False)}
    return {kind: StorageError(
        f"{storage.url.rstrip('/')}/{name}/{kind} is no directory (a file, a symbolic link or a "
        "FIFO; on an object store, an object of that name): its records cannot be read, and "
        "may say the version failed; make it the version's own directory of records again",
        path=f"{name}/{kind}", retryable=False) for kind in sorted(kinds)
        if kind in names}


def _odd_records(storage: Storage, prefix: str) -> StorageError | None:
    """An error when an entry of ``prefix`` is named like a record but is no plain file.

    A failed verification record replaced by a directory (a symbolic link, a FIFO) was passed
    over as no record, and the version it failed became restorable again (fault review 27,
    F10). Its name is the best sign that it is a record, and one that cannot be read (as a
    pin's, R-GC-11; a verification's stops a restore, R-ID-5). Directories not named like a
    record (``verifications/cleared/``) are the format's.
    """
    odd = [e for e in storage.list_foreign(prefix, recursive=False)
           + [f"{prefix}{d}/" for d in storage.list_dirs(prefix)]
           if e.rstrip("/").endswith(".json")]
    if not odd:
        return None
    return StorageError(
        f"{storage.url.rstrip('/')}/{odd[0]} is named like a record but is no plain file (a "
        "directory, a symbolic link or a FIFO; on an object store, keys below that name): the "
        "record cannot be read, and may say the version failed; replace it with the record "
        "itself, or remove it",
        path=odd[0], retryable=False)


#: Records read by listings, by ``(root, path, size, mtime)``: a record is created once and
#: never modified (R-DRILL-7), and every listing (ls, gc, a manager's retention after each save)
#: read and validated every record of every version again (soak review F2). Only records that
#: count are kept, and only small ones: a read that did not give one is never remembered (one
#: flipped bit would have hidden a failed verification for the life of the process, attack
#: review 3 F19). Each is kept as its compact JSON text (a parsed document costs up to ~45x its
#: bytes, F9), with what it costs and the tick of its last use (:func:`evictable`).
_RECORDS: collections.OrderedDict[tuple[str, str, int, float], tuple[str, int, int]] = (
    collections.OrderedDict()
)


#: Bytes of one cached record at most (the library's records are a few KiB), and of all.
_RECORD_CACHED_MAX = 64 << 10


#: What one kept record costs beyond its JSON text: its key (path, size, time), the dict's
#: entry and link, the value's tuple and ints, the text's header (measured: about 500 bytes).
_RECORD_OVERHEAD = 544


#: The memory bound of the records cache: each record's compact JSON plus
#: :data:`_RECORD_OVERHEAD` (about 850 bytes a record of the library, 300 of them JSON). 72 MiB
#: keep a root of 10,000 versions with 4 verification and 4 drill records each (80,000 records,
#: about 67 MiB). It was 8 MiB of record files (about 2,800 such versions; as parsed documents
#: several times that), and past it every listing read every record (scale review C).
_RECORDS_BYTES_MAX = 72 << 20


_records_bytes = 0


#: Ticks of the listings' caches' use (records here, summaries in
#: :mod:`portable_ckpt.io.versions`, manager entries): increasing, so "used during this
#: listing" is one comparison. Taken under each cache's lock, so a cache's order of use (least
#: recent first) is also the order of its entries' ticks.
_TICKS = itertools.count(1)


#: The tick at which the listing of every version running in this context began, or ``None``.
_LISTING_SINCE: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "pck_listing_since", default=None)


def tick() -> int:
    """A new tick of the listings' caches' use."""
    return next(_TICKS)


@contextlib.contextmanager
def listing_pass() -> Iterator[None]:
    """Within: one pass over every version of a root (a nested pass is the outer one).

    The listings' caches evict their least recently used entry, but never one used since the
    running pass began (:func:`evictable`); when none may go, the new entry is not kept. A
    listing reads every version in the same order, so with a root larger than a cache a plain
    LRU evicted each entry just before the next listing asked for it, and every listing missed
    everything (scale review C). Past a cap a listing now misses only what did not fit.
    """
    token = _LISTING_SINCE.set(tick()) if _LISTING_SINCE.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _LISTING_SINCE.reset(token)


def evictable(used: int) -> bool:
    """Whether an entry last used at tick ``used`` may make room (not used by the running pass)."""
    since = _LISTING_SINCE.get()
    return since is None or used < since


def _annotation(
    storage: Storage, attempt_id: str, kind: str, info: ObjectInfo
) -> dict[str, Any] | None:
    """One drill or copy record, or ``None`` when it does not count (storage errors raise)."""
    global _records_bytes
    key = (storage.url, info.path, info.size, info.mtime)
    with _RECORDS_LOCK:
        kept = _RECORDS.get(key)
        if kept is not None:
            _RECORDS[key] = (kept[0], kept[1], tick())
            _RECORDS.move_to_end(key)
    if kept is not None:
        doc: dict[str, Any] = json.loads(kept[0])  # the caller's own: the cache stays as read
        return doc
    found = _read_annotation(storage, attempt_id, kind, info)
    if found is None or info.size > _RECORD_CACHED_MAX:
        return found
    text = json.dumps(found, separators=(",", ":"))
    cost = len(text) + _RECORD_OVERHEAD
    with _RECORDS_LOCK:
        if not _RECORDS:
            _records_bytes = 0  # (a test cleared the cache)
        # Least recently used first; the first this pass used, and all after it, stay.
        while (_RECORDS and _records_bytes + cost > _RECORDS_BYTES_MAX
               and evictable(next(iter(_RECORDS.values()))[2])):
            _records_bytes -= _RECORDS.popitem(last=False)[1][1]
        if key not in _RECORDS and _records_bytes + cost <= _RECORDS_BYTES_MAX:
            _RECORDS[key] = (text, cost, tick())
            _records_bytes += cost
    return found


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
        first = read_listed_record(storage, info.path)
    except (FileMissingError, LimitError):
        return None  # deleted or replaced since the listing: not a record of this version
    doc = _counting_record(first, attempt_id, kind, info.path)
    if doc is not None:
        return doc
    try:  # the same rule as the first read: absent while listed is a storage error (D3)
        again = read_listed_record(storage, info.path)
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
    # Only a well-formed version (§16.1: no leading zeros) with a MAJOR above 1 is newer:
    # "01.0" or "0.9" is a malformed record, which does not count (attack review 12, A7).
    if is_newer_major(fv):
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
    return _slim(doc)


#: Problems of a record kept in memory, and the characters of each message kept.
_ERRORS_KEPT = 8
_MESSAGE_KEPT = 4096
#: Per-rank values of a drill's measurements kept in memory.
_RANKS_KEPT = 4096


def _slim(doc: dict[str, Any]) -> dict[str, Any]:
    """What tools read of a record that counts: its members of the schema, problems cut.

    A listing keeps every version's records; a valid record may carry unknown members
    (R-VERSION-6) and 1,024 messages of 65,536 characters each. Kept whole, three 60 MB
    records took ``ls --latest`` to 3.75 GB (attack review 12, A2). ``clears`` stays only where
    it counts (where the schema bounds it).
    """
    out = {k: v for k, v in doc.items() if k in _MEMBERS}
    if "clears" in out and not _clears(out):
        del out["clears"]
    if isinstance(out.get("errors"), list):
        out["errors"] = [_cut(e) for e in out["errors"][:_ERRORS_KEPT]]
    if isinstance(out.get("error"), dict):
        out["error"] = _cut(out["error"])
    if isinstance(out.get("measurements"), dict):  # per-rank lists: the schema leaves them long
        out["measurements"] = {k: v[:_RANKS_KEPT] if isinstance(v, list) else v
                               for k, v in out["measurements"].items()}
    return out


def _cut(problem: Any) -> Any:
    if isinstance(problem, dict) and isinstance(problem.get("message"), str):
        return {**problem, "message": problem["message"][:_MESSAGE_KEPT]}
    return problem


#: The members of the records' schemas (drill, copy, verification; ``clears`` of 1.2).
_MEMBERS = frozenset({
    "format", "format_version", "attempt_id", "verification_id", "drill_id", "copy_id",
    "verified_at", "started_at", "finished_at", "ok", "mode", "fraction", "chunks", "seed",
    "verifier", "errors", "error", "clears", "destination", "world_size", "saved_world_size",
    "contract", "measurements",
})


_MAJOR_MINOR = re.compile(r"([0-9]+)\.[0-9]+\Z")


def parse_record(data: bytes, rel: str, fmt: str) -> tuple[dict[str, Any], str | None] | None:
    """A record's JSON object when its ``format`` is ``fmt``, and the MAJOR it claims.

    ``None`` for anything else (not JSON, not an object, another format). The MAJOR (``"1"``,
    ``"2"``) is ``None`` where ``format_version`` is not ``MAJOR.MINOR``: a caller validates a
    1.x record, and decides for a newer one, which it cannot validate, which side is safe (a
    pin of a newer major still pins; a deletion mark of one still marks, R-GC-13).

    Raises:
        StorageError: the bytes could not be told apart from a storage failure.

    """
    try:
        doc = jsonio.loads(data, what=rel)
    except StorageError:
        raise
    except CheckpointError:
        return None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        return None
    fv = doc.get("format_version")
    found = _MAJOR_MINOR.match(fv) if isinstance(fv, str) else None
    return doc, None if found is None else found[1]


def read_listed_record(storage: Storage, rel: str) -> bytes:
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
    from portable_ckpt.io.versions import load_manifest  # (versions lists these records)

    listed = load_manifest(storage, attempt_id).files  # only committed versions get records
    rel = f"{attempt_id}/{kind}/{ident}.json"
    before: list[dict[str, Any]] = []
    if kind == "verifications" and record.get("ok") is False:
        # Read before the record is stored: the failures it may prune (R-DRILL-9).
        before = read_annotations(storage, attempt_id, kind, errors=[])
    if not storage.create_if_absent(rel, jsonio.dumps(record, indent=2)):
        raise UsageError(f"{rel} already exists")
    _still_committed(storage, attempt_id, rel)
    # With the records read before, and this one, the pruning reads none again: it only ever
    # removes a record older than one of its own view that stays (R-DRILL-9).
    view = sorted([*before, _slim(record)], key=failure_order) if before else None
    prune_quietly(storage, attempt_id, kind, view, listed=listed,
                  repeated=repeated_failures(before, record) if before else ())
    return rel


def version_gone(storage: Storage, attempt_id: str) -> bool:
    """Whether the storage says, beyond doubt, that ``attempt_id``'s commit record is gone.

    Asked by whoever just stored a record of the version (a pin, a drill, copy or
    verification record) before it removes its own record again: gc deletes the commit
    record first (R-GC-3). Absent to one question but listed is an inconsistent store, and a
    question that fails cannot tell: neither is "gone" (maintainer review 5, 2).
    """
    rel = f"{attempt_id}/manifest.json"
    try:
        return not (storage.exists(rel) or lists_file(storage, rel))
    except CheckpointError:
        return False


def _still_committed(storage: Storage, attempt_id: str, rel: str) -> None:
    """The version is still committed after ``rel`` was stored; else ``rel`` is removed.

    A retention or gc that deleted the version between the check before the write and the
    write left a directory of records only, which gc then kept for good as a version whose
    commit record was lost (SRE review 2, V1).

    Raises:
        VersionDeletedError: the version was deleted meanwhile (its record is removed again).

    """
    from portable_ckpt.errors import VersionDeletedError

    if not version_gone(storage, attempt_id):
        return
    with contextlib.suppress(CheckpointError):
        storage.delete(rel)  # this tool's own record, of a version that is gone
        storage.remove_empty_dirs(f"{attempt_id}/")
    raise VersionDeletedError(
        f"{attempt_id} was deleted (by a gc or a job's retention) while its record was "
        f"written; the record was removed again", path=f"{attempt_id}/manifest.json",
    )



#: Records of one kind a version keeps beyond those that decide its status (R-DRILL-9): the
#: newest few, as history for ``inspect``.
RECORDS_KEPT = 4


def superseded(
    kind: str, records: Sequence[dict[str, Any]], *, repeated: Collection[str] = ()
) -> list[dict[str, Any]]:
    """The records of ``kind`` whose removal changes nothing a tool reads from them (R-DRILL-9).

    ``records`` are the ones that count (:func:`read_annotations`: valid, under their own id,
    naming the attempt), oldest first. Kept: the :data:`RECORDS_KEPT` newest; the newest passed
    verification of each mode; the newest passed drill; for each destination its newest record
    and its newest passed one; a clearing record while a record it clears is still among
    ``records``, and the newest clearing record (spec §14.5); and every failed verification
    but those in ``repeated`` (:func:`repeated_failures`) that no record clears and that are
    not among the four newest. The newest are counted twice: by the records' times, and among
    those dated by now (a record dated ahead is a fast clock's). So ``drilled``,
    ``verified``, ``verification_failed`` and the destinations with a verified copy stay what
    they were: a record is only ever removed for a newer one of its kind that stays.
    """
    # The newest by the records' own times, and the newest dated by now: four passes dated
    # ahead by a host's fast clock pruned every real pass right after it was written (attack
    # review 12b, B5).
    member = ANNOTATION_KINDS[kind][2]
    dated = [r for r in records if not dated_ahead(r.get(member))]
    keep: set[int] = {id(r) for r in [*records[-RECORDS_KEPT:], *dated[-RECORDS_KEPT:]]}

    def newest(pred: Callable[[dict[str, Any]], bool], by: str | None = None) -> None:
        seen: set[str] = set()
        for r in reversed(records):
            group = str(r.get(by)) if by is not None else ""
            if group not in seen and pred(r):
                seen.add(group)
                keep.add(id(r))
        seen = set()
        for r in reversed(dated):
            group = str(r.get(by)) if by is not None else ""
            if group not in seen and pred(r):
                seen.add(group)
                keep.add(id(r))

    def passed(r: dict[str, Any]) -> bool:
        return r.get("ok") is True

    if kind == "verifications":
        gone = {id(r) for r in failed_verifications(records)
                if r.get("verification_id") in repeated}
        keep |= {id(r) for r in records if not passed(r) and id(r) not in gone}
        # A record that clears failed ones: without it a failure still in verifications/ fails
        # the version again (implementer review 2, N4); the newest stays as the account of the
        # last clearing (the ones it moved below verifications/cleared/ are its history).
        here = {str(r.get("verification_id")) for r in records if r.get("ok") is False}
        keep |= {id(r) for r in records if set(_clears(r)) & here}
        newest(lambda r: bool(_clears(r)))
        newest(passed, "mode")
    elif kind == "copies":
        newest(lambda r: True, "destination")
        newest(passed, "destination")
    else:
        newest(passed)
    return [r for r in records if id(r) not in keep]


def repeated_failures(before: Sequence[dict[str, Any]], written: dict[str, Any]) -> set[str]:
    """The failures a tool that stored the failed record ``written`` may prune (R-DRILL-9).

    ``before``: the version's verification records it read before it stored ``written``. Of
    their failed ones that no record clears, all but the oldest and the newest of each
    ``mode`` (of them and ``written``): a
    cron that found the same damage every hour kept a record an hour, and every listing read
    them all (SRE review 2, W1). Only records read before ``written`` was stored: the failed
    record stored last stays whoever prunes when, and is cleared only by a clearing that read
    it, one that began after the last failure was recorded.
    """
    failed = failed_verifications(before)
    mine = [*failed, written]
    # The first finding stays, and the newest of each mode: a deep failure naming three files
    # was pruned by later sampled ones naming one (maintainer review 5, 3).
    kept = {id(min(mine, key=failure_order))}
    for mode in {r.get("mode") for r in mine}:
        kept.add(id(max((r for r in mine if r.get("mode") == mode), key=failure_order)))
    return {str(r.get("verification_id")) for r in failed if id(r) not in kept}


def failure_order(r: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    """The order of a version's verification records: ``verified_at``, then their id."""
    return timestamp_key(str(r.get("verified_at") or "")), str(r.get("verification_id"))


def _clears(record: dict[str, Any]) -> list[str]:
    """The failed verification ids a record clears (spec §14.5): none below format 1.2."""
    clears = record.get("clears")
    if record.get("ok") is not True or record.get("mode") != "deep" or not isinstance(
        clears, list
    ):
        return []
    # In a 1.0 or 1.1 record the member is unknown and ignored (R-VERSION-6); MINOR may have
    # any number of digits (§16.1).
    if not minor_at_least(record.get("format_version"), 2):
        return []
    return [c for c in clears if isinstance(c, str)]


def cleared_ids(records: Sequence[dict[str, Any]]) -> set[str]:
    """The ids of the failed verification records that ``records`` clear (spec §14.5).

    ``records``: the verification records of a version that count (:func:`read_annotations`).
    """
    return {c for r in records for c in _clears(r)}


def unmoved_cleared(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Failed records that ``records`` clear but that are still among them (spec §14.5).

    A clearing moves them to ``verifications/cleared/`` (R-DRILL-10); one still here is a move
    cut short: releases before format 1.2 count the version as failed until it is made.
    """
    cleared = cleared_ids(records)
    return [r for r in records if r.get("ok") is False and r.get("verification_id") in cleared]


def failed_verifications(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The failed verification records of a version that no record clears (R-DRILL-8, R-DRILL-10).

    A version has failed verification exactly when this is not empty: a manager never restores
    it, and it loses its place among gc's ``keep``.
    """
    cleared = cleared_ids(records)
    return [r for r in records
            if r.get("ok") is False and r.get("verification_id") not in cleared]


#: Where clearing moves the failed verification records it cleared (spec §14.5): history.
CLEARED_DIR = "cleared"


def move_cleared(
    storage: Storage, attempt_id: str, records: Sequence[dict[str, Any]]
) -> tuple[list[str], list[CheckpointError]]:
    """Move the failed verification records that ``records`` clear to ``verifications/cleared/``.

    Tools of format 1.0 and 1.1 ignore ``clears``: they kept counting a repaired version as
    failed, their restores resumed an older step and their retention deleted the repaired one,
    and their pruning removed the clearing record, which made it failed for every tool again
    (incident review 2, F1). Moved out, a cleared record counts for no tool (R-DRILL-10). The
    copy is created first and the original deleted after, so a move cut short leaves the
    version failed for older tools only; running it again finishes it.

    ``records``: the version's verification records that count (:func:`read_annotations`).
    Returns the ids moved and the errors of those that were not.
    """
    todo = [str(r.get("verification_id")) for r in unmoved_cleared(records)]
    moved: list[str] = []
    errors: list[CheckpointError] = []
    if not todo:
        return moved, errors
    try:
        from portable_ckpt.io.versions import load_manifest  # (versions lists these records)

        listed = load_manifest(storage, attempt_id).files
    except CheckpointError as exc:
        return moved, [exc]
    for vid in todo:
        src = f"{attempt_id}/verifications/{vid}.json"
        if f"verifications/{vid}.json" in listed:
            continue  # a file of the version (R-FILES-1): never moved out of it
        dst = f"{attempt_id}/verifications/{CLEARED_DIR}/{vid}.json"
        try:
            data = storage.read_all(src, max_size=jsonio.MAX_DOCUMENT_BYTES)
        except FileMissingError:
            continue  # moved by another run meanwhile
        except CheckpointError as exc:
            errors.append(exc)
            continue
        try:
            # Create-if-absent and durable; the original goes only once the history holds its
            # bytes (a file there with other bytes, another run's or anyone's, is not them;
            # nor is a directory or a FIFO there, which reads as absent: attack review 12, A5).
            if not storage.create_if_absent(dst, data) and _read_or_none(storage, dst) != data:
                errors.append(StorageError(
                    f"{dst} exists with other bytes than {src}, or is no regular file: the "
                    "cleared record is left where it is (move the other away and clear again)",
                    path=dst, retryable=False))
                continue
            storage.delete(src)
        except CheckpointError as exc:
            errors.append(exc)
            continue
        moved.append(vid)
    return moved, errors


def _read_or_none(storage: Storage, rel: str) -> bytes | None:
    """A file's bytes, or ``None`` when there is no regular file at ``rel``."""
    try:
        return storage.read_all(rel, max_size=jsonio.MAX_DOCUMENT_BYTES)
    except FileMissingError:
        return None


def prune_annotations(
    storage: Storage,
    attempt_id: str,
    kind: str,
    records: Sequence[dict[str, Any]] | None = None,
    *,
    repeated: Collection[str] = (),
    listed: Collection[str] | None = None,
) -> list[str]:
    """Delete the :func:`superseded` records of ``kind`` of a version; return their paths.

    Every verify, copy or drill adds a record, and a cron job adds one an hour for as long as a
    milestone is kept: listings read every one (ops review F12). Only records that count are
    removed, each for a newer one that stays; other files of the directory are never touched.

    ``records``: the ones :func:`read_annotations` returned, when the caller has them.
    ``repeated``: failed records the caller may prune (:func:`repeated_failures`).
    ``listed``: the version's ``files``, when the caller read its manifest (else read here,
    and only when something is to be pruned).

    Raises:
        CheckpointError: a storage error (what was deleted before it stays deleted).

    """
    if records is None:
        records = read_annotations(storage, attempt_id, kind)
    if kind == "verifications" and unmoved_cleared(records):
        # A clearing whose move was cut short is finished by whoever prunes next (R-DRILL-10):
        # until then, tools of 1.0 and 1.1 still count the version as failed.
        moved, problems = move_cleared(storage, attempt_id, records)
        for exc in problems:
            log_event(_log, "records.move_failed", {"attempt_id": attempt_id},
                      "a cleared verification record of %s was not moved to "
                      "verifications/cleared/ (releases before format 1.2 still count the "
                      "version as failed): %s", attempt_id, exc, level=logging.WARNING)
        records = [r for r in records if r.get("verification_id") not in moved]
    doomed = superseded(kind, records, repeated=repeated)
    id_member = ANNOTATION_KINDS[kind][0]
    if doomed:
        # A file the version's manifest lists is part of the version (R-FILES-1), whatever its
        # name: never pruned, as never moved (attack review 12b, B1).
        if listed is None:
            from portable_ckpt.io.versions import load_manifest  # (versions lists records)

            listed = load_manifest(storage, attempt_id).files
        doomed = [r for r in doomed if f"{kind}/{r[id_member]}.json" not in listed]
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
    *,
    repeated: Collection[str] = (),
    listed: Collection[str] | None = None,
) -> int:
    """:func:`prune_annotations`, a failure logged, not raised; return how many were removed.

    After a record was written (it stands), or in gc (the version is kept either way): the
    next writer or gc prunes again.
    """
    try:
        return len(prune_annotations(storage, attempt_id, kind, records, repeated=repeated,
                                     listed=listed))
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
    clears: Sequence[str] = (),
) -> str:
    """Record a verification of a committed version in ``verifications/<id>.json`` (spec §14.5).

    ``mode`` is ``"sample"`` (``fraction`` of the stored chunks, chosen with ``seed``) or
    ``"deep"``; ``errors`` are the problems found (``{"code", "message"}``), required when
    ``ok`` is false. A version with a failed verification is never restored by a manager.
    ``clears``: the ids of failed verification records this passed deep verification clears
    (a format 1.2 record; R-DRILL-10: only at an operator's request, after a deep verification
    that read every byte of every file, listing only records read before it began).
    Returns the record's path.

    Raises:
        UsageError: ``clears`` in a record that is not a passed deep verification.

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
    if clears:
        if not (ok and mode == "deep"):
            raise UsageError("only a passed deep verification clears failed ones (R-DRILL-10)")
        rec["format_version"] = CLEARS_FORMAT_VERSION
        rec["clears"] = sorted(set(clears))
    validate_document(
        rec, ANNOTATION_KINDS["verifications"][1],
        what=f"{attempt_id}/verifications/{ident}.json",
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
    clears: Sequence[str] = (),
) -> str | None:
    """Record a verification of ``attempt_id`` that found ``errors``, as far as they prove anything.

    See :func:`verification_verdict`: ``ok: true`` when nothing was found, ``ok: false`` with
    the damage, and nothing at all (``None`` is returned) when no error proves damage. Else
    returns the record's path. ``chunks`` is the number of range records the verification read
    (:func:`sampled_chunks` of the total for a sample). ``clears``: the failed records a pass
    clears (:func:`write_verification_record`); a verification that found something clears none.
    """
    ok, damage = verification_verdict(errors)
    if ok is None:
        return None
    return write_verification_record(
        storage, attempt_id, ok=ok, mode=mode, fraction=fraction, chunks=chunks,
        seed=seed, errors=damage, verifier=verifier, clears=clears if ok else (),
    )
