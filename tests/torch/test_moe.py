"""Mixture-of-experts layouts: plain tensors held by some ranks only (MoE review E1).

Experts kept by their own ranks under global ids (``experts.5`` on rank 2 only: Megatron's and
Hugging Face's ModuleList expert parallelism) were refused by ``save``: a plain tensor was
stored from rank 0, so every rank had to hold it. Such a tensor is now stored by the lowest rank
that holds it, as DCP's planner does; the ranks learn who holds what at their first save.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import portable_ckpt

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

W = "tests.torch._moe_workers"


def _run(fn: str, world: int, *args: Any) -> list[Any]:
    from portable_ckpt.torch.launch import run_group

    res = run_group(f"{W}:{fn}", world, args, timeout=150, pg_timeout=45)
    res.raise_for_errors()
    return res.results


def _writer(ck: Any, key: str) -> str:
    """The file that holds ``key`` (one range record: a plain tensor has one writer)."""
    records = ck.tensors[key].ranges
    assert len(records) == 1, records
    return str(records[0].file)


@pytest.mark.parametrize("mode", ["sync", "thread", "process", "manager"])
def test_experts_held_by_their_own_ranks_are_stored_by_them(tmp_path: Path, mode: str) -> None:
    from tests.torch._moe_workers import expert, owned

    root = str(tmp_path / "ck")
    results = _run("save_experts", 4, root, mode)
    if mode != "manager":
        assert [r["contracts"] for r in results] == [["exact", "exact"]] * 4
    # Every save starts with one small all-gather (are the plain keys those of the last
    # exchange?); the keys themselves travel at the group's first save only.
    for r in results:
        assert r["exchanges"] == {"save/plain-keys": 2, "save/plain-owners": 1}, r
        if mode in ("thread", "process", "manager"):
            assert r["blocking"][0] == {"save/plain-keys": 1, "save/plain-owners": 1}, r
            assert r["blocking"][1] == {"save/plain-keys": 1}, r
    versions = [v for v in portable_ckpt.list_versions(root) if v.status == "committed"]
    assert [v.step for v in versions] == [1, 2]
    for v in versions:
        ck = portable_ckpt.open(root, step=v.step)
        assert ck.manifest.continuation.contract == "exact"
        files = {}
        for rank in range(4):
            for gid in owned(rank, 4):
                got = ck.read(f"model/experts/{gid}")
                # the values of the call, not those the loop wrote after it returned
                assert (got == expert(gid, float(v.step)).numpy()).all(), (v.step, gid)
                files[gid] = _writer(ck, f"model/experts/{gid}")
        # each rank wrote its own experts: two per file, four files
        assert len(set(files.values())) == 4
        assert all(files[g] == files[g - g % 2] for g in files)
        assert _writer(ck, "model/router") == files[0]  # rank 0 stores what every rank holds
        assert (ck.read("model/router") == 0.5 + v.step).all()


@pytest.fixture(scope="module")
def experts4(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("experts4") / "ck")
    _run("save_experts", 4, root, "sync")
    return root


@pytest.mark.parametrize("world", [4, 2, 1])
def test_experts_saved_by_their_ranks_load_onto_any_expert_parallel_degree(
    experts4: str, world: int
) -> None:
    results = _run("load_experts", world, experts4, 2)
    for r in results:
        assert r["bad"] == [] and r["router"] and r["step"] == 2 and r["loaded_step"] == 2, r
        assert r["contract"] == ("exact" if world == 4 else "statistical")
        # the other ranks' experts are in the version, not in this rank's target
        assert r["unexpected"] == 8 - 8 // world


@pytest.mark.parametrize("mode", ["sync", "thread"])
def test_plain_tensors_that_change_holders_between_saves(tmp_path: Path, mode: str) -> None:
    """Keys that move, come back and change hands are stored at every save, from the lowest
    rank that holds them at that save (review of E1, R2: an async save refused every other
    save of a key that moved back and forth)."""
    root = str(tmp_path / "ck")
    results = _run("moved_keys", 4, root, mode)
    for r in results:
        assert [r[str(s)] for s in range(1, 6)] == ["exact"] * 4 + ["statistical"], r
    # holders of one key with other values: one copy (the lowest holder's), statistical
    assert "differ between ranks (1: 'x')" in results[0]["stderr5"]
    assert "lowest rank that holds it" in results[0]["stderr5"]
    if mode == "thread":  # each rank staged what it stores, no more
        assert [r["staged4"] for r in results] == [8, 0, 20, 24]  # w; -; x; z
    steps = [v.step for v in portable_ckpt.list_versions(root) if v.status == "committed"]
    assert steps == [1, 2, 3, 4, 5]
    for step in range(1, 5):
        ck = portable_ckpt.open(root, step=step)
        assert (ck.read("x") == torch.arange(5.0).numpy()).all()
        assert (ck.read("z") == (torch.arange(6.0) * 2).numpy()).all()
    ck5 = portable_ckpt.open(root, step=5)
    assert (ck5.read("x") == (torch.arange(5.0) + 1).numpy()).all()  # rank 1's copy


def test_keys_new_to_every_rank_are_staged_by_rank_0_alone(tmp_path: Path) -> None:
    results = _run("keys_new_everywhere", 2, str(tmp_path / "ck"))
    assert results[0]["staged"] == [4000, 1_004_000, 1_004_000]
    assert results[1]["staged"] == [0, 0, 0]


def test_a_rank_that_lost_its_record_or_kept_an_old_one(tmp_path: Path) -> None:
    root = str(tmp_path / "ck")
    results = _run("lost_records", 3, root)
    for r in results:
        assert r["1"] == r["2"] == r["3"] == r["5"] == "exact", r
        # a stale record is found by the agreement step, before anything is written; every
        # rank forgets its record and the next save exchanges the keys again
        assert r["4"].startswith("PCK-METADATA-CONFLICT"), r
        assert "the ranks disagree on which of them stores plain tensors" in r["4"], r
        assert "rank 2 stores 1 plain keys where it should store 0" in r["4"], r
    # the rank at fault names the keys in its own message
    assert "(['x'] are held by a lower rank too)" in results[2]["4"]
    steps = [v.step for v in portable_ckpt.list_versions(root) if v.status == "committed"]
    assert steps == [1, 2, 3, 5]
    assert (portable_ckpt.open(root, step=5).read("x") == torch.arange(4.0).numpy()).all()


def test_a_plain_tensor_another_rank_stores_keeps_its_dcp_item_path(tmp_path: Path) -> None:
    from portable_ckpt.format.keys import recorded_items

    root = str(tmp_path / "ck")
    assert [r["contract"] for r in _run("expert_lists", 2, root)] == ["exact", "exact"]
    ck = portable_ckpt.open(root)
    items = recorded_items(ck)
    assert items is not None
    for gid in range(8):
        for i in range(2):
            assert items[f"experts/{gid}/{i}"] == ("experts", str(gid), i)
    assert (ck.read("experts/5/1") == (torch.arange(12.0).reshape(3, 4) + 500.5).numpy()).all()


@pytest.mark.parametrize("flat", [True, False])
def test_expert_parallel_training_with_adamw_resumes_exactly(tmp_path: Path, flat: bool) -> None:
    """Experts by global id, AdamW, ModelOptimizerState: the third step after a restore is
    bit for bit the third step of the run that saved, on 2 ranks; on one rank every expert."""
    root = str(tmp_path / "ck")
    saved = _run("train_experts", 2, root, flat)
    resumed = _run("resume_experts", 2, root, flat)
    for s, r in zip(saved, resumed, strict=True):
        assert r["params"] == s["params"]
    if flat:
        # The flattened optimizer state names each expert's hyperparameters
        # (param_groups.experts.5.weight.lr): values held by their own ranks, stored from them.
        assert [s["contract"] for s in saved] == ["exact", "exact"]
        assert [r["contract"] for r in resumed] == ["exact", "exact"]
    else:
        # param_groups lists each rank's own parameter names: one copy is stored (documented)
        assert [s["contract"] for s in saved] == ["statistical"] * 2
        assert "train/optim/param_groups/0/params" in saved[0]["stderr"]
    one = _run("resume_experts", 1, root, flat)[0]
    merged = {**saved[0]["params"], **saved[1]["params"]}
    assert one["params"].keys() == merged.keys()
    for k in one["params"]:
        if k.startswith("experts."):  # the router's gradients were averaged over 2 ranks
            assert one["params"][k] == merged[k], k


def test_parameters_that_differ_between_ranks_refuse_the_save(tmp_path: Path) -> None:
    """MoE review E2: experts keyed by local index look like one replicated tensor whose values
    differ; rank 0's copy was stored under a statistical contract with one line on stderr, and
    a 4 → 4 load gave every rank rank 0's experts. A module's parameters that differ now refuse
    the save; buffers that differ (BatchNorm statistics) still make it statistical."""
    results = _run("local_index_experts", 2, str(tmp_path))
    for r in results:
        for name in ("module", "model-optimizer"):
            assert r[name].startswith("PCK-METADATA-CONFLICT"), (name, r[name])
            assert "model parameters that are plain tensors differ between ranks" in r[name]
            assert "'model/experts.0.weight'" in r[name] or "'train/model/experts.0.weight'" in r[
                name]
            assert "key them by global expert id" in r[name]
            assert "norm" not in r[name]  # a buffer is no parameter
        # without the module the save cannot tell a weight from a buffer: as before
        assert r["state-dict"] == "statistical"
        assert r["asked-statistical"] == "statistical" and r["buffers-only"] == "statistical"
    assert "'model/norm.running_mean'" in results[0]["buffers-only-stderr"]
    committed = sorted(m.parent.parent.name for m in tmp_path.glob("*/s*/manifest.json"))
    assert committed == ["asked-statistical", "buffers-only", "state-dict"]


@pytest.mark.parametrize("world", [4, 2])
def test_a_manager_restore_of_experts_names_only_keys_no_rank_read(
    experts4: str, world: int
) -> None:
    """Review of E1, R6: every expert-parallel restore said that the other ranks' experts were
    "not in the state ... a layer removed since the save?"."""
    results = _run("manager_restore_experts", world, experts4, False)
    assert [(r["step"], r["ok"]) for r in results] == [(2, True)] * world
    assert all("in no rank's state" not in r["stderr"] for r in results), results[0]["stderr"]
    dropped = _run("manager_restore_experts", world, experts4, True)
    assert "1 stored key(s) (tensors and plain values) are in no rank's state" in dropped[0][
        "stderr"]
    assert "'model/router'" in dropped[0]["stderr"]


def test_an_interrupt_inside_the_exchange_keeps_the_collectives_in_step(tmp_path: Path) -> None:
    r0, r1 = _run("interrupted_exchange", 2, str(tmp_path / "ck"))
    assert r1["1"] == "KeyboardInterrupt"
    assert r0["1"].startswith("PCK-DISTRIBUTED") and "rank(s) [1]" in r0["1"], r0
    assert r0["2"] == r1["2"] == "exact"  # the group still works


def test_a_peer_that_fails_before_the_exchange_costs_the_others_no_second_staging(
    tmp_path: Path,
) -> None:
    """Diff review 7, D4: the ranks that were ready staged a save already known to fail again."""
    r0, r1 = _run("peer_fails_before_exchange", 2, str(tmp_path / "ck"))
    assert r0["1"] == r1["1"] == "exact"
    assert r1["2"].startswith("PCK-UNSUPPORTED-VALUE") and "'bad'" in r1["2"], r1
    assert r0["2"].startswith("PCK-DISTRIBUTED") and "'bad'" in r0["2"], r0
    assert r0["staged2"] == 1 and r1["staged2"] == 0


def test_a_key_that_is_a_dtensor_on_one_rank_and_plain_on_another(tmp_path: Path) -> None:
    """Diff review 7, D3: every rank wrote, then the commit refused an overlap naming neither
    kind. Refused before anything is written now, naming the key and both ranks."""
    root = str(tmp_path / "ck")
    for r in _run("dtensor_here_plain_there", 2, root):
        assert r["1"].startswith("PCK-METADATA-CONFLICT"), r
        assert "'w' (a plain tensor on rank 1, a DTensor on rank 0)" in r["1"], r
        assert r["2"] == "exact", r
    assert [v.step for v in portable_ckpt.list_versions(root) if v.status == "committed"] == [2]
    assert not [p for p in Path(root).iterdir() if p.name.startswith("s000000000001")]
