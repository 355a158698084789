"""File list, checksums (§6) and dtypes (§7)."""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path

import crc32c
import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.format.dtypes import DTYPES
from portable_ckpt.format.manifest import Continuation
from tests._corrupt import flip_byte

from ._util import (
    build_version,
    edit_manifest,
    expect_code,
    read_manifest,
    sample_array,
    save_sharded,
    shard_header,
)


def test_files_lists_every_file_of_the_version(tmp_path: Path) -> None:
    """R-FILES-1: `files` lists every file except manifest.json, temporaries, drills, copies."""
    m = save_sharded(
        tmp_path,
        {"a": (sample_array("float32", (16, 8)), (4, 2)), "z": (np.zeros((0, 3)), (1, 1))},
        writers=3, entries={"cfg": {"k": [1, 2]}, "sched": {"last_epoch": 3}},
        max_file_bytes=200,
    )
    vdir = tmp_path / m.attempt_id
    on_disk = {str(p.relative_to(vdir)) for p in vdir.rglob("*") if p.is_file()}
    listed = set(read_manifest(vdir)["files"])
    assert on_disk - {"manifest.json"} == listed
    assert {p.split("/")[0] for p in listed} == {"data", "entries", "index"}


def test_referenced_files_must_be_listed(tmp_path: Path) -> None:
    """R-FILES-2: a range or entry value naming an unlisted file is PCK-SCHEMA."""
    vdir, _ = build_version(tmp_path)
    doc = read_manifest(vdir)
    rel = doc["tensors"]["a"]["ranges"][0]["file"]
    edit_manifest(vdir, lambda d: d["files"].pop(rel))
    expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)
    vdir2, _ = build_version(tmp_path, step=2)
    erel = read_manifest(vdir2)["entries"]["cfg"]["values"][0]["file"]
    edit_manifest(vdir2, lambda d: d["files"].pop(erel))
    expect_code("PCK-SCHEMA", portable_ckpt.open, vdir2)


@pytest.mark.parametrize("change", ["missing", "shorter", "longer"])
@pytest.mark.parametrize("kind", ["data", "entries"])
def test_missing_or_resized_file_is_detected_before_use(tmp_path: Path, change: str,
                                                        kind: str) -> None:
    """R-FILES-3: PCK-FILE-MISSING / PCK-FILE-SIZE before any byte of the file is used."""
    vdir, _ = build_version(tmp_path, entries={"cfg": {"x": 1}})
    f = sorted((vdir / kind).iterdir())[0]
    if change == "missing":
        os.unlink(f)
    elif change == "shorter":
        with open(f, "r+b") as fh:
            fh.truncate(f.stat().st_size - 1)
    else:
        with open(f, "ab") as fh:
            fh.write(b"\0" * 5000)
    code = "PCK-FILE-MISSING" if change == "missing" else "PCK-FILE-SIZE"
    ck = portable_ckpt.open(vdir)
    if kind == "data":
        # Only the first element is requested: its blocks are intact, the size is not.
        key = next(k for k, t in ck.tensors.items() if any(r.file.endswith(f.name)
                                                          for r in t.ranges))
        rec = next(r for r in ck.tensors[key].ranges if r.file.endswith(f.name))
        expect_code(code, ck.read, key, rec.offsets, [1] * len(rec.offsets))
    else:
        expect_code(code, ck.entry, "cfg")
    assert ck.stats.bytes_delivered == 0


def test_checksum_check_value_and_worked_example() -> None:
    """R-CKSUM-1: CRC-32C check value and the spec's worked example."""
    from portable_ckpt.io.checksum import BlockHasher

    h = BlockHasher(4096)
    h.update(b"123456789")
    assert h.blocks() == "e3069283"
    data = bytes(i % 251 for i in range(10000))
    h = BlockHasher(4096)
    for i in range(0, len(data), 777):  # fed in odd pieces
        h.update(data[i : i + 777])
    assert h.blocks() == "719077fccf9bb204c59156a2"


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_writer_blocks_cover_exactly_the_stored_bytes(tmp_path: Path, codec: str) -> None:
    """R-CKSUM-1: every file's `blocks` is the CRC-32C of each block of its stored bytes."""
    m = save_sharded(tmp_path, {"a": (sample_array("float32", (100, 37)), (3, 2)),
                                "b": (sample_array("bfloat16", (4096,)), (1,))},
                     codec=codec, block_size=4096, entries={"e": {"v": list(range(2000))}})
    vdir = tmp_path / m.attempt_id
    for rel, rec in read_manifest(vdir)["files"].items():
        data = (vdir / rel).read_bytes()
        bs = rec["checksum"]["block_size"]
        assert rec["size"] == len(data)
        want = "".join(f"{crc32c.crc32c(data[i:i + bs]):08x}" for i in range(0, len(data), bs))
        assert rec["checksum"] == {"algorithm": "crc32c", "block_size": bs, "blocks": want}


@pytest.mark.parametrize("delta", [-1, 1])
def test_block_count_must_match_size(tmp_path: Path, delta: int) -> None:
    """R-CKSUM-2: len(blocks) != 8 * ceil(size / block_size) is PCK-SCHEMA."""
    vdir, _ = build_version(tmp_path)

    def fix(d: dict) -> None:  # type: ignore[type-arg]
        ck = next(iter(d["files"].values()))["checksum"]
        ck["blocks"] = ck["blocks"] + "00000000" if delta > 0 else ck["blocks"][:-8]

    edit_manifest(vdir, fix)
    expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)


def test_partial_block_digits_rejected(tmp_path: Path) -> None:
    """R-CKSUM-2: a `blocks` string that is not whole 8-digit groups is PCK-SCHEMA."""
    vdir, _ = build_version(tmp_path)
    edit_manifest(vdir, lambda d: next(iter(d["files"].values()))["checksum"].__setitem__(
        "blocks", next(iter(d["files"].values()))["checksum"]["blocks"][:-3]))
    expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)


def _one_tensor_version(tmp_path: Path, n: int = 4 * 4096) -> tuple[Path, str, int]:
    a = np.arange(n, dtype=np.uint8)
    m = save_sharded(tmp_path, {"t": (a, (1,))}, writers=1, block_size=4096, entries={})
    vdir = tmp_path / m.attempt_id
    rel = read_manifest(vdir)["tensors"]["t"]["ranges"][0]["file"]
    n_hdr = struct.unpack("<Q", (vdir / rel).read_bytes()[:8])[0]
    return vdir, rel, 8 + n_hdr


def test_whole_touched_block_is_verified_before_delivery(tmp_path: Path) -> None:
    """R-CKSUM-3: a corrupt byte in a touched block fails the read even if not requested."""
    vdir, rel, data_start = _one_tensor_version(tmp_path)
    # Corrupt the last byte of block 2; request one element at the start of block 2.
    flip_byte(vdir / rel, 3 * 4096 - 1, 0x5A)
    ck = portable_ckpt.open(vdir)
    first_in_block2 = 2 * 4096 - data_start
    expect_code("PCK-CHECKSUM", ck.read, "t", [first_in_block2], [1])
    # Elements whose blocks are intact are still served.
    assert ck.read("t", [3 * 4096 - data_start], [10]).tolist() == [
        (3 * 4096 - data_start + i) % 256 for i in range(10)]


def test_header_blocks_are_verified_before_the_header_is_interpreted(tmp_path: Path) -> None:
    """R-CKSUM-3: a corrupted safetensors header is a checksum error, not a parse of bad bytes."""
    vdir, rel, _ = _one_tensor_version(tmp_path)
    flip_byte(vdir / rel, 20, 0x5A)  # inside the JSON header
    ck = portable_ckpt.open(vdir)
    expect_code("PCK-CHECKSUM", ck.read, "t", [16000], [1])


def test_entry_value_blocks_are_verified(tmp_path: Path) -> None:
    """R-CKSUM-3: entry value files are verified before they are decoded."""
    vdir, _ = build_version(tmp_path, entries={"cfg": {"x": 12345}})
    f = next((vdir / "entries").iterdir())
    f.write_bytes(f.read_bytes().replace(b"12345", b"99999"))
    expect_code("PCK-CHECKSUM", portable_ckpt.open(vdir).entry, "cfg")


def test_checksum_error_names_file_and_block(tmp_path: Path) -> None:
    """R-CKSUM-4: a mismatch is PCK-CHECKSUM naming the file and the block index."""
    vdir, rel, data_start = _one_tensor_version(tmp_path)
    flip_byte(vdir / rel, 3 * 4096 + 5, 0x5A)
    err = expect_code("PCK-CHECKSUM", portable_ckpt.open(vdir).read, "t")
    assert rel in str(err) and "block 3" in str(err)
    errs = portable_ckpt.open(vdir).verify(deep=True)
    assert [e.code for e in errs] == ["PCK-CHECKSUM"] and "block 3" in str(errs[0])


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_data_is_little_endian_c_order_of_the_box(tmp_path: Path, dtype: str) -> None:
    """R-DTYPE-1: a range's bytes are the little-endian, row-major bytes of its box."""
    arr = sample_array(dtype, (6, 5, 3), seed=3)
    src = np.asfortranarray(arr)[:, ::1, :]  # a non-C-contiguous source
    m = save_sharded(tmp_path, {"t": (src, (2, 1, 2))}, writers=1, entries={})
    vdir = tmp_path / m.attempt_id
    doc = read_manifest(vdir)
    for r in doc["tensors"]["t"]["ranges"]:
        _, header, data = shard_header(vdir / r["file"])
        b, e = header[r["name"]]["data_offsets"]
        sl = tuple(slice(o, o + n) for o, n in zip(r["offsets"], r["lengths"], strict=True))
        box = np.ascontiguousarray(arr[sl])
        le = box.view(box.dtype.newbyteorder("<")) if box.dtype.byteorder == ">" else box
        assert data[b:e] == le.tobytes(order="C")


def test_big_endian_source_is_never_stored_as_big_endian(tmp_path: Path) -> None:
    """R-DTYPE-1: a big-endian array is refused (or converted), never stored byte-swapped."""
    arr = np.arange(6, dtype=">i4")
    try:
        m = portable_ckpt.save_arrays(tmp_path, {"t": arr}, step=1)
    except portable_ckpt.CheckpointError as exc:
        assert exc.code in ("PCK-USAGE", "PCK-UNSUPPORTED-VALUE", "PCK-DTYPE-UNSUPPORTED")
        return
    ck = portable_ckpt.open(tmp_path / m.attempt_id)
    assert ck.read("t").tolist() == list(range(6))


def test_bool_elements_are_stored_as_0_or_1(tmp_path: Path) -> None:
    """R-DTYPE-2: bool elements are stored as the bytes 0x00 and 0x01 only."""
    raw = np.array([0, 1, 2, 255, 7, 0], dtype=np.uint8)
    arr = raw.view(np.bool_)  # True values with bytes other than 0x01
    m = portable_ckpt.save_arrays(tmp_path, {"t": arr}, step=1)
    vdir = tmp_path / m.attempt_id
    r = read_manifest(vdir)["tensors"]["t"]["ranges"][0]
    _, header, data = shard_header(vdir / r["file"])
    b, e = header[r["name"]]["data_offsets"]
    assert set(data[b:e]) <= {0, 1}


def test_bool_written_from_normal_arrays_is_0_or_1(tmp_path: Path) -> None:
    """R-DTYPE-2: ordinary bool arrays are stored as 0x00/0x01 and read back equal."""
    arr = np.array([True, False, True, True])
    m = portable_ckpt.save_arrays(tmp_path, {"t": arr}, step=1)
    vdir = tmp_path / m.attempt_id
    r = read_manifest(vdir)["tensors"]["t"]["ranges"][0]
    _, header, data = shard_header(vdir / r["file"])
    b, e = header[r["name"]]["data_offsets"]
    assert data[b:e] == b"\x01\x00\x01\x01"


@pytest.mark.parametrize("dtype", ["complex64", "float8_e4m3fnuz", "F32", "float128", "int4",
                                   "Float32", ""])
def test_dtype_outside_table_rejected(tmp_path: Path, dtype: str) -> None:
    """R-DTYPE-3: a dtype not in the table is PCK-DTYPE-UNSUPPORTED."""
    vdir, _ = build_version(tmp_path)
    edit_manifest(vdir, lambda d: d["tensors"]["b"].__setitem__("dtype", dtype))
    expect_code("PCK-DTYPE-UNSUPPORTED", portable_ckpt.open, vdir)


@pytest.mark.parametrize(("version", "listed"), [("1.0", False), ("1.1", False), ("1.1", True)])
def test_a_later_dtype_is_refused_in_an_earlier_document(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, listed: bool
) -> None:
    """R-DTYPE-3 per version (maintainer review M3): a row a later MINOR adds (as the
    procedure of docs/changing-the-format.md adds one) is refused in a document of an earlier
    format_version, or one that does not list its extension; before, a reader that knew the
    row read a 1.0 document using it, which the conformance checker calls not conformant."""
    from portable_ckpt.format.dtypes import DType

    row = DType("float8_e8m0fnu", "F8_E8M0", 1, "ml_dtypes:float8_e8m0fnu", since="1.3",
                extension="dtype-float8-e8m0fnu")
    monkeypatch.setitem(DTYPES, row.name, row)
    vdir, _ = build_version(tmp_path)

    def edit(d: dict) -> None:
        d["format_version"] = version
        d["tensors"]["b"]["dtype"] = row.name
        if listed:
            d["must_understand"] = [row.extension]

    edit_manifest(vdir, edit)
    with monkeypatch.context() as m:  # the extension known to this reader, as with a 1.3 row
        from portable_ckpt.format import manifest

        m.setattr(manifest, "KNOWN_EXTENSIONS", {*manifest.KNOWN_EXTENSIONS, row.extension})
        err = expect_code("PCK-DTYPE-UNSUPPORTED", portable_ckpt.open, vdir)
    assert "'float8_e8m0fnu' is a dtype of format 1.3" in err.message, err.message


def test_a_later_dtype_is_refused_in_a_tensor_table_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Diff review D1: the check above ran for JSON tensors only; a table's dtype codes name
    the same rows, and a 1.1 table using a later row opened."""
    from portable_ckpt.format.dtypes import DType
    from portable_ckpt.io import commit

    monkeypatch.setattr(commit, "TABLE_THRESHOLD", 1)
    m = portable_ckpt.save_arrays(tmp_path, {"u": np.arange(4, dtype=np.uint8),
                                             "f": np.zeros(2, np.float32)}, step=1)
    assert m.tensor_table is not None
    monkeypatch.setitem(DTYPES, "uint8", DType("uint8", "U8", 1, "u1", since="1.3",
                                               extension="dtype-u8-again"))
    err = expect_code("PCK-DTYPE-UNSUPPORTED", portable_ckpt.open, tmp_path)
    assert "'uint8' is a dtype of format 1.3" in err.message and "tensor-table" in err.message


@pytest.mark.parametrize("table", [False, True], ids=["json", "table"])
def test_the_committer_refuses_a_later_dtype_it_does_not_announce(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: bool
) -> None:
    """Contributor review D11: the committer's readability check parsed the record, which holds
    none of a table's rows, so a later row in a tensor table was published in a 1.1 manifest
    without its extension, and no reader opened the version; JSON tensors were refused. The
    committer announces a row of 1.3 itself (R-VERSION-2, R-VERSION-7); with that step taken
    out, the last check before publishing still refuses both forms."""
    from portable_ckpt.io import commit as commit_mod
    from portable_ckpt.io.commit import commit
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id
    from portable_ckpt.storage import open_storage

    monkeypatch.setattr(commit_mod, "_announce_dtypes", lambda manifest, merged: None)
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    indexes = []
    for w in (0, 1):
        sw = ShardWriter(storage, attempt, w, tensor_table=table)
        sw.add_tensor("z", np.arange(2, dtype=np.complex64), offsets=(2 * w,), global_shape=(4,))
        indexes.append(sw.finish())
    err = expect_code("PCK-DTYPE-UNSUPPORTED", commit, storage, attempt, step=1,
                      indexes=indexes, tensor_table=table)
    assert "'complex64' is a dtype of format 1.3" in err.message, err.message
    assert "nothing is published" in err.message, err.message
    assert not (tmp_path / attempt / "manifest.json").exists()


@pytest.mark.parametrize("table", [False, True], ids=["json", "table"])
def test_the_committer_announces_a_dtype_of_1_3_beside_a_table(tmp_path: Path, table: bool) -> None:
    """R-VERSION-2, R-VERSION-7: a tensor of a row of 1.3 makes the manifest and the writer
    indexes that hold it 1.3, and the manifest lists the row's extension, beside
    ``tensor-table`` when the records are in a table (added, never replacing); a version
    without such a tensor stays 1.0 / 1.1."""
    import json

    from portable_ckpt.io.commit import commit
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id
    from portable_ckpt.storage import open_storage

    storage = open_storage(tmp_path, create=True)
    for step, arrays in enumerate(({"w": np.ones(2, np.float32)},
                                   {"w": np.ones(2, np.float32), "z": np.ones(2, np.complex64)}), 1):
        attempt = new_attempt_id(step)
        for w, (key, arr) in enumerate(arrays.items()):
            sw = ShardWriter(storage, attempt, w, tensor_table=table)
            sw.add_tensor(key, arr)
            sw.finish()
        commit(storage, attempt, step=step, expected_writers=list(range(len(arrays))),
               tensor_table=table)
        doc = json.loads((tmp_path / attempt / "manifest.json").read_bytes())
        index_versions = [json.loads((tmp_path / attempt / "index" / f"w{w:05d}.json")
                                     .read_bytes())["format_version"] for w in range(len(arrays))]
        base = "1.1" if table else "1.0"
        if step == 1:
            assert (doc["format_version"], doc["must_understand"]) == (
                base, ["tensor-table"] if table else [])
            assert index_versions == [base]
        else:
            assert doc["format_version"] == "1.3"
            assert doc["must_understand"] == (["dtype-complex64", "tensor-table"] if table
                                              else ["dtype-complex64"])
            assert index_versions == [base, "1.3"]  # only the writer holding the row
        ck = portable_ckpt.open(tmp_path / attempt)
        assert ck.read("w").tolist() == [1.0, 1.0]


@pytest.mark.parametrize("table", [False, True], ids=["json", "table"])
def test_the_committer_refuses_a_stored_index_older_than_its_dtypes(
    tmp_path: Path, table: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-DTYPE-3 on writer indexes: a stored index of 1.0 (JSON) or 1.1 (tensor table) holding
    complex64 is refused, ``commit`` and ``portable-ckpt recommit`` alike. The table's codes
    were not checked against the index's version: the committer merged them and published a
    1.3 version (it stamps what it merged), over an index that readers must refuse."""
    import json

    from portable_ckpt.cli.main import main
    from portable_ckpt.io.commit import commit
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id
    from portable_ckpt.storage import open_storage

    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    sw = ShardWriter(storage, attempt, 0, tensor_table=table)
    sw.add_tensor("z", np.arange(2, dtype=np.complex64))
    sw.finish()
    path = tmp_path / attempt / "index" / "w00000.json"
    doc = json.loads(path.read_bytes())
    assert doc["format_version"] == "1.3"
    doc["format_version"] = "1.1" if table else "1.0"
    path.write_text(json.dumps(doc))
    err = expect_code("PCK-DTYPE-UNSUPPORTED", commit, storage, attempt, step=1,
                      expected_writers=[0], tensor_table=table)
    assert "'complex64' is a dtype of format 1.3" in err.message, err.message
    assert not (tmp_path / attempt / "manifest.json").exists()
    capsys.readouterr()
    assert main(["recommit", str(tmp_path / attempt), "--was-committed"]) == 1
    assert "[PCK-DTYPE-UNSUPPORTED]" in capsys.readouterr().err
    assert not (tmp_path / attempt / "manifest.json").exists()


def _spec_dtype_table() -> list[tuple[str, str, int]]:
    """The rows of spec §7's table, in order: (format dtype, safetensors dtype, itemsize)."""
    import re

    text = (Path(__file__).resolve().parents[2] / "spec" / "README.md").read_text()
    section = text[text.index("## 7. Dtypes"):text.index("## 8.")]
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| (\d+) \|", section, re.M)
    return [(name, st, int(size)) for name, st, size in rows]


def test_itemsizes_match_the_table() -> None:
    """R-DTYPE-1: every transcription of the dtype table is the spec's §7 table, row for row.

    The table is restated on purpose where independence matters (the schemas, the conformance
    checker, the minimal writer); this test is what keeps them one table (maintainer review: a
    row added in one place wrote documents every other reader refuses, and nothing failed).
    """
    import json

    import torch

    from conformance import spec as cspec
    from conformance.examples import minimal_writer
    from portable_ckpt.io.tensor_table import DTYPE_CODES
    from portable_ckpt.torch._tensors import format_dtype, numpy_view, torch_dtype, torch_from_numpy

    rows = _spec_dtype_table()
    assert len(rows) >= 15 and rows[0] == ("float64", "F64", 8)  # the parse found the table
    names = [r[0] for r in rows]
    assert list(DTYPES) == names == list(DTYPE_CODES)  # order: a tensor table's codes (§8.5)
    assert list(cspec.DTYPE_CODES) == names
    for name, st, size in rows:
        assert (DTYPES[name].safetensors, DTYPES[name].itemsize) == (st, size), name
        assert np.dtype(DTYPES[name].numpy).itemsize == size, name
        assert cspec.DTYPES[name] == minimal_writer.DTYPES[name] == (st, size), name
        assert cspec.ST_ITEMSIZE[st] == size, name
    # Row for row (a set missed a misordered minimal writer, whose table codes follow its
    # order: maintainer review M2).
    assert list(cspec.DTYPES) == list(minimal_writer.DTYPES) == names
    root = Path(__file__).resolve().parents[2] / "spec" / "schemas"
    # The 1.0 enum is closed: it holds the rows of 1.0, and a later MINOR's rows (``since``)
    # belong to that MINOR's schemas (docs/changing-the-format.md), not to these.
    of_1_0 = [n for n in names if DTYPES[n].since == "1.0" and DTYPES[n].extension is None]
    for schema in (root / "common.schema.json", root / "errata" / "common.schema.json"):
        assert json.loads(schema.read_text())["$defs"]["dtype"]["enum"] == of_1_0, schema
    # torch: every format dtype this torch has crosses both ways with its bytes unchanged
    for name in names:
        td = torch_dtype(name)
        assert format_dtype(td) == name
        raw = torch.arange(3 * DTYPES[name].itemsize, dtype=torch.uint8)
        if name == "bool":
            raw = raw % 2
        t = raw.view(td)
        back = torch_from_numpy(numpy_view(t))
        assert back.dtype == td and torch.equal(back.view(torch.uint8), raw), name
    assert math.prod([]) == 1
    assert Continuation().world_size == 1
