"""Mutation audit 29, the collective save's decisions (:mod:`portable_ckpt.torch.saving`).

The pure parts of the protocol, called as the save calls them: when writers describe their
ranges in tensor tables, which contract a save ends with when ranks differ, when a rank plans
again after the owners exchange, and how rank 0 merges the plain values other ranks store.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import portable_ckpt  # noqa: E402
import portable_ckpt.torch as pckt  # noqa: E402
from portable_ckpt.errors import MetadataConflictError  # noqa: E402
from portable_ckpt.format.keys import DCP_ITEMS_ENTRY, VALUES_ENTRY, read_dcp_items  # noqa: E402
from portable_ckpt.io.tensor_table import TABLE_THRESHOLD  # noqa: E402
from portable_ckpt.torch._owners import PlainOwners  # noqa: E402
from portable_ckpt.torch.flatten import flatten_state  # noqa: E402
from portable_ckpt.torch.launch import run_group  # noqa: E402
from portable_ckpt.torch.plan import plan_save  # noqa: E402
from portable_ckpt.torch.saving import (  # noqa: E402
    SaveOptions,
    _contract_of,
    _same_owned,
    _take_from_others,
)

ROOT = str(Path(__file__).resolve().parents[2])


def test_tensor_tables_follow_the_ranges_of_the_whole_job() -> None:
    """Every writer of a job whose writers hold more than TABLE_THRESHOLD ranges in all uses a
    table, whatever its own share (mutant S1 counted one writer's); a node-local publisher
    never does (mutant S2: its table would sit on one node only)."""
    opts = SaveOptions(step=1)
    half = TABLE_THRESHOLD // 2 + 1
    assert opts.writer_options(half, 2)["tensor_table"] is True
    assert opts.writer_options(half, 1)["tensor_table"] is False
    node_local = SaveOptions(step=1, tensor_table=True, publisher=object())
    assert node_local.writer_options(half, 2)["tensor_table"] is False


def test_a_statistical_save_keeps_its_contract_when_ranks_differ() -> None:
    """Differing parameters refuse only an exact save; one asked to be statistical stores
    rank 0's copy (mutant S6 refused it too, telling the caller to pass what it passed)."""
    statistical = SaveOptions(step=1, continuation="statistical")
    assert _contract_of(statistical, 0, ["m/w"], ["m/w"]) is statistical
    with pytest.raises(MetadataConflictError, match="model parameters that are plain tensors"):
        _contract_of(SaveOptions(step=1), 1, ["m/w"], ["m/w"])  # mutant S7 stored rank 0's
    exact = _contract_of(SaveOptions(step=1), 1, ["bn/mean"], [])
    assert exact.continuation == "statistical"


def test_a_rank_plans_again_when_the_keys_it_owns_changed() -> None:
    """Mutant S3 kept the plan staged by the last exchange's record."""
    a = PlainOwners(("x", "y"), (2, 1), frozenset({"x"}))
    assert _same_owned(a, PlainOwners(("x", "y"), (2, 1), frozenset({"x"})))
    assert not _same_owned(a, PlainOwners(("x", "y"), (2, 1), frozenset({"y"})))
    assert not _same_owned(a, None) and _same_owned(None, None)


def test_rank_0_merges_the_values_other_ranks_store_with_its_own() -> None:
    """Rank 0 writes ``torch.values`` with its own values and those rank 1 sent, and the
    items entry with both ranks' DCP paths (mutants S4 kept only rank 1's values, S5 only
    rank 1's paths)."""
    plan = plan_save(flatten_state({"a": 1, "hist": [1, 2], "w": torch.ones(1)}), 0, {})
    sent = [{}, {"values": {"b": 2}, "paths": {"l": ["l"]}}]
    _take_from_others(plan, sent)
    entries = {e.name: e for e in plan.entries}
    assert entries[VALUES_ENTRY].value == {"a": 1, "hist/0": 1, "hist/1": 2, "b": 2}
    assert dict(read_dcp_items(entries[DCP_ITEMS_ENTRY].value) or {}) == {
        "hist": ("hist",), "l": ("l",)}


def test_the_block_size_asked_for_is_the_files_checksum_block(tmp_path: Path) -> None:
    """Mutant S16 dropped ``block_size`` and chose one per file."""
    pckt.save({"w": torch.ones(10_000)}, tmp_path, step=1, continuation="statistical",
              block_size=8192)
    files = portable_ckpt.open(tmp_path).manifest.files.values()
    assert {f.checksum.block_size for f in files} == {8192}


def test_max_file_bytes_starts_a_new_shard_file(tmp_path: Path) -> None:
    """Mutant S17 wrote every tensor into one file of the default 4 GiB limit."""
    state = {f"t{i}": torch.full((256,), float(i)) for i in range(4)}  # 1 KiB each
    pckt.save(state, tmp_path, step=1, continuation="statistical", max_file_bytes=1500)
    ck = portable_ckpt.open(tmp_path)
    data = [p for p in ck.manifest.files if p.startswith("data/")]
    assert len(data) >= 3
    assert all(ck.read(f"t{i}").tolist() == [float(i)] * 256 for i in range(4))


def _exact_without_rng(rank: int, world: int, root: str) -> str:
    """Rank ``rank`` of 2 saves an exact version without RNG state; returns what it said."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        pckt.save({"w": torch.ones(2)}, root, step=1, timeout=30)
    return err.getvalue()


def test_only_rank_0_says_that_an_exact_version_holds_no_rng(tmp_path: Path) -> None:
    """One line for the job (mutant S11 let every rank say it)."""
    res = run_group(f"{__name__}:_exact_without_rng", 2, (str(tmp_path),), timeout=120,
                    pg_timeout=45, sys_path=[ROOT])
    res.raise_for_errors()
    said = list(res.results)
    assert said[0].count("holds no RNGState()") == 1 and said[1] == ""


def _owner_moves(rank: int, world: int, root: str) -> list[float]:
    """Two saves of 2 ranks: ``y`` is rank 1's alone, then both ranks hold it."""
    y = torch.full((2,), float(rank + 1))
    pckt.save({"x": torch.ones(1), **({"y": y} if rank == 1 else {})}, root, step=1,
              continuation="statistical", timeout=30)
    info = pckt.save({"x": torch.ones(1), "y": y}, root, step=2, continuation="statistical",
                     timeout=30)
    return [float(v) for v in portable_ckpt.open(info.path).read("y")]


def test_a_rank_whose_owned_keys_moved_since_the_last_save_plans_again(tmp_path: Path) -> None:
    """Rank 1 staged ``y`` by the last exchange's record; now rank 0 holds it too and stores
    it. Rank 1 plans again and leaves it to rank 0 (mutant S3/S13 kept the stale plan)."""
    res = run_group(f"{__name__}:_owner_moves", 2, (str(tmp_path),), timeout=120,
                    pg_timeout=45, sys_path=[ROOT])
    res.raise_for_errors()
    assert list(res.results) == [[1.0, 1.0]] * 2
