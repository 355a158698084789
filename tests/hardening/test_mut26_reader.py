"""Mutation audit 26, the reader's read planning (spec §10, §6.2, §8.3): what real reads of
real shards cost and deliver where the earlier tests did not look.

A layout proven once is reused only for the same boxes (R-COVER-3); bytes kept from a shard
header's last block serve the tensors that end there, strided ones too, without a read
(R-READ-4); a streamed zstd range reads and verifies each checksum block once (R-CKSUM-3,
R-TENSOR-11); a strided copy's scratch stays within the reader's window; touching byte runs
of one file are each read in place.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.format.manifest import Checksum, FileRecord
from portable_ckpt.io import reader
from portable_ckpt.io.checksum import BlockHasher, read_planned
from portable_ckpt.ranges.planning import Extent, Segment, plan_file
from portable_ckpt.storage import open_storage
from tests.core.helpers import sample_array, save_sharded
from tests.rules._util import edit_manifest, expect_code, shard_header

BS = 4096


def _version(root: Path, tensors: dict[str, tuple[np.ndarray, Sequence[int]]], **kw: Any) -> Path:
    m = save_sharded(root, tensors, writers=1, block_size=BS, **kw)
    return root / m.attempt_id


def test_a_proven_layout_is_reused_only_for_the_same_lengths(tmp_path: Path) -> None:
    """R-COVER-3: the reader proves each distinct layout once (every layer of a model shares
    one). ``b`` has ``a``'s shape and range offsets, but its second range is one row short:
    its coverage is another layout, refused before any element of it is delivered, also when
    the requested box lies away from the missing row."""
    a = sample_array("float32", (8, 8), seed=1)
    vdir = _version(tmp_path, {"a": (a, (2, 1)), "b": (a + 1, (2, 1))})

    def shorten(doc: dict[str, Any]) -> None:
        (second,) = [r for r in doc["tensors"]["b"]["ranges"] if r["offsets"] == [4, 0]]
        second["lengths"] = [3, 8]

    edit_manifest(vdir, shorten)
    ck = portable_ckpt.open(vdir)
    np.testing.assert_array_equal(ck.read("a"), a)
    out = np.full((1, 1), -1.0, dtype=np.float32)
    expect_code("PCK-COVERAGE-GAP", ck.read, "b", [0, 0], [1, 1], out=out)
    assert out[0, 0] == -1.0


def test_bytes_kept_from_the_header_block_serve_every_box_of_the_last_tensor(
    tmp_path: Path,
) -> None:
    """§10 (R-READ-4) and the reader's kept header blocks: a small file's header block holds
    its tensors, which end at the end of the file, the end of the kept bytes. Once the header
    is read, any box of them (whole, a row, a strided column) is served without a read."""
    s = sample_array("float32", (6, 5), seed=2)
    vdir = _version(tmp_path, {"s": (s, (1, 1))})
    (shard,) = [p for p in vdir.rglob("*.safetensors")]
    n, _, data = shard_header(shard)
    assert 8 + n + len(data) < BS  # one block: header and tensor
    ck = portable_ckpt.open(vdir)
    np.testing.assert_array_equal(ck.read("s", (5, 0), (1, 5)), s[5:6])  # reads the header
    before = ck.stats.bytes_read
    for offs, lens in (((0, 0), (6, 5)), ((0, 4), (6, 1)), ((1, 1), (5, 4)), ((5, 0), (1, 5))):
        got = ck.read("s", offs, lens)
        np.testing.assert_array_equal(got, s[offs[0] : offs[0] + lens[0], offs[1] : offs[1] + lens[1]])
    assert ck.stats.bytes_read == before


@pytest.mark.parametrize("box", [None, ((3, 0), (40, 64)), ((0, 5), (64, 7))])
def test_a_streamed_zstd_range_verifies_each_block_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, box: tuple[tuple[int, ...], tuple[int, ...]] | None
) -> None:
    """R-CKSUM-3, R-TENSOR-11: a zstd range too large to decode whole is streamed in input
    windows that end on checksum blocks (the first is cut short to the next boundary), so each
    block of the frame is read and verified once, whatever box of the range is served."""
    a = sample_array("float32", (64, 64), seed=3)
    a += np.random.default_rng(3).random((64, 64), dtype=np.float32)  # incompressible: a large frame
    vdir = _version(tmp_path, {"z": (a, (1, 1))}, codec="zstd")
    monkeypatch.setattr(reader, "ZSTD_WHOLE_BYTES", 0)
    monkeypatch.setattr(reader, "ZSTD_INPUT_BYTES", BS)
    monkeypatch.setattr(reader, "ZSTD_WINDOW_BYTES", 2048)
    ck = portable_ckpt.open(vdir)
    offs, lens = box if box is not None else ((0, 0), (64, 64))
    want = a[offs[0] : offs[0] + lens[0], offs[1] : offs[1] + lens[1]]
    np.testing.assert_array_equal(ck.read("z", offs, lens), want)  # header and frame checked
    (rec,) = ck.tensors["z"].ranges
    st = ck._header(rec.file).tensors[rec.name]
    assert st.start % BS and st.end - st.start > 3 * BS  # the frame starts mid-block
    blocks = -(-st.end // BS) - st.start // BS
    span = min(-(-st.end // BS) * BS, ck.manifest.files[rec.file].size) - st.start // BS * BS
    before_blocks, before_bytes = ck.stats.blocks_verified, ck.stats.bytes_read
    np.testing.assert_array_equal(ck.read("z", offs, lens), want)
    # Each block of the frame once: the header FrameStream checks is in the first window it
    # decodes (the audit found its first block read and verified a second time for the header).
    assert ck.stats.blocks_verified - before_blocks == blocks
    assert ck.stats.bytes_read - before_bytes == span


def test_a_strided_copy_is_cut_into_pieces_within_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A box that is no contiguous run of its chunk is copied through scratch in pieces whose
    byte span is at most ``WINDOW_BYTES`` (the scratch bound of a strided read), cut along its
    first dimension (a piece still too large is cut again); together they deliver the box."""
    window = 8192
    monkeypatch.setattr(reader, "WINDOW_BYTES", window)
    a = sample_array("float32", (64, 100), seed=4)
    vdir = _version(tmp_path, {"a": (a, (1, 1))})
    spans: list[int] = []
    real = plan_file

    def spy(segments: list[Segment], **kw: Any) -> list[list[Extent]]:
        spans.extend(s.hi - s.lo for s in segments)
        return real(segments, **kw)

    monkeypatch.setattr(reader, "plan_file", spy)
    ck = portable_ckpt.open(vdir)
    for offs, lens in (((0, 0), (64, 99)), ((3, 1), (61, 98)), ((0, 0), (41, 50))):
        spans.clear()
        got = ck.read("a", offs, lens)
        np.testing.assert_array_equal(got, a[offs[0] : offs[0] + lens[0], offs[1] : offs[1] + lens[1]])
        span = ((lens[0] - 1) * 100 + lens[1]) * 4
        assert len(spans) >= math.ceil(span / window) and max(spans) <= window, (offs, lens, spans)


def test_touching_byte_runs_are_each_read_in_place(tmp_path: Path) -> None:
    """Segments of one file that touch but do not overlap are separate parts, each read
    straight into its destination: only the blocks' edges pass through scratch. Overlapping
    ones share one scratch part."""
    data = np.random.default_rng(6).integers(0, 256, 3 * BS, dtype=np.uint8).tobytes()
    (tmp_path / "f.bin").write_bytes(data)
    h = BlockHasher(BS)
    h.update(data)
    rec = FileRecord("f.bin", len(data), Checksum("crc32c", BS, h.blocks()))
    storage = open_storage(tmp_path)
    bufs = [bytearray(100), bytearray(BS + 100), bytearray(50)]
    segs = [Segment(0, 100, 0, True), Segment(100, BS + 200, 1, True), Segment(BS + 200, BS + 250, 2, True)]
    passes = plan_file(segs, block_size=BS, file_size=len(data), max_shared=1 << 20)
    ((ext,),) = passes
    assert (ext.lo, ext.hi) == (0, 2 * BS)
    assert [(p.lo, p.hi, p.in_place) for p in ext.parts] == [
        (0, 100, True), (100, BS + 200, True), (BS + 200, BS + 250, True)
    ]
    res = read_planned(storage, "f.bin", rec, passes,
                       direct=lambda s: memoryview(bufs[s.sink]), deliver=lambda s, v: None)
    assert [bytes(b) for b in bufs] == [data[0:100], data[100 : BS + 200], data[BS + 200 : BS + 250]]
    assert res.scratch == 2 * BS - (BS + 250) and res.bytes_read == 2 * BS and res.blocks == 2
    # Overlapping runs share one scratch part, delivered to both.
    over = [Segment(10, 300, 0), Segment(200, 400, 1)]
    ((ext2,),) = plan_file(over, block_size=BS, file_size=len(data), max_shared=1 << 20)
    assert [(p.lo, p.hi, len(p.segments)) for p in ext2.parts] == [(10, 400, 2)]


def test_a_streamed_zstd_range_fills_any_destination_within_its_own_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-TENSOR-11: a streamed range goes into a strided ``out`` as into a contiguous one (the
    whole range, and a box of it), and a decoding window larger than the range costs scratch
    of the range's size at most, not of the window's."""
    a = sample_array("float32", (64, 64), seed=8)
    vdir = _version(tmp_path, {"z": (a, (1, 1))}, codec="zstd")
    monkeypatch.setattr(reader, "ZSTD_WHOLE_BYTES", 0)
    monkeypatch.setattr(reader, "ZSTD_INPUT_BYTES", BS)
    monkeypatch.setattr(reader, "ZSTD_WINDOW_BYTES", 1 << 20)
    ck = portable_ckpt.open(vdir)
    big = np.zeros((64, 128), dtype=np.float32)
    got = ck.read("z", out=big[:, ::2])
    np.testing.assert_array_equal(got, a)
    assert not big[:, 1::2].any()
    fortran = np.asfortranarray(np.zeros((30, 20), dtype=np.float32))
    np.testing.assert_array_equal(ck.read("z", (5, 7), (30, 20), out=fortran), a[5:35, 7:27])
    assert ck.stats.peak_scratch_bytes <= a.nbytes + BS


@pytest.mark.parametrize("box", [None, ((3, 5), (20, 30))])
def test_a_decode_window_below_one_element_holds_one_element(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, box: tuple[tuple[int, int], tuple[int, int]]
    | None,
) -> None:
    """A decode window set below one element decodes one element at a time (re-attack 26: no
    dimension's rows fit, and the search for one raised ``StopIteration``)."""
    a = np.arange(64 * 64, dtype=np.float64).reshape(64, 64)
    vdir = _version(tmp_path, {"z": (a, (1, 1))}, codec="zstd")
    monkeypatch.setattr(reader, "ZSTD_WHOLE_BYTES", 0)
    monkeypatch.setattr(reader, "ZSTD_INPUT_BYTES", BS)
    monkeypatch.setattr(reader, "ZSTD_WINDOW_BYTES", 3)
    ck = portable_ckpt.open(vdir)
    offs, lens = box if box is not None else ((0, 0), (64, 64))
    want = a[offs[0] : offs[0] + lens[0], offs[1] : offs[1] + lens[1]]
    np.testing.assert_array_equal(ck.read("z", offs, lens), want)
    assert ck.stats.peak_scratch_bytes <= a.itemsize + BS


def test_the_bytes_kept_from_header_blocks_stay_within_their_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-READ-4: the data bytes kept from shard headers' last blocks are bounded by
    ``PREFIX_BUDGET`` over all files (the mutant left by audit 26): a file whose tail would go
    past it keeps nothing, and its tensors are read again, verified, from the file."""
    a = sample_array("float32", (16, 64), seed=4)  # 4 files of 1 KiB, each in its header's block
    m = save_sharded(tmp_path, {"a": (a, (4, 1))}, writers=4, block_size=BS)
    vdir = tmp_path / m.attempt_id
    monkeypatch.setattr(reader, "PREFIX_BUDGET", 2 * a.nbytes // 4 + 512)  # two tails, not three
    ck = portable_ckpt.open(vdir)
    files = sorted({r.file for r in ck.tensors["a"].ranges})
    assert len(files) == 4
    for path in files:
        ck._header(path)
    assert sorted(ck._prefix) == files[:2]
    assert ck._prefix_bytes == sum(len(d) for _, d in ck._prefix.values()) == a.nbytes // 2
    before_read, before_blocks = ck.stats.bytes_read, ck.stats.blocks_verified
    np.testing.assert_array_equal(ck.read("a"), a)
    # The two files without kept bytes are read again (one block each), the others not.
    assert ck.stats.blocks_verified - before_blocks == 2
    assert ck.stats.bytes_read - before_read == sum(
        min(BS, ck.manifest.files[p].size) for p in files[2:])
