"""Staging buffers found by the plan's layout (the fast path of ``async_save``'s blocking part).

A plan made from a cached template names its layout; :func:`stage` then gets the buffers it got
for the same layout last time without a lookup per slot. These tests hold the pool to what a
lookup per slot would have given: the same buffers for the same layout, new ones after any
change of the pool, the bytes counted exactly, and copies that hold the values of staging time
(host tensors go through one batched copy; plain, strided, offset, negative and conjugate views).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from portable_ckpt.torch.flatten import flatten_state  # noqa: E402
from portable_ckpt.torch.plan import plan_save  # noqa: E402
from portable_ckpt.torch.staging import StagingPool, stage  # noqa: E402


def _plan(state: dict[str, object]):  # type: ignore[no-untyped-def]
    return plan_save(flatten_state(state), 0, {})


def _pool_bytes(pool: StagingPool) -> int:
    return sum(b.numel() * b.element_size() for b, _ in pool._buffers.values())


def test_the_same_layout_gets_the_same_buffers_and_the_values_of_each_save() -> None:
    pool = StagingPool()
    state = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3, dtype=torch.bfloat16)}
    first = _plan(state)
    stage(first, copy=True, into=pool)
    assert first.layout is not None
    state["w"].add_(10)
    second = _plan(state)
    assert second.layout == first.layout
    stage(second, copy=True, into=pool)
    views = [p.array for p in second.pieces]
    assert all(a is b for a, b in zip(views, [p.array for p in first.pieces], strict=True))
    state["w"].add_(100)  # after staging: not in the staged copy
    assert second.pieces[0].array is not None
    assert second.pieces[0].array.tolist() == [[10, 11, 12], [13, 14, 15]]
    assert pool.nbytes == _pool_bytes(pool) == 6 * 4 + 3 * 2


def test_a_layout_whose_buffers_were_pruned_is_looked_up_again() -> None:
    """A, then B (prune frees A's slots), then A: new buffers for A, counted, with A's values."""
    pool = StagingPool()
    a = {"w": torch.arange(4.0)}
    b = {"v": torch.arange(8, dtype=torch.int64)}
    plan_a = _plan(a)
    stage(plan_a, copy=True, into=pool)
    old = plan_a.pieces[0].array
    stage(_plan(b), copy=True, into=pool)
    assert pool.nbytes == _pool_bytes(pool) == 64
    a["w"].mul_(-1)
    again = _plan(a)
    assert again.layout == plan_a.layout
    stage(again, copy=True, into=pool)
    assert again.pieces[0].array is not old
    assert again.pieces[0].array is not None and again.pieces[0].array.tolist() == [0, -1, -2, -3]
    assert pool.nbytes == _pool_bytes(pool) == 16


def test_a_buffer_replaced_by_a_lookup_is_not_handed_out_from_the_last_layout() -> None:
    """A slot reallocated by another shape in between: the next save of the layout gets it."""
    pool = StagingPool()
    state = {"w": torch.arange(4.0)}
    stage(_plan(state), copy=True, into=pool)
    pool.get("w@0", torch.ones(7))  # another user of the slot, another shape
    plan = _plan(state)
    stage(plan, copy=True, into=pool)
    assert plan.pieces[0].array is not None and plan.pieces[0].array.tolist() == [0, 1, 2, 3]
    assert pool._buffers["w@0"][0].shape == (4,)
    assert pool.nbytes == _pool_bytes(pool) == 16


def test_a_save_without_copies_and_one_with_do_not_share_a_layout() -> None:
    """copy=False stages no host tensor (views of the live ones); copy=True then copies all."""
    pool = StagingPool()
    state = {"w": torch.arange(3.0)}
    live = _plan(state)
    stage(live, copy=False, into=pool)
    assert pool.nbytes == 0
    state["w"].add_(1)
    assert live.pieces[0].array is not None and live.pieces[0].array.tolist() == [1, 2, 3]
    copied = _plan(state)
    stage(copied, copy=True, into=pool)
    state["w"].add_(1)
    assert copied.pieces[0].array is not None and copied.pieces[0].array.tolist() == [1, 2, 3]
    assert pool.nbytes == 12


def test_views_of_every_kind_are_staged_as_their_values() -> None:
    """The batched copy resolves what copy_ resolves: strides, offsets, neg and conj bits."""
    base = torch.arange(24.0).reshape(4, 6)
    c = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    state = {
        "t": base.t(),
        "off": base[1:3, 2:5],
        "neg": torch.tensor([1.0, 2.0])._neg_view(),
        "conj": c.conj(),
        "zero": torch.zeros(0, 3),
        "i8": torch.arange(5, dtype=torch.int8),
        "f8": torch.arange(4.0).to(torch.float8_e4m3fn),
        "bool": torch.tensor([True, False]),
    }
    want = {k: v.resolve_neg().resolve_conj().clone() for k, v in state.items()}
    plan = _plan(state)
    stage(plan, copy=True, into=StagingPool())
    for t in (base, c):
        t.zero_()
    staged = {p.key: p.array for p in plan.pieces}
    assert staged.pop("zero") is None  # no bytes: declared only
    assert sorted(staged) == sorted(k for k in want if k != "zero")
    for key, arr in staged.items():
        assert arr is not None, key
        w = want[key]
        if key == "f8":  # no numpy dtype in torch.from_numpy: compared as bytes
            assert arr.tobytes() == w.view(torch.uint8).numpy().tobytes()
        else:
            got = torch.from_numpy(arr.copy())
            assert got.shape == w.shape and torch.equal(got, w), key


def test_a_save_that_copies_nothing_leaves_the_last_layout_found() -> None:
    """A synchronous save of host tensors (nothing copied) between two async saves does not
    make the next async save look its buffers up again."""
    pool = StagingPool()
    state = {"w": torch.arange(3.0)}
    stage(_plan(state), copy=True, into=pool)
    found = pool._last
    stage(_plan(state), copy=False, into=pool)
    assert found is not None and pool._last is found
    again = _plan(state)
    stage(again, copy=True, into=pool)
    assert again.pieces[0].array is found[2][0][1]
