"""The committer: check everything the writers reported, then publish ``manifest.json``.

Nothing is published unless every expected writer reported, writers agree on every tensor's dtype
and shape and on every entry's declaration, every tensor is covered exactly once, every referenced
file exists with its recorded size and every range record agrees with its safetensors header. The
commit record is created with the storage's atomic create-if-absent; it is the only thing that
makes a version exist.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import secrets
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from portable_ckpt import __version__
from portable_ckpt.errors import (
    AttemptIdError,
    CheckpointError,
    CommitConflictError,
    CommitOutcomeUnknownError,
    DtypeUnsupportedError,
    FileMissingError,
    FileSizeError,
    LimitError,
    MetadataConflictError,
    SchemaError,
    StorageError,
    UsageError,
    WriterMissingError,
)
from portable_ckpt.format import jsonio, usage
from portable_ckpt.format.dtypes import DTYPES
from portable_ckpt.format.manifest import (
    TABLE_FORMAT_VERSION,
    Checksum,
    Continuation,
    Entry,
    FileRecord,
    Manifest,
    TableRef,
    TensorEntry,
    WriterIndex,
    check_continuation,
    dtypes_announced,
    entry_values_problem,
    files_bytes,
    parse_manifest,
    parse_writer_index,
)
from portable_ckpt.format.naming import (
    attempt_time,
    check_attempt_id,
    index_file_name,
    parse_attempt_step,
    utc_now_iso,
)
from portable_ckpt.io.annotations import lists_file, reread_record
from portable_ckpt.io.checksum import (
    METADATA_BLOCK_SIZE,
    BlockHasher,
    read_verified,
    read_verified_bytes,
)
from portable_ckpt.io.safetensors_io import check_range, load_header
from portable_ckpt.io.table_decode import TableCache, decode_table, read_table_file
from portable_ckpt.io.tensor_table import (
    DTYPE_CODES,
    EXTENSION,
    TABLE_THRESHOLD,
    TensorTable,
    encode_table,
    range_name,
)
from portable_ckpt.io.versions import commit_time
from portable_ckpt.logs import get_logger, logged
from portable_ckpt.ranges.coverage import LayoutCache, check_coverage
from portable_ckpt.storage.base import Storage

_log = get_logger("io")

__all__ = [
    "CommitReport",
    "CommittedManifest",
    "commit",
    "load_writer_table",
    "logged_commit",
    "merge_indexes",
    "merge_tables",
    "read_writer_index",
    "read_writer_indexes",
    "refuse_without_atomic_create",
]


@dataclass
class CommitReport:
    """What a commit checked (kept on the returned manifest's ``report`` attribute)."""

    writers: int = 0
    files: int = 0
    tensors: int = 0
    ranges: int = 0
    bytes: int = 0
    checks: list[str] = field(default_factory=list)


def read_writer_index(
    storage: Storage,
    attempt_id: str,
    writer: int,
    cache: TableCache | None = None,
) -> WriterIndex:
    """Read and validate ``index/wNNNNN.json`` of ``writer`` (and its tensor table, if any)."""
    idx = _parse_index(attempt_id, writer, _read_index_bytes(storage, attempt_id, writer))
    if idx.tensor_table is not None:
        idx.table = load_writer_table(storage, attempt_id, idx, cache)
    return idx


def read_writer_indexes(
    storage: Storage,
    attempt_id: str,
    writers: Sequence[int],
    cache: TableCache | None = None,
    *,
    threads: int = 16,
) -> list[WriterIndex]:
    """Read the indexes (and tensor tables) of many writers with overlapped I/O.

    On an object store (where each read is a round trip) reads run on a thread pool; parsing
    and validation stay on the calling thread, in writer order, so errors are deterministic.
    Local roots are read sequentially.
    """
    if len(writers) <= 1 or storage.local_root() is not None:
        # Local files come from the page cache: threads would only contend for the GIL with
        # the parsing done here.
        return [read_writer_index(storage, attempt_id, w, cache) for w in writers]
    with ThreadPoolExecutor(max_workers=min(threads, len(writers))) as pool:
        raw = list(pool.map(lambda w: _read_index_bytes(storage, attempt_id, w), writers))
        out = [_parse_index(attempt_id, w, data) for w, data in zip(writers, raw, strict=True)]
        del raw
        _load_tables(storage, attempt_id, out, cache, pool)
    return out


def _read_index_bytes(storage: Storage, attempt_id: str, writer: int) -> bytes:
    full = f"{attempt_id}/{index_file_name(writer)}"
    if not storage.exists(full):
        raise WriterMissingError(
            f"writer {writer} of attempt {attempt_id} left no index ({full}); it did not finish — "
            "the attempt cannot be committed"
        )
    return storage.read_all(full, max_size=jsonio.MAX_DOCUMENT_BYTES)


def _parse_index(attempt_id: str, writer: int, data: bytes) -> WriterIndex:
    rel = index_file_name(writer)
    full = f"{attempt_id}/{rel}"
    idx = parse_writer_index(jsonio.loads(data, what=full), what=full)
    if idx.writer != writer:
        raise SchemaError(
            f"{full}: names writer {idx.writer}, its file name says {writer}", path=full
        )
    h = BlockHasher(METADATA_BLOCK_SIZE)
    h.update(data)
    idx.index_file = FileRecord(rel, len(data), Checksum("crc32c", METADATA_BLOCK_SIZE, h.blocks()))
    return idx


def _load_tables(
    storage: Storage,
    attempt_id: str,
    indexes: Sequence[WriterIndex],
    cache: TableCache | None,
    pool: ThreadPoolExecutor,
    window: int = 64,
) -> None:
    """Load every missing writer table: reads on ``pool`` (a bounded window ahead), decoding here."""
    todo = [idx for idx in indexes if idx.tensor_table is not None and idx.table is None]
    pending: dict[int, Future[bytearray]] = {}
    for i, idx in enumerate(todo):
        for j in range(i, min(len(todo), i + window)):
            if j not in pending:
                pending[j] = pool.submit(_read_table_bytes, storage, attempt_id, todo[j])
        buf = pending.pop(i).result()
        idx.table = _decode_index_table(attempt_id, idx, buf, cache)


def load_writer_table(
    storage: Storage,
    attempt_id: str,
    idx: WriterIndex,
    cache: TableCache | None = None,
) -> TensorTable:
    """Read, verify and decode the tensor table a writer index references (spec §8.5)."""
    ref = idx.tensor_table
    if ref is None:
        raise UsageError(f"writer {idx.writer} has no tensor table")
    return _decode_index_table(attempt_id, idx, _read_table_bytes(storage, attempt_id, idx), cache)


def _decode_index_table(
    attempt_id: str, idx: WriterIndex, buf: bytearray, cache: TableCache | None
) -> TensorTable:
    """Decode a writer's table; its dtype codes are rows of the index's version (R-DTYPE-3).

    A 1.1 index whose table held a code of 1.3 was merged and published as a 1.3 version
    (the committer stamps what it merged): a JSON tensor of that index was refused.
    """
    ref = idx.tensor_table
    if ref is None:  # pragma: no cover - called for an index with a table
        raise UsageError(f"writer {idx.writer} has no tensor table")
    what = f"{attempt_id}/{ref.file}"
    table = decode_table(buf, codec=ref.codec, what=what, files=idx.files, cache=cache)
    problem = table.dtypes_not_defined(idx.format_version, None)
    if problem:
        raise DtypeUnsupportedError(
            f"{what}: {problem} (in the table of {index_file_name(idx.writer)})", path=what
        )
    return table


def _read_table_bytes(storage: Storage, attempt_id: str, idx: WriterIndex) -> bytearray:
    ref = idx.tensor_table
    if ref is None:
        raise UsageError(f"writer {idx.writer} has no tensor table")
    rec = idx.files[ref.file]
    full = f"{attempt_id}/{ref.file}"
    actual = storage.size(full)
    if actual != rec.size:
        raise FileSizeError(
            f"{full}: {actual} bytes on storage, writer {idx.writer} reported {rec.size}", path=full
        )

    def read(lo: int, hi: int, dest: memoryview) -> None:
        read_verified(storage, full, rec, lo, hi, dest)

    return read_table_file(
        read,
        size=rec.size,
        codec=ref.codec,
        block_size=rec.checksum.block_size,
        what=full,
    )


def _table_of(idx: WriterIndex) -> TensorTable:
    if idx.tensor_table is not None:
        if idx.table is None:
            raise UsageError(f"writer {idx.writer}: its tensor table was not loaded")
        table: TensorTable = idx.table
        return table
    return TensorTable.from_entries(idx.tensors.values())


def merge_tables(indexes: Sequence[WriterIndex]) -> TensorTable:
    """Merge the tensors of writer indexes (tables or JSON) into one table (no I/O).

    Writers of one job usually declare the same tensors in the same order: their declaration
    columns are compared by digest, so the per-key work is done once per distinct declaration
    set, and every range record is moved with array operations only.

    Raises:
        MetadataConflictError: writers disagree on a tensor's dtype or shape.

    """
    ids = _TensorIds()
    path_id: dict[str, int] = {}
    parts: list[tuple[np.ndarray[Any, Any], ...]] = []
    for idx in indexes:
        tab = _table_of(idx)
        gmap = ids.of(idx.writer, tab)
        if tab.records == 0:
            continue
        pmap = np.array([path_id.setdefault(p, len(path_id)) for p in tab.paths], dtype=np.uint32)
        tid = np.repeat(gmap, tab.counts)
        parts.append((tid, pmap[tab.file], tab.codec, tab.offsets, tab.lengths))
    ntensors = len(ids.dtypes)
    gnd = np.array([len(s) for s in ids.shapes], dtype=np.int64)
    order = np.lexsort((np.arange(ntensors), gnd))  # tensors by (ndim, first appearance)
    counts, cols = _records_by_tensor(parts, gnd, ntensors)
    keys = list(ids.keys)

    def cat(parts: list[np.ndarray[Any, Any]], dt: Any) -> np.ndarray[Any, Any]:
        return np.concatenate(parts).astype(dt, copy=False) if parts else np.zeros(0, dt)

    shapes = itertools.chain.from_iterable(ids.shapes[g] for g in order.tolist())
    return TensorTable(
        [keys[g] for g in order.tolist()],
        np.array(ids.dtypes, dtype=np.uint8)[order],
        gnd.astype(np.uint8)[order],
        np.fromiter(shapes, dtype=np.int64),
        counts[order],
        list(path_id),
        cat(cols[0], np.uint32),
        cat(cols[1], np.uint8),
        cat(cols[2], np.int64),
        cat(cols[3], np.int64),
    )


class _TensorIds:
    """Global tensor ids in order of first appearance, and the declaration of each."""

    def __init__(self) -> None:
        self.keys: dict[str, int] = {}
        self.dtypes: list[int] = []
        self.shapes: list[tuple[int, ...]] = []
        self._prev: TensorTable | None = None
        self._gmap = np.zeros(0, dtype=np.int64)

    def of(self, writer: int, tab: TensorTable) -> np.ndarray[Any, Any]:
        """The global id of each of ``tab``'s tensors (checked against earlier declarations)."""
        prev = self._prev
        if (
            prev is not None
            and (tab.keys is prev.keys or tab.keys == prev.keys)
            and np.array_equal(tab.dtypes, prev.dtypes)
            and np.array_equal(tab.ndim, prev.ndim)
            and np.array_equal(tab.shape, prev.shape)
        ):
            return self._gmap  # the same declarations as the previous writer's
        gmap = np.empty(len(tab.keys), dtype=np.int64)
        for j, key in enumerate(tab.keys):
            dt, shp = int(tab.dtypes[j]), tab.shape_of(j)
            g = self.keys.get(key)
            if g is None:
                g = self.keys[key] = len(self.dtypes)
                self.dtypes.append(dt)
                self.shapes.append(shp)
            elif self.dtypes[g] != dt or self.shapes[g] != shp:
                raise MetadataConflictError(
                    f"tensor {key!r}: writer {writer} says {tab.dtype_of(j)}{list(shp)}, "
                    f"another writer says {DTYPE_CODES[self.dtypes[g]]}{list(self.shapes[g])}; "
                    "every writer must agree"
                )
            gmap[j] = g
        self._prev, self._gmap = tab, gmap
        return gmap


def _records_by_tensor(
    parts: list[tuple[np.ndarray[Any, Any], ...]], gnd: np.ndarray[Any, Any], ntensors: int
) -> tuple[np.ndarray[Any, Any], list[list[np.ndarray[Any, Any]]]]:
    """Group every writer's records by tensor id (stably).

    Returns the per-tensor counts and the file, codec, offsets and lengths columns in pieces
    (one per number of dimensions).
    """
    counts = np.zeros(ntensors, dtype=np.int64)
    cols: list[list[np.ndarray[Any, Any]]] = [[], [], [], []]
    if not parts:
        return counts, cols
    # Each writer's coordinates are row-ordered, so the concatenation is too: a row's
    # coordinates start at the running sum of the dimensions of the rows before it.
    gid = np.concatenate([p[0] for p in parts])
    fid = np.concatenate([p[1] for p in parts])
    cid = np.concatenate([p[2] for p in parts])
    offs = np.concatenate([p[3] for p in parts])
    lens = np.concatenate([p[4] for p in parts])
    nd = gnd[gid]
    cstart = np.zeros(len(gid), dtype=np.int64)
    np.cumsum(nd[:-1], out=cstart[1:])
    counts = np.bincount(gid, minlength=ntensors).astype(np.int64)
    # Tensor ids fit 16 bits in practice: numpy's stable sort is then a linear radix sort.
    sort_key = gid.astype(np.uint16) if ntensors <= 1 << 16 else gid
    dims = np.flatnonzero(np.bincount(nd)).tolist()
    for d in dims:
        sel = np.flatnonzero(nd == d) if len(dims) > 1 else np.arange(len(gid))
        sel = sel[np.argsort(sort_key[sel], kind="stable")]
        at = cstart[sel][:, None] + np.arange(d, dtype=np.int64)[None, :]
        cols[0].append(fid[sel])
        cols[1].append(cid[sel])
        cols[2].append(offs[at].reshape(-1))
        cols[3].append(lens[at].reshape(-1))
    return counts, cols


def merge_indexes(
    attempt_id: str,
    indexes: Iterable[WriterIndex],
    expected_writers: Sequence[int] | None,
    *,
    merge_tensors: bool = True,
) -> tuple[dict[str, FileRecord], dict[str, TensorEntry], dict[str, Entry], int]:
    """Merge writer indexes into the manifest's files, tensors and entries (no I/O).

    With ``merge_tensors=False`` tensors are left to :func:`merge_tables` (``{}`` is returned).

    Returns ``(files, tensors, entries, writer_count)``.
    """
    files: dict[str, FileRecord] = {}
    tensors: dict[str, TensorEntry] = {}
    entries = _EntryUnion()
    seen: set[int] = set()
    for idx in indexes:
        if idx.attempt_id != attempt_id:
            raise AttemptIdError(
                f"writer {idx.writer} reported attempt {idx.attempt_id}, committing {attempt_id}"
            )
        if idx.writer in seen:
            raise MetadataConflictError(f"writer {idx.writer} reported twice")
        seen.add(idx.writer)
        _merge_files(files, idx)
        if merge_tensors:
            _merge_tensors(tensors, idx)
        for name, e in idx.entries.items():
            entries.add(idx.writer, name, e)
    if expected_writers is not None:
        _check_writers(attempt_id, seen, expected_writers)
    return files, tensors, entries.entries, len(seen)


def _merge_files(files: dict[str, FileRecord], idx: WriterIndex) -> None:
    for rec in [*idx.files.values(), *([idx.index_file] if idx.index_file else [])]:
        if rec.path in files:
            raise MetadataConflictError(f"file {rec.path!r} is reported by two writers")
        files[rec.path] = rec


def _merge_tensors(tensors: dict[str, TensorEntry], idx: WriterIndex) -> None:
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


class _EntryUnion:
    """The entries of every writer: one declaration each, one value per (entry, rank)."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        # Ranks that hold a value, per entry: kept across writers (rebuilding it per writer made
        # per-rank entries quadratic in the number of writers).
        self._ranks: dict[str, set[int | None]] = {}

    def add(self, writer: int, name: str, e: Entry) -> None:
        """Add writer ``writer``'s entry ``name``; raise on a conflicting declaration or value."""
        cur = self.entries.get(name)
        if cur is None:
            self.entries[name] = Entry(
                e.name, e.schema, e.scope, e.encoding, list(e.values), e.world_size_policy
            )
            self._ranks[name] = {v.rank for v in e.values}
            return
        if cur.declaration() != e.declaration():
            raise MetadataConflictError(
                f"entry {name!r}: writer {writer} declares a different schema, scope, "
                "encoding or policy than another writer"
            )
        have = self._ranks[name]
        for v in e.values:
            if v.rank in have:
                what = "the global value" if v.rank is None else f"the value of rank {v.rank}"
                raise MetadataConflictError(
                    f"entry {name!r}: writer {writer} and another writer both stored {what}"
                )
            have.add(v.rank)
        cur.values.extend(e.values)


def _check_writers(attempt_id: str, seen: set[int], expected_writers: Sequence[int]) -> None:
    missing = sorted(set(expected_writers) - seen)
    if missing:
        raise WriterMissingError(
            f"attempt {attempt_id}: no report from writer(s) {missing[:16]}; nothing is published"
        )
    extra = sorted(seen - set(expected_writers))
    if extra:
        raise MetadataConflictError(f"attempt {attempt_id}: unexpected writer(s) {extra[:16]}")


@dataclass
class CommittedManifest(Manifest):
    """The manifest :func:`commit` published, with what the commit checked."""

    report: CommitReport = field(default_factory=CommitReport)


@dataclass
class _Merged:
    """The union of the writer indexes, in the layout chosen for the manifest."""

    files: dict[str, FileRecord]
    tensors: dict[str, TensorEntry]
    entries: dict[str, Entry]
    table: TensorTable | None
    report: CommitReport


def commit(
    storage: Storage,
    attempt_id: str,
    *,
    step: int,
    indexes: Sequence[WriterIndex] | None = None,
    expected_writers: Sequence[int] | None = None,
    continuation: Continuation | None = None,
    producer: dict[str, Any] | None = None,
    check_headers: bool | None = None,
    tensor_table: bool | None = None,
) -> CommittedManifest:
    """Verify an attempt and publish its commit record.

    Phases: read the writer indexes, choose the layout (JSON tensors or a tensor table), merge,
    check coverage, entries, file sizes and shard headers, publish (switching to a table when
    the JSON manifest would be too large for readers, R-TABLE-9). Logged as ``commit.started``
    / ``commit.finished`` (the version's bytes) or ``commit.refused`` (the error's code) on the
    ``portable_ckpt.io`` logger.

    Args:
        storage: The checkpoint root.
        attempt_id: The attempt every writer wrote into.
        step: The completed step (must equal the step in ``attempt_id``).
        indexes: The writers' indexes, in memory; ``None`` reads ``index/wNNNNN.json`` of every
            writer in ``expected_writers`` from storage.
        expected_writers: Writer numbers that must have reported (default: those in ``indexes``).
        continuation: The continuation contract (default ``exact`` on one rank).
        producer: ``{"name", "version"}`` of the writing software.
        check_headers: Read every shard header and check it against the range records
            (default: when the version has at most 65,536 range records; above that each
            writer's own headers are trusted, as the spec allows).
        tensor_table: Publish the tensors in a tensor table (spec §8.5, format 1.1). Default:
            when a writer sent a table or the version has more than 65,536 range records.

    Returns:
        The published manifest and its :class:`CommitReport`.

    Raises:
        CheckpointError: any failed check; nothing is published.

    """
    from portable_ckpt.io.versions import refuse_root_in_version

    _check_arguments(storage, indexes, expected_writers)
    refuse_root_in_version(storage)  # a committer of another process, whatever its writers did
    with logged_commit(storage.url, attempt_id, step) as done:
        manifest = _commit(
            storage, attempt_id, step, indexes, expected_writers, continuation, producer,
            check_headers, tensor_table,
        )
        done(len(manifest.files), files_bytes(manifest.files))
    return manifest


@contextmanager
def logged_commit(url: str, attempt_id: str, step: int) -> Iterator[Callable[[int, int], None]]:
    """Log a commit as ``commit.*`` events, also one that another process runs for this one.

    Call the yielded function with the number of files and the bytes of the published version.
    """
    what = f"commit of step {step} ({attempt_id})"
    with logged(_log, "commit", what, step=step, attempt_id=attempt_id) as out:

        def done(files: int, nbytes: int) -> None:
            out.update(
                bytes=nbytes, files=files,
                detail=f"{files} files, version {url.rstrip('/')}/{attempt_id}",
            )

        yield done


def _commit(
    storage: Storage,
    attempt_id: str,
    step: int,
    indexes: Sequence[WriterIndex] | None,
    expected_writers: Sequence[int] | None,
    continuation: Continuation | None,
    producer: dict[str, Any] | None,
    check_headers: bool | None,
    tensor_table: bool | None,
) -> CommittedManifest:
    """The phases of :func:`commit`."""
    _check_request(storage, attempt_id, step)
    cont = continuation or Continuation(
        "exact", len(expected_writers) if expected_writers else max(1, len(indexes or [])), None
    )
    check_continuation(cont, f"commit of {attempt_id}: continuation")
    storage.sync()  # files this process wrote with deferred durability, before any check
    indexes = _writer_indexes(storage, attempt_id, indexes, expected_writers)
    use_table = _choose_layout(indexes, tensor_table)
    merged = _merge(attempt_id, indexes, expected_writers, use_table)
    _check_coverage(merged)
    _check_entries(merged.entries, cont.world_size)
    _check_files(storage, attempt_id, merged)
    if check_headers if check_headers is not None else merged.report.ranges <= TABLE_THRESHOLD:
        _check_headers(storage, attempt_id, merged)
    manifest = _manifest(attempt_id, step, cont, producer, merged)
    return _publish(storage, manifest, merged, indexes, tensor_table)


def _check_arguments(
    storage: object, indexes: object, expected_writers: object
) -> None:
    """Refuse (``UsageError``) arguments of the wrong kind before anything is read.

    A path as ``storage``, a dict as ``indexes`` or a generator as ``expected_writers`` was an
    ``AttributeError`` or ``TypeError`` from inside the commit (api review 31).
    """
    usage.storage_object(storage, "commit")
    if indexes is not None and (
        not isinstance(indexes, Sequence)
        or isinstance(indexes, str)
        or not all(isinstance(i, WriterIndex) for i in indexes)
    ):
        raise UsageError(
            f"commit: indexes must be a list of WriterIndex (what ShardWriter.finish returns) "
            f"or None, got {type(indexes).__name__} {indexes!r:.80}"
        )
    if expected_writers is not None:
        if not isinstance(expected_writers, Sequence) or isinstance(expected_writers, str):
            raise UsageError(
                f"commit: expected_writers must be a list of writer numbers or None, got "
                f"{type(expected_writers).__name__} {expected_writers!r:.80}"
            )
        for w in expected_writers:
            usage.strict_int(w, "commit: expected_writers item", minimum=0)


def refuse_without_atomic_create(storage: Storage) -> None:
    """Refuse a store that cannot create a commit record atomically (no create-if-absent).

    A writer asks before its first byte (backend review 27, L12: the refusal came at the
    commit, after every file was written and deleted again), the commit again.
    """
    if not storage.capabilities.atomic_create:
        raise StorageError(
            f"{storage.url} cannot create the commit record atomically (no create-if-absent); "
            "refusing to save there — enable conditional writes on the store",
            retryable=False,  # a setting of the store: waiting does not mend it
        )


def _check_request(storage: Storage, attempt_id: str, step: int) -> None:
    check_attempt_id(attempt_id)
    refuse_without_atomic_create(storage)
    if parse_attempt_step(attempt_id) != step:
        raise UsageError(f"step {step} differs from the step in attempt id {attempt_id}")


def _writer_indexes(
    storage: Storage,
    attempt_id: str,
    indexes: Sequence[WriterIndex] | None,
    expected_writers: Sequence[int] | None,
) -> Sequence[WriterIndex]:
    """The given indexes with their tensor tables loaded, or every expected writer's, read."""
    cache = TableCache()
    if indexes is None:
        if expected_writers is None:
            raise UsageError("commit needs indexes= or expected_writers=")
        return read_writer_indexes(storage, attempt_id, list(expected_writers), cache)
    if any(idx.tensor_table is not None and idx.table is None for idx in indexes):
        with ThreadPoolExecutor(max_workers=1 if storage.local_root() else 16) as pool:
            _load_tables(storage, attempt_id, indexes, cache, pool)
    return indexes


def _choose_layout(indexes: Sequence[WriterIndex], tensor_table: bool | None) -> bool:
    """Whether the manifest describes its tensors in a tensor table (spec §8.5)."""
    sent_table = any(idx.tensor_table is not None for idx in indexes)
    if tensor_table is None:
        records = sum(
            idx.table.records
            if idx.table is not None
            else sum(len(t.ranges) for t in idx.tensors.values())
            for idx in indexes
        )
        use_table = sent_table or records > TABLE_THRESHOLD
    else:
        use_table = tensor_table
    if not use_table:
        return False
    # A table implies every record's safetensors name (R-TABLE-7); records of JSON indexes
    # named otherwise (another writer's convention) cannot be described by one.
    odd = next(
        (
            (idx.writer, t.key, r.name)
            for idx in indexes
            if idx.tensor_table is None
            for t in idx.tensors.values()
            for r in t.ranges
            if r.name != range_name(t.key, r.offsets)
        ),
        None,
    )
    if odd is None:
        return True
    if tensor_table is True or sent_table:
        raise MetadataConflictError(
            f"writer {odd[0]}: tensor {odd[1]!r} has a range named {odd[2]!r}, not "
            f"'{odd[1]}@<offsets>'; a tensor table implies that "
            "name (spec §8.5, R-TABLE-7) — rename the chunks or commit without a table"
        )
    return False


def _merge(
    attempt_id: str,
    indexes: Sequence[WriterIndex],
    expected_writers: Sequence[int] | None,
    use_table: bool,
) -> _Merged:
    if not use_table:
        for idx in indexes:
            if idx.table is not None and not idx.tensors:
                idx.tensors = dict(idx.table.entries())
    files, tensors, entries, nwriters = merge_indexes(
        attempt_id, indexes, expected_writers, merge_tensors=not use_table
    )
    report = CommitReport(writers=nwriters, files=len(files), tensors=len(tensors))
    merged = _Merged(files, tensors, entries, None, report)
    if use_table:
        _to_table(merged, indexes)
    else:
        report.ranges = sum(len(t.ranges) for t in tensors.values())
    return merged


def _to_table(merged: _Merged, indexes: Sequence[WriterIndex]) -> None:
    """Describe the merged tensors by one tensor table (the same records)."""
    table = merged.table = merge_tables(indexes)
    merged.tensors = dict(table.entries())
    merged.report.tensors, merged.report.ranges = len(table.keys), table.records


def _check_coverage(merged: _Merged) -> None:
    """Every tensor is covered exactly once by its range records."""
    table = merged.table
    if table is not None:
        proven = LayoutCache()
        for i, key in enumerate(table.keys):
            offs, lens = table.boxes(i)
            proven.check(table.shape_of(i), offs, lens, key=key)
    else:
        # Tensors of the same shape and boxes (every layer, each parameter's moments) share
        # one proof; a set finds candidates by hash and confirms them by equality (exact).
        seen: set[tuple[Any, ...]] = set()
        for key, t in merged.tensors.items():
            layout = (tuple(t.shape), tuple((tuple(r.offsets), tuple(r.lengths)) for r in t.ranges))
            if layout not in seen:
                check_coverage(t.shape, [r.box for r in t.ranges], key=key)
                seen.add(layout)
    merged.report.checks.append("coverage")


def _check_entries(entries: dict[str, Entry], world_size: int) -> None:
    """Each entry has its values: the manifest parser's rule (R-ENTRY-7..9)."""
    for name, e in entries.items():
        problem = entry_values_problem(e.scope, [v.rank for v in e.values], world_size)
        if problem is not None:
            raise problem[0](f"entry {name!r}: {problem[1]}")


def _check_files(storage: Storage, attempt_id: str, merged: _Merged) -> None:
    """Every listed file exists with the size its writer reported."""
    for path, rec in merged.files.items():
        actual = storage.size(f"{attempt_id}/{path}")
        if actual != rec.size:
            raise FileSizeError(
                f"{attempt_id}/{path}: {actual} bytes on storage, the writer reported {rec.size}",
                path=path,
            )
        merged.report.bytes += rec.size
    merged.report.checks.append("files")


def _check_headers(storage: Storage, attempt_id: str, merged: _Merged) -> None:
    """Every range record agrees with the safetensors header of its file."""
    by_file: dict[str, list[tuple[TensorEntry, Any]]] = {}
    for t in merged.tensors.values():
        for r in t.ranges:
            by_file.setdefault(r.file, []).append((t, r))
    for path, items in by_file.items():
        full = f"{attempt_id}/{path}"
        rec = merged.files[path]

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
    merged.report.checks.append("headers")


def _manifest(
    attempt_id: str,
    step: int,
    cont: Continuation,
    producer: dict[str, Any] | None,
    merged: _Merged,
) -> CommittedManifest:
    created = attempt_time(attempt_id)
    created_iso = (
        _dt.datetime.fromtimestamp(created, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        if created is not None
        else utc_now_iso()
    )
    return CommittedManifest(
        attempt_id=attempt_id,
        step=step,
        created_at=created_iso,
        committed_at="",  # set when published
        producer=producer or {"name": "portable_ckpt", "version": __version__},
        continuation=cont,
        files=merged.files,
        tensors=merged.tensors,
        entries=merged.entries,
        report=merged.report,
    )


def _publish(
    storage: Storage,
    manifest: CommittedManifest,
    merged: _Merged,
    indexes: Sequence[WriterIndex],
    tensor_table: bool | None,
) -> CommittedManifest:
    """Create ``manifest.json`` (and its tensor table first); the version exists from then on."""
    attempt_id = manifest.attempt_id
    while True:
        blob = _describe_table(manifest, merged) if merged.table is not None else None
        _announce_dtypes(manifest, merged)
        manifest.committed_at = commit_time(storage, attempt_id)  # after every version of the step
        data = jsonio.dumps(manifest.to_json())
        if len(data) <= jsonio.MAX_MANIFEST_BYTES:
            break
        if blob is not None or tensor_table is False:
            raise LimitError(
                f"{attempt_id}: the manifest would be {len(data)} bytes, above the 1 GiB limit "
                "readers enforce (R-SEC-11)"
                + ("" if blob is not None else "; commit with tensor_table=True (R-TABLE-9)")
            )
        # R-TABLE-9: a manifest that readers would refuse is published with a table instead.
        _choose_layout(indexes, True)
        _to_table(merged, indexes)
        manifest.tensors = merged.tensors
    _readable(attempt_id, data)
    table_path = manifest.tensor_table.file if manifest.tensor_table is not None else None
    if merged.table is not None and table_path is not None:
        _table_dtypes_defined(manifest, merged.table, f"{attempt_id}/{table_path}")
    if blob is not None and table_path is not None:
        storage.put(f"{attempt_id}/{table_path}", blob)
        # R-COMMIT-17: the table's data and its name are durable before the record that lists
        # it exists (put() fsyncs the file; its directory's fsync is batched until sync()).
        storage.sync()
    if not _create_record(storage, attempt_id, data):
        if table_path is not None:
            storage.delete(f"{attempt_id}/{table_path}")
        raise CommitConflictError(
            f"{attempt_id}/manifest.json already exists; an attempt is committed once and never "
            "overwritten (start a new attempt)"
        )
    return manifest


def _create_record(storage: Storage, attempt_id: str, data: bytes) -> bool:
    """``create_if_absent`` of the commit record, never mistaking a lost answer for "not created".

    A backend may report a create whose answer was lost (a timeout after the request was sent)
    as a plain storage error, as the backend guide's "any other failure" reads. The record may
    then exist, and the caller would remove the files of a committed version (R-COMMIT-19). So
    the record is looked for: our bytes there mean success, nothing there means nothing was
    published, and a record that cannot be looked for leaves the outcome unknown.
    """
    record = f"{attempt_id}/manifest.json"
    try:
        return storage.create_if_absent(record, data)
    except CommitOutcomeUnknownError:
        # Not looked up: the backend knows more than a read can tell (a record linked whose
        # directory fsync failed is there, and not durable).
        raise
    except CheckpointError as exc:
        if not isinstance(exc, StorageError | FileMissingError):
            raise  # a refusal (a usage error): nothing was sent
        return _record_after_failure(storage, record, data, exc)
    except Exception as exc:
        # A backend's own exception (an SDK's timeout after its request went: backend review
        # 27, H1): the record is looked for; not there is not "not created" (the request may
        # still be in flight and land after the look: re-attack 27, 3), so nothing is removed.
        said = StorageError(f"{storage.url}/{record}: the backend raised "
                            f"{type(exc).__name__}: {exc}", path=record, retryable=False)
        try:
            return _record_after_failure(storage, record, data, said, cause=exc)
        except StorageError as absent:
            if absent is not said:
                raise
            raise CommitOutcomeUnknownError(
                f"{record}: publishing failed in the backend ({type(exc).__name__}: {exc}) and "
                "the record is not there now, but a request still in flight may create it: "
                "the version may be committed, so nothing of its attempt is removed "
                "(`portable-ckpt ls` / `verify` tell which it is; gc removes it once it is "
                "known abandoned)", path=record) from exc


def _record_after_failure(
    storage: Storage, record: str, data: bytes, exc: CheckpointError,
    cause: BaseException | None = None,
) -> bool:
    """After a failed create of ``record``: whether ``data`` is there (see ``_create_record``).

    Raises ``exc`` (from ``cause``) where nothing is there, and CommitOutcomeUnknownError where
    that cannot be read.
    """
    # FileMissingError: a backend's read-back of what it just stored answered 404.
    try:
        if not storage.exists(record) and not lists_file(storage, record):
            raise exc from cause  # absent, and no listing says otherwise (§15.1): not published
        found = reread_record(storage, record)
        if len(found) > len(data):
            return False  # a longer record is there: another attempt's, a conflict
    except CheckpointError as probe:
        if probe is exc:
            raise
        raise CommitOutcomeUnknownError(
            f"{record}: publishing failed ({exc.message}) and whether the record exists could "
            f"not be read back ({probe.message}); the version may be committed, so nothing of "
            "its attempt is removed: `portable-ckpt ls` / `verify` tell which it is",
            path=record,
        ) from exc
    if found == data:
        return True  # the create took effect; only its answer was lost
    return False  # another record is there: a conflict


def _readable(attempt_id: str, data: bytes) -> None:
    """Parse the record about to be published exactly as a reader will (R-COMMIT-4).

    The parts were checked on the way in, but by the code that built them (a writer in this
    process, or an index given in memory): a record that readers refuse would be an ``invalid``
    attempt, silently passed over by every load and later deleted by gc, while the save
    reported success. The parse costs ~8 ms for a 400-tensor state (a table's rows are not in
    the record).

    Raises:
        CheckpointError: the reader's own error, of its class; nothing is published.

    """
    what = f"{attempt_id}/manifest.json (to be published)"
    try:
        parse_manifest(
            jsonio.loads(data, what=what, max_bytes=jsonio.MAX_MANIFEST_BYTES),
            what=what,
            directory_name=attempt_id,
        )
    except CheckpointError as exc:
        raise type(exc)(
            f"{exc.message}; readers would refuse this commit record, so nothing is published "
            "(fix what the writer was given and save again)",
            path=exc.path,
        ) from None


def _table_dtypes_defined(manifest: CommittedManifest, table: TensorTable, what: str) -> None:
    """R-DTYPE-3 per version on the table's rows, as readers apply it (``io/reader.py``).

    :func:`_readable` parses the record, which holds none of a table's rows: a later row in a
    table of an earlier version (or without its extension) was published, and no reader opened
    the version (contributor review D11; a JSON tensor of it was refused).
    """
    problem = table.dtypes_not_defined(manifest.format_version, manifest.must_understand)
    if problem:
        raise DtypeUnsupportedError(
            f"{what}: {problem}; readers would refuse this commit record, so nothing is "
            "published",
            path=what,
        )


def _announce_dtypes(manifest: CommittedManifest, merged: _Merged) -> None:
    """Announce the later dtype rows the version holds (R-VERSION-2, R-VERSION-7).

    A tensor of a row of spec §7 that format 1.3 added raises the record's version to that
    row's MINOR and lists its extension, added to what the record declares (a table's version
    and extension stay).
    """
    if merged.table is not None:
        used = merged.table.used_dtypes()
    else:
        used = {t.dtype for t in merged.tensors.values()}
    manifest.format_version, extensions = dtypes_announced(manifest.format_version, used)
    if extensions:
        manifest.must_understand = sorted({*manifest.must_understand, *extensions})


def _describe_table(manifest: CommittedManifest, merged: _Merged) -> bytes:
    """Encode the merged table and list it in ``manifest`` (format 1.1); return its bytes."""
    if merged.table is None:  # pragma: no cover - called with a table
        raise UsageError("no tensor table to describe")
    # A unique name: a concurrent committer of the same attempt never overwrites the table
    # that the winning manifest lists.
    table_path = f"tensor-table-{secrets.token_hex(8)}.safetensors.zst"
    blob = encode_table(merged.table, codec="zstd")
    th = BlockHasher(METADATA_BLOCK_SIZE)
    th.update(blob)
    merged.files[table_path] = FileRecord(
        table_path, len(blob), Checksum("crc32c", METADATA_BLOCK_SIZE, th.blocks())
    )
    report = merged.report
    report.files += 1
    report.bytes += len(blob)
    report.checks.append(EXTENSION)
    # Added to what the manifest declares, never in place of it: a later feature's version and
    # extension names stay (maintainer review).
    manifest.format_version = max(
        manifest.format_version, TABLE_FORMAT_VERSION, key=lambda v: tuple(map(int, v.split(".")))
    )
    manifest.must_understand = sorted({*manifest.must_understand, EXTENSION})
    manifest.tensor_table = TableRef(table_path, "zstd")
    return blob


def _prod(xs: Sequence[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out
