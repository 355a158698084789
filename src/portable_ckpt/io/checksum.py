"""Per-block CRC32C: computed while writing, verified for exactly the blocks a read touches."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import crc32c as _crc

from portable_ckpt._threads import worker
from portable_ckpt.errors import ChecksumError, FileSizeError
from portable_ckpt.format.manifest import FileRecord
from portable_ckpt.ranges.planning import Extent, Segment, Slice, cut_windows, plan_file
from portable_ckpt.storage.base import Storage

__all__ = [
    "AUTO_FILE_BLOCKS",
    "DAMAGE_ADVICE",
    "DEFAULT_BLOCK_SIZE",
    "JOB_BLOCK_BUDGET",
    "MAX_DAMAGED_RUNS",
    "METADATA_BLOCK_SIZE",
    "MIN_BLOCK_SIZE",
    "BlockHasher",
    "BlockVerifier",
    "DamagedBlocks",
    "VerifiedRead",
    "auto_block_size",
    "block_error",
    "crc32c",
    "file_blocks_for",
    "read_planned",
    "read_verified",
    "read_verified_bytes",
    "verify_file",
]

#: Largest block the writers choose by themselves: the manifest stays small (8 hex digits per
#: 256 KiB: ~33 KB per GiB) for large files.
DEFAULT_BLOCK_SIZE = 256 * 1024

#: The block size of the files the committer writes itself (writer indexes, tensor tables).
#: The same value as the cap above, but another decision: changing one need not change the
#: other (maintainer review 22).
METADATA_BLOCK_SIZE = 256 * 1024

#: Smallest block the format allows (spec §6.2).
MIN_BLOCK_SIZE = 4096

#: Blocks per file that :func:`auto_block_size` aims at (32 KiB of hex digits per file).
AUTO_FILE_BLOCKS = 4096

#: Checksum blocks a whole job's data files aim at (32 MiB of hex digits in the manifest).
JOB_BLOCK_BUDGET = 1 << 22


def file_blocks_for(writers: int) -> int:
    """Blocks per file for a job of ``writers`` (:data:`JOB_BLOCK_BUDGET` shared, 64 … 4,096).

    Small jobs get :data:`AUTO_FILE_BLOCKS` per file; at 4,096 writers 1,024 blocks per file
    keep the manifest's checksum list at its 256 KiB-block size.
    """
    return max(64, min(AUTO_FILE_BLOCKS, JOB_BLOCK_BUDGET // max(1, writers)))


def auto_block_size(nbytes: int, max_blocks: int = AUTO_FILE_BLOCKS) -> int:
    """The block size a writer picks for a file of ``nbytes``: about ``max_blocks`` blocks.

    The smallest power of two that cuts the file into at most ``max_blocks`` blocks, within
    [4 KiB, 256 KiB]. A reader over-reads at most the partial blocks at the edges of what it
    needs, so small blocks make partial reads of files with many small ranges exact; the cap
    keeps the manifest's checksum list at about 8 bytes per 256 KiB for large files
    (measured in bench/results/*-checksum-layout.md).
    """
    bs = MIN_BLOCK_SIZE
    while bs < DEFAULT_BLOCK_SIZE and bs * max(1, max_blocks) < nbytes:
        bs *= 2
    return bs


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C (Castagnoli) of ``data``, continuing from ``value``."""
    return int(_crc.crc32c(data, value))


def _feed(
    mv: memoryview, bs: int, crc: int, fill: int, out: list[int]
) -> tuple[int, int]:
    """Append the CRC of every block completed by ``mv`` to ``out``; return the open block's state.

    ``crc``/``fill`` describe the block in progress. Whole blocks inside ``mv`` are hashed in
    one comprehension: with 4 KiB blocks the per-block Python work of a loop cost more than
    the CRC itself.
    """
    crc32c = _crc.crc32c
    n = len(mv)
    pos = 0
    if fill:
        pos = min(bs - fill, n)
        crc = crc32c(mv[:pos], crc)
        fill += pos
        if fill < bs:
            return crc, fill
        out.append(crc)
    whole = pos + (n - pos) // bs * bs
    out += [crc32c(mv[i : i + bs]) for i in range(pos, whole, bs)]
    if whole < n:
        return crc32c(mv[whole:]), n - whole
    return 0, 0


def _hex(crcs: list[int]) -> str:
    return struct.pack(f">{len(crcs)}I", *crcs).hex()


class BlockHasher:
    """Feed a file's bytes in order; collects one CRC per ``block_size`` bytes."""

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.block_size = block_size
        self._crcs: list[int] = []
        self._crc = 0
        self._fill = 0
        self.size = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        """Hash the next bytes of the file."""
        mv = memoryview(data).cast("B")
        self.size += len(mv)
        self._crc, self._fill = _feed(mv, self.block_size, self._crc, self._fill, self._crcs)

    def blocks(self) -> str:
        """The ``blocks`` string of the checksum record (call once, after the last update)."""
        if self._fill:
            self._crcs.append(self._crc)
            self._crc = 0
            self._fill = 0
        return _hex(self._crcs)


#: Damaged runs of blocks (consecutive damaged blocks) that :class:`DamagedBlocks` names one by
#: one in a file; the damaged blocks after them are counted in one more finding.
MAX_DAMAGED_RUNS = 16

#: The advice that ends a checksum finding (``_blame`` names what was lost just before it).
DAMAGE_ADVICE = "the file is corrupt — restore it from a copy or use an older version"


@dataclass
class _Run:
    """Consecutive damaged blocks ``first``…``last``; the CRCs of the first (found, recorded)."""

    first: int
    last: int
    crc: int
    want: str


class DamagedBlocks:
    """The damaged checksum blocks one pass over a file found, in memory bounded per file.

    A deep verification goes on to the end of a file after a damaged block (incident review R6:
    naming the first one only hid the rest of the damage). Consecutive damaged blocks make one
    run; the first ``limit`` runs are kept, the damaged blocks after them only counted (with
    the first and last of them), so that memory and the findings stay bounded by a constant
    per file whatever the damage. Blocks ``skip`` (first, last) were reported already and are
    not logged again.

    Attributes:
        runs: The runs kept, in file order.
        more: Damaged blocks after the kept runs; ``more_first``/``more_last`` the first and
            last of them.
        checked: The pass verified bytes ``[0:checked)`` (where a storage error stopped it).

    """

    def __init__(
        self, limit: int = MAX_DAMAGED_RUNS, skip: tuple[int, int] | None = None
    ) -> None:
        self.limit = limit
        self.skip = skip
        self.runs: list[_Run] = []
        self.more = 0
        self.more_first = self.more_last = -1
        self.checked = 0

    def __bool__(self) -> bool:
        return bool(self.runs)

    def add(self, idx: int, crc: int, want: str) -> None:
        """Log block ``idx`` (blocks come in file order) as damaged."""
        if self.skip is not None and self.skip[0] <= idx <= self.skip[1]:
            return
        if self.runs and not self.more and self.runs[-1].last == idx - 1:
            self.runs[-1].last = idx
        elif len(self.runs) < self.limit:
            self.runs.append(_Run(idx, idx, crc, want))
        else:
            self.more += 1
            if self.more_first < 0:
                self.more_first = idx
            self.more_last = idx

    def overlaps(self, lo: int, hi: int, block_size: int) -> bool:
        """Whether a logged damaged block (or the span of the counted ones) meets ``[lo, hi)``."""
        spans = [(r.first, r.last) for r in self.runs]
        if self.more:
            spans.append((self.more_first, self.more_last))
        return any(a * block_size < hi and lo < (b + 1) * block_size for a, b in spans)

    def errors(self, path: str, block_size: int, size: int) -> list[ChecksumError]:
        """One :class:`ChecksumError` per run, and one more for the counted blocks."""
        def span(a: int, b: int) -> tuple[int, int]:
            return a * block_size, min((b + 1) * block_size, size)

        out: list[ChecksumError] = []
        for r in self.runs:
            a, b = r.first, r.last
            lo, hi = span(a, b)
            out.append(block_error(path, lo, hi, a, r.crc, r.want) if a == b else ChecksumError(
                f"{path!r}: bytes [{lo}:{hi}] (blocks {a}-{b}: {b - a + 1} damaged blocks in a "
                f"row) do not have the CRC32C values the manifest records; {DAMAGE_ADVICE}",
                path=path, span=(lo, hi)))
        if self.more:
            lo, hi = span(self.more_first, self.more_last)
            n = self.more
            out.append(ChecksumError(
                f"{path!r}: and {n} more damaged block{'s' * (n != 1)} in bytes [{lo}:{hi}] "
                f"(blocks {self.more_first}..{self.more_last}), not named one by one (at most "
                f"{self.limit} runs of damaged blocks are named per file); {DAMAGE_ADVICE}",
                path=path, span=(lo, hi),
            ))
        return out


def block_error(path: str, lo: int, hi: int, idx: int, crc: int, want: str) -> ChecksumError:
    """The finding of one damaged block ``idx`` (bytes ``[lo, hi)``) of ``path``."""
    return ChecksumError(
        f"{path!r}: bytes [{lo}:{hi}] (block {idx}) have CRC32C {crc:08x}, the manifest "
        f"records {want or 'nothing'}; {DAMAGE_ADVICE}", path=path, span=(lo, hi))


class BlockVerifier:
    """Verify blocks of one file from pieces fed in file order (pieces may live in many buffers).

    ``damaged``: a damaged block is logged there and the verification goes on; without it the
    first damaged block raises :class:`ChecksumError`.
    """

    def __init__(
        self, path: str, blocks: str, block_size: int, size: int,
        damaged: DamagedBlocks | None = None,
    ) -> None:
        self.path = path
        self._blocks = blocks
        self.block_size = block_size
        self.size = size
        self.verified = 0
        self.damaged = damaged

    def verify_span(self, start: int, pieces: list[memoryview]) -> None:
        """Verify the blocks of the byte span starting at block-aligned ``start``.

        ``pieces`` concatenated must be whole blocks (the last may end at end of file).
        """
        bs = self.block_size
        crcs: list[int] = []
        crc = fill = 0
        for piece in pieces:
            mv = piece.cast("B") if piece.format != "B" else piece
            crc, fill = _feed(mv, bs, crc, fill, crcs)
        if fill:
            crcs.append(crc)
        idx = start // bs
        if _hex(crcs) != self._blocks[8 * idx : 8 * (idx + len(crcs))]:
            for i, got in enumerate(crcs):
                self._check(idx + i, got)
        self.verified += len(crcs)
        if self.damaged is not None:
            self.damaged.checked = min(self.size, (idx + len(crcs)) * bs)

    def _check(self, idx: int, crc: int) -> None:
        want = self._blocks[8 * idx : 8 * idx + 8]
        if f"{crc:08x}" == want:
            return
        if self.damaged is not None:
            self.damaged.add(idx, crc, want)
            return
        lo = idx * self.block_size
        raise block_error(self.path, lo, min(lo + self.block_size, self.size), idx, crc, want)


@dataclass
class VerifiedRead:
    """What one verified read cost: bytes fetched, blocks checked, scratch allocated."""

    bytes_read: int
    blocks: int
    scratch: int


def read_verified(
    storage: Storage, full_path: str, rec: FileRecord, lo: int, hi: int, dest: memoryview | None
) -> VerifiedRead:
    """Read bytes ``[lo, hi)`` of a file into ``dest``, verifying every checksum block touched.

    The requested bytes go straight into ``dest``; only the partial blocks at the edges pass
    through small buffers. With ``dest=None`` the bytes are read into scratch and only verified.
    """
    if not 0 <= lo <= hi <= rec.size:
        raise FileSizeError(
            f"{full_path!r}: read [{lo}:{hi}] outside its {rec.size} bytes", path=full_path
        )
    if hi == lo:
        return VerifiedRead(0, 0, 0)
    views = {} if dest is None else {0: dest.cast("B") if dest.format != "B" else dest}
    seg = Segment(lo, hi, 0, direct=dest is not None)
    passes = plan_file(
        [seg], block_size=rec.checksum.block_size, file_size=rec.size, max_shared=hi - lo
    )
    return read_planned(
        storage, full_path, rec, passes, direct=lambda s: views[s.sink], deliver=_discard
    )


def _discard(_: Segment, __: memoryview) -> None:
    """Deliver nothing: the bytes were only to be verified."""


#: Window of a local deep verify: stays in the CPU cache between the copy and the CRC (1 MiB
#: took 83 ms of CPU for 256 MiB, 8 MiB windows 108 ms; bench in tests/hardening/README.md).
LOCAL_WINDOW = 1 << 20
#: Pipeline window: the I/O thread reads window k+1 while window k is checksummed and delivered.
PIPELINE_WINDOW = 8 << 20


def _io_pool() -> ThreadPoolExecutor:
    return worker("pck-io")


@dataclass
class _Window:
    """The buffers of one pipeline window and the parts it completes."""

    reads: list[tuple[int, list[memoryview]]]
    done: list[tuple[int, int]]
    scratch: int


class _Buffers:
    """Builds each window's buffer lists over the plan's parts (scratch allocated on first use)."""

    def __init__(self, extents: Sequence[Extent], direct: Callable[[Segment], memoryview]) -> None:
        self._extents = extents
        self._direct = direct
        self._scratch: dict[tuple[int, int], memoryview] = {}
        self._next = [0] * len(extents)

    def window(self, slices: Sequence[Slice]) -> _Window:
        reads: list[tuple[int, list[memoryview]]] = []
        done: list[tuple[int, int]] = []
        fresh = 0
        for sl in slices:
            parts = self._extents[sl.extent].parts
            bufs: list[memoryview] = []
            pos = sl.lo
            p = self._next[sl.extent]
            while p < len(parts) and parts[p].lo < sl.hi:
                part = parts[p]
                a, b = max(part.lo, pos), min(part.hi, sl.hi)
                if a > pos:
                    bufs.append(memoryview(bytearray(a - pos)))
                    fresh += a - pos
                if part.in_place:
                    view = self._direct(part.segments[0])
                else:
                    key = (sl.extent, p)
                    view = self._scratch.get(key)  # type: ignore[assignment]
                    if view is None:
                        view = self._scratch[key] = memoryview(bytearray(part.hi - part.lo))
                        fresh += part.hi - part.lo
                bufs.append(view[a - part.lo : b - part.lo])
                pos = b
                if part.hi > sl.hi:
                    break  # the part continues in the next slice
                done.append((sl.extent, p))
                p += 1
            self._next[sl.extent] = p
            if pos < sl.hi:
                bufs.append(memoryview(bytearray(sl.hi - pos)))
                fresh += sl.hi - pos
            reads.append((sl.lo, bufs))
        return _Window(reads, done, fresh)

    def deliver(self, win: _Window, deliver: Callable[[Segment, memoryview], None]) -> None:
        """Hand the verified bytes of every part this window completed to its segments."""
        for i, p in win.done:
            part = self._extents[i].parts[p]
            if part.in_place:
                continue
            buf = self._scratch.pop((i, p))
            for seg in part.segments:
                deliver(seg, buf[seg.lo - part.lo : seg.hi - part.lo])


def read_planned(
    storage: Storage,
    full_path: str,
    rec: FileRecord,
    passes: Sequence[Sequence[Extent]],
    *,
    direct: Callable[[Segment], memoryview],
    deliver: Callable[[Segment, memoryview], None],
    window: int | None = None,
    io: ThreadPoolExecutor | None = None,
) -> VerifiedRead:
    """Execute a :func:`~portable_ckpt.ranges.planning.plan_file` plan of one file.

    Direct segments are read straight into ``direct(segment)`` (a buffer of the segment's
    size); every other segment is handed its bytes with ``deliver(segment, view)``. Every block
    an extent covers is verified before any byte of it is delivered; windows are pipelined (the
    I/O thread reads window k+1 while window k is checksummed and delivered), and a failure
    waits for the read in flight, so no read keeps writing into the caller's memory. ``io`` is
    the I/O thread (default: the process's ``pck-io`` worker); files read at the same time
    need one each.
    """
    pool = io if io is not None else _io_pool()
    bs = rec.checksum.block_size
    win = max(bs, (window or PIPELINE_WINDOW) // bs * bs)
    verifier = BlockVerifier(full_path, rec.checksum.blocks, bs, rec.size)
    nbytes = peak = 0
    for extents in passes:
        windows = cut_windows(extents, win)
        if not windows:
            continue
        bufs = _Buffers(extents, direct)
        cur = bufs.window(windows[0])
        if len(windows) == 1:
            storage.read_extents(full_path, cur.reads)
            fut = None
        else:
            fut = pool.submit(storage.read_extents, full_path, cur.reads)
        for k in range(len(windows)):
            nxt = None
            if fut is not None:
                fut.result()
                fut = None
                if k + 1 < len(windows):
                    nxt = bufs.window(windows[k + 1])
                    fut = pool.submit(storage.read_extents, full_path, nxt.reads)
            peak = max(peak, cur.scratch + (nxt.scratch if nxt is not None else 0))
            try:
                for off, pieces in cur.reads:
                    verifier.verify_span(off, pieces)
                    nbytes += sum(len(x) for x in pieces)
                bufs.deliver(cur, deliver)
            except BaseException:
                _settle(fut)  # never leave a read writing into memory the caller owns
                raise
            if nxt is not None:
                cur = nxt
    return VerifiedRead(nbytes, verifier.verified, peak)


def _settle(fut: Future[None] | None) -> None:
    """Wait for a read in flight, ignoring its outcome (an earlier error is being raised)."""
    if fut is not None:
        try:
            fut.result()
        except BaseException:  # the first error is the one reported
            pass


def verify_file(
    storage: Storage,
    full_path: str,
    rec: FileRecord,
    window: int = 8 << 20,
    on_bytes: Callable[[int], None] | None = None,
    *,
    size_checked: bool = False,
    damaged: DamagedBlocks | None = None,
    until: int | None = None,
) -> VerifiedRead:
    """Checksum a whole file without keeping it (``on_bytes(n)`` after each verified window).

    Local files are read with ``pread`` into one cache-sized window, in this thread: a mapping
    would save the copy, but a file truncated while it is mapped kills the process with SIGBUS
    (issue 12 item 19), while a short read is ``PCK-FILE-SIZE``. Other backends alternate two
    windows: one is read while the CRC of the other runs.

    The file's size is asked first (``size_checked``: the caller did): its windows are sized by
    the record, and a record may declare a gigabyte for a file that is not there (attack review
    2 F3). Nothing is allocated for bytes that are not present.

    ``damaged``: the damaged blocks are logged there and the file is read to its end (each
    block read and verified once); without it the first damaged block raises
    :class:`ChecksumError`. A storage error stops the pass either way (``damaged.checked``
    says how far it got). ``until``: with ``damaged``, the pass may stop at the end of the block
    that holds byte ``until - 1`` (a second read that confirms findings up to there).
    """
    bs = rec.checksum.block_size
    verifier = BlockVerifier(full_path, rec.checksum.blocks, bs, rec.size, damaged)
    actual = rec.size if size_checked else storage.size(full_path)
    if actual != rec.size:
        raise FileSizeError(
            f"{full_path!r} is {actual} bytes, the manifest records {rec.size} "
            f"({'truncated' if actual < rec.size else 'extended'}); the version is damaged",
            path=full_path,
        )
    if rec.size == 0:
        return VerifiedRead(0, 0, 0)
    end = rec.size
    if damaged is not None and until is not None:
        end = min(rec.size, -(-max(until, 1) // bs) * bs)
    if storage.capabilities.local_path:
        buf = memoryview(bytearray(min(max(bs, LOCAL_WINDOW // bs * bs), end)))
        for pos in range(0, end, len(buf)):
            piece = buf[: min(len(buf), end - pos)]
            storage.read_into(full_path, pos, piece)
            verifier.verify_span(pos, [piece])
            if on_bytes is not None:
                on_bytes(len(piece))
        return VerifiedRead(end, verifier.verified, len(buf))
    win = max(bs, window // bs * bs)
    bufs = [memoryview(bytearray(min(win, end))), memoryview(bytearray(min(win, end)))]
    pool = _io_pool()

    def fill(k: int, pos: int) -> int:
        n = min(win, end - pos)
        storage.read_into(full_path, pos, bufs[k][:n])
        return n

    pos, k = 0, 0
    fut = pool.submit(fill, 0, 0)
    while pos < end:
        n = fut.result()
        nxt = pos + n
        if nxt < end:
            fut = pool.submit(fill, 1 - k, nxt)
        try:
            verifier.verify_span(pos, [bufs[k][:n]])
        except BaseException:
            if nxt < end:
                fut.result()
            raise
        if on_bytes is not None:
            on_bytes(n)
        pos, k = nxt, 1 - k
    return VerifiedRead(end, verifier.verified, 2 * len(bufs[0]))


def read_verified_bytes(
    storage: Storage, full_path: str, rec: FileRecord, lo: int, hi: int
) -> bytes:
    """Return bytes ``[lo, hi)`` of a file after verifying their blocks."""
    buf = bytearray(hi - lo)
    read_verified(storage, full_path, rec, lo, hi, memoryview(buf))
    return bytes(buf)
