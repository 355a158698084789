"""Tensor entries, range records, codecs (§8) and the coverage rule (§9)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import portable_ckpt
from portable_ckpt.format.manifest import MAX_SIZE
from portable_ckpt.ranges import Box, check_coverage

from ._util import (
    build_version,
    edit_manifest,
    expect_code,
    open_and_read_all,
    read_manifest,
    rebuild_shard,
    rewrite_shard_header,
    sample_array,
    save_sharded,
    shard_header,
)


@pytest.mark.parametrize(
    "shape, dtype, code",
    [
        ([2**50, 8], "float64", "PCK-LIMIT"),
        ([2**30, 2**30, 2**30], "int8", "PCK-LIMIT"),
        ([2**52], "uint16", "PCK-LIMIT"),
        # Exactly MAXINT bytes is allowed by the limit (then fails on its ranges).
        ([MAX_SIZE], "uint8", {"PCK-RANGE-BOUNDS", "PCK-COVERAGE-GAP"}),
    ],
)
def test_tensor_byte_size_limit(tmp_path: Path, shape: list[int], dtype: str,
                                code: Any) -> None:
    """R-TENSOR-1: prod(shape) x itemsize above MAXINT is PCK-LIMIT."""
    vdir, _ = build_version(tmp_path)
    edit_manifest(vdir, lambda d: d["tensors"]["b"].update(shape=shape, dtype=dtype))
    expect_code(code, open_and_read_all, vdir)


@pytest.mark.parametrize(
    "field, value",
    [
        ("offsets", [0]),
        ("offsets", [0, 0, 0]),
        ("lengths", [4]),
        ("lengths", [0, 8]),
        ("offsets", [-1, 0]),
        ("offsets", [4, 1]),
        ("lengths", [4, 9]),
        ("offsets", [MAX_SIZE, 0]),
    ],
)
def test_range_bounds(tmp_path: Path, field: str, value: list[int]) -> None:
    """R-TENSOR-2: wrong rank, empty, negative or out-of-shape ranges are PCK-RANGE-BOUNDS."""
    vdir, _ = build_version(tmp_path)
    edit_manifest(vdir, lambda d: d["tensors"]["a"]["ranges"][1].__setitem__(field, value))
    expect_code("PCK-RANGE-BOUNDS", portable_ckpt.open, vdir)


def test_range_names_exist_in_their_shard_headers(tmp_path: Path) -> None:
    """R-TENSOR-3: the writer names a tensor of the file's header; a reader rejects a wrong name."""
    vdir, _ = build_version(tmp_path)
    doc = read_manifest(vdir)
    for t in doc["tensors"].values():
        for r in t["ranges"]:
            assert r["name"] in shard_header(vdir / r["file"])[1]
    edit_manifest(vdir, lambda d: d["tensors"]["a"]["ranges"][0].__setitem__("name", "a@9,9"))
    expect_code("PCK-SHARD-MISMATCH", open_and_read_all, vdir)


@pytest.mark.parametrize("codec", ["lz4", "ZSTD", "", "gzip", None])
def test_unknown_codec(tmp_path: Path, codec: Any) -> None:
    """R-TENSOR-4: a codec other than none/zstd is PCK-CODEC."""
    vdir, _ = build_version(tmp_path)
    edit_manifest(vdir, lambda d: d["tensors"]["a"]["ranges"][0].__setitem__("codec", codec))
    expect_code("PCK-CODEC", portable_ckpt.open, vdir)


@pytest.mark.parametrize(
    "change, code",
    [
        # A consistent header that disagrees with the record: R-TENSOR-5.
        (lambda t: t.__setitem__("dtype", "I32"), "PCK-SHARD-MISMATCH"),
        (lambda t: t.__setitem__("shape", [8, 4]), "PCK-SHARD-MISMATCH"),
        # A header whose span no longer equals shape x itemsize is itself invalid: R-SHARD-6.
        (lambda t: t.__setitem__("dtype", "F16"), "PCK-SHARD-HEADER"),
        (lambda t: t.__setitem__("shape", [256]), "PCK-SHARD-HEADER"),
    ],
)
def test_codec_none_header_must_agree(tmp_path: Path, change: Any, code: str) -> None:
    """R-TENSOR-5: codec none: safetensors dtype and shape must match; else PCK-SHARD-MISMATCH."""
    vdir, _ = build_version(tmp_path)
    r = read_manifest(vdir)["tensors"]["a"]["ranges"][0]
    rewrite_shard_header(vdir, r["file"], lambda h: change(h[r["name"]]))
    expect_code(code, open_and_read_all, vdir)


def _zstd_version(tmp_path: Path) -> tuple[Path, dict[str, Any], np.ndarray]:
    arr = sample_array("float32", (16, 8), seed=5)
    m = save_sharded(tmp_path, {"t": (arr, (1, 1))}, writers=1, codec="zstd", entries={})
    vdir = tmp_path / m.attempt_id
    return vdir, read_manifest(vdir)["tensors"]["t"]["ranges"][0], arr


def test_zstd_ranges_are_one_exact_frame_in_a_u8_tensor(tmp_path: Path) -> None:
    """R-TENSOR-6: zstd: U8 1-d tensor holding one frame that decodes to the box's bytes."""
    m = save_sharded(tmp_path, {"t": (sample_array("bfloat16", (33, 7)), (3, 2)),
                                "s": (np.float64(2.5), ())}, writers=2, codec="zstd", entries={})
    vdir = tmp_path / m.attempt_id
    doc = read_manifest(vdir)
    arrs = {"t": sample_array("bfloat16", (33, 7)), "s": np.float64(2.5)}
    for key, t in doc["tensors"].items():
        for r in t["ranges"]:
            assert r["codec"] == "zstd"
            _, header, data = shard_header(vdir / r["file"])
            h = header[r["name"]]
            b, e = h["data_offsets"]
            assert h["dtype"] == "U8" and h["shape"] == [e - b] and e - b >= 1
            frame = data[b:e]
            params = zstandard.get_frame_parameters(frame)
            assert params.dict_id == 0
            d = zstandard.ZstdDecompressor().decompressobj()
            out = d.decompress(frame)
            assert d.eof and d.unused_data == b""
            sl = tuple(slice(o, o + n) for o, n in zip(r["offsets"], r["lengths"], strict=True))
            assert out == np.ascontiguousarray(np.asarray(arrs[key])[sl]).tobytes()


@pytest.mark.parametrize("hdr", [("F32", [128]), ("U8", [16, 32]), ("U8", [])])
def test_zstd_range_needs_a_1d_u8_tensor(tmp_path: Path, hdr: tuple[str, list[int]]) -> None:
    """R-TENSOR-6: a zstd range whose tensor is not 1-d U8 is PCK-SHARD-MISMATCH."""
    vdir, r, _ = _zstd_version(tmp_path)
    _, header, data = shard_header(vdir / r["file"])
    b, e = header[r["name"]]["data_offsets"]
    frame = data[b:e]
    payload = frame + b"\0" * (-len(frame) % 4) if hdr[0] == "F32" else frame
    shape = [len(payload) // 4] if hdr[0] == "F32" else hdr[1]
    if hdr[0] == "U8" and hdr[1]:
        payload = b"\0" * 512
    if not hdr[1]:
        payload = frame[:1]
    rebuild_shard(vdir, r["file"], [(r["name"], hdr[0], shape, payload)])
    expect_code("PCK-SHARD-MISMATCH", open_and_read_all, vdir)


def _frames(raw: bytes) -> dict[str, bytes]:
    good = zstandard.ZstdCompressor(write_content_size=True).compress(raw)
    nosize = zstandard.ZstdCompressor(write_content_size=False)
    dict_data = zstandard.train_dictionary(2048, [raw[i:i + 64] * 4 for i in range(0, 512, 8)])
    return {
        "corrupt": good[:6] + bytes(b ^ 0xFF for b in good[6:]),
        "truncated": good[:-3],
        "short_declared": zstandard.ZstdCompressor(write_content_size=True).compress(raw[:-4]),
        "long_undeclared": nosize.compress(raw + b"\0\0\0\0"),
        "short_undeclared": nosize.compress(raw[:-4]),
        "dictionary": zstandard.ZstdCompressor(dict_data=dict_data).compress(raw),
        "not_zstd": b"\x00" * 40,
    }


@pytest.mark.parametrize("kind", ["corrupt", "truncated", "short_declared", "long_undeclared",
                                  "short_undeclared", "dictionary", "not_zstd"])
def test_bad_zstd_frames_are_codec_errors(tmp_path: Path, kind: str) -> None:
    """R-TENSOR-7: corrupt frame, dictionary, wrong (declared) size: PCK-CODEC."""
    vdir, r, arr = _zstd_version(tmp_path)
    frame = _frames(arr.tobytes())[kind]
    rebuild_shard(vdir, r["file"], [(r["name"], "U8", [len(frame)], frame)])
    expect_code("PCK-CODEC", portable_ckpt.open(vdir).read, "t")


@pytest.mark.parametrize("tail", ["zeros", "second_frame"])
def test_trailing_bytes_after_the_frame_are_codec_errors(tmp_path: Path, tail: str) -> None:
    """R-TENSOR-7: bytes after the single frame are PCK-CODEC."""
    vdir, r, arr = _zstd_version(tmp_path)
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(arr.tobytes())
    frame += b"\0\0\0\0" if tail == "zeros" else zstandard.ZstdCompressor().compress(b"xx")
    rebuild_shard(vdir, r["file"], [(r["name"], "U8", [len(frame)], frame)])
    expect_code("PCK-CODEC", portable_ckpt.open(vdir).read, "t")


def test_an_empty_zstd_range_is_a_shard_mismatch(tmp_path: Path) -> None:
    """R-TENSOR-6: a zstd range is a U8 tensor of n >= 1 bytes, else PCK-SHARD-MISMATCH."""
    from conformance.checker import check

    vdir, r, _ = _zstd_version(tmp_path)
    rebuild_shard(vdir, r["file"], [(r["name"], "U8", [0], b"")])
    expect_code("PCK-SHARD-MISMATCH", portable_ckpt.open(vdir).read, "t")
    assert [p.code for p in check(vdir).errors] == ["PCK-SHARD-MISMATCH"]


def test_skippable_frame_is_a_codec_error(tmp_path: Path) -> None:
    """R-TENSOR-7: a skippable frame in front of the data frame is PCK-CODEC."""
    vdir, r, arr = _zstd_version(tmp_path)
    frame = b"\x50\x2a\x4d\x18\x04\x00\x00\x00abcd" + zstandard.ZstdCompressor().compress(
        arr.tobytes())
    rebuild_shard(vdir, r["file"], [(r["name"], "U8", [len(frame)], frame)])
    err = expect_code("PCK-CODEC", portable_ckpt.open(vdir).read, "t")
    # Named as what it is (not "the frame declares 4 decoded bytes", its skippable length).
    assert "skippable frame" in err.message and "declares" not in err.message


def test_zero_d_tensor_has_one_empty_box_range(tmp_path: Path) -> None:
    """R-TENSOR-8: a 0-d tensor has exactly one range with offsets [] and lengths []."""
    m = save_sharded(tmp_path, {"s": (np.float32(3.5), ()), "i": (np.int64(-7), ())},
                     writers=2, entries={})
    vdir = tmp_path / m.attempt_id
    doc = read_manifest(vdir)
    for key in ("s", "i"):
        t = doc["tensors"][key]
        assert t["shape"] == [] and len(t["ranges"]) == 1
        r = t["ranges"][0]
        assert r["offsets"] == [] and r["lengths"] == []
        h = shard_header(vdir / r["file"])[1][r["name"]]
        assert h["shape"] == [] and h["data_offsets"][1] - h["data_offsets"][0] == (
            4 if key == "s" else 8)
    ck = portable_ckpt.open(vdir)
    assert ck.read("s").shape == () and float(ck.read("s")) == 3.5
    edit_manifest(vdir, lambda d: d["tensors"]["s"]["ranges"].append(
        d["tensors"]["s"]["ranges"][0]))
    expect_code("PCK-COVERAGE-OVERLAP", open_and_read_all, vdir)
    edit_manifest(vdir, lambda d: d["tensors"]["s"].__setitem__("ranges", []))
    expect_code("PCK-COVERAGE-GAP", open_and_read_all, vdir)


def test_zero_d_tensor_with_codec_zstd_is_a_u8_frame(tmp_path: Path) -> None:
    """R-TENSOR-8: with codec zstd, a 0-d tensor's range is the U8 frame of its itemsize bytes."""
    m = portable_ckpt.save_arrays(tmp_path, {"s": np.array(3.5, np.float32)}, step=1,
                                  codec="zstd")
    vdir = tmp_path / m.attempt_id
    r = read_manifest(vdir)["tensors"]["s"]["ranges"][0]
    assert r["codec"] == "zstd" and r["offsets"] == [] and r["lengths"] == []
    h = shard_header(vdir / r["file"])[1][r["name"]]
    assert h["dtype"] == "U8" and len(h["shape"]) == 1
    ck = portable_ckpt.open(vdir)
    assert float(ck.read("s")) == 3.5 and ck.verify(deep=True) == []


def test_zero_size_tensor_has_no_ranges(tmp_path: Path) -> None:
    """R-TENSOR-9: a zero-size tensor has no ranges and no bytes; a range for it is rejected."""
    m = save_sharded(tmp_path, {"z": (np.zeros((3, 0, 2), dtype=np.float32), (2, 1, 1)),
                                "a": (np.ones(2, dtype=np.float32), (1,))}, writers=2, entries={})
    vdir = tmp_path / m.attempt_id
    doc = read_manifest(vdir)
    assert doc["tensors"]["z"] == {"dtype": "float32", "shape": [3, 0, 2], "ranges": []}
    for r in doc["tensors"]["a"]["ranges"]:
        assert all(not n.startswith("z") for n in shard_header(vdir / r["file"])[1])
    assert portable_ckpt.open(vdir).read("z").shape == (3, 0, 2)
    edit_manifest(vdir, lambda d: d["tensors"]["z"]["ranges"].append(
        dict(d["tensors"]["a"]["ranges"][0], offsets=[0, 0, 0], lengths=[1, 1, 1])))
    expect_code("PCK-RANGE-BOUNDS", portable_ckpt.open, vdir)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=3), data=st.data())
def test_writer_planning_covers_exactly_once(shape: list[int], data: st.DataObject) -> None:
    """R-COVER-1: the planner gives every element to exactly one writer (replicas written once)."""
    from portable_ckpt.ranges.planning import RangeIndex

    parts = [data.draw(st.integers(1, s)) for s in shape]
    cuts = [[s * i // p for i in range(p + 1)] for s, p in zip(shape, parts, strict=True)]
    boxes = []
    import itertools

    for idx in itertools.product(*[range(p) for p in parts]):
        offs = tuple(c[i] for c, i in zip(cuts, idx, strict=True))
        lens = tuple(c[i + 1] - c[i] for c, i in zip(cuts, idx, strict=True))
        if all(lens):
            boxes.append(Box(offs, lens))
    check_coverage(tuple(shape), boxes, key="t")
    # The reader's planner serves the whole tensor from exactly these boxes, each once.
    items = RangeIndex([(b, b) for b in boxes]).query(Box((0,) * len(shape), tuple(shape)))
    assert sum(it.box.volume for it in items) == int(np.prod(shape))


def test_writers_together_cover_every_element_once(tmp_path: Path) -> None:
    """R-COVER-1: the reference writers' ranges of every tensor cover it exactly once."""
    m = save_sharded(tmp_path, {"a": (sample_array("float32", (9, 7, 3)), (2, 3, 2)),
                                "b": (sample_array("int8", (10,)), (4,))}, writers=3, entries={})
    doc = read_manifest(tmp_path / m.attempt_id)
    for t in doc["tensors"].values():
        mask = np.zeros(t["shape"], dtype=np.int32)
        for r in t["ranges"]:
            mask[tuple(slice(o, o + n) for o, n in zip(r["offsets"], r["lengths"],
                                                       strict=True))] += 1
        assert (mask == 1).all()


def test_committer_checks_coverage_of_every_tensor(tmp_path: Path) -> None:
    """R-COVER-2: a gap or overlap in any tensor stops the commit."""
    from portable_ckpt.format.naming import new_attempt_id
    from portable_ckpt.io.commit import commit
    from portable_ckpt.io.writer import ShardWriter
    from portable_ckpt.storage import open_storage

    storage = open_storage(tmp_path, create=True)
    for second_offset, code in ((3, "PCK-COVERAGE-GAP"), (1, "PCK-COVERAGE-OVERLAP")):
        attempt = new_attempt_id(1)
        w = ShardWriter(storage, attempt, 0)
        w.add_tensor("ok", np.ones(3, dtype=np.float32))
        w.add_tensor("t", np.ones((2, 2), dtype=np.float32), offsets=[0, 0], global_shape=[5, 2])
        w.add_tensor("t", np.ones((2, 2), dtype=np.float32), offsets=[second_offset, 0],
                     global_shape=[5, 2])
        if second_offset == 1:
            w.add_tensor("t", np.ones((2, 2), dtype=np.float32), offsets=[3, 0],
                         global_shape=[5, 2])
        idx = w.finish()
        expect_code(code, commit, storage, attempt, step=1, indexes=[idx], expected_writers=[0])
        assert not (tmp_path / attempt / "manifest.json").exists()


def test_reader_checks_coverage_before_delivering_any_data(tmp_path: Path) -> None:
    """R-COVER-3: coverage of the whole tensor is proven before any element is delivered."""
    vdir, _ = build_version(tmp_path)
    # Overlap in the lower half; the requested box lies in the upper half only.
    edit_manifest(vdir, lambda d: d["tensors"]["a"]["ranges"].append(
        dict(d["tensors"]["a"]["ranges"][1], offsets=[4, 0], lengths=[2, 8])))
    ck = portable_ckpt.open(vdir)
    out = np.full((1, 1), -1.0, dtype=np.float32)
    expect_code("PCK-COVERAGE-OVERLAP", ck.read, "a", [0, 0], [1, 1], out=out)
    assert out[0, 0] == -1.0 and ck.stats.bytes_read == 0
    vdir2, _ = build_version(tmp_path, step=2)
    edit_manifest(vdir2, lambda d: d["tensors"]["a"]["ranges"][1].update(offsets=[5, 0],
                                                                          lengths=[3, 8]))
    ck2 = portable_ckpt.open(vdir2)
    expect_code("PCK-COVERAGE-GAP", ck2.read, "a", [0, 0], [1, 1])
    assert ck2.stats.bytes_read == 0


def test_coverage_error_precedence(tmp_path: Path) -> None:
    """R-COVER-3: bounds before overlap before gap."""
    shape = (6, 4)
    overlap_and_gap = [Box((0, 0), (3, 4)), Box((2, 0), (2, 4))]  # overlap, rows 4-5 missing
    expect_code("PCK-COVERAGE-OVERLAP", check_coverage, shape, overlap_and_gap, key="t")
    bounds_and_overlap = [Box((0, 0), (6, 4)), Box((0, 0), (7, 4))]
    expect_code("PCK-RANGE-BOUNDS", check_coverage, shape, bounds_and_overlap, key="t")
    vdir, _ = build_version(tmp_path)

    def both(d: dict) -> None:  # type: ignore[type-arg]
        rs = d["tensors"]["a"]["ranges"]
        rs[1] = dict(rs[1], offsets=[3, 0], lengths=[2, 8])  # overlaps rows 3, leaves 5-7 empty

    edit_manifest(vdir, both)
    expect_code("PCK-COVERAGE-OVERLAP", portable_ckpt.open(vdir).read, "a")
    assert json.loads((vdir / "manifest.json").read_text())["tensors"]["a"]["ranges"]
