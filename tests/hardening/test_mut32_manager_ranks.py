"""Mutation audit 32: the CheckpointManager's agreements between ranks, on real gloo groups.

Each test kills mutants of ``torch/_manager_decisions.py`` and ``torch/manager.py`` that the
manager suites let live: every rank saw the same failures at the same time there, so a rank's
own count or flag served as well as the agreed one. Here rank 0's background thread learns of a
failed save seconds after rank 1's (as when it is busy with a verification or a retention pass),
so only the agreement makes both ranks act alike at the same call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import portable_ckpt
import portable_ckpt.torch as pckt
from portable_ckpt.errors import CheckpointError
from portable_ckpt.torch.launch import run_group
from tests._corrupt import flip_read_buffer

pytestmark = pytest.mark.torch

#: How much later rank 0's background thread records each failed save.
LATE_S = 1.5


def _rank_zero_learns_late() -> None:
    """Rank 0 records each failed save LATE_S seconds after it failed (its thread is busy)."""
    import portable_ckpt.torch._manager_post as post

    real = post.after_failure

    def late(*args: Any, **kwargs: Any) -> None:
        time.sleep(LATE_S)
        real(*args, **kwargs)

    post.after_failure = late


def _failing(tier: Any) -> Any:
    from portable_ckpt.storage.faults import Fault, FaultyStorage

    full = FaultyStorage(tier.storage, [Fault(op="write", path="*/data/*", error="ENOSPC")])
    return dataclasses.replace(tier, storage=full)


def _count_agreed(rank: int, world: int, root: str) -> dict[str, Any]:
    """Rank 1's disk is full; rank 1 knows of each failure before its next call, rank 0 late."""
    from tests.manager._workers import Trainer

    tr = Trainer(world)
    mgr = pckt.CheckpointManager(root, save_every=1, max_failed_saves=2, timeout=15)
    durable = mgr.tiers["durable"]
    if rank == 1:
        mgr.tiers["durable"] = _failing(durable)
    else:
        _rank_zero_learns_late()
    out: dict[str, Any] = {"raised": None}
    t0 = time.monotonic()
    for step in range(1, 6):
        try:
            mgr.maybe_save(step, {"model": tr})
        except CheckpointError as e:
            out["raised"] = [step, e.code, e.message]
            break
        if rank == 1:
            for fut in list(mgr._post):
                fut.result()
    out["seconds"] = time.monotonic() - t0
    # The caller mends the disk and goes on, once rank 0's thread learned of both failures.
    for fut in list(mgr._post):
        fut.result()
    mgr.tiers["durable"] = durable
    try:
        out["after"] = mgr.maybe_save(4, {"model": tr})
        mgr.wait()
    except CheckpointError as e:
        out["after"] = [e.code, e.message]
    mgr.close()
    return out


def test_the_stop_after_max_failed_saves_is_agreed_when_one_rank_learns_late(
    tmp_path: Path,
) -> None:
    """Both ranks raise at step 3, the first agreement after the second failure, whatever rank
    0's thread knows by then. Its own count stopped it later (mutant D04: only rank 0's count
    sent), or one rank stopped alone and the other waited out the group's timeout in the next
    collective (D08, M02: a rank's own count instead of the agreed one). Once the disk is
    mended, the next save works: the failures rank 0 learned of after the stop were surfaced
    by it, and are not counted again (they stopped every rank a second time)."""
    res = run_group(_count_agreed, 2, (str(tmp_path / "r"),), timeout=120, pg_timeout=45)
    res.raise_for_errors()
    for rank, r in enumerate(res.results):
        assert r["raised"] is not None, (rank, r)
        step, code, message = r["raised"]
        assert (step, code) == (3, "PCK-DISTRIBUTED"), (rank, r)
        assert "2 durable checkpoints in a row failed" in message, (rank, r)
        # Rank 0 learns of the failures after the stop and named them "steps ?" (audit 32):
        # the agreement carries the first and last step any rank saw fail.
        named = ("(steps 1, 2; this rank's last error: [PCK-STORAGE]" if rank == 1 else
                 "(steps 1 to 2, as another rank saw them; this rank has not learned of a "
                 "failure yet)")
        assert named in message, (rank, r)
        assert r["seconds"] < 14, (rank, r)  # no rank waited for a collective's timeout (15 s)
        # The stop surfaced the failures of steps 1 and 2; rank 0 learned of them after it and
        # counted them again: the next call stopped every rank once more, for the same steps.
        assert r["after"] is True, (rank, r)
    committed = [v.step for v in portable_ckpt.list_versions(tmp_path / "r")
                 if v.status == "committed"]
    assert committed == [4]


def _fast_failure_agreed(rank: int, world: int, root: str, fast: str) -> dict[str, Any]:
    """replicate=True: rank 1's fast disk is full; rank 0 learns of the failure late."""
    from tests.manager._workers import Trainer

    tr = Trainer(world)
    mgr = pckt.CheckpointManager(
        root, save_every=1, fast_root=fast, replicate=True, async_save=True, timeout=15,
    )
    if rank == 1:
        mgr.tiers["fast"] = _failing(mgr.tiers["fast"])
    else:
        _rank_zero_learns_late()
    out: dict[str, Any] = {"error": None}
    for step in (1, 2):
        mgr.maybe_save(step, {"model": tr})
        if rank == 1:
            for fut in list(mgr._post):
                fut.result()
    try:
        mgr.wait()
    except CheckpointError as e:
        out["error"] = e.code
    mgr.close()
    out["saves"] = [[e["step"], e["tier"]] for e in mgr.telemetry.history if e["event"] == "save"]
    return out


def test_durable_saves_go_around_a_fast_tier_one_rank_knows_failed(tmp_path: Path) -> None:
    """With replicate=True, step 1 failed on the fast tier; at step 2 rank 1 knew it, rank 0
    not yet. The agreed flag sends both ranks' step 2 to the durable root directly. Each
    rank's own flag (mutants D07, M03) sent rank 0 to the fast tier and rank 1 to the durable
    root: the step failed, on both tiers."""
    root, fast = str(tmp_path / "r"), str(tmp_path / "f")
    res = run_group(_fast_failure_agreed, 2, (root, fast), timeout=120, pg_timeout=45)
    res.raise_for_errors()
    for rank, r in enumerate(res.results):
        assert r["error"] is None, (rank, r)  # the durable step 2 superseded step 1's failure
        assert r["saves"] == [[2, "durable"]], (rank, r)
    assert [(v.step, v.status) for v in portable_ckpt.list_versions(root)] == [(2, "committed")]
    assert [v.step for v in portable_ckpt.list_versions(fast) if v.status == "committed"] == []


def _one_rank_cannot_take_it(rank: int, world: int, root: str) -> dict[str, Any]:
    """Steps 1 and 2 saved, step 1 passed again; then rank 1's state holds a key no version has
    (an error of the target on one rank only)."""
    import io

    import torch

    from tests.manager._workers import Trainer

    tr = Trainer(world)
    out: dict[str, Any] = {"error": None}
    err = io.StringIO()
    with pckt.CheckpointManager(root, save_every=1, timeout=15) as mgr:
        for step in (1, 2):
            mgr.maybe_save(step, {"model": tr})
        with contextlib.redirect_stderr(err):
            out["again"] = mgr.maybe_save(1, {"model": tr})  # below the last save: not saved
    out["said"] = err.getvalue()
    state: dict[str, Any] = {"model": tr}
    if rank == 1:
        state["extra"] = torch.zeros(2)
    mgr = pckt.CheckpointManager(root, save_every=1, timeout=15)
    try:
        mgr.restore(state)
    except CheckpointError as e:
        out["error"] = [e.code, e.message]
    mgr.close()
    out["restores"] = [e for e in mgr.telemetry.history if e["event"] == "restore"]
    # A value no save can store, on rank 1 only, and max_failed_saves=None.
    mgr = pckt.CheckpointManager(root + "-bad", save_every=1, max_failed_saves=None, timeout=15)
    bad: dict[str, Any] = {"model": tr, **({"bad": object()} if rank == 1 else {})}
    mgr.maybe_save(1, bad)
    for fut in list(mgr._post):
        fut.result()
    out["unstorable"] = None
    try:
        mgr.maybe_save(2, {"model": tr})
    except CheckpointError as e:
        out["unstorable"] = e.code
    with contextlib.suppress(CheckpointError):
        mgr.close()
    return out


@pytest.fixture(scope="module")
def one_rank_cannot(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = str(tmp_path_factory.mktemp("mut32") / "r")
    res = run_group(_one_rank_cannot_take_it, 2, (root,), timeout=120, pg_timeout=45)
    res.raise_for_errors()
    return list(res.results)


def test_a_step_below_the_last_save_is_said_by_rank_zero_alone(
    one_rank_cannot: list[dict[str, Any]],
) -> None:
    """Rank 0 decides, and says once that a step below the last save is not saved; every rank
    deciding (mutant D02: each rank's clock and view, max-reduced) said it once per rank."""
    r0, r1 = one_rank_cannot
    assert r0["again"] is False and r1["again"] is False
    assert r0["said"].count("step 1 is not saved (save_every)") == 1, r0["said"]
    assert r1["said"] == "", r1["said"]


def test_a_target_error_on_one_rank_is_raised_on_every_rank_without_a_fallback(
    one_rank_cannot: list[dict[str, Any]],
) -> None:
    """Rank 1's state has a key no version holds: every version would fail alike, so every
    rank raises at the newest one. Whether any rank met an error of its target is agreed
    (any_rank); agreed as "every rank" (mutant D17), the ranks walked every version and
    raised "no version could be restored" instead of the error to fix."""
    r0, r1 = one_rank_cannot
    assert r1["error"][0] == "PCK-TENSOR-MISSING" and "'extra'" in r1["error"][1], r1
    assert r0["error"][0] == "PCK-DISTRIBUTED" and "PCK-TENSOR-MISSING" in r0["error"][1], r0
    for r in (r0, r1):
        assert "no version could be restored" not in r["error"][1], r
        assert r["restores"] == [], r  # no fallback was reported: the newest one raised


def test_a_value_no_save_can_store_on_one_rank_stops_every_rank(
    one_rank_cannot: list[dict[str, Any]],
) -> None:
    """With max_failed_saves=None a value no save can store stops the job all the same, at the
    next call, on every rank: the count that says so is agreed. Rank 1 holds the value; its
    own count alone (mutant M01) stopped rank 1, while rank 0 went on to save step 2 alone."""
    for rank, r in enumerate(one_rank_cannot):
        assert r["unstorable"] == "PCK-UNSUPPORTED-VALUE", (rank, r)


def _node_local_verified(rank: int, world: int, base: str) -> list[dict[str, Any]]:
    from tests.manager._workers import Trainer

    tr = Trainer(world)
    mgr = pckt.CheckpointManager(
        f"{base}/durable", fast_root=f"{base}/fast{{node}}", ranks_per_node=1, fast_every=1,
        verify_sample=1.0, timeout=15,
    )
    mgr.maybe_save(1, {"model": tr})
    mgr.close()
    return [e for e in mgr.telemetry.history if e["event"] == "verify"]


def test_a_node_local_fast_tier_is_verified_without_replicate(tmp_path: Path) -> None:
    """verify_sample on a node-local fast tier needs the background group as replicate=True
    does: each rank reads its share, and every node root records the same outcome, with rank
    0's seed. Made for replicate only (mutant M04), nothing was verified and nothing said;
    each rank's own seed (N08) gave every node a record of its own."""
    import json

    res = run_group(_node_local_verified, 2, (str(tmp_path),), timeout=120, pg_timeout=45)
    res.raise_for_errors()
    [event] = res.results[0]
    assert event["ok"] and len(event["chunks_by_rank"]) == 2, event
    assert all(c > 0 for c in event["chunks_by_rank"]), event
    records = []
    for node in ("fast0", "fast1"):
        [v] = portable_ckpt.list_versions(tmp_path / node)
        [record] = Path(v.path, "verifications").iterdir()
        records.append(json.loads(record.read_text()))
    assert records[0]["seed"] == records[1]["seed"], records


def _queued_behind_a_broken_group(rank: int, world: int, base: str) -> dict[str, Any]:
    """Rank 1's copy share of step 2 outlasts the background group's timeout (3 s); step 3's
    replication is queued behind it when the loop ends and closes the manager."""
    import torch

    from tests.manager._workers import _slow_share_of_step_2

    _slow_share_of_step_2(rank)
    mgr = pckt.CheckpointManager(
        f"{base}/durable", fast_root=f"{base}/fast{{node}}", ranks_per_node=1, replicate=True,
        save_every=1, timeout=3, continuation="statistical", max_failed_saves=None,
        handle_sigterm=False, decision_interval=0,
    )
    state = {"x": torch.arange(4.0)}
    for step in (1, 2, 3):
        mgr.maybe_save(step, state)
    out: dict[str, Any] = {"closed": None}
    try:
        mgr.close()
    except CheckpointError as e:
        out["closed"] = [e.code, e.message]
    out["committed"] = [v.step for v in portable_ckpt.list_versions(f"{base}/durable")
                        if v.status == "committed"]
    return out


def test_a_replication_queued_behind_a_broken_group_at_close_is_a_failure(
    tmp_path: Path,
) -> None:
    """The group broke under step 2's replication and is made anew only at the ranks' next
    agreement, which never comes once the loop closes the manager: step 3's replication
    cannot run, and close() raises that (the durable checkpoint of step 3 does not exist).
    Without the check (mutant P13) it ran without a group, did nothing, and close() named
    only step 2."""
    res = run_group(_queued_behind_a_broken_group, 2, (str(tmp_path),), timeout=120,
                    pg_timeout=45)
    res.raise_for_errors()
    for rank, r in enumerate(res.results):
        assert r["committed"] == [1], (rank, r)
        code, message = r["closed"]
        assert code == "PCK-DISTRIBUTED", (rank, r)
        assert "replication of s000000000003-" in message, (rank, r)
        assert "broke on earlier work" in message, (rank, r)


def _durable_publish_fails(rank: int, world: int, base: str) -> dict[str, Any]:
    """Node-local replication whose durable commit record rank 0 cannot publish."""
    import torch

    from portable_ckpt.errors import StorageError

    mgr = pckt.CheckpointManager(
        f"{base}/durable", fast_root=f"{base}/fast{{node}}", ranks_per_node=1, replicate=True,
        save_every=1, timeout=15, continuation="statistical", max_failed_saves=None,
    )
    if rank == 0:
        durable = mgr.tiers["durable"].storage

        def refused(path: str, data: bytes) -> bool:
            raise StorageError(f"create {path!r}: Permission denied (errno 13)")

        durable.create_if_absent = refused  # type: ignore[method-assign]
    mgr.maybe_save(1, {"x": torch.arange(4.0)})
    for fut in list(mgr._post):
        fut.result()
    out = {"failed": mgr._failed_saves, "error": repr(mgr.last_error)}
    with contextlib.suppress(CheckpointError):
        mgr.close()
    return out


def test_a_durable_record_rank_0_could_not_publish_fails_the_replication_on_every_rank(
    tmp_path: Path,
) -> None:
    """Every file was copied, but rank 0 could not publish the durable commit record: the
    outcome is broadcast, every rank counts the failure and names it, and no node root records
    a copy that does not exist. Not broadcast (mutant N04), rank 1 called it a success and
    wrote a copy record in its node root (`gc --require-copy` would then let the fast version
    go, the only one)."""
    res = run_group(_durable_publish_fails, 2, (str(tmp_path),), timeout=120, pg_timeout=45)
    res.raise_for_errors()
    for rank, r in enumerate(res.results):
        assert r["failed"] == 1, (rank, r)
        assert "failed on rank 0" in r["error"] and "Permission denied" in r["error"], (rank, r)
    for node in ("fast0", "fast1"):
        [v] = portable_ckpt.list_versions(tmp_path / node)
        assert v.status == "committed" and not v.copied, node
    assert [v.status for v in portable_ckpt.list_versions(tmp_path / "durable")] != ["committed"]


def _copy_share_longer_than_timeout(rank: int, world: int, base: str) -> dict[str, Any]:
    """Rank 1's copy share takes 5 s; the manager's timeout (steps' skew) is 3 s."""
    import torch

    import portable_ckpt.torch._manager_nodelocal as nl

    real = nl._copy_files

    def slow(src: Any, dst: Any, attempt: str, recs: Any) -> Any:
        if rank == 1:
            time.sleep(5.0)
        return real(src, dst, attempt, recs)

    nl._copy_files = slow
    mgr = pckt.CheckpointManager(
        f"{base}/durable", fast_root=f"{base}/fast{{node}}", ranks_per_node=1, replicate=True,
        save_every=1, timeout=3, continuation="statistical", async_save=False,
    )
    mgr.maybe_save(1, {"x": torch.arange(4.0)})
    out = {"error": None if mgr.last_error is None else repr(mgr.last_error)}
    mgr.close()
    return out


def test_a_node_copy_share_longer_than_the_timeout_replicates(tmp_path: Path) -> None:
    """timeout= bounds the ranks' skew between steps; a node's share of a replication takes as
    long as its bytes take, so the background group waits at least BACKGROUND_TIMEOUT_S.
    With the manager's timeout (mutant N12) the 5 s share broke the group at 3 s and the
    replication failed (race review F5)."""
    res = run_group(_copy_share_longer_than_timeout, 2, (str(tmp_path),), timeout=120,
                    pg_timeout=45)
    res.raise_for_errors()
    assert [r["error"] for r in res.results] == [None, None], res.results
    assert [(v.step, v.status) for v in portable_ckpt.list_versions(tmp_path / "durable")] == [
        (1, "committed")
    ]


def _node_zero_lost_its_root(rank: int, world: int, base: str) -> dict[str, Any]:
    """Two nodes of one rank, fast_replicas=1, steps 1 and 2 on the fast tier only; node 0's
    disk is replaced (its root empty) before the restart."""
    import shutil

    import torch
    import torch.distributed as dist

    kw: dict[str, Any] = {"fast_root": f"{base}/fast{{node}}", "ranks_per_node": 1,
                          "fast_replicas": 1, "fast_every": 1, "timeout": 15,
                          "continuation": "statistical"}
    with pckt.CheckpointManager(f"{base}/durable", **kw) as mgr:
        for step in (1, 2):
            mgr.maybe_save(step, {"x": torch.arange(4.0) * step})
    dist.barrier()
    if rank == 0:
        shutil.rmtree(f"{base}/fast0")
    dist.barrier()
    target = {"x": torch.zeros(4)}
    mgr = pckt.CheckpointManager(f"{base}/durable", **kw)
    info = mgr.restore(target)
    mgr.close()
    ev = next(e for e in mgr.telemetry.history if e["event"] == "restore")
    return {"step": None if info is None else info.step, "tier": ev["tier"],
            "x": target["x"].tolist()}


def test_a_version_only_another_node_root_holds_is_restored(tmp_path: Path) -> None:
    """Node 0's root is empty after a disk replacement; node 1 holds step 2 and, as its
    replica, node 0's files: every rank lists its own node root, so step 2 is a candidate and
    is restored. Listed by rank 0 alone (mutant R01), the fast tier looked empty and the job
    started from scratch (restore() returned None)."""
    res = run_group(_node_zero_lost_its_root, 2, (str(tmp_path),), timeout=120, pg_timeout=45)
    res.raise_for_errors()
    for rank, r in enumerate(res.results):
        assert (r["step"], r["tier"]) == (2, "fast"), (rank, r)
        assert r["x"] == [0.0, 2.0, 4.0, 6.0], (rank, r)


def _node_records_unreadable(rank: int, world: int, base: str) -> dict[str, Any]:
    """Step 1 on a node-local fast tier; at the restart node 0 may not read its commit record
    (a permission), node 1 meets an EIO."""
    import torch

    from portable_ckpt.storage.faults import Fault, FaultyStorage

    kw: dict[str, Any] = {"fast_root": f"{base}/fast{{node}}", "ranks_per_node": 1,
                          "fast_every": 1, "timeout": 15, "continuation": "statistical"}
    with pckt.CheckpointManager(f"{base}/durable", **kw) as mgr:
        mgr.maybe_save(1, {"x": torch.arange(4.0)})
    mgr = pckt.CheckpointManager(f"{base}/durable", **kw)
    fast = mgr.tiers["fast"]
    fault = Fault(op="read", path="*/manifest.json", error="EACCES" if rank == 0 else "EIO")
    mgr.tiers["fast"] = dataclasses.replace(fast, storage=FaultyStorage(fast.storage, [fault]))
    out: dict[str, Any] = {"error": None}
    try:
        mgr.restore({"x": torch.zeros(4)})
    except CheckpointError as e:
        out["error"] = [e.code, e.retryable, e.message]
    mgr.close()
    return out


def test_a_permission_one_node_met_is_not_hidden_by_another_nodes_transient_error(
    tmp_path: Path,
) -> None:
    """Each rank lists its own node root: node 0 may not read the record (not retryable, a
    person mends it), node 1 met an EIO (retryable). The problem a person must mend stands, on
    every rank, so a restart loop does not retry it for good. The later rank's row winning
    (mutant R02) said "retry" everywhere (review of stop 23, E8)."""
    res = run_group(_node_records_unreadable, 2, (str(tmp_path),), timeout=120, pg_timeout=45)
    res.raise_for_errors()
    for rank, r in enumerate(res.results):
        code, retryable, message = r["error"]
        assert (code, retryable) == ("PCK-STORAGE", False), (rank, r)
        assert "mend what the error names" in message and "EACCES" in message, (rank, r)


def _flip_next_reads(n: int) -> list[int]:
    """The next ``n`` reads of a data file by this process flip one bit in memory (a flaky
    NIC): the file itself is intact."""
    from portable_ckpt.storage.local import LocalStorage

    left = [n]
    for name in ("read_into", "read_into_many", "read_extents"):
        orig = getattr(LocalStorage, name)

        def wrapped(self: Any, path: str, *a: Any, _orig: Any = orig, **k: Any) -> Any:
            out = _orig(self, path, *a, **k)
            if left[0] > 0 and "/data/" in path and flip_read_buffer(a[-1]):
                left[0] -= 1
            return out

        setattr(LocalStorage, name, wrapped)
    return left


def _flips_on_rank_zero(rank: int, world: int, root: str) -> dict[str, Any]:
    """Steps 1 and 2; at the restore rank 0's first two reads of step 2 meet a flipped bit."""
    import torch

    kw: dict[str, Any] = {"save_every": 1, "async_save": False, "timeout": 15,
                          "continuation": "statistical"}
    with pckt.CheckpointManager(root, **kw) as mgr:
        for step in (1, 2):
            mgr.maybe_save(step, {"w": torch.arange(4096.0) + step})
    left = _flip_next_reads(2 if rank == 0 else 0)
    target = {"w": torch.zeros(4096)}
    mgr = pckt.CheckpointManager(root, **kw)
    out: dict[str, Any] = {"error": None}
    try:
        mgr.restore(target)
    except CheckpointError as e:
        out["error"] = [e.code, e.message]
    mgr.close()
    out["left"], out["w0"] = left[0], float(target["w"][0])
    return out


def test_damage_rank_0_cannot_find_again_stops_the_restore_on_every_rank(tmp_path: Path) -> None:
    """Both loads of step 2 failed (rank 0 read a flipped bit twice); rank 0's third read found
    the file intact: nothing is known of the bytes, so no rank may resume step 1. The verdict
    is rank 0's, broadcast; rank 1's own ("pass", mutant R03) took it to step 1 while rank 0
    stopped, and it waited out the group's timeout alone."""
    root = str(tmp_path / "r")
    res = run_group(_flips_on_rank_zero, 2, (root,), timeout=120, pg_timeout=45)
    res.raise_for_errors()
    assert res.results[0]["left"] == 0, res.results[0]
    for rank, r in enumerate(res.results):
        code, message = r["error"]
        assert code == "PCK-STORAGE" and "not found again by a third read" in message, (rank, r)
        assert r["w0"] != 1.0, (rank, r)  # step 1 was not loaded instead
    assert not any(v.verification_failed for v in portable_ckpt.list_versions(root))


def _passed_over_on_two_ranks(rank: int, world: int, root: str) -> dict[str, Any]:
    """Twelve versions saved on two ranks, all but step 3's failed verification; a second
    manager restores on both ranks."""
    import torch
    import torch.distributed as dist

    from portable_ckpt.io.annotations import write_verification_record
    from portable_ckpt.storage import open_storage

    with pckt.CheckpointManager(root, save_every=1, async_save=False, keep_last=None,
                                continuation="statistical") as mgr:
        for step in range(1, 13):
            mgr.save(step, {"w": torch.full((4,), float(step))})
    if rank == 0:
        for v in portable_ckpt.list_versions(root):
            if v.step != 3:
                write_verification_record(
                    open_storage(root), v.id, ok=False, mode="deep", fraction=None, chunks=1,
                    verifier="test", errors=[{"code": "PCK-CHECKSUM", "message": "x"}])
    dist.barrier()
    back = {"w": torch.zeros(4)}
    with pckt.CheckpointManager(root, save_every=1, keep_last=None,
                                continuation="statistical") as mgr:
        info = mgr.restore(back)
    assert info is not None
    return {"step": info.step, "named": [r["step"] for r in info.passed_over],
            "more": info.passed_over_more, "w": back["w"].tolist()}


def test_the_versions_passed_over_are_the_same_on_every_rank(tmp_path: Path) -> None:
    """Stop 32's audit listed ``passed_over_more`` as wrong on ranks other than 0: rank 0 finds
    the versions passed over and broadcasts them, so every rank names the same eight newest
    and counts the ninth (steps 4-12 failed verification; step 3 is restored)."""
    res = run_group(_passed_over_on_two_ranks, 2, (str(tmp_path / "r"),), timeout=120,
                    pg_timeout=45)
    res.raise_for_errors()
    for rank, r in enumerate(res.results):
        assert r == {"step": 3, "named": [12, 11, 10, 9, 8, 7, 6, 5], "more": 1,
                     "w": [3.0] * 4}, (rank, r)
