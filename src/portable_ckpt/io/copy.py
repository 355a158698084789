"""Replicate one committed version to another root (local ↔ S3, S3 → S3), verified, atomically.

Two names on one failed device are not two copies: ``copy_version`` streams every file of a
version to an independent root in bounded memory, verifies every checksum block as it streams,
checks the size (and, on S3, the server-computed whole-object CRC32C) at the destination, and
publishes the destination's ``manifest.json`` last with ``create_if_absent`` — the same commit
protocol as a save, so a partial copy is never listed. It then records the verified copy in the
SOURCE version as ``copies/<copy-id>.json`` (which ``ls`` and ``gc --require-copy`` read).

Phases: resolve the source version and the destination, then (logged as ``copy.*``) check an
existing copy block by block, or stream the files and publish the record; write the copy record.

Memory: at most ``jobs`` files are in flight, each holding two read chunks (one being verified
and written, one prefetched) plus its destination writer's buffer (for S3:
``(max_concurrency + 1) * part_size``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from portable_ckpt.errors import (
    CheckpointError,
    ChecksumError,
    CommitConflictError,
    FileMissingError,
    FileSizeError,
    StorageError,
    UsageError,
    may_pass,
)
from portable_ckpt.format import jsonio, usage
from portable_ckpt.format.manifest import FORMAT_VERSION, FileRecord
from portable_ckpt.format.paths import check_relative_path
from portable_ckpt.io.checksum import crc32c, read_verified
from portable_ckpt.io.deletion import DELETION_DIR
from portable_ckpt.logs import get_logger, logged
from portable_ckpt.storage import Storage, check_root_url, local_path, open_storage

if TYPE_CHECKING:
    from portable_ckpt.io.reader import Checkpoint

__all__ = [
    "CopyResult",
    "copies_of",
    "copy_version",
    "copy_version_async",
    "normalize_root_url",
    "record_url",
    "url_of_record",
    "shutdown_background_copies",
]

_MIB = 1 << 20
_log = get_logger("io.copy")


def normalize_root_url(root: str | os.PathLike[str] | Storage) -> str:
    """Return the canonical URL of a root: ``s3://bucket/prefix`` or ``file:///abs/path``."""
    if isinstance(root, Storage):
        text = root.url
    else:
        text = os.fspath(root)
        check_root_url(text)  # "s3://" has no bucket: never the local folder "s3:"
    local = local_path(text)
    if local is None:  # s3://, or a registered scheme (storage.register_scheme)
        return text.rstrip("/")
    return "file://" + os.path.abspath(local)


def record_url(url: str) -> str:
    """``url`` as a copy record names it: spaces, control characters and ``%`` as ``%XX``.

    The record's ``destination`` is a URL without them (``copy.schema.json``): a destination
    such as ``/mnt/nightly backup`` got no record at all, and ``gc --require-copy`` kept
    everything (multi-job review F4). :func:`url_of_record` undoes it.
    """
    return "".join(
        f"%{ord(c):02X}" if ord(c) <= 0x20 or ord(c) == 0x7F or c == "%" else c for c in url
    )


_ENCODED = re.compile(r"%([01][0-9A-Fa-f]|2[05]|7[Ff])")


def url_of_record(url: str) -> str:
    """The root URL a copy record's ``destination`` names (:func:`record_url` undone).

    ``%`` itself is written ``%25``, so every URL comes back as it was: ``a%20b`` and ``a b``
    are two roots (attack review 3 F2, F11).
    """
    return _ENCODED.sub(lambda m: chr(int(m.group(1), 16)), url)


def _storage_for(url: str, *, create: bool) -> Storage:
    return open_storage(local_path(url) or url, create=create)


@dataclass
class CopyResult:
    """What :func:`copy_version` did.

    Attributes:
        attempt_id: The version copied (same id at both roots).
        step: Its step.
        source: URL of the source version directory.
        destination: URL of the destination root.
        destination_version: URL of the version directory at the destination.
        files: Number of files copied (or checked, when already present).
        bytes: Payload bytes copied.
        seconds: Wall time.
        already_present: The destination already held this exact version; nothing was copied,
            the destination's sizes were checked.
        server_checksums: Files whose destination CRC32C was verified by the store itself.
        record: Path (relative to the source root) of the copy record, when written.
        record_error: Why the copy record could not be written (the copy itself succeeded).
        record_retryable: Whether that cause may pass by itself (a storage that did not
            answer; not a permission): running the copy again then writes the record.
        warnings: Non-fatal observations (e.g. both roots on the same local device).

    """

    attempt_id: str
    step: int
    source: str
    destination: str
    destination_version: str
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    already_present: bool = False
    server_checksums: int = 0
    record: str | None = None
    record_error: str | None = None
    record_retryable: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def mib_per_s(self) -> float:
        """Copy throughput in MiB/s."""
        return self.bytes / _MIB / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        """JSON form used by ``portable-ckpt copy --json``."""
        return {
            "ok": True,
            "attempt_id": self.attempt_id,
            "step": self.step,
            "source": self.source,
            "destination": self.destination,
            "destination_version": self.destination_version,
            "files": self.files,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 6),
            "mib_per_s": round(self.mib_per_s, 3),
            "already_present": self.already_present,
            "server_checksums": self.server_checksums,
            "record": self.record,
            "record_error": self.record_error,
            "warnings": self.warnings,
        }


class _FileCopier:
    """Streams one file: ranged reads (one prefetched), per-block CRC32C checks, upload."""

    def __init__(
        self,
        src: Storage,
        dst: Storage,
        attempt: str,
        rec: FileRecord,
        chunk: int,
        reads: ThreadPoolExecutor,
        progress: Callable[[int], None],
        created: list[str] | None = None,
    ) -> None:
        self.src, self.dst, self.rec = src, dst, rec
        #: Where the files this copy created are named (list.append is atomic across threads).
        self.created = created
        self.rel = f"{attempt}/{check_relative_path(rec.path, what='file path')}"
        bs = rec.checksum.block_size
        if rec.checksum.algorithm != "crc32c":
            raise ChecksumError(
                f"{self.rel}: checksum algorithm {rec.checksum.algorithm!r} is not crc32c",
                path=self.rel,
            )
        self.block_size = bs
        self.chunk = max(bs, chunk // bs * bs)  # whole blocks per chunk
        self.reads = reads
        self.progress = progress

    def _read(self, offset: int, n: int) -> memoryview:
        buf = memoryview(bytearray(n))
        self.src.read_into(self.rel, offset, buf)
        return buf

    def _verify(self, offset: int, data: memoryview) -> None:
        bs, cs = self.block_size, self.rec.checksum
        for start in range(0, len(data), bs):
            index = (offset + start) // bs
            got = crc32c(data[start : start + bs])
            want = cs.block(index)
            if got != want:
                raise ChecksumError(
                    f"{self.src.url}/{self.rel}: block {index} (bytes {offset + start}.."
                    f"{offset + min(start + bs, len(data))}) has CRC32C {got:08x}, the manifest "
                    f"records {want:08x}; the source is corrupt, nothing was published at "
                    f"{self.dst.url}",
                    path=self.rel,
                )

    def run(self) -> bool:
        """Copy and verify; return whether the store verified a whole-object CRC32C."""
        size = self.rec.size
        expected_blocks = -(-size // self.block_size)
        if self.rec.checksum.block_count() != expected_blocks:
            raise ChecksumError(
                f"{self.rel}: manifest has {self.rec.checksum.block_count()} checksum blocks for "
                f"{size} bytes, expected {expected_blocks}",
                path=self.rel,
            )
        whole = 0
        try:
            writer = self.dst.open_writer(self.rel)
            if self.created is not None and self.dst.capabilities.local_path:
                # Created here: a local open is exclusive (O_EXCL), never over another copy's
                # file. An object store's writer proves nothing (a second copy's upload of the
                # same key replaces the first): nothing is recorded, nothing removed there.
                self.created.append(self.rel)
        except StorageError as exc:
            # Made since this copy looked: another copy runs. A local open is exclusive, so its
            # FileExistsError says so even when that copy, failing, removed the file again
            # before this one looked (a full run saw PCK-STORAGE for one of two copies).
            if isinstance(exc.__cause__, FileExistsError) or self.dst.exists(self.rel):
                raise CommitConflictError(
                    f"{self.dst.url}/{self.rel} appeared while this copy ran: another copy of "
                    "the version writes the same destination now; let it finish, then check it "
                    "with `portable-ckpt ls` (where both failed: copy again with --force)",
                    path=self.rel,
                ) from exc
            raise
        try:
            offset = 0
            pending: Future[memoryview] | None = (
                self.reads.submit(self._read, 0, min(self.chunk, size)) if size else None
            )
            while pending is not None:
                data = pending.result()
                nxt = offset + len(data)
                pending = (
                    self.reads.submit(self._read, nxt, min(self.chunk, size - nxt))
                    if nxt < size
                    else None
                )
                self._verify(offset, data)
                whole = crc32c(data, whole)
                writer.write(data)
                self.progress(len(data))
                offset = nxt
            writer.close()
        except BaseException:
            with contextlib.suppress(Exception):  # the first error is the one that counts
                writer.abort()
            raise
        got_size = self.dst.size(self.rel)
        if got_size != size:
            raise FileSizeError(
                f"{self.dst.url}/{self.rel}: destination holds {got_size} bytes after the copy, "
                f"the manifest records {size}",
                path=self.rel,
            )
        # A store that does not check uploads may echo the CRC32C it was sent (S3 review F8).
        if self.dst.capabilities.native_crc32c and self.dst.validates_checksums():
            value = self.dst.checksum_crc32c(self.rel)
            if value is not None:
                if value != whole:
                    raise ChecksumError(
                        f"{self.dst.url}/{self.rel}: the store reports CRC32C {value:08x}, the "
                        f"verified source bytes have {whole:08x}",
                        path=self.rel,
                    )
                return True
        return False


def _check_not_inside(src: Storage, src_url: str, dst_root: str | os.PathLike[str] | Storage,
                      dst_url: str) -> None:
    """Refuse a destination that is the source root under another name, or lies inside it.

    Checked before the destination is created or touched. URLs: the destination's prefix below
    the source's. Local roots: the real paths (symlinks resolved), and the device and inode of
    every existing directory from the destination up (a bind mount or a symlinked parent): a
    copy there is no second copy (and one inside a version is deleted together with it).
    """
    same = f"source and destination are the same root ({dst_url} is {src_url})"
    inside = f"the destination {dst_url} lies inside the source root {src_url}"
    if dst_url == src_url:
        raise UsageError(f"{same}; a copy must go to another root, ideally on independent storage")
    if dst_url.startswith(src_url.rstrip("/") + "/"):
        raise UsageError(f"{inside}; a copy must go to another root, outside the source")
    a = src.local_root()
    if isinstance(dst_root, Storage):
        b = dst_root.local_root()
    else:
        b = local_path(dst_url)
    if a is None or b is None:
        return
    real_a, real_b = os.path.realpath(a), os.path.realpath(b)
    try:
        st_a = os.stat(a)
    except OSError:
        return  # the source was opened from there: a failing stat changes nothing above
    probe = b
    while True:
        try:
            st = os.stat(probe)
        except OSError:
            st = None
        if st is not None and (st.st_dev, st.st_ino) == (st_a.st_dev, st_a.st_ino):
            break
        parent = os.path.dirname(probe)
        if parent == probe:
            probe = ""
            break
        probe = parent
    if probe or real_b == real_a or real_b.startswith(real_a.rstrip("/") + "/"):
        alias = probe == b or (not probe and real_b == real_a)
        how = f"{probe} is the directory {a}" if probe else f"its real path is {real_b}"
        raise UsageError(
            (same if alias else inside)
            + f": {how} (through a symbolic link or another mount); a copy must go to another "
            "root, ideally on independent storage"
        )


def _check_other_root(src: Storage, dst: Storage, dst_url: str) -> None:
    """Refuse a destination that is the source root under a name other than its URL.

    Local roots are compared by their real paths and inodes (:func:`_check_not_inside`); any
    other backend by a probe put into the destination that shows in the source (two
    spellings of a registered scheme's root: backend review B2). A destination that refuses
    the probe refuses the copy's files as well.
    """
    from portable_ckpt.io.clock import same_root

    if same_root(src, dst):
        raise UsageError(
            f"source and destination are the same root ({dst_url} is {src.url}: a probe put "
            "into the destination showed in the source); a copy must go to another root, "
            "ideally on independent storage"
        )


def _same_local_device(src: Storage, dst: Storage) -> bool:
    a, b = src.local_root(), dst.local_root()
    if a is None or b is None:
        return False
    try:
        probe = b
        while not os.path.exists(probe):
            probe = os.path.dirname(probe)
        return os.stat(a).st_dev == os.stat(probe).st_dev
    except OSError:
        return False


def _refuse_lost_record(job: _CopyJob) -> None:
    """The destination's attempt is a committed version whose record was lost: never cleared.

    Its drill, copy or verification records show it was committed (spec §15.1, errata 13):
    its files are the version's, not leftovers of an interrupted copy, and clearing them for
    the source's lost the intact version when the source's copy was damaged (on-call review
    4, R3). The source's commit record is the one to put back (spec §15.4).
    """
    from portable_ckpt.errors import ManifestMissingError
    from portable_ckpt.io.versions import INCOMPLETE, INVALID, classify_attempt

    c = classify_attempt(job.dst, job.attempt)
    if c.status not in (INCOMPLETE, INVALID):  # not positively leftovers: nothing is cleared
        raise c.error if c.error is not None else StorageError(  # (final review 20, 5)
            f"{job.result.destination}/{job.attempt}: cannot tell what its files are "
            f"({c.status}); nothing was deleted: retry", path=f"{job.attempt}/", retryable=True)
    if c.status == INVALID and isinstance(c.error, ManifestMissingError):
        where = f"{local_path(job.result.destination) or job.result.destination}/{job.attempt}"
        src = f"{local_path(job.result.source) or job.result.source}"
        raise CommitConflictError(
            f"{where} is a committed version whose commit record was lost (it holds its "
            f"records), not leftovers of a copy: nothing was deleted. Put the source's record "
            f"back (`cp {shlex.quote(src)}/manifest.json {shlex.quote(where)}/manifest.json`), "
            f"then `portable-ckpt verify {shlex.quote(where)} --deep` (docs/recovery.md)",
            path=f"{job.attempt}/manifest.json", retryable=False)


def _clear_partial(dst: Storage, attempt: str, *, force: bool, grace_s: float) -> None:
    """Remove leftovers of an interrupted copy at a local destination (never committed)."""
    leftovers = list(dst.list(f"{attempt}/"))
    if not leftovers:
        return
    from portable_ckpt.io.clock import storage_clock

    newest = max(i.mtime for i in leftovers)
    # The destination's clock set those times: this host's, ahead, made another copier's
    # fresh files look old (multi-job review F2).
    there = None if force or grace_s <= 0 else storage_clock(dst)
    age = (time.time() if there is None else there) - newest
    if not force and grace_s > 0 and age < grace_s:
        # A state of the destination, not a wrong argument: automation retrying a copy after
        # a crash tells "busy" (PCK-COMMIT-CONFLICT) from a usage error (PCK-USAGE).
        when = (
            f"written {age:.0f}s ago: another copy may be in progress; retry in "
            f"{max(1.0, grace_s - age):.0f}s"
            if age >= 0
            else f"whose times are {-age:.0f}s ahead of this machine's clock (the destination's "
            "clock runs ahead, or a copy is in progress): waiting does not tell"
        )
        # (what a gc stopped while deleting the version there left: re-attack 24, N7)
        what = ("a version a gc was deleting there (its deletion mark)" if any(
            f"/{DELETION_DIR}/" in i.path for i in leftovers) else "an uncommitted copy")
        raise CommitConflictError(
            f"{dst.url}/{attempt} holds {len(leftovers)} files of {what} {when}, or "
            "pass force=True (--force) to replace them if no other copy runs",
            path=f"{dst.url}/{attempt}",
            retryable=age >= 0,
        )
    dst.delete_prefix(f"{attempt}/")


def _restorable(ck: Checkpoint) -> bool:
    """Whether a restore would take the greatest version (no failed or unreadable records).

    Read from its verification records only: its commit record was read once, and the
    republished bytes are the bytes read (the listing walk below reads it again).
    """
    from portable_ckpt.io.annotations import failed_verifications, read_annotations

    errors: list[CheckpointError] = []
    records = read_annotations(ck.storage, ck.id, "verifications", errors=errors)
    return not errors and not failed_verifications(records)


def _version_a_restore_takes(root: str | os.PathLike[str]) -> str:
    """The path of the version a restore of ``root`` takes (``ls --latest``'s answer).

    ``copy ROOT DEST`` copied the greatest committed version, also one that failed
    verification, which the copy then refused as damaged every night (review of stop 23,
    E1): a backup is of what a restart takes. Raises as ``ls --latest`` fails: a version
    whose records could not be read stops the answer (R-ID-5).
    """
    from portable_ckpt.errors import NotFoundError
    from portable_ckpt.io.versions import newest_first, restore_decision, root_must_exist
    from portable_ckpt.storage import open_storage

    storage = open_storage(root)
    root_must_exist(storage)
    failed = []
    for v in newest_first(storage):
        decision = restore_decision(v)
        if decision == "take":
            return v.path
        if decision == "stop":
            raise StorageError(
                f"{v.path}: cannot tell whether it is the version a restore takes ({v.error}); "
                "nothing copied: run it again once it can be read (`portable-ckpt ls ROOT` says "
                "why)", path=f"{v.id}/manifest.json", retryable=v.error_retryable)
        if v.status == "committed":
            failed.append(v.id)
    raise NotFoundError(
        f"{root}: no version a restore takes" + (
            f" (its {len(failed)} committed version(s) failed verification; copy one "
            "explicitly as ROOT/ID)" if failed else ""))


def _remove_unpublished(job: _CopyJob) -> None:
    """After a copy failed: remove the files it wrote, unless the version is published there.

    A copy cut short by a full disk left its files, which used the space it needed and made
    its own retry wait ``partial_grace_s`` for "another copy in progress" (on-call review 23,
    F5). Best effort: what cannot be removed is a leftover the next copy clears.
    """
    try:
        if job.dst.exists(job.manifest_path):
            return  # another copy published it meanwhile: its files
        # Only the files this copy created: a copy that met another one writing the same
        # destination (PCK-COMMIT-CONFLICT) must not delete that one's files.
        for rel in job.created:
            job.dst.delete(rel)
        job.dst.remove_empty_dirs(f"{job.attempt}/")
    except (CheckpointError, OSError):
        pass


def _write_record(src: Storage, attempt: str, destination: str, result: CopyResult) -> str:
    from portable_ckpt.format.naming import utc_now_iso
    from portable_ckpt.format.schemas import validate_document
    from portable_ckpt.io.annotations import annotation_id, prune_quietly

    copy_id = annotation_id("c")
    rel = f"{attempt}/copies/{copy_id}.json"
    rec: dict[str, Any] = {
        "format": "portable-ckpt-copy",
        "format_version": FORMAT_VERSION,
        "attempt_id": attempt,
        "copy_id": copy_id,
        "destination": record_url(destination),
        "verified_at": utc_now_iso(),
        "ok": True,
        "error": None,
    }
    validate_document(rec, "copy.schema.json", what=rel)
    if not src.create_if_absent(rel, jsonio.dumps(rec, indent=2)):
        raise CommitConflictError(f"{src.url}/{rel} already exists", path=rel)
    prune_quietly(src, attempt, "copies")  # a copy run again each night: one record stays
    return rel


@dataclass
class _CopyJob:
    """One resolved copy: both roots, the version, its files (largest first), the result."""

    src: Storage
    dst: Storage
    attempt: str
    files: list[FileRecord]
    result: CopyResult
    #: The bytes of the source's ``manifest.json`` as opening it read them (republished as is).
    record: bytes
    #: The source version, opened (it tells a file missing from a version deleted meanwhile).
    version: Checkpoint | None = None
    #: The destination files this copy created (removed again if it fails).
    created: list[str] = field(default_factory=list)

    @property
    def manifest_path(self) -> str:
        return f"{self.attempt}/manifest.json"


def _resolve(
    src: str | os.PathLike[str], dst_root: str | os.PathLike[str] | Storage, step: int | None
) -> _CopyJob:
    """Open the source version and the destination root (no byte is copied yet)."""
    import portable_ckpt
    from portable_ckpt.storage import root_text

    ck = portable_ckpt.open(src, step=step)
    if step is None and not isinstance(src, Storage) and portable_ckpt._split_version(
        root_text(src)
    ) is None and not _restorable(ck):
        ck = portable_ckpt.open(_version_a_restore_takes(src))
    src_storage: Storage = ck.storage
    dst_url = normalize_root_url(dst_root)
    _check_not_inside(src_storage, normalize_root_url(src_storage), dst_root, dst_url)
    dst = dst_root if isinstance(dst_root, Storage) else _storage_for(dst_url, create=True)
    if local_path(dst_url) is None and not dst_url.startswith("s3://") and dst.url:
        # A registered scheme's backend gives one spelling per root (docs/storage-backends.md):
        # the record names the root by it, not as typed (backend review 27, L10).
        dst_url = dst.url.rstrip("/")
    if not dst.capabilities.atomic_create:  # as a save's commit refuses (backend review B4)
        raise StorageError(
            f"{dst_url} cannot create a commit record atomically (no create-if-absent): a copy "
            "publishes one as a save does; refusing to copy there — enable conditional writes "
            "on the store",
            retryable=False,
        )
    if src_storage.local_root() is None or dst.local_root() is None:
        _check_other_root(src_storage, dst, dst_url)
    result = CopyResult(
        attempt_id=ck.id,
        step=ck.manifest.step,
        source=ck.path,
        destination=dst_url,
        destination_version=f"{dst_url}/{ck.id}",
    )
    if _same_local_device(src_storage, dst):
        result.warnings.append(
            "source and destination are on the same local device: this copy does not survive "
            "the loss of that device"
        )
    files = sorted(ck.manifest.files.values(), key=lambda r: -r.size)
    record = ck.manifest.source
    if record is None:  # pragma: no cover - open() reads the record from storage
        record = src_storage.read_all(f"{ck.id}/manifest.json", max_size=jsonio.MAX_MANIFEST_BYTES)
    return _CopyJob(src_storage, dst, ck.id, files, result, record, ck)


def _check_same_record(job: _CopyJob, raw: bytes, conflict: str) -> None:
    """Raise ``CommitConflictError`` unless the destination's commit record is ``raw``."""
    mrel = job.manifest_path
    if job.dst.read_all(mrel, max_size=jsonio.MAX_MANIFEST_BYTES) != raw:
        raise CommitConflictError(f"{job.result.destination}/{mrel} {conflict}", path=mrel)


def _set_aside(dst_url: str, attempt: str) -> str:
    """How to replace a damaged version at a copy's destination (docs/recovery.md)."""
    where = f"{local_path(dst_url) or dst_url}/{attempt}"
    return (f"Nothing was changed. Set that version aside there (move {where} elsewhere), run "
            "the copy again and verify it (docs/recovery.md)")


def _verify_existing(job: _CopyJob, raw: bytes) -> None:
    """The destination already holds the version: check its record and every block there."""
    dst, dst_url = job.dst, job.result.destination
    rebuilt = b'"portable-ckpt recommit"' in raw  # its producer (spec §15.4)
    _check_same_record(
        job, raw, f"exists with a different commit record than {job.result.source}; refusing "
        "to overwrite a committed version" + (
            ": the source's record was rebuilt by `portable-ckpt recommit` after its own was "
            "lost, and this destination holds the original. Put the original back in the "
            f"source (`cp {shlex.quote(local_path(job.result.destination) or job.result.destination)}"
            f"/{job.attempt}/manifest.json {shlex.quote(local_path(job.result.source) or job.result.source)}"
            "/manifest.json`), or set one of them aside (on-call review 5, R4)"
            if rebuilt else ""),
    )
    # Before vouching for an existing copy, verify every block of every file there.
    window = bytearray(8 << 20)
    for rec in job.files:
        rel = f"{job.attempt}/{rec.path}"
        if dst.size(rel) != rec.size:
            raise FileSizeError(
                f"{dst_url}/{rel}: {dst.size(rel)} bytes, manifest records {rec.size}; the "
                f"destination's copy is damaged. {_set_aside(dst_url, job.attempt)}",
                path=rel,
            )
        bs = rec.checksum.block_size
        step = len(window) // bs * bs or bs
        if len(window) < step:
            window = bytearray(step)
        for pos in range(0, rec.size, step):
            n = min(step, rec.size - pos)
            try:
                read_verified(dst, rel, rec, pos, pos + n, memoryview(window)[:n])
            except ChecksumError as exc:
                # The message named a path both roots hold and said "restore it from a copy":
                # it read as if the source, the good copy, were damaged (incident review R3).
                raise ChecksumError(
                    f"the destination {dst_url} already holds {job.attempt}, and its copy there "
                    f"is damaged: {exc.message}. The source was not found damaged. "
                    f"{_set_aside(dst_url, job.attempt)}",
                    path=exc.path, span=exc.span,
                ) from None
    job.result.already_present = True
    job.result.files = len(job.files)
    from portable_ckpt.io.annotations import failed_verifications, read_annotations
    from portable_ckpt.io.hints import clear_failed

    # Every byte verified there, yet a failed verification keeps that version from restores
    # (a file repaired in place): the copy changed nothing (on-call review 3, F5).
    failed = failed_verifications(read_annotations(dst, job.attempt, "verifications", errors=[]))
    if failed:
        job.result.warnings.append(
            f"{dst_url}/{job.attempt} failed verification earlier "
            f"({failed[-1].get('verification_id')}) and is still passed over by restores; its "
            f"files verify now: `{clear_failed(f'{dst_url}/{job.attempt}')}` clears it (spec "
            "§14.5)")


def _copy_files(
    job: _CopyJob, jobs: int, chunk_size: int, progress: Callable[[int, int], None] | None
) -> None:
    """Stream every file (``jobs`` at a time); the first failure cancels the rest and raises."""
    total = sum(r.size for r in job.files)
    done = [0]
    lock = threading.Lock()

    def on_bytes(n: int) -> None:
        with lock:
            done[0] += n
            now_done = done[0]
        if progress is not None:
            progress(now_done, total)

    with (
        ThreadPoolExecutor(jobs, thread_name_prefix="pck-copy-read") as reads,
        ThreadPoolExecutor(jobs, thread_name_prefix="pck-copy-file") as pool,
    ):
        futures = [
            pool.submit(_FileCopier(job.src, job.dst, job.attempt, rec, chunk_size, reads,
                                    on_bytes, job.created).run)
            for rec in job.files
        ]
        first: BaseException | None = None
        for fut in futures:
            try:
                if fut.result():
                    job.result.server_checksums += 1
            except BaseException as exc:
                if first is None:
                    first = exc
                    for other in futures:
                        other.cancel()
        if first is not None:
            raise first
    job.result.files = len(job.files)
    job.result.bytes = total


def _check_copied(job: _CopyJob, when: str, advice: str) -> None:
    """Every file of the version is at the destination with its recorded size (R-COMMIT-4).

    Sizes only (no data is read again). Something else writing the same attempt at the
    destination (``copy --force`` clearing it as leftovers, a hand-made ``rm``) after this copy
    wrote its files is caught here rather than published, or vouched for in a copy record.
    """
    dst, dst_url = job.dst, job.result.destination
    for rec in job.files:
        rel = f"{job.attempt}/{rec.path}"
        try:
            size = dst.size(rel)
        except FileMissingError as exc:
            raise FileMissingError(
                f"{dst_url}/{rel} was copied and is gone {when} (another copy of this version to "
                f"the same root, run with --force, or another program removed it): {advice}",
                path=rel,
            ) from exc
        if size != rec.size:
            raise FileSizeError(
                f"{dst_url}/{rel} was copied and holds {size} bytes {when}, the manifest records "
                f"{rec.size} (another copy of this version to the same root, or another program "
                f"changed it): {advice}",
                path=rel,
            )


def _publish(job: _CopyJob, raw: bytes) -> None:
    """Make the copied files durable, check them, then create the destination's commit record.

    After the record exists, the files are checked once more (sizes): the copy record that
    vouches for the destination is written only when they are all still there.
    """
    from portable_ckpt.io.versions import load_manifest

    dst = job.dst
    dst.sync()  # R-COMMIT-17: every copied file and its name durable before the record
    _check_copied(job, "before the commit record was created", "nothing was published; copy again")
    if not dst.create_if_absent(job.manifest_path, raw):
        _check_same_record(job, raw, "was committed concurrently with a different record")
    load_manifest(dst, job.attempt)  # the published version parses and validates
    _check_copied(
        job, "just after the commit record was created", f"the version {job.attempt} at "
        f"{job.result.destination} is damaged and no copy record was written; delete that "
        "version there and copy again"
    )


def _finished_fields(result: CopyResult) -> dict[str, Any]:
    """The ``copy.finished`` fields beyond bytes and seconds (and the message's detail)."""
    where = result.destination_version
    detail = (f"already present at {where}, {result.files} files verified there"
              if result.already_present else f"{result.files} files, version {where}")
    return {
        "files": result.files,
        "bytes": result.bytes,
        "destination_version": where,
        "already_present": result.already_present,
        "server_checksums": result.server_checksums,
        "record": result.record,
        "record_error": result.record_error,
        "warnings": result.warnings,
        "detail": detail,
    }


def copy_version(
    src: str | os.PathLike[str],
    dst_root: str | os.PathLike[str] | Storage,
    *,
    step: int | None = None,
    jobs: int = 2,
    chunk_size: int = 8 * _MIB,
    record: bool = True,
    force: bool = False,
    partial_grace_s: float = 300.0,
    progress: Callable[[int, int], None] | None = None,
) -> CopyResult:
    """Copy one committed version to another root, verified, published atomically.

    Logged on ``portable_ckpt.io.copy`` as ``copy.started`` (``attempt_id``, ``step``,
    ``source``, ``destination``) and ``copy.finished`` (also ``files``, ``bytes``,
    ``seconds``, ``mib_per_s``, ``destination_version``, ``already_present``, ...), or
    ``copy.refused`` / ``copy.failed``; a source that cannot be opened raises before
    ``copy.started``.

    Args:
        src: A version directory (``<root>/<attempt-id>``) or a root (the version a restore
            takes, as ``ls --latest`` names it: the newest committed version no verification
            failed; or the newest of ``step``); local path or ``s3://``.
        dst_root: The destination root (local path, ``file://`` URL, ``s3://bucket/prefix`` or a
            :class:`Storage`); created when missing.
        step: With a root as ``src``, copy the newest committed version of this step.
        jobs: Files copied concurrently.
        chunk_size: Bytes per ranged read (rounded down to whole checksum blocks).
        record: Write ``copies/<copy-id>.json`` into the source version afterwards.
        force: Replace leftovers of an interrupted copy at a local destination even if recent.
        partial_grace_s: Leftovers younger than this are assumed to be a copy in progress.
        progress: Called as ``progress(bytes_done, bytes_total)`` from worker threads.

    Returns:
        A :class:`CopyResult`.

    Raises:
        UsageError: source and destination are the same root (also under another name: a
            symbolic link, another mount), the destination lies inside the source root, or
            ``partial_grace_s`` is not a finite number >= 0.
        ChecksumError: a source block does not match its manifest checksum (nothing published).
        FileMissingError, FileSizeError: a copied file vanished or changed at the destination
            before the record was published (nothing published), or just after (no copy record).
        CommitConflictError: the destination holds a different commit record for this id.
        StorageError: an I/O failure (nothing published unless the manifest PUT succeeded).

    """
    from portable_ckpt.io.gc import check_grace

    t0 = time.perf_counter()
    jobs = usage.strict_int(jobs, "copy_version: jobs", minimum=1)
    chunk_size = usage.strict_int(chunk_size, "copy_version: chunk_size", minimum=1)
    check_grace(partial_grace_s, "partial_grace_s")
    job = _resolve(src, dst_root, step)
    result = job.result
    fields: dict[str, Any] = {"attempt_id": result.attempt_id, "step": result.step,
                              "source": result.source, "destination": result.destination}
    what = f"copy of {result.source} to {result.destination}"
    with logged(_log, "copy", what, t0=t0, **fields) as out:
        raw = job.record
        if job.dst.exists(job.manifest_path):
            _verify_existing(job, raw)
        else:
            from portable_ckpt.io.versions import check_record_absent

            # Something that is not a file under the record's name is no leftover to clear.
            check_record_absent(job.dst, job.attempt)
            _refuse_lost_record(job)
            if job.dst.capabilities.local_path:
                _clear_partial(job.dst, job.attempt, force=force, grace_s=partial_grace_s)
            try:
                _copy_files(job, jobs, chunk_size, progress)
            except FileMissingError as exc:
                _remove_unpublished(job)
                # gc or retention deleted the source version meanwhile: not damage (SRE S8)
                gone = job.version._deleted(exc) if job.version is not None else None
                if gone is None:
                    raise
                raise gone from exc
            except BaseException:
                _remove_unpublished(job)
                raise
            _publish(job, raw)
        if record:
            try:
                result.record = _write_record(job.src, job.attempt, result.destination, result)
            except (CheckpointError, OSError) as exc:
                result.record_error = str(exc)
                result.record_retryable = may_pass(exc)
        result.seconds = time.perf_counter() - t0
        out.update(_finished_fields(result))
    return result


_background: ThreadPoolExecutor | None = None
_background_lock = threading.Lock()


def copy_version_async(
    src: str | os.PathLike[str], dst_root: str | os.PathLike[str] | Storage, **kwargs: Any
) -> Future[CopyResult]:
    """Start :func:`copy_version` in a background thread and return its ``Future``.

    Meant for "save fast to local disk, then replicate": background copies run one at a time,
    in submission order, so a burst of saves never multiplies memory or bandwidth use. The
    interpreter waits for running copies at exit; call :func:`shutdown_background_copies` to
    wait explicitly.
    """
    global _background
    with _background_lock:
        if _background is None:
            _background = ThreadPoolExecutor(1, thread_name_prefix="pck-copy-bg")
        return _background.submit(copy_version, src, dst_root, **kwargs)


def shutdown_background_copies(*, wait: bool = True) -> None:
    """Wait for (``wait=True``) or abandon queued background copies and stop their thread."""
    global _background
    with _background_lock:
        pool, _background = _background, None
    if pool is not None:
        pool.shutdown(wait=wait, cancel_futures=not wait)


def copies_of(storage: Storage, ident: str) -> tuple[list[str], str | None]:
    """The roots holding a verified copy of ``ident`` (its copy records, spec §14.4).

    Also why the list may be short (a copy record that could not be read). Read only, and
    never raises: a copy record never makes a restore fail (incident review R4). Used by the
    restore's report, retention's message and ``recommit`` (the record to put back).
    """
    from portable_ckpt.io.annotations import read_annotations

    copies: list[str] = []
    problem: str | None = None
    errors: list[CheckpointError] = []
    try:
        records = read_annotations(storage, ident, "copies", errors=errors)
        here = normalize_root_url(storage)
        for rec in records:
            dest = rec.get("destination")
            if rec.get("ok") is not True or not isinstance(dest, str):
                continue
            url = url_of_record(dest)
            shown = local_path(url) or url
            if url.rstrip("/") != here and shown not in copies:
                copies.append(shown)
    except Exception as exc:  # the restore's outcome must not depend on a record
        problem = f"{type(exc).__name__}: {exc}"
    if errors and problem is None:
        problem = str(errors[0])
    return copies, problem
