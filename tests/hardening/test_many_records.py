"""Memory of reads that grows with range records, not bytes (resource review R8).

A file of many small stored tensors (tiles, or thousands of keys) made the reader parse its
whole safetensors header into one dict of objects (about 330 bytes kept and 2.6 KB at peak
per record) and plan every piece of a read at once (about 2 KB each): 1,000,000 tiles took
2.6 GB to load 16 MB. The header is now parsed a batch of members at a time into array
columns, and a read plans and reads ``PIECES_PER_PASS`` pieces at a time. These tests hold
the parser to the strict JSON parser on every input (batches forced small), and the reads to
their results and bounds.
"""

from __future__ import annotations

import json
import math
import struct
import tracemalloc
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import portable_ckpt
from portable_ckpt.errors import CheckpointError
from portable_ckpt.format.dtypes import DTYPES
from portable_ckpt.io import _read_plan, _verify, commit, reader, safetensors_io
from portable_ckpt.io.reader import ReadRequest
from portable_ckpt.io.safetensors_io import parse_header

from ._util import expect_code, memory_bound, rechecksum

_ITEMSIZE = {row.safetensors: row.itemsize for row in DTYPES.values()}


def _reference(header: bytes, file_size: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """What the header holds by the plain strict parse (``None``: refused)."""
    from portable_ckpt.format import jsonio

    try:
        doc = jsonio.loads(header, what="h", max_bytes=safetensors_io.MAX_HEADER_BYTES)
    except CheckpointError:
        return None
    if not isinstance(doc, dict):
        return None
    meta = doc.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        return None
    data_start, out = 8 + len(header), {}
    spans = []
    for name, t in doc.items():
        if not isinstance(t, dict) or t.get("dtype") not in _ITEMSIZE:
            return None
        shape, (b, e) = t["shape"], t["data_offsets"]
        if e - b != math.prod(shape) * _ITEMSIZE[t["dtype"]] or not 0 <= b <= e <= file_size - data_start:
            return None
        out[name] = (t["dtype"], tuple(shape), data_start + b, data_start + e)
        spans.append((b, e))
    pos = 0
    for b, e in sorted(spans):
        if b != pos:
            return None
        pos = e
    return (out, meta) if pos == file_size - data_start else None


def _parsed(header: bytes, file_size: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
    prefix = struct.pack("<Q", len(header))
    try:
        h = parse_header(prefix, header, path="h", file_size=file_size)
    except CheckpointError as exc:
        assert exc.code == "PCK-SHARD-HEADER", exc
        return None
    got = {n: h.tensors[n] for n in h.tensors}
    assert len(got) == len(h.tensors)
    return {n: (t.dtype, t.shape, t.start, t.end) for n, t in got.items()}, h.metadata


NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


@st.composite
def headers(draw: st.DrawFn) -> tuple[bytes, int]:
    """A header of tensors named with any characters (quotes, backslashes, commas, braces),
    in any JSON layout, and sometimes broken in a way a parser could miss between batches."""
    names = draw(st.lists(NAMES | st.sampled_from(['a,b', '{"x"}', "\\", '"', "}", "]"]),
                          max_size=12, unique=True))
    doc: dict[str, Any] = {}
    if draw(st.booleans()):
        doc["__metadata__"] = {"k,{": draw(NAMES)}
    pos = 0
    for name in names:
        dtype = draw(st.sampled_from(["F32", "U8", "BF16", "I64"]))
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        n = math.prod(shape) * _ITEMSIZE[dtype]
        doc[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + n]}
        pos += n
    indent = draw(st.sampled_from([None, 0, 2]))
    seps = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")]))
    text = json.dumps(doc, indent=indent, separators=seps, ensure_ascii=draw(st.booleans()))
    text = draw(st.sampled_from(["", " ", "\n"])) + text + " " * draw(st.integers(0, 9))
    broken = draw(st.sampled_from(
        ["", "trailing comma", "empty member", "duplicate", "array", "extra", "open", "close"]
    ))
    if broken == "trailing comma" and doc:
        text = text.rstrip()[:-1] + ",}"
    elif broken == "empty member" and doc:
        text = text.replace("{", "{ , ", 1)
    elif broken == "duplicate" and names:
        first = json.dumps(names[0])
        text = text.rstrip()[:-1] + f",{first}:" + json.dumps(doc[names[0]]) + "}"
    elif broken == "array":
        text = "[" + text + "]"
    elif broken == "extra":
        text += draw(st.sampled_from(["x", "{}", ",", "}"]))
    elif broken == "open":
        text = text.rstrip()[:-1]
    elif broken == "close":
        text += "}"
    return text.encode("utf-8"), 8 + len(text.encode("utf-8")) + pos + draw(st.sampled_from([0, 0, 1]))


@settings(max_examples=600, deadline=None)
@given(headers(), st.sampled_from([1, 7, 64, 1 << 18]), st.sampled_from([1, 5, 64, 1 << 18]))
def test_batched_header_parse_equals_the_strict_parse(
    case: tuple[bytes, int], batch: int, window: int
) -> None:
    """Whatever the batch and scan window sizes (1 byte: every member its own batch, every
    byte its own window), the parse keeps and refuses exactly what the whole-document parse
    does, names and values equal."""
    header, size = case
    with mock.patch.object(safetensors_io, "BATCH_BYTES", batch), mock.patch.object(
        safetensors_io, "WHOLE_BYTES", batch), mock.patch.object(
        safetensors_io, "_SCAN_BYTES", window
    ):
        assert _parsed(header, size) == _reference(header, size)


@pytest.mark.parametrize("batch", [1, 64])
def test_a_duplicate_name_in_another_batch_is_refused(batch: int) -> None:
    """Duplicates within a batch are the JSON parser's; across batches the hash columns'."""
    members = [f'"t{i}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{i + 1}]}}' for i in range(50)]
    members.append('"t3":{"dtype":"U8","shape":[1],"data_offsets":[50,51]}')
    header = ("{" + ",".join(members) + "}").encode()
    with mock.patch.object(safetensors_io, "BATCH_BYTES", batch), mock.patch.object(
            safetensors_io, "WHOLE_BYTES", batch):
        err = expect_code(
            "PCK-SHARD-HEADER", parse_header, struct.pack("<Q", len(header)), header,
            path="f", file_size=8 + len(header) + 51,
        )
    assert "duplicate key 't3'" in err.message


def _header_of(n: int) -> bytes:
    members = [
        f'"emb@{i * 10},0":{{"dtype":"F32","shape":[10,1],"data_offsets":[{40 * i},{40 * i + 40}]}}'
        for i in range(n)
    ]
    return ("{" + ",".join(members) + "}").encode()


def test_a_parsed_header_keeps_tens_of_bytes_per_tensor() -> None:
    """The parse of 20,000 members keeps arrays, not objects (measured: 75 bytes per member,
    a peak of 2.6 times the header's bytes; before, a dict of ShardTensor kept 314 bytes per
    member and the parse peaked at 10.7 times the header)."""
    n = 20_000
    header = _header_of(n)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        h = parse_header(struct.pack("<Q", len(header)), header, path="f", file_size=8 + len(header) + 40 * n)
        held, peak = (x - base for x in tracemalloc.get_traced_memory())
    finally:
        tracemalloc.stop()
    assert len(h.tensors) == n and h.tensors[f"emb@{(n - 1) * 10},0"].start == 8 + len(header) + 40 * (n - 1)
    assert held <= 120 * n, held  # names (about 12 bytes) and 8 array columns
    assert peak <= 4 * len(header) + (4 << 20), (peak, len(header))


def _tiles(
    root: Path, rows: int, *, codec: str = "none", dtype: str = "float32", table: bool = False
) -> np.ndarray[Any, Any]:
    """``rows`` x 100 in 2 x 1 tiles; ``table``: records in a tensor table (1.1), not JSON."""
    a = (np.arange(rows * 100) % 251).astype(dtype).reshape(rows, 100)
    # The writer makes a table above 65,536 records; these tests need fewer.
    with mock.patch.object(commit, "TABLE_THRESHOLD", 100 if table else 1 << 30):
        m = portable_ckpt.save_arrays(root, {"emb": a, "b": np.ones(3, np.float32)}, step=1,
                                      tiles={"emb": (2, 1)}, block_size=4096, codec=codec)
    assert (m.tensor_table is not None) == table
    return a


@pytest.mark.parametrize("table", [False, True])
def test_a_read_of_many_pieces_is_planned_in_passes(tmp_path: Path, table: bool) -> None:
    """A read of 5,000 pieces in passes of 64: the values of whole, partial and overlapping
    boxes (read_many across pass boundaries); each block read once per pass at most."""
    a = _tiles(tmp_path, 100, table=table)
    ck = portable_ckpt.open(tmp_path)
    with mock.patch.object(_read_plan, "PIECES_PER_PASS", 64):
        np.testing.assert_array_equal(ck.read("emb"), a)
        blocks = ck.stats.blocks_verified
        outs = ck.read_many([
            ReadRequest("emb", [3, 7], [50, 61]),
            ReadRequest("b"),
            ReadRequest("emb", [0, 0], [100, 100]),
            ReadRequest("emb", [99, 99], [1, 1]),
        ])
    np.testing.assert_array_equal(outs[0], a[3:53, 7:68])
    np.testing.assert_array_equal(outs[1], np.ones(3, np.float32))
    np.testing.assert_array_equal(outs[2], a)
    np.testing.assert_array_equal(outs[3], a[99:, 99:])
    data = next((tmp_path / ck.id / "data").iterdir())
    file_blocks = -(-data.stat().st_size // 4096)
    passes = -(-5000 // 64)
    assert blocks <= file_blocks + passes, (blocks, file_blocks, passes)


@pytest.mark.parametrize("table", [False, True])
def test_pieces_of_zstd_and_bool_ranges_in_passes(tmp_path: Path, table: bool) -> None:
    """zstd pieces are checked (frame headers) and read in passes too; a bad bool byte in
    a late pass names its own range."""
    a = _tiles(tmp_path / "z", 40, codec="zstd", table=table)
    with mock.patch.object(_read_plan, "PIECES_PER_PASS", 16):
        np.testing.assert_array_equal(portable_ckpt.open(tmp_path / "z").read("emb"), a)
    b = _tiles(tmp_path / "b", 40, dtype="bool", table=table)
    assert b.any()
    ck = portable_ckpt.open(tmp_path / "b")
    data = next((tmp_path / "b" / ck.id / "data").iterdir())
    st = ck._header(f"data/{data.name}").tensors["emb@38,97"]
    raw = bytearray(data.read_bytes())
    raw[st.start] = 7
    data.write_bytes(bytes(raw))
    # The damaged byte passes its checksum: the bool check finds it.
    rechecksum(str(tmp_path / "b" / ck.id), str(data.relative_to(tmp_path / "b" / ck.id)))
    with mock.patch.object(_read_plan, "PIECES_PER_PASS", 16):
        err = expect_code("PCK-DTYPE-VALUE", portable_ckpt.open(tmp_path / "b").read, "emb")
    assert "'emb@38,97'" in err.message and "[38, 97]" in err.message


@pytest.mark.parametrize("table", [False, True])
def test_reads_of_a_file_of_many_tiles_are_bounded(tmp_path: Path, table: bool) -> None:
    """20,000 tiles (a 78 KiB tensor): a 5 x 5 read and the whole tensor each peak below
    16 MiB of heap (measured: about 10.5 MiB each; before, 22 and 31.5 MiB)."""
    a = _tiles(tmp_path, 400, table=table)
    ck = portable_ckpt.open(tmp_path)
    with memory_bound(16 << 20):
        got = ck.read("emb", [100, 10], [5, 5])
    np.testing.assert_array_equal(got, a[100:105, 10:15])
    with memory_bound(16 << 20):
        got = ck.read("emb")
    np.testing.assert_array_equal(got, a)


def test_verify_does_not_build_a_tables_records(tmp_path: Path) -> None:
    """verify (sampled and deep) walks a table's records a slice at a time: ``t.ranges`` would
    build and keep every record (about 300 bytes each). The sample is the one a list of the
    records gave (the same seed, the same records)."""
    _tiles(tmp_path, 100, codec="zstd", table=True)
    ck = portable_ckpt.open(tmp_path)
    assert ck.verify(sample=0.01, seed=7) == [] and ck.verify(deep=True) == []
    t = ck.tensors["emb"]
    assert getattr(t, "table_ranges_untouched", False), type(t)
    every = [(k, r) for k, e in ck.tensors.items() for r in e.ranges]  # built now, for the check
    import random

    from portable_ckpt.io.annotations import sampled_chunks

    picked = random.Random(7).sample(every, sampled_chunks(len(every), 0.01))
    seen: list[Any] = []
    with mock.patch.object(_verify, "_verify_chunk", lambda ck, t, r, d: seen.append((t.key, r))):
        portable_ckpt.open(tmp_path).verify(sample=0.01, seed=7)
    assert seen == picked and len(seen) >= 50


@pytest.mark.parametrize(("tail", "said"), [
    (b"x", "does not end its object"),
    (b"}", "the header's object closes before byte"),
    (b" ", "not closed"),
])
def test_a_large_header_that_is_no_object_is_refused_from_positions(tail: bytes, said: str) -> None:
    """Parser review P1: a stray byte after a 94 MB header sent the refusal through a parse of
    the whole header (964 MiB, 24 s). It is said from the scan's positions, nothing parsed."""
    n = 30_000
    header = _header_of(n)
    header = header[:-1] + tail if tail == b" " else header + tail  # " ": the object left open
    size = 8 + len(header) + 40 * n
    with memory_bound(2 << 20):
        err = expect_code("PCK-SHARD-HEADER", parse_header, struct.pack("<Q", len(header)),
                          header, path="f", file_size=size)
    assert said in err.message, err.message
    wrapped = b"[" + _header_of(n) + b"]"
    with memory_bound(2 << 20):
        err = expect_code("PCK-SHARD-HEADER", parse_header, struct.pack("<Q", len(wrapped)),
                          wrapped, path="f", file_size=8 + len(wrapped) + 40 * n)
    assert "not a JSON object" in err.message


def test_a_json_error_deep_in_a_large_header_is_placed_in_the_header() -> None:
    """Parser review P5: the position json gives counts from the batch; it is the header's."""
    header = _header_of(30_000)
    at = header.index(b'"F32"', len(header) // 2)
    header = header[:at] + b"F32  " + header[at + 5:]  # an unquoted word: "Expecting value"
    err = expect_code("PCK-SHARD-HEADER", parse_header, struct.pack("<Q", len(header)), header,
                      path="f", file_size=8 + len(header) + 40 * 30_000)
    assert f"near header byte {at}" in err.message, err.message


def test_many_requests_keep_at_most_a_pass_of_pieces(tmp_path: Path) -> None:
    """Parser review P2: requests of fewer pieces than a pass each kept their pieces from the
    check to the read, so a read_many (a torch load is one) held every piece: 40 requests of
    4,096 tiles peaked at 104 MiB. At most a pass of pieces is kept now."""
    arrays = {f"e{i}": np.full((64, 4), i, np.float32) for i in range(40)}
    portable_ckpt.save_arrays(tmp_path, arrays, step=1, tiles=dict.fromkeys(arrays, (1, 1)),
                              block_size=4096)  # 256 tiles each, 10,240 in all
    ck = portable_ckpt.open(tmp_path)
    ck.read("e0", [0, 0], [1, 1])  # the header parsed outside the bound
    with mock.patch.object(_read_plan, "PIECES_PER_PASS", 512), memory_bound(3 << 20) as peak:
        outs = ck.read_many([ReadRequest(k) for k in arrays])
    assert all(np.array_equal(o, arrays[k]) for o, k in zip(outs, arrays, strict=True)), peak


def test_zstd_frames_are_checked_once_whatever_the_cache(tmp_path: Path) -> None:
    """Parser review P7: past the bound of the checked-frames cache, each zstd frame was
    checked (its first block read and verified) again when read: 923 MB against 616 MB."""
    a = _tiles(tmp_path, 40, codec="zstd")  # 2,000 zstd tiles
    reads = []
    for cap in (1 << 20, 16):
        ck = portable_ckpt.open(tmp_path)
        with mock.patch.object(reader, "_RANGES_CHECKED", cap):
            np.testing.assert_array_equal(ck.read("emb"), a)
        reads.append((ck.stats.bytes_read, ck.stats.blocks_verified))
    assert reads[0] == reads[1], reads
