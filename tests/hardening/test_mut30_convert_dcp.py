"""Mutation audit 30 (conversion layer), how a DCP ``.metadata`` maps onto the version.

Sources are genuine one-process ``dcp.save`` checkpoints whose ``.metadata`` is rewritten with
torch's own pickle where a test says so (``tests/convert/test_dcp.py`` helpers).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import portable_ckpt  # noqa: E402
from portable_ckpt.convert import convert  # noqa: E402
from portable_ckpt.errors import CheckpointError  # noqa: E402

# test_dcp imports its neighbours by bare name, as tests/convert/conftest.py arranges there
sys.path.insert(0, str(Path(__file__).parents[1] / "convert"))
from tests.convert.test_dcp import _rewrite_metadata, _single_rank_dcp  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning")]


def _storage(md: Any, fqn: str) -> Any:
    return next(v for k, v in md.storage_data.items() if k.fqn == fqn)


def test_items_that_share_one_byte_are_refused(tmp_path: Path) -> None:
    """``FileSystemWriter`` stores each item in bytes of its own: an item that starts on the
    last byte of another overlaps it (mutant D05 let a one-byte overlap through)."""
    src = _single_rank_dcp(tmp_path / "src")

    def touch(md: Any) -> None:
        a, b = _storage(md, "model.a"), _storage(md, "model.b")
        b.relative_path, b.offset = a.relative_path, a.offset + a.length - 1

    _rewrite_metadata(src, touch)
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True)
    assert ei.value.code == "PCK-SHARD-HEADER" and "overlap" in str(ei.value)
    assert "model.a" in str(ei.value) and "model.b" in str(ei.value)
    assert not (tmp_path / "out").exists()


def test_a_planner_path_that_is_not_its_items_fqn_is_ignored(tmp_path: Path) -> None:
    """``planner_data`` gives an item's key only where its path joins to the item's FQN
    (DCP's own rule): a path naming another place keeps the FQN as the key (mutant M22 took
    the path, and ``model.a`` came out under the key the file chose)."""
    src = _single_rank_dcp(tmp_path / "src")

    def elsewhere(md: Any) -> None:
        md.planner_data["model.a"] = ("elsewhere", "w")

    _rewrite_metadata(src, elsewhere)
    convert(src, tmp_path / "out", trust_pickle=True)
    ck = portable_ckpt.open(tmp_path / "out")
    assert "model.a" in ck.tensors and "model/b" in ck.tensors
    assert not any(k.startswith("elsewhere") for k in ck.tensors)
    assert ck.read("model.a").tolist() == list(range(8))


def _drop_storage(fqn: str) -> Any:
    def drop(md: Any) -> None:
        del md.storage_data[next(k for k in md.storage_data if k.fqn == fqn)]

    return drop


@pytest.mark.parametrize(
    ("fqn", "says"),
    [
        ("model.a", "chunk at [0] has no storage record"),
        ("step", "byte item has no storage record"),
    ],
)
def test_an_item_without_a_storage_record_fails_the_conversion(
    tmp_path: Path, fqn: str, says: str
) -> None:
    """An item ``.metadata`` lists without saying where its bytes are cannot be converted: the
    conversion names it and writes nothing, and with ``drop_unsupported`` the rest converts
    without it (mutant D09 dropped the chunk alone and converted the tensor without it)."""
    src = _single_rank_dcp(tmp_path / "src")
    _rewrite_metadata(src, _drop_storage(fqn))
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True)
    assert ei.value.code == "PCK-UNSUPPORTED-VALUE" and says in str(ei.value)
    assert not (tmp_path / "out").exists()
    convert(src, tmp_path / "rest", trust_pickle=True, drop_unsupported=True)
    ck = portable_ckpt.open(tmp_path / "rest")
    kept = {"model.a": {"model/b"}, "step": {"model/a", "model/b"}}[fqn]
    assert set(ck.tensors) == kept


def _transforms(fqn: str) -> Any:
    def add(md: Any) -> None:
        for k, v in md.storage_data.items():
            if k.fqn == fqn:
                v.transform_descriptors = ["zstd"]

    return add


def test_a_chunk_stored_through_a_stream_transform_is_a_codec_error(tmp_path: Path) -> None:
    """DCP's stream transforms (compression of an item's bytes) are not read: a tensor chunk
    stored through one is PCK-CODEC naming the transform (mutant D10 parsed the transformed
    bytes as a zip)."""
    src = _single_rank_dcp(tmp_path / "src")
    _rewrite_metadata(src, _transforms("model.a"))
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True)
    assert ei.value.code == "PCK-CODEC" and "zstd" in str(ei.value) and "model.a" in str(ei.value)


def test_a_byte_item_stored_through_a_stream_transform_is_not_converted(tmp_path: Path) -> None:
    """A byte item stored through a transform is an item the conversion cannot read, said as
    such (mutant D21 decoded its bytes and called them no torch.save zip)."""
    src = _single_rank_dcp(tmp_path / "src")
    _rewrite_metadata(src, _transforms("step"))
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True)
    assert ei.value.code == "PCK-UNSUPPORTED-VALUE"
    assert "stream transforms ['zstd'] are not supported" in str(ei.value)


def test_a_byte_item_over_the_size_limit_is_not_decoded(tmp_path: Path) -> None:
    """A byte item of more than 64 MiB is not decoded into an entry; the reason names its
    size (mutant D15 read it, here a sparse file of zeros, and called it no zip)."""
    from portable_ckpt.convert.dcp import _MAX_BYTE_ITEM

    src = _single_rank_dcp(tmp_path / "src")
    with open(src / "__0_1.distcp", "wb") as f:
        f.truncate(_MAX_BYTE_ITEM + 1)

    def big(md: Any) -> None:
        info = _storage(md, "step")
        info.relative_path, info.offset, info.length = "__0_1.distcp", 0, _MAX_BYTE_ITEM + 1

    _rewrite_metadata(src, big)
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True)
    assert ei.value.code == "PCK-UNSUPPORTED-VALUE"
    assert f"byte item of {_MAX_BYTE_ITEM + 1} bytes is too large" in str(ei.value)


def test_a_verbatim_byte_item_whose_fqn_is_no_entry_name_is_not_converted(tmp_path: Path) -> None:
    """With verbatim keys a byte item becomes the entry of its FQN: one that is no entry name
    is refused as such (mutant D16 passed it on, and the entry write refused it later)."""
    import warnings

    import torch.distributed.checkpoint as dcp

    src = tmp_path / "src"
    with warnings.catch_warnings():  # a one-process save warns that no process group runs
        warnings.simplefilter("ignore")
        dcp.save(
            {"w": torch.ones(2), "bad name": 3},
            storage_writer=dcp.FileSystemWriter(str(src), single_file_per_rank=True),
        )
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True, keys="verbatim")
    assert ei.value.code == "PCK-UNSUPPORTED-VALUE"
    assert "'bad name'" in str(ei.value) and "not a valid entry name" in str(ei.value)


def test_a_byte_item_cut_short_by_the_end_of_its_file_is_a_size_error(tmp_path: Path) -> None:
    """A byte item whose bytes the file does not hold in full is damage (PCK-FILE-SIZE naming
    the file), not an item that is no torch.save zip, skipped (mutant Z33: its zip read short
    and the item was "not convertible")."""
    src = _single_rank_dcp(tmp_path / "src")
    import pickle

    md = pickle.loads((src / ".metadata").read_bytes())
    info = _storage(md, "step")
    raw = (src / info.relative_path).read_bytes()[info.offset : info.offset + info.length]
    (src / "__0_1.distcp").write_bytes(raw[:-10])  # the item's own bytes, the last 10 missing

    def cut(md: Any) -> None:
        s = _storage(md, "step")
        s.relative_path, s.offset = "__0_1.distcp", 0

    _rewrite_metadata(src, cut)
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True)
    assert ei.value.code == "PCK-FILE-SIZE" and "__0_1.distcp" in str(ei.value)


def test_an_allowed_class_in_the_place_of_another_is_refused_by_name() -> None:
    """Each record of ``.metadata`` must be of the class its place holds: a ``Metadata`` state
    pickled under another allowed class (``StorageMeta``) is no DCP metadata, refused naming
    the class found (mutant M03 read any class's state as the expected one)."""
    import _dcp_pickles as dp

    from portable_ckpt.convert._dcp_meta import parse_dcp_metadata

    tensors = {"w": ("float32", (2,), [((0,), (2,), "__0_0.distcp", 0, 100)])}
    good = dp.metadata(tensors)
    assert set(parse_dcp_metadata(dp.dumps(good), path="m").state_dict_metadata) == {"w"}
    renamed = dp.dumps(
        good, 4, {dp.Metadata: ("torch.distributed.checkpoint.metadata", "StorageMeta")}
    )
    with pytest.raises(CheckpointError) as ei:
        parse_dcp_metadata(renamed, path="m")
    assert ei.value.code == "PCK-SHARD-HEADER"
    assert "expected torch.distributed.checkpoint.metadata.Metadata" in str(ei.value)
    assert "StorageMeta" in str(ei.value)


class _PairsValue:
    """No mapping to DCP (a byte item of its own); pickled as ``OrderedDict(list of pairs)``."""

    def __reduce__(self) -> Any:
        import collections

        return (collections.OrderedDict, ([("lr", 0.5)],))


def test_a_byte_item_dict_built_from_constructor_arguments_is_not_emptied(tmp_path: Path) -> None:
    """A byte item whose dict holds its items as ``OrderedDict``'s constructor argument (not
    ``SETITEMS``) is not JSON data the reader knows: the conversion names it and writes
    nothing (mutant M05 read it as ``{}`` and converted the item empty)."""
    import warnings

    import torch.distributed.checkpoint as dcp

    src = tmp_path / "src"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(
            {"w": torch.ones(2), "sched": _PairsValue()},
            storage_writer=dcp.FileSystemWriter(str(src), single_file_per_rank=True),
        )
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True)
    assert ei.value.code == "PCK-UNSUPPORTED-VALUE" and "sched" in str(ei.value)
    assert "collections.OrderedDict" in str(ei.value)


def test_a_storage_offset_that_is_a_bool_is_refused(tmp_path: Path) -> None:
    """``True`` is an int to Python but no offset DCP writes: the .metadata is damaged (mutant
    M06 read it as byte 1 of the file)."""
    src = _single_rank_dcp(tmp_path / "src")

    def flag(md: Any) -> None:
        _storage(md, "model.a").offset = True

    _rewrite_metadata(src, flag)
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True)
    assert ei.value.code == "PCK-SHARD-HEADER" and "not an integer" in str(ei.value)
    assert "model.a" in str(ei.value)


def test_a_dtype_that_is_no_torch_attribute_is_a_damaged_metadata() -> None:
    """A tensor's dtype is ``torch.<name>``; another allowed global in its place is a damaged
    .metadata (PCK-SHARD-HEADER naming it), not a dtype the format lacks (mutant M09 read the
    name alone: PCK-DTYPE-UNSUPPORTED)."""
    import _dcp_pickles as dp

    from portable_ckpt.convert._dcp_meta import parse_dcp_metadata

    md = dp.metadata({"w": ("float32", (2,), [((0,), (2,), "__0_0.distcp", 0, 100)])})
    md.state_dict_metadata["w"].properties.dtype = dp._Named("collections", "OrderedDict")
    with pytest.raises(CheckpointError) as ei:
        parse_dcp_metadata(dp.dumps(md), path="m")
    assert ei.value.code == "PCK-SHARD-HEADER"
    assert "dtype is reference to collections.OrderedDict" in str(ei.value)


def test_transform_descriptors_that_are_not_strings_are_a_damaged_metadata(tmp_path: Path) -> None:
    """``transform_descriptors`` is a list of strings; anything else there is a damaged
    .metadata naming the item (mutant M14 took the values as transform names)."""
    src = _single_rank_dcp(tmp_path / "src")

    def odd(md: Any) -> None:
        _storage(md, "model.a").transform_descriptors = [1]

    _rewrite_metadata(src, odd)
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True)
    assert ei.value.code == "PCK-SHARD-HEADER" and "transform_descriptors" in str(ei.value)
    assert "model.a" in str(ei.value)


@pytest.mark.parametrize(
    "rel",
    ["{outside}/__0_0.distcp", "../outside/__0_0.distcp", "sub\\..\\__0_0.distcp"],
    ids=["absolute", "dot-dot", "backslash"],
)
def test_a_relative_path_that_leaves_the_source_is_refused(tmp_path: Path, rel: str) -> None:
    """``.metadata`` names each item's file below the checkpoint; an absolute path, a ``..``
    or a backslash (a Windows separator) is refused as unsafe, even where a copy of the real
    file lies there (mutant D03 took the backslash name for a missing file)."""
    import shutil

    src = _single_rank_dcp(tmp_path / "src")
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(src / "__0_0.distcp", outside / "__0_0.distcp")
    name = rel.format(outside=outside)

    def move(md: Any) -> None:
        _storage(md, "model.a").relative_path = name

    _rewrite_metadata(src, move)
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True)
    assert ei.value.code == "PCK-PATH-UNSAFE", str(ei.value)


def _as_float64(md: Any) -> None:
    md.state_dict_metadata["model.a"].properties.dtype = torch.float64


def _as_half_as_long(md: Any) -> None:
    t = md.state_dict_metadata["model.a"]
    t.size = torch.Size([4])
    t.chunks[0].sizes = torch.Size([4])


@pytest.mark.parametrize(
    ("change", "says"),
    [(_as_float64, "float64[8]"), (_as_half_as_long, "float32[4]")],
    ids=["dtype", "shape"],
)
def test_a_chunk_whose_zip_disagrees_with_the_metadata_is_refused(
    tmp_path: Path, change: Any, says: str
) -> None:
    """Each chunk's zip holds the dtype and shape ``.metadata`` gives it; a disagreement is
    PCK-SHARD-MISMATCH naming both (mutants D11, D12 converted the stored bytes under the
    metadata's dtype or shape)."""
    src = _single_rank_dcp(tmp_path / "src")
    _rewrite_metadata(src, change)
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True)
    assert ei.value.code == "PCK-SHARD-MISMATCH"
    assert f".metadata says {says}" in str(ei.value) and "model.a" in str(ei.value)


def test_a_byte_item_with_a_leaf_key_over_the_key_limit_is_not_converted(tmp_path: Path) -> None:
    """A byte item whose JSON leaves would get a key longer than the key rule allows is named
    as not convertible (mutant D13 stored the leaf under a key no reader maps back)."""
    import warnings

    import torch.distributed.checkpoint as dcp

    from portable_ckpt.format.keys import MAX_KEY

    src = tmp_path / "src"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(
            {"w": torch.ones(2), "meta": {"k" * MAX_KEY: 1}},
            storage_writer=dcp.FileSystemWriter(str(src), single_file_per_rank=True),
        )
    with pytest.raises(CheckpointError) as ei:
        convert(src, tmp_path / "out", trust_pickle=True)
    assert ei.value.code == "PCK-UNSUPPORTED-VALUE"
    assert f"a key over {MAX_KEY} characters" in str(ei.value)


def test_a_strict_read_raises_on_the_first_item_it_cannot_convert(tmp_path: Path) -> None:
    """``read_dcp_source(strict=True)`` raises on an item it would skip; without it the item is
    a warning of the plan (mutant D22 warned in both)."""
    import warnings

    import torch.distributed.checkpoint as dcp

    from portable_ckpt.convert.dcp import read_dcp_source

    src = tmp_path / "src"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(
            {"w": torch.ones(2), "odd": {1.5, 2.5}},
            storage_writer=dcp.FileSystemWriter(str(src), single_file_per_rank=True),
        )
    plan = read_dcp_source(str(src), trust_pickle=True)
    try:
        assert [w.item for w in plan.warnings if w.kind == "skipped"] == ["odd"]
    finally:
        plan.close()
    with pytest.raises(CheckpointError) as ei:
        read_dcp_source(str(src), trust_pickle=True, strict=True)
    assert ei.value.code == "PCK-UNSUPPORTED-VALUE" and "'odd'" in str(ei.value)
