"""Per-file read planning: plan_file/cut_windows invariants (hypothesis) and the executor on real files."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import portable_ckpt
from portable_ckpt.errors import CheckpointError
from portable_ckpt.format.manifest import Checksum, FileRecord
from portable_ckpt.io.checksum import BlockHasher, read_planned
from portable_ckpt.io.reader import ReadRequest
from portable_ckpt.ranges.planning import Segment, cut_windows, plan_file
from portable_ckpt.storage import open_storage

from .helpers import sample_array, save_sharded

BLOCKS = st.sampled_from([1, 2, 7, 16, 64])


@st.composite
def layouts(draw: st.DrawFn) -> tuple[int, int, int, list[Segment]]:
    bs = draw(BLOCKS)
    size = draw(st.integers(1, 600))
    n = draw(st.integers(0, 12))
    segs = []
    for i in range(n):
        lo = draw(st.integers(0, size - 1))
        hi = draw(st.integers(lo + 1, min(size, lo + 80)))
        segs.append(Segment(lo, hi, i, draw(st.booleans())))
    return bs, size, draw(st.integers(1, 200)), segs


@settings(max_examples=400, deadline=None)
@given(layouts())
def test_plan_reads_each_needed_block_once_and_nothing_else(case) -> None:
    bs, size, max_shared, segs = case
    passes = plan_file(segs, block_size=bs, file_size=size, max_shared=max_shared)
    served = []
    for extents in passes:
        blocks_read: list[int] = []
        prev_hi = -1
        for ext in extents:
            # Whole blocks (the last may end at end of file), sorted, disjoint: each block once.
            assert ext.lo % bs == 0 and (ext.hi % bs == 0 or ext.hi == size)
            assert prev_hi <= ext.lo < ext.hi <= size
            prev_hi = ext.hi
            blocks = set(range(ext.lo // bs, -(-ext.hi // bs)))
            blocks_read += sorted(blocks)
            needed: set[int] = set()
            p_hi = ext.lo
            for part in ext.parts:
                assert p_hi <= part.lo < part.hi <= ext.hi  # parts sorted, disjoint, inside
                p_hi = part.hi
                needed |= set(range(part.lo // bs, -(-part.hi // bs)))
                for seg in part.segments:
                    assert part.lo <= seg.lo < seg.hi <= part.hi
                    served.append(seg)
                if part.in_place:
                    assert part.segments[0].direct
            # R-READ-4: every block read holds a byte some segment needs.
            assert blocks == needed
        assert len(blocks_read) == len(set(blocks_read))
    assert sorted(served, key=lambda s: s.sink) == sorted(segs, key=lambda s: s.sink)
    # A second pass only when overlapping segments together span more than max_shared.
    if len(passes) > 1:
        shared = [a for a in segs if any(a is not b and a.lo < b.hi and b.lo < a.hi for b in segs)]
        assert max(s.hi for s in shared) - min(s.lo for s in shared) > max_shared


@settings(max_examples=300, deadline=None)
@given(layouts(), st.integers(1, 6))
def test_windows_cut_extents_exactly(case, k: int) -> None:
    bs, size, max_shared, segs = case
    window = k * bs
    for extents in plan_file(segs, block_size=bs, file_size=size, max_shared=max_shared):
        windows = cut_windows(extents, window)
        got: dict[int, list[tuple[int, int]]] = {}
        for win in windows:
            assert 0 < sum(s.hi - s.lo for s in win) <= window
            for sl in win:
                assert sl.lo % bs == 0
                got.setdefault(sl.extent, []).append((sl.lo, sl.hi))
        for i, ext in enumerate(extents):
            spans = got[i]
            assert spans[0][0] == ext.lo and spans[-1][1] == ext.hi
            assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


def test_plan_rejects_segments_outside_the_file() -> None:
    with pytest.raises(ValueError):
        plan_file([Segment(0, 11, 0)], block_size=4, file_size=10, max_shared=100)


# -- the executor on a real file --------------------------------------------------------------------


def _file(tmp_path: Path, size: int, bs: int) -> tuple[object, str, FileRecord, bytes]:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    (tmp_path / "f.bin").write_bytes(data)
    h = BlockHasher(bs)
    h.update(data)
    rec = FileRecord("f.bin", size, Checksum("crc32c", bs, h.blocks()))
    return open_storage(tmp_path), "f.bin", rec, data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layouts(), st.integers(1, 4))
def test_executor_delivers_exact_bytes_and_verifies_each_block_once(tmp_path, case, k) -> None:
    bs, size, max_shared, segs = case
    bs *= 4
    segs = [Segment(s.lo, s.hi, s.sink, s.direct) for s in segs]
    storage, path, rec, data = _file(tmp_path, max(size, 1), bs)
    got: dict[int, bytes] = {}
    bufs = {s.sink: bytearray(s.hi - s.lo) for s in segs if s.direct}
    passes = plan_file(segs, block_size=bs, file_size=rec.size, max_shared=max_shared)

    def deliver(seg: Segment, view: memoryview) -> None:
        got[seg.sink] = bytes(view)

    res = read_planned(storage, path, rec, passes, direct=lambda s: memoryview(bufs[s.sink]),
                       deliver=deliver, window=k * bs)
    for s in segs:
        assert (bytes(bufs[s.sink]) if s.direct and s.sink not in got else got[s.sink]) == data[s.lo:s.hi]
    assert res.bytes_read == sum(e.hi - e.lo for ext in passes for e in ext)
    assert res.blocks == sum(len(range(e.lo // bs, -(-e.hi // bs))) for ext in passes for e in ext)


def test_executor_fails_on_a_corrupt_block_before_delivering_it(tmp_path) -> None:
    storage, path, rec, data = _file(tmp_path, 40_000, 4096)
    raw = bytearray(data)
    raw[20_000] ^= 1
    (tmp_path / path).write_bytes(bytes(raw))
    segs = [Segment(0, 8000, 0), Segment(19_000, 21_000, 1)]
    passes = plan_file(segs, block_size=4096, file_size=rec.size, max_shared=1 << 20)
    delivered: list[int] = []
    with pytest.raises(CheckpointError) as ei:
        read_planned(storage, path, rec, passes, direct=lambda s: memoryview(b""),
                     deliver=lambda s, v: delivered.append(s.sink), window=4096)
    assert ei.value.code == "PCK-CHECKSUM" and "block 4" in str(ei.value)
    assert delivered == [0]  # the first extent verified and was delivered; the corrupt one never


# -- read_many: one plan per file -------------------------------------------------------------------


def test_read_many_reads_each_block_once(tmp_path) -> None:
    # Many small tensors in one file: per-tensor reads verify shared blocks again and again,
    # one read_many reads the file's blocks once.
    tensors = {f"t{i}": (sample_array("float32", (37 + i,), seed=i), (1,)) for i in range(200)}
    save_sharded(tmp_path, tensors, writers=1, block_size=4096)
    ck = portable_ckpt.open(tmp_path)
    data = next((tmp_path / ck.id / "data").iterdir())
    outs = ck.read_many([ReadRequest(k) for k in tensors])
    for (a, _), got in zip(tensors.values(), outs):
        np.testing.assert_array_equal(got, a)
    assert ck.stats.bytes_read <= os.path.getsize(data)
    assert ck.stats.blocks_verified == -(-os.path.getsize(data) // 4096)
    # The same reads one by one cost more: that is what read_many saves.
    ck2 = portable_ckpt.open(tmp_path)
    for k in tensors:
        ck2.read(k)
    assert ck2.stats.bytes_read > 2 * ck.stats.bytes_read


def test_read_many_mixes_strided_overlapping_scalar_and_zstd_requests(tmp_path) -> None:
    a = sample_array("float32", (64, 48), seed=1)
    b = sample_array("bfloat16", (), seed=2)
    c = sample_array("int16", (300,), seed=3)
    save_sharded(tmp_path, {"a": (a, (3, 2)), "b": (b, ()), "c": (c, (2,))}, writers=2,
                 block_size=4096)
    save_sharded(tmp_path / "z", {"a": (a, (3, 2))}, writers=2, codec="zstd")
    ck = portable_ckpt.open(tmp_path)
    out = np.zeros((40, 20), np.float32)[::2, ::2]
    reqs = [ReadRequest("a", (3, 5), (20, 10), out), ReadRequest("a", (0, 0), (64, 48)),
            ReadRequest("a", (10, 7), (30, 30)), ReadRequest("b"), ReadRequest("c", (5,), (290,)),
            ReadRequest("a", (3, 5), (20, 10))]
    got = ck.read_many(reqs)
    assert got[0] is out
    np.testing.assert_array_equal(out, a[3:23, 5:15])
    np.testing.assert_array_equal(got[1], a)
    np.testing.assert_array_equal(got[2], a[10:40, 7:37])
    assert got[3].shape == () and got[3] == b
    np.testing.assert_array_equal(got[4], c[5:295])
    np.testing.assert_array_equal(got[5], a[3:23, 5:15])
    z = portable_ckpt.open(tmp_path / "z")
    zs = z.read_many([ReadRequest("a", (3, 5), (20, 10)), ReadRequest("a")])
    np.testing.assert_array_equal(zs[0], a[3:23, 5:15])
    np.testing.assert_array_equal(zs[1], a)


def test_small_tensors_after_the_header_cost_no_second_read(tmp_path) -> None:
    # The header's blocks are read (and verified) to parse it; tensors stored in the same
    # blocks are served from them.
    tensors = {f"s{i}": (sample_array("float32", (), seed=i), ()) for i in range(20)}
    save_sharded(tmp_path, tensors, writers=1, block_size=1 << 16)
    ck = portable_ckpt.open(tmp_path)
    ck.read("s0")
    first = ck.stats.bytes_read
    got = ck.read_many([ReadRequest(k) for k in tensors])
    assert [float(g) for g in got] == [float(a) for a, _ in tensors.values()]
    assert ck.stats.bytes_read == first
