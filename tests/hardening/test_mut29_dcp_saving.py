"""Mutation audit 29, the DCP storage writer's decisions (:mod:`portable_ckpt.torch.dcp_saving`).

The writer is called as ``dcp.save`` calls it (``set_up_storage_writer``, ``prepare_global_plan``,
``write_data``, ``finish``), so the decisions a one-process save never reaches are checked too:
what the coordinator tells every rank, what a rank that is not the coordinator hands back.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner  # noqa: E402
from torch.distributed.checkpoint.metadata import Metadata  # noqa: E402
from torch.distributed.checkpoint.planner import SavePlan, WriteItemType  # noqa: E402

import portable_ckpt  # noqa: E402
from portable_ckpt.errors import (  # noqa: E402
    CommitOutcomeUnknownError,
    StorageError,
    UnsupportedValueError,
    UsageError,
)
from portable_ckpt.format.keys import DCP_ITEMS_ENTRY, MAX_KEY, recorded_items  # noqa: E402
from portable_ckpt.io.tensor_table import TABLE_THRESHOLD  # noqa: E402
from portable_ckpt.storage import open_storage  # noqa: E402
from portable_ckpt.storage.faults import Fault, FaultyStorage  # noqa: E402
from portable_ckpt.torch.dcp import (  # noqa: E402
    PortableSavePlanner,
    PortableStorageReader,
    PortableStorageWriter,
)
from tests.dcp.test_dcp_hostile import _failure, _free  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning")]


def _planned(state: dict[str, Any]) -> tuple[DefaultSavePlanner, SavePlan]:
    """DCP's default planner set up on ``state`` and its local plan (one process)."""
    planner = DefaultSavePlanner()
    planner.set_up_planner(state, is_coordinator=True)
    return planner, planner.create_local_plan()


def test_the_coordinator_gives_every_rank_one_attempt_and_the_world_size(tmp_path: Path) -> None:
    """Each rank's plan carries the job's world size (mutant S9 said 1: a writer of a large job
    would size its tensor table for one rank) and the same fresh attempt id."""
    writer = PortableStorageWriter(str(tmp_path), step=5)
    plans = writer.prepare_global_plan([SavePlan([]), SavePlan([]), SavePlan([])])
    assert [p.storage_data["world_size"] for p in plans] == [3, 3, 3]
    assert len({p.storage_data["attempt_id"] for p in plans}) == 1


def test_one_rank_with_a_cached_plan_refuses_the_save(tmp_path: Path) -> None:
    """DCP's plan caching marks only the ranks whose plan did not change as unusable: one such
    rank is enough to refuse (mutant S8 refused only when every rank's plan was cached, and the
    other ranks then saved under an attempt id the cached rank never got)."""
    writer = PortableStorageWriter(str(tmp_path), step=1)
    with pytest.raises(UsageError, match="enable_plan_caching"):
        writer.prepare_global_plan([SavePlan([], usable=True), SavePlan([], usable=False)])


def test_tensor_tables_follow_the_records_of_the_whole_job(tmp_path: Path) -> None:
    """A rank sizes the job's range records as its own times the world size: two items on each
    of TABLE_THRESHOLD ranks is over the threshold, so its ranges go in a tensor table (mutant
    S13 counted the rank's own two)."""
    state = {"a": torch.arange(4.0), "b": torch.ones(3)}
    planner, plan = _planned(state)
    writer = PortableStorageWriter(str(tmp_path), step=1)
    writer.set_up_storage_writer(True, rank=0)
    (plan,) = writer.prepare_global_plan([plan])
    plan.storage_data["world_size"] = TABLE_THRESHOLD  # as the coordinator of such a job says
    results = writer.write_data(plan, planner).wait()
    writer.finish(Metadata(state_dict_metadata={}), [results])
    ck = portable_ckpt.open(str(tmp_path))
    assert ck.manifest.format_version == "1.1" and ck.manifest.tensor_table is not None
    assert torch.equal(torch.from_numpy(ck.read("a")), state["a"])


def test_a_rank_that_is_not_the_coordinator_finishes_its_own_writer(tmp_path: Path) -> None:
    """A rank other than the coordinator writes its index in ``write_data`` and hands it back in
    its result; it keeps no writer for ``finish`` (mutant S7 took every rank for the
    coordinator: no index came back and the commit would miss that rank's files)."""
    planner, plan = _planned({"w": torch.arange(6.0)})
    writer = PortableStorageWriter(str(tmp_path), step=1)
    writer.set_up_storage_writer(False, rank=1)
    (plan,) = writer.prepare_global_plan([plan])
    results = writer.write_data(plan, planner).wait()
    # each item's result says its bytes, as FileSystemWriter's do (mutant S43 said elements)
    assert [(r.index.fqn, r.size_in_bytes) for r in results[:-1]] == [("w", 24)]
    doc = results[-1].storage_data
    assert doc["writer"] == 1 and doc["index"] is not None
    assert writer._writer is None
    with pytest.raises(UsageError, match="write_data did not run on the coordinator"):
        writer.finish(Metadata(state_dict_metadata={}), [results])


def test_portable_save_planner_stores_tensors_and_json_objects(tmp_path: Path) -> None:
    """PortableSavePlanner turns only byte items into JSON (never ``torch.save``) and leaves
    tensors alone (mutant S5 turned the tensors into JSON and the objects into nothing)."""
    planner = PortableSavePlanner()
    planner.set_up_planner({"w": torch.ones(2), "epoch": {"n": 3, "best": float("inf")}},
                           is_coordinator=True)
    items = {i.index.fqn: i for i in planner.create_local_plan().items}
    assert items["epoch.n"].type == WriteItemType.BYTE_IO
    out = planner.transform_object(items["epoch.n"], 3)
    assert isinstance(out, io.BytesIO) and json.loads(out.getvalue()) == 3
    tensor = torch.ones(2)
    assert planner.transform_object(items["w"], tensor) is tensor
    root = str(tmp_path)
    state = {"w": torch.arange(4.0), "epoch": 7, "names": ["a", "b"]}
    dcp.save(state, storage_writer=PortableStorageWriter(root, step=1),
             planner=PortableSavePlanner(), no_dist=True)
    target = {"w": torch.zeros(4), "epoch": 0, "names": ["", ""]}
    dcp.load(target, storage_reader=PortableStorageReader(root), no_dist=True)
    assert torch.equal(target["w"], state["w"])
    assert target["epoch"] == 7 and target["names"] == ["a", "b"]


def test_the_coordinator_writes_its_tensors_in_write_data(tmp_path: Path) -> None:
    """The coordinator's data is on storage when ``write_data`` returns, as every other rank's:
    a tensor changed before ``finish`` (the next step's training, a staging buffer reused) does
    not reach the version (mutant S27 kept only references until ``finish``)."""
    state = {"w": torch.arange(6.0)}
    planner, plan = _planned(state)
    writer = PortableStorageWriter(str(tmp_path), step=1)
    writer.set_up_storage_writer(True, rank=0)
    (plan,) = writer.prepare_global_plan([plan])
    results = writer.write_data(plan, planner).wait()
    state["w"].fill_(-1.0)
    writer.finish(Metadata(state_dict_metadata={}), [results])
    got = portable_ckpt.open(str(tmp_path)).read("w")
    assert got.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_a_value_key_of_exactly_the_key_limit_is_saved(tmp_path: Path) -> None:
    """MAX_KEY characters is a key; one more is refused before the commit (mutant S26 let a key
    of MAX_KEY + 1 characters through, which no reader takes a DCP item from)."""
    ok, long = "k" * MAX_KEY, "k" * (MAX_KEY + 1)
    root = str(tmp_path / "ok")
    dcp.save({"w": torch.ones(1), ok: 1}, storage_writer=PortableStorageWriter(root, step=1),
             no_dist=True)
    assert portable_ckpt.open(root).entry("torch.values") == {ok: 1}
    with pytest.raises(BaseException) as ei:  # DCP wraps it in its CheckpointException
        dcp.save({"w": torch.ones(1), long: 1},
                 storage_writer=PortableStorageWriter(str(tmp_path / "long"), step=1),
                 no_dist=True)
    assert isinstance(_failure(ei.value), UnsupportedValueError)
    assert portable_ckpt.list_versions(tmp_path / "long") == []


def test_a_list_of_tensors_alone_is_recorded_as_a_list(tmp_path: Path) -> None:
    """A state whose only list holds tensors (no plain values) still records its items' object
    paths, so a template-free load rebuilds the list (mutant S30 wrote the record only with
    plain values: the keys alone made ``layers`` a dict ``{"0": ..., "1": ...}``)."""
    root = str(tmp_path)
    dcp.save({"layers": [torch.ones(2), torch.zeros(3)]},
             storage_writer=PortableStorageWriter(root, step=1), no_dist=True)
    ck = portable_ckpt.open(root)
    assert DCP_ITEMS_ENTRY in ck.entries and "torch.values" not in ck.entries
    assert recorded_items(ck) == {"layers/0": ("layers", 0), "layers/1": ("layers", 1)}
    layers = _free(PortableStorageReader(root))["layers"]
    assert isinstance(layers, list) and [t.tolist() for t in layers] == [[1.0, 1.0], [0.0] * 3]


def test_a_commit_of_unknown_outcome_keeps_the_coordinator_files(tmp_path: Path) -> None:
    """The commit record's create timed out with its request still in flight: the version may
    yet be committed, so ``finish`` keeps every file the save wrote (R-COMMIT-19; mutant S35
    aborted the coordinator's writer there, and its data went while the record could land)."""
    root = tmp_path / "root"
    fault = Fault(op="create", path="*/manifest.json",
                  raises=TimeoutError("read timed out; the request was sent"))
    storage = FaultyStorage(open_storage(str(root), create=True), [fault])
    with pytest.raises(BaseException) as ei:  # DCP wraps it in its CheckpointException
        dcp.save({"w": torch.ones(4), "epoch": 2}, storage_writer=PortableStorageWriter(
            storage, step=2), no_dist=True)
    assert isinstance(_failure(ei.value), CommitOutcomeUnknownError), ei.value
    assert fault.fired == 1
    [attempt] = [p for p in root.iterdir() if p.name.startswith("s000000000002-")]
    files = sorted(p.name.split("-")[0] for p in attempt.rglob("*") if p.is_file())
    # data, the writer index and the two JSON entries: all that commit would have named
    assert files == ["torch.dcp_items", "torch.values", "w00000", "w00000.json"], files


def test_a_failed_commit_removes_the_files_of_every_rank(tmp_path: Path) -> None:
    """The commit record cannot be created (ENOSPC) on a job of two ranks: the coordinator
    removes its own files and those the other rank's index lists (mutant S34 left rank 1's
    data and index behind)."""
    root = tmp_path / "root"
    fault = Fault(op="create", path="*/manifest.json", error="ENOSPC")
    storage = FaultyStorage(open_storage(str(root), create=True), [fault])
    coord, peer = (PortableStorageWriter(storage, step=1) for _ in range(2))
    coord.set_up_storage_writer(True, rank=0)
    peer.set_up_storage_writer(False, rank=1)
    (p0, plan0), (p1, plan1) = _planned({"w": torch.ones(3)}), _planned({"v": torch.zeros(2)})
    plan0, plan1 = coord.prepare_global_plan([plan0, plan1])
    results1 = peer.write_data(plan1, p1).wait()  # rank 1 finishes its writer here
    results0 = coord.write_data(plan0, p0).wait()
    assert [p.name for p in root.rglob("w00001*")], "rank 1 wrote its files"
    with pytest.raises(StorageError):
        coord.finish(Metadata(state_dict_metadata={}), [results0, results1])
    assert fault.fired == 1
    assert [p for p in root.rglob("*") if p.is_file()] == []
