"""The committer: check everything the writers reported, then publish ``manifest.json``.

Nothing is published unless every expected writer reported, writers agree on every tensor's dtype
and shape and on every entry's declaration, every tensor is covered exactly once, every referenced
file exists with its recorded size and every range record agrees with its safetensors header. The
commit record is created with the storage's atomic create-if-absent; it is the only thing that
makes a version exist.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from portable_ckpt import __version__
from portable_ckpt.errors import (
    AttemptIdError,
    CommitConflictError,
    EntryMissingError,
    FileSizeError,
    MetadataConflictError,
    SchemaError,
    StorageError,
    UsageError,
    WriterMissingError,
)
from portable_ckpt.format import jsonio
from portable_ckpt.format.dtypes import DTYPES
from portable_ckpt.format.manifest import (
    FORMAT_VERSION,
    Continuation,
    Entry,
    FileRecord,
    Manifest,
    TensorEntry,
    WriterIndex,
    parse_writer_index,
)
from portable_ckpt.format.naming import (
    attempt_time,
    check_attempt_id,
    index_file_name,
    parse_attempt_step,
    utc_now_iso,
)
from portable_ckpt.io.checksum import DEFAULT_BLOCK_SIZE, BlockHasher, read_verified_bytes
from portable_ckpt.io.safetensors_io import check_range, load_header
from portable_ckpt.ranges.coverage import check_coverage
from portable_ckpt.storage.base import Storage

__all__ = ["CommitReport", "commit", "merge_indexes", "read_writer_index"]


@dataclass
class CommitReport:
    """What a commit checked (kept on the returned manifest's ``report`` attribute)."""

    writers: int = 0
    files: int = 0
    tensors: int = 0
    ranges: int = 0
    bytes: int = 0
    checks: list[str] = field(default_factory=list)


def read_writer_index(storage: Storage, attempt_id: str, writer: int) -> WriterIndex:
    """Read and validate ``index/wNNNNN.json`` of ``writer`` from storage."""
    rel = index_file_name(writer)
    full = f"{attempt_id}/{rel}"
    if not storage.exists(full):
        raise WriterMissingError(
            f"writer {writer} of attempt {attempt_id} left no index ({full}); it did not finish — "
            "the attempt cannot be committed"
        )
    data = storage.read_all(full, max_size=jsonio.MAX_DOCUMENT_BYTES)
    idx = parse_writer_index(jsonio.loads(data, what=full), what=full)
    if idx.writer != writer:
        raise SchemaError(
            f"{full}: names writer {idx.writer}, its file name says {writer}", path=full
        )
    h = BlockHasher(DEFAULT_BLOCK_SIZE)
    h.update(data)
    from portable_ckpt.format.manifest import Checksum

    idx.index_file = FileRecord(rel, len(data), Checksum("crc32c", DEFAULT_BLOCK_SIZE, h.blocks()))
    return idx


def merge_indexes(
    attempt_id: str, indexes: Iterable[WriterIndex], expected_writers: Sequence[int] | None
) -> tuple[dict[str, FileRecord], dict[str, TensorEntry], dict[str, Entry], int]:
    """Merge writer indexes into the manifest's files, tensors and entries (no I/O).

    Returns ``(files, tensors, entries, writer_count)``.
    """
    files: dict[str, FileRecord] = {}
    tensors: dict[str, TensorEntry] = {}
    entries: dict[str, Entry] = {}
    seen: set[int] = set()
    for idx in indexes:
        if idx.attempt_id != attempt_id:
            raise AttemptIdError(
                f"writer {idx.writer} reported attempt {idx.attempt_id}, committing {attempt_id}"
            )
        if idx.writer in seen:
            raise MetadataConflictError(f"writer {idx.writer} reported twice")
        seen.add(idx.writer)
        recs = list(idx.files.values()) + ([idx.index_file] if idx.index_file else [])
        for rec in recs:
            if rec.path in files:
                raise MetadataConflictError(f"file {rec.path!r} is reported by two writers")
            files[rec.path] = rec
        for key, t in idx.tensors.items():
            cur = tensors.get(key)
            if cur is None:
                tensors[key] = TensorEntry(key, t.dtype, t.shape, list(t.ranges))
            elif (cur.dtype, cur.shape) != (t.dtype, t.shape):
                raise MetadataConflictError(
                    f"tensor {key!r}: writer {idx.writer} says {t.dtype}{list(t.shape)}, another "
                    f"writer says {cur.dtype}{list(cur.shape)}; every writer must agree"
                )
            else:
                cur.ranges.extend(t.ranges)
        for name, e in idx.entries.items():
            cur_e = entries.get(name)
            if cur_e is None:
                entries[name] = Entry(
                    e.name, e.schema, e.scope, e.encoding, list(e.values), e.world_size_policy
                )
            elif cur_e.declaration() != e.declaration():
                raise MetadataConflictError(
                    f"entry {name!r}: writer {idx.writer} declares a different schema, scope, "
                    "encoding or policy than another writer"
                )
            else:
                have = {v.rank for v in cur_e.values}
                for v in e.values:
                    if v.rank in have:
                        what = (
                            "the global value" if v.rank is None else f"the value of rank {v.rank}"
                        )
                        raise MetadataConflictError(
                            f"entry {name!r}: writer {idx.writer} and another writer both stored {what}"
                        )
                    have.add(v.rank)
                cur_e.values.extend(e.values)
    if expected_writers is not None:
        missing = sorted(set(expected_writers) - seen)
        if missing:
            raise WriterMissingError(
                f"attempt {attempt_id}: no report from writer(s) {missing[:16]}; nothing is published"
            )
        extra = sorted(seen - set(expected_writers))
        if extra:
            raise MetadataConflictError(f"attempt {attempt_id}: unexpected writer(s) {extra[:16]}")
    return files, tensors, entries, len(seen)


def commit(
    storage: Storage,
    attempt_id: str,
    *,
    step: int,
    indexes: Sequence[WriterIndex] | None = None,
    expected_writers: Sequence[int] | None = None,
    continuation: Continuation | None = None,
    producer: dict[str, Any] | None = None,
    check_headers: bool = True,
) -> Manifest:
    """Verify an attempt and publish its commit record.

    Args:
        storage: The checkpoint root.
        attempt_id: The attempt every writer wrote into.
        step: The completed step (must equal the step in ``attempt_id``).
        indexes: The writers' indexes, in memory; ``None`` reads ``index/wNNNNN.json`` of every
            writer in ``expected_writers`` from storage.
        expected_writers: Writer numbers that must have reported (default: those in ``indexes``).
        continuation: The continuation contract (default ``exact`` on one rank).
        producer: ``{"name", "version"}`` of the writing software.
        check_headers: Read every shard header and check it against the range records.

    Returns:
        The published manifest.

    Raises:
        CheckpointError: any failed check; nothing is published.

    """
    check_attempt_id(attempt_id)
    if not storage.capabilities.atomic_create:
        raise StorageError(
            f"{storage.url} cannot create the commit record atomically (no create-if-absent); "
            "refusing to commit — enable conditional writes on the store"
        )
    if parse_attempt_step(attempt_id) != step:
        raise UsageError(f"step {step} differs from the step in attempt id {attempt_id}")
    # Files this process wrote with deferred durability become durable before anything is checked.
    storage.sync()
    cont = continuation or Continuation(
        "exact", len(expected_writers) if expected_writers else max(1, len(indexes or [])), None
    )
    if indexes is None:
        if expected_writers is None:
            raise UsageError("commit needs indexes= or expected_writers=")
        indexes = [read_writer_index(storage, attempt_id, w) for w in expected_writers]
    files, tensors, entries, nwriters = merge_indexes(attempt_id, indexes, expected_writers)
    report = CommitReport(writers=nwriters, files=len(files), tensors=len(tensors))
    for key, t in tensors.items():
        check_coverage(t.shape, [r.box for r in t.ranges], key=key)
        report.ranges += len(t.ranges)
    report.checks.append("coverage")
    for name, e in entries.items():
        if e.scope == "global" and len(e.values) != 1:
            raise EntryMissingError(
                f"global entry {name!r} has {len(e.values)} values; exactly one is required"
            )
        if e.scope == "per_rank":
            ranks = {v.rank for v in e.values}
            missing = sorted(set(range(cont.world_size)) - ranks)
            if missing or len(e.values) != cont.world_size:
                raise EntryMissingError(
                    f"per_rank entry {name!r} lacks rank(s) {missing[:8]} of world size "
                    f"{cont.world_size} (or has values beyond it)"
                )
    for path, rec in files.items():
        actual = storage.size(f"{attempt_id}/{path}")
        if actual != rec.size:
            raise FileSizeError(
                f"{attempt_id}/{path}: {actual} bytes on storage, the writer reported {rec.size}",
                path=path,
            )
        report.bytes += rec.size
    report.checks.append("files")
    if check_headers:
        by_file: dict[str, list[tuple[TensorEntry, Any]]] = {}
        for t in tensors.values():
            for r in t.ranges:
                by_file.setdefault(r.file, []).append((t, r))
        for path, items in by_file.items():
            full = f"{attempt_id}/{path}"
            rec = files[path]

            def read(lo: int, hi: int, full: str = full, rec: FileRecord = rec) -> bytes:
                return read_verified_bytes(storage, full, rec, lo, hi)

            hdr = load_header(read, file_size=rec.size, what=full, probe=rec.checksum.block_size)
            for t, r in items:
                item = DTYPES[t.dtype]
                check_range(
                    hdr,
                    what=full,
                    key=t.key,
                    rec_name=r.name,
                    codec=r.codec,
                    st_dtype=item.safetensors,
                    lengths=r.lengths,
                    nbytes=item.itemsize * _prod(r.lengths),
                )
        report.checks.append("headers")
    created = attempt_time(attempt_id)
    import datetime as _dt

    created_iso = (
        _dt.datetime.fromtimestamp(created, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        if created is not None
        else utc_now_iso()
    )
    manifest = Manifest(
        attempt_id=attempt_id,
        step=step,
        created_at=created_iso,
        committed_at=utc_now_iso(),
        producer=producer or {"name": "portable_ckpt", "version": __version__},
        continuation=cont,
        files=files,
        tensors=tensors,
        entries=entries,
        format_version=FORMAT_VERSION,
    )
    # Every part was validated on the way in (writer indexes are parsed or built by ShardWriter),
    # so the document is not parsed again here: at thousands of writers that re-parse was most
    # of the commit's time. Tests parse every committed manifest with the reader's parser.
    data = jsonio.dumps(manifest.to_json())
    if not storage.create_if_absent(f"{attempt_id}/manifest.json", data):
        raise CommitConflictError(
            f"{attempt_id}/manifest.json already exists; an attempt is committed once and never "
            "overwritten (start a new attempt)"
        )
    manifest.report = report  # type: ignore[attr-defined]
    return manifest


def _prod(xs: Sequence[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out
