"""Versions of a root: discovery through commit records, ``latest``, annotations and retention."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from portable_ckpt.errors import (
    CheckpointError,
    JsonInvalidError,
    ManifestMissingError,
    NotFoundError,
    UsageError,
)
from portable_ckpt.format import jsonio
from portable_ckpt.format.manifest import FORMAT_VERSION, Manifest, parse_manifest
from portable_ckpt.format.naming import ATTEMPT_ID_RE, attempt_time, check_attempt_id
from portable_ckpt.storage import Storage, open_storage

__all__ = [
    "GcReport",
    "VersionInfo",
    "gc",
    "latest",
    "list_versions",
    "load_manifest",
    "read_annotations",
    "write_drill_record",
    "write_verification_record",
]

#: Post-commit record kinds: directory -> (id member, schema file, time member).
ANNOTATION_KINDS = {
    "drills": ("drill_id", "drill.schema.json", "finished_at"),
    "copies": ("copy_id", "copy.schema.json", "verified_at"),
    "verifications": ("verification_id", "verification.schema.json", "verified_at"),
}


@dataclass
class VersionInfo:
    """One attempt of a root as ``ls`` shows it.

    ``status`` is ``committed`` (a valid commit record exists) or ``incomplete`` (none, or one
    that does not validate: ``error`` says why).
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
    last_modified: float | None = None

    @property
    def drilled(self) -> bool:
        """Whether a restore drill of this version passed."""
        return any(d.get("ok") is True for d in self.drills)

    @property
    def verification_failed(self) -> bool:
        """Whether a sampled verification of this version failed (it is never restored)."""
        return any(v.get("ok") is False for v in self.verifications)

    @property
    def copied(self) -> bool:
        """Whether a verified copy on another root exists."""
        return any(c.get("ok") is True for c in self.copies)

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
            "error": self.error,
        }


def timestamp_key(ts: str | None) -> tuple[int, int]:
    """Sort key of an RFC 3339 UTC timestamp: (epoch seconds, nanoseconds).

    Text order is wrong: ``"...00Z"`` must sort before ``"...00.5Z"``.
    """
    if not ts:
        return (-1, 0)
    import datetime as _dt

    base, _, frac = ts.rstrip("Z").partition(".")
    try:
        secs = int(
            _dt.datetime.strptime(base, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=_dt.UTC).timestamp()
        )
    except ValueError:
        return (-1, 0)
    return (secs, int((frac + "000000000")[:9]) if frac.isdigit() else 0)


def load_manifest(storage: Storage, attempt_id: str) -> Manifest:
    """Read, parse and validate ``<attempt_id>/manifest.json``."""
    check_attempt_id(attempt_id, what="version directory")
    rel = f"{attempt_id}/manifest.json"
    if not storage.exists(rel):
        raise ManifestMissingError(
            f"{storage.url}/{attempt_id} has no manifest.json: the attempt was never committed "
            "(or was interrupted) and does not exist for readers",
            path=rel,
        )
    size = storage.size(rel)
    if size > jsonio.MAX_MANIFEST_BYTES:
        raise JsonInvalidError(
            f"{rel}: {size} bytes exceeds the manifest limit of {jsonio.MAX_MANIFEST_BYTES}",
            path=rel,
        )
    data = storage.read_all(rel, max_size=jsonio.MAX_MANIFEST_BYTES)
    return parse_manifest(
        jsonio.loads(data, what=rel, max_bytes=jsonio.MAX_MANIFEST_BYTES),
        what=rel,
        directory_name=attempt_id,
    )


def read_annotations(storage: Storage, attempt_id: str, kind: str) -> list[dict[str, Any]]:
    """Read the post-commit records of an attempt: ``drills``, ``copies`` or ``verifications``.

    Only records that validate, name this attempt and are stored under their own id count.
    """
    id_member, schema_file, time_member = ANNOTATION_KINDS[kind]
    out: list[dict[str, Any]] = []
    for info in storage.list(f"{attempt_id}/{kind}/", recursive=False):
        if not info.path.endswith(".json") or info.size > jsonio.MAX_DOCUMENT_BYTES:
            continue
        try:
            doc = jsonio.loads(
                storage.read_all(info.path, max_size=jsonio.MAX_DOCUMENT_BYTES), what=info.path
            )
        except CheckpointError:
            continue
        if not isinstance(doc, dict) or doc.get("attempt_id") != attempt_id:
            continue
        ident = doc.get(id_member)
        if f"{ident}.json" != info.path.rsplit("/", 1)[-1]:
            continue  # a record counts only under its own name
        try:
            from portable_ckpt.format.schemas import validate_document

            validate_document(doc, schema_file, what=info.path)
        except CheckpointError:
            continue
        out.append(doc)
    out.sort(key=lambda d: timestamp_key(str(d.get(time_member) or "")))
    return out


def _write_annotation(
    storage: Storage, attempt_id: str, kind: str, ident: str, record: dict[str, Any]
) -> str:
    load_manifest(storage, attempt_id)  # annotations only exist for committed versions
    rel = f"{attempt_id}/{kind}/{ident}.json"
    if not storage.create_if_absent(rel, jsonio.dumps(record, indent=2)):
        raise UsageError(f"{rel} already exists")
    return rel


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
        "drill_id": f"d{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}{int(time.time() * 1e6) % 1000000:06d}Z-{secrets.token_hex(4)}",
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

    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
    ident = f"v{stamp}{int(now * 1e6) % 1_000_000:06d}Z-{secrets.token_hex(4)}"
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
        "errors": list(errors or []),
    }
    if verifier is not None:
        rec["verifier"] = verifier
    validate_document(
        rec, "verification.schema.json", what=f"{attempt_id}/verifications/{ident}.json"
    )
    return _write_annotation(storage, attempt_id, "verifications", ident, rec)


def list_versions(
    root: str | os.PathLike[str] | Storage, *, annotations: bool = True
) -> list[VersionInfo]:
    """List every attempt of a root, oldest first (by step, then commit time).

    Only a valid commit record makes an attempt ``committed``; the files present never do.
    """
    storage = open_storage(root)
    out: list[VersionInfo] = []
    for name in storage.list_dirs(""):
        m = ATTEMPT_ID_RE.match(name)
        if not m:
            continue
        step = int(m.group(1))
        path = f"{storage.url.rstrip('/')}/{name}"
        try:
            man = load_manifest(storage, name)
        except ManifestMissingError:
            out.append(VersionInfo(name, step, "incomplete", path))
            continue
        except CheckpointError as exc:
            out.append(VersionInfo(name, step, "incomplete", path, error=str(exc)))
            continue
        info = VersionInfo(
            name,
            man.step,
            "committed",
            path,
            man.committed_at,
            bytes=sum(f.size for f in man.files.values()),
        )
        if annotations:
            info.drills = read_annotations(storage, name, "drills")
            info.copies = read_annotations(storage, name, "copies")
            info.verifications = read_annotations(storage, name, "verifications")
        out.append(info)
    out.sort(key=lambda v: (v.step, timestamp_key(v.committed_at), v.id))
    return out


def latest(storage: Storage, step: int | None = None) -> tuple[str, Manifest]:
    """Return ``(attempt_id, manifest)`` of the newest committed version (or of ``step``).

    Newest means the highest step; among equal steps, the latest ``committed_at``.
    """
    best: tuple[int, tuple[int, int], str, Manifest] | None = None
    candidates = []
    for name in storage.list_dirs(""):
        m = ATTEMPT_ID_RE.match(name)
        if m and (step is None or int(m.group(1)) == step):
            candidates.append((int(m.group(1)), name))
    # Highest step first; stop once a step level yields a committed version.
    candidates.sort(reverse=True)
    level: int | None = None
    for s, name in candidates:
        if level is not None and s < level:
            break
        try:
            man = load_manifest(storage, name)
        except CheckpointError:
            continue
        level = s
        key = (man.step, timestamp_key(man.committed_at), name, man)
        if best is None or key[:3] > best[:3]:
            best = key
    if best is None:
        what = f"step {step}" if step is not None else "any step"
        raise NotFoundError(f"no committed version for {what} under {storage.url}")
    return best[2], best[3]


@dataclass
class GcReport:
    """What gc removed or would remove (``dry_run``)."""

    deleted: list[str] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    protected: str | None = None
    kept_for_copy: list[str] = field(default_factory=list)
    aborted_uploads: int = 0
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "deleted": self.deleted,
            "abandoned": self.abandoned,
            "kept": self.kept,
            "protected": self.protected,
            "kept_for_copy": self.kept_for_copy,
            "aborted_uploads": self.aborted_uploads,
            "dry_run": self.dry_run,
        }


def _last_activity(storage: Storage, attempt_id: str) -> float:
    t = attempt_time(attempt_id) or 0.0
    for info in storage.list(f"{attempt_id}/"):
        t = max(t, info.mtime)
    return t


def gc(
    root: str | os.PathLike[str] | Storage,
    *,
    keep: int,
    grace_seconds: float = 3600.0,
    dry_run: bool = False,
    require_copy: bool | str = False,
    now: Callable[[], float] = time.time,
    keep_ids: Collection[str] = (),
) -> GcReport:
    """Apply retention to a root.

    Keeps the ``keep`` newest committed versions and, in addition, the newest version that passed
    a restore drill (or, when none ever did, the newest committed version). With
    ``require_copy``, older committed versions are only deleted once a kept version has a
    verified copy on another root (any root when ``True``; the given root URL when a string).
    ``keep_ids`` are kept as well (a retention policy's choice, e.g. the manager's keep_best).
    Attempts without a commit record are removed once nothing was
    written to them for ``grace_seconds`` (a save in progress is never touched). A deleted
    version's commit record is removed first, so it stops existing before any data goes.
    """
    if keep < 1:
        raise UsageError("keep must be at least 1")
    storage = open_storage(root)
    versions = list_versions(storage)
    committed = [v for v in versions if v.status == "committed"]
    newest_first = list(reversed(committed))
    kept = newest_first[:keep] + [v for v in newest_first[keep:] if v.id in keep_ids]
    drilled = next((v for v in newest_first if v.drilled), None)
    protected = drilled or (newest_first[0] if newest_first else None)
    if protected is not None and protected not in kept:
        kept.append(protected)
    report = GcReport(
        kept=[v.id for v in kept], protected=protected.id if protected else None, dry_run=dry_run
    )

    def has_copy(v: VersionInfo) -> bool:
        if isinstance(require_copy, str):
            want = require_copy.rstrip("/")
            return any(
                c.get("ok") is True and str(c.get("destination", "")).rstrip("/") == want
                for c in v.copies
            )
        return v.copied

    may_delete = not require_copy or any(has_copy(v) for v in kept)
    for v in newest_first:
        if v in kept:
            continue
        if not may_delete:
            report.kept_for_copy.append(v.id)
            continue
        report.deleted.append(v.id)
        if not dry_run:
            storage.delete(f"{v.id}/manifest.json")
            storage.delete_prefix(f"{v.id}/")
    t_now = now()
    for v in versions:
        if v.status != "incomplete":
            continue
        if t_now - _last_activity(storage, v.id) < grace_seconds:
            continue
        report.abandoned.append(v.id)
        if not dry_run:
            storage.delete(f"{v.id}/manifest.json")
            storage.delete_prefix(f"{v.id}/")
    if not dry_run:
        # Object stores: uploads of killed writers are invisible to listings but still stored.
        report.aborted_uploads = storage.abort_uploads("", older_than_s=grace_seconds)
    return report
