"""Reading (§10) and safetensors shards (§11)."""

from __future__ import annotations

import itertools
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import portable_ckpt
from portable_ckpt.format.dtypes import DTYPES
from portable_ckpt.io.versions import load_manifest

from ._util import (
    RecordingStorage,
    build_version,
    edit_manifest,
    expect_code,
    open_and_read_all,
    open_recorded,
    read_manifest,
    rewrite_file,
    rewrite_shard_header,
    sample_array,
    save_sharded,
    shard_header,
)


def test_latest_skips_invalid_commit_records(tmp_path: Path) -> None:
    """R-READ-1: resolving the latest version skips invalid commit records; step= picks the greatest."""
    v1 = build_version(tmp_path, step=5)[1]
    v2 = build_version(tmp_path, step=5)[1]
    bad = build_version(tmp_path, step=9)[0]
    (bad / "manifest.json").write_text('{"format": "portable-ckpt", "format_version": "1.0"}')
    assert portable_ckpt.open(tmp_path).id == v2.attempt_id
    assert portable_ckpt.open(tmp_path, step=5).id == v2.attempt_id
    assert v1.attempt_id != v2.attempt_id
    expect_code("PCK-NOT-FOUND", portable_ckpt.open, tmp_path, step=9)


def test_all_document_checks_happen_before_any_data_file_is_read(tmp_path: Path) -> None:
    """R-READ-2: §16.3, path and range checks run before any data file of the version is read."""
    vdir, m = build_version(tmp_path)
    bad_mutations = [
        lambda d: d["tensors"]["b"]["ranges"][0].__setitem__("lengths", [6]),
        lambda d: d["tensors"]["b"]["ranges"][0].__setitem__("file", "data/../x"),
        lambda d: d.__setitem__("must_understand", ["x"]),
    ]
    original = (vdir / "manifest.json").read_bytes()
    for mutate in bad_mutations:
        (vdir / "manifest.json").write_bytes(original)
        edit_manifest(vdir, mutate)
        st = RecordingStorage(tmp_path)
        with pytest.raises(portable_ckpt.CheckpointError):
            load_manifest(st, m.attempt_id)
        assert not [p for p, *_ in st.reads() if "/data/" in p or "/entries/" in p]


@pytest.fixture(scope="module")
def grid_version(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    root = tmp_path_factory.mktemp("grid")
    arr = sample_array("int32", (13, 11, 5), seed=2)
    m = save_sharded(root, {"t": (arr, (3, 2, 2))}, writers=3, entries={})
    return root / m.attempt_id, arr


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_box_delivers_exactly_its_elements(grid_version: tuple[Path, np.ndarray],
                                               data: st.DataObject) -> None:
    """R-READ-3: a box read delivers exactly the box's elements."""
    vdir, arr = grid_version
    offs = [data.draw(st.integers(0, s - 1)) for s in arr.shape]
    lens = [data.draw(st.integers(1, s - o)) for s, o in zip(arr.shape, offs, strict=True)]
    ck = portable_ckpt.open(vdir)
    got = ck.read("t", offs, lens)
    want = arr[tuple(slice(o, o + n) for o, n in zip(offs, lens, strict=True))]
    np.testing.assert_array_equal(got, want)
    out = np.full(tuple(lens[::-1]), -1, dtype=np.int32).T  # a non-contiguous destination
    ck.read("t", offs, lens, out=out)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize(
    "offsets, lengths",
    [([0, 0, -1], [1, 1, 1]), ([0, 0, 0], [14, 1, 1]), ([12, 0, 0], [2, 1, 1]),
     ([0, 0], [1, 1]), ([0, 0, 0], [1, 1]), ([0, 0, 5], [1, 1, 1]), ([0, 0, 0], [1, 1, -1])],
)
def test_box_outside_the_tensor_is_a_usage_error(grid_version: tuple[Path, np.ndarray],
                                                 offsets: list[int], lengths: list[int]) -> None:
    """R-READ-3: a requested box outside the tensor's shape is PCK-USAGE, before any I/O."""
    vdir, _ = grid_version
    ck = portable_ckpt.open(vdir)
    expect_code("PCK-USAGE", ck.read, "t", offsets, lengths)
    assert ck.stats.bytes_read == 0


@pytest.mark.parametrize("offsets, lengths", [([0, 0, 0], [0, 2, 2]), ([13, 0, 0], [0, 2, 2]),
                                              ([3, 1, 2], [5, 0, 0]), ([0, 11, 0], [13, 0, 2])])
def test_a_box_with_a_zero_length_delivers_no_elements(grid_version: tuple[Path, np.ndarray],
                                                       offsets: list[int],
                                                       lengths: list[int]) -> None:
    """R-READ-3 (errata 16, reader review R6): a box with a zero length lies inside the shape
    (also at offsets[i] = shape[i]) and delivers an empty array of the box's lengths; one
    element further is outside (PCK-USAGE)."""
    vdir, arr = grid_version
    ck = portable_ckpt.open(vdir)
    got = ck.read("t", offsets, lengths)
    assert got.shape == tuple(lengths) and got.dtype == arr.dtype
    beyond = [o + 1 if n == 0 else o for o, n in zip(offsets, lengths, strict=True)]
    if any(b > s for b, s in zip(beyond, arr.shape, strict=True)):
        expect_code("PCK-USAGE", ck.read, "t", beyond, lengths)


@pytest.mark.parametrize("defect", ["gap", "overlap"])
def test_the_box_is_checked_before_coverage(tmp_path: Path, defect: str) -> None:
    """R-READ-3 ("first"): a box outside the shape is the caller's PCK-USAGE even when the
    tensor's coverage is broken; the lazy coverage check said PCK-COVERAGE-* (reader review F6).
    A box inside the shape then gets the coverage code."""
    vdir, _ = build_version(tmp_path)

    def edit(d: dict[str, Any]) -> None:
        ranges = d["tensors"]["a"]["ranges"]
        if defect == "gap":
            ranges.pop()
        else:
            ranges.append(dict(ranges[0]))

    edit_manifest(vdir, edit)
    ck = portable_ckpt.open(vdir)
    shape = ck.tensors["a"].shape
    expect_code("PCK-USAGE", ck.read, "a", [0] * len(shape), [s + 1 for s in shape])
    expect_code("PCK-USAGE", ck.plan_read, "a", [-1] + [0] * (len(shape) - 1), [1] * len(shape))
    expect_code(f"PCK-COVERAGE-{defect.upper()}", ck.read, "a")


def test_each_element_comes_from_the_range_that_covers_it(tmp_path: Path) -> None:
    """R-READ-3: with distinct per-range contents, every element comes from its own range."""
    from portable_ckpt.format.naming import new_attempt_id
    from portable_ckpt.io.commit import commit
    from portable_ckpt.io.writer import ShardWriter
    from portable_ckpt.storage import open_storage

    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    ws = [ShardWriter(storage, attempt, w) for w in range(3)]
    ws[0].add_tensor("t", np.full((2, 6), 10, np.int16), offsets=[0, 0], global_shape=[6, 6])
    ws[1].add_tensor("t", np.full((4, 3), 20, np.int16), offsets=[2, 0], global_shape=[6, 6])
    ws[2].add_tensor("t", np.full((4, 3), 30, np.int16), offsets=[2, 3], global_shape=[6, 6])
    commit(storage, attempt, step=1, indexes=[w.finish() for w in ws], expected_writers=[0, 1, 2])
    got = portable_ckpt.open(tmp_path).read("t", [1, 2], [3, 3])
    assert got.tolist() == [[10, 10, 10], [20, 30, 30], [20, 30, 30]]


def test_partial_read_reads_only_needed_blocks_and_header(tmp_path: Path) -> None:
    """R-READ-4: codec none: only the blocks holding requested bytes plus the header's blocks."""
    arr = np.arange(64 * 1024, dtype=np.float32).reshape(256, 256)  # 256 KiB in one range
    m = save_sharded(tmp_path, {"t": (arr, (1, 1))}, writers=1, block_size=4096, entries={})
    vdir = tmp_path / m.attempt_id
    r = read_manifest(vdir)["tensors"]["t"]["ranges"][0]
    n_hdr, header, _ = shard_header(vdir / r["file"])
    data_start = 8 + n_hdr + header[r["name"]]["data_offsets"][0]
    for offs, lens in (([100, 7], [3, 5]), ([0, 0], [1, 256]), ([255, 255], [1, 1]),
                       ([10, 0], [20, 1])):
        st, ck = open_recorded(tmp_path, m.attempt_id)
        got = ck.read("t", offs, lens)
        np.testing.assert_array_equal(got, arr[offs[0]:offs[0] + lens[0], offs[1]:offs[1] + lens[1]])
        allowed: set[int] = set(range(0, (8 + n_hdr + 4095) // 4096))  # header blocks
        for i in range(lens[0]):
            lo = data_start + ((offs[0] + i) * 256 + offs[1]) * 4
            hi = lo + lens[1] * 4
            allowed.update(range(lo // 4096, (hi - 1) // 4096 + 1))
        touched: set[int] = set()
        for _path, o, n in st.reads(m.attempt_id + "/data/"):
            touched.update(range(o // 4096, (o + n - 1) // 4096 + 1))
        assert touched <= allowed, sorted(touched - allowed)


def test_unknown_tensor_key(tmp_path: Path) -> None:
    """R-READ-5: a tensor key that does not exist is PCK-TENSOR-MISSING."""
    vdir, _ = build_version(tmp_path)
    ck = portable_ckpt.open(vdir)
    for key in ("nope", "A", "a ", ""):
        expect_code("PCK-TENSOR-MISSING", ck.read, key)
        expect_code("PCK-TENSOR-MISSING", ck.plan_read, key)


def test_shards_are_accepted_by_the_safetensors_library(tmp_path: Path) -> None:
    """R-SHARD-1: data files load with the reference safetensors library; tensors packed densely."""
    from safetensors import safe_open

    # Every row of the table (contributor review D7: a list here missed a row added later).
    tensors = {d: (sample_array(d, (7, 3), seed=i), (2, 1)) for i, d in enumerate(DTYPES)}
    for codec in ("none", "zstd"):
        m = save_sharded(tmp_path / codec, tensors, writers=2, codec=codec, entries={},
                         max_file_bytes=120)
        vdir = tmp_path / codec / m.attempt_id
        doc = read_manifest(vdir)
        for rel in (p for p in doc["files"] if p.startswith("data/")):
            path = vdir / rel
            n_hdr, header, data = shard_header(path)
            spans = sorted(v["data_offsets"] for k, v in header.items() if k != "__metadata__")
            assert spans[0][0] == 0 and spans[-1][1] == len(data)
            assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
            with safe_open(str(path), framework="pt") as f:  # type: ignore[no-untyped-call]
                for name in f.keys():
                    t = f.get_tensor(name)
                    b, e = header[name]["data_offsets"]
                    assert t.numel() * t.element_size() == e - b
                    assert list(t.shape) == header[name]["shape"]


def test_header_is_space_padded_to_a_multiple_of_8(tmp_path: Path) -> None:
    """R-SHARD-2: the header length N is a multiple of 8, padded with ASCII spaces."""
    for i, key in enumerate(["a", "ab", "abc", "abcd" * 7, "k\u00e9y", "x" * 13]):
        m = save_sharded(tmp_path / str(i), {key: (np.ones(i + 1, np.float32), (1,))},
                         writers=1, entries={})
        vdir = tmp_path / str(i) / m.attempt_id
        for rel in (p for p in read_manifest(vdir)["files"] if p.startswith("data/")):
            raw = (vdir / rel).read_bytes()
            n = struct.unpack("<Q", raw[:8])[0]
            assert n % 8 == 0
            text = raw[8:8 + n]
            body = text.rstrip(b" ")
            assert json.loads(body) is not None and set(text[len(body):]) <= {0x20}


def _shard_metadata(data: bytes) -> Any:
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8 : 8 + n])["__metadata__"]


def test_shards_and_tables_of_a_1_1_version_say_shard_rules_1_0(tmp_path: Path) -> None:
    """R-SHARD-3 (issue 16 guess 11): "portable_ckpt": "1.0" names the shard rules of §11, which
    1.1 did not change; the data shards of a 1.1 version keep it. A tensor table is no data
    shard: its __metadata__ is ignored (R-TABLE-4), and the reference committer writes "1.1"."""
    import zstandard

    from portable_ckpt.format.naming import new_attempt_id
    from portable_ckpt.io.commit import commit
    from portable_ckpt.io.writer import ShardWriter
    from portable_ckpt.storage import open_storage

    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(2)
    w = ShardWriter(storage, attempt, 0)
    w.add_tensor("x", np.arange(6, dtype=np.float32))
    m = commit(storage, attempt, step=2, indexes=[w.finish()], expected_writers=[0],
               tensor_table=True)
    vdir = tmp_path / attempt
    assert read_manifest(vdir)["format_version"] == "1.1" and m.tensor_table is not None
    shards = [p for p in read_manifest(vdir)["files"] if p.startswith("data/")]
    assert shards
    for rel in shards:
        assert _shard_metadata((vdir / rel).read_bytes())["portable_ckpt"] == "1.0"
    table = zstandard.ZstdDecompressor().decompress((vdir / m.tensor_table.file).read_bytes())
    assert _shard_metadata(table)["portable_ckpt"] == "1.1"


@pytest.mark.parametrize("meta", [None, {"format": "tf"}, {}, {"x": "y", "portable_ckpt": "9.9"}])
def test_reader_does_not_depend_on_metadata(tmp_path: Path, meta: Any) -> None:
    """R-SHARD-3: removing or changing __metadata__ does not change what is read."""
    vdir, _ = build_version(tmp_path)
    for rel in [p for p in read_manifest(vdir)["files"] if p.startswith("data/")]:
        def fix(h: dict) -> None:  # type: ignore[type-arg]
            h.pop("__metadata__", None)
            if meta is not None:
                h["__metadata__"] = meta

        rewrite_shard_header(vdir, rel, fix)
    ck = open_and_read_all(vdir)
    np.testing.assert_array_equal(ck.read("a"), np.arange(64, dtype=np.float32).reshape(8, 8))


def _data_rel(vdir: Path, key: str = "b") -> str:
    return str(read_manifest(vdir)["tensors"][key]["ranges"][0]["file"])


@pytest.mark.parametrize("raw", [b"", b"\x01", b"\x00" * 7])
def test_file_shorter_than_8_bytes(tmp_path: Path, raw: bytes) -> None:
    """R-SHARD-4: a data file shorter than 8 bytes is PCK-SHARD-HEADER."""
    vdir, _ = build_version(tmp_path)
    rewrite_file(vdir, _data_rel(vdir), raw)
    expect_code("PCK-SHARD-HEADER", open_and_read_all, vdir)


@pytest.mark.parametrize("n", [2**63, 100_000_001, "size-7", "size+100"])
def test_absurd_header_length_is_refused_before_reading(tmp_path: Path, n: Any) -> None:
    """R-SHARD-4: N > 100,000,000 or N > size - 8 is refused before the header is read."""
    vdir, m = build_version(tmp_path)
    rel = _data_rel(vdir)
    raw = (vdir / rel).read_bytes()
    size = len(raw)
    value = size - 7 if n == "size-7" else size + 100 if n == "size+100" else n
    rewrite_file(vdir, rel, struct.pack("<Q", value) + raw[8:])
    st, ck = open_recorded(tmp_path, m.attempt_id)
    expect_code("PCK-SHARD-HEADER", ck.read, "b")
    assert all(o + n_ <= size for p, o, n_ in st.reads(f"{m.attempt_id}/{rel}"))
    assert ck.stats.peak_scratch_bytes < 1 << 20


def test_header_length_limit_is_100_000_000_bytes_whatever_the_file_size() -> None:
    """R-SHARD-4 (traceability audit F7): the limit itself, in a file large enough that the
    ``N <= size - 8`` clause does not refuse first (the test above cannot tell the two apart)."""
    from portable_ckpt.io.safetensors_io import load_header

    class Reached(Exception):
        """The reader asked for the rest of the header: the length passed its checks."""

    for length in (100_000_000, 100_000_001, 100_000_008):
        reads: list[tuple[int, int]] = []

        def read(lo: int, hi: int, n: int = length, seen: list[Any] = reads) -> bytes:
            seen.append((lo, hi))
            if lo > 0:
                raise Reached
            return struct.pack("<Q", n) + b"{" + b" " * (hi - lo - 9)

        if length == 100_000_000:  # the limit itself is accepted (review of the change D5)
            with pytest.raises(Reached):
                load_header(read, file_size=300_000_000, what="f", probe=4096)
            assert reads == [(0, 4096), (4096, 100_000_008)]
            continue
        expect_code("PCK-SHARD-HEADER", load_header, read, file_size=300_000_000, what="f",
                    probe=4096)
        assert reads == [(0, 4096)]  # refused before the header is read


def test_header_length_past_the_file_is_refused_before_the_header_is_read(tmp_path: Path) -> None:
    """mutation audit 22 A-67: R-SHARD-4's ``N <= size - 8`` alone (N far below the limit): a
    real shard whose prefix says N = size - 7 is refused from its first read, nothing past the
    file asked for; N = size - 8 passes that check (the header is then read)."""
    from portable_ckpt.io.safetensors_io import load_header

    vdir, _ = build_version(tmp_path)
    raw = (vdir / _data_rel(vdir)).read_bytes()
    size = len(raw)
    for n, refused in ((size - 7, True), (size - 8, False)):
        data = struct.pack("<Q", n) + raw[8:]
        reads: list[tuple[int, int]] = []

        def read(lo: int, hi: int, data: bytes = data, seen: list[Any] = reads) -> bytes:
            seen.append((lo, hi))
            return data[lo:hi]

        if refused:
            err = expect_code("PCK-SHARD-HEADER", load_header, read, file_size=size, what="f",
                              probe=8)
            assert f"header length {n} exceeds the limit" in err.message
            assert reads == [(0, 8)]
        else:
            with pytest.raises(portable_ckpt.CheckpointError):  # the data area is no JSON
                load_header(read, file_size=size, what="f", probe=8)
            assert reads == [(0, 8), (8, size)]


@pytest.mark.parametrize(
    "header",
    [b"[]", b'"x"', b"{not json", b'{"a": 1, "a": 2}', b'{"b@0": {"dtype": "I32"}}',
     b'{"b@0": {"dtype": "I32", "shape": "5", "data_offsets": [0, 20]}}',
     b'{"b@0": {"dtype": "I32", "shape": [5], "data_offsets": [0]}}',
     b'{"b@0": {"dtype": 7, "shape": [5], "data_offsets": [0, 20]}}',
     b'{"b@0": {"dtype": "I32", "shape": [5], "data_offsets": [0, NaN]}}',
     b'{"b@0": {"dtype": "I32", "shape": [5], "data_offsets": [0, 20]}, "__metadata__": 5}',
     b"\xef\xbb\xbf{}", b'{"\\ud800": {}}'],
)
def test_unusable_header_is_shard_header_error(tmp_path: Path, header: bytes) -> None:
    """R-SHARD-5: non-object / invalid JSON / malformed entries are PCK-SHARD-HEADER."""
    vdir, _ = build_version(tmp_path)
    rel = _data_rel(vdir)
    _, _, data = shard_header(vdir / rel)
    body = header + b" " * (-(len(header) + 8) % 8)
    rewrite_file(vdir, rel, struct.pack("<Q", len(body)) + body + data)
    expect_code("PCK-SHARD-HEADER", open_and_read_all, vdir)


def test_header_entry_with_invalid_dtype(tmp_path: Path) -> None:
    """R-SHARD-5: a header entry without a valid dtype is PCK-SHARD-HEADER."""
    vdir, _ = build_version(tmp_path)
    rel = _data_rel(vdir)
    rewrite_shard_header(vdir, rel, lambda h: h.__setitem__(
        "extra", {"dtype": "Q99", "shape": [0], "data_offsets": [0, 0]}))
    expect_code("PCK-SHARD-HEADER", open_and_read_all, vdir)


@pytest.mark.parametrize("dim", [2**53, 2**63])
def test_a_shape_value_of_2_53_or_more_is_refused(tmp_path: Path, dim: int) -> None:
    """mutation audit 22 A-62: a header shape value is an int in [0, 2^53) (R-SHARD-5): an
    entry of shape [2^53, 0] (zero bytes, so its span agrees) is PCK-SHARD-HEADER."""
    vdir, _ = build_version(tmp_path)
    rel = _data_rel(vdir)
    rewrite_shard_header(vdir, rel, lambda h: h.__setitem__(
        "extra", {"dtype": "U8", "shape": [dim, 0], "data_offsets": [0, 0]}))
    err = expect_code("PCK-SHARD-HEADER", open_and_read_all, vdir)
    assert "extra" in err.message


def test_bytes_after_the_last_tensor_are_refused(tmp_path: Path) -> None:
    """mutation audit 22 A-64: R-SHARD-9: a data area longer than its tensors (16 bytes
    appended, the manifest's size and checksums made to match) is PCK-SHARD-HEADER."""
    vdir, _ = build_version(tmp_path)
    rel = _data_rel(vdir)
    rewrite_file(vdir, rel, (vdir / rel).read_bytes() + bytes(16))
    err = expect_code("PCK-SHARD-HEADER", open_and_read_all, vdir)
    assert "(16 bytes no tensor owns)" in err.message


@pytest.mark.parametrize("offsets", [[20, 0], [0, 10**6], [-4, 16]])
def test_data_offsets_checked_against_the_file(tmp_path: Path, offsets: list[int]) -> None:
    """R-SHARD-6: begin > end or 8 + N + end > size is PCK-SHARD-HEADER."""
    vdir, _ = build_version(tmp_path)
    rel = _data_rel(vdir)
    name = read_manifest(vdir)["tensors"]["b"]["ranges"][0]["name"]
    rewrite_shard_header(vdir, rel, lambda h: h[name].__setitem__("data_offsets", offsets))
    expect_code("PCK-SHARD-HEADER", open_and_read_all, vdir)


def test_span_must_equal_shape_times_itemsize(tmp_path: Path) -> None:
    """R-SHARD-6: end - begin != prod(shape) x itemsize is PCK-SHARD-HEADER."""
    vdir, _ = build_version(tmp_path)
    rel = _data_rel(vdir)
    name = read_manifest(vdir)["tensors"]["b"]["ranges"][0]["name"]
    rewrite_shard_header(vdir, rel, lambda h: h[name].__setitem__("data_offsets", [0, 16]))
    expect_code("PCK-SHARD-HEADER", open_and_read_all, vdir)


@pytest.mark.parametrize(
    "change",
    [
        lambda h, n: h.__setitem__(n + "x", h.pop(n)),
        lambda h, n: h[n].__setitem__("dtype", "U32"),
        lambda h, n: h[n].__setitem__("shape", [5, 1]),
    ],
)
def test_range_disagreeing_with_header_is_shard_mismatch(tmp_path: Path, change: Any) -> None:
    """R-SHARD-7: name absent, or dtype/shape breaking §8.3: PCK-SHARD-MISMATCH."""
    vdir, _ = build_version(tmp_path)
    rel = _data_rel(vdir)
    name = read_manifest(vdir)["tensors"]["b"]["ranges"][0]["name"]
    rewrite_shard_header(vdir, rel, lambda h: change(h, name))
    expect_code("PCK-SHARD-MISMATCH", open_and_read_all, vdir)


def test_a_missing_key_names_stored_keys_that_look_alike(tmp_path: Path) -> None:
    """Fine-tuning review F8: `read("model/tok.weight")` of a version storing
    `train/model/tok.weight` said only how many tensors there are (a load names the likes)."""
    portable_ckpt.save_arrays(tmp_path, {"train/model/tok.weight": np.zeros(2, np.float32),
                                         "train/model/head.bias": np.zeros(2, np.float32)}, step=1)
    ck = portable_ckpt.open(tmp_path)
    err = expect_code("PCK-TENSOR-MISSING", ck.read, "model/tok.weight")
    assert "stored keys that look alike: ['train/model/tok.weight']" in err.message
    err = expect_code("PCK-TENSOR-MISSING", ck.read, "train/model/head.bais")
    assert "'train/model/head.bias'" in err.message
    assert "look alike" not in expect_code("PCK-TENSOR-MISSING", ck.read, "zzz").message
