"""Tensor tables (§8.5, format 1.1): R-TABLE-1 … R-TABLE-9, and R-VERSION-2 for 1.1 documents.

Every test works on real versions: writers (``ShardWriter``, one of them with ``tensor_table=True``)
and the reference committer produce a version whose manifest references a zstd table; hostile
tables are crafted column by column (or byte by byte) and put in place of that file with matching
sizes and checksums, so only the rule under test is broken.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard

import portable_ckpt
from portable_ckpt.format import jsonio
from portable_ckpt.format.manifest import (
    MAX_SIZE,
    Checksum,
    FileRecord,
    RangeRecord,
    TensorEntry,
    WriterIndex,
)
from portable_ckpt.io import table_decode as td
from portable_ckpt.io import tensor_table as tt
from portable_ckpt.io.checksum import BlockHasher
from portable_ckpt.io.commit import commit
from portable_ckpt.io.safetensors_io import build_header
from portable_ckpt.io.table_decode import decode_table
from portable_ckpt.io.tensor_table import (
    COLUMNS,
    TensorTable,
    encode_table,
    range_name,
)
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage

from ._util import (
    edit_manifest,
    expect_code,
    open_and_read_all,
    open_recorded,
    read_manifest,
    rename_shard_member,
    rewrite_file,
    rewrite_shard_header,
    sample_array,
    save_sharded,
    shard_header,
    write_attempt,
)

UKEY = "模型/ü.Ключ"  # a key that is not ASCII
TENSORS: dict[str, tuple[np.ndarray, tuple[int, ...]]] = {
    "a": (sample_array("float32", (8, 8)), (2, 2)),
    "b": (sample_array("int32", (5,), 1), (1,)),
    "s": (sample_array("float64", (), 2), ()),
    "z": (np.zeros((0, 3), np.float16), (1, 1)),
    UKEY: (sample_array("bfloat16", (4, 6), 3), (1, 2)),
    "m": (sample_array("bool", (3,), 4), (1,)),
}


@dataclass
class Base:
    root: Path
    attempt: str


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    """Writer 0 sends a table, writer 1 JSON; the committer therefore publishes a table."""
    root = tmp_path_factory.mktemp("table-base")
    m = save_sharded(root, TENSORS, writer_tables=[0])
    assert m.tensor_table is not None
    return Base(root, m.attempt_id)


@pytest.fixture
def vdir(base: Base, tmp_path: Path) -> Path:
    """A private copy of the table version (its attempt directory)."""
    shutil.copytree(base.root, tmp_path / "root")
    return tmp_path / "root" / base.attempt


# ------------------------------------------------------------------------------------ helpers


def table_ref(vdir: Path) -> dict[str, str]:
    ref: dict[str, str] = read_manifest(vdir)["tensor_table"]
    return ref


def load_table(vdir: Path) -> TensorTable:
    doc = read_manifest(vdir)
    ref = doc["tensor_table"]
    data = (vdir / ref["file"]).read_bytes()
    return decode_table(data, codec=ref["codec"], what=ref["file"], files=doc["files"])


def heap(strings: list[str] | list[bytes]) -> np.ndarray:
    raw = [s.encode("utf-8") if isinstance(s, str) else s for s in strings]
    return np.frombuffer(b"".join(s + b"\0" for s in raw), np.uint8).copy()


def columns(tab: TensorTable) -> dict[str, np.ndarray]:
    """The ten columns of a table as writable arrays (spec §8.5 names)."""
    return {
        "tensor.key": heap(tab.keys),
        "tensor.dtype": np.array(tab.dtypes, np.uint8),
        "tensor.ndim": np.array(tab.ndim, np.uint8),
        "tensor.shape": np.array(tab.shape, np.int64),
        "tensor.ranges": np.array(tab.counts, np.int64),
        "range.file": np.array(tab.file, np.uint32),
        "range.codec": np.array(tab.codec, np.uint8),
        "range.offsets": np.array(tab.offsets, np.int64),
        "range.lengths": np.array(tab.lengths, np.int64),
        "file.path": heap(tab.paths),
    }


def st_bytes(
    cols: dict[str, np.ndarray],
    *,
    dtypes: dict[str, str] | None = None,
    metadata: dict[str, str] | None = None,
) -> bytes:
    """A safetensors file of ``cols``; each column's dtype from §8.5 unless ``dtypes`` says."""
    items, data = [], []
    for name, arr in cols.items():
        st = (dtypes or {}).get(name)
        if st is None:
            st = COLUMNS[name][0] if name in COLUMNS else "U8"
            arr = np.ascontiguousarray(arr, dtype=COLUMNS[name][1] if name in COLUMNS else "u1")
        items.append((name, st, list(arr.shape), arr.nbytes))
        data.append(np.ascontiguousarray(arr).tobytes())
    return build_header(items, metadata or {}) + b"".join(data)


def zstd(raw: bytes, *, content_size: bool = True) -> bytes:
    return zstandard.ZstdCompressor(write_content_size=content_size).compress(raw)


def install(vdir: Path, blob: bytes, codec: str | None = None) -> None:
    """Put ``blob`` in place of the version's table file (size and checksums made to match)."""
    rewrite_file(vdir, table_ref(vdir)["file"], blob)
    if codec is not None:
        edit_manifest(vdir, lambda d: d["tensor_table"].__setitem__("codec", codec))


def install_columns(vdir: Path, cols: dict[str, np.ndarray], codec: str = "zstd", **kw: Any) -> None:
    raw = st_bytes(cols, **kw)
    install(vdir, zstd(raw) if codec == "zstd" else raw, codec)


def install_entries(vdir: Path, fn: Callable[[dict[str, TensorEntry]], Any]) -> None:
    """Edit the table's tensor entries as objects (no validation) and store the result."""
    tab = load_table(vdir)
    ents = {k: TensorEntry(e.key, e.dtype, e.shape, list(e.ranges)) for k, e in tab.entries().items()}
    fn(ents)
    install(vdir, encode_table(TensorTable.from_entries(ents.values()), codec="zstd"))


def index_of(tab: TensorTable, key: str) -> int:
    return tab.keys.index(key)


# ------------------------------------------------------------------------------ R-TABLE-1


def test_reference_names_a_listed_file_and_tensors_is_empty(vdir: Path) -> None:
    """R-TABLE-1: the committed manifest's table file is a key of files and tensors is {}."""
    doc = read_manifest(vdir)
    assert doc["tensors"] == {}
    assert doc["tensor_table"]["file"] in doc["files"]
    assert doc["tensor_table"]["codec"] in ("none", "zstd")
    ck = open_and_read_all(vdir)
    assert set(ck.tensors) == set(TENSORS)
    for key, (arr, _) in TENSORS.items():
        got = ck.read(key)
        assert got.dtype == arr.dtype and got.shape == arr.shape
        assert got.tobytes() == arr.tobytes()


def _json_tensor(d: dict[str, Any]) -> None:
    d["tensors"] = {"x": {"dtype": "float32", "shape": [], "ranges": [
        {"offsets": [], "lengths": [], "file": d["tensor_table"]["file"], "name": "x@",
         "codec": "none"}]}}


@pytest.mark.parametrize(
    "edit, code",
    [
        (lambda d: d["files"].pop(d["tensor_table"]["file"]), "PCK-SCHEMA"),
        (_json_tensor, "PCK-SCHEMA"),
        (lambda d: d["tensor_table"].__setitem__("codec", "lz4"), "PCK-CODEC"),
        (lambda d: d["tensor_table"].__setitem__("codec", None), "PCK-CODEC"),
        (lambda d: d["tensor_table"].__setitem__("file", "../x.safetensors"), "PCK-PATH-UNSAFE"),
        (lambda d: d["tensor_table"].__setitem__("file", "/etc/passwd"), "PCK-PATH-UNSAFE"),
        (lambda d: d["tensor_table"].__setitem__("rows", 3), "PCK-SCHEMA"),
        (lambda d: d["tensor_table"].pop("codec"), "PCK-SCHEMA"),
        (lambda d: d.__setitem__("tensor_table", None), "PCK-SCHEMA"),
        (lambda d: d.__setitem__("tensor_table", [d["tensor_table"]]), "PCK-SCHEMA"),
    ],
    ids=["file-not-listed", "tensors-not-empty", "codec-unknown", "codec-null", "file-dotdot",
         "file-absolute", "extra-member", "codec-missing", "null", "array"],
)
def test_bad_reference_is_rejected(vdir: Path, edit: Callable[[dict[str, Any]], Any],
                                   code: str) -> None:
    """R-TABLE-1: a table file not in files, or tensors beside a table, is PCK-SCHEMA; a codec
    other than none/zstd is PCK-CODEC; an unsafe path is PCK-PATH-UNSAFE."""
    edit_manifest(vdir, edit)
    expect_code(code, portable_ckpt.open, vdir)


def test_writer_index_reference_rules(tmp_path: Path) -> None:
    """R-TABLE-1 for writer indexes: the writer lists its table in files and leaves tensors {};
    a committer reading an index whose table is not listed, or that also has tensors, refuses it."""
    attempt, idx = write_attempt(tmp_path, {"x": np.ones((4, 2), np.float32)}, tensor_table=True)
    p = tmp_path / attempt / "index" / "w00000.json"
    doc = json.loads(p.read_text())
    assert doc["tensors"] == {} and doc["tensor_table"]["file"] in doc["files"]
    assert doc["tensor_table"] == {"file": "index/w00000.tensors.safetensors", "codec": "none"}
    storage = open_storage(tmp_path)

    def bad(fn: Callable[[dict[str, Any]], Any], code: str) -> None:
        d = json.loads(json.dumps(doc))
        fn(d)
        p.write_text(json.dumps(d))
        expect_code(code, commit, storage, attempt, step=1, expected_writers=[0])

    bad(lambda d: d["files"].pop(d["tensor_table"]["file"]), "PCK-SCHEMA")
    bad(lambda d: d.__setitem__("tensors", {"y": {"dtype": "int8", "shape": [0], "ranges": []}}),
        "PCK-SCHEMA")
    bad(lambda d: d["tensor_table"].__setitem__("codec", "gzip"), "PCK-CODEC")
    p.write_text(json.dumps(doc))
    m = commit(storage, attempt, step=1, expected_writers=[0])
    assert m.tensor_table is not None
    assert (open_and_read_all(tmp_path / attempt).read("x") == 1).all()


def test_a_writer_table_longer_than_its_index_records_is_refused(tmp_path: Path) -> None:
    """R-COMMIT-4, R-FILES-3 for a writer's tensor table: a table file that grew after its
    writer recorded its size is PCK-FILE-SIZE when the index is read (read_writer_index,
    load_writer_table: the recorded blocks alone would still verify), and commit publishes
    nothing. Test audit 21, finding 9: in commit the later check of every file's size also
    refuses it, so only the reading functions show whether the table's own check holds."""
    from portable_ckpt.errors import FileSizeError
    from portable_ckpt.io.commit import load_writer_table, read_writer_index

    attempt, idx = write_attempt(tmp_path, {"x": np.ones((4, 2), np.float32)}, tensor_table=True)
    assert idx.tensor_table is not None
    rel = idx.tensor_table.file
    storage = open_storage(tmp_path)
    assert read_writer_index(storage, attempt, 0).table is not None  # as written: it reads
    with open(tmp_path / attempt / rel, "ab") as fh:
        fh.write(b"\0")
    full = f"{attempt}/{rel}"
    for read in (lambda: read_writer_index(storage, attempt, 0),
                 lambda: load_writer_table(storage, attempt, idx)):
        with pytest.raises(FileSizeError, match="writer 0 reported") as err:
            read()
        assert err.value.code == "PCK-FILE-SIZE" and err.value.path == full
    expect_code("PCK-FILE-SIZE", commit, storage, attempt, step=1, expected_writers=[0])
    assert not (tmp_path / attempt / "manifest.json").exists()


# ------------------------------------------------------------------------------ R-TABLE-2


def test_table_manifest_is_1_1_with_must_understand(vdir: Path) -> None:
    """R-TABLE-2: a manifest with a table lists tensor-table and has format_version 1.1."""
    doc = read_manifest(vdir)
    assert doc["format_version"] == "1.1"
    assert doc["must_understand"] == ["tensor-table"]


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.__setitem__("must_understand", []),
        lambda d: d.__setitem__("must_understand", ["tensor-tables"]),
        lambda d: d.__setitem__("format_version", "1.0"),
    ],
    ids=["must-understand-empty", "must-understand-misspelt", "format-1.0"],
)
def test_table_without_announcement_is_rejected(vdir: Path, edit: Callable[..., Any]) -> None:
    """R-TABLE-2: without tensor-table in must_understand, or as format 1.0, the manifest is
    invalid (PCK-SCHEMA; an unknown must_understand name is PCK-FEATURE-UNSUPPORTED)."""
    edit_manifest(vdir, edit)
    expect_code({"PCK-SCHEMA", "PCK-FEATURE-UNSUPPORTED"}, portable_ckpt.open, vdir)


def test_later_minor_with_table_is_read(vdir: Path) -> None:
    """R-TABLE-2: "1.1 or a later 1.x" — a 1.7 manifest with a table reads (R-VERSION-4)."""
    edit_manifest(vdir, lambda d: d.__setitem__("format_version", "1.7"))
    assert open_and_read_all(vdir).read("b").tolist() == TENSORS["b"][0].tolist()


def test_reader_without_the_extension_refuses(vdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """R-TABLE-2: a 1.0 reader (which knows no extension) refuses the version with
    PCK-FEATURE-UNSUPPORTED instead of seeing a checkpoint without tensors."""
    from portable_ckpt.format import manifest as manifest_mod

    monkeypatch.setattr(manifest_mod, "KNOWN_EXTENSIONS", frozenset())
    expect_code("PCK-FEATURE-UNSUPPORTED", portable_ckpt.open, vdir)


# ------------------------------------------------------------------------------ R-TABLE-3


def _frame_header(content_size: int) -> bytes:
    """A zstd frame header (single segment, 8-byte content size) and one empty raw last block."""
    return b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + struct.pack("<Q", content_size) + b"\x01\x00\x00"


def test_declared_size_above_2_32_is_limit(vdir: Path) -> None:
    """R-TABLE-3: a frame declaring more than 2^32 decoded bytes is PCK-LIMIT, found from the
    header alone (nothing of that size is allocated)."""
    install(vdir, _frame_header((1 << 32) + 1), "zstd")
    expect_code("PCK-LIMIT", portable_ckpt.open, vdir)
    # exactly 2^32 is allowed by the limit; this frame then fails as a frame (PCK-CODEC)
    install(vdir, _frame_header(1 << 32), "zstd")
    expect_code("PCK-CODEC", portable_ckpt.open, vdir)


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_table_above_the_limit_is_limit(vdir: Path, codec: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """R-TABLE-3 with the limit lowered: a decoded table above it (the file size for codec none,
    the declared size for zstd) is PCK-LIMIT."""
    raw = st_bytes(columns(load_table(vdir)))
    install(vdir, raw if codec == "none" else zstd(raw), codec)
    assert open_and_read_all(vdir)
    monkeypatch.setattr(td, "MAX_TABLE_BYTES", len(raw) - 1)
    expect_code("PCK-LIMIT", portable_ckpt.open, vdir)


def _frames(raw: bytes) -> dict[str, bytes]:
    good = zstd(raw)
    return {
        "no-content-size": zstd(raw, content_size=False),
        "trailing-bytes": good + b"\0",
        "two-frames": good + good,
        "truncated": good[:-3],
        "not-a-frame": raw,
        "skippable-frame": struct.pack("<II", 0x184D2A50, 4) + b"abcd" + good,
    }


@pytest.mark.parametrize("case", list(_frames(b"")))
def test_bad_zstd_table_is_codec(vdir: Path, case: str) -> None:
    """R-TABLE-3: a zstd table must be exactly one frame that declares its content size
    (violations, including those of R-TENSOR-7, are PCK-CODEC)."""
    install(vdir, _frames(st_bytes(columns(load_table(vdir))))[case], "zstd")
    expect_code("PCK-CODEC", portable_ckpt.open, vdir)


def test_uncompressed_table_is_read(vdir: Path) -> None:
    """R-TABLE-3: codec none stores the safetensors bytes as they are."""
    install_columns(vdir, columns(load_table(vdir)), codec="none")
    ck = open_and_read_all(vdir)
    assert ck.read(UKEY).tobytes() == TENSORS[UKEY][0].tobytes()


# ------------------------------------------------------------------------------ R-TABLE-4


@pytest.mark.parametrize(
    "blob",
    [b"", b"\x01\x02\x03", struct.pack("<Q", 1 << 40) + b"{}", struct.pack("<Q", 4) + b"nope",
     struct.pack("<Q", 8) + b"[1,2,3] ",
     build_header([("tensor.key", "U8", [100], 100)], {})],
    ids=["empty", "short", "length-beyond-file", "not-json", "not-object", "data-outside-file"],
)
@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_decoded_bytes_not_safetensors(vdir: Path, blob: bytes, codec: str) -> None:
    """R-TABLE-4: the decoded bytes must be a safetensors file (else PCK-SHARD-HEADER)."""
    install(vdir, zstd(blob) if codec == "zstd" else blob, codec)
    expect_code("PCK-SHARD-HEADER", portable_ckpt.open, vdir)


def _drop(name: str) -> Callable[[dict[str, np.ndarray]], dict[str, str] | None]:
    def fn(c: dict[str, np.ndarray]) -> None:
        del c[name]
    return fn


def _extra(c: dict[str, np.ndarray]) -> None:
    c["range.name"] = heap(["a@0,0"])


def _retype(name: str, st: str, np_dt: str) -> Callable[[dict[str, np.ndarray]], dict[str, str]]:
    def fn(c: dict[str, np.ndarray]) -> dict[str, str]:
        c[name] = c[name].astype(np_dt)
        return {name: st}
    return fn


def _two_d(name: str) -> Callable[[dict[str, np.ndarray]], dict[str, str]]:
    def fn(c: dict[str, np.ndarray]) -> dict[str, str]:
        c[name] = c[name].reshape(1, -1)
        return {name: COLUMNS[name][0]}
    return fn


def _zero_d(c: dict[str, np.ndarray]) -> dict[str, str]:
    c["tensor.ndim"] = c["tensor.ndim"][:1].reshape(())
    return {"tensor.ndim": "U8"}


COLUMN_CASES: dict[str, Callable[[dict[str, np.ndarray]], Any]] = {
    **{f"missing-{n}": _drop(n) for n in ("tensor.key", "range.codec", "file.path")},
    "extra-column": _extra,
    "shape-as-I32": _retype("tensor.shape", "I32", "<i4"),
    "file-as-U64": _retype("range.file", "U64", "<u8"),
    "key-as-I8": _retype("tensor.key", "I8", "i1"),
    "dtype-as-I64": _retype("tensor.dtype", "I64", "<i8"),
    "offsets-2d": _two_d("range.offsets"),
    "key-2d": _two_d("tensor.key"),
    "ndim-0d": _zero_d,
}


@pytest.mark.parametrize("case", list(COLUMN_CASES))
def test_columns_must_be_exactly_the_ten(vdir: Path, case: str) -> None:
    """R-TABLE-4: a missing, additional, mistyped or multi-dimensional column is PCK-SCHEMA."""
    cols = columns(load_table(vdir))
    dtypes = COLUMN_CASES[case](cols)
    install_columns(vdir, cols, dtypes=dtypes)
    expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)


@pytest.mark.parametrize("metadata", [{"portable_ckpt": 1.1}, {"x": None}, {"x": ["y"]}])
def test_metadata_is_still_an_object_of_strings(vdir: Path, metadata: dict[str, Any]) -> None:
    """R-TABLE-4 (errata 8): no rule reads ``__metadata__``, but a table's header is a
    safetensors header (§11.2): its ``__metadata__`` is an object of strings."""
    install_columns(vdir, columns(load_table(vdir)), metadata=metadata)
    expect_code("PCK-SHARD-HEADER", portable_ckpt.open, vdir)


def test_metadata_is_ignored(vdir: Path) -> None:
    """R-TABLE-4: ``__metadata__`` is ignored, whatever it holds; column order does not matter."""
    cols = columns(load_table(vdir))
    shuffled = dict(reversed(list(cols.items())))
    install_columns(vdir, shuffled, metadata={"format": "pt", "portable_ckpt": "9.9", "x": "y"})
    ck = open_and_read_all(vdir)
    assert ck.read("a").tobytes() == TENSORS["a"][0].tobytes()


# ------------------------------------------------------------------------------ R-TABLE-5


def test_records_follow_the_column_layout(vdir: Path) -> None:
    """R-TABLE-5: records of tensor t are the tensor.ranges[t] records after those of tensors
    0 … t-1; each takes ndim consecutive offsets and lengths. Recomputed here from the raw
    columns and compared with what the reader delivers."""
    tab = load_table(vdir)
    cols = columns(tab)
    keys = bytes(cols["tensor.key"]).decode()[:-1].split("\0")
    paths = bytes(cols["file.path"]).decode()[:-1].split("\0")
    ck = portable_ckpt.open(vdir)
    row = coord = dim = 0
    for t, key in enumerate(keys):
        nd = int(cols["tensor.ndim"][t])
        shape = tuple(int(x) for x in cols["tensor.shape"][dim : dim + nd])
        dim += nd
        expect = []
        for _ in range(int(cols["tensor.ranges"][t])):
            offs = tuple(int(x) for x in cols["range.offsets"][coord : coord + nd])
            lens = tuple(int(x) for x in cols["range.lengths"][coord : coord + nd])
            codec = ("none", "zstd")[int(cols["range.codec"][row])]
            expect.append(RangeRecord(offs, lens, paths[int(cols["range.file"][row])],
                                      range_name(key, offs), codec))
            row += 1
            coord += nd
        entry = ck.tensors[key]
        assert entry.shape == shape == TENSORS[key][0].shape
        assert entry.ranges == expect
    assert row == len(cols["range.file"]) and coord == len(cols["range.offsets"])


def _add_one(name: str, value: int = 0) -> Callable[[dict[str, np.ndarray]], None]:
    def fn(c: dict[str, np.ndarray]) -> None:
        c[name] = np.append(c[name], np.array([value], c[name].dtype))
    return fn


def _cut_one(name: str) -> Callable[[dict[str, np.ndarray]], None]:
    def fn(c: dict[str, np.ndarray]) -> None:
        c[name] = c[name][:-1]
    return fn


def _count(delta0: int, delta1: int = 0) -> Callable[[dict[str, np.ndarray]], None]:
    def fn(c: dict[str, np.ndarray]) -> None:
        c["tensor.ranges"][0] += delta0
        c["tensor.ranges"][1] += delta1
    return fn


def _extra_key(c: dict[str, np.ndarray]) -> None:
    c["tensor.key"] = np.append(c["tensor.key"], heap(["extra"]))


LENGTH_CASES: dict[str, Callable[[dict[str, np.ndarray]], None]] = {
    "dtype-short": _cut_one("tensor.dtype"),
    "ndim-long": _add_one("tensor.ndim"),
    "ranges-short": _cut_one("tensor.ranges"),
    "shape-short": _cut_one("tensor.shape"),
    "shape-long": _add_one("tensor.shape", 1),
    "file-long": _add_one("range.file"),
    "codec-short": _cut_one("range.codec"),
    "offsets-short": _cut_one("range.offsets"),
    "lengths-long": _add_one("range.lengths", 1),
    "count-sum-above-R": _count(+1),
    "count-sum-below-R": _count(-1),
    "count-negative": _count(-5, +5),
    "one-key-more": _extra_key,
    "key-unterminated": _cut_one("tensor.key"),
    "path-unterminated": _cut_one("file.path"),
}


@pytest.mark.parametrize("case", list(LENGTH_CASES))
def test_column_lengths_must_agree(vdir: Path, case: str) -> None:
    """R-TABLE-5: column lengths that disagree with T, Σ ndim, R or Σ ranges·ndim, and
    Σ tensor.ranges ≠ R, are PCK-SCHEMA."""
    cols = columns(load_table(vdir))
    LENGTH_CASES[case](cols)
    install_columns(vdir, cols)
    expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)


def test_a_negative_count_balanced_by_another_is_refused(vdir: Path) -> None:
    """mutation audit 22 A-18: a count below 0 in 'tensor.ranges' is PCK-SCHEMA even when the
    sum of counts is R, no count exceeds R and Σ counts·ndim still matches (R-TABLE-5)."""
    tab = load_table(vdir)
    cols = columns(tab)
    a, z = index_of(tab, "a"), index_of(tab, "z")
    assert cols["tensor.ndim"][a] == cols["tensor.ndim"][z] == 2
    old = int(cols["tensor.ranges"][a])
    cols["tensor.ranges"][a] = -1
    cols["tensor.ranges"][z] += old + 1
    assert int(cols["tensor.ranges"].max()) <= len(cols["range.file"])
    install_columns(vdir, cols)
    err = expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)
    assert "'tensor.ranges' holds a count outside" in err.message


# ------------------------------------------------------------------------------ R-TABLE-6


def _keys(fn: Callable[[list[bytes]], list[bytes]]) -> Callable[[dict[str, np.ndarray]], None]:
    def edit(c: dict[str, np.ndarray]) -> None:
        keys = bytes(c["tensor.key"]).split(b"\0")[:-1]
        c["tensor.key"] = heap(fn(keys))
    return edit


def _paths(fn: Callable[[list[bytes]], list[bytes]]) -> Callable[[dict[str, np.ndarray]], None]:
    def edit(c: dict[str, np.ndarray]) -> None:
        paths = bytes(c["file.path"]).split(b"\0")[:-1]
        c["file.path"] = heap(fn(paths))
    return edit


def _set(i: int, v: bytes) -> Callable[[list[bytes]], list[bytes]]:
    def fn(xs: list[bytes]) -> list[bytes]:
        return [v if j == i else x for j, x in enumerate(xs)]
    return fn


def _col(name: str, value: int, at: int = 0) -> Callable[[dict[str, np.ndarray]], None]:
    def fn(c: dict[str, np.ndarray]) -> None:
        c[name][at] = value
    return fn


def _bad_path_cases() -> dict[str, bytes]:
    return {"dotdot": b"../data/w00000-0000.safetensors", "absolute": b"/data/x.safetensors",
            "inner-dotdot": b"data/../data/w00000-0000.safetensors", "dot": b"data/./x",
            "backslash": b"data\\w00000-0000.safetensors", "empty-component": b"data//x",
            "too-deep": b"/".join([b"d"] * 9)}


SCHEMA_CASES: dict[str, Callable[[dict[str, np.ndarray]], None]] = {
    "key-duplicate": _keys(lambda ks: [ks[0], *ks[:-1]] if ks[0] != ks[1] else ks),
    "key-control-char": _keys(_set(0, b"a\x01b")),
    "key-newline": _keys(_set(1, b"a\nb")),
    "key-del": _keys(_set(1, b"a\x7f")),
    "key-not-utf8": _keys(_set(0, b"a\xffb")),
    "key-overlong-utf8": _keys(_set(0, b"\xc0\xaf")),
    "key-surrogate": _keys(_set(0, b"\xed\xa0\x80")),
    "key-empty": _keys(_set(0, b"")),
    "key-1025-chars": _keys(_set(0, b"k" * 1025)),
    "path-duplicate": _paths(lambda ps: [ps[0], ps[0], *ps[2:]]),
    "path-not-in-files": _paths(_set(0, b"data/w00099-0000.safetensors")),
    "path-not-utf8": _paths(_set(0, b"data/\xff")),
    "file-index-out-of-range": lambda c: c["range.file"].__setitem__(
        0, bytes(c["file.path"]).count(b"\0")  # the number of paths: one past the last index
    ),
}


@pytest.mark.parametrize("case", list(SCHEMA_CASES))
def test_keys_paths_and_file_indexes(vdir: Path, case: str) -> None:
    """R-TABLE-6: keys follow §8.1 and are unique; paths are unique, listed in files; every
    range.file is below the number of paths — else PCK-SCHEMA."""
    cols = columns(load_table(vdir))
    # Two writers, each with a file of pieces and a file of whole tensors.
    assert bytes(cols["file.path"]).count(b"\0") == 4
    SCHEMA_CASES[case](cols)
    install_columns(vdir, cols)
    expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)


@pytest.mark.parametrize("case", list(_bad_path_cases()))
def test_unsafe_path_in_table(vdir: Path, case: str) -> None:
    """R-TABLE-6: a path breaking §2.2 is PCK-PATH-UNSAFE (also if listed in files)."""
    bad = _bad_path_cases()[case]
    cols = columns(load_table(vdir))
    _paths(_set(0, bad))(cols)
    install_columns(vdir, cols)
    expect_code("PCK-PATH-UNSAFE", portable_ckpt.open, vdir)


def test_key_limits_accept_the_boundary(vdir: Path) -> None:
    """R-TABLE-6 / §8.1: a key of 1024 characters (multi-byte) is fine; Unicode keys round-trip."""
    long_key = "é" * 1024
    install_entries(vdir, lambda es: es.__setitem__(long_key, TensorEntry(long_key, "int8", (0,))))
    ck = open_and_read_all(vdir)
    assert long_key in ck.tensors and UKEY in ck.tensors


@pytest.mark.parametrize(
    "edit, code",
    [
        (_col("tensor.dtype", len(tt.DTYPE_CODES)), "PCK-DTYPE-UNSUPPORTED"),
        (_col("tensor.dtype", 255, at=-1), "PCK-DTYPE-UNSUPPORTED"),
        (_col("range.codec", 2), "PCK-CODEC"),
        (_col("range.codec", 255, at=-1), "PCK-CODEC"),
    ],
    ids=["dtype-past-the-table", "dtype-255-last", "codec-2", "codec-255-last"],
)
def test_dtype_and_codec_codes(vdir: Path, edit: Callable[..., None], code: str) -> None:
    """R-TABLE-6: a dtype code past §7's last row (14 in 1.1; contributor review D7: the
    first invalid code follows the table) is PCK-DTYPE-UNSUPPORTED; a codec code above 1 is
    PCK-CODEC."""
    cols = columns(load_table(vdir))
    edit(cols)
    install_columns(vdir, cols)
    expect_code(code, portable_ckpt.open, vdir)


def test_dtype_codes_are_the_rows_of_section_7() -> None:
    """R-TABLE-6 / §8.5: codes count the rows of §7 from 0 (float64 = 0 … float8_e5m2 = 14);
    a later row gets the next code (tests/test_dtype_tables.py compares every copy)."""
    assert tt.DTYPE_CODES[0] == "float64" and tt.DTYPE_CODES[1] == "float32"
    assert tt.DTYPE_CODES[14] == "float8_e5m2"  # a released code keeps its row (R-VERSION-9)


def _shape_of(key: str, shape: tuple[int, ...]) -> Callable[[dict[str, TensorEntry]], None]:
    def fn(es: dict[str, TensorEntry]) -> None:
        es[key].shape = shape
    return fn


def _ndim_65(es: dict[str, TensorEntry]) -> None:
    rec = es["b"].ranges[0]
    es["t65"] = TensorEntry("t65", "uint8", (1,) * 65,
                            [RangeRecord((0,) * 65, (1,) * 65, rec.file, "t65@", "none")])


def _coord(name: str, value: int) -> Callable[[dict[str, np.ndarray]], None]:
    def fn(c: dict[str, np.ndarray]) -> None:
        c[name][0] = value
    return fn


@pytest.mark.parametrize(
    "edit",
    [
        _ndim_65,
        _shape_of("b", (MAX_SIZE + 1,)),
        _shape_of("b", (-1,)),
        _shape_of("b", (-(1 << 63),)),
        _shape_of("b", (1 << 51,)),  # 2^51 int32 = 2^53 bytes (R-TENSOR-1)
        _shape_of("z", (0, 1 << 52, 2)),  # zero-size, but 2^53 float16 in its non-zero dims
        _shape_of("a", (1 << 26, 1 << 26)),  # 2^52 float32 = 2^54 bytes
    ],
    ids=["ndim-65", "shape-2^53", "shape-negative", "shape-int64-min", "bytes-2^53",
         "zero-size-nonzero-dims-2^54", "2d-2^54"],
)
def test_limits_in_declarations(vdir: Path, edit: Callable[..., None]) -> None:
    """R-TABLE-6: ndim above 64, a shape value above MAXINT or negative, or a tensor breaking
    R-TENSOR-1, is PCK-LIMIT (found when the table is decoded, before any read)."""
    install_entries(vdir, edit)
    expect_code("PCK-LIMIT", portable_ckpt.open, vdir)


@pytest.mark.parametrize(
    "edit",
    [_coord("range.offsets", MAX_SIZE + 1), _coord("range.lengths", MAX_SIZE + 1),
     _coord("range.offsets", (1 << 63) - 1), _coord("range.lengths", (1 << 63) - 1)],
    ids=["offset-2^53", "length-2^53", "offset-int64-max", "length-int64-max"],
)
def test_limits_in_records(vdir: Path, edit: Callable[..., None]) -> None:
    """R-TABLE-6: an offset or length above MAXINT is PCK-LIMIT."""
    cols = columns(load_table(vdir))
    edit(cols)
    install_columns(vdir, cols)
    expect_code("PCK-LIMIT", portable_ckpt.open, vdir)


def test_limits_accept_the_boundary() -> None:
    """R-TABLE-6 / R-TENSOR-1: MAXINT bytes exactly is allowed; one more is not."""
    files = {"d.safetensors": None}

    def table(dtype: str, n: int) -> bytes:
        e = TensorEntry("x", dtype, (n,), [RangeRecord((0,), (n,), "d.safetensors", "x@0")])
        return encode_table(TensorTable.from_entries([e]), codec="none")

    tab = decode_table(table("uint8", MAX_SIZE), codec="none", what="t", files=files)
    assert tab.shape_of(0) == (MAX_SIZE,)
    expect_code("PCK-LIMIT", decode_table, table("uint16", MAX_SIZE // 2 + 1), codec="none",
                what="t", files=files)


# ------------------------------------------------- §9 inside a table (R-COVER-3 over a table)


def _drop_record(key: str, j: int = -1) -> Callable[[dict[str, TensorEntry]], None]:
    def fn(es: dict[str, TensorEntry]) -> None:
        del es[key].ranges[j]
    return fn


def _edit_record(key: str, j: int, **kw: Any) -> Callable[[dict[str, TensorEntry]], None]:
    def fn(es: dict[str, TensorEntry]) -> None:
        r = es[key].ranges[j]
        es[key].ranges[j] = RangeRecord(kw.get("offsets", r.offsets), kw.get("lengths", r.lengths),
                                        r.file, r.name, r.codec)
    return fn


def _dup_record(key: str) -> Callable[[dict[str, TensorEntry]], None]:
    def fn(es: dict[str, TensorEntry]) -> None:
        es[key].ranges.append(es[key].ranges[0])
    return fn


def _record_on_zero_size(es: dict[str, TensorEntry]) -> None:
    rec = es["b"].ranges[0]
    es["z"].ranges.append(RangeRecord((0, 0), (1, 1), rec.file, "z@0,0"))


@pytest.mark.parametrize(
    "key, edit, code",
    [
        ("a", _drop_record("a"), "PCK-COVERAGE-GAP"),
        ("b", _drop_record("b"), "PCK-COVERAGE-GAP"),
        ("a", _edit_record("a", 1, offsets=(0, 0)), "PCK-COVERAGE-OVERLAP"),
        ("a", _dup_record("a"), "PCK-COVERAGE-OVERLAP"),
        ("s", _dup_record("s"), "PCK-COVERAGE-OVERLAP"),
        ("a", _edit_record("a", 0, lengths=(9, 4)), "PCK-RANGE-BOUNDS"),
        ("a", _edit_record("a", 0, lengths=(0, 4)), "PCK-RANGE-BOUNDS"),
        ("a", _edit_record("a", 0, offsets=(-4, 0)), "PCK-RANGE-BOUNDS"),
        ("b", _edit_record("b", 0, offsets=(1,)), "PCK-RANGE-BOUNDS"),
        ("z", _record_on_zero_size, "PCK-RANGE-BOUNDS"),
    ],
    ids=["gap-2d", "no-records", "overlap", "duplicate", "0d-two-records", "beyond-shape",
         "empty-box", "negative-offset", "shifted-1d", "zero-size-with-record"],
)
def test_coverage_inside_a_table(vdir: Path, key: str, edit: Callable[..., None],
                                 code: str) -> None:
    """§8.5 applies §9 to a table's records: the reader reports gaps, overlaps and boxes out of
    bounds with the codes of R-COVER-3 before delivering the tensor; other tensors still read."""
    install_entries(vdir, edit)
    ck = portable_ckpt.open(vdir)
    expect_code(code, ck.read, key)
    other = "m" if key != "m" else "b"
    assert ck.read(other).tobytes() == TENSORS[other][0].tobytes()


@pytest.mark.parametrize(
    "edit",
    [_edit_record("a", 0, lengths=(0, 4)), _edit_record("a", 0, offsets=(-4, 0)),
     _edit_record("a", 0, lengths=(9, 4))],
    ids=["empty-box", "negative-offset", "beyond-shape"],
)
def test_verify_reports_a_table_record_out_of_bounds_once(vdir: Path, edit: Callable[..., None]) -> None:
    """R-READ-2, R-VERIFY-1: a record outside its tensor names no stored range, so verify does
    not go on to compare it with the shard header (it reported PCK-SHARD-MISMATCH as well)."""
    install_entries(vdir, edit)
    problems = portable_ckpt.open(vdir).verify(deep=True)
    assert [p.code for p in problems] == ["PCK-RANGE-BOUNDS"], problems


def test_committer_checks_coverage_of_writer_tables(tmp_path: Path) -> None:
    """§8.5 + R-COVER-2: a committer merging writer tables refuses a gap or an overlap."""
    storage = open_storage(tmp_path, create=True)
    for name, boxes, code in [("gap", [(0, 2), (4, 4)], "PCK-COVERAGE-GAP"),
                              ("overlap", [(0, 4), (2, 6)], "PCK-COVERAGE-OVERLAP")]:
        attempt = new_attempt_id(1)
        idx = []
        for w, (o, n) in enumerate(boxes):
            sw = ShardWriter(storage, attempt, w, tensor_table=True)
            sw.add_tensor("v", np.arange(o, o + n, dtype=np.int16), offsets=(o,), global_shape=(8,))
            idx.append(sw.finish())
        expect_code(code, commit, storage, attempt, step=1, indexes=idx, expected_writers=[0, 1])
        assert not (tmp_path / attempt / "manifest.json").exists(), name


def _rewrite_writer_file(root: Path, attempt: str, writer: int, rel: str, data: bytes) -> None:
    """Replace a file a writer index lists and make the index's record match it again."""
    (root / attempt / rel).write_bytes(data)
    p = root / attempt / "index" / f"w{writer:05d}.json"
    doc = json.loads(p.read_text())
    rec = doc["files"][rel]
    h = BlockHasher(rec["checksum"]["block_size"])
    h.update(data)
    rec["size"], rec["checksum"]["blocks"] = len(data), h.blocks()
    p.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "edit, code",
    [(_col("tensor.dtype", len(tt.DTYPE_CODES)), "PCK-DTYPE-UNSUPPORTED"),
     (_col("range.codec", 2), "PCK-CODEC"),
     (_keys(_set(0, b"a\x00b")), "PCK-SCHEMA"), (_coord("range.lengths", -1), "PCK-RANGE-BOUNDS")],
    ids=["dtype-past-the-table", "codec-2", "key-split", "length-negative"],
)
def test_committer_validates_writer_tables(tmp_path: Path, edit: Callable[..., None],
                                           code: str) -> None:
    """R-TABLE-3 … R-TABLE-6 apply to writer tables too: the committer decodes each with the
    same checks. Writer 1 declares exactly what writer 0 declares, so its declarations may be
    taken from the cache of validated declarations, but never its records."""
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    for w in (0, 1):
        sw = ShardWriter(storage, attempt, w, tensor_table=True)
        sw.add_tensor("k", np.full((2, 3), w, np.float32), offsets=(2 * w, 0), global_shape=(4, 3))
        sw.finish()
    rel = "index/w00001.tensors.safetensors"
    files = json.loads((tmp_path / attempt / "index" / "w00001.json").read_text())["files"]
    cols = columns(decode_table((tmp_path / attempt / rel).read_bytes(), codec="none", what=rel,
                                files=files))
    edit(cols)
    _rewrite_writer_file(tmp_path, attempt, 1, rel, st_bytes(cols))
    expect_code(code, commit, storage, attempt, step=1, expected_writers=[0, 1])
    assert not (tmp_path / attempt / "manifest.json").exists()


# ------------------------------------------------------------------------------ R-TABLE-7


def test_range_name_form() -> None:
    """R-TABLE-7: ``key@`` + offsets in decimal without leading zeros, joined by ``,``."""
    assert range_name("model.w", [0, 4096]) == "model.w@0,4096"
    assert range_name("model.s", []) == "model.s@"
    assert range_name("x", np.array([7, 0, 10], np.int64)) == "x@7,0,10"
    assert range_name(UKEY, (3,)) == UKEY + "@3"


def test_writers_store_ranges_under_their_implied_names(vdir: Path) -> None:
    """R-TABLE-7: every record of the table is stored in its file under its implied name."""
    ck = portable_ckpt.open(vdir)
    stored: dict[str, set[str]] = {}
    for rel in read_manifest(vdir)["files"]:
        if rel.startswith("data/"):
            _, header, _ = shard_header(vdir / rel)
            stored[rel] = {k for k in header if k != "__metadata__"}
    implied: dict[str, set[str]] = {}
    for key, t in ck.tensors.items():
        for r in t.ranges:
            assert r.name == range_name(key, r.offsets)
            implied.setdefault(r.file, set()).add(r.name)
    assert implied == stored
    assert "s@" in stored[ck.tensors["s"].ranges[0].file]


def test_missing_implied_name_is_shard_mismatch(vdir: Path) -> None:
    """R-TABLE-7 with R-TENSOR-3 / R-SHARD-7: a record whose implied name is not in its file's
    header is PCK-SHARD-MISMATCH when read (and in deep verification)."""
    ck = portable_ckpt.open(vdir)
    rec = ck.tensors["a"].ranges[1]
    rewrite_shard_header(vdir, rec.file, lambda h: h.__setitem__("a@renamed", h.pop(rec.name)))
    ck = portable_ckpt.open(vdir)
    expect_code("PCK-SHARD-MISMATCH", ck.read, "a")
    assert any(e.code == "PCK-SHARD-MISMATCH" for e in ck.verify(deep=True))
    # a box inside the other records only reads those, and so succeeds
    other = next(r for r in ck.tensors["a"].ranges if r.file != rec.file)
    box = ck.read("a", other.offsets, other.lengths)
    o, n = other.offsets, other.lengths
    assert (box == TENSORS["a"][0][o[0]:o[0] + n[0], o[1]:o[1] + n[1]]).all()


def test_committer_checks_implied_names(tmp_path: Path) -> None:
    """R-TABLE-7: a committer that checks headers finds a writer-table record stored under
    another name (PCK-SHARD-MISMATCH) and publishes nothing."""
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    sw = ShardWriter(storage, attempt, 0, tensor_table=True, write_index=False)
    sw.add_tensor("w", np.ones((2, 2), np.float32))
    idx = sw.finish()
    rel = "data/w00000-0000.safetensors"
    idx.files[rel] = rename_shard_member(tmp_path / attempt / rel, rel, "w@0,0", "w@9,9",
                                         idx.files[rel].checksum.block_size)
    expect_code("PCK-SHARD-MISMATCH", commit, storage, attempt, step=1, indexes=[idx],
                check_headers=True)
    assert not (tmp_path / attempt / "manifest.json").exists()


# ------------------------------------------------------------------------------ R-TABLE-8


def test_table_is_read_whole_and_verified_at_open(base: Base) -> None:
    """R-TABLE-8: opening reads the whole table (every block verified) before any tensor."""
    storage, ck = open_recorded(base.root, base.attempt)
    rel = f"{base.attempt}/{ck.manifest.tensor_table.file}"
    size = ck.manifest.files[ck.manifest.tensor_table.file].size
    got = storage.reads(rel)
    assert sum(n for _, _, n in got) >= size and min(o for _, o, _ in got) == 0
    assert not storage.reads(f"{base.attempt}/data/")  # no tensor data read yet


def test_invalid_last_tensor_blocks_every_tensor(vdir: Path) -> None:
    """R-TABLE-8: the whole table is validated before any tensor is delivered: a broken
    declaration of the last tensor stops the open, so not even the first tensor is served."""
    cols = columns(load_table(vdir))
    cols["tensor.dtype"][-1] = 99
    install_columns(vdir, cols)
    expect_code("PCK-DTYPE-UNSUPPORTED", portable_ckpt.open, vdir)


@pytest.mark.parametrize("damage", ["flip-last-byte", "truncate", "delete"])
def test_damaged_table_file_fails_at_open(vdir: Path, damage: str) -> None:
    """R-TABLE-8 with §6: a table file that fails its checksum, size or existence stops the open
    with PCK-CHECKSUM, PCK-FILE-SIZE or PCK-FILE-MISSING."""
    path = vdir / table_ref(vdir)["file"]
    raw = bytearray(path.read_bytes())
    if damage == "flip-last-byte":
        raw[-1] ^= 0x40
        path.write_bytes(raw)
        code = "PCK-CHECKSUM"
    elif damage == "truncate":
        path.write_bytes(raw[:-1])
        code = "PCK-FILE-SIZE"
    else:
        path.unlink()
        code = "PCK-FILE-MISSING"
    expect_code(code, portable_ckpt.open, vdir)


# ------------------------------------------------------------------------------ R-TABLE-9


def _many_records(root: Path, n: int) -> tuple[Any, str, WriterIndex, np.ndarray]:
    """One writer's share of a uint8 tensor [n] stored as n one-element ranges, 4,096 per shard
    file (the files are built directly: ShardWriter costs ~0.1 ms per chunk, too slow here)."""
    storage = open_storage(root, create=True)
    attempt = new_attempt_id(1)
    values = (np.arange(n) % 251).astype(np.uint8)
    files: dict[str, FileRecord] = {}
    ranges: list[RangeRecord] = []
    per_file = 4096
    for f, lo in enumerate(range(0, n, per_file)):
        hi = min(n, lo + per_file)
        rel = f"data/w00000-{f:04d}.safetensors"
        names = [f"x@{i}" for i in range(lo, hi)]
        raw = build_header([(nm, "U8", [1], 1) for nm in names], {}) + values[lo:hi].tobytes()
        storage.put(f"{attempt}/{rel}", raw)
        h = BlockHasher(1 << 20)
        h.update(raw)
        files[rel] = FileRecord(rel, len(raw), Checksum("crc32c", 1 << 20, h.blocks()))
        ranges += [RangeRecord((lo + i,), (1,), rel, nm) for i, nm in enumerate(names)]
    idx = WriterIndex(attempt, 0, files, {"x": TensorEntry("x", "uint8", (n,), ranges)})
    return storage, attempt, idx, values


@pytest.mark.parametrize("n", [tt.TABLE_THRESHOLD, tt.TABLE_THRESHOLD + 1])
def test_committer_uses_a_table_above_65536_records(tmp_path: Path, n: int) -> None:
    """R-TABLE-9: the reference committer publishes a table above 65,536 range records (a JSON
    manifest at or below), so its manifest stays far below the 1 GiB limit of R-SEC-11."""
    storage, attempt, idx, values = _many_records(tmp_path, n)
    m = commit(storage, attempt, step=1, indexes=[idx])
    doc = read_manifest(tmp_path / attempt)
    size = (tmp_path / attempt / "manifest.json").stat().st_size
    if n <= tt.TABLE_THRESHOLD:
        assert "tensor_table" not in doc and doc["format_version"] == "1.0"
        assert len(doc["tensors"]["x"]["ranges"]) == n and size > 4 << 20
        return  # JSON manifests of this size are read elsewhere; parsing one here costs ~2 s
    assert m.tensor_table is not None and doc["format_version"] == "1.1"
    assert doc["tensors"] == {} and size < 16 << 10
    ck = portable_ckpt.open(tmp_path / attempt)
    assert ck.tensors["x"].range_count == n
    assert (ck.read("x", [n - 300], [300]) == values[-300:]).all()
    assert (ck.read("x", [1000], [5]) == values[1000:1005]).all()


def test_writer_uses_a_table_when_its_index_would_exceed_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-TABLE-9 for writers: a writer whose JSON index would exceed the document limit of
    R-SEC-11 (lowered here to 4 KiB) describes its records in a table instead; a small writer
    index stays JSON. The committer reads both."""
    monkeypatch.setattr(jsonio, "MAX_DOCUMENT_BYTES", 4096)
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    big = ShardWriter(storage, attempt, 0)
    vals = np.arange(64, dtype=np.int64)
    for i in range(64):
        big.add_tensor("v", vals[i:i + 1], offsets=(i,), global_shape=(64,))
    small = ShardWriter(storage, attempt, 1)
    small.add_tensor("u", np.ones(3, np.int8))
    big.finish()
    small.finish()
    docs = [json.loads((tmp_path / attempt / "index" / f"w0000{w}.json").read_bytes())
            for w in (0, 1)]
    assert all(len(json.dumps(d)) <= 4096 for d in docs)
    assert docs[0]["format_version"] == "1.1" and docs[0]["tensors"] == {}
    assert docs[0]["tensor_table"]["file"] in docs[0]["files"]
    assert docs[1]["format_version"] == "1.0" and "tensor_table" not in docs[1]
    commit(storage, attempt, step=1, expected_writers=[0, 1])
    ck = open_and_read_all(tmp_path / attempt)
    assert (ck.read("v") == vals).all() and (ck.read("u") == 1).all()


def test_committer_uses_a_table_when_the_manifest_would_exceed_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-TABLE-9 for committers: a JSON manifest above the 1 GiB limit of R-SEC-11 (lowered here
    to just below this version's JSON size) is published with a table instead; a committer told
    not to use a table refuses with PCK-LIMIT and publishes nothing."""
    from portable_ckpt.errors import LimitError

    vals = np.arange(40, dtype=np.float32)

    def write(root: Path) -> tuple[Any, str]:
        storage = open_storage(root, create=True)
        attempt = new_attempt_id(3)
        for w in range(2):
            sw = ShardWriter(storage, attempt, w)
            for i in range(w * 20, (w + 1) * 20):
                sw.add_tensor("v", vals[i:i + 1], offsets=(i,), global_shape=(40,))
            sw.finish()
        return storage, attempt

    storage, attempt = write(tmp_path / "json")
    assert commit(storage, attempt, step=3, expected_writers=[0, 1]).tensor_table is None
    real = (tmp_path / "json" / attempt / "manifest.json").stat().st_size
    monkeypatch.setattr(jsonio, "MAX_MANIFEST_BYTES", real - 1)
    storage, attempt = write(tmp_path / "forced")
    with pytest.raises(LimitError):
        commit(storage, attempt, step=3, expected_writers=[0, 1], tensor_table=False)
    assert not (tmp_path / "forced" / attempt / "manifest.json").exists()
    storage, attempt = write(tmp_path / "auto")
    m = commit(storage, attempt, step=3, expected_writers=[0, 1])
    assert m.tensor_table is not None and m.format_version == "1.1"
    doc = (tmp_path / "auto" / attempt / "manifest.json").read_bytes()
    assert len(doc) < real - 1
    assert (portable_ckpt.open(tmp_path / "auto" / attempt).read("v") == vals).all()


# ------------------------------------------------------------------------------ R-VERSION-2


def test_documents_with_a_table_say_1_1_and_the_others_1_0(vdir: Path) -> None:
    """R-VERSION-2: in a version with a table, the manifest and the writer index that references a
    table carry format_version 1.1; the JSON writer index, drill and copy records carry 1.0."""
    from portable_ckpt.io.annotations import write_drill_record
    from portable_ckpt.io.copy import copy_version

    root, attempt = vdir.parent, vdir.name
    write_drill_record(open_storage(root), attempt, {
        "ok": True, "started_at": "2030-01-01T00:00:00Z", "finished_at": "2030-01-01T00:00:01Z",
        "world_size": 1, "saved_world_size": 2, "contract": "exact", "measurements": {},
        "error": None})
    copy_version(vdir, root.parent / "dst")
    versions = {p.name: json.loads(p.read_text())["format_version"] for p in [
        vdir / "manifest.json", *(vdir / "index").glob("*.json"), *(vdir / "drills").iterdir(),
        *(vdir / "copies").iterdir()]}
    assert len(versions) == 5, versions
    assert versions.pop("manifest.json") == "1.1"
    assert versions.pop("w00000.json") == "1.1"  # writer 0 sent a table
    assert set(versions.values()) == {"1.0"}, versions
    # the copy is a version with the same table
    assert open_and_read_all(root.parent / "dst" / attempt).read("a").tobytes() == \
        TENSORS["a"][0].tobytes()
