"""Mutation audit 28, tensor tables (spec §8.5, R-TABLE-3 … R-TABLE-8): what the earlier tests
left unchecked in :mod:`portable_ckpt.io.table_decode` and :mod:`portable_ckpt.io.tensor_table`.

Hostile tables are real safetensors files built column by column and decoded by the reader's
own :func:`decode_table` (the function every reader and committer runs on a table's verified
bytes), or put in place of a real version's table, sizes and checksums made to match.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest
import zstandard

from portable_ckpt.errors import CheckpointError
from portable_ckpt.format.manifest import MAX_SIZE, RangeRecord, TensorEntry
from portable_ckpt.io import table_decode as td
from portable_ckpt.io.codec import zstd_bound
from portable_ckpt.io.safetensors_io import build_header
from portable_ckpt.io.table_decode import TableCache, decode_table
from portable_ckpt.io.tensor_table import (
    COLUMNS,
    MAX_TABLE_BYTES,
    TensorTable,
    encode_table,
    range_name,
)
from tests.rules.test_r_table import columns, heap

A, B = "data/a.safetensors", "data/b.safetensors"
FILES: dict[str, Any] = {A: {}, B: {}}


def _rec(key: str, offs: tuple[int, ...], lens: tuple[int, ...], file: str, codec: str = "none") -> RangeRecord:
    return RangeRecord(offs, lens, file, range_name(key, offs), codec)


def _entries() -> list[TensorEntry]:
    """Three tensors of different ndim, two files, both codecs."""
    return [
        TensorEntry("w", "float32", (4, 6), [_rec("w", (0, 0), (2, 6), A), _rec("w", (2, 0), (2, 6), B, "zstd")]),
        TensorEntry("s", "int64", (), [_rec("s", (), (), B)]),
        TensorEntry("v", "bfloat16", (5,), [_rec("v", (0,), (3,), A, "zstd"), _rec("v", (3,), (2,), A)]),
    ]


def _columns() -> dict[str, np.ndarray]:
    return columns(TensorTable.from_entries(_entries()))


def _st(cols: dict[str, np.ndarray]) -> bytes:
    items, data = [], []
    for name, arr in cols.items():
        a = np.ascontiguousarray(arr, dtype=COLUMNS[name][1])
        items.append((name, COLUMNS[name][0], [a.shape[0]], a.nbytes))
        data.append(a.tobytes())
    return build_header(items, {}) + b"".join(data)


def _zstd(raw: bytes) -> bytes:
    return zstandard.ZstdCompressor(write_content_size=True).compress(raw)


def _decode(cols: dict[str, np.ndarray], codec: str = "zstd", **kw: Any) -> TensorTable:
    raw = _st(cols)
    return decode_table(_zstd(raw) if codec == "zstd" else raw, codec=codec, what="t", files=FILES, **kw)


def _code(fn: Any, *args: Any, **kw: Any) -> CheckpointError:
    with pytest.raises(CheckpointError) as ei:
        fn(*args, **kw)
    return ei.value


def test_the_base_table_decodes() -> None:
    for codec in ("none", "zstd"):
        tab = _decode(_columns(), codec)
        assert tab.keys == ["w", "s", "v"] and tab.paths == [A, B]


# ------------------------------------------------------------------------------ R-TABLE-5/6


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_file_path_column_without_its_last_terminator_is_schema(codec: str) -> None:
    """R-TABLE-5: a non-empty ``file.path`` column ends with 0x00. Its last byte replaced by
    another, the column still splits into the listed paths once that byte is cut off: only the
    terminator check refuses it (mutant: the check dropped, the table was accepted)."""
    cols = _columns()
    assert bytes(cols["file.path"]).endswith(b"\0")
    cols["file.path"][-1] = ord("x")
    assert _code(_decode, cols, codec).code == "PCK-SCHEMA"


@pytest.mark.parametrize("byte", [0x01, 0x09, 0x1B, 0x1F, 0x7F])
@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_every_control_character_in_a_key_is_schema(codec: str, byte: int) -> None:
    """§8.1 / R-TABLE-6: U+0000–U+001F and U+007F are control characters; the earlier tests
    used 0x01, 0x0A and 0x7F only (mutant: ``< 0x1F`` let 0x1F through)."""
    cols = _columns()
    keys = bytes(cols["tensor.key"]).split(b"\0")[:-1]
    keys[1] = b"a" + bytes([byte]) + b"b"
    cols["tensor.key"] = heap(keys)
    err = _code(_decode, cols, codec)
    assert err.code == "PCK-SCHEMA" and "control character" in err.message


def test_space_and_non_ascii_in_keys_are_allowed() -> None:
    """The other side of the boundary: 0x20, 0x7E and 0x80+ (UTF-8) are not control characters."""
    cols = _columns()
    cols["tensor.key"] = heap([b"a b", b"~", "é\u0080x".encode()])
    assert _decode(cols).keys == ["a b", "~", "é\u0080x"]


# ------------------------------------------------------------------------------ R-TABLE-3


@pytest.mark.parametrize("codec", ["gzip", "lz4", "", "ZSTD", "None"])
def test_unknown_table_codec_is_codec_in_every_entry_point(codec: str) -> None:
    """``tensor_table.codec`` is ``none`` or ``zstd`` (else PCK-CODEC): each of the table reader's
    entry points refuses another before it looks at the bytes, also when they are a valid zstd
    frame (mutant: ``check_table_size`` dropped its codec check; the frame was then checked as
    zstd but its bytes decoded as codec none)."""
    raw = _st(_columns())
    data = _zstd(raw)
    assert _code(td.check_table_size, len(data), codec=codec, what="t").code == "PCK-CODEC"
    assert _code(td.check_table_head, data[:18], size=len(data), codec=codec, what="t").code == "PCK-CODEC"
    assert _code(decode_table, data, codec=codec, what="t", files=FILES).code == "PCK-CODEC"
    assert _code(decode_table, raw, codec=codec, what="t", files=FILES).code == "PCK-CODEC"

    def read(lo: int, hi: int, dest: memoryview) -> None:
        dest[:] = data[lo:hi]

    err = _code(td.read_table_file, read, size=len(data), codec=codec, block_size=4096, what="t")
    assert err.code == "PCK-CODEC"


def test_table_size_limits_at_their_boundaries() -> None:
    """R-TABLE-3: codec none, the file size may be 2^32 but not more; codec zstd, the file may be
    ``ZSTD_COMPRESSBOUND(2^32)`` long but not one byte more (PCK-LIMIT from the size alone)."""
    assert MAX_TABLE_BYTES == 1 << 32
    td.check_table_size(MAX_TABLE_BYTES, codec="none", what="t")
    assert _code(td.check_table_size, MAX_TABLE_BYTES + 1, codec="none", what="t").code == "PCK-LIMIT"
    bound = zstd_bound(MAX_TABLE_BYTES)
    assert bound > MAX_TABLE_BYTES
    td.check_table_size(bound, codec="zstd", what="t")
    assert _code(td.check_table_size, bound + 1, codec="zstd", what="t").code == "PCK-LIMIT"


# ------------------------------------------------------------------------------ the cache


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_a_cached_header_is_reused_only_for_the_same_decoded_size(codec: str) -> None:
    """A committer decodes many writer tables with one :class:`TableCache`. A table whose header
    is byte-identical to the previous one's but which holds a byte no column owns is still
    PCK-SHARD-HEADER (§11.2, R-TABLE-4) (mutant: the cached parse reused whatever the size)."""
    raw = _st(_columns())
    cache = TableCache()
    enc = (lambda b: _zstd(b)) if codec == "zstd" else (lambda b: b)
    assert decode_table(enc(raw), codec=codec, what="t", files=FILES, cache=cache).keys == ["w", "s", "v"]
    err = _code(decode_table, enc(raw + b"\0"), codec=codec, what="t", files=FILES, cache=cache)
    assert err.code == "PCK-SHARD-HEADER"
    # and the good table still decodes with the same cache afterwards
    assert decode_table(enc(raw), codec=codec, what="t", files=FILES, cache=cache).paths == [A, B]


def test_a_refused_header_is_not_cached() -> None:
    """A zstd table whose columns end before its decoded size is PCK-SHARD-HEADER every time it
    is decoded, not only the first: the parse made against the columns' end (to tell that case
    from a frame that ends early) is never cached (mutant: it was, and the same table then
    passed with the same cache)."""
    data = _zstd(_without_metadata(_st(_columns())) + b"\0\0\0")
    cache = TableCache()
    for _ in range(3):
        err = _code(decode_table, data, codec="zstd", what="t", files=FILES, cache=cache)
        assert err.code == "PCK-SHARD-HEADER"


def test_cached_declarations_are_reused_only_for_identical_columns() -> None:
    """Writers of one job declare the same tensors; a table whose key column is byte-identical
    to the previous one's but whose shapes differ gets its declaration checks (R-TABLE-6)."""
    cache = TableCache()
    _decode(_columns(), cache=cache)
    cols = _columns()
    cols["tensor.shape"][0] = -1
    assert _code(_decode, cols, cache=cache).code == "PCK-LIMIT"
    cols = _columns()
    cols["tensor.dtype"][0] = 200
    assert _code(_decode, cols, cache=cache).code == "PCK-DTYPE-UNSUPPORTED"
    cols = _columns()
    cols["tensor.shape"][1] = MAX_SIZE  # 4 x 2^53-1 float32: R-TENSOR-1
    assert _code(_decode, cols, cache=cache).code == "PCK-LIMIT"
    cols = _columns()
    keys = bytes(cols["tensor.key"]).split(b"\0")[:-1]
    cols["tensor.key"] = heap([keys[0], keys[0], keys[2]])  # same length, a duplicate key
    assert _code(_decode, cols, cache=cache).code == "PCK-SCHEMA"


# ------------------------------------------------------------------------------ frames


def _raw_frame(raw: bytes, *, block: int = 1 << 17, declared: int | None = None, window_log: int = 17) -> bytes:
    """A zstd frame (not single-segment, 8-byte content size) of ``raw`` in raw blocks of
    ``block`` bytes, declaring ``declared`` (default: ``len(raw)``) decoded bytes."""
    out = bytearray(struct.pack("<I", 0xFD2FB528) + bytes([0xC0, (window_log - 10) << 3]))
    out += struct.pack("<Q", len(raw) if declared is None else declared)
    parts = [raw[i : i + block] for i in range(0, len(raw), block)] or [b""]
    for i, part in enumerate(parts):
        out += struct.pack("<I", (len(part) << 3) | (i == len(parts) - 1))[:3] + part
    return bytes(out)


def test_the_hand_built_frame_decodes() -> None:
    raw = _st(_columns())
    assert decode_table(_raw_frame(raw), codec="zstd", what="t", files=FILES).keys == ["w", "s", "v"]


def test_a_table_frame_longer_than_its_bound_is_codec_from_its_head() -> None:
    """R-TABLE-3 applies R-TENSOR-10 with the declared size as ``m``: a frame longer than
    ``ZSTD_COMPRESSBOUND(m)`` (here: one raw block per decoded byte, 4 stored bytes per byte)
    is PCK-CODEC from its first 18 bytes and its size, before the rest is read (mutant: the
    frame-header check dropped from ``check_table_head``; the frame was read and decoded)."""
    raw = _st(_columns())
    data = _raw_frame(raw, block=1)
    assert len(data) > zstd_bound(len(raw))
    err = _code(td.check_table_head, data[:18], size=len(data), codec="zstd", what="t")
    assert err.code == "PCK-CODEC" and "ZSTD_COMPRESSBOUND" in err.message
    assert _code(decode_table, data, codec="zstd", what="t", files=FILES).code == "PCK-CODEC"
    reads: list[tuple[int, int]] = []

    def read(lo: int, hi: int, dest: memoryview) -> None:
        reads.append((lo, hi))
        dest[:] = data[lo:hi]

    err = _code(td.read_table_file, read, size=len(data), codec="zstd", block_size=64, what="t")
    assert err.code == "PCK-CODEC" and reads == [(0, 64)]


def test_a_table_frame_with_a_window_above_2_27_is_codec_from_its_head() -> None:
    """R-TENSOR-10 for a table: a decoder window above 2^27 bytes is PCK-CODEC from the head."""
    raw = _st(_columns())
    data = _raw_frame(raw, window_log=28)
    err = _code(td.check_table_head, data[:18], size=len(data), codec="zstd", what="t")
    assert err.code == "PCK-CODEC" and "window" in err.message
    assert _code(decode_table, data, codec="zstd", what="t", files=FILES).code == "PCK-CODEC"


def _lying_frame(raw: bytes, declared: int) -> bytes:
    """A real (compressed) zstd frame of ``raw`` whose header declares ``declared`` bytes."""
    data = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(raw)
    assert data[4] == 0  # no content size, checksum or dictionary; not single-segment
    return data[:4] + bytes([0xC0, data[5]]) + struct.pack("<Q", declared) + data[6:]


def _incompressible_table(records: int = 400_000) -> TensorTable:
    """One tensor of ``records`` records with random boxes: about 8 MiB that zstd keeps at more
    than 1 MiB, so the frame's end is not in its first input step (decoding is streamed)."""
    rng = np.random.default_rng(28)
    return TensorTable(
        ["w"], np.array([6], np.uint8), np.array([1], np.uint8), np.array([1 << 40], np.int64),
        np.array([records], np.int64), [A], np.zeros(records, np.uint32),
        np.zeros(records, np.uint8), rng.integers(0, 1 << 40, records),
        rng.integers(1, 1 << 20, records),
    )  # fmt: skip


def _without_metadata(raw: bytes) -> bytes:
    n = int.from_bytes(raw[:8], "little")
    doc = json.loads(raw[8 : 8 + n])
    doc.pop("__metadata__", None)
    head = json.dumps(doc, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + raw[8 + n :]


def test_a_streamed_frame_that_ends_with_the_columns_is_codec_without_metadata() -> None:
    """R-TENSOR-7 (§8.5): a frame that decodes to fewer bytes than it declares is PCK-CODEC,
    also when the decoded bytes hold a consistent table and the frame is long enough to be
    decoded in steps (the parse of the header sees the declared size first)."""
    raw = _without_metadata(encode_table(_incompressible_table(), codec="none"))
    assert decode_table(raw, codec="none", what="t", files=FILES).records == 400_000
    for extra in (1, 4096):
        data = _lying_frame(raw, len(raw) + extra)
        assert len(data) > 1 << 20 and len(raw) > 4 << 20
        assert _code(decode_table, data, codec="zstd", what="t", files=FILES).code == "PCK-CODEC"


def test_a_streamed_frame_that_ends_with_the_columns_is_codec_with_metadata() -> None:
    """The same table as the reference writer stores it (with ``__metadata__``): a bug the
    audit found (``_columns_end`` gave up at the ``__metadata__`` member, which every table
    has, and the short frame was refused as PCK-SHARD-HEADER, not PCK-CODEC as R-TENSOR-7
    says through §8.5)."""
    raw = encode_table(_incompressible_table(), codec="none")
    data = _lying_frame(raw, len(raw) + 1)
    assert _code(decode_table, data, codec="zstd", what="t", files=FILES).code == "PCK-CODEC"


@pytest.mark.parametrize("codec", ["none", "zstd", "gzip"])
def test_a_table_refused_from_its_size_is_not_read_at_all(codec: str) -> None:
    """R-TABLE-3: "a zstd table file longer than ZSTD_COMPRESSBOUND(2^32) is PCK-LIMIT from its
    size alone" (codec none: above 2^32; an unknown codec: PCK-CODEC): ``read_table_file`` asks
    for no byte of it (mutant: its size check dropped, the first block was read first)."""
    size = MAX_TABLE_BYTES + 1 if codec != "zstd" else zstd_bound(MAX_TABLE_BYTES) + 1
    head = _zstd(_st(_columns()))
    reads: list[tuple[int, int]] = []

    def read(lo: int, hi: int, dest: memoryview) -> None:
        reads.append((lo, hi))
        dest[:] = (head + bytes(hi))[lo:hi]

    err = _code(td.read_table_file, read, size=size, codec=codec, block_size=4096, what="t")
    assert err.code == ("PCK-CODEC" if codec == "gzip" else "PCK-LIMIT")
    assert reads == []


def _streamed(keys: list[str], records: int = 300_000) -> TensorTable:
    """A table above one 4 MiB decoding step (so it is decoded in steps, with the key scan)."""
    t = len(keys)
    counts = np.zeros(t, np.int64)
    counts[0] = records
    return TensorTable(
        keys, np.full(t, 6, np.uint8), np.ones(t, np.uint8), np.full(t, 1 << 40, np.int64), counts,
        [A], np.zeros(records, np.uint32), np.zeros(records, np.uint8),
        np.arange(records, dtype=np.int64) * 2, np.ones(records, np.int64),
    )  # fmt: skip


@pytest.mark.parametrize("where", [0, 1])
def test_a_key_of_4097_bytes_fails_in_the_key_scan_of_a_streamed_table(where: int) -> None:
    """§8.1 in a streamed table: a run of 4097 bytes without a terminator cannot be a key of at
    most 1024 characters, and the scan of each decoded piece refuses it there (the bound that
    keeps a column of one repeated byte from costing its declared length); 4096 bytes (1024
    four-byte characters) are fine (mutants: the scan's bounds one byte looser)."""
    ok = ["a", "\U0001f600" * 1024]
    data = encode_table(_streamed(ok))
    assert len(zstandard.decompress(data)) > 4 << 20
    assert decode_table(data, codec="zstd", what="t", files=FILES).keys == ok
    keys = ["a", "b"]
    keys[where] = "k" * 4097
    err = _code(decode_table, encode_table(_streamed(keys)), codec="zstd", what="t", files=FILES)
    assert err.code == "PCK-SCHEMA" and "longer than 4096 bytes" in err.message


def test_bytes_after_a_streamed_frame_are_codec_before_the_table_is_looked_at() -> None:
    """R-TABLE-3 / R-TENSOR-7: a streamed table is checked as one frame (trailing bytes, a
    truncated frame) before any column: PCK-CODEC even when its columns break R-TABLE-6
    (mutant: the frame walk's end check dropped; the column error came first)."""
    good = encode_table(_streamed(["a"]))
    assert decode_table(good, codec="zstd", what="t", files=FILES).keys == ["a"]
    bad = encode_table(_streamed(["a\x01"]))
    assert _code(decode_table, bad, codec="zstd", what="t", files=FILES).code == "PCK-SCHEMA"
    for data in (good + b"\0", bad + b"\0", bad + good, bad[:-1]):
        assert _code(decode_table, data, codec="zstd", what="t", files=FILES).code == "PCK-CODEC"


def _reindent(raw: bytes) -> bytes:
    """The same safetensors file with its header indented by tabs and newlines (valid JSON)."""
    n = int.from_bytes(raw[:8], "little")
    head = json.dumps(json.loads(raw[8 : 8 + n]), indent="\t").encode() + b"\r\n"
    return struct.pack("<Q", len(head)) + head + raw[8 + n :]


@pytest.mark.parametrize("streamed", [False, True])
def test_a_header_with_json_whitespace_decodes(streamed: bool) -> None:
    """§11.2 / §18.3: tab, line feed and carriage return are JSON whitespace. The check of each
    decoded piece of a streamed table's header refuses bytes below 0x20 except those three
    (mutant: it refused the tab too; only streamed tables use it)."""
    tab = _streamed(["a", "b"]) if streamed else TensorTable.from_entries(_entries())
    raw = _reindent(encode_table(tab, codec="none"))
    assert b"\t" in raw[:200] and b"\n" in raw[:200]
    data = _zstd(raw)
    assert (len(raw) > 4 << 20) == streamed
    assert decode_table(data, codec="zstd", what="t", files=FILES).keys == tab.keys
    assert decode_table(raw, codec="none", what="t", files=FILES).keys == tab.keys


@pytest.mark.parametrize("size", [64, 5 << 20])
@pytest.mark.parametrize("beyond", [1, 4, 8])
@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_a_header_length_past_the_decoded_bytes_is_shard_header(codec: str, beyond: int, size: int) -> None:
    """§11.2 for a table: a header length above ``decoded size − 8`` is PCK-SHARD-HEADER before
    any header byte is decoded, also in a streamed table whose "header" bytes are all blanks
    (mutant: compared with the decoded size itself, the streamed read ran past the frame's
    end and raised ValueError)."""
    n = size - 8 + beyond
    raw = struct.pack("<Q", n) + b" " * (size - 8)
    data = _zstd(raw) if codec == "zstd" else raw
    err = _code(decode_table, data, codec=codec, what="t", files=FILES)
    assert err.code == "PCK-SHARD-HEADER" and "header length" in err.message


# ------------------------------------------------------------------------------ tensor_table


def _round_trip() -> TensorTable:
    return decode_table(encode_table(TensorTable.from_entries(_entries())), codec="zstd", what="t", files=FILES)


def test_table_records_equal_the_entries_they_were_built_from() -> None:
    """R-TABLE-5 layout: each tensor's records follow those of the tensors before it; their
    file and codec come from the record's own row (mutants: rows not offset by the tensor;
    names made from lengths; a constant file or codec)."""
    tab = _round_trip()
    want = {e.key: e for e in _entries()}
    for key, t in tab.entries().items():
        assert (t.dtype, t.shape) == (want[key].dtype, want[key].shape)
        assert t.ranges == want[key].ranges, key
        for j, r in enumerate(want[key].ranges):
            assert tab.record(tab.keys.index(key), j) == r


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 7])
def test_iter_records_yields_every_record_in_order_whatever_the_chunk(n: int) -> None:
    """``iter_records`` makes a table's records ``chunk`` at a time: every record, in order, for
    counts around the chunk size (mutant: the last record of each tensor was dropped)."""
    from portable_ckpt.io.tensor_table import iter_records

    recs = [_rec("w", (i,), (1,), A if i % 2 else B, "zstd" if i % 3 else "none") for i in range(n)]
    ents = [TensorEntry("w", "int8", (max(n, 1),), recs), TensorEntry("s", "int8", (), [_rec("s", (), (), A)])]
    tab = decode_table(encode_table(TensorTable.from_entries(ents)), codec="zstd", what="t", files=FILES)
    w = tab.entries()["w"]
    for chunk in (1, 2, 3, 4096):
        assert list(iter_records(w, chunk=chunk)) == recs
    assert list(iter_records(tab.entries()["s"])) == ents[1].ranges


def test_edited_ranges_of_a_table_entry_are_the_ones_used() -> None:
    """``TableTensorEntry.ranges`` may be assigned (its setter is public); afterwards the
    entry is no longer "untouched" and ``record``, ``records`` and ``iter_records`` serve the
    assigned list, not the table's rows (mutants: any of them read the table regardless)."""
    from portable_ckpt.io.tensor_table import iter_records

    tab = _round_trip()
    w = tab.entries()["w"]
    assert w.table_ranges_untouched and w.range_count == 2
    new = [_rec("w", (0, 0), (4, 6), B, "zstd")]
    w.ranges = new
    assert not w.table_ranges_untouched
    assert w.record(0) == new[0]
    assert w.records(np.array([0])) == new
    assert list(iter_records(w)) == new


def test_table_size_constants_are_the_specs() -> None:
    """R-TABLE-3: 2^32 decoded bytes; §8.5: the reference writes a table above 65,536 records."""
    from portable_ckpt.io import tensor_table as tt

    assert tt.MAX_TABLE_BYTES == 1 << 32 == td.MAX_TABLE_BYTES
    assert tt.TABLE_THRESHOLD == 65536


def test_a_streamed_frame_holding_more_than_it_declares_is_codec() -> None:
    """R-TENSOR-7 (§8.5): the frame decodes to exactly its declared size. A streamed table whose
    frame holds bytes past the declared size (after complete, valid columns) is PCK-CODEC
    (mutant: the final check of the stream dropped; the table was accepted)."""
    raw = encode_table(_streamed(["a"]), codec="none")
    assert len(raw) > 4 << 20
    assert decode_table(_lying_frame(raw, len(raw)), codec="zstd", what="t", files=FILES).keys == ["a"]
    for extra in (b"\0", b"x" * 4096):
        data = _lying_frame(raw + extra, len(raw))
        assert _code(decode_table, data, codec="zstd", what="t", files=FILES).code == "PCK-CODEC"


@pytest.mark.parametrize("delta", [-1, 1])
@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_a_ranges_column_longer_or_shorter_than_the_dtype_column_is_schema(codec: str, delta: int) -> None:
    """R-TABLE-5: ``tensor.ranges`` has T values, like ``tensor.dtype``; with one more (a 0)
    or one fewer (its records moved to the tensor before) the sums still agree, and only the
    length check refuses it with PCK-SCHEMA (mutant: that pair unchecked; numpy then failed
    with ValueError)."""
    cols = _columns()
    counts = [int(x) for x in cols["tensor.ranges"]]
    counts = counts + [0] if delta > 0 else [*counts[:-2], counts[-2] + counts[-1]]
    cols["tensor.ranges"] = np.array(counts, np.int64)
    assert sum(counts) == len(cols["range.file"])
    err = _code(_decode, cols, codec)
    assert err.code == "PCK-SCHEMA" and "tensor.ranges" in err.message


def test_encode_table_writes_the_codec_it_is_asked_for() -> None:
    """``encode_table`` writes codec ``none`` (the safetensors bytes) or ``zstd`` (one frame
    that declares its content size) and refuses another codec with PCK-CODEC, rather than
    writing a file the document would then describe wrongly (mutant: it wrote zstd)."""
    tab = TensorTable.from_entries(_entries())
    raw = encode_table(tab, codec="none")
    assert int.from_bytes(raw[:8], "little") < len(raw) and raw[8:9] == b"{"
    data = encode_table(tab, codec="zstd")
    assert zstandard.get_frame_parameters(data).content_size == len(raw)
    assert zstandard.decompress(data) == raw
    for bad in ("gzip", "ZSTD", ""):
        assert _code(encode_table, tab, codec=bad).code == "PCK-CODEC"


#: The column table of spec §8.5, written out independently of ``COLUMNS``: safetensors dtypes
#: are little-endian.
SPEC_COLUMNS = {
    "tensor.key": ("U8", "<u1"), "tensor.dtype": ("U8", "<u1"), "tensor.ndim": ("U8", "<u1"),
    "tensor.shape": ("I64", "<i8"), "tensor.ranges": ("I64", "<i8"), "range.file": ("U32", "<u4"),
    "range.codec": ("U8", "<u1"), "range.offsets": ("I64", "<i8"), "range.lengths": ("I64", "<i8"),
    "file.path": ("U8", "<u1"),
}  # fmt: skip


def test_columns_are_the_specs_little_endian_columns_both_ways() -> None:
    """§8.5 / §11.1: a table written by ``encode_table`` read with the spec's dtypes (little
    endian) holds the entries; a table built with the spec's dtypes in another column order
    decodes to them (mutants: a column's byte order or the stored order changed in both the
    writer and the reader, so a round trip alone could not tell)."""
    tab = TensorTable.from_entries(_entries())
    raw = encode_table(tab, codec="none")
    n = int.from_bytes(raw[:8], "little")
    head = json.loads(raw[8 : 8 + n])
    got = {}
    for name, (st, dt) in SPEC_COLUMNS.items():
        assert head[name]["dtype"] == st
        b, e = head[name]["data_offsets"]
        got[name] = np.frombuffer(raw[8 + n + b : 8 + n + e], dt)
    assert list(got["tensor.shape"]) == [4, 6, 5] and list(got["tensor.ranges"]) == [2, 1, 2]
    assert list(got["range.offsets"]) == [0, 0, 2, 0, 0, 3]
    assert list(got["range.lengths"]) == [2, 6, 2, 6, 3, 2]
    assert list(got["range.file"]) == [0, 1, 1, 0, 0] and list(got["range.codec"]) == [0, 1, 0, 1, 0]
    # hand-built with the spec's dtypes, columns in reverse order
    items, blobs = [], []
    for name in reversed(list(SPEC_COLUMNS)):
        st, dt = SPEC_COLUMNS[name]
        a = np.ascontiguousarray(got[name], dt)
        items.append((name, st, [a.shape[0]], a.nbytes))
        blobs.append(a.tobytes())
    hand = build_header(items, {}) + b"".join(blobs)
    back = decode_table(hand, codec="none", what="t", files=FILES)
    assert [e.shape for e in back.entries().values()] == [(4, 6), (), (5,)]
    assert {k: e.ranges for k, e in back.entries().items()} == {e.key: e.ranges for e in _entries()}
