"""Mutation audit 29, the DCP storage reader's decisions (:mod:`portable_ckpt.torch.dcp_loading`).

Versions are built by hand (``portable_ckpt.save_arrays``) or saved through DCP, then read as
``dcp.load`` reads them: the ``Metadata`` the reader shows DCP, the plans it checks across
ranks, the items it fills.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner  # noqa: E402
from torch.distributed.checkpoint.metadata import (  # noqa: E402
    BytesStorageMetadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem  # noqa: E402

import portable_ckpt  # noqa: E402
from portable_ckpt.errors import DistributedError, JsonInvalidError, UnsupportedValueError  # noqa: E402
from portable_ckpt.format.keys import MAX_KEY, dcp_items_value  # noqa: E402
from portable_ckpt.format.manifest import Continuation  # noqa: E402
from portable_ckpt.torch.dcp import (  # noqa: E402
    PortableLoadPlanner,
    PortableStorageReader,
    PortableStorageWriter,
)
from tests.dcp.test_dcp_hostile import _failure, _free  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning")]


def test_a_torch_values_entry_that_is_not_a_dict_names_no_items(tmp_path: Path) -> None:
    """``torch.values`` holds JSON leaves keyed by portable key; a version whose entry is a list
    gives DCP no items from it, and other entries still do (mutant L59 took the list for
    leaves and ``read_metadata`` failed)."""
    root = str(tmp_path)
    portable_ckpt.save_arrays(root, {"w": np.zeros(2, np.float32)}, step=1,
                              entries={"torch.values": [1, 2], "other": {"a": [1, 2]}})
    reader = PortableStorageReader(root)
    md = reader.read_metadata()
    reader.set_up_storage_reader(md, True)  # raises what read_metadata kept
    assert sorted(md.state_dict_metadata) == ["other.a", "w"]
    assert md.planner_data == {"w": ("w",), "other.a": ("other", "a")}


def test_a_value_key_over_the_key_limit_is_no_dcp_item(tmp_path: Path) -> None:
    """A leaf whose key is longer than MAX_KEY (no key rule makes it; a hand-made version can
    hold one) is no DCP item of its own, with an item record as without one: in
    ``torch.values`` it is dropped (mutant L62 showed it to DCP where the version records its
    items); in another entry it is dropped too (mutant L68 showed it there)."""
    long = "k" * (MAX_KEY + 1)
    cases = [({"torch.values": {long: 1, "a": 2}}, ["a", "w"]),
             ({"torch.values": {"a": 2}, "other": {long: 1, "b": 3}}, ["a", "other.b", "w"])]
    for i, (entries, items) in enumerate(cases):
        for name, record in [("rec", {"torch.dcp_items": dcp_items_value([])}), ("bare", {})]:
            root = str(tmp_path / f"{name}{i}")
            portable_ckpt.save_arrays(root, {"w": np.zeros(2, np.float32)}, step=1,
                                      entries={**entries, **record})
            md = PortableStorageReader(root).read_metadata()
            assert sorted(md.state_dict_metadata) == items, (name, i)


@pytest.mark.parametrize("planner", [PortableLoadPlanner, DefaultLoadPlanner])
def test_the_portable_planner_places_values_in_the_shape_of_the_target(
    tmp_path: Path, planner: type[DefaultLoadPlanner]
) -> None:
    """With PortableLoadPlanner as with DCP's default one, a byte item is rebuilt in the shape
    of the target's value and put in place (a tuple stays a tuple), not sent through JSON bytes
    and ``load_bytes`` (mutant L58: the tuple came back a list, JSON having no tuples)."""
    root = str(tmp_path)
    state = {"w": torch.arange(3.0), "betas": (0.9, 0.999), "best": float("inf")}
    dcp.save(state, storage_writer=PortableStorageWriter(root, step=1), no_dist=True)
    target = {"w": torch.zeros(3), "betas": (0.0, 0.0), "best": 0.0}
    dcp.load(target, storage_reader=PortableStorageReader(root), planner=planner(), no_dist=True)
    assert type(target["betas"]) is tuple and target["betas"] == (0.9, 0.999)
    assert target["best"] == float("inf") and torch.equal(target["w"], state["w"])


def test_a_tensor_keeps_its_dcp_name_from_a_value_of_the_same_name(tmp_path: Path) -> None:
    """The tensor ``a.b`` and the value ``a/b`` are both DCP's ``a.b``: the tensor keeps the
    name and loads, the value is no item (mutant L85 described ``a.b`` as a byte item, and
    ``dcp.load`` of the tensor failed)."""
    root = str(tmp_path)
    portable_ckpt.save_arrays(root, {"a.b": np.arange(2, dtype=np.float32)}, step=1,
                              entries={"torch.values": {"a/b": 1, "c": 2}})
    md = PortableStorageReader(root).read_metadata()
    assert isinstance(md.state_dict_metadata["a.b"], TensorStorageMetadata)
    assert isinstance(md.state_dict_metadata["c"], BytesStorageMetadata)
    target = {"a.b": torch.zeros(2), "c": 0}
    dcp.load(target, storage_reader=PortableStorageReader(root), no_dist=True)
    assert target["a.b"].tolist() == [0.0, 1.0] and target["c"] == 2


def test_a_template_free_load_reads_any_world_size(tmp_path: Path) -> None:
    """DCP's template-free load (``dcp_to_torch_save``) continues no training: a version an
    exact job of two ranks saved is read without ``allow_statistical`` (mutant L93 checked the
    contract there too: PCK-CONTRACT); a load into a state still checks it."""
    root = str(tmp_path)
    portable_ckpt.save_arrays(root, {"w": np.arange(3, dtype=np.float32)}, step=1,
                              continuation=Continuation("exact", 2))
    assert _free(PortableStorageReader(root))["w"].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(BaseException) as ei:
        dcp.load({"w": torch.zeros(3)}, storage_reader=PortableStorageReader(root), no_dist=True)
    assert getattr(_failure(ei.value), "code", None) == "PCK-CONTRACT"


class _OtherView(DefaultLoadPlanner):
    """A planner whose ``lookup_tensor`` disagrees with the tensors it reads into."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel = numel

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        return torch.zeros(read_item.lengths)  # the box, wherever lookup_tensor says

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        return torch.zeros(self.numel)


@pytest.mark.parametrize("numel", [5, 2])
def test_items_that_do_not_fill_their_destination_are_refused(tmp_path: Path, numel: int) -> None:
    """The read items of a destination fill exactly its elements: 3 of the 5 a planner's view
    says, or 3 of 2, is refused (mutant L95 counted nothing and the load passed half filled;
    L107 refused only the overfilled one)."""
    root = str(tmp_path)
    dcp.save({"w": torch.arange(3.0)}, storage_writer=PortableStorageWriter(root, step=1),
             no_dist=True)
    with pytest.raises(BaseException) as ei:
        dcp.load({"w": torch.zeros(3)}, storage_reader=PortableStorageReader(root),
                 planner=_OtherView(numel), no_dist=True)
    err = _failure(ei.value)
    assert isinstance(err, UnsupportedValueError), err
    assert f"fill 3 of its {numel} elements" in str(err)


def _opened(*docs: dict[str, object]) -> str:
    reader = PortableStorageReader("unused")
    with pytest.raises(DistributedError) as ei:
        reader.prepare_global_plan([LoadPlan([], storage_data=d) for d in docs])
    return str(ei.value)


def test_ranks_that_opened_different_versions_hear_what_differed() -> None:
    """What the coordinator tells ranks that opened different versions: the roots or steps
    they were given, or a save committed during the load (mutants L97, L98: two values were
    not "different"; L99: with no step given, it said to pass a version directory)."""
    plans = LoadPlan([], storage_data={"id": "v1", "root": "/r", "step": 3})
    reader = PortableStorageReader("unused")
    assert [p.storage_data for p in reader.prepare_global_plan([plans, plans, plans])] == [
        {"id": "v1", "world_size": 3}] * 3
    roots = _opened({"id": "v1", "root": "/a", "step": 1}, {"id": "v2", "root": "/b", "step": 1})
    assert "different roots (rank 0: '/a'; rank 1: '/b')" in roots and "steps" not in roots
    steps = _opened({"id": "v1", "root": "/a", "step": 1}, {"id": "v2", "root": "/a", "step": 2})
    assert "different steps (step= rank 0: 1; rank 1: 2)" in steps and "roots" not in steps
    moved = _opened({"id": "v1", "root": "/a", "step": None},
                    {"id": "v2", "root": "/a", "step": None})
    assert "no step, so a save committed a newer version during the load" in moved
    fixed = _opened({"id": "v1", "root": "/a", "step": 4}, {"id": "v2", "root": "/a", "step": 4})
    assert "same root and step 4" in fixed and "pass that version's directory" in fixed


def test_two_tensors_of_one_dcp_name_are_refused_by_name(tmp_path: Path) -> None:
    """The tensors ``a.b`` and ``a/b`` are both DCP's ``a.b``: loading it names both keys
    instead of reading one of them (mutant L84 read whichever came first)."""
    root = str(tmp_path)
    portable_ckpt.save_arrays(root, {"a.b": np.zeros(2, np.float32),
                                     "a/b": np.ones(2, np.float32)}, step=1)
    with pytest.raises(BaseException) as ei:
        dcp.load({"a.b": torch.zeros(2)}, storage_reader=PortableStorageReader(root),
                 no_dist=True)
    err = _failure(ei.value)
    assert isinstance(err, UnsupportedValueError), err
    assert "stands for several keys" in str(err) and "['a.b', 'a/b']" in str(err)


def test_each_rank_tells_the_coordinator_the_step_it_was_given(tmp_path: Path) -> None:
    """A rank's plan carries the version it opened and the root and step it was given, which
    the coordinator's message on mixed versions names (mutant L90 dropped the step)."""
    root = str(tmp_path)
    portable_ckpt.save_arrays(root, {"w": np.zeros(2, np.float32)}, step=3)
    reader = PortableStorageReader(root, step=3)
    reader.read_metadata()
    plan = reader.prepare_local_plan(LoadPlan([]))
    assert plan.storage_data == {"id": reader.checkpoint.id, "root": root, "step": 3}


def test_a_tensor_stored_in_several_chunks_loads_each_at_its_offset(tmp_path: Path) -> None:
    """DCP reads a chunk at offsets relative to the chunk (``storage_offsets``) from the chunk
    at ``storage_index.offset``: the reader adds the two (mutant L100 read every chunk's box
    from the start of the tensor, and rows 4-7 came back as rows 0-3)."""
    root = str(tmp_path)
    portable_ckpt.save_arrays(root, {"w": np.arange(16, dtype=np.float32).reshape(8, 2)},
                              step=1, tiles={"w": [4, 2]})
    md = PortableStorageReader(root).read_metadata()
    assert [list(c.offsets) for c in md.state_dict_metadata["w"].chunks] == [[0, 0], [4, 0]]
    target = {"w": torch.zeros(8, 2)}
    dcp.load(target, storage_reader=PortableStorageReader(root), no_dist=True)
    assert target["w"].flatten().tolist() == [float(i) for i in range(16)]


class _Refusing(DefaultLoadPlanner):
    """A custom ``load_bytes`` that refuses the item with a checkpoint error of its own."""

    def load_bytes(self, read_item: ReadItem, value: object) -> None:
        raise JsonInvalidError("the planner's own refusal")


def test_a_checkpoint_error_from_a_custom_load_bytes_is_raised_as_it_is(tmp_path: Path) -> None:
    """Only other exceptions of a custom ``load_bytes`` are explained as a planner expecting
    pickle; its checkpoint error keeps its class and code (mutant L110 wrapped it too)."""
    root = str(tmp_path)
    dcp.save({"w": torch.ones(1), "epoch": 3}, storage_writer=PortableStorageWriter(root, step=1),
             no_dist=True)
    with pytest.raises(BaseException) as ei:
        dcp.load({"w": torch.zeros(1), "epoch": 0}, storage_reader=PortableStorageReader(root),
                 planner=_Refusing(), no_dist=True)
    err = _failure(ei.value)
    assert type(err) is JsonInvalidError and str(err).endswith("the planner's own refusal"), err


def test_a_version_without_an_item_record_takes_positions_for_list_indices(
    tmp_path: Path,
) -> None:
    """Without ``torch.dcp_items``, a container whose children are ``0..n-1`` is a list: the
    object paths carry int positions, several children as one (mutant L76 kept them str, and
    DCP would rebuild a dict ``{"0": ..., "1": ...}``)."""
    root = str(tmp_path)
    portable_ckpt.save_arrays(root, {"w": np.zeros(2, np.float32)}, step=1, entries={
        "torch.values": {"g/0/lr": 1, "g/1/lr": 2, "g/1/m": 2, "h/0/x/0": 5}})
    assert PortableStorageReader(root).read_metadata().planner_data == {
        "w": ("w",), "g.0.lr": ("g", 0, "lr"), "g.1.lr": ("g", 1, "lr"),
        "g.1.m": ("g", 1, "m"), "h.0.x": ("h", 0, "x")}
