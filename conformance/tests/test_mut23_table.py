"""Mutation audit 23: the suite's tensor table decoder (§8.5, R-TABLE-3 … R-TABLE-6).

A table is encoded by :func:`conformance.table.encode_table`, then one column is replaced by bytes
no conforming writer stores; :func:`conformance.table.decode_table` (and ``load_table`` for a
zstd table) must refuse it with the spec's code, never decode it nor crash.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from conformance.craft import file_record, safetensors_bytes
from conformance.spec import DTYPE_CODES
from conformance.store import Problem, VersionFiles, parse_file_record, parse_safetensors_bytes
from conformance.table import decode_table, encode_table, load_table

FILE = "data/w00000-0000.safetensors"
FILES: dict[str, Any] = {FILE: {}}


def _tensor(shape: list[int]) -> dict[str, Any]:
    return {"dtype": "float32", "shape": shape,
            "ranges": [{"offsets": [0] * len(shape), "lengths": shape, "file": FILE,
                        "codec": "none"}]}


def _table(tensors: dict[str, Any], **columns: bytes) -> bytes:
    """The table of ``tensors`` with the named columns' bytes replaced."""
    raw = encode_table(tensors)
    hdr = parse_safetensors_bytes(raw, "table")
    items = []
    for name, st in hdr.tensors.items():
        data = columns.get(name.replace(".", "_"), raw[st.begin:st.end])
        size = {"U8": 1, "U32": 4, "I64": 8}[st.dtype]
        items.append((name, st.dtype, [len(data) // size], data))
    return safetensors_bytes(items)


def _q(*xs: int) -> bytes:
    return struct.pack(f"<{len(xs)}q", *xs)


def _code(raw: bytes, files: dict[str, Any] = FILES) -> str:
    try:
        decode_table(raw, files, "table")
    except Problem as exc:
        return exc.code
    return "ok"


TWO = {"a": _tensor([4]), "b": _tensor([2])}


def test_an_intact_table_decodes() -> None:
    table = decode_table(_table(TWO), FILES, "table")
    assert table.keys == ["a", "b"] and [list(s) for s in table.shapes] == [[4], [2]]


@pytest.mark.parametrize(("tensors", "columns", "code"), [
    (TWO, {"tensor_key": b"a\x00bc"}, "PCK-SCHEMA"),  # T01: last key not NUL-terminated
    (TWO, {"tensor_key": b"a\x00a\x00"}, "PCK-SCHEMA"),  # T04: a key twice (R-TABLE-6)
    (TWO, {"file_path": FILE.encode() + b"\x00" + FILE.encode() + b"\x00",
           "range_file": struct.pack("<2I", 0, 1)}, "PCK-SCHEMA"),  # T05: a path twice
    (TWO, {"file_path": b"data/other.safetensors\x00"}, "PCK-SCHEMA"),  # T06: not in files
    (TWO, {"range_file": struct.pack("<2I", 0, 1)}, "PCK-SCHEMA"),  # T07: path 1 of 1
    (TWO, {"tensor_dtype": bytes([0, len(DTYPE_CODES)])}, "PCK-DTYPE-UNSUPPORTED"),  # T08
    (TWO, {"range_codec": bytes([0, 2])}, "PCK-CODEC"),  # T09: codec 2 is neither
    (TWO, {"tensor_shape": _q(4, -2)}, "PCK-LIMIT"),  # T10: a negative dimension
    (TWO, {"tensor_shape": _q(4, 2, 7)}, "PCK-SCHEMA"),  # T12: one value more than Σ ndim
    (TWO, {"tensor_ranges": _q(3, -1)}, "PCK-SCHEMA"),  # T03: Σ counts right, one negative
    ({"a": _tensor([1] * 64)}, {"tensor_ndim": bytes([65]), "tensor_shape": _q(*[1] * 65)},
     "PCK-LIMIT"),  # T02: 65 dimensions, above the limit of 64
])
def test_a_table_breaking_one_rule(tensors: dict[str, Any], columns: dict[str, bytes],
                                   code: str) -> None:
    assert _code(_table(tensors, **columns)) == code


def test_the_limit_of_64_dimensions_is_inclusive() -> None:
    assert _code(_table({"a": _tensor([1] * 64)})) == "ok"


def test_a_zstd_table_must_declare_its_size(tmp_path: Path) -> None:
    """T13: a zstd table's frame declares its decoded size (R-TABLE-3)."""
    import zstandard

    raw = _table(TWO)
    rel = "tables/t.safetensors.zst"
    for declared, code in ((True, "ok"), (False, "PCK-CODEC")):
        frame = zstandard.ZstdCompressor(write_content_size=declared).compress(raw)
        (tmp_path / "tables").mkdir(exist_ok=True)
        (tmp_path / rel).write_bytes(frame)
        vf = VersionFiles(tmp_path)
        files = {FILE: {}, rel: file_record(frame)}
        vf.records[rel] = parse_file_record(rel, files[rel])
        try:
            load_table(vf, {"file": rel, "codec": "zstd"}, files, "manifest.json")
            got = "ok"
        except Problem as exc:
            got = exc.code
        assert got == code, declared
