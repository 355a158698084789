"""A save's tensor plan is reused across saves of the same layout, and only then.

Counted through the public ``portable_ckpt.torch.plan.plan_stats()``; every checkpoint is read
back and compared with the state as it was when the save was called (a reused plan binds the
tensors of *this* call, so data written in place, new tensor objects and new roots all show).
The multi-rank half (DTensor placements and meshes) is ``test_plan_reuse_dist`` below.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import portable_ckpt  # noqa: E402
import portable_ckpt.torch as pckt  # noqa: E402
from portable_ckpt.torch._shm import SHARED  # noqa: E402
from portable_ckpt.torch.plan import plan_stats  # noqa: E402

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]


def _state(salt: float = 0.0) -> dict[str, Any]:
    base = torch.arange(48, dtype=torch.float32).reshape(6, 8) + salt
    return {
        "w": base.clone(),
        "bf": (base[0] * 0.5).to(torch.bfloat16),
        "t": base.clone().t(),  # not contiguous
        "empty": torch.zeros(0, 3),
        "opt": {"m": base[:, :2].clone(), "step": torch.tensor(7.0 + salt)},
        "n": 3,
    }


def _expected(state: dict[str, Any]) -> dict[str, np.ndarray[Any, Any]]:
    """Flat key → the tensor's values now (a copy), as the checkpoint must hold them."""
    out: dict[str, np.ndarray[Any, Any]] = {}

    def walk(v: Any, key: str) -> None:
        if isinstance(v, dict):
            for k, w in v.items():
                walk(w, f"{key}/{k}" if key else k)
        elif isinstance(v, torch.Tensor):
            out[key] = v.detach().float().numpy().copy()

    walk(state, "")
    return out


def _check(root: Path, step: int, expect: dict[str, np.ndarray[Any, Any]]) -> None:
    ck = portable_ckpt.open(str(root), step=step)
    assert ck.verify(deep=True) == []
    for key, want in expect.items():
        got = np.asarray(ck.read(key), dtype=np.float32)
        assert got.shape == want.shape and np.array_equal(got, want), key


def _delta(before: dict[str, int]) -> tuple[int, int]:
    now = plan_stats()
    return now["planned"] - before["planned"], now["reused"] - before["reused"]


def test_second_save_reuses_the_plan_and_writes_this_calls_data(tmp_path: Path) -> None:
    """Same layout twice → planned once; in-place writes and new tensor objects both show."""
    state = _state()
    s0 = plan_stats()
    pckt.save(state, str(tmp_path), step=1)
    first = _expected(state)
    state["w"].mul_(-1)  # in place: the same objects
    state["opt"]["m"] = state["opt"]["m"] + 5  # a new object of the same layout
    pckt.save(state, str(tmp_path / "other"), step=2)  # another root: nothing shared but the plan
    assert _delta(s0) == (1, 1)
    _check(tmp_path, 1, first)
    _check(tmp_path / "other", 2, _expected(state))


CHANGES = {
    "shape": lambda s: s.update(w=torch.zeros(6, 9)),
    "dtype": lambda s: s.update(w=s["w"].double()),
    "key": lambda s: s.update(w2=s.pop("w")),
    "added": lambda s: s.update(x=torch.ones(2)),
    "empty shape": lambda s: s.update(empty=torch.zeros(0, 4)),
    "order": lambda s: s.update(w=s.pop("w")),  # same tensors, another key order
}


def _saver(tmp_path: Path, how: str) -> Any:
    def save(state: dict[str, Any], step: int) -> None:
        if how == "save":
            pckt.save(state, str(tmp_path), step=step)
        else:  # staged copies, in buffers found by the plan's layout
            pckt.async_save(state, str(tmp_path), step=step, mode=how).result(timeout=120)

    return save


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("how", ["save", "thread"])
def test_any_layout_change_plans_afresh(tmp_path: Path, change: str, how: str) -> None:
    """Each change of an input of the planning → a new plan, and the checkpoint is right."""
    save = _saver(tmp_path, how)
    state = _state(salt=len(change))
    save(state, 1)
    CHANGES[change](state)
    s0 = plan_stats()
    save(state, 2)
    assert _delta(s0) == (1, 0), change
    _check(tmp_path, 2, _expected(state))
    s1 = plan_stats()
    save(state, 3)  # and that new plan is then reused
    assert _delta(s1) == (0, 1), change
    _check(tmp_path, 3, _expected(state))


#: Changes of a local tensor's memory layout alone: no input of the planning (its pieces are
#: boxes of its shape), so the plan is reused, and the bytes written are still the values.
MEMORY_CHANGES = {
    "strides": lambda s: s.update(w=s["w"].t().contiguous().t()),
    "storage offset": lambda s: s.update(bf=torch.cat([s["bf"], s["bf"]])[8:]),
    "contiguous again": lambda s: s.update(t=s["t"].contiguous()),
}


@pytest.mark.parametrize("change", sorted(MEMORY_CHANGES))
@pytest.mark.parametrize("how", ["save", "thread", "process"])
def test_memory_layout_change_reuses_the_plan(tmp_path: Path, change: str, how: str) -> None:
    """Other strides or storage offset, same shapes → the plan reused, the right values."""
    save = _saver(tmp_path, how)
    state = _state(salt=10 + len(change))
    save(state, 1)
    MEMORY_CHANGES[change](state)
    state["w"].add_(1)
    s0 = plan_stats()
    save(state, 2)
    assert _delta(s0) == (0, 1), change
    _check(tmp_path, 2, _expected(state))


def test_two_states_alternating_each_keep_their_plan(tmp_path: Path) -> None:
    """Two layouts saved in turn: each is planned once, no plan serves the other."""
    a, b = _state(1.0), {"only": torch.arange(5.0), "w": torch.zeros(6, 8, dtype=torch.int64)}
    pckt.save(a, str(tmp_path / "a"), step=0)
    pckt.save(b, str(tmp_path / "b"), step=0)
    s0 = plan_stats()
    for step in (1, 2):
        a["w"].add_(step)
        b["w"].add_(step)
        pckt.save(a, str(tmp_path / "a"), step=step)
        pckt.save(b, str(tmp_path / "b"), step=step)
        _check(tmp_path / "a", step, _expected(a))
        _check(tmp_path / "b", step, _expected(b))
    assert _delta(s0) == (0, 4)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_async_with_a_reused_plan_never_leaks_later_mutations(tmp_path: Path, mode: str) -> None:
    """Async saves on a reused plan (process mode: in the same segment) write the staged copy."""
    state = _state(2.0)
    pckt.async_save(state, str(tmp_path), step=1, mode=mode).result(timeout=120)
    segment = SHARED.segment
    expects = {}
    s0 = plan_stats()
    for step in (2, 3):
        state["w"].add_(step)
        expects[step] = _expected(state)
        h = pckt.async_save(state, str(tmp_path), step=step, mode=mode)
        for t in (state["w"], state["bf"], state["t"], state["opt"]["m"]):
            t.fill_(-1)  # right after the call: never in this version
        h.result(timeout=120)
        state["w"].copy_(torch.from_numpy(expects[step]["w"]))
    assert _delta(s0) == (0, 2)
    if mode == "process":
        assert SHARED.segment is segment and segment is not None  # kept: the size is unchanged
    for step, expect in expects.items():
        _check(tmp_path, step, expect)


def test_process_mode_layout_change_restages_correctly(tmp_path: Path) -> None:
    """A larger state after a reused segment: a new plan and segment, the right bytes."""
    state = _state(3.0)
    for step in (1, 2):
        pckt.async_save(state, str(tmp_path), step=step, mode="process").result(timeout=120)
    small = SHARED.segment
    state["big"] = torch.arange(1 << 16, dtype=torch.float32)
    s0 = plan_stats()
    h = pckt.async_save(state, str(tmp_path), step=3, mode="process")
    expect = _expected(state)
    state["big"].zero_()
    h.result(timeout=120)
    assert _delta(s0) == (1, 0) and SHARED.segment is not small
    _check(tmp_path, 3, expect)


def test_manager_saves_reuse_the_plan(tmp_path: Path) -> None:
    """The manager's saves go through the same cache (its own entries change every time)."""
    state = _state(4.0)
    with pckt.CheckpointManager(str(tmp_path), save_every=1, timeout=60) as mgr:
        mgr.maybe_save(1, state)
        mgr.wait()
        s0 = plan_stats()
        expects = {}
        for step in (2, 3):
            state["w"].add_(1)
            expects[step] = _expected(state)
            mgr.maybe_save(step, state)
            mgr.wait()
        assert _delta(s0) == (0, 2)
    for step, expect in expects.items():
        _check(tmp_path, step, expect)


def test_plan_reuse_dist(tmp_path: Path) -> None:
    """Two gloo ranks: DTensor placement and mesh changes re-plan; every version loads right."""
    from portable_ckpt.torch.launch import run_group

    res = run_group("tests.torch._plan_workers:placements_and_meshes", 2, (str(tmp_path),),
                    timeout=240, sys_path=[str(ROOT), os.path.join(ROOT, "src")])
    res.raise_for_errors()
    for r in res.results:
        assert r["problems"] == [], r
        # shard x2 (planned, reused), replicate, strided, another mesh object, shard again
        assert r["deltas"] == [[1, 0], [0, 1], [1, 0], [1, 0], [1, 0], [0, 1]], r
