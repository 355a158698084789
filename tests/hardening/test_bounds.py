"""Issue 12, wrong results and costs bounded by the bytes present (items 5, 7-16).

Each test failed on the main branch before its fix: it names the item of the issue it pins.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import portable_ckpt
import portable_ckpt.format.dtypes
from portable_ckpt.errors import CheckpointError
from portable_ckpt.io.checksum import BlockHasher
from tests.hardening._hand import HandTensor, Piece, edit_manifest, rle_frame, write_version
from tests.hardening._util import cpu_bound, expect_code, json_values, memory_bound, time_bound

#: Memory a small read may cost: the 16 MiB scratch window of the reader plus slack.
SMALL_READ_BYTES = 40 << 20



# -- item 5: a range check is keyed by the whole record, never by (file, name) ------------------
def _aliased(root: Path, codec: str) -> str:
    """Tensor ``b`` (float32[20]) whose record names the 12-element range of tensor ``a``."""
    import zstandard

    def piece(arr: np.ndarray[Any, Any]) -> Piece:
        raw = arr.tobytes()
        if codec == "zstd":
            raw = zstandard.ZstdCompressor(write_content_size=True).compress(raw)
        return Piece((0,), arr.shape, raw, codec)

    a = np.arange(12, dtype=np.float32)
    b = np.arange(20, dtype=np.float32) + 100
    c = np.arange(40, dtype=np.float32) + 1000
    attempt = write_version(
        str(root),
        [
            HandTensor("a", "float32", (12,), [piece(a)]),
            HandTensor("b", "float32", (20,), [piece(b)]),
            HandTensor("c", "float32", (40,), [piece(c)]),
        ],
    )
    edit_manifest(str(root / attempt), lambda d: d["tensors"]["b"]["ranges"][0].update(name="a@0"))
    return str(root / attempt)


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_aliased_range_after_its_owner_is_refused(tmp_path: Path, codec: str) -> None:
    """Item 5, R-SHARD-8: b's record names a's range; reading a first must not let b skip its check."""
    vdir = _aliased(tmp_path, codec)
    code = "PCK-SHARD-MISMATCH" if codec == "none" else "PCK-CODEC"
    ck = portable_ckpt.open(vdir)
    assert np.array_equal(ck.read("a"), np.arange(12, dtype=np.float32))
    expect_code(code, ck.read, "b")
    assert np.array_equal(ck.read("c"), np.arange(40, dtype=np.float32) + 1000)
    # A fresh reader: verify (deep) reports b whatever the order in which ranges are checked.
    errors = portable_ckpt.open(vdir).verify(deep=True)
    assert [e.code for e in errors] == [code], errors


def test_aliased_range_of_another_dtype_and_the_same_lengths_is_refused(tmp_path: Path) -> None:
    """R-SHARD-8 (traceability audit F4): the check is keyed by dtype too. A float64[10] whose
    record names an int64[10] range read after its owner must not deliver the int64 bytes as
    float64 values (a cache keyed by file, name, codec and lengths alone did)."""
    ints = np.arange(10, dtype=np.int64)
    floats = np.arange(10, dtype=np.float64) + 0.5
    attempt = write_version(str(tmp_path), [
        HandTensor("ints", "int64", (10,), [Piece((0,), (10,), ints.tobytes(), "none")]),
        HandTensor("alias", "float64", (10,), [Piece((0,), (10,), floats.tobytes(), "none")]),
    ])
    vdir = str(tmp_path / attempt)
    edit_manifest(vdir, lambda d: d["tensors"]["alias"]["ranges"][0].update(name="ints@0"))
    ck = portable_ckpt.open(vdir)
    assert np.array_equal(ck.read("ints"), ints)
    expect_code("PCK-SHARD-MISMATCH", ck.read, "alias")


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_aliased_range_partial_reads(tmp_path: Path, codec: str) -> None:
    """Item 5: a partial read of a (caching its frame) then of b: b is still checked."""
    vdir = _aliased(tmp_path, codec)
    ck = portable_ckpt.open(vdir)
    assert np.array_equal(ck.read("a", [2], [3]), np.arange(2, 5, dtype=np.float32))
    expect_code("PCK-SHARD-MISMATCH" if codec == "none" else "PCK-CODEC", ck.read, "b", [0], [1])


# -- item 12: a zstd frame longer than its range can need is refused before it is read ----------
def _long_frame_version(root: Path, frame_bytes: int) -> str:
    """A float32[1] zstd tensor whose stored frame is ``frame_bytes`` long (a sparse file).

    Only the first checksum block (header + frame start) carries a correct CRC: a reader that
    checks the frame length first never reads the rest.
    """
    import zstandard

    frame = zstandard.ZstdCompressor(write_content_size=True).compress(b"\x00\x00\x80\x3f")
    attempt = write_version(
        str(root), [HandTensor("w", "float32", (1,), [Piece((0,), (1,), frame, "zstd")])]
    )
    vdir = root / attempt
    rel = "data/w00000-0000.safetensors"
    from portable_ckpt.io.safetensors_io import build_header

    head = build_header([("w@0", "U8", [frame_bytes], frame_bytes)], {"format": "pt"})
    with open(vdir / rel, "wb") as f:
        f.write(head + frame)
        f.truncate(len(head) + frame_bytes)
    bs = 4096
    h = BlockHasher(bs)
    h.update((head + frame + bytes(bs))[:bs])
    nblocks = -(-(len(head) + frame_bytes) // bs)

    def fix(d: dict[str, Any]) -> None:
        d["files"][rel] = {
            "size": len(head) + frame_bytes,
            "checksum": {
                "algorithm": "crc32c",
                "block_size": bs,
                "blocks": h.blocks() + "0" * 8 * (nblocks - 1),
            },
        }

    edit_manifest(str(vdir), fix)
    return str(vdir)


def test_zstd_frame_longer_than_bound_is_refused_before_reading(tmp_path: Path) -> None:
    """Item 12, R-TENSOR-10: a 4-byte zstd tensor whose header gives its frame 1 GiB."""
    vdir = _long_frame_version(tmp_path, 1 << 30)
    with time_bound(5), memory_bound(SMALL_READ_BYTES):
        ck = portable_ckpt.open(vdir)
        err = expect_code("PCK-CODEC", ck.read, "w")
        assert "ZSTD_COMPRESSBOUND" in err.message or "bound" in err.message
        assert [e.code for e in ck.verify()] == ["PCK-CODEC"]


def test_zstd_frame_at_bound_is_accepted(tmp_path: Path) -> None:
    """Item 12: the bound is exactly ZSTD_COMPRESSBOUND: incompressible data stored raw passes."""
    from portable_ckpt.io.codec import zstd_bound

    assert [zstd_bound(n) for n in (0, 1, 4, 1 << 17, 1 << 20)] == [64, 64, 67, 131584, 1052672]
    rng = np.random.default_rng(0)
    for n in (1, 100, 4096, 200_000):
        arr = rng.integers(0, 256, n, dtype=np.uint8)
        root = tmp_path / str(n)
        portable_ckpt.save_arrays(str(root), {"x": arr}, step=1, codec="zstd")
        ck = portable_ckpt.open(str(root))
        st = ck._header(ck.tensors["x"].ranges[0].file).tensors["x@0"]
        assert st.end - st.start <= zstd_bound(n)
        assert np.array_equal(ck.read("x"), arr)


def _padded_frame(window_descriptor: bool) -> bytes:
    """A valid zstd frame of float32 1.0 (4 bytes, size declared) padded with 17 empty raw
    blocks: 67 bytes (single segment) or 68 (with a window descriptor byte)."""
    import struct

    head = bytes([0x80, 0x00]) if window_descriptor else bytes([0xA0])  # 4-byte content size
    return (struct.pack("<I", 0xFD2FB528) + head + struct.pack("<I", 4) + b"\0\0\0" * 17
            + struct.pack("<I", (4 << 3) | 1)[:3] + b"\x00\x00\x80\x3f")


def test_zstd_frame_one_byte_above_the_bound_is_refused(tmp_path: Path) -> None:
    """mutation audit 22 A-06: R-TENSOR-10 at its boundary: a valid frame of a 4-byte range
    stored in exactly ZSTD_COMPRESSBOUND(4) = 67 bytes reads; in 68 bytes it is PCK-CODEC."""
    import zstandard

    from portable_ckpt.io.codec import zstd_bound

    for pad, ok in ((False, True), (True, False)):
        frame = _padded_frame(pad)
        assert len(frame) == zstd_bound(4) + (0 if ok else 1)
        assert zstandard.ZstdDecompressor().decompress(frame) == b"\x00\x00\x80\x3f"
        root = tmp_path / str(pad)
        attempt = write_version(
            str(root), [HandTensor("w", "float32", (1,), [Piece((0,), (1,), frame, "zstd")])])
        ck = portable_ckpt.open(str(root / attempt))
        if ok:
            assert ck.read("w").tolist() == [1.0]
        else:
            err = expect_code("PCK-CODEC", ck.read, "w")
            assert "ZSTD_COMPRESSBOUND" in err.message


# -- item 13: reading part of a zstd range costs memory bounded by a window, not its size --------
def _rle_version(root: Path, total: int, **frame: Any) -> str:
    payload = rle_frame(total, byte=7, **frame)
    return str(
        root
        / write_version(
            str(root),
            [HandTensor("z", "uint8", (total,), [Piece((0,), (total,), payload, "zstd")])],
        )
    )


def test_small_read_of_huge_honest_frame_is_bounded(tmp_path: Path) -> None:
    """Item 13, R-TENSOR-11: a 32 KiB frame that honestly decodes to 1 GiB; one element costs a
    window, not the range."""
    vdir = _rle_version(tmp_path, 1 << 30)
    ck = portable_ckpt.open(vdir)
    with time_bound(20), memory_bound(SMALL_READ_BYTES):
        got = ck.read("z", [12345], [3])
    assert got.tolist() == [7, 7, 7]
    assert ck.stats.peak_scratch_bytes <= 16 << 20


def test_frame_with_huge_window_is_refused(tmp_path: Path) -> None:
    """Item 13, R-TENSOR-10: a single-segment frame declaring 16 GiB needs a 16 GiB window."""
    vdir = _rle_version(tmp_path, 1 << 34, single_segment=True)
    ck = portable_ckpt.open(vdir)
    with time_bound(5), memory_bound(SMALL_READ_BYTES):
        err = expect_code("PCK-CODEC", ck.read, "z", [0], [1])
    assert "window" in err.message


def test_streamed_frame_that_lies_about_its_size(tmp_path: Path) -> None:
    """Item 13: a large frame without a declared size that decodes to more than the range."""
    total = 40 << 20
    payload = rle_frame(total + 1, byte=1, content_size=None)
    vdir = str(
        tmp_path
        / write_version(
            str(tmp_path),
            [HandTensor("z", "uint8", (total,), [Piece((0,), (total,), payload, "zstd")])],
        )
    )
    with time_bound(10), memory_bound(SMALL_READ_BYTES):
        expect_code("PCK-CODEC", portable_ckpt.open(vdir).read, "z", [5], [1])
    short = rle_frame(total - 1, byte=1, content_size=None)
    vdir2 = str(
        tmp_path
        / "b"
        / write_version(
            str(tmp_path / "b"),
            [HandTensor("z", "uint8", (total,), [Piece((0,), (total,), short, "zstd")])],
        )
    )
    expect_code("PCK-CODEC", portable_ckpt.open(vdir2).read, "z", [5], [1])


def test_streamed_frame_with_trailing_bytes(tmp_path: Path) -> None:
    """Item 13: the streaming path still refuses bytes after the frame (R-TENSOR-7)."""
    total = 40 << 20
    payload = rle_frame(total, byte=1) + b"\x00" * 5
    vdir = str(
        tmp_path
        / write_version(
            str(tmp_path),
            [HandTensor("z", "uint8", (total,), [Piece((0,), (total,), payload, "zstd")])],
        )
    )
    err = expect_code("PCK-CODEC", portable_ckpt.open(vdir).read, "z", [5], [1])
    assert "after" in err.message


# -- item 13: the streaming path agrees with numpy on every box --------------------------------
_DTYPES = list(portable_ckpt.format.dtypes.DTYPES)  # every row (contributor review D7)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_streamed_box_equals_numpy(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """Any box of a zstd range read through tiny windows equals the same box of the array."""
    import zstandard

    from portable_ckpt.io import reader

    shape = tuple(data.draw(st.lists(st.integers(1, 7), min_size=1, max_size=4), label="shape"))
    dtype = data.draw(st.sampled_from(_DTYPES), label="dtype")
    offs = tuple(data.draw(st.integers(0, n - 1)) for n in shape)
    lens = tuple(data.draw(st.integers(1, n - o)) for n, o in zip(shape, offs, strict=True))
    window = data.draw(st.integers(1, 300), label="window")
    rng = np.random.default_rng(len(shape) * 1000 + window)
    npdt = portable_ckpt.format.dtypes.DTYPES[dtype].numpy
    arr = rng.integers(0, 4, size=shape).astype(npdt)  # few values: compressible, with matches
    frame = zstandard.ZstdCompressor(write_content_size=data.draw(st.booleans())).compress(
        arr.tobytes()
    )
    root = tmp_path_factory.mktemp("box")
    vdir = str(
        root
        / write_version(
            str(root),
            [HandTensor("t", dtype, shape, [Piece((0,) * len(shape), shape, frame, "zstd")])],
        )
    )
    isz = arr.dtype.itemsize
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reader, "ZSTD_WHOLE_BYTES", 0)
        mp.setattr(reader, "ZSTD_WINDOW_BYTES", max(isz, window))
        mp.setattr(reader, "ZSTD_INPUT_BYTES", 1)
        ck = portable_ckpt.open(vdir)
        got = ck.read("t", offs, lens)
        whole = ck.read("t")
    want = arr[tuple(slice(o, o + n) for o, n in zip(offs, lens, strict=True))]
    assert got.view(np.uint8).tobytes() == want.view(np.uint8).tobytes()
    assert whole.view(np.uint8).tobytes() == arr.view(np.uint8).tobytes()


@settings(max_examples=200, deadline=None)
@given(
    payload=st.binary(max_size=3000),
    level=st.integers(-5, 19),
    checksum=st.booleans(),
    size=st.booleans(),
    cut=st.integers(-8, 8),
)
def test_frame_walker_finds_the_frame_end(
    payload: bytes, level: int, checksum: bool, size: bool, cut: int
) -> None:
    """FrameWalker ends exactly where zstd's frame ends, fed in any pieces; cut or extended
    frames are PCK-CODEC in both decoders."""
    import zstandard

    from portable_ckpt.errors import CodecError
    from portable_ckpt.io.codec import FrameWalker, decompress_frame

    frame = zstandard.ZstdCompressor(
        level=level, write_checksum=checksum, write_content_size=size
    ).compress(payload * 3)
    w = FrameWalker("f")
    for i in range(0, len(frame) + 5, 7):
        w.feed((frame + b"trail")[i : i + 7])
    assert w.done and w.extent == len(frame)
    assert decompress_frame(frame, expect=len(payload) * 3, limit=1 << 20, what="f") == payload * 3
    bad = frame[:cut] if cut < 0 else frame + bytes(cut)
    if cut:
        with pytest.raises(CodecError):
            decompress_frame(bad, expect=len(payload) * 3, limit=1 << 20, what="f")


# -- item 11: a tensor table's size is checked before it is read --------------------------------
def _table_version(root: Path) -> str:
    from portable_ckpt.io.commit import commit
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id
    from portable_ckpt.storage import open_storage

    storage = open_storage(str(root), create=True)
    attempt = new_attempt_id(1)
    w = ShardWriter(storage, attempt, 0, write_index=False)
    w.add_tensor("w", np.arange(6, dtype=np.float32))
    commit(
        storage,
        attempt,
        step=1,
        indexes=[w.finish()],
        expected_writers=[0],
        continuation=portable_ckpt.Continuation("exact", 1, None),
        tensor_table=True,
    )
    return str(root / attempt)


def _table_file(vdir: str) -> str:
    doc = json.loads((Path(vdir) / "manifest.json").read_bytes())
    return next(k for k in doc["files"] if k.startswith("tensor-table"))


def _huge_table(vdir: str, codec: str, size: int = 5 << 30) -> None:
    """Make the table file ``size`` bytes (sparse); its checksums are wrong past the header."""
    rel = _table_file(vdir)
    with open(Path(vdir) / rel, "r+b") as f:
        f.truncate(size)

    def fix(d: dict[str, Any]) -> None:
        d["tensor_table"]["codec"] = codec
        d["files"][rel]["size"] = size
        d["files"][rel]["checksum"] = {
            "algorithm": "crc32c",
            "block_size": 1 << 30,
            "blocks": "0" * 8 * -(-size >> 30),
        }

    edit_manifest(vdir, fix)


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_huge_table_is_refused_before_it_is_read(tmp_path: Path, codec: str) -> None:
    """Item 11, R-TABLE-3: a 5 GiB (sparse) table file: PCK-LIMIT before any of it is read."""
    vdir = _table_version(tmp_path)
    _huge_table(vdir, codec)
    with time_bound(5), memory_bound(SMALL_READ_BYTES):
        expect_code("PCK-LIMIT", portable_ckpt.open, vdir)


def test_table_frame_longer_than_bound_is_refused(tmp_path: Path) -> None:
    """Item 11, R-TABLE-3/R-TENSOR-10: a zstd table whose frame is padded far past its bound."""
    from tests.hardening._util import rechecksum

    vdir = _table_version(tmp_path)
    rel = _table_file(vdir)
    with open(Path(vdir) / rel, "ab") as f:
        f.write(bytes(1 << 20))
    rechecksum(vdir, rel)
    err = expect_code("PCK-CODEC", portable_ckpt.open, vdir)
    assert "ZSTD_COMPRESSBOUND" in err.message


def test_inspect_of_huge_table_prints_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 11: `inspect` on such a version exits 1 with the code, no traceback."""
    from portable_ckpt.cli.main import main

    vdir = _table_version(tmp_path)
    _huge_table(vdir, "none")
    with time_bound(5), memory_bound(SMALL_READ_BYTES):
        assert main(["inspect", vdir]) == 1
    out = capsys.readouterr()
    assert "PCK-LIMIT" in out.out + out.err and "Traceback" not in out.err


# -- items 7 and 8: coverage costs bounded by the boxes, every layout -------------------------
def _coverage_code(shape: tuple[int, ...], boxes: list[Any], **kw: Any) -> str:
    from portable_ckpt.ranges import check_coverage

    try:
        check_coverage(shape, boxes, key="t", **kw)
    except CheckpointError as exc:
        return exc.code
    return "ok"


def _staircase(n: int) -> list[Any]:
    """Rows ``i`` up to the diagonal and columns above it: 2n - 1 boxes, no two alike."""
    from portable_ckpt.ranges import Box

    return [Box((i, 0), (1, i + 1)) for i in range(n)] + [Box((0, i), (i, 1)) for i in range(1, n)]


def test_staircase_layout_is_fast() -> None:
    """Item 8: a 4100 x 4100 staircase (8,199 boxes; one dropped: 10.8 s, and > 60 s on a loaded
    machine, before). Each verdict now takes well under a second (sweep of disjoint intervals)."""
    from portable_ckpt.ranges import Box

    boxes = _staircase(4100)
    with memory_bound(SMALL_READ_BYTES):
        assert _coverage_code((4100, 4100), boxes[:-1]) == "PCK-COVERAGE-GAP"
    cases = [(boxes, "ok"), (boxes[1:], "PCK-COVERAGE-GAP"),
             ([*boxes, Box((7, 3), (1, 1))], "PCK-COVERAGE-OVERLAP"),
             ([*boxes[:-1], Box((0, 4099), (4100, 1))], "PCK-COVERAGE-OVERLAP")]
    for bx, code in cases:
        with time_bound(5):
            assert _coverage_code((4100, 4100), bx) == code


def test_high_dimensional_layouts_are_fast() -> None:
    """Item 7: 16-d tensors (one box: a 6.75 GiB grid or 6-12 s before; 2^16 unit boxes)."""
    from portable_ckpt.ranges import Box, check_coverage_arrays

    one = [Box((0,) * 16, (1,) * 16)]
    halves = [Box((0,) * 15 + (h,), (2,) * 15 + (1,)) for h in (0, 1)]
    cases = [((3,) * 14 + (2, 2), one, "PCK-COVERAGE-GAP"),
             ((2,) * 16, halves, "ok"), ((2,) * 16, halves[:1], "PCK-COVERAGE-GAP"),
             ((2,) * 64, [Box((0,) * 64, (2,) * 63 + (1,))], "PCK-COVERAGE-GAP")]
    for shape, bx, code in cases:
        with time_bound(2), memory_bound(SMALL_READ_BYTES):
            assert _coverage_code(shape, bx) == code, (shape, len(bx))
    cells = np.array(list(itertools.product((0, 1), repeat=16)), dtype=np.int64)
    ones = np.ones_like(cells)
    dup = np.concatenate([cells, cells[77:78]])
    for offs, lens, code in [(cells, ones, "ok"), (cells[1:], ones[1:], "PCK-COVERAGE-GAP"),
                             (dup, np.ones_like(dup), "PCK-COVERAGE-OVERLAP")]:
        with time_bound(10), memory_bound(SMALL_READ_BYTES):
            try:
                check_coverage_arrays((2,) * 16, offs, lens, key="t")
                got = "ok"
            except CheckpointError as exc:
                got = exc.code
        assert got == code


def _brute(shape: tuple[int, ...], boxes: list[Any]) -> str:
    """The spec's verdict (R-COVER-3) by counting every element."""
    for b in boxes:
        if len(b.offsets) != len(shape) or not all(
                o >= 0 and n >= 1 and o + n <= s for o, n, s in zip(b.offsets, b.lengths, shape)):
            return "PCK-RANGE-BOUNDS"
    if math.prod(shape) == 0:
        return "PCK-RANGE-BOUNDS" if boxes else "ok"
    counts = np.zeros(shape, dtype=np.int64)
    for b in boxes:
        counts[b.slices()] += 1
    return ("PCK-COVERAGE-OVERLAP" if (counts > 1).any()
            else "PCK-COVERAGE-GAP" if (counts == 0).any() else "ok")


@st.composite
def _layouts(draw: st.DrawFn) -> tuple[tuple[int, ...], list[Any]]:
    """A shape of 0-16 dimensions (at most 4096 elements) and boxes: a guillotine partition or
    a grid, then damaged (dropped, duplicated, grown, shifted boxes, random boxes)."""
    from portable_ckpt.ranges import Box

    nd = draw(st.integers(0, 16))
    shape: list[int] = []
    for _ in range(nd):
        room = 4096 // max(1, math.prod(shape))
        shape.append(draw(st.integers(1, max(1, min(6, room)))))
    if nd and draw(st.integers(0, 30)) == 0:
        shape[draw(st.integers(0, nd - 1))] = 0
    boxes = [Box((0,) * nd, tuple(shape))] if math.prod(shape) else []
    if boxes and draw(st.booleans()):  # grid: per-dimension cuts
        axes = []
        for s in shape:
            cuts = sorted(set(draw(st.lists(st.integers(1, max(1, s - 1)), max_size=2)) or [s]))
            edges = [0] + [c for c in cuts if 0 < c < s] + [s]
            axes.append(list(itertools.pairwise(edges)))
        boxes = [Box(tuple(a for a, _ in cell), tuple(b - a for a, b in cell))
                 for cell in itertools.product(*axes)]
    elif boxes:  # guillotine: split random boxes at random planes
        for _ in range(draw(st.integers(0, 12))):
            i = draw(st.integers(0, len(boxes) - 1))
            b = boxes[i]
            ds = [d for d in range(nd) if b.lengths[d] > 1]
            if not ds:
                continue
            d = draw(st.sampled_from(ds))
            c = draw(st.integers(1, b.lengths[d] - 1))
            lo = Box(b.offsets, b.lengths[:d] + (c,) + b.lengths[d + 1:])
            hi = Box(b.offsets[:d] + (b.offsets[d] + c,) + b.offsets[d + 1:],
                     b.lengths[:d] + (b.lengths[d] - c,) + b.lengths[d + 1:])
            boxes[i:i + 1] = [lo, hi]
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["drop", "dup", "grow", "shift", "random", "outside"]))
        if kind == "random" or not boxes:
            if nd and math.prod(shape):
                o = tuple(draw(st.integers(0, s - 1)) for s in shape)
                boxes.append(Box(o, tuple(draw(st.integers(1, s - x)) for s, x in zip(shape, o))))
            continue
        i = draw(st.integers(0, len(boxes) - 1))
        b = boxes[i]
        if kind == "drop":
            boxes.pop(i)
        elif kind == "dup":
            boxes.append(b)
        elif kind in ("grow", "shift", "outside") and nd:
            d = draw(st.integers(0, nd - 1))
            if kind == "grow":
                nb = Box(b.offsets, b.lengths[:d] + (b.lengths[d] + 1,) + b.lengths[d + 1:])
            elif kind == "shift":
                nb = Box(b.offsets[:d] + (b.offsets[d] + 1,) + b.offsets[d + 1:], b.lengths)
            else:
                nb = Box(b.offsets[:d] + (-1,) + b.offsets[d + 1:], b.lengths)
            boxes[i] = nb
    return tuple(shape), boxes


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(_layouts())
def test_coverage_agrees_with_brute_force(layout: tuple[tuple[int, ...], list[Any]]) -> None:
    """Items 7/8 (R-COVER-3, R-COVER-4): every strategy (grid, counting, sweep of intervals,
    vectorised sweep) gives the verdict of counting every element, 0-16 dimensions."""
    shape, boxes = layout
    want = _brute(shape, boxes)
    assert _coverage_code(shape, boxes) == want
    assert _coverage_code(shape, boxes, max_grid_cells=0) == want
    from portable_ckpt.ranges import coverage

    with pytest.MonkeyPatch.context() as mp:  # the overlap sweep alone, then the tiling sweep
        mp.setattr(coverage, "TERM_LIMIT", 0)
        assert _coverage_code(shape, boxes, max_grid_cells=0) == want
        mp.setattr(coverage, "TERM_LIMIT", 1 << 25)
        mp.setattr(coverage, "WORK_LIMIT", 0)
        got = _coverage_code(shape, boxes, max_grid_cells=0)
    total = sum(b.volume for b in boxes)
    if total == math.prod(shape) or want in ("PCK-RANGE-BOUNDS", "ok"):
        assert got == want


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(_layouts(), st.integers(0, 200))
def test_coverage_budget_outcomes(layout: tuple[tuple[int, ...], list[Any]], limit: int) -> None:
    """R-COVER-4: with the sweep's budget exhausted the verdict is still true: a gap decided by
    the volumes, an overlap decided by them, or PCK-LIMIT when only the sweep could decide."""
    from portable_ckpt.ranges import coverage

    shape, boxes = layout
    want = _brute(shape, boxes)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(coverage, "WORK_LIMIT", limit)
        mp.setattr(coverage, "TERM_LIMIT", limit * 8)
        got = _coverage_code(shape, boxes, max_grid_cells=0)
    total = sum(b.volume for b in boxes)
    allowed = {want}
    if want == "PCK-COVERAGE-OVERLAP" and total < math.prod(shape):
        allowed.add("PCK-COVERAGE-GAP")  # both rules broken; the overlap was not established
    if want in ("ok", "PCK-COVERAGE-OVERLAP") and total == math.prod(shape):
        allowed.add("PCK-LIMIT")
    assert got in allowed, (got, want)


# -- items 9 and 10: entry values and their schemas cost work bounded by the value ------------
def _entry_version(root: Path, schema: Any, payload: bytes, encoding: str = "json") -> Any:
    """A version whose entry ``e`` has the given embedded schema and stored bytes."""
    portable_ckpt.save_arrays(str(root), {"w": np.zeros(2, np.float32)}, step=1,
                              entries={"e": 0})
    vdir = next(p for p in root.iterdir() if p.name.startswith("s"))
    rel = "entries/hostile.g.json" + (".zst" if encoding == "json+zstd" else "")
    (vdir / rel).write_bytes(payload)
    h = BlockHasher(4096)
    h.update(payload)

    def edit(d: dict[str, Any]) -> None:
        d["files"][rel] = {"size": len(payload), "checksum": {
            "algorithm": "crc32c", "block_size": 4096, "blocks": h.blocks()}}
        d["entries"]["e"].update(schema={"json_schema": schema}, encoding=encoding,
                                 values=[{"file": rel}])

    edit_manifest(str(vdir), edit)
    return portable_ckpt.open(str(vdir))


def _fan_out(depth: int, leaf: Any) -> dict[str, Any]:
    """Definitions each referring to the next twice: 2^depth evaluations without a budget."""
    defs = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(depth)}
    defs[f"d{depth}"] = leaf
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def test_schema_ref_fan_out_is_bounded(tmp_path: Path) -> None:
    """Item 9, R-ENTRY-16: a 1.6 KB schema of 25 definitions each referring twice to the next
    never finished; now PCK-ENTRY-SCHEMA after the budget, the same verdict every time."""
    schema = _fan_out(25, {"type": "integer"})
    assert len(json.dumps(schema, separators=(",", ":"))) < 1700
    ck = _entry_version(tmp_path, schema, b"1")
    for _ in range(2):
        with time_bound(20):
            err = expect_code("PCK-ENTRY-SCHEMA", ck.entry, "e")
        assert "R-ENTRY-16" in err.message


@pytest.mark.parametrize("keyword", ["unevaluatedProperties", "unevaluatedItems"])
def test_schema_unevaluated_fan_out_is_bounded(tmp_path: Path, keyword: str) -> None:
    """Item 9: jsonschema's unevaluated* helpers follow $ref chains outside any keyword count."""
    leaf = {"properties": {"a": {}}} if keyword == "unevaluatedProperties" else {"prefixItems": [{}]}
    schema = {**_fan_out(40, leaf), keyword: False}
    ck = _entry_version(tmp_path, schema, b'{"a": 1}' if "Prop" in keyword else b"[1]")
    with time_bound(20):
        expect_code("PCK-ENTRY-SCHEMA", ck.entry, "e")


def test_schema_enum_against_many_items_is_linear(tmp_path: Path) -> None:
    """Item 9: items: {enum: [6000 values]} against 6000 items (killed at 8 s before)."""
    schema = {"type": "array", "items": {"enum": list(range(6000))}}
    ck = _entry_version(tmp_path, schema, json.dumps(list(range(6000))).encode())
    with time_bound(10):
        assert ck.entry("e") == list(range(6000))
    bad = _entry_version(tmp_path / "b", schema, json.dumps([*range(5999), 6000]).encode())
    expect_code("PCK-ENTRY-SCHEMA", bad.entry, "e")


def test_unevaluated_properties_patterns_use_linear_engine(tmp_path: Path) -> None:
    """Item 9, R-ENTRY-15: jsonschema's unevaluatedProperties matched patternProperties with the
    backtracking `re` module: ^(a+)+$ against 'aaa…a!' stalled validation."""
    schema = {"patternProperties": {"^(a+)+$": {}}, "unevaluatedProperties": False}
    ck = _entry_version(tmp_path, schema, json.dumps({"a" * 40 + "!": 1}).encode())
    with time_bound(5):
        expect_code("PCK-ENTRY-SCHEMA", ck.entry, "e")


_SCHEMA_PARTS = st.deferred(lambda: st.one_of(
    st.just({}), st.just(True), st.just(False),
    st.sampled_from([{"type": t} for t in ("integer", "number", "string", "array", "object")]),
    st.lists(st.one_of(st.integers(-2, 2), st.text("ab", max_size=2), st.lists(
        st.integers(0, 2), max_size=2)), max_size=4).map(lambda v: {"enum": v}),
    st.one_of(st.integers(0, 2), st.lists(st.integers(0, 2), max_size=2)).map(
        lambda v: {"const": v}),
    st.dictionaries(st.sampled_from("abc"), _SCHEMA_PARTS, max_size=2).map(
        lambda p: {"properties": p}),
    st.tuples(st.dictionaries(st.sampled_from(["^a", "b$", "^(a|b)+$"]), _SCHEMA_PARTS,
                              max_size=2), st.booleans()).map(
        lambda t: {"patternProperties": t[0], "unevaluatedProperties": t[1]}),
    st.tuples(st.lists(_SCHEMA_PARTS, max_size=2), st.booleans()).map(
        lambda t: {"prefixItems": t[0], "unevaluatedItems": t[1]}),
    st.tuples(st.sampled_from(["allOf", "anyOf", "oneOf"]),
              st.lists(_SCHEMA_PARTS, min_size=1, max_size=2)).map(lambda t: {t[0]: t[1]}),
    st.just({"uniqueItems": True}), st.just({"contains": {"type": "integer"}}),
    st.tuples(_SCHEMA_PARTS, st.booleans()).map(
        lambda t: {"properties": {"x": t[0]}, "additionalProperties": t[1]}),
))
_VALUES = st.recursive(st.one_of(st.integers(-2, 2), st.sampled_from([1.0, "a", "ab", "b", True,
                                                                     None])),
                       lambda c: st.one_of(st.lists(c, max_size=3),
                                           st.dictionaries(st.sampled_from(["a", "b", "x", "ab"]),
                                                           c, max_size=3)), max_leaves=8)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(_SCHEMA_PARTS, _VALUES)
def test_metered_validator_agrees_with_jsonschema(schema: Any, value: Any) -> None:
    """Item 9: the metered keywords (hashed enum/const, set-based unevaluated*) give
    jsonschema's verdicts."""
    import jsonschema

    from portable_ckpt.errors import EntrySchemaError
    from portable_ckpt.format.schemas import validate_entry_value

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError:
        return  # an invalid schema is PCK-ENTRY-SCHEMA for every value (R-ENTRY-3)
    want = jsonschema.Draft202012Validator(schema).is_valid(value)
    try:
        validate_entry_value(value, {"json_schema": schema}, name="e")
        got = True
    except EntrySchemaError:
        got = False
    assert got == want, (schema, value)


def _bomb(n_bytes: int) -> bytes:
    return b"[" + b"{}," * (n_bytes // 3 - 1) + b"{}]"


@pytest.mark.parametrize(("size", "level"), [(64 << 20, 19), (8 << 20, 19)])
def test_json_zstd_bomb_is_refused_before_it_is_built(tmp_path: Path, size: int, level: int) -> None:
    """Item 10, R-SEC-15: 64 MiB (from 5.6 KB) or 8 MiB (from 718 bytes) of `[{},{},…]`: 1.9 GB
    RSS / 2 s and 450 MiB before; now PCK-JSON-INVALID from a count of the text."""
    import zstandard

    text = _bomb(size - 1)
    frame = zstandard.ZstdCompressor(level=level, write_content_size=True).compress(text)
    assert len(frame) < 8000
    ck = _entry_version(tmp_path, {}, frame, "json+zstd")
    with time_bound(20), memory_bound(3 * size + (16 << 20)):
        err = expect_code("PCK-JSON-INVALID", ck.entry, "e")
    assert "JSON values" in err.message


def test_value_at_the_node_limit_is_read(tmp_path: Path) -> None:
    """R-SEC-15: exactly 2^21 values pass, one more is refused (reader and writer agree)."""
    from portable_ckpt.format import jsonio
    from portable_ckpt.format.schemas import validate_entry_value

    n = jsonio.MAX_VALUE_NODES
    assert n == 2_097_152  # the spec's number, not the code's (traceability audit F5)
    ok = b"[" + b"0," * (n - 2) + b"0]"
    assert jsonio.count_values(ok) == n
    assert len(jsonio.loads(ok, what="v", max_nodes=n)) == n - 1
    over = b"[" + b"0," * (n - 1) + b"0]"
    expect_code("PCK-JSON-INVALID", jsonio.loads, over, what="v", max_nodes=n)
    expect_code("PCK-JSON-INVALID", validate_entry_value, [0] * n, {"id": "pck:json/1"}, name="e")


_JSON_TEXT = st.recursive(
    st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.booleans(),
              st.none(), st.text(alphabet='ab,[]{}:"\\ \n\u00e9', max_size=6)),
    lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(
        st.text(alphabet='k,[]{}"\\', max_size=3), c, max_size=4)), max_leaves=30)


@settings(max_examples=150, deadline=None)
@given(_JSON_TEXT, st.sampled_from([None, 1, 2]), st.sampled_from([1, 3, 7, 64, 1 << 20]))
def test_count_values_equals_the_parse(value: Any, indent: int | None, chunk: int) -> None:
    """R-SEC-15: the count on the text equals the values json.loads builds, in any windows."""
    from portable_ckpt.format import jsonio

    text = json.dumps(value, indent=indent, ensure_ascii=False).encode()
    assert jsonio.count_values(text, chunk=chunk) == json_values(value)


# -- items 14-16: conversion sources cost work and output bounded by their bytes -------------
def _torch_zip(path: Path, pkl: bytes, *, method: int | None = None, declared: int | None = None,
               members: dict[str, bytes] | None = None) -> None:
    """A torch.save-shaped zip: ``archive/data.pkl`` (optionally compressed, with a lying
    declared size in the central directory), ``archive/byteorder`` and extra members."""
    import zipfile

    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(zipfile.ZipInfo("archive/data.pkl"), pkl,
                    compress_type=method if method is not None else zipfile.ZIP_STORED)
        zf.writestr("archive/byteorder", b"little")
        for name, data in (members or {}).items():
            zf.writestr(name, data)
    if declared is not None:  # patch the uncompressed size of data.pkl in the central directory
        raw = bytearray(path.read_bytes())
        cd = raw.rfind(b"PK\x01\x02", 0, raw.rfind(b"archive/byteorder"))
        raw[cd + 24 : cd + 28] = declared.to_bytes(4, "little")
        path.write_bytes(bytes(raw))


def _shared_pickle(depth: int) -> bytes:
    """``x = [x, x]`` ``depth`` times, pickled with its memo: 2^depth leaves in a few bytes."""
    import pickle

    x: Any = []
    for _ in range(depth):
        x = [x, x]
    return pickle.dumps({"optim": x, "step": 3}, protocol=2)


def test_torch_pickle_memo_sharing_is_bounded(tmp_path: Path) -> None:
    """Item 14: a 317-byte data.pkl of x = [x, x] forty times never returned (walks were
    depth-bounded, not size-bounded): PCK-LIMIT now, before anything is written."""
    from portable_ckpt.convert import convert

    pkl = _shared_pickle(40)
    assert len(pkl) < 400
    src = tmp_path / "bomb.pt"
    _torch_zip(src, pkl)
    with time_bound(30):  # about 2^16 visits: well under a second on an idle machine
        err = expect_code("PCK-LIMIT", convert, str(src), str(tmp_path / "out"), src_format="torch")
    assert "shared references" in err.message
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_torch_pickle_legit_sharing_converts(tmp_path: Path) -> None:
    """Item 14: a moderately shared value (2^10 leaves from 12 levels) still converts."""
    from portable_ckpt.convert import convert

    src = tmp_path / "ok.pt"
    _torch_zip(src, _shared_pickle(10))
    convert(str(src), str(tmp_path / "out"), src_format="torch", keys="verbatim")
    value = portable_ckpt.open(str(tmp_path / "out")).entry("value")  # no tensors: one entry
    assert value["step"] == 3 and len(json.dumps(value["optim"])) > 1000
    # mapped keys (the default): one leaf per path, as portable_ckpt.torch.save writes them
    convert(str(src), str(tmp_path / "mapped"), src_format="torch")
    leaves = portable_ckpt.open(str(tmp_path / "mapped")).entry("torch.values")
    assert leaves["step"] == 3 and len(leaves) == 1 + 2**10


def test_dcp_metadata_shared_chunk_lists_are_bounded() -> None:
    """Item 14: a .metadata whose 20,000 tensors share one 2,000-chunk list (memo) walked
    4 * 10^7 chunks; its budget (4 values per byte) ends it with PCK-LIMIT."""
    from portable_ckpt.convert._dcp_meta import parse_dcp_metadata
    from tests.convert import _dcp_pickles as dp

    md = dp.metadata({"t": ("float32", (2000,), [((i,), (1,), "__0_0.distcp", i * 4, 4)
                                                  for i in range(2000)])})
    shared = md.state_dict_metadata["t"]  # type: ignore[attr-defined]
    md.state_dict_metadata = {f"t{i}": shared for i in range(20000)}  # type: ignore[attr-defined]
    data = dp.dumps(md, 4)
    assert len(data) < 1 << 20
    with time_bound(20):
        expect_code("PCK-LIMIT", parse_dcp_metadata, data, path="x/.metadata")


@pytest.mark.parametrize("method", ["deflate", "bzip2"])
def test_torch_zip_compressed_pickle_is_refused(tmp_path: Path, method: str) -> None:
    """Item 15: a data.pkl compressed to ~1 KB that declares 25 bytes and inflates to 64 MiB
    (1 GiB in the issue) was inflated in one call; torch.save writes no compressed member."""
    import zipfile

    from portable_ckpt.convert import convert

    # bzip2 compresses slowly: a smaller bomb shows the same refusal.
    bomb = b"\x80\x02}q\x00." + bytes((64 if method == "deflate" else 8) << 20)
    src = tmp_path / "bomb.pt"
    kind = zipfile.ZIP_DEFLATED if method == "deflate" else zipfile.ZIP_BZIP2
    _torch_zip(src, bomb, method=kind, declared=25)
    assert src.stat().st_size < 100_000
    with time_bound(10), memory_bound(SMALL_READ_BYTES):
        err = expect_code("PCK-CODEC", convert, str(src), str(tmp_path / "out"), src_format="torch")
    assert "compressed" in err.message


def test_torch_expanded_view_needs_allow_expand(tmp_path: Path) -> None:
    """Item 16: zeros(1).expand(2^20, 2^20) (1.5 KB) converted as a 4 TiB tensor and wrote
    256 MiB before it was stopped. Views repeating stored elements are refused unless allowed,
    and the output is bounded relative to the source before anything is written."""
    torch = pytest.importorskip("torch")
    from portable_ckpt.convert import convert

    src = tmp_path / "expand.pt"
    torch.save({"w": torch.zeros(1).expand(2**20, 2**20)}, src)
    assert src.stat().st_size < 4096
    out = tmp_path / "out"
    with time_bound(10), memory_bound(SMALL_READ_BYTES):
        err = expect_code("PCK-UNSUPPORTED-VALUE", convert, str(src), str(out), src_format="torch")
        assert "allow_expand" in err.message
        expect_code("PCK-LIMIT", convert, str(src), str(out), src_format="torch", allow_expand=True)
    assert not out.exists() or not any(p.suffix == ".safetensors" for p in out.rglob("*"))
    small = tmp_path / "small.pt"
    torch.save({"w": torch.arange(3.0).expand(4, 3)}, small)
    expect_code("PCK-UNSUPPORTED-VALUE", convert, str(small), str(tmp_path / "o2"), src_format="torch")
    convert(str(small), str(tmp_path / "o3"), src_format="torch", allow_expand=True)
    got = portable_ckpt.open(str(tmp_path / "o3")).read("w")
    assert got.tolist() == [[0.0, 1.0, 2.0]] * 4
    with pytest.raises(CheckpointError) as info:  # an explicit bound below the output
        convert(str(small), str(tmp_path / "o4"), src_format="torch", allow_expand=True,
                max_output_bytes=16)
    assert info.value.code == "PCK-LIMIT"


def test_torch_zip_storage_member_past_its_window_is_refused(tmp_path: Path) -> None:
    """Mutation audit B Z05 (mut-05): a storage member whose declared size runs past the end
    of its zip's window is refused (PCK-FILE-SIZE) even where the file goes on: a DCP chunk is
    one zip inside a larger .distcp, and the next item's bytes were read as tensor data."""
    import io
    import os
    import zipfile

    torch = pytest.importorskip("torch")
    from portable_ckpt.convert._torchzip import parse_torch_zip
    from portable_ckpt.errors import FileSizeError

    def saved(t: Any) -> bytes:
        buf = io.BytesIO()
        torch.save(t, buf)
        return buf.getvalue()

    # data.pkl: a (4,) view of a 256-element storage (1 KiB); the member, written last, holds
    # 16 bytes of it and the central directory says 1024, so the sizes agree with the pickle
    # and only the window (about 400 bytes of central directory after the member) bounds it.
    src = zipfile.ZipFile(io.BytesIO(saved(torch.arange(256.0)[:4])))
    out = io.BytesIO()
    with src, zipfile.ZipFile(out, "w") as zf:
        infos = sorted(src.infolist(), key=lambda i: i.filename.endswith("/data/0"))
        for info in infos:
            data = src.read(info)
            zf.writestr(info.filename, data[:16] if info.filename.endswith("/data/0") else data)
    first, second = bytearray(out.getvalue()), saved(torch.full((512,), 7.0))
    name = first.rfind(b"/data/0")
    cd = first.rfind(b"PK\x01\x02", 0, name)
    assert cd > 0 and int.from_bytes(first[cd + 24 : cd + 28], "little") == 16
    assert len(first) - first.find(b"/data/0") < 1024
    for at in (cd + 20, cd + 24):  # compressed and uncompressed size: 16 -> 1024 bytes
        first[at : at + 4] = (1024).to_bytes(4, "little")
    path = tmp_path / "two.distcp"
    path.write_bytes(bytes(first) + second)  # the first zip's member now ends in the second
    fd = os.open(path, os.O_RDONLY)
    try:
        assert parse_torch_zip(fd, len(first), len(second), where="x").shape == (512,)
        with pytest.raises(FileSizeError, match="extends past"):
            parse_torch_zip(fd, 0, len(first), where="x")
    finally:
        os.close(fd)


def _edited_torch_save(path: Path, tensor: Any, *, ints: dict[int, int] | None = None,
                       drop_int: int | None = None, byteorder: bytes | None = None,
                       data: bytes | None = None, compress: str | None = None,
                       prefix: str = "archive/") -> Path:
    """``torch.save({"w": tensor})`` to ``path``, its zip rewritten member by member with edits:
    ``ints`` replaces the integer arguments of data.pkl by their position (0: the storage's
    element count, 1: the storage offset, then the sizes and the strides), ``drop_int`` removes
    one, ``byteorder``/``data`` replace those members, ``compress`` deflates the member of that
    name and ``prefix`` moves every member under another folder."""
    import io
    import pickletools
    import struct
    import zipfile

    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save({"w": tensor}, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    pkl = src.read("archive/data.pkl")
    edits, n = [], 0
    sizes = {"BININT1": 2, "BININT2": 3, "BININT": 5}
    for op, _arg, pos in pickletools.genops(pkl):
        if op.name in sizes:
            if ints and n in ints:
                edits.append((pos, sizes[op.name], b"J" + struct.pack("<i", ints[n])))
            if drop_int == n:
                edits.append((pos, sizes[op.name], b""))
            n += 1
    for pos, size, new in sorted(edits, reverse=True):
        pkl = pkl[:pos] + new + pkl[pos + size :]
    with src, zipfile.ZipFile(path, "w") as zf:
        for info in src.infolist():
            leaf = info.filename.split("/", 1)[1]
            body = {"data.pkl": pkl, "byteorder": byteorder, "data/0": data}.get(leaf)
            kind = zipfile.ZIP_DEFLATED if compress == leaf else zipfile.ZIP_STORED
            zf.writestr(zipfile.ZipInfo(prefix + leaf), src.read(info) if body is None else body,
                        compress_type=kind)
    return path


_FIVE = np.arange(5.0, dtype=np.float32)


@pytest.mark.parametrize(("edit", "code", "says"), [
    pytest.param({}, None, "", id="unedited"),
    pytest.param({"byteorder": b"big", "data": _FIVE.astype(">f4").tobytes()},
                 "PCK-SHARD-HEADER", "big-endian", id="B2-08-big-endian"),
    # torch.load takes b"little" and b"big" only (mutation audit 30's observation)
    pytest.param({"byteorder": b""}, "PCK-SHARD-HEADER", "neither", id="byteorder-empty"),
    pytest.param({"byteorder": b" little\n"}, "PCK-SHARD-HEADER", "neither",
                 id="byteorder-padded"),
    pytest.param({"compress": "data/0"}, "PCK-CODEC", "compressed", id="B2-10-deflated-storage"),
    pytest.param({"ints": {0: 6}}, "PCK-SHARD-HEADER", "disagrees", id="B2-11-numel-6-of-20-bytes"),
    pytest.param({"ints": {1: 4, 3: -1}}, "PCK-SHARD-HEADER", "shape/stride", id="B2-13-stride-minus-1"),
    pytest.param({"ints": {1: 2}}, "PCK-SHARD-HEADER", "exceeds", id="B2-15-one-element-past"),
    pytest.param({"ints": {1: -1, 2: 2}}, "PCK-SHARD-HEADER", "exceeds", id="B2-16-offset-minus-1"),
    pytest.param({"prefix": "archive/inner/"}, "PCK-SHARD-HEADER", "single data.pkl",
                 id="B2-18-nested-data-pkl"),
    pytest.param({"drop_int": 0}, "PCK-SHARD-HEADER", "storage reference", id="B2-19-4-item-pid"),
])
def test_torch_zip_inconsistent_with_its_storage_is_refused(
    tmp_path: Path, edit: dict[str, Any], code: str | None, says: str
) -> None:
    """mutation audit 22 B2-08, B2-10, B2-11, B2-13, B2-15, B2-16, B2-18, B2-19: a real
    ``torch.save`` of ``arange(5.)[1:]`` (a (4,) view at offset 1 of a 5-element storage) with
    one edit is refused with a named code before a value is read, where each mutant converted
    garbage or raised a bare error: byteorder "big" (with big-endian data: values byte-swapped),
    a deflated storage member (compressed bytes read as floats), a storage element count that
    disagrees with its 20 bytes, stride -1 (refused as an expand view instead), a view ending
    one element past its storage (offset 2: reads the bytes after it), storage offset -1 (reads
    the zip header before it), data.pkl one folder deeper than torch writes it, and a storage
    reference of 4 items (a bare ValueError). Unedited, the rewritten zip converts."""
    from portable_ckpt.convert import convert

    torch = pytest.importorskip("torch")
    src = _edited_torch_save(tmp_path / "w.pt", torch.from_numpy(_FIVE)[1:], **edit)
    out = tmp_path / "out"
    with time_bound(10):
        if code is None:
            convert(str(src), str(out), src_format="torch")
            assert portable_ckpt.open(str(out)).read("w").tolist() == [1.0, 2.0, 3.0, 4.0]
            return
        err = expect_code(code, convert, str(src), str(out), src_format="torch")
    assert says in err.message
    assert not out.exists() or not any(p.suffix == ".safetensors" for p in out.rglob("*"))


@pytest.mark.parametrize("damage", ["byteorder-header", "pickle-header", "encrypted", "crc"])
def test_torch_zip_damaged_member_is_a_checkpoint_error(tmp_path: Path, damage: str) -> None:
    """Found by the fuzz target of torch.save sources (issue 12 "Done means"): a damaged local
    header of ``archive/byteorder`` raised a bare ``zipfile.BadZipFile`` from ``open_source``, an
    "encrypted" flag on ``data.pkl`` a bare ``RuntimeError``; both now PCK-SHARD-HEADER, like a
    damaged header of ``data.pkl`` already was. A recorded CRC-32 that its bytes do not match is
    PCK-CHECKSUM, as for every member (conversion review M2)."""
    import pickle

    from portable_ckpt.convert import open_source

    src = tmp_path / "m.pt"
    _torch_zip(src, pickle.dumps({"lr": 0.1}, protocol=2))
    raw = bytearray(src.read_bytes())
    member = "archive/byteorder" if damage == "byteorder-header" else "archive/data.pkl"
    local = raw.find(member.encode()) - 30  # the first occurrence: the local header
    central = raw.rfind(b"PK\x01\x02", 0, raw.rfind(member.encode()))
    if damage.endswith("header"):
        raw[local : local + 4] = b"PK\x07\x07"
    elif damage == "encrypted":
        raw[central + 8] |= 1  # general purpose flag bit 0 in the central directory
    else:
        raw[central + 16] ^= 0xFF  # the recorded CRC-32 of data.pkl
    src.write_bytes(bytes(raw))
    with time_bound(10):
        code = "PCK-CHECKSUM" if damage == "crc" else "PCK-SHARD-HEADER"
        expect_code(code, open_source, str(src), "torch")


@pytest.mark.parametrize("fmt", ["torch", None])
def test_zip_end_record_spanning_disks_is_a_checkpoint_error(tmp_path: Path, fmt: str | None) -> None:
    """Found by the long fuzz run (seed 12, input 3117): ``zipfile.is_zipfile`` raises
    ``BadZipFile`` for a zip64 end locator naming two disks instead of answering; the torch
    reader and format detection let it escape. Such a file is a damaged zip (PCK-SHARD-HEADER)."""
    import struct

    from portable_ckpt.convert import open_source

    src = tmp_path / "m.pt"
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, 0, 2)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0, 0, 0, 0, 0)
    src.write_bytes(b"PK\x03\x04" + bytes(40) + locator + end)
    with time_bound(10):
        expect_code("PCK-SHARD-HEADER", open_source, str(src), fmt)


@pytest.mark.parametrize("fmt", ["torch", None])
def test_zip_needing_a_newer_version_is_a_checkpoint_error(tmp_path: Path, fmt: str | None) -> None:
    """Found by the long fuzz run (seed 12, input 12465): a central directory entry whose
    "version needed to extract" is 6.7 makes ``zipfile.ZipFile`` raise ``NotImplementedError``."""
    import pickle

    from portable_ckpt.convert import open_source

    src = tmp_path / "m.pt"
    _torch_zip(src, pickle.dumps({"lr": 0.1}, protocol=2))
    raw = bytearray(src.read_bytes())
    central = raw.rfind(b"PK\x01\x02", 0, raw.rfind(b"archive/data.pkl"))
    raw[central + 6] = 67  # version needed to extract: 6.7
    src.write_bytes(bytes(raw))
    with time_bound(10):
        expect_code("PCK-SHARD-HEADER", open_source, str(src), fmt)


def _fan_out_to_a_type_error(depth: int) -> dict[str, Any]:
    defs: dict[str, Any] = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2}
                            for i in range(depth)}
    defs[f"d{depth}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def test_schema_error_messages_are_metered(tmp_path: Path) -> None:
    """Found by the long fuzz run (seed 12, input 4532), R-ENTRY-16: jsonschema writes the
    instance's repr into every error, and ``anyOf`` keeps its branches' errors; a ``$ref``
    fan-out ending in ``{"type": "string"}`` against a 5,000-item array stayed within its unit
    budget while formatting ~100 MB of messages (6.6 s CPU, 231 MiB). Messages are charged too."""
    from portable_ckpt.format.schemas import validate_entry_value

    schema = {"json_schema": _fan_out_to_a_type_error(20)}
    # CPU and memory in separate passes: tracemalloc (memory_bound) multiplies the cost of every
    # allocation (this validation's 0.29 s of CPU becomes 3.5 s under it), so a CPU bound on a
    # combined pass measured the instrument, and failed on slower CI machines.
    with time_bound(120), cpu_bound(5):
        err = expect_code("PCK-ENTRY-SCHEMA", validate_entry_value, list(range(5000)), schema, name="e")
    with time_bound(120), memory_bound(24 << 20):
        again = expect_code("PCK-ENTRY-SCHEMA", validate_entry_value, list(range(5000)), schema,
                        name="e")
    assert "keyword evaluations" in err.message and again.message == err.message


@pytest.mark.parametrize("nested", [False, True])
def test_checker_schema_error_messages_are_metered(nested: bool) -> None:
    """The conformance checker's metered validator had the same unmetered error messages (it
    charges the instance's length per keyword: a flat array is caught, ``[[0, …, 4999]]`` not)."""
    from conformance.schemas import (
        SCHEMA_BASE_UNITS,
        SCHEMA_UNITS_PER_VALUE,
        BudgetExceeded,
        SchemaSet,
        default_schema_dir,
    )

    schemas = SchemaSet(default_schema_dir())
    budget = SCHEMA_BASE_UNITS + SCHEMA_UNITS_PER_VALUE * 5001
    value: Any = [list(range(5000))] if nested else list(range(5000))
    # CPU and memory in separate passes (tracemalloc multiplies the cost of every allocation:
    # see test_schema_error_messages_are_metered).
    with time_bound(120), cpu_bound(5), pytest.raises(BudgetExceeded):
        schemas.validate(_fan_out_to_a_type_error(20), value, limit=3, budget=budget)
    with time_bound(120), memory_bound(24 << 20), pytest.raises(BudgetExceeded):
        schemas.validate(_fan_out_to_a_type_error(20), value, limit=3, budget=budget)


def test_missing_ranks_of_a_huge_world_size_cost_the_values_present(tmp_path: Path) -> None:
    """Found by the long fuzz run (seed 13, input 9949): a per_rank entry of a manifest whose
    world size says 2^21 built ``set(range(world_size))`` to name the missing ranks (256 MiB in
    the parser; the conformance checker the same). The first missing ranks are found by
    scanning, in O(values present)."""
    from conformance.checker import check
    from portable_ckpt.format.manifest import parse_manifest
    from tests.hardening._util import make_version

    attempt = make_version(str(tmp_path), 1)
    vdir = tmp_path / attempt

    def grow(doc: dict[str, Any]) -> None:
        doc["continuation"]["world_size"] = 1 << 22

    edit_manifest(str(vdir), grow)
    doc = json.loads((vdir / "manifest.json").read_bytes())
    with time_bound(60), cpu_bound(2), memory_bound(16 << 20):
        err = expect_code("PCK-ENTRY-MISSING", parse_manifest, doc, directory_name=attempt)
        report = check(str(vdir))
    assert "[2, 3, 4, 5, 6, 7, 8, 9]" in err.message
    assert "PCK-ENTRY-MISSING" in report.codes


@pytest.mark.skipif(not os.path.isfile("/proc/self/status"), reason="needs Linux /proc")
def test_read_regular_bounds_what_it_reads_not_what_fstat_says() -> None:
    """mutation audit 22 A-97: ``read_regular`` stops reading above ``max_size`` whatever fstat
    said: a pseudo-file (procfs reports st_size 0) or a file growing during the read is refused
    with PCK-LIMIT ("grew above"), never read without bound."""
    from portable_ckpt.errors import LimitError
    from portable_ckpt.storage._posix import read_regular

    path = "/proc/self/status"  # a regular file of st_size 0 and over a kilobyte of text
    assert os.stat(path).st_size == 0
    with pytest.raises(LimitError, match="grew above the limit of 64 bytes") as ei:
        read_regular(path, max_size=64)
    assert ei.value.code == "PCK-LIMIT"
    assert b"Name:" in read_regular(path, max_size=1 << 20)
