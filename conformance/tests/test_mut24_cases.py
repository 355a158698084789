"""Mutation audit 24, conformance/cases.py: what a crash case kills at, and what replays it."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from conformance.cases import (
    CrashCase,
    SaveCase,
    case_from_json,
    case_to_json,
    crash_cases,
    save_cases,
)

from .conftest import explicit_case


def test_a_replayed_crash_case_kills_where_the_run_did() -> None:
    """``writer --replay`` rebuilds the crash case from case.json: the kill point ``at`` is part
    of it (a replay that kills half-way instead of where the run failed may pass)."""
    cc = CrashCase(explicit_case(), explicit_case(8), "kill-writer", 1, 0.118)
    back = case_from_json(json.loads(json.dumps(case_to_json(cc))))
    assert isinstance(back, CrashCase)
    assert (back.fault, back.victim, back.at) == ("kill-writer", 1, 0.118)
    assert case_to_json(back) == case_to_json(cc)


def test_the_simplest_kill_case_kills_half_way() -> None:
    """Hypothesis starts from (and shrinks towards) its simplest draw: that kill case kills in
    the middle of the victim's work (a mid-file crash), not after its first system call."""
    simplest = find(crash_cases(2, ("none",), "never", fault="kill-writer"), lambda c: True)
    assert simplest.at == 0.5


def test_a_replayed_save_case_keeps_its_world_size() -> None:
    """A save case of more ranks than writers replays as one: the world size is in case.json
    (a committer that took the writers for the world size fails its replay too)."""
    case = explicit_case()
    case.world_size, case.mesh = 3, {"shape": [3], "dim_names": ["dp"]}
    back = case_from_json(json.loads(json.dumps(case_to_json(case))))
    assert isinstance(back, SaveCase)
    assert back.ranks() == 3 and back.continuation() == case.continuation()
    assert case_to_json(back) == case_to_json(case)


@settings(max_examples=60, deadline=None, database=None)
@given(st.data())
def test_a_fewer_ranks_case_has_fewer_ranks(data: st.DataObject) -> None:
    """``rank_kind="fewer"``: writers numbered world_size and above store no per-rank value,
    which is what the kind is drawn for (with a single writer: one rank per writer)."""
    case = data.draw(save_cases(max_writers=4, rank_kind="fewer"))
    if case.num_writers == 1:
        assert case.ranks() == 1
    else:
        assert 1 <= case.ranks() < case.num_writers, (case.ranks(), case.num_writers)


@settings(max_examples=80, deadline=None, database=None)
@given(save_cases(max_writers=3, tables="never"))
def test_drawn_boxes_tile_every_tensor(case: SaveCase) -> None:
    """Every drawn split covers each element once (a generator gap or overlap would make a
    conforming committer refuse, and fail a conforming writer)."""
    for t in case.tensors:
        seen = np.zeros(t.shape, dtype=np.int64)
        for offs, lens, w in t.boxes:
            assert 0 <= w < case.num_writers
            seen[tuple(slice(o, o + n) for o, n in zip(offs, lens, strict=True))] += 1
        assert (seen == (1 if t.boxes else 0)).all(), (t.key, t.shape, t.boxes)


@settings(max_examples=40, deadline=None, database=None)
@given(crash_cases(3, ("none",), "never"))
def test_every_crash_case_has_data_to_write(cc: CrashCase) -> None:
    """Attempt B always holds data (a kill point inside the data, not only around the index)."""
    assert any(t.boxes for t in cc.second.tensors)


def test_the_strategy_draws_every_policy_and_a_2d_mesh() -> None:
    """Every world_size_policy of §12, and 2-d meshes (R-CONTRACT-2), are drawn at all."""
    policies: set[str | None] = set()
    dims: set[int] = set()

    @settings(max_examples=400, deadline=None, database=None, phases=[Phase.generate],
              derandomize=True)
    @given(save_cases(max_writers=4, max_tensors=0, tables="never"))
    def draw(c: SaveCase) -> None:
        policies.update(e.policy for e in c.entries)
        dims.add(len(c.mesh["shape"]) if c.mesh else 0)

    draw()
    assert {"require_same", "modulo", "rank0", "drop"} <= policies, policies
    assert 2 in dims, dims
