"""Mutation audit 30 (conversion layer), the ``torch.save`` zip reader's CRC-32 decisions.

Every source is a real ``torch.save`` file, damaged on disk where a test says so; a damaged
storage member is refused (``PCK-CHECKSUM``), never converted into a version whose fresh
checksums call it good.
"""

from __future__ import annotations

import struct
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import portable_ckpt  # noqa: E402
from portable_ckpt.convert import convert  # noqa: E402
from portable_ckpt.convert._torchzip import _CRC_BLOCK  # noqa: E402
from portable_ckpt.errors import CheckpointError  # noqa: E402
from tests.convert.test_convert_attack2 import _torch_zip  # noqa: E402
from tests.convert.test_source_integrity import _flip, _member_data, _refused  # noqa: E402

# test_dcp imports its neighbours by bare name, as tests/convert/conftest.py arranges there
sys.path.insert(0, str(Path(__file__).parents[1] / "convert"))
from tests.convert.test_dcp import dcp_chunk_of_members  # noqa: E402

pytestmark = pytest.mark.torch


def test_an_empty_storage_does_not_switch_off_the_crc_checks(tmp_path: Path) -> None:
    """An empty tensor's storage member is 0 bytes, whose CRC-32 is 0: the zip still records
    CRC-32s, and the other members' are checked (mutant Z12 took any zero CRC for a file saved
    without them, and converted the damaged tensor)."""
    src = tmp_path / "e.pt"
    torch.save({"e": torch.empty(0), "w": torch.arange(64.0)}, src)
    empty, _, size = _member_data(src, "/data/0")
    assert size == 0
    name, start, _ = _member_data(src, "/data/1")
    _flip(src, start)
    err = _refused(src, tmp_path / "root", "PCK-CHECKSUM")
    assert name in err.message and "tensor 'w'" in err.message


def test_every_storage_member_of_a_file_is_checked_not_only_the_first(tmp_path: Path) -> None:
    """Members are checked once each, keyed by where their bytes are: damage in the last of
    three storages is found (mutant Z29 keyed them all alike, so only the first was summed)."""
    src = tmp_path / "three.pt"
    torch.save({"a": torch.arange(64.0), "b": torch.ones(32), "c": torch.zeros(16)}, src)
    name, start, _ = _member_data(src, "/data/2")
    _flip(src, start)
    err = _refused(src, tmp_path / "root", "PCK-CHECKSUM")
    assert name in err.message and "tensor 'c'" in err.message


def test_a_view_of_a_storage_over_one_crc_block_converts(tmp_path: Path) -> None:
    """A view of part of a storage has its member summed apart, ``_CRC_BLOCK`` at a time: the
    sums chain across blocks, so a good member of more than one block passes (mutant Z11 kept
    the last block's sum only and refused the good file as damaged)."""
    n = _CRC_BLOCK // 4 + 1024  # float32 elements: a member of one block and a bit
    base = torch.arange(n, dtype=torch.float32)
    src = tmp_path / "view.pt"
    torch.save({"v": base[1000:1010]}, src)
    _, _, size = _member_data(src, "/data/0")
    assert size > _CRC_BLOCK
    convert(str(src), str(tmp_path / "root"))
    got = portable_ckpt.open(str(tmp_path / "root")).read("v")
    np.testing.assert_array_equal(got, np.arange(1000, 1010, dtype=np.float32))


def test_every_format_dtype_converts_from_torch_save_as_itself(tmp_path: Path) -> None:
    """Each dtype of the format's table, as ``torch.save`` writes it (a typed storage class
    such as ``HalfStorage`` with ``_rebuild_tensor_v2``, or an untyped storage and the dtype
    with ``_rebuild_tensor_v3`` for the unsigned and float8 types), converts to that dtype and
    its bytes (mutant Z01 read a ``HalfStorage`` as bfloat16, Z03 skipped v3 tensors)."""
    from portable_ckpt.format.dtypes import DTYPES

    state = {}
    for name in DTYPES:
        # distinct small bytes (no float8 NaN pattern; a bool byte is 0 or 1)
        raw = torch.arange(24, dtype=torch.uint8).reshape(3, 8) % (2 if name == "bool" else 255) + 1
        if name == "bool":
            raw -= 1
        itemsize = DTYPES[name].itemsize
        state[name] = raw[:, : itemsize * 2].contiguous().view(getattr(torch, name)).reshape(-1)
    src = tmp_path / "dtypes.pt"
    torch.save(state, src)
    convert(str(src), str(tmp_path / "root"))
    ck = portable_ckpt.open(str(tmp_path / "root"))
    for name, t in state.items():
        assert ck.tensors[name].dtype == name, name
        got = np.ascontiguousarray(ck.read(name)).view(np.uint8).tobytes()
        assert got == t.view(torch.uint8).numpy().tobytes(), name


def _rezip(src: Path, dst: Path, compression: int) -> None:
    """Copy the zip ``src`` to ``dst`` member by member with ``compression``."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))


def test_a_compressed_member_is_a_codec_error_naming_it(tmp_path: Path) -> None:
    """``torch.save`` stores every member; a deflated one is refused before its bytes are read
    (PCK-CODEC naming the member), not read raw and called damaged (mutant Z04: PCK-CHECKSUM)."""
    src = tmp_path / "ok.pt"
    torch.save({"w": torch.arange(64.0)}, src)
    deflated = tmp_path / "deflated.pt"
    _rezip(src, deflated, zipfile.ZIP_DEFLATED)
    err = _refused(deflated, tmp_path / "root", "PCK-CODEC")
    assert "compressed" in err.message and "data.pkl" in err.message


def test_a_stored_member_whose_two_sizes_differ_is_refused(tmp_path: Path) -> None:
    """A stored member records its size twice (compressed and not) in the central directory;
    two different sizes are no ``torch.save`` member and are refused (mutant Z06 read the file
    size and converted it)."""
    src = tmp_path / "ok.pt"
    torch.save({"w": torch.arange(64.0)}, src)
    raw = bytearray(src.read_bytes())
    name = _member_data(src, "/data/0")[0].encode()
    at = raw.index(b"PK\x01\x02")
    while raw[at + 46 : at + 46 + len(name)] != name:  # the member's central directory record
        at = raw.index(b"PK\x01\x02", at + 4)
    size = struct.unpack("<I", raw[at + 24 : at + 28])[0]
    raw[at + 20 : at + 24] = struct.pack("<I", size + 4)  # its "compressed" size
    src.write_bytes(bytes(raw))
    err = _refused(src, tmp_path / "root", "PCK-SHARD-HEADER")
    assert "stored" in err.message and name.decode() in err.message


def _one_tensor(
    path: Path,
    storage: bytes,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    numel: int,
    offset: int = 0,
    *,
    tag: bytes = b"storage",
    dtype: bytes = b"",
    args: int = 6,
) -> Path:
    """A hand-made ``torch.save`` zip of one tensor ``t``, as torch pickles it: a float32
    ``FloatStorage`` with ``_rebuild_tensor_v2``, or (``dtype``, a torch attribute name) an
    untyped storage with ``_rebuild_tensor_v3``; ``args`` of the rebuild's are written."""

    def tup(v: tuple[int, ...]) -> bytes:
        return b"(" + b"".join(b"J" + struct.pack("<i", x) for x in v) + b"t"

    def text(v: bytes) -> bytes:
        return b"X" + struct.pack("<I", len(v)) + v

    v3 = bool(dtype)
    pid = (
        b"("
        + text(tag)
        + (b"ctorch.storage\nUntypedStorage\n" if v3 else b"ctorch\nFloatStorage\n")
        + text(b"0")
        + text(b"cpu")
        + b"J"
        + struct.pack("<i", numel)
        + b"tQ"
    )
    parts = [
        pid,
        b"J" + struct.pack("<i", offset),
        tup(shape),
        tup(stride),
        b"\x89",
        b"ccollections\nOrderedDict\n)R",
        b"ctorch\n" + dtype + b"\n",
    ]
    rebuild = b"_rebuild_tensor_v3" if v3 else b"_rebuild_tensor_v2"
    pkl = (
        b"\x80\x02}"
        + text(b"t")
        + b"ctorch._utils\n"
        + rebuild
        + b"\n("
        + b"".join(parts[: args + (1 if v3 else 0)])
        + b"tRs."
    )
    return _torch_zip(path, pkl, {"0": storage})


def test_a_hand_made_tensor_converts_as_torch_loads_it(tmp_path: Path) -> None:
    """The hand-made zip of the refusals below, unedited: torch.load and convert agree."""
    src = _one_tensor(tmp_path / "ok.pt", struct.pack("<4f", 1, 2, 3, 4), (2,), (2,), 4, 1)
    assert torch.load(src, weights_only=True)["t"].tolist() == [2.0, 4.0]
    convert(str(src), str(tmp_path / "root"))
    assert portable_ckpt.open(str(tmp_path / "root")).read("t").tolist() == [2.0, 4.0]


@pytest.mark.parametrize(
    ("storage", "shape", "stride", "numel", "offset", "code", "says"),
    [
        # numel 1 of a 2-element member (mutant Z18: converted)
        (8, (1,), (1,), 1, 0, "PCK-SHARD-HEADER", "disagrees with its element count"),
        # the last element one past the storage: the next bytes of the zip (mutant Z21 read them)
        (4, (2,), (1,), 1, 0, "PCK-SHARD-HEADER", "exceeds its storage"),
        (16, (2,), (2,), 4, 2, "PCK-SHARD-HEADER", "exceeds its storage"),
        # two elements from one stored element: an expand (mutant Z24 converted it)
        (4, (2,), (0,), 1, 0, "PCK-UNSUPPORTED-VALUE", "repeats stored elements"),
        # a stride per dimension (mutant Z20: an internal error from the strict zip)
        (8, (2,), (1, 1), 2, 0, "PCK-SHARD-HEADER", "bad shape/stride"),
    ],
    ids=[
        "numel-vs-member",
        "one-past-the-end",
        "offset-one-past-the-end",
        "expand-of-two",
        "rank-of-stride",
    ],
)
def test_a_view_its_storage_cannot_back_is_refused(
    tmp_path: Path,
    storage: int,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    numel: int,
    offset: int,
    code: str,
    says: str,
) -> None:
    src = _one_tensor(tmp_path / "bad.pt", bytes(storage), shape, stride, numel, offset)
    err = _refused(src, tmp_path / "root", code)
    assert says in err.message and "'t'" in err.message


def test_a_data_pkl_below_the_archive_folder_is_no_torch_save_file(tmp_path: Path) -> None:
    """torch's reader finds ``<archive>/data.pkl`` one folder down; a zip whose ``data.pkl`` is
    deeper is no file it loads, and convert refuses it too (mutant Z14 converted it)."""
    src = tmp_path / "ok.pt"
    torch.save({"w": torch.arange(8.0)}, src)
    deep = tmp_path / "deep.pt"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(deep, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename.replace("/", "/sub/", 1), zin.read(info.filename))
    with pytest.raises(RuntimeError):
        torch.load(deep, weights_only=True)
    err = _refused(deep, tmp_path / "root", "PCK-SHARD-HEADER")
    assert "without a single data.pkl" in err.message


def test_a_dcp_chunk_zip_of_the_member_limit_converts_and_one_more_is_refused(
    tmp_path: Path,
) -> None:
    """A DCP chunk's zip may hold ``MAX_ITEM_MEMBERS`` members; one more is refused (mutant
    Z17 read one more)."""
    from portable_ckpt.convert._torchzip import MAX_ITEM_MEMBERS

    ok = dcp_chunk_of_members(tmp_path / "ok", MAX_ITEM_MEMBERS)
    convert(ok, tmp_path / "ok" / "out", trust_pickle=True)
    got = portable_ckpt.open(tmp_path / "ok" / "out").read("model/a")
    assert got.tolist() == list(range(8))
    bad = dcp_chunk_of_members(tmp_path / "bad", MAX_ITEM_MEMBERS + 1)
    with pytest.raises(CheckpointError) as ei:
        convert(bad, tmp_path / "bad" / "out", trust_pickle=True)
    assert ei.value.code == "PCK-SHARD-HEADER"
    assert f"{MAX_ITEM_MEMBERS + 1:,} members" in str(ei.value)


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ({"args": 3}, "not a plain dense tensor"),  # mutant Z25: an internal IndexError
        ({"dtype": b"float32", "args": 5}, "_rebuild_tensor_v3 without a dtype"),  # Z26: same
        ({"tag": b"module"}, "storage reference malformed"),  # Z27: read as a storage
    ],
    ids=["v2-of-three-args", "v3-without-its-dtype", "persistent-id-of-another-kind"],
)
def test_a_rebuild_call_torch_would_not_make_is_a_header_error(
    tmp_path: Path, edit: dict[str, Any], says: str
) -> None:
    src = _one_tensor(tmp_path / "bad.pt", bytes(8), (2,), (1,), 2, **edit)
    err = _refused(src, tmp_path / "root", "PCK-SHARD-HEADER")
    assert says in err.message


def test_a_v3_tensor_whose_dtype_torch_names_by_an_alias_converts_to_that_dtype(
    tmp_path: Path,
) -> None:
    """``torch.long`` is ``torch.int64`` (torch itself pickles the canonical name; a hand-made
    file may use the alias, which torch.load resolves): converted as int64 (mutant Z02 mapped
    the alias to int32 and halved every value's width)."""
    src = _one_tensor(
        tmp_path / "long.pt", struct.pack("<2q", 5, -7), (2,), (1,), 16, dtype=b"long"
    )
    # (weights_only refuses the alias's global; the file is this test's own)
    assert torch.load(src, weights_only=False)["t"].tolist() == [5, -7]
    convert(str(src), str(tmp_path / "root"))
    ck = portable_ckpt.open(str(tmp_path / "root"))
    assert ck.tensors["t"].dtype == "int64" and ck.read("t").tolist() == [5, -7]


def test_a_byteorder_member_over_its_bound_is_refused_unread(tmp_path: Path) -> None:
    """``byteorder`` is six bytes; one of more than 64 is refused before it is read (mutant Z35
    read it, and its padded ``little`` passed the check)."""
    src = tmp_path / "ok.pt"
    torch.save({"w": torch.arange(8.0)}, src)
    padded = tmp_path / "padded.pt"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(padded, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            zout.writestr(
                info.filename, data.ljust(65) if info.filename.endswith("/byteorder") else data
            )
    err = _refused(padded, tmp_path / "root", "PCK-SHARD-HEADER")
    assert "byteorder is 65 bytes; too large" in err.message
