"""A zstd tensor table is decoded in steps, header first (spec §8.5, R-TABLE-3).

Before: ``decode_table`` decoded the whole frame in one call into a buffer of its declared
content size, so a 32 KiB RLE frame of zeros declaring 1 GiB (checksums recomputed by the
attacker) cost 1 GiB in ``open`` and in the committer before the table's 8-byte length prefix
was looked at (128 KiB: 4 GiB, 12 s). Now the prefix and header come from the first decoded
bytes, the column lengths are checked against each other and the declared size, and columns
grow only as their bytes decode, each checked once complete (``tensor.key`` piece by piece).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zstandard

import portable_ckpt
import portable_ckpt.io.table_decode as td
from portable_ckpt.io.checksum import BlockHasher
from portable_ckpt.io.safetensors_io import build_header
from portable_ckpt.io.table_decode import decode_table
from portable_ckpt.io.tensor_table import COLUMNS, TensorTable, encode_table
from tests.hardening._hand import rle_frame
from tests.hardening._util import cpu_bound, expect_code, memory_bound, rechecksum, time_bound

#: What refusing a bomb may cost (traced Python/numpy heap): the 4 MiB decode step plus slack.
SMALL = 16 << 20
GIB = 1 << 30



def _frame(prefix: bytes, fill: int, byte: int = 0, declared: int | None = None) -> bytes:
    """A zstd frame: ``prefix`` in raw blocks, then ``fill`` copies of ``byte`` in RLE blocks."""
    total = len(prefix) + fill if declared is None else declared
    out = bytearray(struct.pack("<I", 0xFD2FB528) + bytes([0xC0, (17 - 10) << 3]))
    out += struct.pack("<Q", total)
    blocks: list[bytes] = []
    for i in range(0, len(prefix), 1 << 17):
        part = prefix[i : i + (1 << 17)]
        blocks.append(struct.pack("<I", len(part) << 3)[:3] + part)
    while fill:
        k = min(fill, 1 << 17)
        blocks.append(struct.pack("<I", (k << 3) | 2)[:3] + bytes([byte]))
        fill -= k
    if not blocks:
        blocks.append(b"\0\0\0")
    last = bytearray(blocks[-1])
    last[0] |= 1
    blocks[-1] = bytes(last)
    return bytes(out + b"".join(blocks))


def _header(sizes: dict[str, int], order: list[str] | None = None) -> bytes:
    """A table header whose columns have ``sizes`` values, stored in ``order``."""
    items = []
    for name in order or list(COLUMNS):
        st, np_dt = COLUMNS[name]
        n = sizes.get(name, 0)
        items.append((name, st, [n], n * np.dtype(np_dt).itemsize))
    return build_header(items, {})


def _table_version(root: Path) -> str:
    from portable_ckpt.io.commit import commit
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id
    from portable_ckpt.storage import open_storage

    storage = open_storage(str(root), create=True)
    attempt = new_attempt_id(1)
    w = ShardWriter(storage, attempt, 0, write_index=False)
    w.add_tensor("w", np.arange(6, dtype=np.float32))
    commit(storage, attempt, step=1, indexes=[w.finish()], expected_writers=[0],
           continuation=portable_ckpt.Continuation("exact", 1, None), tensor_table=True)
    return str(root / attempt)


def _install(vdir: str, blob: bytes) -> None:
    """Replace the version's table with ``blob`` (codec zstd), checksums recomputed."""
    doc = json.loads((Path(vdir) / "manifest.json").read_bytes())
    rel = doc["tensor_table"]["file"]
    assert doc["tensor_table"]["codec"] == "zstd"
    (Path(vdir) / rel).write_bytes(blob)
    rechecksum(vdir, rel)


# -- the reader ---------------------------------------------------------------------------------
def test_rle_bomb_table_is_refused_from_its_header(tmp_path: Path) -> None:
    """32 KiB of RLE zeros declaring 1 GiB: the length prefix (0) ends it, in a few MiB."""
    vdir = _table_version(tmp_path)
    blob = rle_frame(GIB)
    assert len(blob) < 40 << 10
    _install(vdir, blob)
    with time_bound(30), cpu_bound(5), memory_bound(SMALL):
        err = expect_code("PCK-SHARD-HEADER", portable_ckpt.open, vdir)
    assert "tensor-table" in err.message


def test_rle_bomb_table_peak_rss(tmp_path: Path) -> None:
    """The same through a fresh process: peak RSS (C allocations included) barely moves."""
    vdir = _table_version(tmp_path)
    _install(vdir, rle_frame(GIB))
    # ru_maxrss is inherited across fork and exec (an earlier test's peak would hide this one):
    # the child resets its VmHWM through /proc/self/clear_refs instead.
    code = (
        "import sys, portable_ckpt\n"
        "def kib(field):\n"
        "    with open('/proc/self/status') as f:\n"
        "        return next(int(x.split()[1]) for x in f if x.startswith(field))\n"
        "try:\n"
        "    with open('/proc/self/clear_refs', 'w') as f:\n"
        "        f.write('5')\n"
        "except OSError:\n"
        "    print('unsupported 0'); sys.exit()\n"
        "base = kib('VmRSS:')\n"
        "try:\n"
        "    portable_ckpt.open(sys.argv[1]); print('opened')\n"
        "except portable_ckpt.CheckpointError as e:\n"
        "    print(e.code)\n"
        "print((kib('VmHWM:') - base) * 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, vdir], capture_output=True, text=True,
                         timeout=120, check=True, cwd=Path(__file__).parents[2])
    result, growth = out.stdout.split()
    if result == "unsupported":
        pytest.skip("/proc/self/clear_refs cannot reset the peak RSS here")
    assert result == "PCK-SHARD-HEADER"
    assert int(growth) < 64 << 20, f"peak RSS grew by {int(growth) >> 20} MiB"


def test_header_length_then_bytes_json_cannot_hold(tmp_path: Path) -> None:
    """A prefix announcing a 90 MB header followed by zeros: refused in the first decoded piece."""
    vdir = _table_version(tmp_path)
    _install(vdir, _frame(struct.pack("<Q", 90_000_000), GIB))
    with time_bound(30), cpu_bound(5), memory_bound(SMALL):
        err = expect_code("PCK-SHARD-HEADER", portable_ckpt.open, vdir)
    assert "0x00" in err.message


def test_header_length_above_the_header_limit_is_refused_before_decoding(tmp_path: Path) -> None:
    """mutation audit 22 A-16: a prefix over MAX_HEADER_BYTES is refused from the prefix alone.

    The frame declares ~300 MB and its prefix a 200 MB header of spaces (bytes JSON can hold):
    only the MAX_HEADER_BYTES bound stops the reader decoding those 200 MB before parsing.
    """
    vdir = _table_version(tmp_path)
    n = 200_000_000
    assert n > td.MAX_HEADER_BYTES
    _install(vdir, _frame(struct.pack("<Q", n), 300_000_000, byte=0x20))
    with time_bound(30), cpu_bound(5), memory_bound(SMALL):
        err = expect_code("PCK-SHARD-HEADER", portable_ckpt.open, vdir)
    assert f"header length {n}" in err.message


def test_zeros_after_a_valid_header_fail_in_the_first_column(tmp_path: Path) -> None:
    """A consistent header for ~1 GiB of columns, then zeros: tensor.key fails in its first piece."""
    vdir = _table_version(tmp_path)
    t, r = 1 << 24, 1 << 26
    head = _header({"tensor.key": 1 << 29, "tensor.dtype": t, "tensor.ndim": t,
                    "tensor.ranges": t, "range.file": r, "range.codec": r})
    _install(vdir, _frame(head, (1 << 29) + 10 * t + 5 * r))
    with time_bound(30), cpu_bound(5), memory_bound(SMALL):
        err = expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)
    assert "key #0" in err.message


def test_inconsistent_column_lengths_fail_from_the_header(tmp_path: Path) -> None:
    """Column lengths that cannot agree (R-TABLE-5) are refused before any column decodes."""
    vdir = _table_version(tmp_path)
    t = 1 << 20
    bad = [
        {"tensor.key": 2 * t, "tensor.dtype": t, "tensor.ndim": t, "tensor.ranges": t - 1},
        {"range.file": 1 << 26, "range.codec": 1},
        {"range.offsets": 1 << 26},
        {"tensor.key": 2 * t - 1, "tensor.dtype": t, "tensor.ndim": t, "tensor.ranges": t},
    ]
    for sizes in bad:
        head = _header(sizes)
        fill = sum(n * np.dtype(COLUMNS[c][1]).itemsize for c, n in sizes.items())
        _install(vdir, _frame(head, fill, byte=1))
        with time_bound(30), cpu_bound(5), memory_bound(SMALL):
            expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)


def test_consistent_hostile_table_costs_at_most_its_decoded_columns(tmp_path: Path) -> None:
    """The remaining bound (see ``decode_table``): columns stored before the failing one are held.

    range.file and range.codec first (zeros are legal values there), tensor.key last: the frame
    of zeros fails on the empty key #0, having held the 5 bytes per record it decoded before.
    """
    vdir = _table_version(tmp_path)
    r = 6 << 20  # 30 MiB of range.file + range.codec
    order = ["range.file", "range.codec", "tensor.ranges", "tensor.dtype", "tensor.ndim",
             "tensor.shape", "range.offsets", "range.lengths", "file.path", "tensor.key"]
    head = _header({"tensor.key": 2, "tensor.dtype": 1, "tensor.ndim": 1, "tensor.ranges": 1,
                    "range.file": r, "range.codec": r, "file.path": 2}, order)
    _install(vdir, _frame(head, 5 * r + 1 + 1 + 8 + 2 + 2))
    with time_bound(60), cpu_bound(10), memory_bound(5 * r + SMALL):
        err = expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)
    assert "key #0" in err.message


# -- the committer (writer-index tables share the decoder) ---------------------------------------
def test_committer_refuses_a_bomb_writer_table(tmp_path: Path) -> None:
    from portable_ckpt.io.commit import commit
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id
    from portable_ckpt.storage import open_storage

    storage = open_storage(str(tmp_path), create=True)
    attempt = new_attempt_id(1)
    w = ShardWriter(storage, attempt, 0, tensor_table=True)
    w.add_tensor("x", np.ones((4, 2), np.float32))
    w.finish()
    ipath = tmp_path / attempt / "index" / "w00000.json"
    doc = json.loads(ipath.read_text())
    rel = doc["tensor_table"]["file"]
    blob = rle_frame(GIB)
    (tmp_path / attempt / rel).write_bytes(blob)
    rec = doc["files"][rel]
    h = BlockHasher(rec["checksum"]["block_size"])
    h.update(blob)
    rec["size"], rec["checksum"]["blocks"] = len(blob), h.blocks()
    doc["tensor_table"]["codec"] = "zstd"
    ipath.write_text(json.dumps(doc))
    with time_bound(30), cpu_bound(5), memory_bound(SMALL):
        expect_code("PCK-SHARD-HEADER", commit, storage, attempt, step=1, expected_writers=[0])


# -- decoding in pieces equals decoding at once ---------------------------------------------------
def _sample_table(keys: list[str]) -> TensorTable:
    t = len(keys)
    return TensorTable(
        keys, np.ones(t, np.uint8), np.full(t, 2, np.uint8), np.tile(np.array([4, 3]), t),
        np.full(t, 2, np.int64), ["data/a", "data/b"], np.tile(np.array([0, 1], np.uint32), t),
        np.tile(np.array([0, 1], np.uint8), t), np.tile(np.array([0, 0, 2, 0]), t),
        np.tile(np.array([2, 3, 2, 3]), t),
    )  # fmt: skip


FILES = {"data/a": None, "data/b": None}
KEYS = ["a", "ü" * 1024, "model.layers.0.w", "x" * 1024, "\U0001f600" * 1024, "a@b@0,1", "z"]


@pytest.mark.parametrize("step", [1, 2, 3, 5, 7, 64, 4095, 4097])
def test_decoding_in_small_steps_equals_one_step(step: int, monkeypatch: pytest.MonkeyPatch) -> None:
    blob = encode_table(_sample_table(KEYS), codec="zstd")
    whole = decode_table(blob, codec="zstd", what="t", files=FILES)
    monkeypatch.setattr(td, "_OUT_STEP", step)
    monkeypatch.setattr(td, "_IN_STEP", max(1, step // 2))
    part = decode_table(blob, codec="zstd", what="t", files=FILES)
    assert part.keys == whole.keys == KEYS
    for name in ("dtypes", "ndim", "shape", "counts", "file", "codec", "offsets", "lengths"):
        assert np.array_equal(getattr(part, name), getattr(whole, name)), name


@pytest.mark.parametrize("step", [1, 3, 4096, 1 << 22])
@pytest.mark.parametrize(
    "keys",
    [["a", "", "b"], [""], ["a", "b\x01c"], ["a\x7f"], ["k" * 4097], ["a", "\U0001f600" * 1025],
     ["b", "k" * 5000]],
    ids=["empty-middle", "empty-first", "control", "del", "4097-bytes", "1025-chars", "long-last"],
)
def test_bad_keys_are_schema_in_any_step(keys: list[str], step: int,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(td, "_OUT_STEP", step)
    blob = encode_table(_sample_table(keys), codec="zstd")
    for codec, data in (("zstd", blob), ("none", encode_table(_sample_table(keys), codec="none"))):
        expect_code("PCK-SCHEMA", decode_table, data, codec=codec, what="t", files=FILES)


def test_bytes_after_the_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoded bytes no column owns are PCK-SHARD-HEADER; a frame that stops where the columns
    stop but declares more is PCK-CODEC (R-TENSOR-7), as before."""
    raw = encode_table(_sample_table(["a"]), codec="none")
    expect_code("PCK-SHARD-HEADER", decode_table, raw + b"\0", codec="none", what="t", files=FILES)
    expect_code("PCK-SHARD-HEADER", decode_table, _frame(raw, 1), codec="zstd", what="t",
            files=FILES)
    expect_code("PCK-CODEC", decode_table, _frame(raw, 0, declared=len(raw) + 1), codec="zstd",
            what="t", files=FILES)
    expect_code("PCK-CODEC", decode_table, _frame(raw, 0, declared=len(raw) + GIB), codec="zstd",
            what="t", files=FILES)
    assert decode_table(_frame(raw, 0), codec="zstd", what="t", files=FILES).keys == ["a"]



def _many_short_strings(column: str, n_bytes: int) -> bytes:
    """A consistent header (2T <= key bytes <= 4097T) whose ``column`` is ``"ab\\0"`` repeated."""
    t = -(-n_bytes // 4097)
    keys = b"".join(b"k%d\0" % i for i in range(t))
    sizes = {"tensor.key": n_bytes if column == "tensor.key" else len(keys),
             "tensor.dtype": t, "tensor.ndim": t, "tensor.ranges": t}
    if column == "file.path":
        sizes["file.path"] = n_bytes
    head = _header(sizes)
    body = bytearray(head)
    for name, n in ((c, sizes.get(c, 0)) for c in COLUMNS):
        width = np.dtype(COLUMNS[name][1]).itemsize
        if name == column:
            body += b"ab\0" * (n // 3)
        elif name == "tensor.key":
            body += keys
        else:
            body += bytes(n * width)
    return zstandard.ZstdCompressor(level=3, write_content_size=True).compress(bytes(body))


@pytest.mark.parametrize("column", ["tensor.key", "file.path"])
def test_a_column_of_many_short_strings_is_counted_before_it_is_split(
    tmp_path: Path, column: str
) -> None:
    """Outside review, round 2: 6 KB of ``"ab\\0"`` repeated made ~22M Python strings (1.8 GB)
    before the count refused them. The count comes first now: the cost is the column's bytes."""
    vdir = _table_version(tmp_path)
    n = (16 << 20) // 3 * 3
    blob = _many_short_strings(column, n)
    assert len(blob) < 64 << 10
    _install(vdir, blob)
    with time_bound(30), cpu_bound(10), memory_bound(2 * n + SMALL):
        err = expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)
    assert ("keys" if column == "tensor.key" else "paths") in err.message
