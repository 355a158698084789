"""The DCP storage layer in one process: real ``dcp.save``/``dcp.load`` (no process group), keys,
JSON items, refusals, checksums; and the key/JSON helpers as properties."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.distributed.checkpoint as dcp  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch.distributed.checkpoint.default_planner import (  # noqa: E402
    DefaultLoadPlanner,
    DefaultSavePlanner,
)

import portable_ckpt  # noqa: E402
import portable_ckpt.torch as pckt  # noqa: E402
from portable_ckpt.errors import CheckpointError, DistributedError, UnsupportedValueError  # noqa: E402
from portable_ckpt.format.keys import list_item_key  # noqa: E402
from portable_ckpt.torch._dcp_keys import (  # noqa: E402
    JsonTree,
    dcp_fqn,
    json_leaves,
    portable_key,
)
from portable_ckpt.torch.dcp import PortableStorageReader, PortableStorageWriter  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning")]


def job() -> dict[str, Any]:
    return {
        "model": {
            "fc.weight": torch.arange(12.0).reshape(3, 4),
            "fc.bias": torch.ones(3).bfloat16(),
        },
        "optim": {
            "state": {"fc.weight": {"step": torch.tensor(3.0), "exp_avg": torch.full((3, 4), 0.5)}},
            "param_groups": [
                {
                    "lr": 0.1,
                    "betas": (0.9, 0.999),
                    "params": ["fc.weight", "fc.bias"],
                    "foreach": None,
                    "max": float("inf"),
                }
            ],
        },
        "counts": torch.arange(5, dtype=torch.int64),
        "epoch": 4,
        "empty": [],
    }


def zeroed(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return torch.zeros_like(state)
    if isinstance(state, dict):
        return {k: zeroed(v) for k, v in state.items()}
    if isinstance(state, list):
        return [zeroed(v) for v in state]
    if isinstance(state, tuple):
        return tuple(zeroed(v) for v in state)
    return {int: 0, float: 0.0, str: "", bool: False}.get(type(state), state)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


def test_save_is_a_portable_version_and_loads_back(tmp_path: Any) -> None:
    root = str(tmp_path)
    writer = PortableStorageWriter(root, step=5)
    md = dcp.save(job(), storage_writer=writer)
    ck = portable_ckpt.open(root)
    assert ck.id == writer.attempt_id and ck.step == 5 and ck.continuation.contract == "exact"
    # what dcp.save returns names the version and where each item went, as FileSystemWriter's
    assert md.storage_meta is not None and md.storage_meta.save_id == ck.id
    assert portable_ckpt.open(md.storage_meta.checkpoint_id).id == ck.id
    assert md.storage_data is not None
    stored = {i.fqn: k for i, k in md.storage_data.items()}
    assert stored["optim.state.fc.weight.exp_avg"] == "optim/state/fc.weight/exp_avg"
    assert stored["optim.param_groups.0.betas"] == "optim/param_groups/0/betas"
    assert set(stored) == set(md.state_dict_metadata)
    assert sorted(ck.tensors) == [
        "counts",
        "model/fc.bias",
        "model/fc.weight",
        "optim/state/fc.weight/exp_avg",
        "optim/state/fc.weight/step",
    ]
    assert ck.tensors["model/fc.bias"].dtype == "bfloat16"
    assert all(f.checksum.blocks for f in ck.manifest.files.values() if f.size)
    values = ck.entry("torch.values")
    assert values["optim/param_groups/0/betas/1"] == 0.999 and values["empty"] == []
    assert values["optim/param_groups/0/max"] == {"__float__": "inf"}
    assert ck.verify(deep=True) == []
    target = zeroed(job())
    reader = PortableStorageReader(root)
    dcp.load(target, storage_reader=reader)
    assert same(target, job())  # tuples stay tuples, None and inf come back
    assert reader.checkpoint.id == ck.id and reader.stats.blocks_verified > 0


def test_cross_loading_with_portable_ckpt_torch(tmp_path: Any) -> None:
    """dcp.save -> portable_ckpt.torch.load and portable_ckpt.torch.save -> dcp.load, nested."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    state = job()
    del state["empty"]  # the key rule stores no leaf for an empty list (nothing to compare)
    dcp.save(state, storage_writer=PortableStorageWriter(a, step=1))
    target = zeroed(state)
    pckt.load(target, a)
    assert same(target, state)
    pckt.save(state, b, step=2)
    target = zeroed(state)
    dcp.load(target, storage_reader=PortableStorageReader(b))
    assert same(target, state)


def test_reset_root_steps_and_version_directories(tmp_path: Any) -> None:
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    dcp.save(
        {"w": torch.ones(2)},
        checkpoint_id=second,
        storage_writer=PortableStorageWriter(first, step=1),
    )
    dcp.save({"w": torch.full((2,), 2.0)}, storage_writer=PortableStorageWriter(second, step=2))
    assert not os.path.exists(first) or not portable_ckpt.list_versions(first)
    v1 = next(v for v in portable_ckpt.list_versions(second) if v.step == 1)
    for reader, want in (
        (PortableStorageReader(second), 2.0),
        (PortableStorageReader(second, step=1), 1.0),
        (PortableStorageReader(os.path.join(second, v1.id)), 1.0),
    ):
        target = {"w": torch.zeros(2)}
        dcp.load(target, storage_reader=reader)
        assert target["w"].tolist() == [want, want]


def test_a_save_into_a_version_directory_is_refused(tmp_path: Any) -> None:
    """Framework review 26, F1: a save given the version a save returned
    (``storage_meta.checkpoint_id``) nested a root inside it, said success, was read by no
    reader of the root and deleted by gc with the outer version. Refused, naming the root."""
    root = tmp_path / "root"
    md = dcp.save({"w": torch.ones(2)}, storage_writer=PortableStorageWriter(root, step=1))
    version = md.storage_meta.checkpoint_id
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for target in (version, os.path.join(version, "data")):
        with pytest.raises(CheckpointError, match="version directory") as info:
            dcp.save({"w": torch.full((2,), 2.0)}, checkpoint_id=target,
                     storage_writer=PortableStorageWriter(target, step=2))
        assert info.value.code == "PCK-USAGE" and f"Save into the root, {root}" in str(info.value)
    writer = PortableStorageWriter(root, step=3)
    with pytest.raises(CheckpointError, match="is a version directory"):
        writer.reset(version)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert [v.step for v in portable_ckpt.list_versions(root)] == [1]


def failure(e: BaseException) -> BaseException:
    """The first rank's exception inside DCP's CheckpointException."""
    failures = getattr(e, "failures", None)
    return next(iter(failures.values()))[0] if failures else e


@pytest.mark.parametrize(
    ("value", "why"),
    [(object(), "object"), (b"\x80pickle", "bytes"), ((torch.ones(2),), "tensor")],
)
def test_values_json_cannot_hold_are_refused(tmp_path: Any, value: Any, why: str) -> None:
    root = str(tmp_path)
    with pytest.raises(BaseException) as info:
        dcp.save(
            {"app": {"odd": value}, "w": torch.ones(3)},
            storage_writer=PortableStorageWriter(root, step=1),
        )
    err = failure(info.value)
    assert isinstance(err, UnsupportedValueError) and err.code == "PCK-UNSUPPORTED-VALUE"
    assert "'app.odd'" in str(err) and "'app/odd" in str(err) and why in str(err)
    assert not [v for v in portable_ckpt.list_versions(root) if v.status == "committed"]


def test_plan_caching_and_collective_free_saves_are_refused(tmp_path: Any) -> None:
    root = str(tmp_path)
    for kwargs in (
        {"planner": DefaultSavePlanner(enable_plan_caching=True)},
        {"use_collectives": False},
    ):
        with pytest.raises(BaseException) as info:
            dcp.save(
                {"w": torch.ones(2)}, storage_writer=PortableStorageWriter(root, step=1), **kwargs
            )
        assert getattr(failure(info.value), "code", None) == "PCK-USAGE", kwargs
    assert portable_ckpt.list_versions(root) == [] or all(
        v.status != "committed" for v in portable_ckpt.list_versions(root)
    )


def test_load_verifies_checksums_and_finds_versions(tmp_path: Any) -> None:
    root = str(tmp_path)
    with pytest.raises(BaseException) as info:
        dcp.load({"w": torch.zeros(4)}, storage_reader=PortableStorageReader(root))
    assert getattr(failure(info.value), "code", None) == "PCK-NOT-FOUND"
    dcp.save({"w": torch.arange(4096.0)}, storage_writer=PortableStorageWriter(root, step=1))
    ck = portable_ckpt.open(root)
    data = os.path.join(root, ck.id, next(p for p in ck.manifest.files if p.startswith("data/")))
    with open(data, "r+b") as f:
        f.seek(os.path.getsize(data) - 100)
        f.write(b"\xff")
    with pytest.raises(BaseException) as info:
        dcp.load({"w": torch.zeros(4096)}, storage_reader=PortableStorageReader(root))
    assert getattr(failure(info.value), "code", None) == "PCK-CHECKSUM"


def test_ranks_that_opened_different_versions_are_refused(tmp_path: Any) -> None:
    from torch.distributed.checkpoint.planner import LoadPlan

    reader = PortableStorageReader(str(tmp_path))
    with pytest.raises(DistributedError):
        reader.prepare_global_plan([LoadPlan([], storage_data="a"), LoadPlan([], storage_data="b")])
    plans = reader.prepare_global_plan([LoadPlan([], storage_data="a")] * 2)
    assert [p.storage_data for p in plans] == [{"id": "a", "world_size": 2}] * 2


def test_writer_and_reader_arguments() -> None:
    for bad in (
        {"step": -1},
        {"step": True},
        {"step": 1, "continuation": "x"},
        {"step": 1, "codec": "lz4"},
        {"step": 1, "block_size": 64},  # review 3, L1: refused at construction, not mid-save
        {"step": 1, "block_size": 3 << 12},
        {"step": 1, "block_size": True},
    ):
        with pytest.raises(CheckpointError):
            PortableStorageWriter("/tmp/x", **bad)
    with pytest.raises(CheckpointError):
        PortableStorageReader(42)  # type: ignore[arg-type]
    with pytest.raises(CheckpointError):
        PortableStorageReader("/tmp/x").stats  # noqa: B018 - nothing opened yet


# -- keys and JSON leaves --------------------------------------------------------------------------


def test_key_mapping_examples() -> None:
    assert portable_key(("model", "fc.weight")) == "model/fc.weight"
    assert portable_key(("optim", "param_groups", 0, "a/b~c")) == "optim/param_groups/0/a~1b~0c"
    assert dcp_fqn("optim/state/fc.weight/exp_avg") == "optim.state.fc.weight.exp_avg"
    assert dcp_fqn("a~1b") == "a/b"
    assert list_item_key("o/pg/0/betas/1") == "o/pg/0/betas"
    assert list_item_key("o/pg/0/lr") == "o/pg/0/lr"
    assert list_item_key("0/1") == "0"


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.text(max_size=5)
    | st.floats(allow_nan=False),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text("ab/~.", max_size=4) | st.integers(10, 19), inner, max_size=3)
    ),
    max_leaves=12,
)


@given(json_values)
def test_json_leaves_rebuild_in_the_shape_of_the_target(value: Any) -> None:
    """Splitting a value into leaves and rebuilding it with the old value as template is exact."""
    leaves = json_leaves("app/x", value, fqn="app.x")
    assert all(k == "app/x" or k.startswith("app/x/") for k in leaves)
    tree = JsonTree(leaves)
    assert same_json(tree.value("app/x", value), value)


def same_json(a: Any, b: Any) -> bool:
    if isinstance(b, dict):
        return (
            isinstance(a, dict) and a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in b)
        )
    if isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same_json, a, b))
    return type(a) is type(b) and a == b


def scheduler() -> Any:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.5)
    return torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.25)


def test_lr_scheduler_cross_loads_both_ways(tmp_path: Any) -> None:
    """A scheduler saved by DCP (its state_dict as JSON leaves) restores through
    portable_ckpt.torch.load, and one saved as a pck:lr-scheduler/1 entry through dcp.load."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    sched = scheduler()
    for _ in range(3):
        sched.optimizer.step()
        sched.step()
    want = sched.state_dict()
    dcp.save({"sched": sched, "w": torch.ones(2)}, storage_writer=PortableStorageWriter(a, step=3))
    pckt.save({"sched": sched, "w": torch.ones(2)}, b, step=3)
    for load in (
        lambda st: pckt.load(st, a),
        lambda st: dcp.load(st, storage_reader=PortableStorageReader(b)),
    ):
        fresh = scheduler()
        load({"sched": fresh, "w": torch.zeros(2)})
        assert fresh.state_dict() == want


def test_zstd_and_tensor_table_versions_through_dcp(tmp_path: Any) -> None:
    """Writer options reach the ShardWriter: zstd chunks, a format 1.1 tensor table; both load."""
    root = str(tmp_path)
    state = job()
    dcp.save(
        state, storage_writer=PortableStorageWriter(root, step=1, codec="zstd", tensor_table=True)
    )
    ck = portable_ckpt.open(root)
    assert ck.manifest.format_version == "1.1" and ck.manifest.tensor_table is not None
    assert {r.codec for t in ck.tensors.values() for r in t.ranges} == {"zstd"}
    target = zeroed(job())
    dcp.load(target, storage_reader=PortableStorageReader(root))
    assert same(target, job())


def test_failed_commit_publishes_nothing_and_removes_its_files(tmp_path: Any) -> None:
    """The commit record cannot be created (ENOSPC): PCK-STORAGE, no version, no data left."""
    from portable_ckpt.storage import open_storage
    from portable_ckpt.storage.faults import FaultyStorage, parse_faults

    root = str(tmp_path)
    storage = FaultyStorage(open_storage(root, create=True), parse_faults("create:*:ENOSPC"))
    with pytest.raises(BaseException) as info:
        dcp.save(job(), storage_writer=PortableStorageWriter(storage, step=1))
    assert getattr(failure(info.value), "code", None) == "PCK-STORAGE"
    assert not [v for v in portable_ckpt.list_versions(root) if v.status == "committed"]
    left = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
    assert not [p for p in left if "/data/" in p or "/entries/" in p or "/index/" in p], left


def test_read_data_plans_all_items_together(tmp_path: Any) -> None:
    """One plan's items share blocks: each byte is read once, as portable_ckpt.torch.load does.

    Many small tensors in one shard (a state of biases and norms): the per-item reader read the
    whole checksum block around each of them; read_data plans them together per file.
    """
    root = str(tmp_path)
    state = {"model": {f"norm{i}.weight": torch.full((64,), float(i)) for i in range(200)}}
    dcp.save(state, storage_writer=PortableStorageWriter(root, step=1, block_size=64 << 10))
    target = zeroed(state)
    reader = PortableStorageReader(root)
    dcp.load(target, storage_reader=reader)
    assert same(target, state)
    data = sum(f.size for p, f in reader.checkpoint.manifest.files.items() if "data/" in p)
    assert reader.stats.bytes_read <= data  # item by item: 85 KB read, 10 blocks verified
    assert reader.stats.blocks_verified <= -(-data // (64 << 10))


class StagingPlanner(dcp.DefaultLoadPlanner):
    """A planner that resolves into fresh buffers and copies them into the state on commit."""

    def __init__(self) -> None:
        super().__init__()
        self.staged: dict[Any, torch.Tensor] = {}
        self.committed = 0

    def resolve_tensor(self, read_item: Any) -> torch.Tensor:
        dest = super().resolve_tensor(read_item)
        buf = torch.full_like(dest, -1.0)
        self.staged[read_item.dest_index] = buf
        return buf

    def commit_tensor(self, read_item: Any, tensor: torch.Tensor) -> None:
        assert tensor.data_ptr() == self.staged.pop(read_item.dest_index).data_ptr()
        super().resolve_tensor(read_item).copy_(tensor)
        self.committed += 1


def test_a_staging_planner_is_read_in_bounded_batches(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """resolve_tensor may allocate: items are resolved, read and committed batch by batch."""
    import portable_ckpt.torch.dcp_loading as pdcp

    root = str(tmp_path)
    state = {f"w{i}": torch.arange(1024.0) + i for i in range(6)}
    dcp.save(state, storage_writer=PortableStorageWriter(root, step=1))
    monkeypatch.setattr(pdcp, "ITEM_BATCH_BYTES", 2 * 4096)  # two tensors per batch
    peak: list[int] = []
    original = pdcp._TensorReads.flush

    def flush(self: Any) -> None:
        peak.append(len(planner.staged))
        original(self)

    monkeypatch.setattr(pdcp._TensorReads, "flush", flush)
    planner = StagingPlanner()
    target = zeroed(state)
    dcp.load(target, storage_reader=PortableStorageReader(root), planner=planner)
    assert same(target, state) and planner.committed == 6 and not planner.staged
    assert max(peak) == 2  # never more than one batch of staged buffers alive


class _Redact(DefaultSavePlanner):
    """A planner hook that changes a value before it is stored (returns the object itself)."""

    def transform_object(self, write_item: Any, object: Any) -> Any:
        if write_item.index.fqn == "meta.token":
            return "***"
        return super().transform_object(write_item, object)


class _RedactPickled(DefaultSavePlanner):
    """The same hook, handing the changed value on to DefaultSavePlanner's torch.save."""

    def transform_object(self, write_item: Any, object: Any) -> Any:
        if write_item.index.fqn == "meta.token":
            object = "***"
        return super().transform_object(write_item, object)


def test_a_planner_that_transforms_objects_is_honoured_or_refused(tmp_path: Any) -> None:
    """Review 3, W1: the live object used to be stored, silently dropping the planner's change."""
    state = {"w": torch.ones(2), "meta": {"token": "secret", "epoch": 3}}
    root = str(tmp_path / "a")
    dcp.save(state, storage_writer=PortableStorageWriter(root, step=1), planner=_Redact())
    values = portable_ckpt.open(root).entry("torch.values")
    assert "secret" not in str(values) and "***" in str(values)
    # Pickled bytes from the hook cannot be stored as JSON: refused, with the way out.
    other = str(tmp_path / "b")
    with pytest.raises(BaseException) as info:
        dcp.save(state, storage_writer=PortableStorageWriter(other, step=1), planner=_RedactPickled())
    err = failure(info.value)
    assert isinstance(err, UnsupportedValueError)
    assert "'meta.token'" in str(err) and "transform_object" in str(err)
    assert not [v for v in portable_ckpt.list_versions(other) if v.status == "committed"]


class _TorchLoadPlanner(DefaultLoadPlanner):
    """torch's documented pattern: a custom load_bytes that unpickles with torch.load."""

    def load_bytes(self, read_item: Any, value: Any) -> None:
        obj = torch.load(value, weights_only=False)
        self.original_state_dict[read_item.dest_index.fqn] = obj

    def set_up_planner(self, state_dict: Any, metadata: Any = None, is_coordinator: bool = False) -> None:
        self.original_state_dict = state_dict
        super().set_up_planner(state_dict, metadata, is_coordinator)


def test_a_load_bytes_that_expects_pickle_is_told_why(tmp_path: Any) -> None:
    """Review 3, B2: it used to fail with a bare "UnpicklingError: invalid load key"."""
    root = str(tmp_path)
    dcp.save({"w": torch.ones(2), "epoch": 5}, storage_writer=PortableStorageWriter(root, step=1))
    with pytest.raises(BaseException) as info:
        dcp.load({"w": torch.zeros(2), "epoch": 0}, storage_reader=PortableStorageReader(root),
                 planner=_TorchLoadPlanner())
    err = failure(info.value)
    assert isinstance(err, UnsupportedValueError)
    assert "'epoch'" in str(err) and "JSON" in str(err) and "decode_item" in str(err)


class _JsonLoadPlanner(DefaultLoadPlanner):
    """A custom load_bytes as the docs say to write one (DefaultLoadPlanner's, decoding JSON)."""

    def load_bytes(self, read_item: Any, value: Any) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        from portable_ckpt.torch.dcp import decode_item

        obj = decode_item(value)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def test_a_custom_load_bytes_gets_floats_that_are_not_finite(tmp_path: Any) -> None:
    """DCP integrator review 23, 1: the docs said to read byte items with json.load, which gives
    ReduceLROnPlateau's `best` of inf as {"__float__": "inf"}: the load passed and the first
    scheduler.step() raised TypeError. decode_item gives the float, as DCP's own storage does."""
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    root = str(tmp_path)
    state = {"sched": sched.state_dict(), "nan": float("nan"), "neg": float("-inf")}
    dcp.save(state, storage_writer=PortableStorageWriter(root, step=1))
    target = {"sched": {k: None for k in state["sched"]}, "nan": 0.0, "neg": 0.0}
    dcp.load(target, storage_reader=PortableStorageReader(root), planner=_JsonLoadPlanner())
    assert target["sched"]["best"] == float("inf") and target["neg"] == float("-inf")
    assert math.isnan(target["nan"])
    fresh = torch.optim.lr_scheduler.ReduceLROnPlateau(torch.optim.SGD(model.parameters(), lr=0.1))
    fresh.load_state_dict(target["sched"])
    fresh.step(1.0)  # raised TypeError with the tagged object
    assert fresh.best == 1.0


def test_a_tensor_in_an_unflattened_dict_names_the_planner_option(tmp_path: Any) -> None:
    """Review 3, B3: the message said "inside a tuple or a plain list" for a dict item."""
    with pytest.raises(BaseException) as info:
        dcp.save(
            {"model": {"w": torch.ones(2)}},
            storage_writer=PortableStorageWriter(str(tmp_path), step=1),
            planner=DefaultSavePlanner(flatten_state_dict=False),
        )
    err = failure(info.value)
    assert isinstance(err, UnsupportedValueError)
    assert "a tensor inside a dict" in str(err) and "flatten_state_dict=True" in str(err)


@pytest.mark.parametrize(
    ("state", "flatten", "fix"),
    [
        ({"model": {"w": torch.ones(2), "b": {"x": torch.ones(1)}}}, False, "DefaultSavePlanner()"),
        ({"m": {"a": [torch.ones(2), {"x": torch.ones(1)}]}}, False, "DefaultSavePlanner()"),
        ({"m": {"pair": (torch.ones(2), 3)}}, True, "make the tuple a list"),
    ],
)
def test_a_tensor_kept_inside_an_item_gets_one_message_and_its_one_fix(
    tmp_path: Any, state: dict[str, Any], flatten: bool, fix: str
) -> None:
    """DCP integrator review 26, 2: a tensor inside an item kept whole (flatten_state_dict=False,
    or a tuple) was refused with two messages joined: "... so that each tensor is an item of its
    own (Tensor) cannot be stored without pickle; ... Convert it (bytes to a base64 str ...)".
    Now one message naming the item, the key, and the fix for that case only."""
    with pytest.raises(BaseException) as info:
        dcp.save(
            state,
            storage_writer=PortableStorageWriter(str(tmp_path), step=1),
            planner=DefaultSavePlanner(flatten_state_dict=flatten),
        )
    err = failure(info.value)
    assert isinstance(err, UnsupportedValueError) and err.code == "PCK-UNSUPPORTED-VALUE"
    text = str(err)
    assert text.startswith("[PCK-UNSUPPORTED-VALUE] DCP item "), text
    assert fix in text, text
    assert "a tensor inside" in text and "cannot be stored" in text, text
    for other in ("base64", "without pickle", "state_dict()", "(Tensor)"):
        assert other not in text, text
    if flatten:
        assert "flatten_state_dict" not in text, text  # the tuple's fix, not the planner's
    else:
        assert "tuple" not in text, text  # the planner's fix, not the tuple's
    assert not [v for v in portable_ckpt.list_versions(str(tmp_path)) if v.status == "committed"]


def test_a_writer_saving_again_at_its_published_step_says_so_once(
    tmp_path: Any, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """DCP integrator review 26, 4: a PortableStorageWriter(root, step=10) kept across saves
    labelled every version step 10, silently. The second save at a step the writer already
    published says so once (a warning event on portable_ckpt.torch and a line on stderr),
    naming both fixes; a writer whose step is set before each save says nothing."""
    import logging

    root = str(tmp_path / "r")
    writer = PortableStorageWriter(root, step=10)
    caplog.set_level(logging.WARNING, logger="portable_ckpt.torch")
    dcp.save({"w": torch.ones(2)}, storage_writer=writer)
    assert not [r for r in caplog.records if r.name == "portable_ckpt.torch"]
    first = writer.attempt_id
    dcp.save({"w": torch.ones(2)}, storage_writer=writer)
    dcp.save({"w": torch.ones(2)}, storage_writer=writer)  # said once per writer
    said = [r for r in caplog.records if getattr(r, "pck_event", {}).get("event")
            == "save.writer_reused"]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    assert said[0].levelno == logging.WARNING
    assert said[0].pck_event["step"] == 10 and said[0].pck_event["previous"] == first
    msg = said[0].getMessage()
    assert first in msg and "new PortableStorageWriter(root, step=N)" in msg
    assert "writer.step = N" in msg
    err = capfd.readouterr().err
    assert err.count("saves again at step 10") == 1, err
    assert [v.step for v in portable_ckpt.list_versions(root)] == [10, 10, 10]
    # step set before each save, or a new writer per save: nothing to say
    caplog.clear()
    other = PortableStorageWriter(str(tmp_path / "s"), step=1)
    for step in (1, 2):
        other.step = step
        dcp.save({"w": torch.ones(2)}, storage_writer=other)
    for step in (3, 4):
        dcp.save({"w": torch.ones(2)},
                 storage_writer=PortableStorageWriter(str(tmp_path / "s"), step=step))
    assert not [r for r in caplog.records if r.name == "portable_ckpt.torch"]
    assert "saves again" not in capfd.readouterr().err
    assert sorted(v.step for v in portable_ckpt.list_versions(str(tmp_path / "s"))) == [1, 2, 3, 4]


# -- which leaves make one DCP item (torch.dcp_items) ----------------------------------------------


def _both(tmp_path: Any, state: dict[str, Any]) -> tuple[str, str]:
    """``state`` saved by DCP's FileSystemWriter and by PortableStorageWriter."""
    from torch.distributed.checkpoint import FileSystemWriter

    fs, pc = str(tmp_path / "fs"), str(tmp_path / "pc")
    dcp.save(state, storage_writer=FileSystemWriter(fs))
    dcp.save(state, storage_writer=PortableStorageWriter(pc, step=1))
    return fs, pc


def _outcome(target: dict[str, Any], reader: Any) -> Any:
    try:
        dcp.load(target, storage_reader=reader)
    except BaseException as e:  # DCP's CheckpointException wraps the planner's error
        return "Missing key in checkpoint state_dict: loader.workers" in str(e)
    return target["loader"]["workers"]


@pytest.mark.parametrize(
    "workers", [{"0": "w0", "1": "w1"}, {0: "w0", 1: "w1"}, ["w0", "w1"], ("w0", "w1")]
)
def test_a_dict_keyed_0_to_n_stays_a_dict(tmp_path: Any, workers: Any) -> None:
    """A dict with keys 0..n-1 is n items, a list one item, exactly as DCP's own storage says:
    a ``None`` target refuses the dict (it used to come back as a list) and takes the list."""
    from torch.distributed.checkpoint import FileSystemReader

    state = {"w": torch.ones(2), "loader": {"workers": workers}}
    fs, pc = _both(tmp_path, state)
    want = _outcome({"w": torch.zeros(2), "loader": {"workers": None}}, FileSystemReader(fs))
    got = _outcome({"w": torch.zeros(2), "loader": {"workers": None}}, PortableStorageReader(pc))
    assert want == (True if isinstance(workers, dict) else workers)
    assert got == (True if isinstance(workers, dict) else list(workers))  # JSON: tuples are lists
    # with the structure in the target, both give the same value back (int keys: DCP's own
    # load puts the values under str keys beside the target's int keys)
    want, got = zeroed(state), zeroed(state)
    dcp.load(want, storage_reader=FileSystemReader(fs))
    dcp.load(got, storage_reader=PortableStorageReader(pc))
    assert _plain(got) == _plain(want)
    assert same(got, state) == (not isinstance(next(iter(workers)), int))


def _rich_state(*, empty_list: bool = True) -> dict[str, Any]:
    state = job()
    state.update(
        {
            "loader": {"workers": {"0": "w0", "1": "w1"}, "ids": {3: 1, 4: 2}},
            "nested": [[1, 2], [3]],
            "mixed": [torch.arange(3.0), 7, {"a": 1}],
            "groups": [{"lr": 0.5, "params": [0, 1]}, {"lr": 0.25, "params": [] if empty_list else [2]}],
        }
    )
    if not empty_list:
        del state["empty"]  # portable_ckpt.torch.save stores no leaf for an empty list
    return state


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, torch.Tensor):
        return ("tensor", str(v.dtype), v.tolist())
    return v


def _template_free(reader: Any) -> dict[str, Any]:
    """What ``dcp_to_torch_save`` loads: the whole state rebuilt from the metadata alone."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    sd: dict[str, Any] = {}
    _load_state_dict(sd, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    assert sd, "the template-free load rebuilt nothing"
    return sd


def test_metadata_names_the_items_dcp_saved(tmp_path: Any) -> None:
    """Every item DCP's own storage lists, with the same object paths (list positions as ints),
    and no two that overlap; so DCP's template-free load rebuilds the same state."""
    from torch.distributed.checkpoint import FileSystemReader

    state = _rich_state()
    fs, pc = _both(tmp_path, state)
    want, got = FileSystemReader(fs).read_metadata(), PortableStorageReader(pc).read_metadata()
    assert set(got.state_dict_metadata) == set(want.state_dict_metadata)
    assert got.planner_data == want.planner_data
    assert _plain(_template_free(PortableStorageReader(pc))) == _plain(
        _template_free(FileSystemReader(fs))
    )
    # portable_ckpt.torch.save records the same items for the same state
    state = _rich_state(empty_list=False)
    fs, _ = _both(tmp_path / "2", state)
    pckt.save(state, tmp_path / "pt", step=1)
    want = FileSystemReader(fs).read_metadata()
    got = PortableStorageReader(str(tmp_path / "pt")).read_metadata()
    assert set(got.state_dict_metadata) == set(want.state_dict_metadata)
    assert got.planner_data == want.planner_data


def test_a_version_without_an_item_record_reads_lists_as_dcp_keeps_them(tmp_path: Any) -> None:
    """A version written before torch.dcp_items (or by a writer that does not record it): each
    trailing run of positions is one list item; no items overlap; template-free loads work."""
    leaves = {"hist/0": 1.0, "hist/1": 2.0, "pg/0/lr": 0.5, "pg/0/betas/0": 0.9, "m/1/0": 3,
              "mix/1": 7, "mix/2/0": 8}
    arrays = {"w": np.ones(2, np.float32), "mix/0": np.ones(1, np.float32)}
    portable_ckpt.save_arrays(tmp_path, arrays, step=1, entries={"torch.values": leaves})
    md = PortableStorageReader(str(tmp_path)).read_metadata()
    assert sorted(md.state_dict_metadata) == [  # a list holding a tensor: items by position
        "hist", "m", "mix.0", "mix.1", "mix.2", "pg.0.betas", "pg.0.lr", "w"
    ]
    sd = _template_free(PortableStorageReader(str(tmp_path)))
    # positions guessed as convert --to torch guesses them: keys 0..n-1 without a tensor below
    assert sd["hist"] == [1.0, 2.0] and sd["pg"][0]["betas"] == [0.9] and sd["m"] == {"1": [3]}
    assert sd["mix"]["1"] == 7 and sd["mix"]["2"] == [8]
    target = {"hist": (0.0, 0.0), "w": torch.zeros(2)}
    dcp.load(target, storage_reader=PortableStorageReader(str(tmp_path)))
    assert target["hist"] == (1.0, 2.0)


def test_a_hostile_item_record_names_no_overlapping_items(tmp_path: Any) -> None:
    """A record that names an item inside another, a missing key or a malformed path is not
    trusted beyond naming stored leaves: items stay disjoint, every leaf stays reachable."""
    leaves = {"a/0": 1, "a/1": 2, "b": 3, "c/x": 4}
    for record, want in [
        ([["a", 0], ["a", 1], ["a", 40]], ["a.0", "a.1", "b", "c.x", "w"]),  # a/40: no leaf
        ([["a"], ["a", 0], ["zzz"], ["c", "x"]], ["a", "b", "c.x", "w"]),
        ([["a", 1], ["a", "0"]], ["a", "b", "c.x", "w"]),  # list and dict at once: the list rule
        ([["a", 1]], ["a", "b", "c.x", "w"]),  # so is a leaf at a dict key of a list
        ([["w", 0]], ["a.0", "a.1", "b", "c.x", "w"]),  # names nothing: each leaf an item
        ([["b"], ["w"], ["a", 0, "q"]], ["a.0", "a.1", "b", "c.x", "w"]),
        ([["a", -1]], ["a", "b", "c.x", "w"]),  # malformed: the list rule
        ({"a": 1}, ["a", "b", "c.x", "w"]),
    ]:
        root = tmp_path / str(len(list(tmp_path.iterdir())))
        portable_ckpt.save_arrays(root, {"w": np.ones(2, np.float32)}, step=1,
                                  entries={"torch.values": leaves, "torch.dcp_items": record})
        md = PortableStorageReader(str(root)).read_metadata()
        assert sorted(md.state_dict_metadata) == want, record
        if record != [["a", 0], ["a", 1], ["a", 40]]:  # plain items at list positions: DCP
            # wants the list whole and says "Missing key", as for its own list of an empty dict
            _template_free(PortableStorageReader(str(root)))
    # a list longer than what is stored in it: DCP would allocate every position
    for record in ([["a", 10**12]], [["a", 0], ["a", 1], ["a", 40]]):
        root = tmp_path / str(len(list(tmp_path.iterdir())))
        big = {"a/0": 1, "a/1": 2, "a/40": 3, "a/1000000000000": 4}
        entries = {"torch.values": big, "torch.dcp_items": record}
        portable_ckpt.save_arrays(root, {"w": np.ones(2, np.float32)}, step=1, entries=entries)
        md = PortableStorageReader(str(root)).read_metadata()
        assert sorted(md.state_dict_metadata) == ["a", "w"], record  # the list rule instead
        assert md.planner_data["a"] == ("a",)
    # a record naming a place inside another entry's item; keys past the key rule's length
    deep = "/".join(["d"] * 8000)
    for record, want in [
        ([["cfg", "x", 0]], ["b", "cfg.x", "w"]),
        ([["cfg", "x", "0"]], ["b", "cfg.x", "w"]),
        ([["cfg"]], ["b", "cfg.x", "w"]),
        ([["d"] * 8000], ["b", "cfg.x", "w"]),
    ]:
        root = tmp_path / str(len(list(tmp_path.iterdir())))
        entries = {"torch.values": {"b": 1, deep: 2}, "cfg": {"x": [1, 2]}, "torch.dcp_items": record}
        portable_ckpt.save_arrays(root, {"w": np.ones(2, np.float32)}, step=1, entries=entries)
        md = PortableStorageReader(str(root)).read_metadata()
        assert sorted(md.state_dict_metadata) == want, record
        sd = _template_free(PortableStorageReader(str(root)))
        assert sd["cfg"] == {"x": [1, 2]} and sd["b"] == 1


json_documents = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text("xy", max_size=2),
    lambda inner: st.lists(inner, min_size=1, max_size=3)
    | st.dictionaries(st.text("ab", min_size=1, max_size=2) | st.integers(0, 3), inner,
                      min_size=1, max_size=3),
    max_leaves=10,
)


@given(json_documents)
def test_json_item_paths_are_dcps_traversal(value: Any) -> None:
    """The items of a JSON value are the ones torch's own traversal makes of it."""
    from torch.distributed.checkpoint._traverse import traverse_state_dict

    from portable_ckpt.format.keys import json_item_paths

    seen: list[tuple[Any, ...]] = []
    traverse_state_dict({"k": value}, lambda path, _: seen.append(tuple(path)))
    assert sorted(map(repr, json_item_paths(value, ("k",)))) == sorted(map(repr, seen))


json_states = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text("xy", max_size=2),
    lambda inner: st.lists(inner, max_size=3)
    | st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(st.text("ab", min_size=1, max_size=2) | st.integers(0, 3), inner,
                      max_size=3),
    max_leaves=10,
)


@given(st.dictionaries(st.text("ab", min_size=1, max_size=2), json_states, min_size=1,
                       max_size=3))
def test_torch_save_records_the_items_dcp_save_makes(state: dict[str, Any]) -> None:
    """For any state of JSON values (tuples and empty containers too), portable_ckpt.torch.save's
    items and paths are what DCP's default planner makes of the same state."""
    import tempfile

    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    planner = DefaultSavePlanner()
    planner.set_up_planner({"t": torch.ones(1), **state}, is_coordinator=True)
    want = {fqn: tuple(p) for fqn, p in planner.mappings.items()}
    with tempfile.TemporaryDirectory() as d:
        pckt.save({"t": torch.ones(1), **state}, d, step=1)
        got = PortableStorageReader(d).read_metadata().planner_data
    assert {f: tuple(p) for f, p in got.items()} == want


def test_empty_lists_and_tuples_are_the_items_dcp_makes(tmp_path: Any) -> None:
    """portable_ckpt.torch.save stores an empty list (an optimizer's empty param group) and keeps a
    tuple as one item, as DCP does: dcp.load and template-free loads see the saved state."""
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    opt = torch.optim.AdamW([{"params": [torch.nn.Parameter(torch.ones(2))]}, {"params": []}])
    for i, state in enumerate([
        {"w": torch.ones(1), "a": [[], 5], "e": []},
        {"w": torch.ones(1), "o": {"b": (1, {"x": 2}), "t": ()}},
        {"w": torch.ones(1), "optim": opt.state_dict()},
    ]):
        fs, pc = str(tmp_path / f"fs{i}"), str(tmp_path / f"pc{i}")
        dcp.save(state, storage_writer=FileSystemWriter(fs))
        pckt.save(state, pc, step=1)
        want = FileSystemReader(fs).read_metadata()
        got = PortableStorageReader(pc).read_metadata()
        assert set(got.state_dict_metadata) == set(want.state_dict_metadata)
        assert got.planner_data == want.planner_data
        assert _plain(_template_free(PortableStorageReader(pc))) == _plain(
            _template_free(FileSystemReader(fs))
        )
        for load in (
            lambda t: dcp.load(t, storage_reader=PortableStorageReader(pc)),  # noqa: B023
            lambda t: pckt.load(t, pc),  # noqa: B023
        ):
            target = zeroed(state)
            load(target)
            assert same(target, state)


def test_an_empty_list_a_version_did_not_store_keeps_the_target_value(tmp_path: Any) -> None:
    """Versions written before empty lists were stored load into a target that has one."""
    portable_ckpt.save_arrays(tmp_path, {"w": np.ones(2, np.float32)}, step=1,
                              entries={"torch.values": {"lr": 0.5}})
    target = {"w": torch.zeros(2), "lr": 0.0, "params": []}
    info = pckt.load(target, tmp_path)
    assert target["lr"] == 0.5 and target["params"] == [] and info.missing_keys == []


def test_a_value_key_over_the_key_limit_is_refused_before_the_commit(tmp_path: Any) -> None:
    """Re-check of the review: such a value was committed, then no reader took an item from it
    (dcp.load: "Missing key"); it is refused as portable_ckpt.torch.save refuses it."""
    name = "n/" * 520  # 1,040 characters once '/' is escaped inside the one component
    with pytest.raises(BaseException) as ei:  # DCP wraps it in its CheckpointException
        dcp.save({"w": torch.ones(2), name: 1}, storage_writer=PortableStorageWriter(
            str(tmp_path), step=1))
    assert "over the 1024 a key may have" in str(ei.value)
    assert portable_ckpt.list_versions(tmp_path) == []  # nothing committed


def test_a_tuple_subclass_template_is_rebuilt_as_itself() -> None:
    """Fidelity review F13: a namedtuple (or torch.Size) template gave a plain tuple back."""
    import collections

    from portable_ckpt.format.keys import JsonTree

    Point = collections.namedtuple("Point", "a b")
    tree = JsonTree({"p/0": 1, "p/1": 2.5, "q/0/0": 3, "q/0/1": 4, "s": [5, 6]})
    assert tree.value("p", Point(0, 0.0), item=True) == Point(1, 2.5)
    assert type(tree.value("p", Point(0, 0.0), item=True)) is Point
    got = tree.value("q", (Point(0, 0), ), item=True)
    assert got == (Point(3, 4),) and type(got[0]) is Point
    assert type(tree.value("s", Point(0, 0))) is Point  # a stored list in a leaf, too
    assert tree.value("p", (0, 0), item=True) == (1, 2.5)  # a plain tuple stays plain


def test_a_lossy_cast_through_dcp_load_is_refused_as_by_load(tmp_path: Any) -> None:
    """Attack review 4 A1: dcp.load with PortableStorageReader cast float64 1e5 to float16 inf
    (and 1e-10 to 0) without a word where pckt.load refuses; now both refuse, and an exact
    cast (float16 -> float32) passes through DCP."""
    d = str(tmp_path / "ck")
    w = torch.tensor([1e5, 1e-10, 2.0**40 + 1], dtype=torch.float64)
    pckt.save({"w": w, "h": torch.tensor([0.5, -2.0], dtype=torch.float16)}, d, step=1,
              continuation="statistical")
    sd = {"w": torch.zeros(3, dtype=torch.float16), "h": torch.zeros(2, dtype=torch.float16)}
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    with pytest.raises(CheckpointException, match=r"out of the target type's range") as e:
        dcp.load(sd, storage_reader=PortableStorageReader(d))
    assert "PCK-USAGE" in str(e.value)
    with pytest.raises(CheckpointError, match=r"out of the target type's range"):
        pckt.load({"w": torch.zeros(3, dtype=torch.float16)}, d)
    wide = {"w": torch.zeros(3, dtype=torch.float64), "h": torch.zeros(2, dtype=torch.float32)}
    dcp.load(wide, storage_reader=PortableStorageReader(d))
    assert torch.equal(wide["w"], w) and wide["h"].tolist() == [0.5, -2.0]


def test_list_room_at_its_edge() -> None:
    """mutation audit 22 A-69: each list may ask for its stored positions plus 16 beyond them
    without taking any of LIST_ROOM: an empty list whose largest position is LIST_ROOM + 15
    fits exactly, LIST_ROOM + 16 does not."""
    from portable_ckpt.format.keys import LIST_ROOM, list_room, lists_fit

    assert list_room(4, 4 + 4 + 16 - 1) == 0  # 4 stored, 20 positions beyond the last: free
    assert list_room(4, 4 + 4 + 16) == -1
    assert lists_fit([(0, LIST_ROOM + 15)])
    assert not lists_fit([(0, LIST_ROOM + 16)])


def test_json_leaves_nesting_limit_is_64_levels() -> None:
    """mutation audit 22 A-70: a value nested 64 levels deep is split into leaves; 65 levels
    is PCK-UNSUPPORTED-VALUE, 'nested more than 64 levels deep'."""
    def nested(depth: int) -> Any:
        v: Any = 1
        for _ in range(depth):
            v = {"a": v}
        return v

    assert json_leaves("k", nested(64), fqn="x") == {"k" + "/a" * 64: 1}
    with pytest.raises(UnsupportedValueError, match="nested more than 64 levels deep"):
        json_leaves("k", nested(65), fqn="x")


def test_a_dcp_directory_is_named_as_such_where_no_version_is_found(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """DCP integrator review 23, 4: the reader pointed at a stock DCP checkpoint said only "no
    committed version". It names the `.metadata` and the two ways on (FileSystemReader,
    convert), in the library, through DCP's reader and in `ls --latest`."""
    import warnings

    from portable_ckpt.cli.main import main

    root = str(tmp_path / "dcp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save({"w": torch.ones(2)}, checkpoint_id=root, no_dist=True)
    with pytest.raises(CheckpointError) as info:
        portable_ckpt.open(root)
    assert info.value.code == "PCK-NOT-FOUND" and "it holds .metadata" in str(info.value)
    assert "FileSystemReader" in str(info.value) and "portable-ckpt convert" in str(info.value)
    with pytest.raises(BaseException) as info2:
        dcp.load({"w": torch.zeros(2)}, storage_reader=PortableStorageReader(root), no_dist=True)
    assert "it holds .metadata" in str(failure(info2.value))
    assert main(["ls", root, "--latest"], restore_signals=True) == 1
    assert "it holds .metadata" in capsys.readouterr().err
    portable_ckpt.save_arrays(tmp_path / "empty", {"w": np.ones(1)}, step=1)
    for p in (tmp_path / "empty").iterdir():
        import shutil

        shutil.rmtree(p)
    with pytest.raises(CheckpointError) as info3:  # an empty root: no hint
        portable_ckpt.open(tmp_path / "empty")
    assert "it holds" not in str(info3.value)


def test_an_int_a_float_cannot_hold_is_not_rounded_into_a_float_target(tmp_path: Any) -> None:
    """DCP integrator review 23, 6: an int loaded where the target holds a float became a float
    (documented); above 2^53 that rounded it without a word (`2**70 + 1` → 1.18e21). Such an
    int stays the int it was saved as; one a float holds exactly still becomes a float."""
    big = 2**70 + 1
    state = {"w": torch.ones(2), "big": big, "small": 3, "huge": 10**300}
    root = str(tmp_path / "dcp")
    dcp.save(state, storage_writer=PortableStorageWriter(root, step=1), no_dist=True)
    target = {"w": torch.zeros(2), "big": 0.0, "small": 0.0, "huge": 0.0}
    dcp.load(target, storage_reader=PortableStorageReader(root), no_dist=True)
    assert target["big"] == big and type(target["big"]) is int
    assert target["small"] == 3.0 and type(target["small"]) is float
    assert target["huge"] == 10**300 and type(target["huge"]) is int
    pckt.save(state, tmp_path / "pk", step=1)  # the same through portable_ckpt.torch.load
    again = {"w": torch.zeros(2), "big": 0.0, "small": 0.0, "huge": 0.0}
    pckt.load(again, tmp_path / "pk")
    assert again["big"] == big and type(again["small"]) is float and again["huge"] == 10**300


def test_a_writer_on_a_storage_object_travels_to_another_process_or_says_why_not(tmp_path: Any) -> None:
    """DCP integrator review 23, 10: process-mode async_save with a Storage object as the root
    failed with "cannot pickle '_thread.lock' object". A backend that says how another process
    opens it (local, S3) travels as that; any other is refused naming the way out."""
    import pickle

    from portable_ckpt.errors import UsageError
    from portable_ckpt.storage import open_storage
    from portable_ckpt.storage.faults import FaultyStorage

    local = open_storage(str(tmp_path / "r"), create=True)
    back = pickle.loads(pickle.dumps(PortableStorageWriter(local, step=3)))
    assert back.root.url == local.url and back.step == 3
    dcp.save({"w": torch.ones(2)}, storage_writer=back, no_dist=True)
    assert portable_ckpt.open(tmp_path / "r").step == 3
    with pytest.raises(UsageError, match=r"cannot be sent to another process.*path or an s3:// URL"):
        pickle.dumps(PortableStorageWriter(FaultyStorage(local), step=3))
