"""``CheckpointManager.restore``: the newest committed, verified version over both tiers.

Rank 0 ranks the candidates (newest step first, the fast tier first on ties; a node-local fast
tier is listed by every rank) and broadcasts them; every rank tries them in that order. A
damaged, partial or unreachable version falls back to the next one, and every rank takes part in
that agreement; an error of the caller's target state (contract, shapes, keys) would repeat on
every version, so it is raised at once everywhere.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from portable_ckpt.errors import (
    CheckpointError,
    ContractError,
    DistributedError,
    EntryMissingError,
    FileMissingError,
    TensorMissingError,
    UnsupportedValueError,
    UsageError,
)
from portable_ckpt.io.versions import list_versions, timestamp_key
from portable_ckpt.torch._collectives import make_comm
from portable_ckpt.torch._manager_decisions import any_rank, broadcast_json
from portable_ckpt.torch._manager_tiers import Tier
from portable_ckpt.torch._nodelocal import prepare_fast_restore
from portable_ckpt.torch.info import LoadInfo
from portable_ckpt.torch.loading import load

if TYPE_CHECKING:
    from portable_ckpt.torch.manager import CheckpointManager

__all__ = ["after_restore", "candidates", "restore"]

_log = logging.getLogger("portable_ckpt")
_MIB = float(1 << 20)
#: Errors of the caller's target state: every version would fail the same way (no fallback).
_CALLER_ERRORS = (
    ContractError,
    UsageError,
    TensorMissingError,
    EntryMissingError,
    UnsupportedValueError,
)


def _fallback(tier: str, ident: str, e: CheckpointError) -> dict[str, Any]:
    """A restore candidate that failed, as telemetry reports it."""
    return {"tier": tier, "checkpoint_id": ident, "code": e.code, "message": e.message[:500]}


def listing(mgr: CheckpointManager, name: str, step: int | None) -> list[list[Any]]:
    """``[step, committed_at, id]`` of this rank's view of a tier: restorable versions."""
    tier = mgr.tiers[name]
    try:
        versions = list_versions(tier.storage)
    except CheckpointError as e:
        _log.warning("cannot list the %s tier %s: %s", name, tier.root, e)
        return []
    return [
        [v.step, v.committed_at, v.id]
        for v in versions
        if v.status == "committed"
        and not v.verification_failed
        and (step is None or v.step == step)
    ]


def candidates(mgr: CheckpointManager, step: int | None) -> list[tuple[str, str]]:
    """``(tier, attempt id)`` newest first over both tiers (fast first on ties), everywhere.

    A node-local fast tier is listed by every rank (its own node root): a version any node
    holds is a candidate; whether every rank can reach its bytes is settled when it is tried.
    """
    found: dict[tuple[str, str], tuple[int, tuple[int, int], int]] = {}
    fast = mgr.tiers.get("fast")
    views: list[tuple[int, str, list[list[Any]]]] = []
    if fast is not None and fast.layout is not None:
        comm = make_comm(mgr.process_group, mgr.timeout)
        for seen in comm.allgather_json(listing(mgr, "fast", step), "restore/fast-list"):
            views.append((1, "fast", seen))
    elif fast is not None and mgr.rank == 0:
        views.append((1, "fast", listing(mgr, "fast", step)))
    if mgr.rank == 0:
        views.append((0, "durable", listing(mgr, "durable", step)))
    for order, name, rows in views:
        for v_step, committed_at, ident in rows:
            found[(name, ident)] = (int(v_step), timestamp_key(committed_at), order)
    ranked = sorted(found.items(), key=lambda kv: kv[1], reverse=True)
    local = [(name, ident) for (name, ident), _ in ranked]
    return [
        tuple(c) for c in broadcast_json(mgr._group, mgr.rank, local if mgr.rank == 0 else None)
    ]


def restore(
    mgr: CheckpointManager,
    state: Mapping[str, Any],
    step: int | None,
    checkpoint: str | os.PathLike[str] | None,
    allow_statistical: bool,
    record_ranges: bool,
) -> LoadInfo | None:
    """The body of :meth:`CheckpointManager.restore` (see there)."""
    t0 = time.perf_counter()
    if checkpoint is not None:
        cands = [("explicit", os.fspath(checkpoint))]
    else:
        cands = candidates(mgr, step)
    fallbacks: list[dict[str, Any]] = []
    for tier_name, ident in cands:
        try:
            info = load_one(mgr, state, tier_name, ident, allow_statistical, record_ranges)
        except Exception as e:
            fallbacks.append(_fallback(tier_name, ident, _fall_back_or_raise(mgr, e)))
            _log.warning(
                "restore of %s from the %s tier failed (%s); trying the next candidate",
                ident,
                tier_name,
                e,
            )
            continue
        after_restore(mgr, info, tier_name, t0, fallbacks)
        return info
    _nothing_restored(mgr, t0, fallbacks, len(cands))
    return None


def _fall_back_or_raise(mgr: CheckpointManager, e: Exception) -> CheckpointError:
    """Return ``e`` when every rank may try the next candidate; re-raise it otherwise.

    Every rank takes part in this agreement, whatever it saw: one rank's damage is its peers'
    PCK-DISTRIBUTED, and an error of the target state (contract, shapes, keys) would repeat on
    every version, so it is raised everywhere.
    """
    caller = not isinstance(e, CheckpointError) or isinstance(e, _CALLER_ERRORS)
    if any_rank(mgr._group, caller) or not isinstance(e, CheckpointError):
        raise e
    return e


def _nothing_restored(
    mgr: CheckpointManager, t0: float, fallbacks: list[dict[str, Any]], n: int
) -> None:
    """No version restored: ``None`` for an empty job (first run), an error if all failed."""
    mgr.telemetry.emit(
        "restore",
        ok=not fallbacks,
        tier=None,
        step=None,
        seconds=round(time.perf_counter() - t0, 6),
        fallbacks=fallbacks,
        candidates=n,
    )
    if fallbacks:
        raise DistributedError(
            f"no version could be restored: {len(fallbacks)} candidate(s) failed, last "
            f"{fallbacks[-1]['checkpoint_id']} ({fallbacks[-1]['code']}: "
            f"{fallbacks[-1]['message']})"
        )


def load_one(
    mgr: CheckpointManager,
    state: Mapping[str, Any],
    tier_name: str,
    ident: str,
    allow_statistical: bool,
    record_ranges: bool = False,
) -> LoadInfo:
    """Load one candidate (a version directory, or an attempt of a tier)."""
    kwargs: dict[str, Any] = {
        "process_group": mgr.process_group,
        "allow_statistical": allow_statistical,
        "timeout": mgr.timeout,
        "record_ranges": record_ranges,
    }
    if tier_name == "explicit":
        return load(state, ident, **kwargs)  # a version directory
    tier = mgr.tiers[tier_name]
    if tier.layout is not None:
        reach_node_local(mgr, tier, state, ident)
    return load(state, tier.storage, checkpoint_id=ident, **kwargs)


def reach_node_local(
    mgr: CheckpointManager, tier: Tier, state: Mapping[str, Any], ident: str
) -> None:
    """Make the bytes every rank needs present in its node root, or raise (fallback)."""
    from portable_ckpt.format import jsonio

    if tier.layout is None:  # pragma: no cover - only called for node-local tiers
        return
    comm = make_comm(mgr.process_group, mgr.timeout)
    rel = f"{ident}/manifest.json"
    mine = None
    if tier.storage.exists(rel):
        raw = tier.storage.read_all(rel, max_size=jsonio.MAX_MANIFEST_BYTES)
        mine = raw.decode("utf-8")
    text = next((t for t in comm.allgather_json(mine, "restore/fast-manifest") if t), None)
    if text is None:
        raise FileMissingError(f"no node root of the fast tier holds {rel}", path=rel)
    usable, report = prepare_fast_restore(comm, tier.layout, tier.storage, ident, state, text)
    mgr._fetched = report
    if not usable:
        raise FileMissingError(
            f"fast tier version {ident}: {report['unreachable']} file(s) a rank needs are on "
            f"no reachable node root ({report['missing']} missing before fetching)",
            path=ident,
        )


def after_restore(
    mgr: CheckpointManager,
    info: LoadInfo,
    tier_name: str,
    t0: float,
    fallbacks: list[dict[str, Any]],
) -> None:
    """Start the time-to-resume clock; report the restore (bytes, seconds, slowest rank)."""
    mgr._last_save_step = info.step
    mgr._last_save_time = time.time()
    mgr._restored_at = time.perf_counter()
    per = info.per_rank or [info.counters()]
    slowest = max(range(len(per)), key=lambda r: float(per[r].get("seconds", 0.0)))
    total = sum(int(p.get("bytes_read", 0)) for p in per)
    seconds = time.perf_counter() - t0
    mgr.telemetry.emit(
        "restore",
        ok=True,
        tier=tier_name,
        step=info.step,
        checkpoint_id=info.checkpoint_id,
        contract=info.contract,
        seconds=round(seconds, 6),
        bytes=total,
        mib_per_s=round(total / _MIB / seconds, 3) if seconds > 0 else 0.0,
        slowest_rank=slowest,
        slowest_rank_seconds=round(float(per[slowest].get("seconds", 0.0)), 6),
        fallbacks=fallbacks,
        fetched_from_peers=mgr._fetched,
    )
    mgr._fetched = None
