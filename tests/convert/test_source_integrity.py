"""Integrity of torch.save and DCP sources (conversion review: M2, M3, H2's torch.save part).

M2: damaged bytes of a storage member were converted and then verified as good (the damage got
fresh checksums); every member's bytes are now checked against the CRC-32 its zip records.
M3: a zip with two members of one name converted to other values than ``torch.load`` reads.
H2: a valid torch.save file of many small tensors ran out of file descriptors (one mapping per
tensor), exit 75 "retryable" on every run.

Every source here is a real ``torch.save`` / ``dcp.save`` output, damaged on disk where a test
says so.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import portable_ckpt  # noqa: E402
from portable_ckpt.convert import convert  # noqa: E402
from portable_ckpt.errors import CheckpointError  # noqa: E402

pytestmark = pytest.mark.torch


def _member_data(path: Path, suffix: str) -> tuple[str, int, int]:
    """``(name, file offset, size)`` of the zip member of ``path`` whose name ends with ``suffix``."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(suffix))
    raw = path.read_bytes()
    n, e = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
    return info.filename, info.header_offset + 30 + n + e, info.file_size


def _flip(path: Path, at: int, count: int = 8) -> None:
    raw = bytearray(path.read_bytes())
    for k in range(count):
        raw[at + k] ^= 0x55
    path.write_bytes(bytes(raw))


def _refused(src: Path, dst: Path, code: str, **kw: Any) -> CheckpointError:
    with pytest.raises(CheckpointError) as ei:
        convert(str(src), str(dst), **kw)
    assert ei.value.code == code, str(ei.value)
    assert not dst.exists(), "nothing may be committed from a refused source"
    return ei.value


# -- M2: damaged storage bytes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        "small",  # read into a fresh buffer (under 1 MiB), the sum on those bytes
        "large",  # mapped (1 MiB and more), the sum on the mapping
        "view",  # a view of part of its storage: the damage lies outside the converted bytes
    ],
)
def test_damaged_torch_save_member_is_a_checksum_error(tmp_path: Path, case: str) -> None:
    """Review M2: 8 flipped data bytes of a torch.save member (zipfile.testzip names it) were
    converted, exit 0, and ``verify --deep`` said OK. Now PCK-CHECKSUM, naming the file, the
    member and the tensor, and nothing is committed."""
    src = tmp_path / "ok.pt"
    base = torch.arange(float(1 << 19 if case == "large" else 64))
    torch.save({"w": base[:8] if case == "view" else base, "step": 40}, src)
    name, start, size = _member_data(src, "/data/0")
    _flip(src, start + size - 16 if case == "view" else start)
    with zipfile.ZipFile(src) as z:
        assert z.testzip() == name  # real damage: the zip's own CRC-32 disagrees
    err = _refused(src, tmp_path / "root", "PCK-CHECKSUM")
    assert str(src) in err.message and name in err.message and "tensor 'w'" in err.message
    assert err.path == str(src)


def test_damaged_member_shared_by_tensors_is_named_once_and_summed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tensors sharing one storage (tied weights, views) load one member: its CRC-32 is summed
    once, not once per tensor, and a good file converts with every tensor's values."""
    from portable_ckpt.convert import _torchzip

    t = torch.arange(4096.0).reshape(64, 64)
    state = {"emb": t, "head": t, "row": t[3], "col": t[:, 5], "other": torch.ones(3)}
    src = tmp_path / "tied.pt"
    torch.save(state, src)
    summed: list[str] = []
    real = _torchzip.check_member_crc

    def counting(fd: int, member: Any, **kw: Any) -> None:
        summed.append(member.name)
        real(fd, member, **kw)

    monkeypatch.setattr(_torchzip, "check_member_crc", counting)
    convert(str(src), str(tmp_path / "root"))
    data = sorted(n for n in summed if "/data/" in n)
    assert len(data) == len(set(data)) == 2, summed  # the shared storage and "other"'s
    ck = portable_ckpt.open(str(tmp_path / "root"))
    for key, want in state.items():
        assert ck.read(key).tolist() == want.tolist(), key
    name, start, _ = _member_data(src, "/data/0")  # the shared storage, saved first
    _flip(src, start)
    assert name in _refused(src, tmp_path / "root2", "PCK-CHECKSUM").message


def test_torch_save_without_crc32s_still_converts(tmp_path: Path) -> None:
    """torch.save under ``set_crc32_options(False)`` records 0 for every member, and torch.load
    reads it; it was refused (PCK-SHARD-HEADER, "Bad CRC-32" of its ``byteorder``)."""
    from torch.serialization import get_crc32_options, set_crc32_options

    was = get_crc32_options()
    set_crc32_options(False)
    try:
        torch.save({"w": torch.arange(64.0), "big": torch.ones(1 << 19), "step": 3}, tmp_path / "n.pt")
    finally:
        set_crc32_options(was)
    with zipfile.ZipFile(tmp_path / "n.pt") as z:
        assert {i.CRC for i in z.infolist()} == {0}
    convert(str(tmp_path / "n.pt"), str(tmp_path / "root"))
    ck = portable_ckpt.open(str(tmp_path / "root"))
    assert ck.read("w").tolist() == list(range(64)) and float(ck.read("big").sum()) == 1 << 19


def test_damaged_data_pkl_is_a_checksum_error(tmp_path: Path) -> None:
    """``data.pkl``'s own CRC-32 mismatch is the same rule as a storage member's."""
    src = tmp_path / "p.pt"
    torch.save({"w": torch.ones(2), "name": "abcdefgh"}, src)
    raw = src.read_bytes()
    at = raw.index(b"abcdefgh")
    _flip(src, at, 1)  # still a valid pickle: only the CRC-32 tells
    err = _refused(src, tmp_path / "root", "PCK-CHECKSUM")
    assert "data.pkl" in err.message and str(src) in err.message


def _dcp_save(state: dict[str, Any], path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(path), no_dist=True)


@pytest.mark.parametrize("n", [64, 1 << 19])  # a read chunk, a mapped chunk
def test_damaged_dcp_chunk_is_a_checksum_error(tmp_path: Path, n: int) -> None:
    """Review M2, DCP: a flipped chunk (each chunk is a torch.save zip) was converted, exit 0."""
    src = tmp_path / "dcp"
    w = torch.arange(float(n)) + 0.5
    _dcp_save({"w": w, "keep": torch.zeros(4)}, src)
    (distcp,) = src.glob("*.distcp")
    at = distcp.read_bytes().index(w[:4].numpy().tobytes())
    _flip(distcp, at + 8)
    err = _refused(src, tmp_path / "root", "PCK-CHECKSUM", trust_pickle=True)
    assert str(distcp) in err.message and "tensor 'w'" in err.message and "/data/0" in err.message


def test_damaged_dcp_byte_item_is_refused_not_skipped(tmp_path: Path) -> None:
    """A byte item whose ``data.pkl`` differs from its CRC-32 was skipped with a warning (as an
    item that is no torch.save zip), exit 0: it is damage, refused like a damaged chunk."""
    src = tmp_path / "dcp"
    _dcp_save({"w": torch.ones(2), "note": "marker-xyz"}, src)
    (distcp,) = src.glob("*.distcp")
    _flip(distcp, distcp.read_bytes().index(b"marker-xyz"), 1)
    err = _refused(src, tmp_path / "root", "PCK-CHECKSUM", trust_pickle=True)
    assert str(distcp) in err.message and "'note'" in err.message and err.path == str(distcp)


# -- M3: two members of one name -------------------------------------------------------------------


def _rewrite(src: Path, dst: Path, suffix: str, data: bytes) -> None:
    """Copy ``src``'s members to ``dst``, adding a second member of the name ending with
    ``suffix``, holding ``data``, right after the first."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info))
            if info.filename.endswith(suffix):
                zout.writestr(info.filename, data)


@pytest.mark.parametrize("how", ["same-name", "case", "data.pkl"])
def test_duplicate_zip_member_is_refused(tmp_path: Path, how: str) -> None:
    """Review M3: a re-added ``data/0`` made the converter read the last duplicate while
    torch.load reads the first. torch's reader compares names without ASCII case, so
    ``DATA/0`` before ``data/0`` is what it reads; a second ``data.pkl`` is the same. All are
    refused (PCK-SHARD-HEADER), naming the file and the member."""
    ok = tmp_path / "ok.pt"
    # torch.load finds a name by a binary search of the sorted names: which of two it reads
    # depends on the others. These counts make it read the other member than a converter
    # reading the last of a name (zipfile's), or the exact name, would.
    extra = 3 if how == "case" else 12
    torch.save({"w": torch.arange(8.0), **{f"x{i}": torch.ones(2) for i in range(extra)}}, ok)
    bad = torch.full((8,), 666.0).numpy().tobytes()
    dup = tmp_path / "dup.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name it writes
        if how == "same-name":
            _rewrite(ok, dup, "/data/0", bad)
        elif how == "case":
            _rewrite(ok, dup, "/data/0", bad)
            raw = bytearray(dup.read_bytes())
            prefix = raw[30 : raw.index(b"/", 30)].decode()
            old = f"{prefix}/data/0".encode()
            hits = [i for i in range(len(raw)) if raw.startswith(old, i)]
            assert len(hits) == 4  # local and central headers of data/0 and of the one added
            for at in hits[1::2]:  # the added member's: torch.load reads it for data/0
                raw[at : at + len(old)] = f"{prefix}/DATA/0".encode()
            dup.write_bytes(bytes(raw))
        else:
            with zipfile.ZipFile(ok) as z:
                pkl = z.read(z.namelist()[0])  # torch.save writes data.pkl first
            _rewrite(ok, dup, "/data.pkl", pkl.replace(b"x0", b"y0"))
    if how != "data.pkl":
        assert torch.load(dup, weights_only=True)["w"].tolist() == (
            [666.0] * 8 if how == "case" else list(range(8)))
    err = _refused(dup, tmp_path / "root", "PCK-SHARD-HEADER")
    member = "data.pkl" if how == "data.pkl" else "/data/0"
    assert str(dup) in err.message and member in err.message
    assert ("DATA/0" in err.message) == (how == "case")


def test_duplicate_member_of_a_dcp_item_is_refused(tmp_path: Path) -> None:
    """Review M3, DCP: an item's zip (a byte item holding two tensors: ``data/0``,
    ``data/1``) with its second member renamed to the first's name is refused, not skipped."""
    src = tmp_path / "dcp"
    _dcp_save({"w": torch.ones(2), "pair": (torch.zeros(2), torch.ones(3))}, src)
    (distcp,) = src.glob("*.distcp")
    raw = bytearray(distcp.read_bytes())
    hits = []
    at = raw.find(b"/data/1")
    while at >= 0:
        hits.append(at)
        at = raw.find(b"/data/1", at + 1)
    assert len(hits) == 2  # the local and the central header of the pair's second tensor
    for at in hits:
        raw[at : at + 7] = b"/data/0"
    distcp.write_bytes(bytes(raw))
    err = _refused(src, tmp_path / "root", "PCK-SHARD-HEADER", trust_pickle=True)
    assert str(distcp) in err.message and "'pair'" in err.message and "/data/0" in err.message


# -- H2: many small tensors under a descriptor limit -----------------------------------------------


_UNDER_LIMIT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from portable_ckpt.convert import convert
convert(sys.argv[1], sys.argv[2], trust_pickle=True)
"""


def _convert_under_limit(src: Path, dst: Path) -> None:
    """Convert ``src`` in a process whose descriptor limit is 256 (``ulimit -n 256``)."""
    run = subprocess.run(
        [sys.executable, "-c", _UNDER_LIMIT, str(src), str(dst)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert run.returncode == 0, run.stderr[-600:]


@pytest.mark.parametrize("case", ["small-tensors", "strided-views"])
def test_many_small_tensors_convert_under_a_descriptor_limit(tmp_path: Path, case: str) -> None:
    """Review H2: 4,800 LayerNorm/Adam tensors of 32 bytes each held a mapping (a duplicated
    descriptor) until the writer dropped its batch: EMFILE under ``ulimit -n 1024``, exit 75
    on every run. Tensors under 1 MiB are read; a few elements strided across a large storage
    are copied out, so their mapping goes at once."""
    src = tmp_path / "many.pt"
    if case == "small-tensors":
        m = torch.nn.ModuleList([torch.nn.LayerNorm(8) for _ in range(150)])
        opt = torch.optim.Adam(m.parameters())
        sum(p.sum() for p in m.parameters()).backward()  # type: ignore[union-attr]
        opt.step()
        state: dict[str, Any] = {"model": m.state_dict(), "optim": opt.state_dict()}
    else:
        base = torch.arange(float(1024 * 512)).reshape(1024, 512)  # one 2 MiB storage
        state = {f"col{i}": base[:, i] for i in range(300)}
    torch.save(state, src)
    _convert_under_limit(src, tmp_path / "root")
    ck = portable_ckpt.open(str(tmp_path / "root"))
    if case == "strided-views":
        assert ck.read("col7").tolist() == state["col7"].tolist()
    else:
        assert ck.read("model/149.weight").tolist() == state["model"]["149.weight"].tolist()


def test_dcp_of_many_files_converts_under_a_descriptor_limit(tmp_path: Path) -> None:
    """After H2: a DCP checkpoint of one file per item (``single_file_per_rank=False``, what
    ``--to dcp`` writes) kept every ``.distcp`` open: 300 files under ``ulimit -n 256`` failed
    with EMFILE, exit 75, on every run. At most 64 are open at once."""
    import torch.distributed.checkpoint as dcp

    state = {f"t{i}": torch.full((4,), float(i)) for i in range(300)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, no_dist=True, storage_writer=dcp.FileSystemWriter(
            str(tmp_path / "dcp"), single_file_per_rank=False))
    assert len(list((tmp_path / "dcp").glob("*.distcp"))) >= 300
    _convert_under_limit(tmp_path / "dcp", tmp_path / "root")
    ck = portable_ckpt.open(str(tmp_path / "root"))
    assert [ck.read(f"t{i}").tolist() for i in (0, 150, 299)] == [[0.0] * 4, [150.0] * 4, [299.0] * 4]
