"""Mutation audit 29, staging (:mod:`portable_ckpt.torch.staging`).

The host buffers an async save copies into are reused per piece slot and pruned to the slots
of the latest save; once staged, a piece holds no reference to the live tensor.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from portable_ckpt.torch.flatten import flatten_state  # noqa: E402
from portable_ckpt.torch.plan import plan_save  # noqa: E402
from portable_ckpt.torch.staging import StagingPool, register, stage, staging_bytes  # noqa: E402


def test_a_pruning_request_frees_the_buffers_of_other_slots() -> None:
    """Mutant G3 kept every slot ever staged: the host memory of renamed keys stayed held."""
    pool = StagingPool()
    pool.buffers([("a@0", torch.ones(1000)), ("b@0", torch.ones(10))], prune=True)
    assert pool.nbytes == 1010 * 4
    pool.buffers([("b@0", torch.ones(10))], prune=False)
    assert pool.nbytes == 1010 * 4
    pool.buffers([("b@0", torch.ones(10))], prune=True)
    assert pool.nbytes == 10 * 4


def test_a_staged_copy_holds_the_values_and_no_live_reference() -> None:
    """Copied pieces keep the values of staging time; every piece drops its source (mutant G5
    kept the live tensors referenced until the write)."""
    w = torch.arange(4.0)
    plan = plan_save(flatten_state({"w": w, "v": torch.ones(2)}), 0, {})
    stage(plan, copy=True, into=StagingPool())
    w.add_(10)
    assert [p.source for p in plan.pieces] == [None, None]
    assert plan.pieces[0].array is not None and plan.pieces[0].array.tolist() == [0, 1, 2, 3]


def test_a_staging_registered_twice_is_counted_once() -> None:
    """Mutant G6 appended it again: ``staging_bytes()`` counted its buffers twice."""
    pool = StagingPool()
    pool.buffers([("x@0", torch.ones(100))], prune=True)
    before = staging_bytes()
    register(pool)
    register(pool)
    try:
        assert staging_bytes() == before + 400
    finally:
        pool.retain_only(set())  # it stays registered: let it count nothing
