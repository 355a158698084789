"""Verification of an opened version (spec §10.1): shallow, sampled or deep, each problem once.

:meth:`Checkpoint.verify <portable_ckpt.io.reader.Checkpoint.verify>` is :func:`verify_version`
(its docstring says what is checked, in which order); the checks go through the reader's own
(sizes, shard headers, ranges, entry values, verified reads), and the deep pass checksums every
block of every file (:func:`~portable_ckpt.io.checksum.verify_file`), naming the damaged ones.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from portable_ckpt.errors import (
    CheckpointError,
    ChecksumError,
    FileMissingError,
    RangeBoundsError,
    UsageError,
)
from portable_ckpt.format.manifest import RangeRecord, TensorEntry
from portable_ckpt.format.usage import callable_or_none, flag, fraction, strict_int
from portable_ckpt.io import reader  # its windows are read at call time: tests set them small
from portable_ckpt.io._blame import name_blocks
from portable_ckpt.io._entries import load_json_value
from portable_ckpt.io.checksum import DamagedBlocks, verify_file
from portable_ckpt.io.reader import Checkpoint
from portable_ckpt.io.safetensors_io import ShardTensor
from portable_ckpt.io.tensor_table import TableTensorEntry, iter_records
from portable_ckpt.logs import Progress

__all__ = ["verify_version"]


def verify_version(
    ck: Checkpoint,
    *,
    deep: bool = False,
    sample: float | None = None,
    seed: int | None = None,
    progress: Progress | None = None,
) -> list[CheckpointError]:
    """Every problem of the version: :meth:`Checkpoint.verify`'s body (documented there)."""
    flag(deep, "verify: deep")  # deep="no" is truthy: a deep pass nobody asked for
    if sample is not None:
        sample = fraction(sample, "verify: sample")
    if seed is not None:
        seed = strict_int(seed, "verify: seed")
    # Silently ignored before (api review 31): a caller who meant a sample got none.
    if seed is not None and sample is None:
        raise UsageError("verify: seed draws the sample's range records: it needs sample=")
    if deep and sample is not None:
        raise UsageError(
            "verify: deep=True reads every range record: give deep=True or sample=, not both"
        )
    callable_or_none(progress, "verify: progress")
    f = _Findings()
    gone = ck._deleted()
    if gone is not None:  # gc removed it since it was opened (serving review F2)
        return [gone]
    ck._sizes_checked = set()  # each verify looks at the files again, not at earlier reads
    for path in ck.manifest.files:
        f.run(path, ck._file, path)
    for key, t in ck.tensors.items():
        if isinstance(f.run(None, ck._tensor, key), RangeBoundsError):
            continue  # a table's record outside its tensor names no stored range (R-READ-2)
        for rec in iter_records(t):
            f.run(rec.file, ck._shard_tensor, t, rec)
    for e in ck.entries.values():
        for v in e.values:
            f.run(v.file, load_json_value, ck, e, v.file)
    chunks: Iterable[tuple[TensorEntry, RangeRecord]] = ()
    if deep:
        on_bytes = _meter(progress, sum(r.size for r in ck.manifest.files.values()))
        for path in ck.manifest.files:
            if path not in f.bad_files or path in f.bad_block:  # each block once (R6)
                f.add(path, _verify_file, ck, path, on_bytes, f.bad_block.get(path))
        chunks = (  # made as they are verified (a table's records are not all kept)
            (t, r)
            for t in ck.tensors.values()
            for r in iter_records(t)
            if t.dtype == "bool" or r.codec == "zstd"
        )
    elif sample:
        from portable_ckpt.io.annotations import sampled_chunks  # the count records state

        tensors = list(ck.tensors.values())
        ends = list(itertools.accumulate(t.range_count for t in tensors))
        k = sampled_chunks(ends[-1] if ends else 0, sample)
        # The records' indices are sampled (the same records as sampling a list of them).
        picked = random.Random(seed).sample(range(ends[-1] if ends else 0), k)
        chunks = [_nth_record(tensors, ends, i) for i in picked]
    for t, r in chunks:
        f.run(r.file, _verify_chunk, ck, t, r, deep)
    if any(isinstance(e, FileMissingError) for e in f.errors):
        gone = ck._deleted()  # deleted while verified: not damage to record
        if gone is not None:
            return [gone]
    return f.errors


def _verify_chunk(ck: Checkpoint, t: TensorEntry, rec: RangeRecord, checksummed: bool) -> None:
    """Read one stored range whole: its blocks, its zstd frame, its ``bool`` bytes.

    ``checksummed``: the file's blocks were already verified (deep mode); only ranges whose
    content has rules of its own (zstd, bool) are read again then. Memory stays bounded by
    one window whatever the range's size.
    """
    st = ck._shard_tensor(t, rec)
    if rec.codec == "zstd":
        _verify_frame(ck, t, rec, st)
    elif t.dtype == "bool":
        bs = ck.manifest.files[rec.file].checksum.block_size
        step = max(bs, reader.WINDOW_BYTES // bs * bs)
        buf = memoryview(bytearray(min(step, st.end - st.start)))
        ck._note_scratch(len(buf))
        lo = st.start
        while lo < st.end:
            hi = min(st.end, (lo // step + 1) * step)  # windows end on checksum blocks
            ck._read_verified(rec.file, lo, hi, buf[: hi - lo])
            ck._check_bool_window(t, rec, buf[: hi - lo], lo - st.start)
            lo = hi
    elif not checksummed:
        ck._read_verified(rec.file, st.start, st.end, None)


def _verify_frame(ck: Checkpoint, t: TensorEntry, rec: RangeRecord, st: ShardTensor) -> None:
    """Decode a zstd range to its end in bounded windows (R-TENSOR-7), checking bools."""
    what = f"{ck._rel(rec.file)}: tensor {t.key!r} range {rec.name!r}"
    stream, step = ck._frame_stream(t, rec, st, what)
    expect = math.prod(rec.lengths) * t.itemsize
    buf = memoryview(bytearray(min(expect, reader.ZSTD_WINDOW_BYTES)))
    ck._note_scratch(len(buf) + step)
    done = 0
    while done < expect:
        n = min(len(buf), expect - done)
        stream.readinto(buf[:n])
        if t.dtype == "bool":
            ck._check_bool_window(t, rec, buf[:n], done)
        done += n
    stream.finish()


def _verify_file(
    ck: Checkpoint,
    path: str,
    on_bytes: Callable[[int], None] | None = None,
    reported: tuple[int, int] | None = None,
) -> list[CheckpointError]:
    """Checksum every block of ``path``: its damaged blocks, named, and what stopped it.

    The pass goes on after a damaged block (incident review R6: the first one alone was
    named, and nothing said the rest of the file went unchecked). ``reported``: bytes of a
    damaged block an earlier check of this verification named (not named again). A
    storage error ends the pass: it comes last, saying which bytes were not checked.
    """
    rel, rec = ck._rel(path), ck._file(path)
    bs = rec.checksum.block_size
    skip = None if reported is None else (reported[0] // bs, (reported[1] - 1) // bs)
    log = DamagedBlocks(skip=skip)
    stopped: CheckpointError | None = None
    try:
        res = verify_file(  # _file() checked the size once for this reader
            ck.storage, rel, rec, on_bytes=on_bytes, size_checked=True, damaged=log
        )
    except CheckpointError as exc:
        stopped = exc
        stopped.reword(f"{exc.message}; the rest of {rel!r} (bytes [{log.checked}:"
                       f"{rec.size}]) was not checked for damage")
    else:
        ck._account(res)
    found: list[CheckpointError] = []
    if log:  # named in one walk of the file's records; an intact file walks none
        found += name_blocks(log.errors(rel, bs, rec.size), ck.manifest, path,
                             ck._headers.get(path), in_header=False)
    return found + ([stopped] if stopped is not None else [])


def _nth_record(
    tensors: Sequence[TensorEntry], ends: Sequence[int], i: int
) -> tuple[TensorEntry, RangeRecord]:
    """Record ``i`` of all ``tensors``' records in order (``ends``: their running counts)."""
    k = bisect.bisect_right(ends, i)
    t, j = tensors[k], i - (ends[k - 1] if k else 0)
    return t, (t.record(j) if isinstance(t, TableTensorEntry) else t.ranges[j])


def _meter(progress: Progress | None, total: int) -> Callable[[int], None] | None:
    """``on_bytes(n)`` calls adding up to ``progress(done, total)`` (``None`` without one)."""
    if progress is None:
        return None
    done = [0]
    progress(0, total)

    def on_bytes(n: int) -> None:
        done[0] += n
        progress(done[0], total)

    return on_bytes


#: Codes that make a file unusable for the rest of a verification (reported once).
_FILE_CODES = frozenset(
    {"PCK-FILE-MISSING", "PCK-FILE-SIZE", "PCK-CHECKSUM", "PCK-SHARD-HEADER", "PCK-STORAGE",
     "PCK-PATH-UNSAFE"}
)


class _Findings:
    """The problems of one :meth:`Checkpoint.verify`, each reported once."""

    def __init__(self) -> None:
        self.errors: list[CheckpointError] = []
        self.bad_files: set[str] = set()
        #: Files whose first problem is one damaged checksum block: its bytes.
        self.bad_block: dict[str, tuple[int, int]] = {}
        self._seen: set[tuple[str, str]] = set()

    def run(self, file: str | None, fn: Any, *args: Any) -> CheckpointError | None:
        """Run one check that needs ``file``; skip it when that file already failed.

        A check repeated on the same object (a range record checked again when its data is
        read) fails with the same code and message: that repeat is dropped. Returns the
        check's error, ``None`` when it passed or was skipped.
        """
        if file is not None and file in self.bad_files:
            return None
        try:
            fn(*args)
        except CheckpointError as exc:
            self._note(file, exc)
            return exc
        return None

    def add(self, file: str, fn: Any, *args: Any) -> None:
        """Run a check of ``file`` that returns its problems (it may raise one too)."""
        try:
            found = fn(*args)
        except CheckpointError as exc:
            found = [exc]
        for problem in found:
            self._note(file, problem)

    def _note(self, file: str | None, exc: CheckpointError) -> None:
        if (exc.code, exc.message) not in self._seen:
            self._seen.add((exc.code, exc.message))
            self.errors.append(exc)
        if file is not None and exc.code in _FILE_CODES:
            if file not in self.bad_files and isinstance(exc, ChecksumError) and exc.span:
                self.bad_block[file] = exc.span
            else:
                self.bad_block.pop(file, None)
            self.bad_files.add(file)
