"""Saves, loads and managers whatever other process groups the job has made (review 3, C1/C2).

torch names a group made with local synchronization after the number of groups the calling rank
is a member of. The library's side group used it on the whole world, so after a job had made a
group of some ranks only (``new_group([1, 3])``), ranks computed different names and the first
save hung until the 30-minute group timeout. A manager's group was made on a subset of ranks
without local synchronization, which torch requires every rank to call: two managers on disjoint
groups collided.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")


def test_save_and_load_after_a_group_that_not_every_rank_is_in(tmp_path: Path) -> None:
    from portable_ckpt.torch.launch import run_group

    res = run_group(
        "tests.torch._group_workers:save_after_asymmetric_group", 4, (str(tmp_path),),
        timeout=180, pg_timeout=60,
    )
    res.raise_for_errors()
    assert len({r["id"] for r in res.results}) == 1
    assert [r["step"] for r in res.results] == [2, 2, 2, 2]
    assert [r["w"] for r in res.results] == [[0.0, 1.0, 2.0, 3.0]] * 4


def test_managers_on_disjoint_groups_work_independently(tmp_path: Path) -> None:
    from portable_ckpt.torch.launch import run_group

    res = run_group(
        "tests.torch._group_workers:managers_on_disjoint_groups", 4, (str(tmp_path),),
        timeout=180, pg_timeout=60,
    )
    res.raise_for_errors()
    assert [(r["tag"], r["step"], r["w"]) for r in res.results] == [
        ("a", 1, [1.0] * 4), ("a", 1, [1.0] * 4), ("b", 1, [2.0] * 4), ("b", 1, [2.0] * 4)
    ]


def test_load_of_a_stateful_whose_state_dict_runs_collectives(tmp_path: Path) -> None:
    """Review 3, C3: rank 0 flattened the state (all-gathers of get_state_dict) inside the
    record share while the other ranks waited for its broadcast: a deadlock until timeout."""
    from portable_ckpt.torch.launch import run_group

    res = run_group(
        "tests.torch._group_workers:load_full_state_dict_stateful", 2, (str(tmp_path),),
        timeout=180, pg_timeout=60,
    )
    res.raise_for_errors()
    assert res.results == [{"step": 1, "same": True}] * 2


def test_a_partial_load_on_the_same_2d_mesh_is_exact(tmp_path: Path) -> None:
    """Review 3, B1: a target of only the FSDP-only parameters (DTensors on mesh["dp"]) was
    taken for a job on a 1-D mesh: a false PCK-CONTRACT on the very layout that saved it."""
    from portable_ckpt.torch.launch import run_group

    res = run_group(
        "tests.torch._group_workers:partial_load_on_the_same_2d_mesh", 4, (str(tmp_path),),
        timeout=240, pg_timeout=60,
    )
    res.raise_for_errors()
    assert res.results == [{"saved_mesh": [2, 2], "contract": "exact", "same": True}] * 4


def test_exact_onto_another_mesh_shape_of_the_same_world_size_is_refused(tmp_path: Path) -> None:
    """R-CONTRACT-5: an exact version restored onto another mesh shape is refused, even at the
    same world size: saved on a (2, 2) mesh of 4 gloo ranks, loaded onto a (4,) mesh of the same
    4 ranks, it fails with PCK-CONTRACT and leaves the target alone; with allow_statistical it
    loads as statistical, bit for bit; on a (2, 2) mesh again it is exact. Test audit 21,
    finding 2: no test compared mesh shapes at one world size."""
    from portable_ckpt.torch.launch import run_group

    res = run_group(
        "tests.torch._group_workers:exact_onto_another_mesh_of_the_same_world", 4,
        (str(tmp_path),), timeout=180, pg_timeout=60,
    )
    res.raise_for_errors()
    assert res.results == [{
        "saved": ["exact", 4, [2, 2]], "refused": "PCK-CONTRACT", "untouched": True,
        "allowed": "statistical", "values": True, "same_mesh": "exact",
    }] * 4


@pytest.mark.parametrize(("local_names", "mode"), [(False, "sync"), (True, "async")])
def test_pipeline_stages_on_dp_submeshes_are_refused_not_dropped(
    tmp_path: Path, local_names: bool, mode: str
) -> None:
    """HSDP/PP review F0: under pp2 x dp2 with FSDP2 on ``mesh["dp"]``, stage 1's DTensors were
    taken for copies of stage 0's (the rank at pp coordinate 0 stores a sub-mesh's copy): the
    save committed stage 0's layers alone, `verify --deep` passed and the contract said exact.
    Now every rank refuses, naming a key and the fix, and nothing is published. With names
    that the stages share, stage 1's values would have been stored as stage 0's."""
    from portable_ckpt.torch.launch import run_group

    res = run_group(
        "tests.torch._group_workers:pipeline_stages_on_dp_submeshes", 4,
        (str(tmp_path), local_names, mode), timeout=240, pg_timeout=60,
    )
    res.raise_for_errors()
    for r in res.results:
        assert r["error"] == "PCK-METADATA-CONFLICT", r
        assert "rank 2 holds DTensors on a sub-mesh (dp)" in r["message"], r["message"]
        assert "Pipeline parallelism" in r["message"] and r["published"] == [], r
    if not local_names:  # the stages hold different keys: stage 1's are named
        assert "model/layers.2." in res.results[0]["message"]


@pytest.mark.parametrize("case", ["strided", "same_head"])
def test_pipeline_stages_that_share_names_are_refused_by_their_values(
    tmp_path: Path, case: str
) -> None:
    """Diff review 4 F1: stages with one name and shape were told apart by the first 256 bytes
    of contiguous shards only: a strided shard, or shards alike in their first 64 elements,
    were taken for copies and stage 1 was lost (contract exact)."""
    from portable_ckpt.torch.launch import run_group

    res = run_group(
        "tests.torch._group_workers:submesh_copy_cases", 4, (str(tmp_path), case),
        timeout=240, pg_timeout=60,
    )
    res.raise_for_errors()
    for r in res.results:
        assert r["error"] == "PCK-METADATA-CONFLICT" and r["published"] == [], r
        assert "with other values" in r["message"], r["message"]


def test_sub_mesh_copies_in_a_group_that_does_not_start_at_rank_0_are_accepted(
    tmp_path: Path,
) -> None:
    """Diff review 4 F2: the stored copy's holder is a global rank; it was looked up among the
    group's ranks, and a valid (dp, tp) job on ranks 2-5 was refused on every rank."""
    from portable_ckpt.torch.launch import run_group

    res = run_group(
        "tests.torch._group_workers:submesh_copy_cases", 6, (str(tmp_path), "offset_group"),
        timeout=240, pg_timeout=60,
    )
    res.raise_for_errors()
    saved = [r for r in res.results if not r.get("skipped")]
    assert len(saved) == 4
    for r in saved:
        assert r["error"] is None and len(r["published"]) == 1, r


def test_a_stall_past_the_timeout_fails_one_save_not_the_next(tmp_path: Path) -> None:
    from portable_ckpt.torch.launch import run_group

    res = run_group(
        "tests.torch._group_workers:stall_then_save", 2, (str(tmp_path),), timeout=180,
        pg_timeout=60,
    )
    res.raise_for_errors()
    for r in res.results:
        assert r["steps"] == [[1, 1], [2, "PCK-DISTRIBUTED"], [3, 3]], r
        assert r["load"] == [4, True, True], r


def test_more_ranks_than_saved_are_told_their_rng_streams_repeat(tmp_path: Path) -> None:
    """Async review F21: on more ranks, rank r continues stored rank r mod W's RNG (documented),
    so ranks draw alike; rank 0 now says so once."""
    import portable_ckpt.torch as pckt
    from portable_ckpt.torch.launch import run_group

    pckt.save({"w": torch.ones(2), "rng": pckt.RNGState()}, str(tmp_path), step=1)
    res = run_group(
        "tests.torch._group_workers:load_rng_upscaled", 2, (str(tmp_path),), timeout=180,
        pg_timeout=60,
    )
    res.raise_for_errors()
    r0, r1 = res.results
    assert "rank 1 continues the RNG streams of saved rank 0 (policy modulo)" in r0["stderr"], \
        r0["stderr"]
    assert r1["stderr"] == ""
    assert r0["draw"] == r1["draw"]  # what the message warns about


@pytest.mark.parametrize("n", [1, 5, 100, 127, 191, 255, 1000])
def test_the_sub_mesh_sample_reaches_every_element_over_the_steps(n: int) -> None:
    """Last review F2: the sample's start moved by whole steps of n // 64, and below 128
    elements not at all: a third to half of a small shard (a norm weight) was never compared."""
    import numpy as np

    from portable_ckpt.torch.plan import _spread_sample, _to_host

    t = torch.arange(n, dtype=torch.int32)
    seen: set[int] = set()
    for step in range(1, 201):
        seen |= set(np.frombuffer(_to_host([_spread_sample(t, step, {})])[0], np.int32).tolist())
    assert seen == set(range(n))
