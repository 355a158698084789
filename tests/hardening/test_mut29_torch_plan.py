"""Mutation audit 29, what one rank writes (:mod:`portable_ckpt.torch.plan`).

:func:`plan_save` decides from the state alone, without a process group, so a rank other than
0 of a group is planned here directly: which plain tensors and values it stores (those its
owners record says no lower rank holds), the bytes it counts, and the DCP paths of the lists
above its values. The replica digests (what the ranks compare before a save is committed)
are checked at their documented bounds.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from portable_ckpt.errors import UnsupportedValueError  # noqa: E402
from portable_ckpt.format.keys import DCP_ITEMS_ENTRY, VALUES_ENTRY  # noqa: E402
from portable_ckpt.io.checksum import crc32c  # noqa: E402
from portable_ckpt.torch import DataPosition, GradScalerState, RNGState  # noqa: E402
from portable_ckpt.torch._owners import PlainOwners, keys_digest, plain_keys  # noqa: E402
from portable_ckpt.torch.flatten import flatten_state  # noqa: E402
from portable_ckpt.torch.plan import (  # noqa: E402
    REPLICA_CHECK_BYTES,
    REPLICA_CHECK_TOTAL,
    _spread_sample,
    copy_conflicts,
    diverged,
    plan_save,
    replica_conflicts,
    replica_digests,
)


def _state() -> dict[str, Any]:
    return {"w": torch.ones(2), "v": torch.zeros(3), "cfg": {"a": 1, "b": 2}, "hist": [1, [2, 3]],
            "z": torch.zeros(0, 4), "pos": DataPosition(epoch=2),
            "scaler": GradScalerState(torch.amp.GradScaler("cpu"))}


def test_a_rank_other_than_0_stores_the_plain_keys_it_owns_and_no_others() -> None:
    """Rank 1 owns ``v``, the zero-size ``z``, ``cfg/a`` and an item of the list ``hist``.

    Mutants P1 (kept the keys it does not own), P3 (all values), P4 (no path of the list
    above a value), P21 (``z`` declared by nobody), P23 (the global scaler entry written by
    rank 1 too), P30 (rank 0's byte count), P31 (no staged keys reported).
    """
    flat = flatten_state(_state())
    keys = plain_keys(flat)
    owners = PlainOwners(keys, keys_digest(keys), frozenset({"v", "z", "cfg/a", "hist/1/0"}))
    plan = plan_save(flat, 1, {}, world=2, owners=owners)
    assert [(p.key, p.offsets, p.source is None) for p in plan.pieces] == [
        ("v", (0,), False), ("z", (0, 0), True)]
    assert plan.staged_plain == ["v", "z"] and plan.tensor_bytes == 3 * 4
    assert plan.plain_values == {"cfg/a": 1, "hist/1/0": 2}
    assert plan.plain_paths == {"hist": ["hist"]}
    # rank 0 writes the values entry (with what rank 1 sends it) and the global entries
    assert [(e.name, e.scope, e.policy) for e in plan.entries] == [("pos", "per_rank", "rank0")]


def test_rank_0_stores_every_plain_tensor_and_a_group_of_two_compares_them() -> None:
    """Mutant P2: a world of two planned no replica digests, so nothing was compared."""
    flat = flatten_state(_state())
    plan = plan_save(flat, 0, {}, world=2)
    assert [p.key for p in plan.pieces] == ["w", "v", "z"] and plan.tensor_bytes == 5 * 4
    assert set(plan.replicas) == {"w", "v", "z", "cfg/a", "cfg/b", "hist/0", "hist/1/0",
                                  "hist/1/1", "scaler"}
    assert plan_save(flat, 0, {}, world=1).replicas == {}


def test_a_tensor_of_replica_check_bytes_is_compared_whole() -> None:
    """Up to REPLICA_CHECK_BYTES the digest is the CRC32C of every byte (P5 sampled it)."""
    t = torch.arange(REPLICA_CHECK_BYTES // 4, dtype=torch.int32)
    digest = replica_digests(flatten_state({"t": t}))["t"]
    assert digest == f"int32[{t.numel()}]:{crc32c(t.numpy().tobytes()):08x}"


def test_small_tensors_past_the_total_budget_are_not_compared() -> None:
    """At most REPLICA_CHECK_TOTAL bytes are read per save (P7 never spent the budget)."""
    n = REPLICA_CHECK_TOTAL // REPLICA_CHECK_BYTES
    state = {f"t{i}": torch.full((REPLICA_CHECK_BYTES // 4,), float(i)) for i in range(n + 1)}
    digests = replica_digests(flatten_state(state))
    assert all(":" in digests[f"t{i}"] for i in range(n))
    assert digests[f"t{n}"] == f"float32[{REPLICA_CHECK_BYTES // 4}]"


def test_a_large_tensor_that_differs_in_its_last_element_is_told_apart() -> None:
    """The sample ends with the tensor's last bytes (mutant P8 sampled the slices only)."""
    a = torch.zeros(REPLICA_CHECK_BYTES)  # 4 MiB of float32: sampled
    b = a.clone()
    b[-1] = 1.0
    da, db = (replica_digests(flatten_state({"t": t}))["t"] for t in (a, b))
    assert da.startswith(f"float32[{a.numel()}]:s") and da != db


def test_a_large_tensor_past_the_budget_is_not_sampled() -> None:
    """Sampling costs budget too: none is left after REPLICA_CHECK_TOTAL bytes (mutant P33)."""
    n = REPLICA_CHECK_TOTAL // REPLICA_CHECK_BYTES
    state = {f"t{i}": torch.zeros(REPLICA_CHECK_BYTES // 4) for i in range(n)}
    state["big"] = torch.zeros(REPLICA_CHECK_BYTES)
    assert replica_digests(flatten_state(state))["big"] == f"float32[{REPLICA_CHECK_BYTES}]"


def test_a_sub_mesh_sample_includes_the_shards_last_element() -> None:
    """Mutant P13 sampled the spread elements alone: a change at the end went unseen."""
    t = torch.arange(1000, dtype=torch.int32)
    sample = _spread_sample(t, 0, {})
    assert sample.view(torch.int32)[-1].item() == 999


def test_diverged_compares_values_of_one_dtype_and_shape_only() -> None:
    """Mutants P10 (an entry some ranks lack was compared), P11 (a shape difference was taken
    for a value difference: it is a conflict), P12 (two kinds were no conflict)."""
    assert diverged([{"e": "entry:1"}, {}, {"e": "entry:2"}]) == []
    assert diverged([{"k": "float32[2]:aa"}, {"k": "float32[3]:bb"}]) == []
    assert diverged([{"k": "float32[2]:aa"}, {"k": "float32[2]:bb!p"}]) == ["k"]
    assert replica_conflicts([{"k": "float32[2]:aa"}, {"k": "value:01"}]) == [
        "'k' is float32[2] on some ranks, value on others"]


def test_copy_conflicts_compare_each_rank_with_its_holder_by_global_rank() -> None:
    """A group of global ranks 4 and 5: rank 5's copy is rank 4's (mutant P14 took the group
    index for the global rank; P15 missed values that differ)."""
    holder = [4, "s1", "v1", "w"]
    same = copy_conflicts([{"dp@4": holder}, {"dp@4": [4, "s1", "v1", "w"]}], [4, 5])
    assert same == []
    drifted = copy_conflicts([{"dp@4": holder}, {"dp@4": [4, "s1", "v2", "w"]}], [4, 5])
    assert len(drifted) == 1 and "which holds them with other values" in drifted[0]
    # group index 1 is global rank 5: a holder of global rank 1 is outside the group
    outside = copy_conflicts([{}, {"dp@1": [1, "s1", "v1", "w"]}], [4, 5])
    assert outside == ["rank 5 holds DTensors on a sub-mesh (dp) such as 'w', stored from "
                       "rank 1, which is not in the saving group"]


def test_module_parameters_are_marked_in_their_digest() -> None:
    """The mark makes a parameter that differs refuse the save (mutant P29 dropped it)."""
    model = torch.nn.Linear(2, 2)
    model.register_buffer("stat", torch.zeros(2))
    digests = replica_digests(flatten_state({"m": model}))
    assert digests["m/weight"].endswith("!p") and digests["m/bias"].endswith("!p")
    assert not digests["m/stat"].endswith("!p")


class _Mine(DataPosition):
    scope = "global"
    compare_ranks = False


def test_an_entry_left_out_of_the_rank_check_gets_no_digest() -> None:
    """``compare_ranks = False`` (the manager's bookkeeping) is not compared (mutant P28)."""
    digests = replica_digests(flatten_state({"book": _Mine(), "pos": GradScalerState(
        torch.amp.GradScaler("cpu"))}))
    assert "book" not in digests and digests["pos"].startswith("entry:")


def test_rank_0_plans_the_dcp_items_of_tensors_below_list_positions() -> None:
    """A state of tensors in a list, with no plain value: the items entry still records
    their DCP paths (mutant P26 wrote it only with values)."""
    plan = plan_save(flatten_state({"layers": [torch.ones(1), torch.ones(2)]}), 0, {})
    assert [e.name for e in plan.entries] == [DCP_ITEMS_ENTRY]


@pytest.mark.parametrize("name", [VALUES_ENTRY, DCP_ITEMS_ENTRY])
def test_an_entry_under_a_reserved_name_is_refused(name: str) -> None:
    """Mutant P27: it would have been written beside the adapter's own entry of that name."""
    with pytest.raises(UnsupportedValueError, match="is reserved; rename it"):
        plan_save(flatten_state({name: DataPosition()}), 0, {})


def test_rng_state_without_cuda_stores_no_cuda_generators() -> None:
    """``RNGState(cuda=False)`` drops the CUDA states of the snapshot (mutant P25)."""
    plan = plan_save(flatten_state({"rng": RNGState(cuda=False)}), 0,
                     {"torch_cpu": "AA==", "torch_cuda": ["AA=="]})
    assert plan.entries[0].value == {"torch_cpu": "AA==", "torch_cuda": None}
