"""After a commit, on the manager's background thread: telemetry, verification, replication, retention.

Each rank reports its save (pause, throughput); rank 0 reports the commit (expected and reported
writers, or the failure code), runs the sampled verification (a record beside the version),
starts the background copy to the durable root and applies retention through the core gc
(never the newest committed or drilled version, a save in flight, or anything unclassified).
A node-local tier's node leaders each keep their own node root.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from portable_ckpt.errors import (
    DAMAGE_CODES,
    CheckpointError,
    CommitOutcomeUnknownError,
    DistributedError,
    UnsupportedValueError,
    error_for_code,
)
from portable_ckpt.manager.decisions import Decision
from portable_ckpt.manager.pinning import sync_pins
from portable_ckpt.manager.records import candidates_of
from portable_ckpt.manager.retention import RetentionDecision, plan_retention
from portable_ckpt.torch._inflight import say
from portable_ckpt.torch._manager_tiers import Tier
from portable_ckpt.torch.async_saving import AsyncSaveHandle
from portable_ckpt.torch.info import CheckpointInfo

if TYPE_CHECKING:
    from portable_ckpt.torch._collectives import Comm
    from portable_ckpt.torch.manager import CheckpointManager

__all__ = [
    "after_failure",
    "after_save",
    "copy_failed",
    "durable_failed",
    "durable_ok",
    "failure_text",
    "note_commit",
    "replicate",
    "replicate_nodes",
    "retain",
    "too_many_failures",
    "verify",
    "verify_nodes",
]

_log = logging.getLogger("portable_ckpt")
_MIB = float(1 << 20)


def after_save(
    mgr: CheckpointManager,
    step: int,
    tier: Tier,
    decision: Decision,
    handle: AsyncSaveHandle | None,
    info: CheckpointInfo | None,
    pause: float,
    comm: Comm | None = None,
    seq: int | None = None,
) -> None:
    """Report a save (every rank), then rank 0's commit, verification, copy and retention.

    ``comm``: the background group as it was when the save was started (every rank took it
    at the same call, so every rank's background thread uses the same one). ``seq``: the
    save's number in this manager (``CheckpointManager._saves_started`` when it started).
    """
    with mgr._retain_lock:
        mgr._saves_queued[tier.name] -= 1  # now the saves queued behind this one
    if handle is not None:
        try:
            info = handle.committed.result()
        except CheckpointError as e:
            after_failure(mgr, step, tier, decision, e, seq=seq)
            if not isinstance(e, CommitOutcomeUnknownError):
                # (an unknown outcome may be a version: a pass would count it as the newest
                # and delete the last durable one; the pass stays owed: re-attack 27, 1)
                _owed_retention(mgr, tier)
            return
        except BaseException as e:  # pragma: no cover - non-checkpoint failure
            after_failure(mgr, step, tier, decision, DistributedError(str(e)), seq=seq)
            return  # (whether it committed is not known: the pass stays owed)
    if info is None:  # pragma: no cover - guarded by the callers
        return
    with mgr._retain_lock:
        mgr._handled[tier.name] = info.checkpoint_id
    if tier.name == "fast":
        mgr._fast_failed = False
    elif mgr._fast_failing:  # a durable save that went around a failing fast tier
        mgr._direct_saves += 1
        if mgr._direct_saves >= FAST_RETRY_AFTER:
            # tried again: a job without fast_every saves nothing else there (review F2)
            mgr._fast_failed, mgr._direct_saves = False, 0
    if tier.name == "durable":
        durable_ok(mgr)  # with replicate=True the durable version exists once it is copied
    mib_s = info.bytes_written / _MIB / info.seconds if info.seconds > 0 else 0.0
    mgr.telemetry.emit(
        "save",
        tier=tier.name,
        step=step,
        checkpoint_id=info.checkpoint_id,
        reason=decision.reason,
        mode="sync" if handle is None else "async",
        pause_s=round(pause, 6),
        seconds=round(info.seconds, 6),
        bytes=info.bytes_written,
        total_bytes=info.total_bytes,
        mib_per_s=round(mib_s, 6),
    )
    if tier.layout is not None:
        _after_node_local(mgr, step, tier, decision, info, comm)
        return
    if mgr.rank != 0:
        return
    _emit_commit(mgr, tier, step, info)
    damage = verify(mgr, tier, info.checkpoint_id)
    if tier.name == "fast" and mgr.replicate and decision.tier == "durable":
        if damage is None:
            replicate(mgr, tier, info.checkpoint_id, step)
        else:
            not_copied(mgr, info.checkpoint_id, step, damage)
    retain(mgr, tier, info.checkpoint_id)


def _owed_retention(mgr: CheckpointManager, tier: Tier) -> None:
    """Run the retention pass a commit left to the save queued behind it, which failed.

    The failed save keeps every older version (it runs no pass of its own), but the pass the
    last commit skipped is owed: without it, on a disk with room for one version beyond the
    policy, the versions the policy lets go stayed, every later save failed for want of
    space, and a restarted job too (fault review 27, F1). Only where that pass was skipped
    (rank 0, a node's leader); a pass is skipped once at most (:func:`retain`).
    """
    with mgr._retain_lock:
        if tier.name not in mgr._retain_owed:
            return
        own = mgr._retain_owed[tier.name]
    retain(mgr, tier, own)


def _newer_not_ours(mgr: CheckpointManager, step: int, decisions: list[Any]) -> bool:
    """Whether a version at a newer step than ``step`` was created before this job started.

    ``decisions``: those of the versions a restore may take (a version that failed
    verification is never restored: incident review R7).
    """
    from portable_ckpt.format.naming import attempt_time

    return any(
        d.step > step and (attempt_time(d.id) or 0.0) < mgr._started for d in decisions
    )


def _warn_below_newer(
    mgr: CheckpointManager, tier: Tier, step: int, decisions: list[Any]
) -> None:
    """Say once per tier that this job's saves sort below newer steps already there."""
    if f"below-newer:{tier.name}" in mgr._warned:
        return
    mgr._warned.add(f"below-newer:{tier.name}")
    newer = sorted({d.step for d in decisions if d.step > step})
    say(
        f"this job saved step {step} to {tier.root}, which already holds newer steps "
        f"{newer[:8]} (an earlier run's, or a rolled-back branch): versions are ordered by "
        f"step, so restore() resumes step {newer[-1]}, not this job's saves (retention keeps "
        f"this job's newest ones as a new branch). To continue that run, call restore() first; "
        "to start afresh, use an empty root"
    )


def _emit_commit(mgr: CheckpointManager, tier: Tier, step: int, info: CheckpointInfo) -> None:
    mgr.telemetry.emit(
        "commit",
        tier=tier.name,
        step=step,
        checkpoint_id=info.checkpoint_id,
        ok=True,
        expected_writers=info.world_size,
        reported_writers=info.world_size,
        code=None,
    )


def _after_node_local(
    mgr: CheckpointManager,
    step: int,
    tier: Tier,
    decision: Decision,
    info: CheckpointInfo,
    comm: Comm | None,
) -> None:
    """Node-local version: every rank takes part; no single rank can read all of it.

    A collective of the background group that fails (a peer's copy share longer than its
    timeout, a dead peer) leaves that group broken for good: every later replication failed at
    once, uncounted and unsaid (race review F5). The failure is counted and said like any
    failed durable save, and the group is made anew at the ranks' next agreement.
    """
    if mgr.rank == 0:
        _emit_commit(mgr, tier, step, info)
    durable = mgr.replicate and comm is not None and decision.tier == "durable"
    had_comm, comm = comm is not None, usable_comm(mgr, comm)
    try:
        if had_comm and comm is None:
            raise DistributedError(
                "the background group broke on earlier work and was not made anew before the "
                "manager waited for this work or closed (it is made anew at the ranks' next "
                "agreement)"
            )
        damage = verify_nodes(mgr, comm, tier, info.checkpoint_id)  # agreed by every rank
        if durable:
            if damage is None:
                replicate_nodes(mgr, comm, tier, info.checkpoint_id, step)
            else:
                not_copied(mgr, info.checkpoint_id, step, damage)
    except DistributedError as e:
        if comm is not None:
            comm.broken = True
            # Only the group in use is renewed: a failure on one already replaced (a peer that
            # came late to it) would renew again under work that started on the new one.
            mgr._bg_broken = mgr._bg_broken or comm is mgr._bg_comm
        if not durable:
            _log.error("node-local verification of %s failed: %s", info.checkpoint_id, e)
            return
        copy_failed(mgr, info.checkpoint_id, step, DistributedError(
            f"replication of {info.checkpoint_id} to {mgr.tiers['durable'].root} failed: "
            f"{e.message}"
        ))
        return
    if tier.leads(mgr.rank):
        retain(mgr, tier, info.checkpoint_id)  # each node's leader keeps its own node root


#: Durable saves written around a failing fast tier (``replicate=True``) before it is tried again.
FAST_RETRY_AFTER = 5


def usable_comm(mgr: CheckpointManager, comm: Comm | None) -> Comm | None:
    """``comm``, or when a collective already failed on it, the group made anew (or None).

    Saves go on while a peer's long copy share holds the background thread: every one queued
    behind it was given the group that then broke, and each failed at once and counted: one
    slow node stopped the job through ``max_failed_saves`` (attack review 4 A3). A job
    finds its group broken on every rank alike (each rank's thread failed the job before it),
    and every rank makes the new group at one agreement; so the job waits for that group (at
    most the group's timeout, not while the main thread waits for background work or closes:
    the renewal needs its next agreement) and runs on it.
    """
    if comm is None or not comm.broken:
        return comm
    deadline = time.monotonic() + comm.timeout
    # Not while the main thread waits for this work (wait(), a synchronous save): the renewal
    # comes from its next agreement, and an hour's stall is worse (review of the change F3).
    while (mgr._bg_comm is comm and not mgr._closing and not mgr._main_waiting
           and time.monotonic() < deadline):
        time.sleep(0.05)
    return None if mgr._bg_comm is comm else mgr._bg_comm


def not_copied(mgr: CheckpointManager, attempt: str, step: int, damage: CheckpointError) -> None:
    """A durable save (``replicate=True``) whose fast-tier version failed its verification.

    It is not copied (a copy would carry the damage, or fail on it), so the durable checkpoint
    of ``step`` does not exist: counted towards ``max_failed_saves``, kept for ``wait()`` and
    said on stderr, like any durable save that failed. It was dropped without a word: a job
    on a failing SSD ran with an empty durable root and exited 0.
    """
    durable = mgr.tiers["durable"]
    copy_failed(mgr, attempt, step, type(damage)(
        f"{attempt} failed its sampled verification on the fast tier ({damage.message}); it "
        f"is not copied to the durable root {durable.root}: the durable checkpoint of step "
        f"{step} does not exist",
        path=damage.path,
    ))


def copy_failed(mgr: CheckpointManager, attempt: str, step: int, e: CheckpointError) -> None:
    """Every rank: the durable checkpoint of ``step`` (``replicate=True``) does not exist.

    Counted towards ``max_failed_saves``, kept for ``wait()``, said on stderr and sent as a
    ``replicate`` event (rank 0), like any durable save that failed.
    """
    mgr.last_error = e
    durable_failed(mgr, step)
    if mgr.rank == 0:
        if not mgr._exiting:
            say(failure_text(mgr, step, "durable", e))
        mgr.telemetry.emit(
            "replicate", tier="durable", checkpoint_id=attempt, ok=False, code=e.code,
            message=e.message[:2000],
        )


def verify_nodes(
    mgr: CheckpointManager, comm: Comm | None, tier: Tier, attempt: str
) -> CheckpointError | None:
    """Sampled verification of a node-local version: each rank its share, results agreed.

    Returns the first damage found (the version failed), else ``None``.
    """
    from portable_ckpt.torch._manager_nodelocal import verify_node_local

    if mgr.verify_sample <= 0 or comm is None or tier.layout is None:
        return None
    out = verify_node_local(comm, tier.layout, tier.storage, attempt, mgr.verify_sample)
    if mgr.rank == 0:
        mgr.telemetry.emit(
            "verify",
            tier=tier.name,
            checkpoint_id=attempt,
            fraction=mgr.verify_sample,
            chunks=out.chunks,
            chunks_by_rank=out.chunks_by_rank,
            ok=out.ok,
            errors=out.errors[:8],
        )
        if not out.ok:
            _log.error("version %s failed sampled verification: %s", attempt, out.errors[:1])
    if out.ok:
        return None
    first = next(e for e in out.errors if e.get("code") in DAMAGE_CODES)
    return error_for_code(str(first["code"]))(str(first.get("message", "")))


def replicate_nodes(
    mgr: CheckpointManager, comm: Comm | None, tier: Tier, attempt: str, step: int
) -> None:
    """Replicate a node-local version (every rank, background thread); rank 0 reports it."""
    from portable_ckpt.torch._manager_nodelocal import replicate_node_local

    if comm is None or tier.layout is None:  # pragma: no cover - guarded by caller
        return
    durable = mgr.tiers["durable"]
    out = replicate_node_local(comm, tier.layout, tier.storage, durable.storage, attempt)
    if out.ok:  # the outcome is agreed: every rank counts it
        durable_ok(mgr)
    else:
        durable_failed(mgr, step)
        # Every rank keeps the agreed error: a stop after max_failed_saves names it on each
        # rank (the others said "last error: None").
        mgr.last_error = DistributedError(
            f"replication of {attempt} to {durable.root} failed on rank {out.failed_rank}: "
            f"[{out.code}] {out.message}"
        )
    if mgr.rank != 0:
        return
    fields: dict[str, Any] = {"tier": "durable", "checkpoint_id": attempt, "ok": out.ok}
    if not out.ok:
        _log.error("%s", mgr.last_error)
        say(f"rank 0: {mgr.last_error}. Training continues; the version stays on the fast tier.")
        mgr.telemetry.emit("replicate", **fields, code=out.code, message=out.message)
        return
    mib_s = out.bytes / _MIB / out.seconds if out.seconds > 0 else 0.0
    mgr.telemetry.emit(
        "replicate",
        **fields,
        bytes=out.bytes,
        seconds=round(out.seconds, 6),
        mib_per_s=round(mib_s, 3),
        bytes_by_rank=out.bytes_by_rank,
        nodes=tier.layout.nodes,
    )
    retain(mgr, durable, attempt)


def after_failure(
    mgr: CheckpointManager,
    step: int,
    tier: Tier,
    decision: Decision,
    e: CheckpointError,
    *,
    raised: bool = False,
    seq: int | None = None,
) -> None:
    """Report a refused commit; keep the error for ``wait()`` (older versions are all kept).

    Every rank counts it (the next ``maybe_save`` raises after ``max_failed_saves`` in a row);
    rank 0 says so on stderr unless the error is ``raised`` to the caller right away (a
    synchronous save): the logger is silent by default and training goes on. A save started
    before the stop after ``max_failed_saves`` (``seq``) is neither counted nor kept: that stop
    surfaced it, whichever rank learned of it first.
    """
    mgr._saved_steps.discard(step)  # not saved: saving it again is no repeat
    # A rank whose thread learns of a failure after the agreed stop (busy with a verification)
    # counted it again: the next call stopped every rank a second time, for the same steps,
    # though the cause was mended (mutation audit 32).
    surfaced = seq is not None and seq < mgr._stopped_before
    if not raised and not surfaced:  # a synchronous save's error reached the caller already
        mgr.last_error = e
    if decision.tier == "durable" and not surfaced:
        durable_failed(mgr, step)
    if isinstance(e, UnsupportedValueError) and not raised and not surfaced:
        # The state holds a value no save can store: every later save fails alike. Counted
        # as all the failures allowed, so the next maybe_save raises on every rank (the count
        # is agreed), whatever max_failed_saves says (odd-states review O12: training went on
        # without checkpoints until the third failure, or for ever with None). Not when the
        # caller was told: a synchronous save raised it, or wait() does (it resets this).
        mgr._failed_saves = max(mgr._failed_saves, UNSTORABLE)
    if tier.name == "fast":
        mgr._fast_failed = True
    _log.error("checkpoint of step %d to the %s tier failed: %s", step, tier.name, e)
    if mgr.rank == 0 and not raised and not mgr._exiting:  # at exit: the ABANDONED line
        where = "durable" if decision.tier == "durable" else tier.name
        say(failure_text(mgr, step, where, e) + (
            " It was written to the fast tier first (replicate=True): the next durable saves go "
            "to the durable root directly until a fast-tier save works again."
            if where != tier.name else ""))
    failed = getattr(e, "failed_ranks", None) or None
    mgr.telemetry.emit(
        "commit",
        tier=tier.name,
        step=step,
        ok=False,
        expected_writers=mgr.world_size,
        reported_writers=None if failed is None else mgr.world_size - len(failed),
        failed_ranks=failed,
        code=e.code,
        message=e.message[:2000],
        reason=decision.reason,
        failed_in_a_row=len(mgr._failed_steps),  # (not the count that stops a job for good)
    )
    # A failed save keeps every older version: retention does not run.


#: The failed-save count that says a save failed for a value no save can store.
UNSTORABLE = 1 << 30


def durable_failed(mgr: CheckpointManager, step: int) -> None:
    """Count a durable checkpoint that does not exist (its save or its copy failed).

    Only these count towards ``max_failed_saves``: the durable tier is what protects the job.
    A failing fast tier is said on stderr but never stops a job whose durable saves work,
    and a working fast tier never hides a durable tier that fails.
    """
    mgr._failed_saves += 1
    mgr._failed_steps.append(step)


def durable_ok(mgr: CheckpointManager) -> None:
    """A durable version was published (committed, or copied to the durable root).

    A failure still waiting in ``last_error`` goes, of either tier: it was said on stderr when
    it happened, and a newer durable checkpoint supersedes it. close() raised it at the end of
    a run whose last durable save had committed, and the job exited 1 (tier review F10 for
    the fast tier, async review F16 for an earlier durable failure).
    """
    mgr._failed_saves, mgr._failed_steps = 0, []
    mgr.last_error = None
    mgr._last_raised = None  # a later stop names a failure after this commit, not before it


def failure_text(mgr: CheckpointManager, step: int, tier: str, e: BaseException) -> str:
    """The stderr line of a failed background checkpoint (one per failure, rank 0)."""
    n, limit = mgr._failed_saves, mgr.max_failed_saves
    code = getattr(e, "code", "PCK-DISTRIBUTED")
    message = getattr(e, "message", str(e))
    if n >= UNSTORABLE:
        return (
            f"rank {mgr.rank}: the checkpoint of step {step} FAILED ([{code}] {message[:1000]}). "
            "No save can store this state: the next maybe_save/save raises. Change the state "
            "(see the message), then save again."
        )
    if tier != "durable" and n == 0:
        then = "the durable saves protect the job; fast-tier failures never stop it"
    elif limit is None:
        then = "max_failed_saves=None: the job never stops for failed saves"
    elif n >= limit:
        then = f"the next maybe_save/save raises (max_failed_saves={limit})"
    else:
        then = f"the next maybe_save/save raises after {limit} in a row (max_failed_saves)"
    return (
        f"rank {mgr.rank}: the checkpoint of step {step} to the {tier} tier FAILED "
        f"([{code}] {message[:1000]}). Training continues without it (the previous version "
        f"remains the latest); {n} durable checkpoint(s) failed in a row; {then}."
    )


def too_many_failures(mgr: CheckpointManager) -> CheckpointError:
    """The error every rank raises once ``max_failed_saves`` durable checkpoints failed.

    Of one class on every rank (``DistributedError`` in a group: each rank saw its own
    error, the rank whose disk is full a storage error, rank 0 the failed commit), so one
    ``except`` catches it everywhere; this rank's last error is in the message and chained.
    """
    last = mgr.last_error if mgr.last_error is not None else mgr._last_raised
    if mgr._agreed_failed_saves >= UNSTORABLE:
        return UnsupportedValueError(
            "the state holds a value that no save can store"
            + (f" ({last.message})" if isinstance(last, CheckpointError) else "")
            + ": no checkpoint of this job can be saved; change the state, then save again"
        )
    agreed = mgr._agreed_failed_range
    if mgr._failed_steps:
        steps = "steps " + ", ".join(str(s) for s in mgr._failed_steps[-8:])
    elif agreed is not None:  # this rank learns of them later (its thread still verifying)
        first, latest = agreed
        steps = (f"step {first}" if first == latest else f"steps {first} to {latest}") + (
            ", as another rank saw them")
    else:
        steps = "steps not known to this rank"
    if last is not None:
        mine = f"this rank's last error: {str(last)[:1000]}"
    elif mgr._failed_steps:  # (was "this rank's last error: None")
        mine = "each was raised to the caller of its save"
    else:
        mine = "this rank has not learned of a failure yet"
    message = (
        f"{mgr._agreed_failed_saves} durable checkpoints in a row failed ({steps}; {mine}). "
        "No durable version was published since; "
        f"stopping rather than training on without checkpoints (max_failed_saves="
        f"{mgr.max_failed_saves}). Fix the cause and restart (restore resumes from the latest "
        f"version), or pass a larger max_failed_saves (None: never stop for failed saves)."
    )
    if mgr.world_size > 1:
        return DistributedError(message, failures=getattr(last, "failures", ()))
    cls = error_for_code(getattr(last, "code", "PCK-DISTRIBUTED"))
    if issubclass(cls, DistributedError):
        return cls(message, failures=getattr(last, "failures", ()))
    return cls(message)


def verify(mgr: CheckpointManager, tier: Tier, attempt: str) -> CheckpointError | None:
    """Sampled verification of a fresh version on rank 0; records the result beside it.

    Returns the first damage found (the version failed), else ``None`` (also when it was not
    verified, or could not be read: that proves nothing).
    """
    if mgr.verify_sample <= 0:
        return None
    import portable_ckpt
    from portable_ckpt.io.annotations import (
        record_verification,
        sampled_chunks,
        verification_verdict,
    )
    from portable_ckpt.io.damage import confirm_damage
    from portable_ckpt.io.reader import Checkpoint

    seed = int.from_bytes(os.urandom(4), "big")
    chunks = 0
    opened = None
    try:
        opened = portable_ckpt._resolve(f"{tier.root.rstrip('/')}/{attempt}", None)
        storage, ident, manifest = opened
        chunks = sum(t.range_count for t in manifest.tensors.values())
        errors = Checkpoint(storage, ident, manifest).verify(sample=mgr.verify_sample, seed=seed)
    except CheckpointError as e:  # damage met while opening it too (a tensor table's bytes)
        errors = [e]
    if opened is not None:  # every finding gets its second look (attack review 4 A5)
        storage, ident, manifest = opened
        errors = confirm_damage(storage, ident, manifest.files, errors)
    n = sampled_chunks(chunks, mgr.verify_sample)
    # A storage error proves nothing about the bytes: only damage marks the version failed
    # (it would never be restored, and retention would delete it).
    verdict, _ = verification_verdict(errors)
    ok = verdict is not False
    try:
        record_verification(
            tier.storage,
            attempt,
            errors,
            mode="sample",
            fraction=mgr.verify_sample,
            chunks=n,
            seed=seed,
            verifier="portable_ckpt CheckpointManager",
        )
    except CheckpointError as e:
        _log.error("cannot record the verification of %s: %s", attempt, e)
    mgr.telemetry.emit(
        "verify",
        tier=tier.name,
        checkpoint_id=attempt,
        fraction=mgr.verify_sample,
        chunks=n,
        ok=ok,
        errors=[x.to_json() for x in errors[:8]],
    )
    if not ok:
        _log.error("version %s failed sampled verification: %s", attempt, errors[0])
    elif errors:
        _log.warning("the sampled verification of %s could not read it (%s); nothing recorded",
                     attempt, errors[0])
    return None if ok else next(e for e in errors if e.code in DAMAGE_CODES)


def replicate(mgr: CheckpointManager, tier: Tier, attempt: str, step: int) -> None:
    """Copy a durable save from the fast tier to the durable root, in the background.

    ``mgr._copies`` holds a future that ends once the copy's callback has run, not the copy's
    own: ``wait()`` woke when the copy ended, before the callback recorded a failure or queued
    the retention passes, and ``close()`` then shut the pool down under it (race review F1).
    """
    from portable_ckpt.io.copy import copy_version_async

    durable = mgr.tiers["durable"]
    with mgr._retain_lock:  # kept by the fast tier's passes from before the copy starts
        mgr._copying.add(attempt)
    try:
        fut = copy_version_async(f"{tier.root.rstrip('/')}/{attempt}", durable.root)
    except BaseException:
        with mgr._retain_lock:
            mgr._copying.discard(attempt)
        raise
    tracked: cf.Future[Any] = cf.Future()
    with mgr._retain_lock:  # the training thread prunes the list (race review F8)
        mgr._copies.append(tracked)

    def done(f: cf.Future[Any]) -> None:
        try:
            with mgr._retain_lock:
                mgr._copying.discard(attempt)
            reported(f)
        finally:
            tracked.set_result(None)

    def reported(f: cf.Future[Any]) -> None:
        try:
            res = f.result()
        except BaseException as e:
            mgr.last_error = e
            durable_failed(mgr, step)
            say(
                f"rank 0: the copy of {attempt} to the durable root {durable.root} FAILED "
                f"({e}). Training continues; the version stays on the fast tier; "
                f"{len(mgr._failed_steps)} durable checkpoint(s) failed in a row."
            )
            mgr.telemetry.emit(
                "replicate",
                tier="durable",
                checkpoint_id=attempt,
                ok=False,
                code=getattr(e, "code", "PCK-STORAGE"),
                message=str(e)[:2000],
            )
            return
        durable_ok(mgr)
        mgr.telemetry.emit(
            "replicate",
            tier="durable",
            checkpoint_id=attempt,
            ok=True,
            bytes=res.bytes,
            seconds=round(res.seconds, 6),
            mib_per_s=round(res.mib_per_s, 3),
        )
        # The durable root as this copy's own version; then the fast tier, now that the copy
        # is done. Not as "this job's newest save" there: later fast saves may have committed
        # meanwhile (they are this job's, not an earlier run's), and the version is safe on
        # the durable root.
        try:
            passes = [mgr._bg.submit(retain, mgr, durable, attempt),
                      mgr._bg.submit(retain, mgr, tier)]
        except RuntimeError:  # closed (close(timeout=...) gave up): nothing more runs
            return
        with mgr._retain_lock:
            mgr._post.extend(passes)

    fut.add_done_callback(done)


#: Kept versions a ``retention`` event lists (the newest; ``kept_count`` counts them all).
RETENTION_EVENT_KEPT = 32


def retain(mgr: CheckpointManager, tier: Tier, own: str | None = None) -> None:
    """Apply the tier's retention policy with the core gc (rank 0, background thread).

    ``own`` is the version this job just committed: its own retention never deletes it for
    being outside the policy, which happens only when newer steps are in the tier (an earlier
    run's, or a rolled-back branch); the job then says so once. A version that failed its
    sampled verification is deleted all the same.
    """
    if not tier.retention.active:
        return
    with mgr._retain_lock:
        queued = own is not None and mgr._saves_queued.get(tier.name, 0) > 0
        grouped = tier.layout is not None or mgr.replicate
        if own is not None and grouped and any(n > 0 for n in mgr._saves_queued.values()):
            # The peers' next collectives (a node-local verification, a replication) wait on
            # this thread: a pass here made them time out (test_manager_dist's slow node
            # share), and skipping it while saves came back to back ran none until the job
            # ended (leak review 28, left open). It runs beside this thread instead (the
            # durable root's too, which fast-tier saves queue behind).
            _retain_aside(mgr, tier, own)
            return
        if queued and tier.name not in mgr._retain_owed:
            # A later save's pass is queued behind this one and covers it (soak review F6);
            # owed, should that save fail (_owed_retention). Never twice in a row: a job whose
            # every commit found the next save queued ran no pass at all until it exited (leak
            # review 28, F1: 300 versions kept of keep_last=3 on S3, 88 s of deletions at exit).
            mgr._retain_owed[tier.name] = own
            return
        mgr._retain_owed.pop(tier.name, None)
    with mgr._pass_lock:
        _retention_pass(mgr, tier, own, aside=False)


#: This job's committed versions numbered in commit order, the newest kept.
COMMIT_ORDER_KEPT = 4096


def note_commit(mgr: CheckpointManager, attempt: str) -> None:
    """Number a version this job committed (retention's "newer", whatever the clocks say)."""
    with mgr._retain_lock:
        mgr._commit_order[attempt] = mgr._commits_noted
        mgr._commits_noted += 1
        while len(mgr._commit_order) > COMMIT_ORDER_KEPT:
            del mgr._commit_order[next(iter(mgr._commit_order))]


def _newer(order: dict[str, int], attempt: str, than: str) -> bool:
    """Whether ``attempt`` was committed after ``than``.

    By this job's commit order where it numbered both, else by the times in their ids (a
    clock stepped back between two saves made a newer version look older: re-attack 29).
    """
    from portable_ckpt.format.naming import attempt_time

    a, b = order.get(attempt), order.get(than)
    if a is not None and b is not None:
        return a > b
    return (attempt_time(attempt) or 0.0) > (attempt_time(than) or 0.0)


def _retain_aside(mgr: CheckpointManager, tier: Tier, own: str) -> None:
    """Queue a pass on the retention thread (the caller holds ``mgr._retain_lock``).

    One pass per tier waits at most: a later commit's request before it started gives it
    the newer version instead. ``wait()`` and ``close()`` wait for it (``mgr._post``).
    """
    waiting = tier.name in mgr._aside_own
    mgr._aside_own[tier.name] = own
    if waiting:
        return
    try:
        mgr._post.append(mgr._retainer.submit(_aside_pass, mgr, tier))
    except RuntimeError:  # closed (close(timeout=...) gave up): nothing more runs
        mgr._aside_own.pop(tier.name, None)


def _aside_pass(mgr: CheckpointManager, tier: Tier) -> None:
    with mgr._pass_lock:
        with mgr._retain_lock:
            own = mgr._aside_own.pop(tier.name)
        _retention_pass(mgr, tier, own, aside=True)


def _retention_pass(mgr: CheckpointManager, tier: Tier, own: str | None, *, aside: bool) -> None:
    """One retention pass of ``tier`` (the caller holds ``mgr._pass_lock``).

    ``aside``: run beside the background thread, which may be verifying or replicating a
    version committed after ``own`` (queued saves): those are kept, whatever the policy says;
    a later pass decides them.
    """
    from portable_ckpt.io.gc import gc

    with mgr._retain_lock:  # a version being replicated is never deleted under the copy
        copying = set(mgr._copying) if tier.name == "fast" else set()
        # Versions committed after the newest one whose post-save work began wait for their
        # verification and copy on the background thread: a pass a finished copy queued ahead
        # of that work (own=None) deleted one, and its copy to the durable root failed
        # (re-attack 29). Without copies a queued version is the policy's to delete.
        grouped = tier.layout is not None or mgr.replicate
        queued = grouped and mgr._saves_queued.get(tier.name, 0) > 0
        unhandled = mgr._handled.get(tier.name) if queued else None
        order = dict(mgr._commit_order)
    try:
        cands = candidates_of(tier.storage)
        decisions = plan_retention(cands, tier.retention)
        # Newer steps that failed verification are never restored: they do not sort above
        # this job's saves for a restore, and are not named as if they did (incident R7);
        # nor are attempts that are no version (an invalid or lost commit record, a save
        # that never committed: incident R4).
        never = {c.id for c in cands if c.verification_failed or not c.committed}
        restorable = [d for d in decisions if d.id not in never]
        for d in decisions:
            if d.id != own or not _newer_not_ours(mgr, d.step, restorable):
                continue  # (this job's later copies passed it, race review F2: as the policy says)
            if d.delete and d.reasons[0].startswith("outside"):
                d.delete, d.reasons = False, ["this job's newest save"]
            # Said whether or not the policy keeps it (a rollback's branch is kept now): the
            # newer steps win the next restore (review of the change F13).
            _warn_below_newer(mgr, tier, d.step, restorable)
        pivot = own if aside and own is not None else unhandled
        for d in decisions:
            if d.delete and d.id in copying:
                d.delete, d.reasons = False, ["being copied to the durable root"]
            elif d.delete and pivot is not None and d.id != own and _newer(order, d.id, pivot):
                d.delete, d.reasons = False, ["newer than this pass's version (its "
                                              "verification or replication may be running "
                                              "or queued)"]
        keep = [d.id for d in decisions if not d.delete]
        pins: dict[str, Any] = {}
        if tier.name == "durable" and mgr.pin_kept:
            try:
                pins = sync_pins(tier.storage, decisions)
            except CheckpointError as e:  # gc below says whether the pins can be read at all
                pins = {"pin_error": {"code": e.code, "message": e.message[:2000]}}
        elif tier.name == "durable" and "stale_pins" not in mgr._warned:
            _say_stale_pins(mgr, tier)
        # spare_since: the next async save may be writing already; with a short grace its
        # files went under its writers (chaos review F1). Failed saves remove their own files.
        # Their copy records go with them: read before gc, for the few that are named.
        failed_ids = {c.id for c in cands if c.committed and c.verification_failed}
        failed_copies = _failed_copies(tier, decisions, failed_ids)
        report = gc(tier.storage, keep=1, keep_ids=keep, grace_seconds=mgr.grace_seconds,
                    spare_since=mgr._started)
    except CheckpointError as e:
        _log.error("retention on the %s tier failed: %s", tier.name, e)
        mgr.telemetry.emit(
            "retention", tier=tier.name, ok=False, code=e.code, message=e.message[:2000]
        )
        return
    why = {d.id: d.reasons for d in decisions}
    kept = [{"id": d.id, "reasons": d.reasons} for d in decisions if not d.delete]
    # An attempt gc could not delete keeps using space: said, not only counted (multi-job
    # review F14: the event said ok, and the disk filled days later).
    failed = [u for u in report.unknown if u.get("status") == "delete failed"]
    failed += report.left_behind  # deleted, but its files still use the space
    # While the root's pins cannot be read, gc deletes no committed version (R-GC-11): the
    # event said ok and nothing was said while every version stayed (attack review 5 F5).
    held = [u for u in report.unknown if u.get("status") == "pins unreadable"]
    mgr.telemetry.emit(
        "retention",
        tier=tier.name,
        ok=not failed and not held and "pin_error" not in pins,
        policy=tier.retention.describe(),
        deleted=[{"id": i, "reasons": why.get(i, ["gc"])} for i in report.deleted],
        deleted_count=len(report.deleted),
        abandoned=report.abandoned,
        kept=kept[-RETENTION_EVENT_KEPT:],  # the newest: every kept version made it 100 KB
        kept_count=len(kept),
        damaged=report.damaged,
        failed=failed,
        **({"held": held} if held else {}),
        **pins,
    )
    where = f"rank {mgr.rank}: {tier.name} tier:"
    _say_failed_deleted(mgr, tier, decisions, [i for i in report.deleted if i in failed_ids],
                        failed_copies)
    for bad in held:
        _say_once(mgr, f"pins:{tier.name}", (
            f"{where} retention deletes no committed version while the root's pins cannot be "
            f"read ([{bad['code']}] {str(bad['message'])[:300]}): any version may be pinned "
            "(spec R-GC-11), so the tier keeps growing until they can be read"))
    for bad in failed:
        _say_once(mgr, f"undeletable:{bad['id']}", (
            f"{where} retention could not delete {bad['id']} ({str(bad['message'])[:300]}); it "
            "keeps using space until it can be deleted (portable-ckpt gc names it)"))
    for bad in report.damaged:  # R-GC-10: kept; said once per attempt, the job goes on
        _say_once(mgr, f"damaged:{bad['id']}", (
            f"{where} attempt {bad['id']} has an invalid commit record ([{bad['code']}] "
            f"{bad['message'][:300]}): a committed version damaged after its commit; retention "
            "keeps it (portable-ckpt gc --delete-invalid deletes it)"))


def _say_stale_pins(mgr: CheckpointManager, tier: Tier) -> None:
    """Once per manager without ``pin_kept``: the pins an earlier run's ``pin_kept`` wrote."""
    from portable_ckpt.manager.pinning import manager_pins

    try:
        left = manager_pins(tier.storage)
    except CheckpointError:
        return  # gc says whether the pins can be read
    if left:
        root = tier.root.rstrip("/")
        _say_once(mgr, "stale_pins", (
            f"rank {mgr.rank}: {tier.name} tier: {len(left)} version(s) stay pinned by an "
            f"earlier run's pin_kept=True ({', '.join(left[:3])}{', ...' if len(left) > 3 else ''}"
            "): this manager (pin_kept=False) neither keeps them in step with its policy nor "
            "removes them, and every gc keeps them; remove them with `portable-ckpt unpin "
            f"{root}/ID`, or relaunch with pin_kept=True"))
    else:
        mgr._warned.add("stale_pins")  # asked once: none


#: Deleted versions that failed verification which one retention pass names (then a count).
FAILED_DELETED_NAMED = 3


def _failed_copies(
    tier: Tier, decisions: list[RetentionDecision], failed: set[str]
) -> dict[str, tuple[list[str], str | None]]:
    """The verified copies recorded for the newest failed versions this pass is to delete.

    Read before gc deletes them with their records; at most :data:`FAILED_DELETED_NAMED`, and
    none in the usual pass, which deletes no failed version.
    """
    from portable_ckpt.io.copy import copies_of

    doomed = [d.id for d in decisions if d.delete and d.id in failed]
    return {i: copies_of(tier.storage, i) for i in doomed[::-1][:FAILED_DELETED_NAMED]}


def _say_failed_deleted(
    mgr: CheckpointManager,
    tier: Tier,
    decisions: list[RetentionDecision],
    deleted: list[str],
    copies: dict[str, tuple[list[str], str | None]],
) -> None:
    """Once per pass, by the rank that ran it: retention deleted versions that failed verification.

    Rank 0, or a node-local tier's node leaders, each for its node root.

    They went at the job's next save, inside ``keep_last`` too, with nothing said but the
    retention event: an operator paged for a cron verify's failure found the version gone
    before repairing it in place (SRE review 2, W6). Said on stderr and as a WARNING
    (event ``retention.deleted_failed``), with the verified copies recorded for them.
    """
    import shlex

    from portable_ckpt._printable import printable
    from portable_ckpt.logs import log_event

    if not tier.leads(mgr.rank) or not deleted:  # (a node leader's node root: its own)
        return
    step = {d.id: d.step for d in decisions}
    gone = sorted(deleted, reverse=True)  # newest first (attempt ids sort by step)
    root = tier.root.rstrip("/")
    rows: list[dict[str, Any]] = []
    parts: list[str] = []
    for ident in gone[:FAILED_DELETED_NAMED]:
        found, problem = copies.get(ident, ([], None))
        rows.append({"checkpoint_id": ident, "step": step.get(ident), "path": f"{root}/{ident}",
                     "copies": found, "copies_error": problem})
        part = f"step {step.get(ident)}, {root}/{ident}"
        if found:
            part += f" (a copy is recorded at {', '.join(found)}, verified when made, not since)"
        elif problem is not None:
            part += f" (its copy records could not be read: {problem[:200]})"
        elif ident in copies:
            part += " (no verified copy of it is recorded)"
        parts.append(part)
    more = len(gone) - len(rows)
    text = (
        f"rank {mgr.rank}: {tier.name} tier: retention deleted {len(gone)} version(s) that "
        f"failed verification: {'; '.join(parts)}"
        + (f"; and {more} more (the retention event lists them)" if more else "")
        + ". A version that failed verification is deleted at the job's next retention pass, "
        "inside keep_last too, unless it is pinned: to repair the next one in place, pin it "
        f"as soon as it fails (`portable-ckpt pin {shlex.quote(root)}/ID`; docs/recovery.md)"
    )
    log_event(  # escaped as say() escapes it: copy destinations come from records (review 5)
        _log, "retention.deleted_failed",
        {"tier": tier.name, "deleted": rows, "more": more},
        "%s", printable(text), rank=mgr.rank, level=logging.WARNING,
    )
    say(text)


def _say_once(mgr: CheckpointManager, key: str, text: str) -> None:
    """Say ``text`` on stderr the first time ``key`` comes up in this manager."""
    if key not in mgr._warned:
        mgr._warned.add(key)
        say(text)
