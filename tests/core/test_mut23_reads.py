"""Mutation audit 23: reads of boxes whose bytes are far apart in their chunk, and their cost."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import FileSizeError
from portable_ckpt.format.manifest import Checksum, FileRecord
from portable_ckpt.io.checksum import BlockHasher, read_planned, read_verified
from portable_ckpt.ranges.planning import Segment, plan_file
from portable_ckpt.storage import open_storage

from .helpers import sample_array, save_sharded

BS = 4096


def test_a_column_of_wide_rows_is_read_row_by_row_skipping_the_gaps(tmp_path: Path) -> None:
    # One chunk, rows of 16 KiB: a column touches one block per row, the rows far apart. The
    # read is split into one segment per row; no block between them is read (R-READ-4), and
    # each row's bytes land in their own row of the result.
    a = sample_array("float32", (2, 32, 4096), seed=5)
    save_sharded(tmp_path, {"a": (a, (1, 1, 1))}, writers=1, block_size=BS)
    ck = portable_ckpt.open(tmp_path)
    ck.read("a", (0, 0, 0), (1, 1, 1))  # the header is read and kept: not counted below
    cases = [
        ((0, 0, 2050), (2, 32, 1)),
        ((1, 0, 4095), (1, 32, 1)),  # first dimension of length 1: split along the second
        ((0, 3, 7), (1, 20, 3)),
        ((1, 5, 1000), (1, 1, 3000)),
    ]
    for offs, lens in cases:
        before = ck.stats.bytes_read
        got = ck.read("a", offs, lens)
        sl = tuple(slice(o, o + n) for o, n in zip(offs, lens, strict=True))
        np.testing.assert_array_equal(got, a[sl])
        rows = lens[0] * lens[1]
        # Per row, the blocks its bytes touch (one more for a partial edge); never the gaps.
        per_row = (lens[2] * 4 // BS + 2) * BS
        assert ck.stats.bytes_read - before <= rows * per_row, (offs, lens)


def _file(tmp_path: Path, data: bytes) -> tuple[FileRecord, portable_ckpt.storage.Storage]:
    (tmp_path / "f.bin").write_bytes(data)
    h = BlockHasher(BS)
    h.update(data)
    return FileRecord("f.bin", len(data), Checksum("crc32c", BS, h.blocks())), open_storage(tmp_path)


def test_read_verified_outside_the_file_is_a_file_size_error(tmp_path: Path) -> None:
    data = bytes(range(256)) * 40
    rec, storage = _file(tmp_path, data)
    buf = bytearray(100)
    res = read_verified(storage, "f.bin", rec, len(data) - 100, len(data), memoryview(buf))
    assert bytes(buf) == data[-100:] and res.blocks == 1
    for lo, hi in ((len(data) - 50, len(data) + 50), (-1, 10), (20, 10)):
        with pytest.raises(FileSizeError):
            read_verified(storage, "f.bin", rec, lo, hi, memoryview(bytearray(max(0, hi - lo))))


def test_a_window_that_is_not_a_multiple_of_the_block_is_rounded_down(tmp_path: Path) -> None:
    # Every window starts on a block boundary whatever window is asked for (each is verified
    # by the blocks it starts at).
    data = np.random.default_rng(7).integers(0, 256, 7 * BS + 123, dtype=np.uint8).tobytes()
    rec, storage = _file(tmp_path, data)
    segs = [Segment(10, 3 * BS + 5, 0), Segment(4 * BS + 1, len(data), 1)]
    passes = plan_file(segs, block_size=BS, file_size=rec.size, max_shared=1 << 20)
    got: dict[int, bytes] = {}

    def deliver(seg: Segment, view: memoryview) -> None:
        got[seg.sink] = bytes(view)

    for window in (BS + 1, 2 * BS + 100, 3 * BS - 1):
        got.clear()
        res = read_planned(storage, "f.bin", rec, passes, direct=lambda s: memoryview(b""),
                           deliver=deliver, window=window)
        assert got == {0: data[10 : 3 * BS + 5], 1: data[4 * BS + 1 :]}
        assert res.blocks == 8


def test_peak_scratch_counts_the_window_read_ahead(tmp_path: Path) -> None:
    # Window k is verified while window k+1 is read: both windows' scratch is alive at once.
    data = np.random.default_rng(9).integers(0, 256, 4 * BS, dtype=np.uint8).tobytes()
    rec, storage = _file(tmp_path, data)
    segs = [Segment(i * BS + 1, (i + 1) * BS - 1, i) for i in range(4)]  # strided: scratch
    passes = plan_file(segs, block_size=BS, file_size=rec.size, max_shared=1 << 20)
    assert [(e.lo, e.hi) for e in passes[0]] == [(0, 4 * BS)]
    got: dict[int, bytes] = {}

    def deliver(seg: Segment, view: memoryview) -> None:
        got[seg.sink] = bytes(view)

    res = read_planned(storage, "f.bin", rec, passes, direct=lambda s: memoryview(b""),
                       deliver=deliver, window=BS)
    assert got == {i: data[i * BS + 1 : (i + 1) * BS - 1] for i in range(4)}
    assert res.scratch == 2 * BS and res.bytes_read == 4 * BS and res.blocks == 4
