"""Versions of a root: discovery through commit records, classification, listing and ``latest``.

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
import contextvars
import dataclasses
import datetime as _dt
import hashlib
import itertools
import logging
import os
import sys
import threading
import warnings
from collections.abc import Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from portable_ckpt.errors import (
    CheckpointError,
    CommitConflictError,
    FeatureUnsupportedError,
    FileMissingError,
    JsonInvalidError,
    LimitError,
    ManifestMissingError,
    NotFoundError,
    PassedOverWarning,
    PathUnsafeError,
    StorageError,
    UsageError,
    VersionUnsupportedError,
    may_pass,
)
from portable_ckpt.format import jsonio
from portable_ckpt.format.manifest import (
    FORMAT_VERSION_RE,
    FORMAT_VERSIONS,
    Manifest,
    files_bytes,
    parse_manifest,
)
from portable_ckpt.format.naming import (
    ATTEMPT_ID_RE,
    PROBE_RE,
    check_attempt_id,
)
from portable_ckpt.format.usage import flag
from portable_ckpt.io.annotations import (
    ANNOTATION_KINDS,
    cleared_ids,
    dated_ahead,
    epoch_us,
    evictable,
    failed_verifications,
    failure_order,
    listing_pass,
    lists_file,
    odd_record_dirs,
    read_annotations,
    reread_record,
    tick,
    timestamp_key,
    unmoved_cleared,
)
from portable_ckpt.io.damage import PLACEMENT_ENTRY
from portable_ckpt.io.deletion import DELETION_DIR, deletion_marks
from portable_ckpt.io.pins import PIN_DIR, read_pins
from portable_ckpt.storage import ObjectInfo, Storage, local_path, open_storage

__all__ = [
    "STATUSES",
    "Classification",
    "VersionInfo",
    "attempt_names",
    "check_record_absent",
    "classify_attempt",
    "classify_record",
    "commit_time",
    "enclosing_version",
    "refuse_root_in_version",
    "foreign_keys",
    "latest",
    "likely_record",
    "list_versions",
    "load_manifest",
    "newest_first",
    "other_format_hint",
    "restore_decision",
    "mark_pinned",
    "root_must_exist",
    "upload_only_attempts",
    "version_order",
]


def enclosing_version(text: str) -> str | None:
    """The local version directory ``text`` names or lies in (``<version>/data``), else None.

    An attempt-named directory at most two levels up, as written and with links resolved (a
    link to a version is that version). Remote URLs: None. The one rule of the CLI's path
    arguments and of :func:`portable_ckpt.open`'s "not found" (maintainer review M9).
    """
    local = local_path(text)
    return None if local is None else _attempt_dir_above(local, levels=3)


def _attempt_dir_above(local: str, *, levels: int | None, holding: bool = False) -> str | None:
    """The attempt-named directory ``local`` is or lies in, as written and with links resolved.

    ``levels``: how many directories up to look (None: up to the file system's root);
    ``holding``: count only one that holds what attempts hold (:data:`_ATTEMPT_PARTS`).
    """
    from portable_ckpt.format.naming import ATTEMPT_ID_RE

    for path in dict.fromkeys((os.path.normpath(os.path.abspath(local)), os.path.realpath(local))):
        for _ in itertools.count() if levels is None else range(levels):
            if ATTEMPT_ID_RE.match(os.path.basename(path)) and os.path.isdir(path) and (
                    not holding or any(os.path.lexists(os.path.join(path, part))
                                       for part in _ATTEMPT_PARTS)):
                return path
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
    return None


#: What an attempt directory holds (§2.1): a directory named like an attempt id that holds one
#: of these is a version (or a save in progress), not a root of its own.
_ATTEMPT_PARTS = ("manifest.json", "data", "index", "entries", "drills", "copies",
                  "verifications", "deleting")


def refuse_root_in_version(root: Storage | str | os.PathLike[str]) -> None:
    """Refuse to write into a root that is a version directory or lies in one (``UsageError``).

    A save given the version a previous save returned (DCP's ``storage_meta.checkpoint_id``)
    nested a root inside that version: it reported success, no reader of the root saw it
    (files of an attempt that no document names are ignored, R-LAYOUT-4), and gc deleted it
    with the outer version (framework review 26, F1). A local root is looked at on disk, at any
    depth; an object store's by the components of its prefix: one
    named like an attempt id with more below it, or, given the storage, the root itself when it
    holds a ``manifest.json``.
    """
    from portable_ckpt.format.naming import ATTEMPT_ID_RE

    if isinstance(root, Storage):
        local, url = root.local_root(), root.url
    else:
        url = os.fspath(root)
        local = local_path(url)
    if local is not None:
        # at any depth, and only what holds an attempt's parts: a root a person named like an
        # attempt id, empty or holding attempts, is a root
        version = _attempt_dir_above(local, levels=None, holding=True)
    else:
        scheme, _, rest = url.rpartition("://")
        parts = rest.rstrip("/").split("/")
        inner = [i for i, part in enumerate(parts[1:-1], 1) if ATTEMPT_ID_RE.match(part)]
        version = f"{scheme}://{'/'.join(parts[:inner[0] + 1])}" if inner else None
        if version is None and len(parts) > 1 and ATTEMPT_ID_RE.match(parts[-1]) \
                and isinstance(root, Storage) and root.exists("manifest.json"):
            version = url.rstrip("/")
    if version is None:
        return
    here = {os.path.normpath(os.path.abspath(local)), os.path.realpath(local)} \
        if local is not None else {url.rstrip("/")}
    what = "is a version directory" if version.rstrip("/") in here \
        else f"lies in the version directory {version}"
    raise UsageError(
        f"{url} {what}: a save there would nest a root inside that version, which no reader of "
        f"its root sees and gc deletes with it. Save into the root, "
        f"{os.path.dirname(version.rstrip('/'))}",
        path=url,
    )


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
    #: Whether ``error`` may pass by itself (:attr:`CheckpointError.retryable`: a storage that
    #: did not answer, not a permission).
    error_retryable: bool = False
    annotations_unreadable: bool = False
    #: Its verification records (which decide whether it may be restored, R-DRILL-8) could not
    #: all be read; drill and copy records decide only what gc keeps.
    verifications_unreadable: bool = False
    #: Whether a pin record names it (spec §15.3); ``None``: the pins could not be read.
    pinned: bool | None = False
    #: Published in node-local roots (spec §14.7): a node root holds its nodes' files only.
    node_local: bool = False
    #: A gc began deleting it (R-GC-13): without a commit record, what a stopped gc left
    #: (``incomplete``); with one, a gc stopped before the record went, or one deleting it now.
    being_deleted: bool = False

    @property
    def drilled(self) -> bool:
        """Whether a restore drill of this version passed."""
        return any(d.get("ok") is True for d in self.drills)

    @property
    def verification_failed(self) -> bool:
        """Whether a verification of this version failed and none cleared it (never restored)."""
        return bool(failed_verifications(self.verifications))

    @property
    def last_pass(self) -> dict[str, Any] | None:
        """The newest passed verification (``mode``, ``verified_at``), or ``None``.

        A pass is what was true then: a sampled check at save time says little after a storage
        incident (incident review R5), so listings show its kind and age.
        """
        return self.newest_pass()

    def newest_pass(self, mode: str | None = None) -> dict[str, Any] | None:
        """:attr:`last_pass`, of ``mode`` only when given (``"deep"``: an alert on its age)."""
        passed = [v for v in self.verifications if v.get("ok") is True
                  and (mode is None or v.get("mode") == mode)]
        if not passed:
            return None
        # A pass dated in the future (a host whose clock is ahead) read as "0 s ago" for as long
        # as the skew, and hid that the crons had stopped (SRE review 2, W4): the newest pass
        # dated by now counts; one dated ahead only when there is no other, marked.
        dated = [v for v in passed if not dated_ahead(v.get("verified_at"))] or passed
        newest = max(dated, key=failure_order)
        out = {"mode": newest.get("mode"), "verified_at": newest.get("verified_at")}
        if dated_ahead(newest.get("verified_at")):
            out["clock_ahead"] = True
        return out

    @property
    def dated_ahead(self) -> list[str]:
        """Its records dated after now (a clock ahead): ``manifest.json``, then record ids."""
        commit = ["manifest.json"] if dated_ahead(self.committed_at) else []  # (V4)
        return commit + [str(r.get(idm)) for kind, idm, rs in (
            ("verifications", "verification_id", self.verifications),
            ("drills", "drill_id", self.drills), ("copies", "copy_id", self.copies))
            for r in rs if dated_ahead(r.get(ANNOTATION_KINDS[kind][2]))]

    @property
    def unmoved_cleared(self) -> list[str]:
        """Cleared failed records still in ``verifications/`` (a move cut short, spec §14.5)."""
        return [str(v.get("verification_id")) for v in unmoved_cleared(self.verifications)]

    @property
    def failures_cleared(self) -> list[str]:
        """Ids of failed verification records a deep verification cleared (spec §14.5).

        As its clearing records name them: the cleared records themselves are moved to
        ``verifications/cleared/`` (R-DRILL-10).
        """
        return sorted(cleared_ids(self.verifications))

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
            "failures_cleared": self.failures_cleared,
            "last_verified": self.last_pass,
            "last_deep_verified": self.newest_pass("deep"),
            "pinned": self.pinned,
            "node_local": self.node_local,
            "being_deleted": self.being_deleted,
            "error": self.error,
            "error_code": self.error_code,
            "error_retryable": self.error_retryable,
        }


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
    storage: Storage, attempt_id: str, known: Mapping[str, bytes] | None = None,
    *, explain: bool = True,
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
    if next(iter(storage.list(f"{attempt_id}/")), None) is None:  # nothing of it is left
        local = storage.local_root()
        if local is not None and os.path.isdir(os.path.join(local, attempt_id)):
            # An empty directory is an attempt (ls: incomplete), not a deleted version (docs
            # review 21, F9).
            raise ManifestMissingError(
                f"{storage.url}/{attempt_id} holds no file and no manifest.json: an attempt "
                "that was never committed (a save that wrote nothing, or whose files were "
                "deleted); readers do not see it, and gc deletes it after its grace period",
                path=rel,
            )
        raise ManifestMissingError(
            f"{storage.url}/{attempt_id} does not exist (any more: a version that retention or "
            "gc deleted looks like this); open the root again for its latest version",
            path=rel,
        )
    lost = _without_record(storage, attempt_id) if explain else None  # (classifying: its own)
    if lost is not None and lost.status == INVALID and lost.error is not None:
        raise lost.error  # a committed version whose record was lost (on-call review 4, R8)
    if lost is not None and lost.being_deleted:
        raise ManifestMissingError(
            f"{storage.url}/{attempt_id} is being deleted: a gc marked it ({DELETION_DIR}/) and "
            "deleted its manifest.json, then stopped; it does not exist for readers, and a "
            "later gc removes the rest (open the root again for its latest version)",
            path=rel,
        )
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
    #: A version published in node-local roots (spec §14.7): one root holds part of it.
    node_local: bool = False
    #: ``incomplete`` because a gc began deleting it: it holds a deletion mark (R-GC-13).
    being_deleted: bool = False


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
        return _read_record(storage, attempt_id, known, explain=False)
    except (ManifestMissingError, FileMissingError):
        return _without_record(storage, attempt_id)
    except (JsonInvalidError, LimitError) as exc:
        return Classification(INVALID, error=exc)  # larger than any version allows (R-SEC-11)
    except PathUnsafeError as exc:
        # A symlink, FIFO, device or directory under the record's name: read without a storage
        # error, and not a commit record (no writer creates one): a foreign entry, R-LAYOUT-7.
        return Classification(STRAY, error=exc)
    except CheckpointError as exc:
        return Classification(UNREADABLE, error=exc)


def _without_record(storage: Storage, attempt_id: str) -> Classification:
    """An attempt whose commit record the storage says is absent: incomplete, or a lost record.

    Drill, copy and verification records are written into committed versions only (§14): an
    attempt that holds one lost its commit record after the commit (a script, a disk). It is
    invalid, kept by gc (R-GC-10) and named, not an abandoned save deleted after the grace
    period (disaster-recovery review R1: its data was intact). A listing that fails leaves it
    unclassified (R-GC-6).
    """
    try:
        dirs = set(storage.list_dirs(f"{attempt_id}/"))
        # A gc that began deleting the version wrote its mark before the commit record went
        # (R-GC-13): what it left is no version whose record was lost (on-call review 23, N2).
        if DELETION_DIR in dirs and deletion_marks(storage, attempt_id, first=True):
            return Classification(INCOMPLETE, being_deleted=True)
        kinds = sorted(dirs & set(ANNOTATION_KINDS))
        held = [k for k in kinds if next(iter(storage.list(f"{attempt_id}/{k}/")), None)]
        # Records and nothing else: written into a version while it was deleted (a nightly
        # copy after the job's retention: SRE review 2, V1); nothing of a version is left.
        # Files count, not directories (an empty `data/` on a disk, which an object store
        # never shows: spec implementer 25, 2).
        only_records = held and not any(
            next(iter(storage.list(f"{attempt_id}/{d}/")), None) is not None
            for d in sorted(dirs - set(ANNOTATION_KINDS))
        ) and next(iter(storage.list(f"{attempt_id}/", recursive=False)), None) is None
    except CheckpointError as exc:
        return Classification(UNREADABLE, error=exc)
    if not held or only_records:
        return Classification(INCOMPLETE)  # the storage said "absent" (perhaps deleted since)
    return Classification(INVALID, error=ManifestMissingError(
        f"{attempt_id}/manifest.json is lost (the attempt holds {' and '.join(held)} records, "
        "which only a committed version gets; gc keeps it): put it back from a copy, or "
        "without one `portable-ckpt recommit ROOT/ID`, then `verify --deep` (docs/recovery.md)",
        path=f"{attempt_id}/manifest.json",
    ))


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
    return Classification(COMMITTED, manifest=man, committed_at=man.committed_at,
                          node_local=PLACEMENT_ENTRY in man.entries)


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
    info = VersionInfo(name, step, c.status, path, c.committed_at, node_local=c.node_local,
                       being_deleted=c.being_deleted)
    if c.error is not None:
        info.error, info.error_code = str(c.error), c.error.code
        info.error_retryable = c.error.retryable
    if nbytes is None:
        return info
    info.bytes = nbytes
    if annotations:
        errors: list[CheckpointError] = []
        try:  # one listing says which kinds of records exist (three listings were asked)
            dirs = set(storage.list_dirs(f"{name}/"))
            present = dirs & set(ANNOTATION_KINDS)
            odd = odd_record_dirs(storage, name)
        except StorageError:
            dirs, present = set(), set(ANNOTATION_KINDS)  # each is asked, and its error kept
            odd = {}
        if DELETION_DIR in dirs:
            # A mark that counts, not the directory (an empty one, a mark cleared, or junk in
            # it: mark review 24, F1). Unread: as without one (gc then stores its own).
            with contextlib.suppress(CheckpointError):
                info.being_deleted = bool(deletion_marks(storage, name, first=True))
        unread: dict[str, CheckpointError] = dict(odd)
        for kind in sorted(present - set(odd)):
            setattr(info, kind, read_annotations(storage, name, kind, errors=errors))
            if errors:
                unread.setdefault(kind, errors[0])
                errors.clear()
        if unread:
            # Only unreadable verification records stop a restore (attack review 4 A4: a copy
            # record of a newer format stopped every restart); gc is careful with all three.
            info.annotations_unreadable = True
            info.verifications_unreadable = "verifications" in unread
            kind, first = next((k, e) for k, e in sorted(
                unread.items(), key=lambda ke: ke[0] != "verifications"))
            info.error, info.error_code = f"{kind} records unreadable: {first}", first.code
            info.error_retryable = first.retryable
    return info


def restore_decision(v: VersionInfo) -> str:
    """What a tool that restores automatically does with ``v``, met newest first.

    ``"take"``: a committed version that no verification failed (R-DRILL-8); ``"stop"``: the
    attempt, or its verification records, could not be read, and it may be the latest (R-ID-5):
    no older version is taken instead; ``"skip"``: anything else. The one rule of
    ``CheckpointManager.restore``, ``ls --latest``, ``drill ROOT`` and ``verify ROOT --all`` (a
    maintainer review found four copies of it, which disagreed).
    """
    if v.status == UNREADABLE or (v.status == COMMITTED and v.verifications_unreadable):
        return "stop"
    if v.status == COMMITTED and not v.verification_failed:
        return "take"
    return "skip"


def version_order(v: VersionInfo) -> tuple[int, tuple[int, ...], str]:
    """Sort key of versions, oldest first: step, then commit time, then id (R-ID-4)."""
    return (v.step, timestamp_key(v.committed_at), v.id)


def list_versions(
    root: str | os.PathLike[str] | Storage,
    *,
    annotations: bool = True,
    uploads: bool = False,
    errors: list[CheckpointError] | None = None,
    pins: bool = False,
    missing_ok: bool = False,
) -> list[VersionInfo]:
    """List every attempt of a root, oldest first (by step, then commit time).

    Only a valid commit record makes an attempt ``committed``; the files present never do. An
    attempt whose record could not be read is ``unreadable``, never ``incomplete``. With
    ``uploads``, attempts that exist only as unfinished uploads on an object store (a save
    killed while every object was uploading) are listed too, ``incomplete``: what ``ls`` and gc
    show. If the uploads cannot be listed, the error is raised, or appended to ``errors`` when a
    list is given (the attempts that could be listed are returned). With ``pins``, each
    attempt's ``pinned`` says whether a pin record names it (spec §15.3); pins that cannot be
    read make it ``None`` for every attempt, and the error is appended to ``errors`` (or logged).

    A root that does not exist raises ``NotFoundError``, as ``portable-ckpt ls`` and
    :func:`latest` say it (a mistyped root is not a root without versions); an existing empty
    root lists ``[]``. ``missing_ok``: list a missing root as ``[]`` too (a fresh job's root,
    which an object store holds no object of before the job's first save).

    Raises:
        NotFoundError: the root does not exist (or is no directory), unless ``missing_ok``.

    """
    flag(missing_ok, "list_versions: missing_ok")
    storage = open_storage(root)
    # One view: each directory level listed once (on S3 a version's directory was listed three
    # times and its verifications twice, 7 requests where 3 prefixes were asked: scale review
    # A); the second looks of records answered absent list again (annotations.listed_info).
    # One pass: the caches keep what it used (annotations.listing_pass, scale review C).
    with storage.one_root_listing(), listing_pass():
        out = _list_versions(storage, annotations, uploads, errors, pins)
        if not out and not missing_ok:
            root_must_exist(storage)  # (was [], as if the mistyped root were empty)
        return out


def _list_versions(
    storage: Storage,
    annotations: bool,
    uploads: bool,
    errors: list[CheckpointError] | None,
    pins: bool,
) -> list[VersionInfo]:
    """:func:`list_versions` inside the root's one listing."""
    names = attempt_names(storage)

    def one(name: str) -> VersionInfo:
        c, nbytes = _summary(storage, name)
        return _info(storage, name, c, annotations, nbytes)

    if storage.capabilities.local_path or len(names) < 2:
        out = [one(n) for n in names]
    else:
        # An object store answers each of a version's requests (its record, its drill, copy
        # and verification records) after a round trip: asked one version after another, a
        # root of 1,000 versions took a minute (ops review F4). Several are asked at once,
        # each in a copy of this context (the one listing lives there).
        ctx = contextvars.copy_context()
        with ThreadPoolExecutor(max_workers=LISTING_CONCURRENCY) as pool:
            out = list(pool.map(lambda n: ctx.copy().run(one, n), names))
    if uploads:
        try:
            out += upload_only_attempts(storage, names)
        except StorageError as exc:
            if errors is None:
                raise
            errors.append(exc)
    if pins:
        unread = mark_pinned(storage, out)
        if unread is not None and errors is not None:
            errors.append(unread)
        elif unread is not None:
            _log.warning("%s: the pins could not be read (any version may be pinned): %s",
                         storage.url, unread)
    out.sort(key=version_order)
    return out


def newest_first(root: str | os.PathLike[str] | Storage) -> Iterator[VersionInfo]:
    """The root's attempts, newest first, classified one step level at a time, on demand.

    What :func:`list_versions` returns, reversed, without reading the records (and the
    verification, drill and copy records) of older levels before the caller asks for them: a
    poller that stops at the first version it can use reads the newest levels only (serving
    review F4: ``ls --latest`` read every record of a root of 300 versions, about 1,000 requests
    on S3, to answer with the newest).
    """
    storage = open_storage(root)
    by_step: dict[int, list[str]] = {}
    for name in attempt_names(storage):
        by_step.setdefault(_step_of(name), []).append(name)
    for step in sorted(by_step, reverse=True):
        level = []
        for name in by_step[step]:
            c, nbytes = _summary(storage, name)
            level.append(_info(storage, name, c, True, nbytes))
        yield from sorted(level, key=version_order, reverse=True)


def mark_pinned(storage: Storage, versions: list[VersionInfo]) -> CheckpointError | None:
    """Set each version's ``pinned`` from the root's pin records (spec §15.3).

    Returns the error that kept the pins from being read (every ``pinned`` is then ``None``).
    """
    try:
        named = read_pins(storage)
    except CheckpointError as exc:
        for v in versions:
            v.pinned = None
        return exc
    for v in versions:
        v.pinned = v.id in named
    return None


#: Versions of an object-store root classified at once by :func:`list_versions`.
LISTING_CONCURRENCY = 16


#: Listings' classifications by record bytes: ``(attempt id, size, BLAKE2b)`` → the
#: classification without its manifest, the version's bytes and the tick of the entry's last use
#: (a listing never evicts what it used itself: :func:`~.annotations.listing_pass`, scale review
#: C). Parsing and checking a commit record of thousands of tensors costs a tenth of a second,
#: and ls, gc and a manager's retention after every save listed every version again (ops review
#: F11, F20); a record that changed is a new key.
_SUMMARIES: collections.OrderedDict[
    tuple[str, int, bytes], tuple[Classification, int | None, int]
] = collections.OrderedDict()


#: Entries at most, each about 700 bytes (measured: a classification without its manifest and
#: the key), so about 12 MiB: a root of 16,384 versions is listed without parsing a record
#: again (was 4,096, and past that every listing parsed every record).
_SUMMARIES_MAX = 16384


_SUMMARIES_LOCK = threading.Lock()


def _summary(storage: Storage, name: str) -> tuple[Classification, int | None]:
    """:func:`classify_attempt` for a listing (no manifest kept), cached by the record's bytes."""
    data = _record_or_status(storage, name, None)
    if isinstance(data, Classification):  # absent, unreadable, too large, not a file
        return data, None
    key = (name, len(data), hashlib.blake2b(data, digest_size=16).digest())
    with _SUMMARIES_LOCK:
        kept = _SUMMARIES.get(key)
        if kept is not None:
            _SUMMARIES[key] = (kept[0], kept[1], tick())
            _SUMMARIES.move_to_end(key)
            return kept[0], kept[1]
    c = classify_record(name, data)
    # The error without its traceback and chained errors: their frames hold the record's bytes
    # and parsed document, pinned for the life of the process (attack review 2 F11).
    error = None if c.error is None else _bare(c.error)
    hit = (dataclasses.replace(c, manifest=None, error=error),
           None if c.manifest is None else files_bytes(c.manifest.files))
    with _SUMMARIES_LOCK:
        # Least recently used first; the first this pass used, and all after it, stay.
        while (key not in _SUMMARIES and len(_SUMMARIES) >= _SUMMARIES_MAX
               and evictable(next(iter(_SUMMARIES.values()))[2])):
            _SUMMARIES.popitem(last=False)
        if len(_SUMMARIES) < _SUMMARIES_MAX:  # else full of this pass's own: not kept
            _SUMMARIES[key] = (*hit, tick())
    return hit


def _bare(exc: CheckpointError) -> CheckpointError:
    """``exc`` holding nothing but its message: no traceback, no cause, no context."""
    exc.__traceback__ = None
    exc.__cause__ = exc.__context__ = None
    exc.__suppress_context__ = True
    return exc




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
    invalid: list[tuple[str, Classification]] = []
    for s in sorted(by_step, reverse=True):
        found = _latest_of_level(storage, by_step[s], skipped, known, invalid)
        if found is not None:
            if invalid:  # R-READ-1: a damaged newest record must not pass unnoticed
                _passed_over(storage, invalid, found[0])
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
        else other_format_hint(storage)
    )
    raise NotFoundError(f"no committed version for {what} under {storage.url}{others}")


def _passed_over(storage: Storage, invalid: list[tuple[str, Classification]], taken: str) -> None:
    """Log and warn (:class:`PassedOverWarning`) that newer invalid attempts were skipped.

    A lost commit record (the attempt holds records only a committed version gets) is put back
    from a copy or rebuilt; the advice was `gc --delete-invalid`, which deletes what `recommit`
    brings back (S3 review 24, M1).
    """
    base = storage.url.rstrip("/")
    lost = [n for n, c in invalid if isinstance(c.error, ManifestMissingError)]
    damaged = [n for n, c in invalid if n not in lost]
    parts = []
    if lost:
        parts.append(
            f"the newer version(s) {', '.join(lost)} lost their commit record (manifest.json): "
            "put it back from a copy of the version, or rebuild it with `portable-ckpt "
            f"recommit {base}/{lost[0]}`, then `portable-ckpt verify --deep` (docs/recovery.md)")
    if damaged:
        parts.append(
            f"the newer attempt(s) {', '.join(damaged)} have a commit record that is not valid: "
            f"`portable-ckpt verify {base}/{damaged[0]}` names the defect; put a copy's record "
            "back (gc keeps them and names them)")
    message = f"{storage.url}: opening {taken}, an older version: " + "; ".join(parts)
    _log.warning("%s", message)
    warnings.warn(message, PassedOverWarning, stacklevel=_outside_level())


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _outside_level() -> int:
    """The ``stacklevel`` of a warning that names the first caller outside this package."""
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(
            _PACKAGE_DIR + os.sep):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


#: Files that say a directory holds a checkpoint of another format, and what to do with it.
_OTHER_FORMATS = (
    (".metadata", "a torch.distributed.checkpoint (DCP) checkpoint: load it with DCP's "
     "FileSystemReader, or convert it (`portable-ckpt convert ROOT DEST`)"),
    ("model.safetensors.index.json", "a Hugging Face checkpoint: convert it "
     "(`portable-ckpt convert ROOT DEST`)"),
    ("model.safetensors", "a Hugging Face checkpoint: convert it (`portable-ckpt convert ROOT DEST`)"),
)


def other_format_hint(storage: Storage) -> str:
    """A hint when the root holds another format's checkpoint (DCP integrator review 23, 4)."""
    for name, what in _OTHER_FORMATS:
        try:
            if storage.exists(name):
                return f" (it holds {name}: {what})"
        except CheckpointError:
            continue  # a hint only
    return ""


def _latest_of_level(
    storage: Storage,
    names: list[str],
    skipped: list[str],
    known: Mapping[str, bytes] | None,
    invalid: list[tuple[str, Classification]],
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
                path=f"{name}/manifest.json", retryable=c.error is None or may_pass(c.error),
            )
        if c.status == FOREIGN:
            skipped.append(name)
        elif c.status == INVALID:
            invalid.append((name, c))
    for name, c in level:
        if c.status == STRAY:
            _log.warning(
                "%s/%s is skipped: %s (R-LAYOUT-7)", storage.url.rstrip("/"), name, c.error
            )
    if best is not None and skipped:
        message = (f"{storage.url}: the newer attempt(s) {', '.join(skipped)} were written by a "
                   "format version this reader does not implement and are skipped; returning "
                   f"{best[1]} (a newer release of portable_ckpt reads them)")
        _log.warning("%s", message)
        warnings.warn(message, PassedOverWarning, stacklevel=_outside_level())
    return None if best is None else (best[1], best[2])


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
                path=f"{name}/manifest.json", retryable=c.error is None or may_pass(c.error),
            )
        key = timestamp_key(c.committed_at)
        if len(key) > 1 and epoch_us(key) > floor_us:
            floor_us, floor_of = epoch_us(key), name
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


def upload_only_attempts(
    storage: Storage, listed: Collection[str], uploads: Sequence[ObjectInfo] | None = None
) -> list[VersionInfo]:
    """Attempts not in ``listed`` that exist only as unfinished uploads (status incomplete).

    On an object store a save whose objects are all still being uploaded is invisible to
    listings: a killed writer's parts stay stored (and billed) until gc aborts them.
    :func:`list_versions` with ``uploads=True`` lists them with the others. ``uploads``: the
    root's unfinished uploads, listed already.

    Raises:
        StorageError: the unfinished uploads could not be listed.

    """
    if uploads is None:
        uploads = storage.list_uploads("")
    # Only uploads inside an attempt directory: a root-level key named like an attempt is no
    # attempt's (gc would report a deletion its abort of "<id>/" never makes).
    names = {u.path.split("/", 1)[0] for u in uploads if "/" in u.path} - set(listed)
    base = storage.url.rstrip("/")
    return [
        VersionInfo(n, _step_of(n), INCOMPLETE, f"{base}/{n}")
        for n in sorted(names)
        if ATTEMPT_ID_RE.match(n)
    ]


def foreign_keys(storage: Storage) -> list[str]:
    """Entries at the top of a root that this format did not write (``ls --json``).

    Children whose names are not attempt ids (directories end in ``/``) other than ``pins/``,
    and keys that are not well-formed paths. Readers ignore them (R-LAYOUT-4); gc never deletes them (R-GC-5).
    """
    names = [f"{n}/" for n in storage.list_dirs("")
             if not ATTEMPT_ID_RE.match(n) and n != PIN_DIR]  # pins are the format's (§15.3)
    # A probe left by gc or copy (a store that refused its delete) is the format's (§15.2).
    names += [info.path for info in storage.list("", recursive=False)
              if not PROBE_RE.match(info.path)]
    names += storage.list_foreign("", recursive=False)
    return sorted(names)


#: Names this module held before retention, post-commit records and damage confirmation got
#: modules of their own; still importable from here (``portable_ckpt.io.versions.gc`` was the
#: documented path of ``gc``).
_MOVED = {
    **dict.fromkeys(
        ("GcReport", "check_grace", "check_retention", "gc", "storage_clock",
         "RETIRE_TOLERANCE_SECONDS", "CLOCK_SKEW_SAID", "PROBE_LEFTOVER_SECONDS"),
        "portable_ckpt.io.gc",
    ),
    **dict.fromkeys(
        ("ANNOTATION_KINDS", "MESSAGE_CHARS", "RECORDS_KEPT", "annotation_id", "prune_annotations",
         "prune_quietly", "read_annotations", "record_verification", "sampled_chunks",
         "superseded", "timestamp_key", "verification_verdict", "write_drill_record",
         "write_verification_record"),
        "portable_ckpt.io.annotations",
    ),
    **dict.fromkeys(("confirm_damage", "read_file_again"), "portable_ckpt.io.damage"),
}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import importlib

        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
