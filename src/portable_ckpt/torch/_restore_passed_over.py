"""What a restore passed over: the newer versions it did not resume, and where their copies are.

Incident review R4: a restore passed over a damaged, invalid or failed newest version without a
word, or without saying where its verified copy was, and the job retrained the steps between.
Rank 0 names each such version (why, and each destination a copy record names, with the
commands that bring it back) in :attr:`LoadInfo.passed_over` and on stderr. What it reads
never makes the restore fail.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from portable_ckpt._printable import one_line
from portable_ckpt.io.annotations import failed_verifications, failure_order
from portable_ckpt.io.copy import copies_of
from portable_ckpt.io.recommit import every_writer_indexed
from portable_ckpt.io.versions import version_order
from portable_ckpt.torch._inflight import say
from portable_ckpt.torch._manager_decisions import broadcast_json
from portable_ckpt.torch.info import LoadInfo

if TYPE_CHECKING:
    from portable_ckpt.io.versions import VersionInfo
    from portable_ckpt.torch.manager import CheckpointManager

__all__ = ["PASSED_OVER_NAMED", "passed_over", "say_passed_over"]

_log = logging.getLogger("portable_ckpt")


#: Versions a restore passed over that it names one by one (their copy records read).
PASSED_OVER_NAMED = 8
#: Seconds after which rank 0 reads no more copy records of the versions it names (a quarter
#: of the manager's collective timeout when that is shorter; one read begun runs to its end).
COPIES_SECONDS = 10.0
#: How each reason reads.
_REASONS = {
    "damaged": "damaged on read",
    "unloadable": "failed to load",
    "invalid": "invalid commit record",
    "failed_verification": "failed verification",
    "uncommitted": "no commit record, but every writer's index",
}


def passed_over(
    mgr: CheckpointManager,
    info: LoadInfo,
    step: int | None,
    seen: Mapping[str, Sequence[VersionInfo]],
    tried: Mapping[tuple[str, str], Mapping[str, Any]],
) -> None:
    """Fill ``info.passed_over``: the newer versions the restore passed over (a collective).

    Rank 0 finds them (incident review R4: a restore passed over a damaged, invalid or failed
    newest version, said nothing, or not where its verified copy was, and the steps in
    between were retrained) and broadcasts them. Never raises for what it reads: a storage
    error only leaves the report shorter.
    """
    found: dict[str, Any] = {"named": [], "more": 0}
    if mgr.rank == 0:
        try:
            found = _find_passed_over(mgr, info, step, seen, tried)
        except Exception as exc:  # the restore succeeded: the report must not undo it
            _log.warning("restored %s: cannot tell which newer versions it passed over: %s",
                         info.checkpoint_id, exc)
    got = broadcast_json(mgr, found if mgr.rank == 0 else None, "the versions passed over")
    info.passed_over = list(got["named"])
    info.passed_over_more = int(got["more"])


def _find_passed_over(
    mgr: CheckpointManager,
    info: LoadInfo,
    step: int | None,
    seen: Mapping[str, Sequence[VersionInfo]],
    tried: Mapping[tuple[str, str], Mapping[str, Any]],
) -> dict[str, Any]:
    """Rank 0: ``{"named": [...], "more": n}`` (see :attr:`LoadInfo.passed_over`).

    A version is passed over when it is newer than the one restored (in the order of §3) and
    the restore tried it and failed, or did not try it: its commit record is
    invalid (or lost), or a verification of it failed. Of the step asked for only, with
    ``step=`` (newer steps were passed over on purpose: a rollback says so itself).
    """
    restored = info.checkpoint_id
    by_id = {v.id: v for vs in seen.values() for v in vs}

    def newer(vid: str) -> bool:
        # In the order of §3 (step, commit time, id) where both are committed (mutation audit
        # 27: an older commit of the step, created later, was named passed over), else by id
        # (an attempt without a commit time).
        v, mine = by_id.get(vid), by_id.get(restored)
        if v is not None and mine is not None and v.committed_at and mine.committed_at:
            return version_order(v) > version_order(mine)
        return vid > restored

    # The other ranks wait in the broadcast while rank 0 reads: a slow store must not turn a
    # restore that succeeded into a collective timeout (review of the change).
    deadline = time.monotonic() + min(COPIES_SECONDS, (mgr.timeout or COPIES_SECONDS * 4) / 4)
    rows: dict[tuple[str, str], Mapping[str, Any]] = {
        # (not a node-local version then restored from the durable tier: the same one)
        key: why for key, why in tried.items() if newer(key[1]) and key[0] in mgr.tiers
    }
    for tier_name, versions in seen.items():
        for v in reversed(versions):  # newest first: a deadline reached drops the oldest
            if not newer(v.id) or (step is not None and v.step != step):
                continue
            if (tier_name, v.id) in rows:
                continue
            if v.status == "invalid":
                rows[(tier_name, v.id)] = {
                    "reason": "invalid", "code": v.error_code, "message": str(v.error),
                    "recorded": False,
                }
            elif (v.status == "incomplete" and not v.being_deleted
                  and time.monotonic() < deadline
                  and every_writer_indexed(mgr.tiers[tier_name].storage, v.id)):
                # A save cut short at its commit, or a version whose record was lost: with
                # no drill, copy or verification record nothing tells which, and retention
                # deletes it after the grace period (on-call review 23, F2: the restart went
                # back a step without a word, and the data went too).
                rows[(tier_name, v.id)] = {
                    "reason": "uncommitted", "code": "PCK-MANIFEST-MISSING",
                    "message": "a save cut short at its commit, or a version whose record was "
                               "lost",
                    "recorded": False,
                }
            elif v.status == "committed" and v.verification_failed:
                failed = max(  # the newest failure no pass cleared (spec §14.5)
                    failed_verifications(v.verifications),
                    key=failure_order,
                    default={},
                )
                errors = failed.get("errors") or []
                first = errors[0] if errors and isinstance(errors[0], dict) else {}
                rows[(tier_name, v.id)] = {
                    "reason": "failed_verification",
                    "code": first.get("code"),
                    "message": str(first.get("message") or (
                        f"its verification {failed.get('verification_id')} failed")),
                    "recorded": True,
                }
    order = sorted(rows, key=lambda k: (k[1], k[0] == "fast"), reverse=True)
    # One version in both tiers is one version passed over (the fast tier's row is named).
    order = list({k[1]: k for k in reversed(order)}.values())[::-1]
    named = [
        _passed_row(mgr, tier_name, ident, rows[(tier_name, ident)], deadline)
        for tier_name, ident in order[:PASSED_OVER_NAMED]
    ]
    # "more" counts versions: attempts without a record beyond the named ones are not counted
    # (a restart loop killed during commits must not page through the count: review E2)
    rest = order[PASSED_OVER_NAMED:]
    return {"named": named,
            "more": sum(1 for k in rest if rows[k]["reason"] != "uncommitted")}


def _passed_row(
    mgr: CheckpointManager, tier_name: str, ident: str, row: Mapping[str, Any],
    deadline: float,
) -> dict[str, Any]:
    """One version passed over, with the roots that hold a verified copy of it."""
    from portable_ckpt.format.naming import parse_attempt_step
    from portable_ckpt.io.hints import copy_back_commands

    tier = mgr.tiers[tier_name]
    root = tier.root.rstrip("/")
    copies, problem = (copies_of(tier.storage, ident) if time.monotonic() < deadline else (
        [], f"not read: the restore's {COPIES_SECONDS:g} s for its report ran out "
        "(`portable-ckpt ls` names the copies)"))
    path = f"{root}/{ident}"
    commands = copy_back_commands(path, copies[0]) if copies else []
    return {
        "checkpoint_id": ident,
        "step": parse_attempt_step(ident),
        "tier": tier_name,
        "path": path,
        "reason": row["reason"],
        "code": row["code"],
        "message": one_line(str(row["message"]).removeprefix(f"[{row['code']}] "), 300),
        "recorded_failed": bool(row["recorded"]),
        "copies": copies,
        "copies_error": None if problem is None else problem[:300],
        "commands": commands,
    }


def say_passed_over(mgr: CheckpointManager, info: LoadInfo, tier_name: str) -> None:
    """Rank 0, once: the newer versions this restore passed over, and how to bring one back.

    A WARNING of the package logger (event ``restore.passed_over``, with the rows of
    :attr:`LoadInfo.passed_over`) and the same lines on stderr.
    """
    if mgr.rank != 0 or not info.passed_over:
        return
    import shlex

    from portable_ckpt._printable import printable
    from portable_ckpt.io.hints import copy_back
    from portable_ckpt.logs import log_event

    total = len(info.passed_over) + info.passed_over_more
    head = (f"rank 0: restored step {info.step} ({info.checkpoint_id}) from the {tier_name} "
            f"tier, passing over {total} newer version(s)")
    if info.passed_over_more == 0 and all(r["reason"] == "uncommitted" for r in info.passed_over):
        # Most often the last run was killed while committing a save: nothing was lost, and
        # "trained again unless you bring one back" read as an incident (stop 27 review).
        lines = [
            f"{head} without a commit record: most often the last run was killed while "
            "committing that save, and nothing needs doing (the steps after step "
            f"{info.step} are trained again); only if the job's events name a commit of it "
            "was its record lost, and recommit brings it back (docs/recovery.md; "
            "LoadInfo.passed_over lists them)"
        ]
    else:
        lines = [
            f"{head}: the steps after step {info.step} are trained again unless you stop the "
            "job and bring one back (docs/recovery.md; LoadInfo.passed_over lists them)"
        ]
    for row in info.passed_over:
        tier = mgr.tiers.get(str(row["tier"]))
        code = f"[{row['code']}] " if row["code"] else ""
        why = _REASONS.get(str(row["reason"]), "passed over")
        line = f"  step {row['step']}, {row['path']}: {why} ({code}{one_line(row['message'], 200)})"
        if row["recorded_failed"] and tier is not None and tier.retention.active:
            line += (
                "; this job's retention deletes versions that failed verification unless they "
                f"are pinned (`portable-ckpt pin {shlex.quote(str(row['path']))}`)"
            )
        if row["reason"] == "uncommitted":
            line += (
                "; a job killed while committing that save leaves the same; if it was "
                "committed (the job's events name a commit of it), `portable-ckpt recommit "
                f"{shlex.quote(str(row['path']))} --was-committed` brings it back, before this "
                "job's retention deletes it once the grace period has passed (recommit checks "
                "that its writers' files cover every tensor exactly once)"
            )
        if row["copies"]:
            line += (
                f"; a copy is recorded at {', '.join(row['copies'])} (verified when made, not "
                f"since: check it is still there with `portable-ckpt ls`): "
                f"{copy_back(str(row['path']), str(row['copies'][0]))}, and restart the job"
            )
        elif not row["copies_error"]:
            line += "; no verified copy of it is recorded"
        if row["copies_error"]:
            line += (
                f"; its copy records could not all be read ({one_line(row['copies_error'], 200)}): "
                "`portable-ckpt ls` names its copies"
            )
        lines.append(line)
    if info.passed_over_more:
        lines.append(
            f"  and {info.passed_over_more} more (`portable-ckpt ls "
            f"{mgr.tiers[str(info.passed_over[0]['tier'])].root}` lists them)"
        )
    # Escaped for a terminal line by line: the rows quote records from the root (B2).
    text = "\n".join(printable(line) for line in lines)
    log_event(
        _log, "restore.passed_over",
        {"checkpoint_id": info.checkpoint_id, "step": info.step, "tier": tier_name,
         "passed_over": info.passed_over, "more": info.passed_over_more},
        "%s", text, rank=mgr.rank, level=logging.WARNING,
    )
    for line in lines:
        say(line)
