"""Conversion between the portable format and today's checkpoint formats, in bounded memory.

Directions (``src`` format → ``dst`` format):

* ``dcp`` → ``portable``: PyTorch DCP directories (see :mod:`portable_ckpt.convert.dcp`); needs
  ``trust_pickle=True`` because DCP metadata is a pickle. Chunk layout and keys are kept.
* ``hf`` → ``portable``: ``model.safetensors`` or a sharded set with an index
  (:mod:`portable_ckpt.convert.hf`); tensor bytes are copied unchanged.
* ``torch`` → ``portable``: ``torch.save`` state dicts (:mod:`portable_ckpt.convert.torch_save`).
* ``portable`` → ``portable`` | ``hf`` | ``dcp``.
* any other pair goes through a temporary portable checkpoint next to ``dst``.

Every conversion streams: one batch of chunks (≤ ``batch_bytes``, or one chunk if it is larger)
is in memory at a time. Nothing appears at ``dst`` unless the conversion succeeds: portable
targets publish with the core commit (``manifest.json`` created last), directory targets are
built beside ``dst`` and renamed into place.

Example::

    from portable_ckpt.convert import convert
    report = convert("hf-model/", "ckpts/run1", step=0)
    print(report.tensors, report.bytes, report.seconds)
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from portable_ckpt.convert._model import (
    ChunkSpec,
    ConvertWarning,
    EntrySpec,
    SourcePlan,
    TensorSpec,
    check_plan,
)
from portable_ckpt.errors import CheckpointError, LimitError, NotFoundError, UsageError
from portable_ckpt.format.vocab import is_entry_name
from portable_ckpt.storage._posix import file_kind, open_regular

__all__ = [
    "FORMATS",
    "SOURCE_FORMATS",
    "TARGET_FORMATS",
    "ConvertReport",
    "ConvertWarning",
    "convert",
    "detect_format",
    "open_source",
]

SOURCE_FORMATS = ("dcp", "hf", "torch", "portable")
TARGET_FORMATS = ("portable", "dcp", "hf")
FORMATS = SOURCE_FORMATS
#: Default bytes of chunks held before a writer is flushed to storage.
DEFAULT_BATCH_BYTES = 64 << 20


@dataclass
class ConvertReport:
    """Summary of one conversion.

    Attributes:
        tensors: number of tensors written.
        bytes: bytes of tensor elements written.
        seconds: wall time.
        source_format: detected or given source format.
        target_format: target format.
        destination: where the result was published (a version directory for portable).
        chunks: number of stored chunks (range records) written.
        entries: number of non-tensor entries written.
        largest_chunk: size in bytes of the largest chunk.
        warnings: items skipped or changed.

    """

    tensors: int
    bytes: int
    seconds: float
    source_format: str = ""
    target_format: str = ""
    destination: str = ""
    chunks: int = 0
    entries: int = 0
    largest_chunk: int = 0
    warnings: list[ConvertWarning] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Return the report as JSON data (the CLI's ``--json`` output)."""
        return {
            "ok": True,
            "source_format": self.source_format,
            "target_format": self.target_format,
            "destination": self.destination,
            "tensors": self.tensors,
            "chunks": self.chunks,
            "entries": self.entries,
            "bytes": self.bytes,
            "largest_chunk": self.largest_chunk,
            "seconds": round(self.seconds, 6),
            "mib_per_s": round(self.bytes / max(self.seconds, 1e-9) / (1 << 20), 3),
            "warnings": [w.to_json() for w in self.warnings],
        }


def detect_format(path: str | os.PathLike[str]) -> str:
    """Guess the format of ``path``: ``"portable"``, ``"dcp"``, ``"hf"`` or ``"torch"``.

    Raises:
        NotFoundError: nothing at ``path``.
        UsageError: the format cannot be recognised (pass it explicitly).

    """
    p = os.fspath(path)
    if p.startswith("s3://"):
        return "portable"
    if not os.path.lexists(p):
        raise NotFoundError(f"source {p} does not exist", path=p)
    if file_kind(p, what=f"source {p}") == "file":  # a FIFO or socket is refused, never opened
        if p.endswith(".safetensors") or p.endswith(".safetensors.index.json"):
            return "hf"
        if p.endswith((".pt", ".pth", ".bin", ".ckpt")):
            return "torch"
        with os.fdopen(open_regular(p), "rb") as f:
            head = f.read(16)
            if zipfile.is_zipfile(f):
                return "torch"
        if len(head) >= 9 and head[8:9] == b"{":
            return "hf"
        if head[:2] == b"\x80\x02":  # legacy torch.save pickle
            return "torch"
        raise UsageError(f"cannot tell the format of file {p}; pass --from hf|torch")
    names = os.listdir(p)
    if "manifest.json" in names or any(
        os.path.isfile(os.path.join(p, n, "manifest.json")) for n in names if n.startswith("s")
    ):
        return "portable"
    from portable_ckpt.convert.dcp import is_dcp_dir

    if is_dcp_dir(p):
        return "dcp"
    if any(n.endswith(".safetensors") or n.endswith(".safetensors.index.json") for n in names):
        return "hf"
    torch_files = [n for n in names if n.endswith((".pt", ".pth", ".bin"))]
    if len(torch_files) == 1:
        return "torch"
    raise UsageError(f"cannot tell the format of directory {p}; pass --from dcp|hf|torch|portable")


def _portable_source(src: str, step: int | None) -> SourcePlan:
    import portable_ckpt

    ck = portable_ckpt.open(src, step=step)
    tensors: list[TensorSpec] = []
    for key in sorted(ck.tensors):
        info = ck.tensors[key]
        item = info.numpy_dtype.itemsize
        chunks = []
        for r in info.ranges:
            offs, lens = tuple(r.offsets), tuple(r.lengths)
            nbytes = item
            for n in lens:
                nbytes *= n

            def load(
                key: str = key, offs: tuple[int, ...] = offs, lens: tuple[int, ...] = lens
            ) -> Any:
                return ck.read(key, offs, lens)

            chunks.append(ChunkSpec(offs, lens, nbytes, f"{ck.path}/{r.file}", load))
        tensors.append(TensorSpec(key, info.dtype, tuple(info.shape), chunks))
    entries: list[EntrySpec] = []
    warnings: list[ConvertWarning] = []
    for name in sorted(ck.entries):
        e = ck.entries[name]
        if e.scope != "global":
            warnings.append(
                ConvertWarning(name, "per-rank entry: only global entries are converted; skipped")
            )
            continue
        schema = e.schema.get("id") if isinstance(e.schema, dict) else None
        entries.append(
            EntrySpec(name, ck.entry(name), schema if isinstance(schema, str) else "pck:json/1")
        )
    plan = SourcePlan("portable", tensors, entries, warnings, world_size=ck.continuation.world_size)
    return plan


#: Without ``max_output_bytes``, a conversion may write at most this many times the source's
#: bytes on disk, plus :data:`OUTPUT_SLACK`: records that alias one another's bytes and views that
#: repeat elements (``allow_expand``) could otherwise make a 1.5 KB file write 4 TiB.
OUTPUT_RATIO = 4
OUTPUT_SLACK = 1 << 30


def open_source(
    src: str | os.PathLike[str],
    fmt: str | None = None,
    *,
    trust_pickle: bool = False,
    strict: bool = False,
    step: int | None = None,
    allow_expand: bool = False,
    max_output_bytes: int | None = None,
) -> SourcePlan:
    """Describe ``src`` as a :class:`SourcePlan` (tensors, chunks, entries) without reading data.

    ``allow_expand`` accepts ``torch.save`` views that repeat stored elements. The plan's bytes
    are checked against ``max_output_bytes`` (default: :data:`OUTPUT_RATIO` times the source's
    bytes on disk plus :data:`OUTPUT_SLACK`; no default bound for an object-store source)
    before anything is written.

    Raises:
        CheckpointError: the source is missing, malformed, or (DCP) not trusted; ``LimitError``
            for a plan above the output bound.

    """
    p = os.fspath(src)
    fmt = fmt or detect_format(p)
    if fmt == "hf":
        from portable_ckpt.convert.hf import read_hf_source

        plan = read_hf_source(p)
    elif fmt == "dcp":
        from portable_ckpt.convert.dcp import read_dcp_source

        plan = read_dcp_source(p, trust_pickle=trust_pickle, strict=strict)
    elif fmt == "torch":
        from portable_ckpt.convert.torch_save import read_torch_source

        plan = read_torch_source(p, strict=strict, allow_expand=allow_expand)
    elif fmt == "portable":
        plan = _portable_source(p, step)
    else:
        raise UsageError(f"unknown source format {fmt!r}; use one of {', '.join(SOURCE_FORMATS)}")
    try:
        check_plan(plan)
        _check_output(plan, p, max_output_bytes)
    except BaseException:
        plan.close()
        raise
    return plan


def _check_output(plan: SourcePlan, src: str, max_output_bytes: int | None) -> None:
    """Refuse a plan that would write more than its bound, before anything is written."""
    limit = max_output_bytes
    if limit is None:
        if "://" in src:
            return  # an object-store source: its files' sizes are the version's own records
        limit = OUTPUT_RATIO * _bytes_on_disk(src) + OUTPUT_SLACK
    if plan.total_bytes > limit:
        raise LimitError(
            f"{src}: converting it would write {plan.total_bytes:,} bytes, more than the bound of "
            f"{limit:,} ({OUTPUT_RATIO}x its bytes on disk + {OUTPUT_SLACK >> 30} GiB unless "
            "max_output_bytes / --max-output is given): records that alias one another's bytes "
            "or views that repeat elements",
            path=src,
        )


def _bytes_on_disk(path: str) -> int:
    """Bytes of the regular files at or below ``path`` (links are not followed)."""
    if not os.path.isdir(path):
        return os.stat(path).st_size if os.path.isfile(path) else 0
    total = 0
    for top, _dirs, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(top, name))
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


class _PortableSink:
    """Writes a source plan into one portable attempt, one writer per batch of chunks.

    A full batch is handed to a background thread (``ShardWriter.finish`` writes, checksums and
    fsyncs it) while the caller loads the next batch, so reading and writing overlap. At most
    ``limit`` bytes of chunks are in memory: the in-flight batch is awaited before a chunk would
    exceed it.
    """

    def __init__(self, root: str, step: int, codec: str, batch_bytes: int, limit: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from portable_ckpt.io.writer import ShardWriter, new_attempt_id
        from portable_ckpt.storage import open_storage

        self._writer_cls = ShardWriter
        self.root = root
        self.created_root = not os.path.exists(root) and "://" not in root
        self.storage = open_storage(root, create=True)
        self.attempt = new_attempt_id(step)
        self.step = step
        self.codec = codec
        self.batch_bytes = batch_bytes
        self.limit = limit
        self.indexes: list[Any] = []
        self.next_id = 0
        self.pending = 0
        self.inflight: Any = None
        self.inflight_bytes = 0
        self.inflight_writer: Any = None
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="pck-convert-writer")
        self.writer = self._new()

    def _new(self) -> Any:
        # Durability is awaited once, by commit(): fsyncs of finished batches overlap later writes.
        w = self._writer_cls(
            self.storage,
            self.attempt,
            self.next_id,
            codec=self.codec,
            write_index=False,
            sync_on_finish=False,
        )
        self.next_id += 1
        return w

    def _wait(self) -> None:
        if self.inflight is not None:
            fut, self.inflight = self.inflight, None
            self.indexes.append(fut.result())
            self.inflight_bytes = 0
            self.inflight_writer = None

    def flush(self) -> None:
        self._wait()
        self.inflight_writer = self.writer
        self.inflight = self.pool.submit(self.writer.finish)
        self.inflight_bytes = self.pending
        self.writer = self._new()
        self.pending = 0

    def reserve(self, nbytes: int) -> None:
        if self.pending and self.pending + nbytes > self.batch_bytes:
            self.flush()
        if self.inflight is not None and self.inflight_bytes + self.pending + nbytes > self.limit:
            self._wait()
        self.pending += nbytes

    def commit(self, world_size: int) -> Any:
        from portable_ckpt.format.manifest import Continuation
        from portable_ckpt.io.commit import commit

        self._wait()
        self.indexes.append(self.writer.finish())
        self.pool.shutdown()
        self.indexes.sort(key=lambda i: i.writer)
        return commit(
            self.storage,
            self.attempt,
            step=self.step,
            indexes=self.indexes,
            expected_writers=list(range(len(self.indexes))),
            continuation=Continuation(contract="exact", world_size=max(1, world_size)),
        )

    def abort(self) -> None:
        if self.inflight is not None:
            try:
                self.inflight.result()
            except BaseException:
                pass
            self.inflight = None
        self.pool.shutdown()
        for w in (self.writer, self.inflight_writer):
            if w is not None:
                try:
                    w.abort()
                except CheckpointError:
                    pass
        try:
            self.storage.delete_prefix(self.attempt + "/")
        except CheckpointError:
            pass
        local = self.storage.local_root()
        if local:
            shutil.rmtree(os.path.join(local, self.attempt), ignore_errors=True)
            if self.created_root:
                try:
                    os.rmdir(local)
                except OSError:
                    pass


def _write_portable(
    plan: SourcePlan,
    dst: str,
    *,
    step: int,
    codec: str,
    batch_bytes: int,
    progress: Callable[[int], None] | None,
) -> tuple[ConvertReport, str]:
    limit = max(plan.largest_chunk, batch_bytes) + batch_bytes
    sink = _PortableSink(dst, step, codec, batch_bytes, limit)
    written = chunks = 0
    entries = 0
    warnings = list(plan.warnings)
    try:
        for t in plan.tensors:
            if not t.chunks:
                sink.writer.declare_tensor(t.key, t.dtype, t.shape)
            for c in t.chunks:
                sink.reserve(c.nbytes)
                arr = c.load()
                sink.writer.add_tensor(t.key, arr, offsets=c.offsets, global_shape=t.shape)
                del arr
                written += c.nbytes
                chunks += 1
                if progress is not None:
                    progress(c.nbytes)
        for e in plan.entries:
            if not is_entry_name(e.name):
                warnings.append(
                    ConvertWarning(
                        e.name, "not a valid entry name ([A-Za-z0-9._/-], 1..256); skipped"
                    )
                )
                continue
            sink.writer.add_entry(e.name, e.value, e.schema)
            entries += 1
        manifest = sink.commit(plan.world_size)
    except BaseException:
        sink.abort()
        raise
    local = sink.storage.local_root()
    dest = os.path.join(local, sink.attempt) if local else f"{sink.storage.url}/{sink.attempt}"
    del manifest
    report = ConvertReport(
        tensors=len(plan.tensors),
        bytes=written,
        seconds=0.0,
        chunks=chunks,
        entries=entries,
        largest_chunk=plan.largest_chunk,
        warnings=warnings,
    )
    return report, dest


def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    src_format: str | None = None,
    dst_format: str = "portable",
    trust_pickle: bool = False,
    strict: bool = False,
    max_shard_size: int | str = "5GB",
    step: int | None = None,
    codec: str = "none",
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    progress: Callable[[int, int], None] | None = None,
    allow_expand: bool = False,
    max_output_bytes: int | None = None,
) -> ConvertReport:
    """Convert checkpoint ``src`` into ``dst``.

    Args:
        src: source path (file or directory; portable roots may be ``s3://``).
        dst: destination: a portable checkpoint root (a new version is committed there), or a
            new/empty directory for ``hf`` and ``dcp``.
        src_format: ``dcp``, ``hf``, ``torch`` or ``portable``; detected when ``None``.
        dst_format: ``portable`` (default), ``dcp`` or ``hf``.
        trust_pickle: allow reading DCP pickles (they can run code; see
            :data:`portable_ckpt.convert.dcp.TRUST_HELP`).
        strict: fail instead of skipping items that cannot be converted.
        max_shard_size: HF target: largest shard (``"5GB"`` = 5·10^9 bytes, ``"2GiB"``, or int).
        step: portable target: the step of the new version (default 0); portable source: which
            version to read (default latest).
        codec: portable target: ``"none"`` or ``"zstd"``.
        batch_bytes: bytes of chunks held in memory before they are written.
        progress: called as ``progress(done_bytes, total_bytes)``.
        allow_expand: ``torch.save`` sources: materialise views that repeat stored elements
            (``expand``, zero or overlapping strides) instead of refusing them.
        max_output_bytes: the most bytes of tensor data the conversion may write (default:
            :data:`OUTPUT_RATIO` times the source's bytes on disk plus :data:`OUTPUT_SLACK`),
            checked before anything is written.

    Returns:
        A :class:`ConvertReport`.

    Raises:
        CheckpointError: a subclass with the spec's code; nothing is published at ``dst``.

    """
    t0 = time.perf_counter()
    s, d = os.fspath(src), os.fspath(dst)
    if dst_format not in TARGET_FORMATS:
        raise UsageError(
            f"unknown target format {dst_format!r}; use one of {', '.join(TARGET_FORMATS)}"
        )
    fmt = src_format or detect_format(s)
    if fmt not in SOURCE_FORMATS:
        raise UsageError(f"unknown source format {fmt!r}; use one of {', '.join(SOURCE_FORMATS)}")
    limits = {"allow_expand": allow_expand, "max_output_bytes": max_output_bytes}
    if dst_format != "portable":
        from portable_ckpt.convert._publish import check_dst_free

        check_dst_free(d)
    if dst_format == "portable":
        report = _to_portable(
            s, d, fmt, trust_pickle, strict, step, codec, batch_bytes, progress, limits
        )
    elif fmt == "portable":
        report = _from_portable(s, d, dst_format, step, max_shard_size, progress)
    else:
        parent = os.path.dirname(os.path.abspath(d)) or "."
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".pck-convert-", dir=parent)
        try:
            first = _to_portable(
                s, tmp, fmt, trust_pickle, strict, 0, "none", batch_bytes, None, limits
            )
            report = _from_portable(tmp, d, dst_format, None, max_shard_size, progress)
            report.warnings = first.warnings + report.warnings
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    report.source_format = fmt
    report.target_format = dst_format
    report.seconds = time.perf_counter() - t0
    return report


def _to_portable(
    s: str,
    d: str,
    fmt: str,
    trust_pickle: bool,
    strict: bool,
    step: int | None,
    codec: str,
    batch_bytes: int,
    progress: Callable[[int, int], None] | None,
    limits: dict[str, Any],
) -> ConvertReport:
    plan = open_source(
        s, fmt, trust_pickle=trust_pickle, strict=strict,
        step=step if fmt == "portable" else None, **limits,
    )
    try:
        total = plan.total_bytes
        done = 0

        def tick(n: int) -> None:
            nonlocal done
            done += n
            if progress is not None:
                progress(done, total)

        out_step = step if step is not None and fmt != "portable" else 0
        if fmt == "portable" and step is None:
            import portable_ckpt

            out_step = portable_ckpt.open(s).step
        report, dest = _write_portable(
            plan, d, step=out_step, codec=codec, batch_bytes=batch_bytes, progress=tick
        )
    finally:
        plan.close()
    report.destination = dest
    return report


def _from_portable(
    s: str,
    d: str,
    dst_format: str,
    step: int | None,
    max_shard_size: int | str,
    progress: Callable[[int, int], None] | None,
) -> ConvertReport:
    import portable_ckpt

    ck = portable_ckpt.open(s, step=step)
    total = sum(int(i.nbytes) for i in ck.tensors.values())
    done = 0

    def tick(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    if dst_format == "hf":
        from portable_ckpt.convert.hf import parse_size, write_hf

        n, nbytes, warnings = write_hf(
            ck, d, max_shard_size=parse_size(max_shard_size), progress=tick
        )
    elif dst_format == "dcp":
        from portable_ckpt.convert.dcp import write_dcp

        n, nbytes, warnings = write_dcp(ck, d, progress=tick)
    else:  # pragma: no cover - guarded by the caller
        raise UsageError(f"unknown target format {dst_format!r}")
    largest = 0
    chunks = 0
    for info in ck.tensors.values():
        for r in info.ranges:
            size = info.numpy_dtype.itemsize
            for x in r.lengths:
                size *= x
            largest = max(largest, size)
            chunks += 1
    return ConvertReport(
        tensors=n,
        bytes=nbytes,
        seconds=0.0,
        destination=os.path.abspath(d),
        chunks=chunks,
        entries=len(ck.entries),
        largest_chunk=largest,
        warnings=warnings,
    )


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
