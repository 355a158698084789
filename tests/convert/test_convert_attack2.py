"""Conversion under attack, second round (review atkconv2): fidelity of portable -> DCP for a
stock optimizer resume, bounds on what a hostile .metadata or data.pkl makes the reader do,
rank counting, destinations, collisions inside values."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import portable_ckpt  # noqa: E402
from portable_ckpt.convert import convert  # noqa: E402
from portable_ckpt.errors import CheckpointError  # noqa: E402

pytestmark = pytest.mark.torch


# -- N9: portable -> DCP, then stock dcp.load + set_state_dict of an AdamW after a step ----------


def _job() -> tuple[Any, Any]:
    torch.manual_seed(0)
    # 12 parameters: the params list runs past position 9 ("10" sorts before "2")
    m = torch.nn.Sequential(*[torch.nn.Linear(3, 3) for _ in range(6)])
    return m, torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.05)


@pytest.mark.parametrize("source", ["portable_ckpt.torch.save", "dcp.save"])
@pytest.mark.parametrize("via", ["convert --to dcp", "PortableStorageReader"])
def test_portable_to_dcp_keeps_the_optimizer_params_list(tmp_path: Path, source: str, via: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import portable_ckpt.torch as pt
    from portable_ckpt.torch.dcp import PortableStorageReader

    m, opt = _job()
    m(torch.randn(4, 3)).sum().backward()
    opt.step()
    msd, osd = get_state_dict(m, opt)
    root = tmp_path / "root"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if source == "dcp.save":  # convert stores DCP's leaves sorted as strings
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp_path / "src"))
            convert(tmp_path / "src", root, trust_pickle=True)
        else:
            pt.save({"model": msd, "optim": osd}, str(root), step=1)
        m2, opt2 = _job()
        msd2, osd2 = get_state_dict(m2, opt2)
        state = {"model": msd2, "optim": osd2}
        if via == "convert --to dcp":
            convert(root, tmp_path / "dcp-out", dst_format="dcp")
            dcp.load(state, checkpoint_id=str(tmp_path / "dcp-out"))  # as docs/convert.md shows
        else:
            dcp.load(state, storage_reader=PortableStorageReader(str(root)))  # docs/dcp.md
    params = state["optim"]["param_groups"][0]["params"]
    assert isinstance(params, list) and params == osd["param_groups"][0]["params"]
    set_state_dict(m2, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
    want, got = opt.state_dict(), opt2.state_dict()
    # lr, betas, eps, weight_decay kept (betas a list: JSON has no tuples; torch.optim takes it)
    assert _tuples_as_lists(got["param_groups"]) == _tuples_as_lists(want["param_groups"])
    assert got["state"].keys() == want["state"].keys()
    for i, s in want["state"].items():
        for k, v in s.items():
            assert torch.equal(got["state"][i][k], v), (i, k)
    m2(torch.randn(4, 3)).sum().backward()
    opt2.step()  # KeyError: 'betas' when param_groups lost them

def _tuples_as_lists(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _tuples_as_lists(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_tuples_as_lists(x) for x in v]
    return v


# -- N1, N2: tensor rank bounded where a shape is first read; N3, N4: key hashing bounded --------


def _torch_zip(path: Path, pkl: bytes, storages: dict[str, bytes] | None = None) -> Path:
    """A ``torch.save`` zip of the given ``data.pkl`` (as torch lays it out)."""
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", b"little")
        z.writestr("archive/version", b"3\n")
        for k, v in (storages or {}).items():
            z.writestr(f"archive/data/{k}", v)
    return path


def _bin(x: str) -> bytes:
    import struct

    b = x.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def _shared_shape_pickle(n: int, rank: int) -> bytes:
    """``n`` float tensors of shape and stride ``(1,) * rank``, all one memoised tuple."""
    p = bytearray(b"\x80\x02")
    p += b"ctorch._utils\n_rebuild_tensor_v2\nq\x01"
    p += b"(" + _bin("storage") + b"ctorch\nFloatStorage\n" + _bin("0") + _bin("cpu") + b"K\x01tq\x02"
    p += b"(" + b"K\x01" * rank + b"tq\x03"
    p += b"ccollections\nOrderedDict\n)Rq\x04" + b"0" * 4
    p += b"}("
    for k in range(n):  # ~25 bytes a tensor, whatever its rank
        p += _bin(f"t{k}") + b"h\x01(h\x02QK\x00h\x03h\x03\x89h\x04tR"
    return bytes(p + b"u.")


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("n", "rank"), [(1, 65), (2000, 2000)])
def test_torch_tensor_of_too_many_dimensions_is_refused(tmp_path: Path, n: int, rank: int) -> None:
    src = _torch_zip(tmp_path / "rank.pt", _shared_shape_pickle(n, rank), {"0": b"\0\0\x80?"})
    with pytest.raises(CheckpointError) as ei:  # rank 65 was "internal error (ValueError ...)"
        convert(src, tmp_path / "out")
    assert ei.value.code == "PCK-LIMIT"
    msg = str(ei.value)
    assert str(src) in msg and "'t0'" in msg and f"{rank:,} dimensions" in msg and "64" in msg
    assert not (tmp_path / "out").exists()
    ok = _torch_zip(tmp_path / "ok.pt", _shared_shape_pickle(2, 64), {"0": b"\0\0\x80?"})
    convert(ok, tmp_path / "ok")  # the format's limit itself converts
    assert portable_ckpt.open(str(tmp_path / "ok")).tensors["t1"].shape == (1,) * 64


def _rank_metadata(d: Path, n: int, rank: int) -> Path:
    """A DCP .metadata of ``n`` tensors sharing one shape, chunk and offsets of ``rank`` dims."""
    import pickle

    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    ones, zeros = torch.Size([1] * rank), torch.Size([0] * rank)
    chunk = ChunkStorageMetadata(offsets=zeros, sizes=ones)
    info = _StorageInfo("__0_0.distcp", 0, 1000)
    props = TensorProperties(dtype=torch.float32)
    sdm, sd = {}, {}
    for k in range(n):
        sdm[f"t{k}"] = TensorStorageMetadata(properties=props, size=ones, chunks=[chunk])
        idx = MetadataIndex(f"t{k}", zeros, 0)
        object.__setattr__(idx, "offset", zeros)  # the shared tuple, not a copy
        sd[idx] = info
    d.mkdir()
    (d / ".metadata").write_bytes(pickle.dumps(Metadata(state_dict_metadata=sdm, storage_data=sd)))
    (d / "__0_0.distcp").write_bytes(b"\0" * 1000)
    return d


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("n", "rank"), [(1, 65), (1000, 5000)])
def test_dcp_tensor_of_too_many_dimensions_is_refused(tmp_path: Path, n: int, rank: int) -> None:
    src = _rank_metadata(tmp_path / "src", n, rank)
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True)
    assert ei.value.code == "PCK-LIMIT"
    msg = str(ei.value)
    assert str(src / ".metadata") in msg and "'t0'" in msg and f"{rank:,} dimensions" in msg
    assert len(msg) < 1000  # not the offsets listed


def test_dcp_genuine_metadata_rank_65_is_refused(tmp_path: Path) -> None:
    from test_dcp import _rewrite_metadata, _single_rank_dcp

    src = _single_rank_dcp(tmp_path / "src")

    def widen(md: Any) -> None:
        t = md.state_dict_metadata["model.a"]
        t.size = torch.Size([8] + [1] * 64)
        for ch in t.chunks:
            ch.offsets, ch.sizes = torch.Size([0] * 65), torch.Size([8] + [1] * 64)

    _rewrite_metadata(src, widen)
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True)
    assert ei.value.code == "PCK-LIMIT" and "model.a" in str(ei.value)
    assert str(src / ".metadata") in str(ei.value)


@pytest.mark.timeout(30)
def test_a_metadata_index_of_long_offsets_used_as_many_keys_is_cheap(tmp_path: Path) -> None:
    # One MetadataIndex of 100 000 offsets used as a dict key 100 000 times (3 bytes a use):
    # each use hashed all the offsets, 58 s for this 500 KB .metadata
    def u(x: str) -> bytes:
        b = x.encode()
        return b"\x8c" + bytes([len(b)]) + b

    m = n = 100_000
    p = b"\x80\x04" + u("torch.distributed.checkpoint.metadata") + u("MetadataIndex") + b"\x93)\x81"
    p += b"}(" + u("fqn") + u("a") + u("offset") + b"(" + b"K\x00" * n + b"t" + u("index") + b"K\x00u"
    p += b"b\x94" + b"0" + b"}(" + b"h\x00N" * m + b"u."
    src = tmp_path / "src"
    src.mkdir()
    (src / ".metadata").write_bytes(p)
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True)
    assert str(src / ".metadata") in str(ei.value)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("digits_bytes", "refs"), [(200_000, 1), (2_000, 20)])
def test_a_big_int_key_is_charged_by_its_size(tmp_path: Path, digits_bytes: int, refs: int) -> None:
    import struct

    # one big int (LONG4), a tuple of `refs` references to it, that tuple a dict key 8 times:
    # hash() of an int is not cached and reads every digit each time
    p = b"\x80\x04\x8b" + struct.pack("<i", digits_bytes) + b"\x01" * digits_bytes + b"\x94" + b"0"
    p += b"(" + b"h\x00" * refs + b"t\x94" + b"0" + b"}(" + b"h\x01N" * 8 + b"u."
    src = _torch_zip(tmp_path / "bigkey.pt", p)
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out")
    assert ei.value.code == "PCK-SHARD-HEADER" and str(src) in str(ei.value)
    assert "hash" in str(ei.value)


def test_int_keys_of_a_legitimate_size_still_convert(tmp_path: Path) -> None:
    src = tmp_path / "ok.pt"
    torch.save({"w": torch.ones(2), "ids": {2**100: "a", 7: "b"}, "pairs": {(2**70, 1): 1}}, src)
    report = convert(src, tmp_path / "out", drop_unsupported=True)
    ck = portable_ckpt.open(str(tmp_path / "out"))
    assert ck.entry("torch.values")["ids/" + str(2**100)] == "a"
    assert [w for w in report.warnings if "tuple" in w.message]  # tuple keys: dropped, as asked


# -- N5: byte items on one byte range -----------------------------------------------------------


def _count_byte_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    from portable_ckpt.convert import dcp as dcp_mod

    calls: list[int] = []
    real = dcp_mod.decode_byte_item

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(dcp_mod, "decode_byte_item", counting)
    return calls


@pytest.mark.parametrize("keys", ["mapped", "verbatim"])
@pytest.mark.parametrize("with_tensor", [False, True])
def test_byte_items_sharing_one_range_are_refused_before_decoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keys: str, with_tensor: bool
) -> None:
    import pickle

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import MetadataIndex

    src = tmp_path / "src"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.ones(2), "blob": list(range(1000))}, checkpoint_id=str(src))
    ok = convert(src, tmp_path / "ok", trust_pickle=True, keys=keys)  # genuine: converts
    assert not ok.warnings
    md = pickle.loads((src / ".metadata").read_bytes())
    info = next(v for k, v in md.storage_data.items() if k.fqn == "blob")
    for i in range(150):  # 150 items on the one range: 150 decoded JSON copies were written
        md.state_dict_metadata[f"blob{i}"] = md.state_dict_metadata["blob"]
        md.storage_data[MetadataIndex(f"blob{i}")] = info
    if with_tensor:  # a byte item on a tensor chunk's range: each would be parsed again
        md.state_dict_metadata = {k: v for k, v in md.state_dict_metadata.items() if k == "w"}
        md.state_dict_metadata["blob"] = next(
            v for k, v in pickle.loads((src / ".metadata").read_bytes()).state_dict_metadata.items()
            if k == "blob"
        )
        w = next(v for k, v in md.storage_data.items() if k.fqn == "w")
        md.storage_data = {k: (w if k.fqn == "blob" else v) for k, v in md.storage_data.items() if k.fqn in ("w", "blob")}
    md.planner_data = {k: (k,) for k in md.state_dict_metadata}
    (src / ".metadata").write_bytes(pickle.dumps(md))
    decodes = _count_byte_decodes(monkeypatch)
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True, keys=keys)
    assert ei.value.code == "PCK-SHARD-HEADER" and "the same bytes" in str(ei.value)
    assert str(src / ".metadata") in str(ei.value) and "blob" in str(ei.value)
    assert decodes == []  # refused from .metadata alone
    assert not (tmp_path / "out").exists()


# -- N6, N11: the world size a DCP checkpoint was saved by ---------------------------------------


@pytest.fixture(scope="module")
def replicated_4(tmp_path_factory: Any) -> Path:
    """A genuine 4-rank gloo dcp.save of a replicated state: 3 items, so rank 3 has none."""
    import _dist_workers
    from conftest import run_ranks

    d = tmp_path_factory.mktemp("repl") / "ckpt"
    run_ranks(_dist_workers.save_replicated, 4, str(d))
    return d


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_a_rank_without_items_still_counts(replicated_4: Path, tmp_path: Path) -> None:
    import pickle

    md = pickle.loads((replicated_4 / ".metadata").read_bytes())
    used = {v.relative_path for v in md.storage_data.values()}
    # what DCP writes: every rank its file, rank 3's empty and unused by .metadata
    assert (replicated_4 / "__3_0.distcp").stat().st_size == 0 and "__3_0.distcp" not in used
    report = convert(replicated_4, tmp_path / "out", trust_pickle=True)
    cont = portable_ckpt.open(str(tmp_path / "out")).continuation
    assert (cont.contract, cont.world_size) == ("exact", 4)  # was exact for 3
    assert not report.warnings


def test_a_rank_whose_shard_is_empty_still_counts(tmp_path: Path) -> None:
    import _dist_workers
    from conftest import run_ranks

    src = tmp_path / "ckpt"
    run_ranks(_dist_workers.save_uneven, 4, str(src))
    # rank 3's file holds the zip of its zero-length chunk: named by .metadata, never read
    assert (src / "__3_0.distcp").stat().st_size > 0
    report = convert(src, tmp_path / "out", trust_pickle=True)
    cont = portable_ckpt.open(str(tmp_path / "out")).continuation
    assert (cont.contract, cont.world_size) == ("exact", 4) and not report.warnings


def test_a_file_of_bytes_no_item_uses_is_a_leftover(replicated_4: Path, tmp_path: Path) -> None:
    # a file with bytes that .metadata does not name is left by an older, larger save into the
    # same directory: it names no rank, and the world of ranks 0..3 stays exact (rev22 D5)
    src = _copy(replicated_4, tmp_path / "src")
    (src / "__4_0.distcp").write_bytes(b"left by an older save")
    report = convert(src, tmp_path / "out", trust_pickle=True, strict=True)
    cont = portable_ckpt.open(str(tmp_path / "out")).continuation
    assert (cont.contract, cont.world_size) == ("exact", 4)
    (w,) = report.warnings
    assert w.kind == "note" and "__4_0.distcp" in w.message and "older save" in w.message
    (src / "__4_0.distcp").write_bytes(b"")  # an empty file: a rank that had no items
    assert convert(src, tmp_path / "out5", trust_pickle=True).warnings == []
    cont = portable_ckpt.open(str(tmp_path / "out5")).continuation
    assert (cont.contract, cont.world_size) == ("exact", 5)


def test_a_save_again_by_fewer_ranks_is_exact_for_them(tmp_path: Path) -> None:
    import _dist_workers
    from conftest import run_ranks

    src = tmp_path / "ckpt"
    run_ranks(_dist_workers.save_uneven, 4, str(src))
    run_ranks(_dist_workers.save_uneven, 2, str(src))  # elastic shrink: __2_0, __3_0 stay behind
    assert all((src / f"__{r}_0.distcp").stat().st_size > 0 for r in range(4))
    report = convert(src, tmp_path / "out", trust_pickle=True, strict=True)
    ck = portable_ckpt.open(str(tmp_path / "out"))
    assert (ck.continuation.contract, ck.continuation.world_size) == ("exact", 2)
    (w,) = report.warnings
    assert w.kind == "note" and "__2_0.distcp (and 1 more)" in w.message
    assert report.tensors == 2


def test_a_zero_length_chunk_names_no_rank(tmp_path: Path) -> None:
    import copy

    from test_dcp import _rewrite_metadata, _single_rank_dcp
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    src = _single_rank_dcp(tmp_path / "src")

    def empty_chunk(md: Any) -> None:
        t = md.state_dict_metadata["model.a"]
        t.chunks = [*t.chunks, ChunkStorageMetadata(offsets=torch.Size([8]), sizes=torch.Size([0]))]
        info = copy.copy(next(v for k, v in md.storage_data.items() if k.fqn == "model.a"))
        info.relative_path = "__7_0.distcp"  # absent, never read
        md.storage_data[MetadataIndex("model.a", torch.Size([8]))] = info

    _rewrite_metadata(src, empty_chunk)
    report = convert(src, tmp_path / "out", trust_pickle=True)
    cont = portable_ckpt.open(str(tmp_path / "out")).continuation
    assert (cont.contract, cont.world_size) == ("exact", 1) and not report.warnings


# -- N7: a symlinked destination given with a trailing slash -----------------------------------


@pytest.mark.parametrize("fmt", ["hf", "dcp"])
def test_a_symlinked_destination_with_a_slash_is_refused_up_front(tmp_path: Path, fmt: str) -> None:
    import os

    src = tmp_path / "m.pt"
    torch.save({"w": torch.ones(2, 2)}, src)
    (tmp_path / "empty").mkdir()
    link = tmp_path / "emptylink"
    link.symlink_to(tmp_path / "empty")
    for dst in (str(link), str(link) + "/", str(link) + "//"):
        with pytest.raises(CheckpointError) as ei:  # was PCK-STORAGE after all the work
            convert(src, dst, dst_format=fmt)
        assert ei.value.code == "PCK-USAGE" and "symbolic link" in str(ei.value)
    assert os.path.islink(link) and os.listdir(tmp_path / "empty") == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "emptylink", "m.pt"]


# -- N8: collisions: advice that works, and keys inside one value -------------------------------


@pytest.mark.parametrize("keys", ["mapped", "verbatim"])
def test_colliding_keys_inside_a_value_are_refused(tmp_path: Path, keys: str) -> None:
    src = tmp_path / "v.pt"
    torch.save({"t": torch.ones(2), "v": {1: 5, "1": 6}}, src)  # became {'1': 6}, exit 0
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", keys=keys)
    assert ei.value.code == "PCK-UNSUPPORTED-VALUE"
    msg = str(ei.value)
    assert str(src) in msg and "'v'" in msg and "1 and '1'" in msg and "change one" in msg
    assert not (tmp_path / "out").exists()
    ok = tmp_path / "ok.pt"
    torch.save({"t": torch.ones(2), "v": {1: 5, "2": 6}}, ok)  # distinct keys still convert
    convert(ok, tmp_path / "ok", keys=keys)


def test_dcp_byte_item_with_colliding_keys_is_refused(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    src = tmp_path / "src"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.ones(2), "extra": ({1: 5, "1": 6},)}, checkpoint_id=str(src))
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True)
    assert ei.value.code == "PCK-UNSUPPORTED-VALUE" and "1 and '1'" in str(ei.value)
    assert "extra" in str(ei.value) and ".distcp" in str(ei.value)


@pytest.mark.parametrize(
    ("state", "other_mode"),
    [
        ({1: "t1", "1": "t2"}, False),
        ({"": "t1", "value": "t2"}, False),
        ({"a": {"b": "t1"}, "a.b": "t2"}, True),
    ],
)
def test_collision_advice_is_advice_that_works(tmp_path: Path, state: Any, other_mode: bool) -> None:
    tensors = {"t1": torch.ones(2), "t2": torch.zeros(2)}

    def fill(d: Any) -> Any:
        return {k: fill(v) if isinstance(v, dict) else tensors[v] for k, v in d.items()}

    src = tmp_path / "c.pt"
    torch.save(fill(state), src)
    worked = []
    for keys in ("mapped", "verbatim"):
        try:
            convert(src, tmp_path / keys, keys=keys)
            worked.append(keys)
        except CheckpointError as exc:
            # the source's content, as inside a value: not a usage error (rev22 D3)
            assert exc.code == "PCK-UNSUPPORTED-VALUE" and "rename one in the source" in str(exc)
            # the other mode is advised only where it converts
            assert ("--keys" in str(exc)) == other_mode
            assert ("--keys mapped" in str(exc)) == other_mode
    assert worked == (["mapped"] if other_mode else [])


# -- N10: Ctrl-C while torch.save writes the torch target ----------------------------------------


@pytest.mark.timeout(60)
def test_ctrl_c_while_the_torch_target_is_written_is_an_interrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    from portable_ckpt.convert import _torch_export

    src = tmp_path / "m.pt"
    torch.save({f"t{i}": torch.full((1 << 18,), float(i)) for i in range(8)}, src)  # 8 MiB
    real = _torch_export.open_staged

    class Interrupted:
        """The staged file; a real SIGINT arrives once 1 MiB is written (inside torch's writer)."""

        def __init__(self, f: Any) -> None:
            self.f, self.n = f, 0

        def write(self, b: Any) -> int:
            self.n += len(b)
            if self.n > 1 << 20 and self.n - len(b) <= 1 << 20:
                signal.raise_signal(signal.SIGINT)  # the handler raises in this callback
            return int(self.f.write(b))

        def __getattr__(self, name: str) -> Any:
            return getattr(self.f, name)

        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: Any) -> None:
            self.f.close()

    monkeypatch.setattr(_torch_export, "open_staged", lambda tmp: Interrupted(real(tmp)))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):  # was StorageError "a write fell short" (exit 75)
        convert(src, tmp_path / "out.pt", dst_format="torch")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]  # nothing left behind
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


_CLI_INTERRUPTED_AT_1MIB = """
import signal, sys
from portable_ckpt.cli.main import main
from portable_ckpt.convert import _torch_export

real = _torch_export.open_staged


class Interrupted:
    def __init__(self, f):
        self.f, self.n = f, 0

    def write(self, b):
        self.n += len(b)
        if self.n > 1 << 20 and self.n - len(b) <= 1 << 20:
            signal.raise_signal(signal.SIGINT)  # a real SIGINT, inside torch's writer
        return self.f.write(b)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


_torch_export.open_staged = lambda tmp: Interrupted(real(tmp))
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.timeout(120)
def test_the_cli_exits_130_for_a_ctrl_c_while_the_torch_target_is_written(tmp_path: Path) -> None:
    """rev22 D13: the CLI's side of the interrupt above, in its own process: exit 130 with the
    advice to run it again, no traceback, and nothing left in the target's directory."""
    import subprocess
    import sys

    src = tmp_path / "m.pt"
    torch.save({f"t{i}": torch.full((1 << 18,), float(i)) for i in range(8)}, src)  # 8 MiB
    out = subprocess.run(
        [sys.executable, "-c", _CLI_INTERRUPTED_AT_1MIB, "convert", str(src), str(tmp_path / "out.pt"),
         "--to", "torch"],
        capture_output=True, text=True, timeout=100, cwd=tmp_path,
    )
    assert out.returncode == 130, out.stderr
    # one line, no traceback
    assert out.stderr == "portable-ckpt: convert was interrupted before it finished; run it again to finish it\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]  # nothing left behind


def test_positions_in_any_order_is_a_json_tree_option() -> None:
    # rev22 D6: the DCP view took a list's positions in any order by copying JsonTree's private
    # trie; it is JsonTree's own option now, and only children 0..n-1 make a list
    from portable_ckpt.format.keys import JsonTree

    leaves = {"x/1": 5, "x/0": 6, "y/1": 1, "y/2": 2, "z/00": 1, "z/1": 2, "p/10": 0}
    leaves.update({f"p/{i}": i for i in range(10)})
    plain, any_order = JsonTree(leaves), JsonTree(leaves, positions_in_any_order=True)
    assert plain.value("x") == {"1": 5, "0": 6} and any_order.value("x") == [6, 5]
    assert plain.value("p") == {"10": 0, **{str(i): i for i in range(10)}}
    assert any_order.value("p") == [*range(10), 0]
    for tree in (plain, any_order):
        assert tree.value("y") == {"1": 1, "2": 2} and tree.value("z") == {"00": 1, "1": 2}


def test_a_dcp_checkpoint_in_the_safetensors_layout_is_named_not_called_damaged(tmp_path: Path) -> None:
    """DCP integrator review 23, 8: `FileSystemWriter(serialization_format=SAFETENSORS)` was
    refused as a damaged `.metadata` to re-copy. It is a layout convert does not read."""
    import os
    import shutil
    import threading

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import SerializationFormat

    for name, state in [("two", {"a": torch.arange(4.0), "b": torch.arange(6)}),
                        ("one", {"a": torch.arange(4.0)})]:  # items overlap / one item, no zip
        src = tmp_path / name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(state, no_dist=True, storage_writer=FileSystemWriter(
                str(src), serialization_format=SerializationFormat.SAFETENSORS))
        with pytest.raises(CheckpointError) as ei:
            convert(src, tmp_path / f"out_{name}", trust_pickle=True)
        assert ei.value.code == "PCK-UNSUPPORTED-VALUE", str(ei.value)
        assert "serialization_format=SAFETENSORS" in str(ei.value) and "damaged" not in str(ei.value)
        assert not (tmp_path / f"out_{name}").exists()
    # rev23 maintainer review 2: the layout check opened the file plainly; a FIFO in its place
    # hung the conversion. It is opened as every source file is (a FIFO refused at once).
    fifo = tmp_path / "fifo"
    shutil.copytree(tmp_path / "two", fifo)
    (data,) = fifo.glob("*.distcp")
    data.unlink()
    os.mkfifo(data)
    done: list[BaseException] = []

    def run() -> None:
        try:
            convert(fifo, tmp_path / "out_fifo", trust_pickle=True)
        except BaseException as exc:
            done.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():  # unblock the reader so the thread ends, then fail
        with open(data, "wb"):
            pass
        pytest.fail("convert waited on a FIFO in the source")
    assert done and isinstance(done[0], CheckpointError), done
