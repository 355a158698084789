"""zstd frame headers (R-TENSOR-6, R-TENSOR-7, R-TENSOR-10 without ``--deep``, R-VERIFY-2),
integer tokens and one report per defect and location (errata 3)."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conformance.checker import check
from conformance.store import (
    ZSTD_MAX_WINDOW,
    Problem,
    zstd_bound,
    zstd_check_header,
    zstd_decode,
    zstd_frame_header,
)
from conformance.vectors import VECTOR_DIR, load_cases, materialize

MAGIC = b"\x28\xb5\x2f\xfd"


def _block(data: bytes, *, last: bool) -> bytes:
    return struct.pack("<I", int(last) | (len(data) << 3))[:3] + data


def test_zstd_bound_is_the_spec_formula() -> None:
    for n in (0, 1, 32, 2047, 2048, 131071, 131072, 131073, 1 << 20, 1 << 32):
        small = (131072 - n) // 2048 if n < 131072 else 0
        assert zstd_bound(n) == n + n // 256 + small
    assert zstd_bound(32) == 95 and zstd_bound(8) == 71


@pytest.mark.parametrize(("descriptor", "window"), [
    (0x00, 1 << 10), (0x01, (1 << 10) + (1 << 7)), (0x88, 1 << 27), (0x89, (1 << 27) + (1 << 24)),
    (0x90, 1 << 28), (0xFF, (1 << 41) + 7 * (1 << 38)),
])
def test_window_from_the_descriptor(descriptor: int, window: int) -> None:
    """RFC 8878 §3.1.1.1.2: 2^(10 + Exponent) + 2^(10 + Exponent) / 8 × Mantissa."""
    head = MAGIC + bytes([0x80, descriptor]) + struct.pack("<I", 32)
    fh = zstd_frame_header(head)
    assert (fh.window_size, fh.content_size, fh.single_segment, fh.header_size) == \
        (window, 32, False, 10)


def test_single_segment_window_is_the_content_size() -> None:
    assert zstd_frame_header(MAGIC + bytes([0x20, 200])).window_size == 200
    big = MAGIC + bytes([0xE0]) + struct.pack("<Q", ZSTD_MAX_WINDOW + 1)
    fh = zstd_frame_header(big)
    assert fh.window_size == ZSTD_MAX_WINDOW + 1 and fh.header_size == 13
    with pytest.raises(Problem, match="window"):
        zstd_check_header(big, stored=100, where="x", limit=1 << 40)
    two = MAGIC + bytes([0x60]) + struct.pack("<H", 0)  # 2-byte size: value + 256
    assert zstd_frame_header(two).content_size == 256


@pytest.mark.parametrize(("head", "why"), [
    (b"\x50\x2a\x4d\x18\x04\x00\x00\x00skip", "skippable"),
    (b"\x5f\x2a\x4d\x18\x04\x00\x00\x00skip", "skippable"),
    (b"\x29\xb5\x2f\xfd\x20\x20", "magic"),
    (MAGIC + b"\x28\x20", "reserved"),
    (MAGIC + b"\x21\x01\x20", "dictionary"),
    (MAGIC + b"\x80\x90\x20\x00", "truncated"),
    (MAGIC + b"\x80", "truncated"),
    (MAGIC, "magic"),
])
def test_header_defects_are_codec(head: bytes, why: str) -> None:
    with pytest.raises(Problem, match=why) as ei:
        zstd_check_header(head, stored=len(head) + 32, where="x", limit=32, exact=32)
    assert ei.value.code == "PCK-CODEC"


def test_a_dictionary_id_of_zero_names_no_dictionary() -> None:
    """RFC 8878: a Dictionary_ID field holding 0 is no dictionary (libzstd decodes the frame)."""
    data = bytes(range(32))
    for did in (b"\x00", b"\x00\x00", b"\x00\x00\x00\x00"):
        flag = {1: 1, 2: 2, 4: 3}[len(did)]
        frame = MAGIC + bytes([0x20 | flag]) + did + bytes([32]) + _block(data, last=True)
        fh = zstd_frame_header(frame)
        assert (fh.content_size, fh.header_size) == (32, 6 + len(did))
        assert zstd_decode(frame, where="x", limit=32, exact=32) == data
    with pytest.raises(Problem, match="dictionary"):
        zstd_frame_header(MAGIC + b"\x22\x00\x01\x20")


def test_bound_and_window_before_decoding() -> None:
    data = bytes(range(32))
    at_bound = MAGIC + bytes([0x20, 32]) + _block(b"", last=False) * 18 + _block(data, last=True)
    over = MAGIC + bytes([0x20, 32]) + _block(b"", last=False) * 19 + _block(data, last=True)
    assert len(at_bound) == 95 and len(over) == 98
    assert zstd_decode(at_bound, where="x", limit=32, exact=32) == data
    with pytest.raises(Problem, match="ZSTD_COMPRESSBOUND"):
        zstd_decode(over, where="x", limit=32, exact=32)
    for wd, ok in ((0x88, True), (0x90, False)):
        frame = MAGIC + bytes([0x80, wd]) + struct.pack("<I", 32) + _block(data, last=True)
        if ok:
            assert zstd_decode(frame, where="x", limit=32, exact=32) == data
        else:
            with pytest.raises(Problem, match="window"):
                zstd_decode(frame, where="x", limit=32, exact=32)
    # without a declared size the bound is that of the required size (or of the limit)
    no_size = MAGIC + bytes([0x00, 0x00]) + _block(b"", last=False) * 30 + _block(data, last=True)
    with pytest.raises(Problem, match=r"ZSTD_COMPRESSBOUND\(32\)"):
        zstd_check_header(no_size, stored=len(no_size), where="x", limit=1 << 20, exact=32)
    assert zstd_check_header(no_size, stored=len(no_size), where="x", limit=1 << 20) is None


# -- the checker: one report per defect and location; integer tokens ------------------------------
def _basic(tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    case = next(c for c in load_cases(VECTOR_DIR) if c["name"] == "valid-basic")
    target = materialize(case, tmp_path, VECTOR_DIR)
    mpath = target / "manifest.json"
    m = json.loads(mpath.read_text())
    edit(m)
    mpath.write_text(json.dumps(m, indent=1))
    return target


def _range0(m: dict[str, Any]) -> dict[str, Any]:
    r: dict[str, Any] = m["tensors"]["model.w"]["ranges"][0]
    return r


def _dotslash(m: dict[str, Any]) -> None:
    m["files"]["./entries/meta.g.json"] = m["files"].pop("entries/meta.g.json")
    m["entries"]["meta"]["values"][0]["file"] = "./entries/meta.g.json"


EDITS: dict[str, tuple[Callable[[dict[str, Any]], None], str, int]] = {
    "codec-unknown": (lambda m: _range0(m).update(codec="lz4"), "PCK-CODEC", 1),
    "dtype-unknown": (lambda m: m["tensors"]["model.w"].update(dtype="complex64"),
                      "PCK-DTYPE-UNSUPPORTED", 1),
    "builtin-unknown": (lambda m: m["entries"]["meta"].update(schema={"id": "pck:step/2"}),
                        "PCK-ENTRY-SCHEMA", 1),
    "no-ranges": (lambda m: m["tensors"]["model.w"].update(ranges=[]), "PCK-COVERAGE-GAP", 1),
    "range-path-dotdot": (lambda m: _range0(m).update(file="data/../x"), "PCK-PATH-UNSAFE", 1),
    # one path in two places: the files key and the entry's value file, once each
    "dotslash": (_dotslash, "PCK-PATH-UNSAFE", 2),
    "attempt-id-malformed": (lambda m: m.update(attempt_id="s10"), "PCK-ATTEMPT-ID", 1),
    "size-above-2^53": (lambda m: m["files"]["entries/meta.g.json"].update(size=2**53),
                        "PCK-LIMIT", 1),
    "step-float": (lambda m: m.update(step=10.0), "PCK-SCHEMA", 1),
    "size-float": (lambda m: m["files"]["entries/meta.g.json"].update(size=29.0), "PCK-SCHEMA", 1),
    "world-size-float": (lambda m: m["continuation"].update(world_size=1.0), "PCK-SCHEMA", 1),
    "shape-float": (lambda m: m["tensors"]["model.w"].update(shape=[4.0, 3]), "PCK-SCHEMA", 1),
    "offsets-float": (lambda m: _range0(m).update(offsets=[0.0, 0]), "PCK-SCHEMA", 1),
    "lengths-float": (lambda m: _range0(m).update(lengths=[2, 3.0]), "PCK-SCHEMA", 1),
    "block-size-float": (lambda m: m["files"]["entries/meta.g.json"]["checksum"].update(
        block_size=4096.0), "PCK-SCHEMA", 1),
}


@pytest.mark.parametrize("name", list(EDITS))
def test_one_report_per_defect_and_location(name: str, tmp_path: Path) -> None:
    edit, code, n = EDITS[name]
    target = _basic(tmp_path, edit)
    for deep in (False, True):
        rep = check(target, deep=deep)
        assert [e.code for e in rep.errors] == [code] * n, [e.to_json() for e in rep.errors]


def test_float_integers_in_writer_index_and_rank(tmp_path: Path) -> None:
    """``writer`` of a writer index and a per-rank value's ``rank``: PCK-SCHEMA for 0.0."""
    case = next(c for c in load_cases(VECTOR_DIR) if c["name"] == "valid-per-rank")
    target = materialize(case, tmp_path, VECTOR_DIR)
    mpath = target / "manifest.json"
    m = json.loads(mpath.read_text())
    m["entries"][next(iter(m["entries"]))]["values"][0]["rank"] = 0.0
    mpath.write_text(json.dumps(m, indent=1))
    rep = check(target)
    assert [e.code for e in rep.errors] == ["PCK-SCHEMA"], [e.to_json() for e in rep.errors]
    assert "rank" in rep.errors[0].message and "integer" in rep.errors[0].message
    # a writer index (not listed in files: read unverified, like an unlisted side document)
    case = next(c for c in load_cases(VECTOR_DIR) if c["name"] == "valid-basic")
    target = materialize(case, tmp_path / "w", VECTOR_DIR)
    (target / "index").mkdir()
    doc = {"format": "portable-ckpt-writer-index", "format_version": "1.0",
           "attempt_id": target.name, "writer": 0.0, "files": {}, "tensors": {}, "entries": {}}
    (target / "index" / "w00000.json").write_text(json.dumps(doc))
    rep = check(target)
    assert "PCK-SCHEMA" in rep.codes and "PCK-ATTEMPT-ID" not in rep.codes, \
        [e.to_json() for e in rep.errors]


def test_an_undeclared_frame_is_bounded_by_what_it_decodes_to() -> None:
    """R-ENTRY-6 (errata 3): without a declared content size, m is the decoded size."""
    from portable_ckpt.errors import CodecError
    from portable_ckpt.io.codec import decompress_frame

    raw = b'{"n": 1}'
    ok = MAGIC + bytes([0x00, 0x00]) + _block(raw, last=True)  # 8 bytes, no content size
    bloated = MAGIC + bytes([0x00, 0x00]) + _block(b"", last=False) * 19 + _block(raw, last=True)
    assert len(bloated) == 74 > zstd_bound(len(raw)) == 71
    assert zstd_decode(ok, where="x", limit=1 << 26) == raw
    assert decompress_frame(ok, expect=None, limit=1 << 26, what="x") == raw
    with pytest.raises(Problem, match="ZSTD_COMPRESSBOUND"):
        zstd_decode(bloated, where="x", limit=1 << 26)
    with pytest.raises(CodecError, match="ZSTD_COMPRESSBOUND"):
        decompress_frame(bloated, expect=None, limit=1 << 26, what="x")
