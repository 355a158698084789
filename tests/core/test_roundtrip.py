"""Write/read round trips: every dtype, 0-d, empty, strided sources, codecs, partial reads."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import portable_ckpt
from portable_ckpt.errors import TensorMissingError, UsageError
from portable_ckpt.format.dtypes import DTYPES
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage

from .helpers import sample_array, save_sharded


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_every_dtype_round_trips_bit_exact(tmp_path, dtype: str, codec: str) -> None:
    a = sample_array(dtype, (7, 5), seed=3)
    s = sample_array(dtype, (), seed=4)
    save_sharded(tmp_path, {"a": (a, (3, 2)), "s": (s, ())}, codec=codec)
    ck = portable_ckpt.open(tmp_path)
    got = ck.read("a")
    assert got.dtype == DTYPES[dtype].numpy
    assert got.tobytes() == a.tobytes()
    assert ck.read("s").tobytes() == s.tobytes()
    assert ck.tensors["a"].dtype == dtype and ck.tensors["s"].shape == ()


def test_zero_size_and_zero_d(tmp_path) -> None:
    e = np.zeros((0, 4), dtype=np.float32)
    z = np.array(7, dtype=np.int64)
    save_sharded(tmp_path, {"empty": (e, (1, 1)), "z": (z, ())})
    ck = portable_ckpt.open(tmp_path)
    assert ck.tensors["empty"].shape == (0, 4) and ck.tensors["empty"].ranges == []
    assert ck.read("empty").shape == (0, 4)
    assert ck.read("z") == 7 and ck.read("z").shape == ()


def test_non_contiguous_sources_are_written_correctly(tmp_path) -> None:
    base = np.arange(40 * 30, dtype=np.float64).reshape(40, 30)
    views = {"t": base.T, "strided": base[::3, ::2], "neg": base[::-1]}
    storage = open_storage(tmp_path)
    aid = new_attempt_id(2)
    w = ShardWriter(storage, aid, 0)
    for k, v in views.items():
        w.add_tensor(k, v)
    idx = w.finish()
    from portable_ckpt.io.commit import commit

    commit(storage, aid, step=2, indexes=[idx])
    ck = portable_ckpt.open(tmp_path)
    for k, v in views.items():
        np.testing.assert_array_equal(ck.read(k), v)


def test_small_pieces_and_many_files(tmp_path, monkeypatch) -> None:
    import portable_ckpt.io.writer as wmod

    monkeypatch.setattr(wmod, "PIECE_BYTES", 1000)  # exercise piece boundaries vs blocks
    a = sample_array("float32", (64, 33), seed=1)
    b = sample_array("int16", (101,), seed=2)
    save_sharded(tmp_path, {"a": (a, (4, 3)), "b": (b, (5,))}, writers=3, max_file_bytes=2000)
    ck = portable_ckpt.open(tmp_path)
    assert len([f for f in ck.manifest.files if f.startswith("data/")]) > 3
    np.testing.assert_array_equal(ck.read("a"), a)
    np.testing.assert_array_equal(ck.read("b"), b)
    assert ck.verify(deep=True) == []


@st.composite
def layouts(draw: st.DrawFn):
    nd = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(1, 9)) for _ in range(nd))
    parts = tuple(draw(st.integers(1, s)) for s in shape)
    dtype = draw(st.sampled_from(list(DTYPES)))  # every row (contributor review D7)
    boxes = []
    for _ in range(3):
        offs = tuple(draw(st.integers(0, s - 1)) for s in shape)
        lens = tuple(draw(st.integers(1, s - o)) for s, o in zip(shape, offs))
        boxes.append((offs, lens))
    codec = draw(st.sampled_from(["none", "none", "zstd"]))
    return shape, parts, dtype, boxes, codec


@given(layouts())
def test_partial_reads_match_numpy_slicing(tmp_path_factory, layout) -> None:
    shape, parts, dtype, boxes, codec = layout
    root = tmp_path_factory.mktemp("ck")
    a = sample_array(dtype, shape, seed=11)
    save_sharded(root, {"a": (a, parts)}, writers=3, codec=codec)
    ck = portable_ckpt.open(root)
    for offs, lens in boxes:
        sl = tuple(slice(o, o + n) for o, n in zip(offs, lens))
        np.testing.assert_array_equal(ck.read("a", offs, lens), a[sl])
        # Into a non-contiguous destination view.
        big = np.zeros(tuple(2 * n for n in lens), dtype=a.dtype)
        out = big[tuple(slice(None, None, 2) for _ in lens)]
        ck.read("a", offs, lens, out=out)
        np.testing.assert_array_equal(out, a[sl])
        items = ck.plan_read("a", offs, lens)
        assert sum(it.box.volume for it in items) == int(np.prod(lens))


def test_partial_read_touches_only_needed_blocks(tmp_path) -> None:
    # 4 MiB tensor in one chunk, 4 KiB blocks: a 64 KiB row slab reads 64 KiB + at most 2 blocks.
    a = np.arange(1024 * 1024, dtype=np.float32).reshape(1024, 1024)
    save_sharded(tmp_path, {"a": (a, (1, 1))}, writers=1, block_size=4096)
    ck = portable_ckpt.open(tmp_path)
    ck.read("a", (0, 0), (1, 1))  # loads (and verifies) the shard header once
    header_bytes = ck.stats.bytes_read
    ck.stats.peak_scratch_bytes = 0
    got = ck.read("a", (100, 0), (16, 1024))
    np.testing.assert_array_equal(got, a[100:116])
    data_read = ck.stats.bytes_read - header_bytes
    assert ck.stats.bytes_delivered == 4 + 16 * 1024 * 4
    assert data_read <= 16 * 1024 * 4 + 2 * 4096
    # The slab went straight into the destination: scratch held only the header and the edges.
    assert ck.stats.peak_scratch_bytes <= 2 * 4096
    # A square box far from contiguous: rows are 4 KiB apart, each touched block is read once.
    before = ck.stats.bytes_read
    got = ck.read("a", (10, 10), (32, 32))
    np.testing.assert_array_equal(got, a[10:42, 10:42])
    assert ck.stats.bytes_read - before <= 33 * 2 * 4096


def test_read_errors_name_the_problem(tmp_path) -> None:
    a = np.zeros((4, 4), np.float32)
    save_sharded(tmp_path, {"a": (a, (2, 2))})
    ck = portable_ckpt.open(tmp_path)
    with pytest.raises(TensorMissingError, match="'b'"):
        ck.read("b")
    with pytest.raises(UsageError):
        ck.read("a", (3, 0), (2, 4))
    with pytest.raises(UsageError):
        ck.read("a", out=np.zeros((4, 4), np.float64))


def test_entries_round_trip_with_compression(tmp_path) -> None:
    storage = open_storage(tmp_path)
    aid = new_attempt_id(3)
    w = ShardWriter(storage, aid, 0)
    w.add_entry("cfg", {"lr": 0.1, "names": ["a", "b"]}, compress=True)
    w.add_entry(
        "pos",
        {"epoch": 1, "global_sample_index": 640, "sampler_seed": 7, "workers": []},
        "pck:data-position/1",
    )
    idx = w.finish()
    from portable_ckpt.io.commit import commit

    commit(storage, aid, step=3, indexes=[idx])
    ck = portable_ckpt.open(tmp_path)
    assert ck.entry("cfg") == {"lr": 0.1, "names": ["a", "b"]}
    assert ck.entry("pos")["global_sample_index"] == 640
    assert ck.entries["cfg"].encoding == "json+zstd"


def test_pipelined_reads_verify_every_window(tmp_path, monkeypatch) -> None:
    import portable_ckpt.io.checksum as cmod

    monkeypatch.setattr(cmod, "PIPELINE_WINDOW", 8192)  # many windows for a small file
    a = sample_array("float32", (300, 100), seed=5)
    save_sharded(tmp_path, {"a": (a, (1, 1))}, writers=1, block_size=4096)
    ck = portable_ckpt.open(tmp_path)
    np.testing.assert_array_equal(ck.read("a"), a)
    np.testing.assert_array_equal(ck.read("a", (7, 0), (250, 100)), a[7:257])
    assert ck.verify(deep=True) == []
    # Corrupt a byte near the end: the last window catches it, deep verify too.
    f = next((tmp_path / ck.id / "data").iterdir())
    raw = bytearray(f.read_bytes())
    raw[-100] ^= 0xFF
    f.write_bytes(bytes(raw))
    ck = portable_ckpt.open(tmp_path)
    with pytest.raises(portable_ckpt.CheckpointError) as ei:
        ck.read("a")
    assert ei.value.code == "PCK-CHECKSUM"
    assert [e.code for e in ck.verify(deep=True)] == ["PCK-CHECKSUM"]


def test_flush_streams_in_bounded_pieces(tmp_path) -> None:
    storage = open_storage(tmp_path)
    aid = new_attempt_id(4)
    w = ShardWriter(storage, aid, 0)
    parts = [sample_array("int32", (10, 6), seed=i) for i in range(3)]
    for i, p in enumerate(parts):
        w.add_tensor("x", p, offsets=(10 * i, 0), global_shape=(30, 6))
        w.flush()
    idx = w.finish()
    assert len([f for f in idx.files if f.startswith("data/")]) == 3
    from portable_ckpt.io.commit import commit

    commit(storage, aid, step=4, indexes=[idx])
    np.testing.assert_array_equal(portable_ckpt.open(tmp_path).read("x"), np.concatenate(parts))
