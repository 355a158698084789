"""``CheckpointManager.restore``: the newest committed, verified version over both tiers.

Rank 0 ranks the candidates (newest step first, the fast tier first on ties; a node-local fast
tier is listed by every rank) and broadcasts them; every rank tries them in that order. A
damaged, partial or unreachable version falls back to the next one, and every rank takes part in
that agreement; an error of the caller's target state (contract, shapes, keys) would repeat on
every version, so it is raised at once everywhere.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from portable_ckpt.errors import (
    DAMAGE_CODES,
    CheckpointError,
    ContractError,
    DistributedError,
    EntryMissingError,
    EntryTargetError,
    FileMissingError,
    NotFoundError,
    StorageError,
    TensorMissingError,
    UnsupportedValueError,
    UsageError,
)
from portable_ckpt.io.annotations import timestamp_key
from portable_ckpt.io.copy import copies_of
from portable_ckpt.io.versions import list_versions, load_manifest, restore_decision
from portable_ckpt.storage import local_path
from portable_ckpt.torch._collectives import make_comm
from portable_ckpt.torch._hyperparameters import Hyperparameters
from portable_ckpt.torch._inflight import say
from portable_ckpt.torch._manager_decisions import any_rank, broadcast_json
from portable_ckpt.torch._manager_tiers import Tier, storage_url
from portable_ckpt.torch._nodelocal import prepare_fast_restore
from portable_ckpt.torch._restore_passed_over import passed_over, say_passed_over
from portable_ckpt.torch.info import LoadInfo
from portable_ckpt.torch.loading import left_from, load_into, shown_keys

if TYPE_CHECKING:
    from portable_ckpt.io.versions import VersionInfo
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
    EntryTargetError,
    UnsupportedValueError,
)


def _fallback(tier: str, ident: str, e: CheckpointError) -> dict[str, Any]:
    """A restore candidate that failed, as telemetry reports it."""
    return {"tier": tier, "checkpoint_id": ident, "code": e.code, "message": e.message[:500]}


def _way_out(tier: str) -> str:
    """How a job goes on when ``tier`` stays unreadable (a dead node-local disk, a lost bucket).

    The advice was the fast tier's whatever the tier: a job without a fast tier whose bucket
    was gone was told to construct its manager without ``fast_root=`` (S3 review 24, L1).
    """
    if tier == "fast":
        return ("if the fast tier is gone for good, restore without it: construct the manager "
                "without fast_root= for this run (the durable tier's newest version is "
                "restored), or pass checkpoint= to restore one version directory explicitly")
    return ("if the durable root is gone for good, copy the version to resume back from a "
            "backup (`portable-ckpt copy BACKUP_ROOT ROOT` copies the one a restore takes, "
            "docs/recovery.md), or pass checkpoint= to restore one version directory "
            "explicitly (a fast tier's, or a backup's); do not empty this root: a job given a "
            "new root= starts afresh")


def listing(
    mgr: CheckpointManager,
    name: str,
    step: int | None,
    seen: dict[str, list[VersionInfo]] | None = None,
) -> dict[str, Any]:
    """The tier as this rank sees it: ``{"rows": [[step, committed_at, id, problem]]}``.

    ``problem`` is ``None`` for a restorable version, else why its commit record (or its
    verification records) could not be read (an ``unreadable`` attempt: perhaps the newest
    version), as ``{"message", "retryable"}``. A tier that could not be
    listed gives ``{"error": message}`` (never "no versions", R-ID-5). ``seen`` keeps the
    whole listing by tier name (what the restore passed over is named from it).
    """
    tier = mgr.tiers[name]
    try:
        versions = list_versions(tier.storage, missing_ok=True)  # a fresh job: from scratch
    except CheckpointError as e:
        return {"error": f"cannot list the {name} tier {tier.root}: {e}"}
    if seen is not None:
        seen[name] = versions
    # The one rule of what a restore takes (versions.restore_decision): a version whose records
    # could not be read may have failed verification, or been cleared (R-DRILL-8, R-DRILL-10):
    # like an unreadable record, it stops the restore rather than being taken or skipped.
    rows = []
    for v in versions:
        decision = restore_decision(v)
        if (step is None or v.step == step) and decision != "skip":
            rows.append([v.step, v.committed_at, v.id, None if decision == "take" else
                         {"message": str(v.error), "retryable": v.error_retryable}])
    return {"rows": rows}


def candidates(
    mgr: CheckpointManager, step: int | None, seen: dict[str, list[VersionInfo]] | None = None
) -> list[list[Any]]:
    """``[tier, attempt id, problem]`` newest first over both tiers (fast first on ties).

    The same list on every rank. A node-local fast tier is listed by every rank (its own node
    root): a version any node holds is a candidate; whether every rank can reach its bytes is
    settled when it is tried. A version whose record could not be read stays in the list
    (with its problem): the restore stops there instead of silently taking an older one.

    Raises:
        StorageError: a tier could not be listed (on every rank).

    """
    found: dict[tuple[str, str], tuple[tuple[int, tuple[int, ...], int], Any]] = {}
    fast = mgr.tiers.get("fast")
    views: list[tuple[int, str, dict[str, Any]]] = []
    if fast is not None and fast.layout is not None:
        comm = make_comm(mgr.process_group, mgr.timeout)
        for view in comm.allgather_json(listing(mgr, "fast", step, seen), "restore/fast-list"):
            views.append((1, "fast", view))
    elif fast is not None and mgr.rank == 0:
        views.append((1, "fast", listing(mgr, "fast", step, seen)))
    if mgr.rank == 0:
        views.append((0, "durable", listing(mgr, "durable", step, seen)))
    errors = [(name, view["error"]) for _, name, view in views if "error" in view]
    for order, name, view in views:
        for v_step, committed_at, ident, problem in view.get("rows", []):
            key = (int(v_step), timestamp_key(committed_at), order)
            seen_before = found.get((name, ident), (key, None))[1]
            # Several ranks' views of a node-local tier: a problem any rank met stands (one
            # that read the record fine must not hide it), and one a person must mend first
            # (review of stop 23, E8: the last rank's row won).
            if problem is None or (seen_before is not None and not seen_before["retryable"]):
                problem = seen_before
            found[(name, ident)] = (key, problem)
    ranked = sorted(found.items(), key=lambda kv: kv[1][0], reverse=True)
    local: dict[str, Any] = (
        {"error": errors[0][1], "tier": errors[0][0]}
        if errors
        else {"cands": [[name, ident, problem] for (name, ident), (_, problem) in ranked]}
    )
    got = broadcast_json(mgr, local if mgr.rank == 0 else None, "the restore's candidates")
    if "error" in got:
        raise StorageError(
            f"{got['error']}; a storage error is not 'no checkpoint' (spec R-ID-5): retry the "
            f"restore; {_way_out(str(got.get('tier', 'durable')))}"
        )
    return [list(c) for c in got["cands"]]


def restore(
    mgr: CheckpointManager,
    state: Mapping[str, Any],
    step: int | None,
    checkpoint: str | os.PathLike[str] | None,
    allow_statistical: bool,
    record_ranges: bool,
    strict: bool = True,
    strict_dtype: bool = False,
    hyper: Hyperparameters | None = None,
) -> LoadInfo | None:
    """The body of :meth:`CheckpointManager.restore` (see there).

    ``hyper`` is shared by the loads of every candidate: the optimizers' hyper-parameters
    before the first are the current ones, also after a candidate failed part way.
    """
    hyper = Hyperparameters() if hyper is None else hyper
    t0 = time.perf_counter()
    seen: dict[str, list[VersionInfo]] = {}  # rank 0's listings: what it passes over is named
    if checkpoint is not None:
        cands: list[list[Any]] = [["explicit", os.fspath(checkpoint), None]]
    else:
        cands = candidates(mgr, step, seen)
    fallbacks: list[dict[str, Any]] = []
    tried: dict[tuple[str, str], dict[str, Any]] = {}  # the candidates that failed, and why
    for tier_name, ident, problem in cands:
        if problem is not None:
            # Same list on every rank: every rank stops here (R-ID-5). A permission (not
            # retryable) is mended by a person: a restart loop must not retry it for good
            # (on-call review 23, F12: `chmod 000` on the newest version said "retry").
            retryable = bool(problem["retryable"])
            raise StorageError(
                f"cannot tell whether {ident} of the {tier_name} tier is the version to restore:"
                f" its commit or verification records could not be read ({problem['message']});"
                " a storage error is not 'no version' (spec R-ID-5): "
                f"{'retry' if retryable else 'mend what the error names (a permission, a path), then restart'}"
                f"; {_way_out(tier_name)}",
                path=f"{ident}/manifest.json", retryable=retryable,
            )
        attempt = functools.partial(
            load_one, mgr, state, tier_name, ident, allow_statistical, record_ranges,
            strict=strict, strict_dtype=strict_dtype, hyper=hyper, step=step,
        )
        absent: NotFoundError | None = None
        try:
            try:
                info = attempt()
            except Exception as first:
                if tier_name == "fast":
                    raise  # a node-local version may just be out of some rank's reach
                err = _fall_back_or_raise(mgr, first)
                absent = _explicit_absent(mgr, tier_name, ident, step, err)
                if absent is None:
                    _again(mgr, ident, err)
                    info = attempt()
        except Exception as e:
            err = _fall_back_or_raise(mgr, e)
            codes = _codes(err)
            if tier_name != "fast" and "PCK-STORAGE" in codes and not codes & DAMAGE_CODES:
                # A permission (not retryable) is mended by a person, not by a restart loop
                # retrying it (on-call review 23, F12): the advice follows the error's class.
                fix = ("retry the restore" if err.retryable else
                       "mend what the error names (a permission, a path), then restart")
                raise StorageError(
                    f"restore of {ident} from the {tier_name} tier failed twice on a storage "
                    f"error ({err.message}); a storage error is not damage, and resuming an "
                    "older version would silently lose the training since (spec R-ID-5): "
                    f"{fix}; {_way_out(tier_name)}",
                    path=ident, retryable=err.retryable,
                ) from err
            verdict = _damage_agreed(mgr, tier_name, ident, err)
            if verdict == "unconfirmed":
                raise StorageError(
                    f"restore of {ident} from the {tier_name} tier failed twice ({err.message})"
                    ", but the damage was not found again by a third read of the file: the "
                    "storage or this host's reads are unreliable, and resuming an older version"
                    " would silently lose the training since (spec R-ID-5): retry the restore;"
                    f" {_way_out(tier_name)}",
                    path=ident,
                ) from err
            fallbacks.append(_fallback(tier_name, ident, err))
            tried[(tier_name, ident)] = _tried(err, verdict)
            text = (
                f"restore of {ident} from the {tier_name} tier failed ({e}); trying the next "
                "candidate"
            )
            _log.warning(text)
            if mgr.rank == 0:
                say(text)  # an operator without logging or events= learns of the damage too
            continue
        if absent is not None:
            raise absent
        if fallbacks and info.missing_keys:
            _say_left_from_failed(mgr, info, fallbacks)
        if tier_name != "explicit":
            passed_over(mgr, info, step, seen, tried)
        own_tier = tier_name if tier_name != "explicit" else _own_tier(mgr, ident)
        if own_tier is not None:
            _seed_telemetry(mgr, info, own_tier, seen)  # published with the restore event
        after_restore(mgr, info, tier_name, t0, fallbacks, own=own_tier is not None)
        say_passed_over(mgr, info, tier_name)
        if step is not None:
            _warn_if_rolled_back(mgr, info.step)
        _say_unread(mgr, info)
        _say_casts(mgr, info)
        _say_foreign_newer(mgr, info)
        _check_the_rest(mgr, tier_name, ident)
        return info
    _nothing_restored(mgr, t0, fallbacks, len(cands), step)
    return None


#: What a load of a path that holds no (such) version raises: nothing a second read mends.
_ABSENT_CODES = frozenset({"PCK-NOT-FOUND", "PCK-MANIFEST-MISSING"})


def _explicit_absent(
    mgr: CheckpointManager, tier_name: str, ident: str, step: int | None, err: CheckpointError
) -> NotFoundError | None:
    """The ``NotFoundError`` every rank raises when an explicit ``checkpoint=`` holds no version.

    A misspelt path was read twice and reported as ``PCK-DISTRIBUTED`` ("no version could be
    restored: 1 candidate(s) failed") wrapping the ``PCK-NOT-FOUND`` (api review 31): the
    caller's path, not a failure to retry. Agreed by every rank (one collective), so that a
    rank whose own error was a peer's failure raises the same.
    """
    if tier_name != "explicit":
        return None
    codes = _codes(err)
    if not any_rank(mgr, bool(codes & _ABSENT_CODES) and not codes & DAMAGE_CODES,
                    "whether the checkpoint exists"):
        return None
    which = f"no version of step {step}" if step is not None else "no committed version"
    out = NotFoundError(
        f"restore: checkpoint={ident!r} holds {which} ({err.message}); pass the path of a "
        "version directory (<root>/<attempt id>) or of a root, as `portable-ckpt ls ROOT` "
        "lists them, or leave checkpoint= out to restore this job's newest version",
        path=ident,
    )
    out.__cause__ = err
    return out


def _damage_agreed(
    mgr: CheckpointManager, tier_name: str, ident: str, err: CheckpointError
) -> str:
    """Whether every rank may pass over ``ident`` (a collective): rank 0's verdict.

    ``"unconfirmed"`` when rank 0 found that the damage its load reported does not come back
    at a third read (attack review 3 F7: an EIO, then one flipped bit, condemned an intact
    version and resumed an older step): no rank may pass over it. Otherwise ``"recorded"``
    (the damage was recorded), ``"elsewhere"`` (a node root's files other nodes hold) or
    ``"pass"``.

    Damage found again is recorded (:func:`_record_damage`); a failure without damage passes
    over the version as before (another rank's files out of reach, a node-local tier).
    """
    verdict = "pass"
    if mgr.rank == 0:
        try:
            verdict = _record_damage(mgr, tier_name, ident, err)
        except CheckpointError as exc:  # could not look: proves nothing either way
            _log.warning("cannot check the damage of %s again: %s", ident, exc)
            verdict = "unconfirmed"
    return str(broadcast_json(mgr, verdict, f"whether {ident} is damaged"))


def _check_the_rest(mgr: CheckpointManager, tier_name: str, ident: str) -> None:
    """Rank 0, in the background: checksum the restored version's files the load did not need.

    A load reads and checks every byte the state needs; a damaged entry it does not read
    (``torch.dcp_items``, which export uses) or a damaged writer index went unnoticed, and the
    version kept its passed verification while a deep verify failed it (chaos review F2). Its
    entries and indexes are small; damage is said on stderr and recorded as a failed
    verification (the job goes on from the bytes it proved; later restores choose another).
    """
    if mgr.rank != 0 or tier_name == "explicit" or mgr.tiers[tier_name].layout is not None:
        return
    storage = mgr.tiers[tier_name].storage

    def check() -> None:
        from portable_ckpt.io.checksum import verify_file
        from portable_ckpt.io.damage import confirm_damage
        from portable_ckpt.io.versions import load_manifest

        try:
            manifest = load_manifest(storage, ident)
            rest = sorted(p for p in manifest.files if not p.startswith("data/"))
            errors: list[CheckpointError] = []
            for rel in rest:
                try:
                    verify_file(storage, f"{ident}/{rel}", manifest.files[rel])
                except CheckpointError as exc:
                    # Without its traceback: the frames hold the file's read windows.
                    errors.append(exc.with_traceback(None))
            errors = confirm_damage(storage, ident, manifest.files, errors)
        except CheckpointError as exc:  # could not look: proves nothing
            _log.warning("restored %s: its other files could not be checked: %s", ident, exc)
            return
        damage = [e for e in errors if e.code in DAMAGE_CODES]
        for problem in errors:
            if problem.code not in DAMAGE_CODES:  # proves nothing about the bytes, but is said
                _log.warning("restored %s: a file could not be checked: %s", ident, problem)
        if not damage:
            return
        say(
            f"rank 0: restored {ident} from the {tier_name} tier from intact bytes, but "
            f"{len(damage)} of its files the restore did not need are damaged ({damage[0]}): "
            "recorded as a failed verification, so no later restore chooses it; the job's next "
            "save supersedes it"
        )
        _record_damage(mgr, tier_name, ident, damage[0], more=damage[1:], confirmed=True)

    mgr._post.append(mgr._bg.submit(check))


def _say_left_from_failed(
    mgr: CheckpointManager, info: LoadInfo, fallbacks: Sequence[Mapping[str, Any]]
) -> None:
    """The keys a fallback version lacks that a failed candidate holds: said, and listed.

    A candidate that failed part way (damage on one rank) wrote its values into the targets of
    the ranks that read them; the version restored instead does not hold these keys, so with
    ``strict=False`` they stay as that partial load left them: another step's values on some
    ranks, the fresh ones on others (SRE review F7). Listed in ``LoadInfo.left_from_failed``.
    """
    from portable_ckpt.io.versions import load_manifest

    held: set[str] = set()
    for f in fallbacks:
        tier = mgr.tiers.get(str(f["tier"]))
        try:
            if tier is not None:  # its tensors and entries (a Stateful's, the data position)
                m = load_manifest(tier.storage, str(f["checkpoint_id"]))
                held |= set(m.tensors) | set(m.entries)
        except CheckpointError:
            held |= set(info.missing_keys)  # cannot tell: every missing key may be such
    keys = left_from(info, held)
    if mgr.rank == 0 and keys:
        shown = shown_keys(keys)
        say(
            f"rank 0: restored step {info.step} after a newer version failed part way; "
            f"{len(keys)} key(s) of the state are not in step {info.step} but are in the failed "
            f"one ({shown}): the failed load may have written them on some ranks, so they may "
            "hold its values on some ranks and their initial values on others. Set them again "
            "on every rank (LoadInfo.left_from_failed lists them), or restore into a fresh state"
        )


def _tried(err: CheckpointError, verdict: str) -> dict[str, Any]:
    """Why a candidate was passed over: its damage (any rank's) first, else its error.

    ``verdict``: :func:`_damage_agreed`'s. A node root's file that another node holds is not
    damage (``"elsewhere"``): the version failed to load here.
    """
    damage = None if verdict == "elsewhere" else next(
        (f for f in (err, *getattr(err, "failures", ())) if f.code in DAMAGE_CODES), None)
    shown = err if damage is None else damage
    rank = getattr(shown, "rank", None)
    return {
        "reason": "unloadable" if damage is None else "damaged",
        "code": shown.code,
        "message": (f"rank {rank}: " if rank is not None else "") + shown.message[:500],
        "recorded": verdict == "recorded",
    }


def _say_unread(mgr: CheckpointManager, info: LoadInfo) -> None:
    """Rank 0: stored keys that no rank's state holds were not restored (a removed layer?).

    As with ``dcp.load``, ``strict`` covers the state's keys only; a job that resumes with
    fewer parameters than it saved should not learn it from a loss curve. A collective: each
    rank's state may hold keys the others lack (experts held by their own ranks), so rank 0's
    unread keys are checked against what the other ranks read (review of E1, R6: every expert
    parallel restore said "a layer removed since the save?").
    """
    unread = info.unexpected_keys
    if mgr.world_size > 1:
        comm = make_comm(mgr.process_group, mgr.timeout)
        theirs = comm.broadcast_json(unread if mgr.rank == 0 else None, "restore/unread")
        mine = set(info.unexpected_keys)
        read = [i for i, k in enumerate(theirs) if k not in mine]
        gathered = comm.gather_json(read, "restore/read")
        if gathered is None:
            return
        done = {i for r in gathered for i in r}
        unread = [k for i, k in enumerate(theirs) if i not in done]
    if mgr.rank != 0 or not unread:
        return
    shown = ", ".join(repr(k) for k in unread[:4]) + (", ..." if len(unread) > 4 else "")
    say(
        f"rank 0: restored step {info.step}, but {len(unread)} stored key(s) (tensors and "
        f"plain values) are in no rank's state and were not read ({shown}): a layer removed "
        "since the save? (LoadInfo.unexpected_keys lists each rank's)"
    )


def _say_foreign_newer(mgr: CheckpointManager, info: LoadInfo) -> None:
    """Rank 0: newer versions of a format this library does not read were passed over.

    After an image rollback, a newer library's saves are ``foreign`` (R-COMMIT-1): readers skip
    them, and the job resumed older steps with a warning on a logger nobody routes (multi-job
    review F6). Said on stderr, like the other surprises of a restore.
    """
    if mgr.rank != 0:
        return
    newer = [
        v.id for tier in mgr.tiers.values()
        for v in _versions_or_none(tier) if v.status == "foreign" and v.step >= info.step
    ]
    if newer:
        say(
            f"rank 0: restored step {info.step}, but {len(newer)} newer version(s) were written "
            f"by a format version this library does not read and were passed over "
            f"({', '.join(newer[:3])}{', ...' if len(newer) > 3 else ''}): a newer "
            "portable_ckpt saved them (an image rolled back?); upgrade to resume from them. "
            "This job's next saves go beside them"
        )


def _say_casts(mgr: CheckpointManager, info: LoadInfo) -> None:
    """Rank 0: tensors were loaded into other dtypes than stored (a config changed?).

    The manager's stderr, like removed layers: a job that changed its dtype should not learn
    it from its loss (multi-job review F5). Casts that destroy values were refused already.
    """
    if mgr.rank != 0 or not info.casts:
        return
    shown = ", ".join(f"{c['key']!r} {c['stored']} → {c['target']}" for c in info.casts[:3])
    flushed = sum(int(c["flushed"]) for c in info.casts)
    lost = f"; {flushed} non-zero value(s) became 0 on rank 0" if flushed else ""
    say(
        f"rank 0: restored step {info.step} into {len(info.casts)} tensor(s) of another dtype "
        f"than stored ({shown}{', ...' if len(info.casts) > 3 else ''}){lost}: a changed "
        "config? (LoadInfo.casts lists them; restore(strict_dtype=True) refuses casts)"
    )


def _codes(e: CheckpointError) -> set[str]:
    """The codes of ``e`` and of every rank's failure it gathers."""
    return {e.code} | {str(f.code) for f in getattr(e, "failures", ())}


def _again(mgr: CheckpointManager, ident: str, err: CheckpointError) -> None:
    """Rank 0 says that a candidate's load failed and is tried once more before anything else.

    Every rank does the same: the error is the same on every rank. A bit flipped once on its
    way, a 404 of an inconsistent store, an EIO of a failover are gone at the second read; a
    fallback would resume an older step, and a damage record would condemn the version for
    good (multi-job review F10, F12; attack review 2 F12).
    """
    if mgr.rank == 0:
        say(f"restore of {ident} failed ({err}); reading it once more")


def _fall_back_or_raise(mgr: CheckpointManager, e: Exception) -> CheckpointError:
    """Return ``e`` when every rank may try the next candidate; re-raise it otherwise.

    Every rank takes part in this agreement, whatever it saw: one rank's damage is its peers'
    PCK-DISTRIBUTED, and an error of the target state (contract, shapes, keys) would repeat on
    every version, so it is raised everywhere.
    """
    if any(f.message.startswith(_STOPS) for f in getattr(e, "failures", ())):
        raise e  # a peer was interrupted (Ctrl-C) and left: no more collectives (race review F3)
    caller = not isinstance(e, CheckpointError) or isinstance(e, _CALLER_ERRORS)
    if any_rank(mgr, caller, "whether to try the next version") or not isinstance(
        e, CheckpointError
    ):
        raise e
    return e


#: How a peer's failure reads when its process was stopped (it takes no further part).
_STOPS = ("KeyboardInterrupt", "SystemExit")


def _warn_if_rolled_back(mgr: CheckpointManager, restored: int) -> None:
    """Rank 0: warn when newer versions exist than the step a job asked to restore.

    Versions are ordered by step (R-ID-4): the steps this job saves next sort before the newer
    ones, so ``keep_last`` deletes them first and a later ``restore()`` resumes the newer step,
    silently undoing the rollback.
    """
    if mgr.rank != 0:
        return
    newer = sorted(
        {
            v.step
            for tier in mgr.tiers.values()  # a node root lists every version: its record is
            for v in _versions_or_none(tier, annotations=True)  # published in each (SRE F6)
            # one that failed verification is no step a restore resumes (incident R7, R4)
            if v.status == "committed" and not v.verification_failed and v.step > restored
        }
    )
    if newer:
        text = (
            f"restored step {restored}, but this job also holds newer steps {newer[:8]}: "
            f"versions are ordered by step, so the steps saved from here sort before step "
            f"{newer[-1]}; keep_last deletes them first and the next restore() without step= "
            f"resumes step {newer[-1]}. To train a new branch from step {restored}, move the "
            "newer versions away or save to another root"
        )
        _log.warning(text)
        say(text)
        # the saves from here sort below those steps: said now, not again at the first save
        mgr._warned.update(f"below-newer:{name}" for name in mgr.tiers)


def _versions_or_none(tier: Tier, *, annotations: bool = False) -> list[Any]:
    """The tier's versions for a message (a listing error only leaves the message shorter)."""
    try:
        return list_versions(tier.storage, annotations=annotations, missing_ok=True)
    except CheckpointError:
        return []




def _record_damage(
    mgr: CheckpointManager,
    tier_name: str,
    ident: str,
    e: CheckpointError,
    more: Sequence[CheckpointError] = (),
    *,
    confirmed: bool = False,
) -> str:
    """Rank 0: record a failed verification of a version whose bytes proved damaged.

    Returns ``"recorded"``, ``"pass"`` (nothing recorded: no damage, a tier where it is not
    recorded, or a record that could not be written), ``"elsewhere"`` (a node root's files
    that other nodes hold) or ``"unconfirmed"`` (the damage did not come back).

    Without it the version stays ``committed`` to ``ls``, counts in ``keep_last`` and is tried
    first again by every restart; with it, it is never restored automatically (R-DRILL-8).
    A node-local tier is left alone: its files may just be on a node that is gone. Findings
    not ``confirmed`` yet (a restore's) are read again first: a restore that met an EIO, then
    one flipped bit, recorded an intact version as failed (attack review 3 F7). The one way a
    reader records damage: :func:`~portable_ckpt.io.damage.record_read_damage`.
    """
    if mgr.rank != 0 or tier_name == "explicit":
        return "pass"
    tier = mgr.tiers[tier_name]
    if tier.layout is not None:
        return "pass"
    found = [(e.code, e.message, e.path)] + [
        (f.code, f"rank {f.rank}: {f.message}", None) for f in getattr(e, "failures", ())
    ] + [(m.code, m.message, m.path) for m in more]
    if not any(c in DAMAGE_CODES for c, _, _ in found):
        return "pass"
    from portable_ckpt.io.damage import record_read_damage
    from portable_ckpt.io.versions import load_manifest

    try:
        manifest = load_manifest(tier.storage, ident)
    except CheckpointError as exc:
        if not confirmed:
            raise  # the caller cannot tell: unconfirmed
        _log.error("cannot record that %s of the %s tier is damaged: %s", ident, tier_name, exc)
        say(_unrecorded_text(ident, tier_name, exc))
        return "pass"
    verdict, _, notes = record_read_damage(
        tier.storage, ident, manifest, found,
        verifier="portable_ckpt CheckpointManager.restore", confirmed=confirmed,
    )
    for x in notes:
        if verdict == "unrecorded":
            _log.error("cannot record that %s of the %s tier is damaged: %s", ident, tier_name,
                       x)
            say(_unrecorded_text(ident, tier_name, x))
        else:
            say(f"rank 0: {ident}: {x.message[:600]}")
    # Not recorded: not "failed verification" in the restore's report (maintainer review 4).
    return {"unrecorded": "pass", "none": "pass"}.get(verdict, verdict)


def _unrecorded_text(ident: str, tier_name: str, why: object) -> str:
    """What rank 0 says on stderr when a damaged version's failure cannot be recorded.

    The logger is silent in a training job: every restart read the damaged version again, and
    nobody was told why (fault review 27, F6: a full or read-only root).
    """
    return (f"rank 0: {ident} of the {tier_name} tier is damaged, and that could not be "
            f"recorded ({str(why)[:400]}): every restart reads it again before it falls back "
            "until it is recorded; free space on the root or make it writable, then run "
            "`portable-ckpt verify ROOT/ID --deep`")


def _nothing_restored(
    mgr: CheckpointManager, t0: float, fallbacks: list[dict[str, Any]], n: int, step: int | None
) -> None:
    """No version restored: ``None`` for an empty job (first run), an error if all failed.

    A step asked for and not found is an error too: "start from scratch" is not what a job
    that names a step wants. So is a job whose only versions failed verification: they are no
    candidates, and a retry after a failed restore would otherwise start from scratch (and its
    retention would then delete them).
    """
    failed: list[str] = []
    if not fallbacks:
        failed = [
            f"{tier.root.rstrip('/')}/{v.id}"
            for tier in mgr.tiers.values()
            for v in _versions_or_none(tier, annotations=True)
            if (step is None or v.step == step)
            and v.status == "committed"
            and v.verification_failed
        ]
    all_failed = not fallbacks and any_rank(mgr, bool(failed), "the restore's outcome")
    missing = not fallbacks and not all_failed and step is not None
    mgr.telemetry.emit(
        "restore",
        ok=not (fallbacks or all_failed or missing),
        tier=None,
        step=None,
        seconds=round(time.perf_counter() - t0, 6),
        fallbacks=fallbacks,
        candidates=n,
        failed_verification=len(failed),
    )
    if all_failed:
        which = f"the versions of step {step}" if step is not None else (
            "every committed version of this job"
        )
        raise NotFoundError(
            f"{which} failed verification ({', '.join(failed[:4]) or 'see rank 0'}: "
            "`portable-ckpt ls` shows them as failed in its VERIFIED column) and are never "
            "restored automatically (spec R-DRILL-8)" + _way_back(mgr, failed) + "; to read "
            "one anyway, pass checkpoint=<that path>; to start this job afresh, move them away"
        )
    if missing:
        raise NotFoundError(
            f"no committed version of step {step} in any tier of this job "
            f"({mgr.tiers['durable'].root}"
            + (f", {mgr.tiers['fast'].root}" if "fast" in mgr.tiers else "")
            + "); `portable-ckpt ls` lists the steps there are"
        )
    if fallbacks:
        raise DistributedError(
            f"no version could be restored: {len(fallbacks)} candidate(s) failed, last "
            f"{fallbacks[-1]['checkpoint_id']} ({fallbacks[-1]['code']}: "
            f"{fallbacks[-1]['message']})"
        )
    _say_not_versions(mgr)


def _way_back(mgr: CheckpointManager, failed: Sequence[str]) -> str:
    """How the newest failed version comes back: its recorded copy, or a repair (R4, R2)."""
    if not failed:
        return ""
    from portable_ckpt.io.hints import clear_failed, copy_back

    newest = max(failed, key=lambda path: path.rsplit("/", 1)[-1])
    root, _, ident = newest.rpartition("/")
    tier = next((t for t in mgr.tiers.values() if t.root.rstrip("/") == root), None)
    copies, _ = copies_of(tier.storage, ident) if tier is not None else ([], None)
    back = (f"; a copy of {ident} is recorded at {copies[0]} (verified when made, not since): "
            f"{copy_back(newest, copies[0])}" if copies else f"; no copy of {ident} is recorded")
    # A version set aside and copied back has no failed record to clear: the other way.
    return (back + f"; or{' instead' * bool(copies)}, once a damaged file is replaced by its "
            f"intact copy, `{clear_failed(newest)}` makes it restorable (docs/recovery.md)")


def _say_not_versions(mgr: CheckpointManager) -> None:
    """Rank 0: a start from scratch beside attempts that are no version is said.

    A replication killed part way leaves an incomplete attempt on the durable root; with the
    node disks gone, restore() returned None without a word and the job began at step 1
    while `ls` showed an attempt of a later step (SRE review F5).
    """
    if mgr.rank != 0:
        return
    left = [(v.step, f"{tier.root.rstrip('/')}/{v.id}", v.status)
            for tier in mgr.tiers.values() for v in _versions_or_none(tier)
            if v.status != "committed"]
    if left:
        step, path, status = max(left)
        say(
            f"rank 0: no version to restore: starting from scratch, although the tiers hold "
            f"{len(left)} attempt(s) that are not versions (newest: step {step}, {status}, "
            f"{path}): saves that never committed, which no reader restores"
        )


def load_one(
    mgr: CheckpointManager,
    state: Mapping[str, Any],
    tier_name: str,
    ident: str,
    allow_statistical: bool,
    record_ranges: bool = False,
    *,
    strict: bool = True,
    strict_dtype: bool = False,
    hyper: Hyperparameters | None = None,
    step: int | None = None,
) -> LoadInfo:
    """Load one candidate (a version directory, or an attempt of a tier).

    ``step``: the caller's, for an explicit ``checkpoint=`` (a root's version of that step, or
    a version directory that must hold it); a tier's candidate was chosen by it already.
    """
    hyper = Hyperparameters() if hyper is None else hyper
    kwargs: dict[str, Any] = {
        "process_group": mgr.process_group,
        "allow_statistical": allow_statistical,
        "timeout": mgr.timeout,
        "record_ranges": record_ranges,
        "strict": strict,
        "strict_dtype": strict_dtype,
    }
    if tier_name == "explicit":
        # (step was dropped: restore(checkpoint=v, step=99) loaded v's step 1: api review 31)
        return load_into(state, ident, hyper, step=step, **kwargs)  # a version directory
    tier = mgr.tiers[tier_name]
    if tier.layout is not None:
        reach_node_local(mgr, tier, state, ident)
    return load_into(state, tier.storage, hyper, checkpoint_id=ident, **kwargs)


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
    try:  # a node that cannot read its copy offers none; every rank reaches the exchange
        if tier.storage.exists(rel):
            raw = tier.storage.read_all(rel, max_size=jsonio.MAX_MANIFEST_BYTES)
            mine = raw.decode("utf-8", "replace")
    except CheckpointError as e:
        _log.warning("rank %d: cannot read %s of its node root: %s", mgr.rank, rel, e)
    text = next((t for t in comm.allgather_json(mine, "restore/fast-manifest") if t), None)
    if text is None:
        raise FileMissingError(f"no node root of the fast tier holds {rel}", path=rel)
    usable, report = prepare_fast_restore(comm, tier.layout, tier.storage, ident, state, text)
    if not usable:
        raise FileMissingError(
            f"fast tier version {ident}: {report['unreachable']} file(s) a rank needs are on "
            f"no reachable node root ({report['missing']} missing before fetching)",
            path=ident,
        )
    mgr._fetched = report  # this restore's: a failed candidate's report is not the restore's


def _own_tier(mgr: CheckpointManager, checkpoint: str) -> str | None:
    """The tier whose root an explicit ``checkpoint=`` is, or holds it as a version, or ``None``.

    ``load`` takes a root's newest version (review D2).
    """
    path = storage_url(checkpoint).rstrip("/")
    for name, tier in mgr.tiers.items():
        root = tier.root.rstrip("/")
        for candidate in (path, path.rsplit("/", 1)[0]):
            if candidate == root or (
                local_path(root) is not None
                and os.path.realpath(candidate) == os.path.realpath(root)
            ):
                return name
    return None


def _seed_telemetry(
    mgr: CheckpointManager, info: LoadInfo, tier_name: str,
    seen: Mapping[str, Sequence[VersionInfo]],
) -> None:
    """Seed the textfile with the restored version's step and, on rank 0, commit times.

    A restart rebuilt the Prometheus textfile from the new process's events only: when its
    saves failed, ``pck_save_step`` was gone, and no gauge dated the newest commit (SRE review
    2, W5). The commit times are rank 0's, which reports the commits (another rank's copy would
    never move): the restored version's for its tier, and for every other tier its newest
    committed version's (V5: restored from the fast tier, the durable tier's gauge was absent
    until its next save). A time after now (a host whose clock was ahead, V4) is taken as now:
    never a freshness the alert cannot see through. Only versions of this job's tiers: another
    run's is no save of this job. Never raises: the restore succeeded.
    """
    from portable_ckpt.io.annotations import now_us, timestamp_us

    now = now_us()

    def seconds(text: str | None) -> float | None:
        us = timestamp_us(text)
        return min(us, now) / 1e6 if us >= 0 else None

    stamps: dict[str, float | None] = {}
    if mgr.rank == 0 and mgr.telemetry.prometheus:
        text = next((v.committed_at for v in seen.get(tier_name, ())
                     if v.id == info.checkpoint_id), None)
        if text is None:  # an explicit checkpoint=, a node-local version of another node
            try:
                text = load_manifest(mgr.tiers[tier_name].storage, info.checkpoint_id).committed_at
            except CheckpointError as e:  # the restore succeeded: the metrics must not undo it
                _log.info("cannot read the commit time of %s for the metrics: %s",
                          info.checkpoint_id, e)
        stamps[tier_name] = seconds(text)
        for other, versions in seen.items():
            if other != tier_name and other in mgr.tiers:
                times = [t for v in versions if v.status == "committed"
                         and (t := seconds(v.committed_at)) is not None]
                stamps[other] = max(times, default=None)
    mgr.telemetry.seed(tier_name, step=info.step, committed_at=stamps.get(tier_name))
    for other, when in stamps.items():
        if other != tier_name and when is not None:
            mgr.telemetry.seed(other, committed_at=when)


def after_restore(
    mgr: CheckpointManager,
    info: LoadInfo,
    tier_name: str,
    t0: float,
    fallbacks: list[dict[str, Any]],
    *,
    own: bool = True,
) -> None:
    """Start the time-to-resume clock; report the restore (bytes, seconds, slowest rank).

    ``own``: the version is one of this manager's tiers'. Only then is its step this job's last
    save: another run's version (a seed, a converted checkpoint) made every step up to its
    own unsaved, preemption included (fine-tuning review F1: a fine-tune counting from 1 after
    a step-50 seed saved nothing for 50 steps).
    """
    mgr._last_save_step = info.step if own else None
    mgr._restored_step = info.step  # the resume event's step, whoever's version it was
    mgr._last_save_time = time.monotonic()
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
        passed_over=info.passed_over,
        # An attempt without commit record beside every writer's index is what a crash during
        # a save's commit leaves as well as a lost record: counted apart, so that the alert on
        # versions passed over does not page after every such crash (on-call review 23, N1).
        passed_over_count=len([r for r in info.passed_over if r["reason"] != "uncommitted"])
        + info.passed_over_more,
        uncommitted_count=len([r for r in info.passed_over if r["reason"] == "uncommitted"]),
        fetched_from_peers=mgr._fetched,
    )
    mgr._fetched = None
