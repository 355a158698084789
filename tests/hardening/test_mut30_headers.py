"""Mutation audit 30, the shard-header checks of a zstd range (``io/safetensors_io.check_range``,
run by the committer and by every reader): the three parts of "a 1-D U8 tensor of at least one
byte" (R-TENSOR-6), each of which the suite reached only together with the others.

Real zstd versions; the shard is rebuilt with one member changed and re-checksummed, so only the
rule under test can refuse it. Each test names the mutant it kills (the audit's ``mutants.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import portable_ckpt

from ..rules._util import build_version, expect_code, rebuild_shard, shard_header


def _rebuild_member(vdir: Path, name: str, st_dtype: str | None,
                    shape: Callable[[int], list[int]] | None, payload: bytes | None = None) -> None:
    """Rebuild the shard holding ``name`` with that member's dtype, shape (of its byte count)
    or bytes replaced."""
    for shard in sorted((vdir / "data").iterdir()):
        _, header, data = shard_header(shard)
        if name in header:
            break
    else:
        raise AssertionError(f"no shard holds {name!r}")
    items = []
    for key, t in sorted(((k, v) for k, v in header.items() if k != "__metadata__"),
                         key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = t["data_offsets"]
        item = (key, t["dtype"], list(t["shape"]), data[b:e])
        if key == name:
            body = item[3] if payload is None else payload
            item = (key, st_dtype or t["dtype"],
                    shape(len(body)) if shape is not None else [len(body)], body)
        items.append(item)
    rebuild_shard(vdir, f"data/{shard.name}", items)


@pytest.mark.parametrize("case", ["dtype-I8", "shape-n-by-1", "empty"])
def test_a_zstd_range_must_be_a_1d_u8_tensor_of_at_least_one_byte(tmp_path: Path,
                                                                   case: str) -> None:
    """R-TENSOR-6: a zstd range's member is ``U8``, 1-D, at least one byte; otherwise
    PCK-SHARD-MISMATCH, found by ``read`` and by ``verify``. Mutants S09 (the dtype not
    compared: an ``I8`` member of the same bytes was read), S10 (the rank not compared: a
    ``[n, 1]`` member was read) and S11 (``0 <=``: an empty member reached the decoder)."""
    vdir, _ = build_version(tmp_path, codec="zstd")
    if case == "dtype-I8":
        _rebuild_member(vdir, "b@0", "I8", None)
    elif case == "shape-n-by-1":
        _rebuild_member(vdir, "b@0", None, lambda n: [n, 1])
    else:
        _rebuild_member(vdir, "b@0", None, lambda n: [n], b"")
    ck = portable_ckpt.open(vdir)
    err = expect_code("PCK-SHARD-MISMATCH", ck.read, "b")
    assert "b@0" in err.message
    assert "PCK-SHARD-MISMATCH" in [p.code for p in ck.verify(deep=True)]


def test_a_member_whose_span_is_longer_than_its_shape_is_a_header_error(tmp_path: Path) -> None:
    """A header member must span exactly ``prod(shape) × itemsize`` bytes: a longer span is a
    malformed header (PCK-SHARD-HEADER), whatever record names it. ``b`` (int32, 20 bytes)
    declared ``[4]`` over its 20 bytes. Mutant S13 (only a shorter span refused): the header
    parsed and the fault surfaced as a range mismatch of one record (PCK-SHARD-MISMATCH)."""
    vdir, _ = build_version(tmp_path)
    _rebuild_member(vdir, "b@0", None, lambda n: [n // 4 - 1])
    err = expect_code("PCK-SHARD-HEADER", portable_ckpt.open(vdir).read, "b")
    assert "'b@0' spans 20 bytes, but I32[4] needs 16" in err.message


def test_a_hole_between_members_is_a_header_error() -> None:
    """R-SHARD-9: members tile the data area without holes. ``x`` owns bytes 0-4, ``y`` 8-12:
    bytes 4-8 are nobody's, though the last member ends at the end of the file. Mutant S16
    (only overlaps refused): the header was accepted."""
    from portable_ckpt.errors import ShardHeaderError
    from portable_ckpt.format import jsonio
    from portable_ckpt.io.safetensors_io import load_header

    doc = {"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
           "y": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}
    body = jsonio.dumps(doc)
    body += b" " * (-(len(body) + 8) % 8)
    raw = len(body).to_bytes(8, "little") + body + bytes(12)
    with pytest.raises(ShardHeaderError, match="'y' starts at data offset 8, the previous "
                                               "tensor ends at 4 \\(a hole before it\\)"):
        load_header(lambda lo, hi: raw[lo:hi], file_size=len(raw), what="shard")
