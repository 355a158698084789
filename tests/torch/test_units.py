"""Single-process tests of the torch adapter: box arithmetic, key rule, state helpers, save/load."""

from __future__ import annotations

import itertools
import math
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import portable_ckpt  # noqa: E402
import portable_ckpt.torch as pckt  # noqa: E402
from portable_ckpt.errors import CheckpointError, UnsupportedValueError, UsageError  # noqa: E402
from portable_ckpt.format.dtypes import DTYPES  # noqa: E402
from portable_ckpt.format.schemas import validate_entry_value  # noqa: E402
from portable_ckpt.ranges import Box, check_coverage  # noqa: E402
from portable_ckpt.storage.local import LocalStorage  # noqa: E402
from portable_ckpt.torch._tensors import numpy_view, torch_dtype  # noqa: E402
from portable_ckpt.torch.flatten import (  # noqa: E402
    decode_json,
    encode_json,
    escape_component,
    flatten_state,
    split_key,
    unflatten_keys,
)
from portable_ckpt.torch.layout import PlacementSpec, chunk_extent, shard_box, writes_region  # noqa: E402

pytestmark = pytest.mark.torch


# -- box arithmetic ----------------------------------------------------------------------------------

layouts = st.tuples(
    st.lists(st.integers(0, 9), min_size=0, max_size=3),
    st.lists(st.integers(1, 4), min_size=1, max_size=3),
).flatmap(
    lambda gm: st.tuples(
        st.just(gm[0]),
        st.just(gm[1]),
        st.lists(
            st.sampled_from(
                [PlacementSpec("replicate")]
                + [PlacementSpec("shard", d) for d in range(len(gm[0]))]
            ),
            min_size=len(gm[1]),
            max_size=len(gm[1]),
        ),
    )
)


@given(layouts)
def test_writers_cover_every_element_exactly_once(layout: Any) -> None:
    shape, mesh, placements = layout
    boxes = []
    for coord in itertools.product(*[range(n) for n in mesh]):
        offs, lens = shard_box(shape, mesh, coord, placements)
        if writes_region(coord, placements) and all(lens):
            boxes.append(Box(offs, lens))
    if math.prod(shape):
        check_coverage(tuple(shape), boxes, key="t")  # raises on a gap or an overlap
    else:
        assert boxes == []


@given(layouts)
def test_box_arithmetic_matches_torch(layout: Any) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    shape, mesh, placements = layout
    tp = [Shard(p.dim) if p.kind == "shard" else Replicate() for p in placements]
    for coord in itertools.product(*[range(n) for n in mesh]):
        local, offset = _compute_local_shape_and_global_offset(shape, mesh, list(coord), tp)
        offs, lens = shard_box(shape, mesh, coord, placements)
        assert tuple(local) == lens
        if all(lens):
            assert tuple(offset) == offs


def test_chunk_extent_like_torch_chunk() -> None:
    for length in range(0, 12):
        for parts in range(1, 7):
            chunks = torch.arange(length).chunk(parts)
            for i in range(parts):
                start, size = chunk_extent(length, parts, i)
                expect = chunks[i].tolist() if i < len(chunks) else []
                assert list(range(start, start + size)) == expect
                # torch.chunk gives fewer chunks than asked for when the length is short: the
                # missing ones are empty and start at the end of the dimension, never past it
                # (mutation audit 23)
                if not expect:
                    assert (start, size) == (length, 0), (length, parts, i)


def test_partial_spec_refused() -> None:
    with pytest.raises(UnsupportedValueError) as e:
        shard_box((4,), (2,), (0,), [PlacementSpec("partial")])
    assert e.value.code == "PCK-UNSUPPORTED-VALUE"


# -- key rule ----------------------------------------------------------------------------------------


@given(st.lists(st.text(min_size=0, max_size=6), min_size=1, max_size=4))
def test_key_rule_round_trips(parts: list[str]) -> None:
    key = "/".join(escape_component(p) for p in parts)
    assert split_key(key) == parts


def test_flatten_keys_nested_lists_objects() -> None:
    lin = torch.nn.Linear(2, 3)
    state = {
        "model": lin,
        "a/b": {"c~d": torch.zeros(1)},
        "l": [torch.ones(1), {"x": 1.5}],
        7: "seven",
    }
    flat = flatten_state(state)
    assert set(flat.tensors) == {"model/weight", "model/bias", "a~1b/c~0d", "l/0"}
    assert flat.values == {"l/1/x": 1.5, "7": "seven"}
    assert "model" in flat.objects
    nested = unflatten_keys({k: 0 for k in flat.tensors})
    assert set(flatten_state(nested).values) == set(flat.tensors)


def test_flatten_refuses_collisions_and_pickle_only_values() -> None:
    with pytest.raises(UnsupportedValueError):
        flatten_state({1: torch.zeros(1), "1": torch.zeros(1)})
    with pytest.raises(UnsupportedValueError) as e:
        flatten_state({"obj": object()})
    assert e.value.code == "PCK-UNSUPPORTED-VALUE"
    with pytest.raises(UnsupportedValueError):
        flatten_state({"bad\x01key": 1})


def test_json_encoding_of_special_floats() -> None:
    v = {"a": float("inf"), "b": [float("-inf"), 1.0, (2, 3)]}
    enc = encode_json(v)
    assert enc == {"a": {"__float__": "inf"}, "b": [{"__float__": "-inf"}, 1.0, [2, 3]]}
    dec = decode_json(enc)
    assert dec["a"] == math.inf and dec["b"][0] == -math.inf
    nan = decode_json(encode_json(float("nan")))
    assert math.isnan(nan)


# -- zero-copy views ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch_dtype(n) for n in DTYPES], ids=list(DTYPES))  # review D7
def test_numpy_view_is_zero_copy(dtype: Any) -> None:
    t = torch.zeros(4, 3).to(dtype)
    v = numpy_view(t)
    assert v.shape == (4, 3) and v.ctypes.data == t.data_ptr()
    tt = t.t()
    assert numpy_view(tt).ctypes.data == t.data_ptr()  # strided view, still no copy


# -- continuation-state helpers ----------------------------------------------------------------------


def test_rng_capture_restore_and_schema() -> None:
    value = pckt.capture_rng()
    validate_entry_value(value, {"id": "pck:rng/1"}, name="rng")
    a = (random.random(), np.random.rand(), torch.rand(2).tolist())
    pckt.restore_rng(value)
    assert (random.random(), np.random.rand(), torch.rand(2).tolist()) == a


def test_scheduler_scaler_data_values_match_schemas() -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.SequentialLR(
        opt,
        [
            torch.optim.lr_scheduler.LinearLR(opt, 0.5, total_iters=2),
            torch.optim.lr_scheduler.StepLR(opt, 2),
        ],
        milestones=[2],
    )
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)  # holds best=inf
    scaler = torch.amp.GradScaler("cpu")
    for e, sid in (
        (pckt.LRSchedulerState(sched), "pck:lr-scheduler/1"),
        (pckt.LRSchedulerState(plateau), "pck:lr-scheduler/1"),
        (pckt.GradScalerState(scaler), "pck:grad-scaler/1"),
        (pckt.DataPosition(1, 5, {"sampler_seed": 3}), "pck:data-position/1"),
    ):
        validate_entry_value(e.capture(), {"id": sid}, name="x")
    pl2 = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    pckt.LRSchedulerState(pl2).restore(pckt.LRSchedulerState(plateau).capture())
    assert pl2.best == math.inf


def _single_state(seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Linear(5, 2))
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 10)
    scaler = torch.amp.GradScaler("cpu", growth_interval=1)
    return {
        "model": m,
        "optim": opt,
        "sched": sched,
        "scaler": scaler,
        "rng": pckt.RNGState(),
        "data": pckt.DataPosition(),
        "extra": {"bf": torch.zeros(3, dtype=torch.bfloat16), "z": torch.tensor(0)},
    }


def _train(state: dict[str, Any], steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 4)
        loss = state["model"](torch.nn.functional.dropout(x, 0.2)).pow(2).mean()
        state["optim"].zero_grad()
        state["scaler"].scale(loss).backward()
        state["scaler"].step(state["optim"])
        state["scaler"].update()
        state["sched"].step()
        state["data"].global_sample_index += 8
        losses.append(loss.item())
    return losses


def test_single_process_resume_is_bit_identical(tmp_path: Any) -> None:
    a = _single_state(0)
    _train(a, 3)
    a["extra"]["bf"].copy_(torch.tensor([1.5, -2.0, 3.25]))
    a["extra"]["z"].fill_(9)
    info = pckt.save(a, str(tmp_path), step=3)
    assert info.step == 3 and info.world_size == 1
    ref = _train(a, 2)
    b = _single_state(1)  # other initial values, fresh optimizer without state
    li = pckt.load(b, str(tmp_path))
    assert (
        li.contract == "exact"
        and li.step == 3
        and li.unexpected_keys == []
        and li.missing_keys == []
    )
    assert b["extra"]["bf"].tolist() == [1.5, -2.0, 3.25] and int(b["extra"]["z"]) == 9
    assert b["data"].global_sample_index == 24 and b["sched"].last_epoch == 3
    assert _train(b, 2) == ref
    for p, q in zip(a["model"].parameters(), b["model"].parameters(), strict=True):
        assert torch.equal(p, q)


class _SlowStorage(LocalStorage):
    def create_if_absent(self, path: str, data: bytes) -> bool:
        time.sleep(1.0)
        return super().create_if_absent(path, data)


def test_async_save_second_save_in_flight(tmp_path: Any) -> None:
    storage = _SlowStorage(str(tmp_path), create=True)
    state = {"w": torch.arange(6.0), "n": 1}
    h = pckt.async_save(state, storage, step=1)
    assert h.staged.done()
    state["w"].add_(10)
    with pytest.raises(UsageError):
        pckt.async_save(state, storage, step=2, if_busy="raise")
    h2 = pckt.async_save(state, storage, step=2)  # waits for the first
    assert h.committed.done()
    assert h2.result().step == 2 and h.result().step == 1
    assert pckt.wait_for_pending_save() is not None
    ck = portable_ckpt.open(str(tmp_path), step=1)
    assert ck.read("w").tolist() == list(np.arange(6.0))
    assert portable_ckpt.open(str(tmp_path)).read("w").tolist() == list(np.arange(6.0) + 10)


def test_async_save_after_a_finished_one_does_not_raise_if_busy(tmp_path: Any) -> None:
    """Mutation audit B I01 (mut-14): ``if_busy="raise"`` raises only while a save is in
    flight; the slot keeps the finished handle, so a done save must not count as busy (every
    later ``if_busy="raise"`` save failed with PCK-USAGE)."""
    state = {"w": torch.arange(6.0)}
    h = pckt.async_save(state, str(tmp_path), step=1)
    assert h.result().step == 1
    h2 = pckt.async_save(state, str(tmp_path), step=2, if_busy="raise")
    assert h2.result().step == 2
    assert [v.step for v in portable_ckpt.list_versions(str(tmp_path))] == [1, 2]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (torch.arange(6, dtype=torch.float32) + 0.25, torch.arange(6, dtype=torch.float64) + 0.5),
        (torch.arange(6, dtype=torch.float32) + 0.25, torch.arange(6, dtype=torch.int32) - 3),
        (torch.arange(6, dtype=torch.float32) + 0.25, torch.arange(6.0).reshape(1, 6) * 3),
        (torch.arange(6, dtype=torch.float32) + 0.25, torch.arange(6.0).reshape(2, 3) * 3),
        (torch.arange(6.0).reshape(2, 3), torch.arange(6.0).reshape(3, 2) + 1),
    ],
    ids=["f32-f64", "f32-i32", "6-1x6", "6-2x3", "2x3-3x2"],
)
def test_async_saves_of_one_key_whose_dtype_or_shape_changed(
    tmp_path: Any, first: Any, second: Any
) -> None:
    """Mutation audit B G02/G03 (mut-04, mut-13): the staging buffer reused across async
    saves of one key is reallocated when the tensor's dtype or shape changes (same numel):
    reused, ``copy_`` cast the values into the old dtype, or kept the old shape, and the
    second version was written with the wrong bytes or shape."""
    pckt.async_save({"w": first}, str(tmp_path), step=1).result()
    pckt.async_save({"w": second}, str(tmp_path), step=2).result()
    for step, want in ((1, first), (2, second)):
        got = portable_ckpt.open(str(tmp_path), step=step).read("w")
        assert got.dtype == want.numpy().dtype and got.shape == tuple(want.shape), step
        assert np.array_equal(got, want.numpy()), step


def test_load_errors(tmp_path: Any) -> None:
    pckt.save({"w": torch.zeros(3)}, str(tmp_path), step=1)
    with pytest.raises(CheckpointError) as e:
        pckt.load({"w": torch.zeros(4)}, str(tmp_path))
    assert e.value.code == "PCK-USAGE"
    with pytest.raises(CheckpointError) as e:
        pckt.load({"v": torch.zeros(3)}, str(tmp_path))
    assert e.value.code == "PCK-TENSOR-MISSING"
    info = pckt.load({"v": torch.zeros(3), "w": torch.ones(3)}, str(tmp_path), strict=False)
    assert info.missing_keys == ["v"] and info.unexpected_keys == []
    with pytest.raises(CheckpointError) as e:  # none found: nothing would load (docs review 21)
        pckt.load({"v": torch.zeros(3)}, str(tmp_path), strict=False)
    assert e.value.code == "PCK-TENSOR-MISSING" and "none of the target's 1 tensors" in str(e.value)
    with pytest.raises(CheckpointError) as e:
        pckt.load({"w": torch.zeros(3)}, str(tmp_path / "nothing"))
    assert e.value.code in ("PCK-NOT-FOUND", "PCK-STORAGE", "PCK-FILE-MISSING")
    with pytest.raises(UsageError):
        pckt.save({"w": torch.zeros(3)}, str(tmp_path), step=-1)


@pytest.mark.parametrize("n", [5, 7])
def test_a_target_of_another_global_shape_is_refused_and_left_unwritten(
    tmp_path: Path, n: int
) -> None:
    """One process, no group: a target smaller or larger than the saved tensor is refused
    naming both shapes, before anything is written into it. Test audit 21b, L11: without the
    shape check of ``_stored_like`` a smaller target got a prefix of the stored tensor and the
    load reported success; only a 3-rank gloo test about how failures propagate caught it."""
    pckt.save({"w": torch.arange(6.0)}, str(tmp_path), step=1, continuation="statistical")
    target = {"w": torch.zeros(n)}
    with pytest.raises(UsageError, match=rf"tensor 'w': the checkpoint holds shape \[6\], the "
                       rf"target has \[{n}\]"):
        pckt.load(target, str(tmp_path))
    assert torch.equal(target["w"], torch.zeros(n))


def test_dtype_conversion_on_load(tmp_path: Any) -> None:
    pckt.save({"w": torch.tensor([1.5, 2.5])}, str(tmp_path), step=1)
    target = {"w": torch.zeros(2, dtype=torch.bfloat16)}
    pckt.load(target, str(tmp_path))
    assert target["w"].tolist() == [1.5, 2.5]


def _fresh_targets() -> list[dict[str, Any]]:
    """Targets whose plain lists differ in length from the saved ones (a job made fresh)."""
    return [
        {"w": torch.zeros(2), "hist": [], "app": {"seen": ["x"], "grid": [[0]], "pair": (0, 0)}},
        {"w": torch.zeros(2), "hist": [9.0] * 5, "app": {"seen": [], "grid": [], "pair": ()}},
    ]


def test_plain_lists_load_whole_as_with_dcp(tmp_path: Any) -> None:
    """A list DCP keeps as one item (plain values) is replaced whole, whatever its length in the
    target, as dcp.load with DCP's own storage does; it used to be loaded position by position,
    so a target made fresh (``hist = []``) kept its empty list: the saved history was lost."""
    import torch.distributed.checkpoint as dcp

    state = {"w": torch.ones(2), "hist": [0.5, 0.25, 0.125],
             "app": {"seen": ["a", "b"], "grid": [[1, 2], [3]], "pair": (4, 5)}}
    pckt.save(state, str(tmp_path / "p"), step=1)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path / "d")), no_dist=True)
    for ours, theirs in zip(_fresh_targets(), _fresh_targets()):
        hist = ours["hist"]
        pckt.load(ours, str(tmp_path / "p"))
        dcp.load(theirs, storage_reader=dcp.FileSystemReader(str(tmp_path / "d")), no_dist=True)
        assert ours["hist"] is hist  # the target's list object, updated in place
        for got in (ours, theirs):
            assert got["hist"] == [0.5, 0.25, 0.125] and got["app"]["seen"] == ["a", "b"]
            assert got["app"]["grid"] == [[1, 2], [3]]
        assert ours["app"]["pair"] == (4, 5) and list(theirs["app"]["pair"]) == [4, 5]
        assert torch.equal(ours["w"], torch.ones(2))


# -- protocol steps (one process: the same code path as a group, with local collectives) -----------


def test_save_keywords_are_the_save_options() -> None:
    import dataclasses

    from portable_ckpt.torch.saving import SaveKeywords, SaveOptions

    keys = SaveKeywords.__required_keys__ | SaveKeywords.__optional_keys__
    assert keys == {f.name for f in dataclasses.fields(SaveOptions)}
    assert SaveKeywords.__required_keys__ == frozenset({"step"})
    with pytest.raises(UsageError):
        SaveOptions(step=True)
    with pytest.raises(UsageError):
        SaveOptions(step=1, continuation="bitwise")
    with pytest.raises(TypeError):
        pckt.save({"w": torch.zeros(1)}, "unused", step=1, codecs="zstd")


def test_comm_steps_return_or_raise_in_one_place() -> None:
    from portable_ckpt.errors import DistributedError, MetadataConflictError
    from portable_ckpt.torch._collectives import make_comm

    comm = make_comm()
    assert comm.all_gather_step("t", lambda: ("mine", {"n": 1}), what="x", outcome="y") == (
        "mine",
        [{"n": 1}],
    )
    aborted: list[bool] = []
    local, result = comm.coordinator_step(
        "t",
        lambda: (1, 2),
        lambda shared: sum(shared) * 10,
        what="x",
        outcome="y",
        on_failure=lambda: aborted.append(True),
    )
    assert (local, result, aborted) == (1, 20, [])

    def conflict(_: list[Any]) -> Any:
        raise MetadataConflictError("writers disagree")

    with pytest.raises(MetadataConflictError):  # the coordinator's own error, as it was raised
        comm.coordinator_step(
            "t",
            lambda: (1, 2),
            conflict,
            what="x",
            outcome="y",
            on_failure=lambda: aborted.append(True),
        )
    assert aborted == [True]

    def boom() -> tuple[Any, Any]:
        raise RuntimeError("boom")

    with pytest.raises(DistributedError) as e:  # a foreign exception: wrapped, cause kept
        comm.all_gather_step("t", boom, what="save of step 1 (prepare)", outcome="nothing")
    assert isinstance(e.value.__cause__, RuntimeError)
    assert e.value.failed_ranks == [0] and e.value.failures[0].message == "RuntimeError: boom"
    assert "rank 0: save of step 1 (prepare) failed" in e.value.message


failures_st = st.lists(
    st.builds(
        portable_ckpt.errors.RankFailure,
        st.integers(0, 1 << 20),
        st.sampled_from(["PCK-DISTRIBUTED", "PCK-USAGE"]),
        st.text(max_size=40),
        st.booleans(),
    ),
    max_size=4,
)


@given(
    st.recursive(
        st.none() | st.integers() | st.text(max_size=8), lambda c: st.lists(c, max_size=3)
    ),
    failures_st,
)
def test_step_status_round_trips_through_json(value: Any, failures: list[Any]) -> None:
    import json

    from portable_ckpt.torch._collectives import StepStatus

    s = StepStatus(value, tuple(failures))
    back = StepStatus.from_json(json.loads(json.dumps(s.to_json())))
    assert back == s and back.ok == (not failures)


def test_a_killed_unreaped_peer_counts_as_gone() -> None:
    """A SIGKILLed rank is a zombie until its launcher reaps it: still gone for PCK-DISTRIBUTED."""
    import os
    import signal
    import subprocess

    from portable_ckpt.torch._collectives import _process_gone

    p = subprocess.Popen(["sleep", "30"])
    try:
        assert not _process_gone(p.pid)
        os.kill(p.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while not _process_gone(p.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _process_gone(p.pid)  # a zombie: not reaped yet
        assert p.poll() is not None
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize("shape", ["deep", "self-dict", "self-list"])
def test_runaway_nesting_is_refused_by_name(shape: str, tmp_path: Path) -> None:
    """A state nested 700 levels deep, or a container holding itself, failed with a bare
    RecursionError wrapped as PCK-DISTRIBUTED; 256 levels save and load."""
    from portable_ckpt.torch.flatten import MAX_DEPTH

    def nest(levels: int) -> dict[str, Any]:
        d: dict[str, Any] = {"x": torch.ones(2)}
        for _ in range(levels):
            d = {"k": d}
        return d

    ok = nest(MAX_DEPTH - 1)
    portable_ckpt.torch.save(ok, tmp_path / "ok", step=1)
    target = nest(MAX_DEPTH - 1)
    portable_ckpt.torch.load(target, tmp_path / "ok")
    if shape == "deep":
        bad: Any = nest(700)
    elif shape == "self-dict":
        bad = {"x": torch.ones(2)}
        bad["me"] = bad
    else:
        loop: list[Any] = [1]
        loop.append(loop)
        bad = {"l": loop}
    with pytest.raises(portable_ckpt.errors.UnsupportedValueError, match="nested more than"):
        portable_ckpt.torch.save(bad, tmp_path / "bad", step=1)


def test_the_sampled_comparison_moves_with_the_step() -> None:
    """Attack review 2 F10: 16 fixed slices of 4 KiB: per-rank values between them were never
    seen, at any save, and the version said ``exact``. The slices move with the step (the same
    on every rank), so a fixed difference is found within a few saves."""
    from portable_ckpt.torch.flatten import flatten_state
    from portable_ckpt.torch.plan import replica_digests

    n = 512 * 1024  # 2 MiB of float32: sampled
    a = torch.zeros(n)
    b = torch.zeros(n)
    b[5000:5010] = 1.0  # between the slices of step 0
    digests = [
        (replica_digests(flatten_state({"buf": a}), seed=s)["buf"],
         replica_digests(flatten_state({"buf": b}), seed=s)["buf"])
        for s in range(40)
    ]
    assert digests[0][0] == digests[0][1]  # step 0's fixed slices do not see it
    found = [s for s, (x, y) in enumerate(digests) if x != y]
    assert found and found[0] < 40
    c = a.clone()  # equal tensors are equal at every step
    assert all(replica_digests(flatten_state({"buf": c}), seed=s)["buf"] == x
               for s, (x, _) in enumerate(digests[:5]))


def test_a_group_retries_a_deleted_version_only_when_every_rank_says_so(tmp_path: Path) -> None:
    """The decision to load the root's latest again is taken from the failures every rank
    exchanged: alike everywhere, so a group retries together or not at all."""
    from portable_ckpt.errors import DistributedError, RankFailure, VersionDeletedError
    from portable_ckpt.torch._collectives import Comm, StepStatus
    from portable_ckpt.torch.loading import _may_retry

    group = Comm(1, 3, None, [0, 1, 2], 5.0)
    gone = RankFailure(0, "PCK-FILE-MISSING", "VersionDeletedError: x", deleted=True)
    damaged = RankFailure(2, "PCK-CHECKSUM", "ChecksumError: y")
    own = VersionDeletedError("x")
    own.failures = (gone, gone)
    root = str(tmp_path)
    assert _may_retry(root, group, None, None, DistributedError("d", failures=[gone]))
    assert _may_retry(root, group, None, None, own)
    assert not _may_retry(root, group, None, None, DistributedError("d", failures=[gone, damaged]))
    assert not _may_retry(root, group, None, None, DistributedError("exchange failed"))
    assert not _may_retry(root, group, None, None, VersionDeletedError("no list"))
    assert not _may_retry(root, group, None, 3, own)  # a step's newest: the one deleted
    assert not _may_retry(root, group, "s1", None, own)
    # the flag travels in the exchanged document
    doc = StepStatus(failures=(gone,)).to_json()
    assert StepStatus.from_json(doc).failures[0].deleted
    one = Comm(0, 1, None, [0], 5.0)
    assert _may_retry(root, one, None, None, VersionDeletedError("x"))
    assert not _may_retry(root, one, None, None, DistributedError("d", failures=[gone]))


def test_as_tensor_gives_torch_every_dtype_a_read_returns(tmp_path) -> None:
    """Fine-tuning review F4: `torch.from_numpy` refuses the bfloat16 and float8 arrays the read
    API returns; `as_tensor` crosses every format dtype with its bytes unchanged, no copy."""
    import portable_ckpt
    import portable_ckpt.torch as pckt
    from portable_ckpt.errors import UsageError

    state = {"bf": torch.randn(3, 4).to(torch.bfloat16), "f8": torch.randn(5).to(torch.float8_e4m3fn),
             "i": torch.arange(6, dtype=torch.int16)}
    pckt.save(state, tmp_path, step=1, continuation="statistical")
    ck = portable_ckpt.open(tmp_path)
    for key, want in state.items():
        arr = ck.read(key)
        got = pckt.as_tensor(arr)
        assert got.dtype == want.dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8))
        assert got.data_ptr() == arr.ctypes.data  # shares the array's memory
    with pytest.raises(UsageError, match="numpy array"):
        pckt.as_tensor([1, 2])  # type: ignore[arg-type]
