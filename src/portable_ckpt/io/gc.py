"""Retention and garbage collection of a root (spec §15).

:func:`gc` keeps the newest versions (and the protected ones: drilled, verified, copied, a
rollback's new branch), deletes the rest commit record first, and removes abandoned attempts
once quiet for the grace period on the storage's clock (:func:`storage_clock`). Nothing is
deleted that was not positively classified (:mod:`portable_ckpt.io.versions`). This module
decides what goes; :mod:`portable_ckpt.io.deletion` deletes one attempt (its mark, its commit
record, then the rest, R-GC-3 and R-GC-13) and :mod:`portable_ckpt.io.clock` asks the
storage's clock.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from portable_ckpt.errors import (
    CheckpointError,
    LimitError,
    StorageError,
    UsageError,
    may_pass,
)
from portable_ckpt.format import usage
from portable_ckpt.format.naming import PROBE_RE, attempt_time
from portable_ckpt.format.vocab import DEFAULT_GRACE_SECONDS
from portable_ckpt.io.annotations import (
    ANNOTATION_KINDS,
    epoch_us,
    listed_info,
    prune_quietly,
    superseded,
    timestamp_key,
)
from portable_ckpt.io.clock import PROBE_LEFTOVER_SECONDS, same_root, storage_clock
from portable_ckpt.io.deletion import (
    DELETION_DIR,
    delete_attempt,
    deletion_marks,
    remark_if_record_gone,
)
from portable_ckpt.io.pins import PIN_DIR, read_pins
from portable_ckpt.io.versions import (
    COMMITTED,
    FOREIGN,
    INCOMPLETE,
    INVALID,
    STRAY,
    UNREADABLE,
    VersionInfo,
    classify_attempt,
    list_versions,
    load_manifest,
    root_must_exist,
    upload_only_attempts,
    version_order,
)
from portable_ckpt.logs import Progress, log_event
from portable_ckpt.storage import ObjectInfo, Storage, local_path, open_storage

__all__ = [
    "CLOCK_SKEW_SAID",
    "PROBE_LEFTOVER_SECONDS",
    "RETIRE_TOLERANCE_SECONDS",
    "GcReport",
    "check_grace",
    "check_retention",
    "gc",
    "storage_clock",
]

_log = logging.getLogger(__name__)


@dataclass
class GcReport:
    """What gc removed or would remove (``dry_run``), and what it left alone and why.

    ``unknown`` lists the attempts gc could not classify (``{"id", "status", "code",
    "message", "retryable"}``; ``retryable``: the cause may pass by itself, as a store that did
    not answer, unlike a permission): they were not touched, and ``complete`` is False.
    ``foreign`` lists versions of a format this implementation does not implement: never
    garbage, never counted in
    ``keep``. ``foreign_keys`` lists entries that are not the format's (e.g. ``<attempt>//x`` on
    an object store, a FIFO in a local attempt) that gc found and left where they are.
    """

    deleted: list[str] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    #: Committed versions that failed verification (kept or deleted): never restored, so a
    #: kept one is no version to resume (incident review 2, F7).
    failed_verification: list[str] = field(default_factory=list)
    protected: str | None = None
    kept_for_copy: list[str] = field(default_factory=list)
    #: Destinations of copy records that could not be asked whether they hold the copy.
    copy_unasked: list[str] = field(default_factory=list)
    #: Whether every cause in ``copy_unasked`` may pass by itself (a store that did not
    #: answer): then the copies are not known to be missing, and the CLI exits 75, not 1.
    copy_unasked_retryable: bool = True
    aborted_uploads: int = 0
    dry_run: bool = False
    unknown: list[dict[str, Any]] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    foreign_keys: list[str] = field(default_factory=list)
    #: Attempts without a commit record left alone because something was written to them
    #: within the grace period (a save may be in progress): ``{"id", "status", "age_seconds",
    #: "being_deleted", "empty"}`` (``empty``: no file left in it, a save that wrote nothing
    #: yet or what a stopped gc left).
    in_grace: list[dict[str, Any]] = field(default_factory=list)
    #: Attempts whose commit record is there but invalid, kept (R-GC-10): committed versions
    #: damaged after their commit. ``{"id", "code", "message"}``; ``delete_invalid`` deletes them.
    damaged: list[dict[str, Any]] = field(default_factory=list)
    #: Committed versions of lower steps than the latest but committed after it (a job resumed
    #: from an older step: a rollback's new branch), kept: readers restore the latest, not them.
    newer_branch: list[str] = field(default_factory=list)
    #: Committed versions a later commit at the same or a lower step abandoned, deleted by
    #: ``retire_abandoned`` (or to be deleted).
    retired: list[str] = field(default_factory=list)
    #: Versions ``retire_abandoned`` would retire but kept because they are pinned: while one
    #: is, the rollback's branch is not the latest.
    retire_pinned: list[str] = field(default_factory=list)
    #: Attempts kept because a pin record names them (R-GC-11); when the pins could not be read,
    #: every attempt with a commit record (any of them may be pinned).
    pinned: list[str] = field(default_factory=list)
    #: Superseded drill, copy and verification records removed from kept versions (R-DRILL-9).
    pruned_records: int = 0
    #: Versions ``retire_abandoned`` did not retire because the store's clock does not confirm
    #: the writers' (``{"id", "reason"}``).
    retire_doubted: list[dict[str, Any]] = field(default_factory=list)
    #: Seconds this host's clock is ahead of the storage's (negative: behind), when more than a
    #: minute; attempts were dated on the storage's clock.
    clock_skew: float | None = None
    #: Deleted attempts (their commit record is gone) whose other files could not all be
    #: deleted: ``{"id", "code", "message", "retryable"}``; the next gc removes them as
    #: abandoned.
    left_behind: list[dict[str, Any]] = field(default_factory=list)
    #: Attempts planned for deletion that another process deleted first (an overlapping gc, a
    #: manager's retention): not in ``deleted`` or ``abandoned``, which count what this run
    #: deleted (scripting review F7: three overlapping runs reported 615 of 297 versions).
    gone: list[str] = field(default_factory=list)
    #: Attempts listed without a commit record that were committed while gc ran (a save's
    #: commit during its listing): new versions, left to the next gc, no problem.
    committed_meanwhile: list[str] = field(default_factory=list)
    #: Deletion marks removed from committed versions gc keeps (R-GC-13): what a gc stopped
    #: before the commit record went left.
    marks_cleared: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Whether every attempt was classified (nothing skipped for a storage error)."""
        return not self.unknown

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "deleted": self.deleted,
            "abandoned": self.abandoned,
            "kept": self.kept,
            "failed_verification": self.failed_verification,
            "protected": self.protected,
            "kept_for_copy": self.kept_for_copy,
            "copy_unasked": self.copy_unasked,
            "copy_unasked_retryable": self.copy_unasked_retryable,
            "aborted_uploads": self.aborted_uploads,
            "dry_run": self.dry_run,
            "foreign": self.foreign,
            "foreign_keys": self.foreign_keys,
            "in_grace": self.in_grace,
            "damaged": self.damaged,
            "newer_branch": self.newer_branch,
            "retired": self.retired,
            "pinned": self.pinned,
            "retire_pinned": self.retire_pinned,
            "pruned_records": self.pruned_records,
            "retire_doubted": self.retire_doubted,
            "clock_skew": self.clock_skew,
            "gone": self.gone,
            "committed_meanwhile": self.committed_meanwhile,
            "marks_cleared": self.marks_cleared,
            "left_behind": self.left_behind,
            "unknown": self.unknown,
            "complete": self.complete,
        }

    def damage(self, v: VersionInfo) -> None:
        """Record a kept attempt whose commit record is invalid (R-GC-10)."""
        code = v.error_code or "PCK-SCHEMA"
        message = (v.error or "invalid commit record").removeprefix(f"[{code}] ")[:2000]
        self.damaged.append({"id": v.id, "code": code, "message": message})

    def skip(
        self,
        attempt_id: str | None,
        status: str,
        exc: CheckpointError | str | None,
        code: str | None = None,
        retryable: bool = False,
    ) -> None:
        """Record an attempt gc leaves alone because it could not classify it.

        ``attempt_id`` is ``None`` when the unfinished uploads of the root could not be listed
        (attempts known only by their uploads are then unknown). ``code``, ``retryable``: the
        error's when ``exc`` is its message only.
        """
        if isinstance(exc, CheckpointError):
            code, retryable = exc.code, exc.retryable
        self.unknown.append({"id": attempt_id, "status": status, "code": code or "PCK-STORAGE",
                             "message": str(exc), "retryable": retryable})

    def keep_pinned(self, attempt_id: str) -> None:
        """Record an attempt planned for deletion but kept: pinned while gc ran."""
        for planned in (self.deleted, self.abandoned, self.retired):
            if attempt_id in planned:
                planned.remove(attempt_id)
        if attempt_id not in self.pinned:
            self.pinned.append(attempt_id)

    def deleted_by_other(self, attempt_id: str) -> None:
        """Record an attempt that was gone when this run deleted it."""
        for done in (self.deleted, self.abandoned, self.retired):
            if attempt_id in done:
                done.remove(attempt_id)
        self.gone.append(attempt_id)

    def failed(self, attempt_id: str, exc: CheckpointError) -> None:
        """Record an attempt whose deletion failed part way: not deleted, and named."""
        self._uncount(attempt_id)
        self.skip(attempt_id, "delete failed", exc)

    def committed_since(self, attempt_id: str) -> None:
        """Record an attempt planned for deletion as abandoned that a save committed since."""
        self._uncount(attempt_id)
        self.committed_meanwhile.append(attempt_id)

    def _uncount(self, attempt_id: str) -> None:
        for done in (self.deleted, self.abandoned):
            if attempt_id in done:
                done.remove(attempt_id)


def check_retention(keep: int, grace_seconds: float) -> None:
    """Refuse retention arguments that could delete a save in progress (``UsageError``)."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise UsageError(f"keep must be an integer >= 1, got {keep!r}")
    check_grace(grace_seconds)


def check_grace(seconds: float, what: str = "grace period") -> None:
    """Refuse a grace period that is not a finite number of seconds >= 0 (``UsageError``).

    NaN, a negative or an infinite value would make "younger than the grace period" false for
    files being written: gc would delete a save in progress, a copy a copy in progress.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
        math.isfinite(seconds) and seconds >= 0
    ):
        raise UsageError(f"{what} must be a finite number of seconds >= 0, got {seconds!r}")


def _check_gc_arguments(
    *, now: object, progress: object, spare_since: object, require_copy: object
) -> None:
    """Refuse (``UsageError``) what gc would trip on part way, after deleting some versions.

    ``progress=5`` raised ``TypeError`` after the first deletion, ``spare_since="x"`` and
    ``now=5.0`` at the first comparison; ``require_copy=1`` was taken as ``True`` (api
    review 31).
    """
    usage.callable_or_none(now, "gc: now")
    usage.callable_or_none(progress, "gc: progress")
    if spare_since is not None and (
        isinstance(spare_since, bool)
        or not isinstance(spare_since, int | float)
        or not math.isfinite(spare_since)
    ):
        raise UsageError(
            f"gc: spare_since must be epoch seconds (a finite number) or None, got "
            f"{spare_since!r:.80}"
        )
    if not isinstance(require_copy, bool | str):
        raise UsageError(
            f"gc: require_copy must be True, False or a root URL, got {require_copy!r:.80}"
        )


def gc(
    root: str | os.PathLike[str] | Storage,
    *,
    keep: int,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    dry_run: bool = False,
    require_copy: bool | str = False,
    now: Callable[[], float] | None = None,
    keep_ids: Collection[str] = (),
    progress: Progress | None = None,
    delete_invalid: bool = False,
    retire_abandoned: bool = False,
    spare_since: float | None = None,
) -> GcReport:
    """Apply retention to a root.

    Keeps the ``keep`` newest committed versions and, in addition, the newest version that passed
    a restore drill (or, when none ever did, the newest committed version). With
    ``require_copy``, older committed versions are only deleted once a kept version has a
    verified copy on another root (any root when ``True``; the given root URL when a string)
    whose commit record is still there (the copy record alone is not trusted).
    ``keep_ids`` are kept as well (a retention policy's choice, e.g. the manager's keep_best).
    Attempts without a commit record (or with an invalid one) are removed once nothing was
    written to them for ``grace_seconds`` (a save in progress is never touched as long as it
    writes more often than that: a grace of 0 deletes saves that are running). A deleted
    version's commit record is removed first, so it stops existing before any data goes; only
    the unfinished uploads of attempts being deleted are aborted.

    A pinned attempt (a pin record at the root names it, spec §15.3) is never deleted and takes
    no place among the ``keep`` newest; while the pins cannot be read no attempt with a commit
    record is deleted (R-GC-11, ``report.pinned``, ``report.unknown``).

    Nothing is deleted that was not positively classified: attempts whose records could not be
    read are listed in ``report.unknown`` and left alone, versions of a newer format in
    ``report.foreign`` (spec §15). An attempt whose commit record is there but invalid is a
    committed version damaged after its commit (the protocol publishes only checked records):
    it is kept and listed in ``report.damaged`` unless ``delete_invalid`` asks for its deletion
    (R-GC-10), its data and writer indexes may still restore it. ``progress(done, total)``
    follows the attempts deleted.

    A committed version of a lower step than the latest but committed after it (a job resumed
    from an older step, a rollback: its new saves sort below the abandoned steps) is kept and
    listed in ``report.newer_branch``, the ``keep`` newest of them by commit time: the ``keep``
    greatest by step are the abandoned branch's. ``retire_abandoned`` deletes first (commit record first) every
    committed version that a later commit at the same or a lower step abandoned, so that the
    rollback's branch becomes the latest; retention then applies to the rest
    (``report.retired``).

    ``now`` is a clock of the caller's, taken as it is; by default (this host's clock) attempts
    are dated on the storage's
    (:func:`storage_clock`: a host whose clock is ahead would delete saves in progress), and an
    offset of more than a minute is ``report.clock_skew``.

    ``spare_since`` (epoch seconds): attempts without a commit record created at or after this
    time are left alone, whatever the grace period (listed in ``report.in_grace``): a job's own
    retention passes its start, so that it never deletes its next save while that is being
    written (chaos review F1: with a short grace, retention after one async save deleted the
    next one's files under its writers). An attempt whose commit record appears while gc runs
    is never deleted as abandoned.

    Raises:
        UsageError: ``keep`` < 1, a grace period that is negative or not finite, or ``now``,
            ``progress``, ``spare_since`` or ``require_copy`` of the wrong kind (before
            anything is read).
        NotFoundError: the root does not exist.

    """
    check_retention(keep, grace_seconds)
    _check_gc_arguments(now=now, progress=progress, spare_since=spare_since,
                        require_copy=require_copy)
    ask_storage = now is None  # a caller's own clock is taken as it is
    now = time.time if now is None else now
    keep_ids = usage.name_collection(keep_ids, "gc: keep_ids")
    if isinstance(require_copy, str) and require_copy:
        require_copy = _copy_destination(require_copy, strict=True)
    storage = open_storage(root)
    root_must_exist(storage)
    report = GcReport(dry_run=dry_run)
    try:
        uploads: list[ObjectInfo] = storage.list_uploads("")
    except StorageError as exc:
        uploads = []
        report.skip(None, UNREADABLE, exc)  # attempts seen only as uploads stay unknown
    listed = list_versions(storage, pins=False)
    extra = upload_only_attempts(storage, [v.id for v in listed], uploads)
    versions = _known_versions(storage, sorted(listed + extra, key=version_order), report)
    pinned = _pinned(storage, versions, report)
    # Pinned attempts are out of gc's reach (R-GC-11): they are neither retired, nor counted
    # among `keep`, nor deleted as invalid or abandoned.
    versions, held = [v for v in versions if v.id not in pinned], [
        v for v in versions if v.id in pinned]
    for v in held:
        if v.status == INVALID:
            report.damage(v)  # R-GC-10 still: kept, and said (review of the change F9)
    if retire_abandoned:
        # On all versions: a pinned one that a rollback abandoned stays the latest, which the
        # report says (review of the change F8); it is kept, the others are retired.
        retired = _abandoned_branch(storage, sorted(versions + held, key=version_order), report)
        report.retire_pinned = [v.id for v in retired if v.id in pinned]
        retired = [v for v in retired if v.id not in pinned]
        report.retired = [v.id for v in retired]
        report.deleted += report.retired
        versions = [v for v in versions if v not in retired]
    else:
        retired = []
    doomed = list(report.retired)
    doomed += _retention(
        versions, keep, require_copy, report, keep_ids, own=_copy_destination(storage.url),
        root=storage if require_copy else None,
    )
    storage_now = _StorageNow(storage, now(), report, ask=ask_storage)
    abandoned = _abandoned(
        storage, versions, grace_seconds, now(), report, delete_invalid, spare_since,
        storage_now=storage_now,
    )
    doomed += abandoned
    unrecorded = {v.id for v in versions if v.status == INCOMPLETE}
    # Versions (a pin may hold them: a lost record may be recommitted meanwhile, final review
    # 20, 7), and of them those with a commit record file (a lost one has none: its deletion
    # was reported as another process's, on-call review 4, R5).
    # The retired versions too: they were taken out of `versions` above, and went without a
    # deletion mark and without the last look at the pins (the conformance suite's trace of
    # the retention vectors, session 26: R-GC-13 and R-GC-11 broken by --retire-abandoned).
    candidates = versions + retired
    recorded = {v.id for v in candidates if v.status in (COMMITTED, INVALID)}
    with_record = {v.id for v in candidates if v.status == COMMITTED
                   or (v.status == INVALID and v.error_code != "PCK-MANIFEST-MISSING")}
    by_id = {v.id: v for v in candidates}
    if not dry_run:
        pins_now = _PinWatch(storage, report)
        for i, attempt_id in enumerate(doomed):
            try:
                if attempt_id in abandoned and attempt_id in unrecorded:
                    _still_unrecorded(storage, attempt_id)
                if attempt_id in abandoned and attempt_id in with_record and attempt_id not in (
                        unrecorded):
                    _still_invalid(storage, attempt_id)
                seen = by_id.get(attempt_id)
                pinnable = attempt_id in recorded or (seen is not None and seen.being_deleted)
                if pinnable and pins_now.holds(attempt_id):
                    doomed[i] = ""  # kept: pinned while this gc ran
                else:
                    delete_attempt(storage, attempt_id, report, attempt_id in with_record,
                                   mark=_why_deleted(attempt_id, report, by_id, recorded),
                                   marked_before=seen is not None and seen.being_deleted,
                                   storage_now=storage_now)
            except CheckpointError as exc:
                # Go on with the others; the report says what was deleted and what was not.
                if attempt_id in unrecorded and _committed_now(storage, attempt_id):
                    report.committed_since(attempt_id)
                else:
                    report.failed(attempt_id, exc)
            if progress is not None:
                progress(i + 1, len(doomed))
    kept = [v for v in versions if v.id not in doomed] + held
    report.kept += [v.id for v in held if v.status == COMMITTED and v.id not in report.kept]
    _abort_orphan_uploads(storage, kept, uploads, grace_seconds, now(), report)
    _prune_kept(storage, kept, report)
    if not dry_run:
        # (also the versions whose deletion failed: a store refusing deletes keeps them)
        failed = {u["id"] for u in report.unknown if u["status"] == "delete failed"}
        _clear_stale_marks(storage, kept + [v for v in versions if v.id in failed],
                           grace_seconds, storage_now, report)
        storage_now.tidy_probes()
    _log_gc(storage, report)
    return report


def _why_deleted(
    attempt_id: str, report: GcReport, by_id: dict[str, VersionInfo], recorded: set[str]
) -> str | None:
    """The reason a deletion mark gives (R-GC-13), or None: no mark (no version).

    Only versions get one (an attempt without records is incomplete whatever a stopped gc
    leaves). Every gc stores its own, also where an older one is there: another gc may clear
    that one meanwhile (mark review 24, F4); one too young for any gc to clear is reused, so
    that a store refusing deletes gets no mark more per run (maintainer review 24, 1).
    """
    v = by_id.get(attempt_id)
    if attempt_id not in recorded or v is None:
        return None
    if attempt_id in report.retired:
        return "retired: a later commit at the same or a lower step abandoned it"
    if v.status == INVALID:
        return "invalid commit record, deleted as asked (delete_invalid)"
    return "retention"


class _StorageNow:
    """The storage's time, asked once per run (a clock probe) and only when needed.

    The grace period and a stale mark's age are both measured on it; asked twice, a run wrote
    two probes and warned of a skew twice (maintainer review 24, 9). Later uses take the first
    answer: an age it understates by the run's length only keeps more.
    """

    def __init__(self, storage: Storage, t_now: float, report: GcReport, *, ask: bool) -> None:
        self._storage, self._t_now, self._report, self._ask = storage, t_now, report, ask
        self._at: float | None = None

    def tidy_probes(self) -> None:
        """Ask the clock where the run did not and a probe lies at the root.

        Asking deletes probes over :data:`PROBE_LEFTOVER_SECONDS` old (spec §15.2); a gc that
        had nothing to date never asked, and left them for ever (backend review 27, L9).
        """
        if self._at is not None or not self._ask:
            return
        try:
            found = any(PROBE_RE.match(o.path) for o in self._storage.list("", recursive=False))
        except CheckpointError:
            return  # (another run tidies them)
        if found:
            self()

    def __call__(self) -> float:
        if self._at is None:
            self._at = (_clock_for_ages(self._storage, self._t_now, self._report) if self._ask
                        else self._t_now)
        return self._at


def _clear_stale_marks(
    storage: Storage,
    kept: list[VersionInfo],
    grace: float,
    storage_now: Callable[[], float],
    report: GcReport,
) -> None:
    """Delete the deletion marks of committed versions this gc keeps, once out of grace.

    A mark beside a commit record is what a gc left that was stopped before the record went,
    or whose deletion of it failed. Left there, a record lost later would make the version
    deletable (R-GC-13) where it is otherwise kept (R-GC-10). A mark younger than the grace
    period, and than an hour whatever the grace, may be another gc's at work (with another
    ``keep``): left alone (mark review 24, F5: a gc with ``--grace 0`` cleared a live one).
    The commit record is looked for right before (a version this gc listed as committed may
    be being deleted by another now), and right after (:func:`remark_if_record_gone`).
    """
    marked = [v for v in kept if v.status == COMMITTED and v.being_deleted]
    if not marked:
        return
    try:
        now = storage_now()
    except CheckpointError:
        return  # the next gc
    age = max(grace, MARK_STALE_SECONDS)
    for v in marked:
        try:
            old = [m for m in deletion_marks(storage, v.id) if now - m.mtime >= age]
            if not old or not storage.exists(f"{v.id}/manifest.json"):
                continue
            for info in old:
                storage.delete(info.path)  # (an object store cannot tell whether it removed it)
                report.marks_cleared.append(info.path)
            # A gc that stored one of them, paused past their age, may have deleted the record
            # since it was looked for (re-attack 24, N3): marked again then.
            if not remark_if_record_gone(storage, v.id):
                storage.remove_empty_dirs(f"{v.id}/{DELETION_DIR}/")
        except CheckpointError as exc:
            _log.warning("%s: could not clear the deletion mark of %s, which gc keeps (%s); "
                         "the next gc tries again", storage.url, v.id, exc)


#: A deletion mark beside a commit record younger than this (or than the grace period) may be
#: another gc's at work: not cleared.
MARK_STALE_SECONDS = 3600.0


#: How old gc's last look at ``pins/`` may be when it deletes a version.
PIN_LOOK_SECONDS = 1.0


class _PinWatch:
    """Pins taken while gc runs: looked for before each commit record is deleted.

    gc reads the pins once, before its plan, and then deletes for as long as that takes: a
    ``pin`` in that window returned success and this gc deleted the version (attack review 5
    F2). Before a version goes, ``pins/`` is listed again when the last look is older than
    :data:`PIN_LOOK_SECONDS` (a listing before each of 100 deletions beside 3,000 pins took
    6.9 s: diff review 3 F5); only when it lists otherwise are the pins read again. While they
    cannot be read, no more versions are deleted.
    """

    def __init__(self, storage: Storage, report: GcReport) -> None:
        self.storage, self.report = storage, report
        self.names: frozenset[str] | None = None  # the first look reads the pins again
        self.pins: set[str] = set()
        self.blind = False
        self.looked = -math.inf

    def _names(self) -> frozenset[str] | None:
        try:
            return frozenset(i.path for i in self.storage.list(f"{PIN_DIR}/", recursive=False))
        except CheckpointError as exc:
            self.report.skip(None, "pins unreadable", exc)
            return None

    def holds(self, attempt_id: str) -> bool:
        """Whether ``attempt_id`` must be kept: pinned since the plan, or pins unreadable."""
        if not self.blind and time.monotonic() - self.looked >= PIN_LOOK_SECONDS:
            self.looked = time.monotonic()
            names = self._names()
            if names is None:
                self.blind = True
            elif names != self.names:
                self.names = names
                try:
                    self.pins = set(read_pins(self.storage))
                except CheckpointError as exc:
                    self.report.skip(None, "pins unreadable", exc)
                    self.blind = True
        if self.blind or attempt_id in self.pins:
            self.report.keep_pinned(attempt_id)
            return True
        return False


def _pinned(storage: Storage, versions: list[VersionInfo], report: GcReport) -> set[str]:
    """The ids of ``versions`` gc must leave alone for pins (R-GC-11); listed in ``report``.

    While a pin cannot be read any version may be pinned: then every attempt that has a commit
    record (committed, invalid) or a deletion mark (a version being deleted, which a pin keeps
    as it is: re-attack 26, errata 20) is held, and the run is incomplete (``report.unknown``).
    """
    try:
        pins = read_pins(storage)
    except CheckpointError as exc:
        report.skip(None, "pins unreadable", exc)
        held = {v.id for v in versions if v.status in (COMMITTED, INVALID) or v.being_deleted}
        report.pinned = sorted(held)
        return held
    held = {v.id for v in versions if v.id in pins}
    report.pinned = [v.id for v in versions if v.id in held]
    return held


def _prune_kept(storage: Storage, versions: list[VersionInfo], report: GcReport) -> None:
    """Remove the superseded drill, copy and verification records of kept versions (R-DRILL-9).

    A version's records piled up before writers pruned them (and a writer's prune can fail):
    gc, which read them all, counts them in ``report.pruned_records`` (a dry run deletes none).
    """
    for v in versions:
        if v.status != COMMITTED or v.annotations_unreadable:
            continue
        for kind in ANNOTATION_KINDS:
            records: list[dict[str, Any]] = getattr(v, kind)
            report.pruned_records += (
                len(superseded(kind, records)) if report.dry_run
                else prune_quietly(storage, v.id, kind, records)
            )


def _log_gc(storage: Storage, report: GcReport) -> None:
    """One ``gc.finished`` line (INFO) for the job log; ``gc.damaged`` (WARNING) per kept damage.

    Skipped attempts are in the report.
    """
    for d in report.damaged:
        log_event(
            _log, "gc.damaged", {"root": storage.url, **d},
            "gc of %s kept %s: its commit record is invalid ([%s] %s): a committed version "
            "damaged after its commit; verify it, restore the record from a copy, or delete it "
            "with delete_invalid=True (--delete-invalid)",
            storage.url, d["id"], d["code"], d["message"], level=logging.WARNING,
        )
    if report.newer_branch:
        log_event(
            _log, "gc.branch", {"root": storage.url, "newer_branch": report.newer_branch},
            "gc of %s kept %s: committed after the latest version at lower steps (a job resumed "
            "from an older step?); readers restore the latest, not them. To make them the "
            "latest, delete the steps they abandoned: gc --retire-abandoned",
            storage.url, ", ".join(report.newer_branch[:8]), level=logging.WARNING,
        )
    verb = "would delete" if report.dry_run else "deleted"
    fields = {k: report.to_json()[k] for k in ("deleted", "abandoned", "kept", "dry_run")}
    log_event(
        _log, "gc.finished", {"root": storage.url, **fields},
        "gc of %s: %s %d version(s) and %d abandoned attempt(s); kept %d",
        storage.url, verb, len(report.deleted), len(report.abandoned), len(report.kept),
    )


def _known_versions(
    storage: Storage, versions: list[VersionInfo], report: GcReport
) -> list[VersionInfo]:
    """Drop what gc must not act on (unknown, foreign)."""
    out = []
    for v in versions:
        if not v.known:
            report.skip(v.id, v.status, v.error, v.error_code, v.error_retryable)
        elif v.status == FOREIGN:
            report.foreign.append(v.id)
        elif v.status == STRAY:
            # A foreign entry has the record's name: neither a version nor garbage (R-LAYOUT-7).
            report.foreign_keys.append(f"{v.id}/manifest.json")
        else:
            out.append(v)
    return out


def _abort_orphan_uploads(
    storage: Storage,
    versions: list[VersionInfo],
    uploads: Sequence[ObjectInfo],
    grace: float,
    t_now: float,
    report: GcReport,
) -> None:
    """Abort unfinished uploads of files that kept committed versions list (R-GC-8).

    A writer whose CreateMultipartUpload answer was lost retried it; the server had started
    both, and the first stayed under the version for as long as it was kept, billed (ops review
    F9). Such an upload belongs to nobody: every listed file was complete before the commit,
    and completed it would replace a committed file. Only those whose newest activity is older
    than the grace period are aborted, each by its exact key.
    """
    attempts = {u.path.split("/", 1)[0] for u in uploads if "/" in u.path}
    for v in versions:
        if v.status != COMMITTED or v.id not in attempts:
            continue
        try:
            files = load_manifest(storage, v.id).files
            dated = storage.list_uploads(f"{v.id}/", activity=True)
        except CheckpointError as exc:  # left for the next run; the version is kept either way
            report.skip(v.id, "uploads not checked", exc)
            continue
        orphans = {
            u.path for u in dated
            if u.path.split("/", 1)[1] in files and t_now - u.mtime >= grace
        }
        if not orphans:
            continue
        if report.dry_run:
            report.aborted_uploads += len(orphans)
            continue
        try:
            report.aborted_uploads += storage.abort_uploads(f"{v.id}/", only=orphans)
        except CheckpointError as exc:
            report.skip(v.id, "uploads not checked", exc)


#: How far the store's time between two commit records may differ from the writers' before a
#: retirement is doubted (the time between a record's timestamp and its write, NTP drift).
RETIRE_TOLERANCE_SECONDS = 60.0


def _abandoned_branch(
    storage: Storage, versions: list[VersionInfo], report: GcReport
) -> list[VersionInfo]:
    """Committed versions that a later commit at the same or a lower step abandoned.

    A job resumed from step S and saved S+1, S+2 ... again: the first run's versions above S
    were committed before a version at their step or below, and readers (by step first) still
    return them. In a run that never went back no version is abandoned.

    ``committed_at`` comes from the clock of the host that committed: one writer whose clock
    was ahead (or behind) looked like a rollback, and every later version (or the latest) was
    retired (multi-job review F1). So a version is retired only when the storage's own times
    of the two commit records (their listed modification times: one clock, the store's) agree
    that the later commit came later, and by as much (within
    :data:`RETIRE_TOLERANCE_SECONDS`); where they disagree, or a time is unknown, it is kept
    and named in ``report.retire_doubted``.
    """
    committed = sorted((v for v in versions if v.status == COMMITTED), key=lambda v: v.step)
    times = {v.id: timestamp_key(v.committed_at) for v in committed}
    stored: dict[str, float | None] = {}

    def stored_time(v: VersionInfo) -> float | None:
        if v.id not in stored:
            try:
                info = listed_info(storage, f"{v.id}/manifest.json")
            except CheckpointError:
                info = None
            stored[v.id] = None if info is None else info.mtime
        return stored[v.id]

    candidates: list[VersionInfo] = []  # by the writers' clocks, in one pass
    bound: tuple[int, ...] = ()  # the latest commit time at a step below the current one
    i = 0
    while i < len(committed):
        group = [v for v in committed[i:] if v.step == committed[i].step]
        i += len(group)
        top = max([bound, *(times[v.id] for v in group)])
        candidates += [v for v in group if times[v.id] < top]
        bound = top

    def confirms(w: VersionInfo, v: VersionInfo) -> bool:
        """The store saw ``w``'s record after ``v``'s, as much later as the writers' clocks say.

        Order alone is not enough: in a copied root (a backup, a migration) the store's times
        are the copy's, in whatever order it went (attack review 3 F13). Two records stored when
        they were committed are as far apart on the store's clock as on the writers' (any
        constant offset cancels); a copy, or a skewed writer, breaks that.
        """
        mine, theirs = stored_time(v), stored_time(w)
        if mine is None or theirs is None or theirs <= mine or min(times[v.id], times[w.id]) < (0,):
            return False
        writers = (epoch_us(times[w.id]) - epoch_us(times[v.id])) / 1e6
        return abs((theirs - mine) - writers) <= RETIRE_TOLERANCE_SECONDS

    out: list[VersionInfo] = []
    for v in candidates:
        later = [w for w in committed
                 if w is not v and w.step <= v.step and times[w.id] > times[v.id]]
        by = next((w for w in later if confirms(w, v)), None)
        if by is not None:
            out.append(v)
            continue
        w = max(later, key=lambda w: times[w.id])
        report.retire_doubted.append({
            "id": v.id,
            "reason": (
                f"its committed_at {v.committed_at} is earlier than {w.id}'s {w.committed_at} "
                f"(step {w.step}), but the storage's times of the two commit records do not "
                "agree that it came that much later: a writer's clock was off, or the root "
                "was copied (its times are the copy's); kept"
            ),
        })
    return out


def _retention(
    versions: list[VersionInfo],
    keep: int,
    require_copy: bool | str,
    report: GcReport,
    keep_ids: Collection[str] = (),
    *,
    own: str | None = None,
    root: Storage | None = None,
) -> list[str]:
    """Committed versions to delete: all but the ``keep`` newest, ``keep_ids`` and the protected one.

    ``own``: this root as copy records name it (a "copy" there is no copy); ``root``: this
    root, to find it under another name (:func:`same_root`).

    A version whose verification failed is never restored (R-DRILL-8): it takes no place of the
    ``keep`` newest and no protection from the ones that did not fail (R-GC-9), which are kept
    as well; R-GC-1 and R-GC-2 still keep it where they keep it.
    """
    newest_first = [v for v in reversed(versions) if v.status == COMMITTED]
    good = [v for v in newest_first if not v.verification_failed]
    report.failed_verification = [v.id for v in newest_first if v.verification_failed]
    kept = newest_first[:keep] + [v for v in newest_first[keep:] if v.id in keep_ids]
    kept += [v for v in good[:keep] if v not in kept]
    if newest_first:  # a rollback's new branch: committed after the latest, at lower steps
        latest = timestamp_key(newest_first[0].committed_at)
        branch = [v for v in newest_first[1:] if timestamp_key(v.committed_at) > latest]
        # its own `keep` newest, by commit time: bounded, as the branch grows with every save
        branch.sort(key=lambda v: timestamp_key(v.committed_at), reverse=True)
        report.newer_branch = [v.id for v in branch[:keep]]
        kept += [v for v in branch[:keep] if v not in kept]
    drilled = next((v for v in newest_first if v.drilled), None)
    protected = drilled or (newest_first[0] if newest_first else None)
    for p in (protected, None if drilled else next(iter(good), None)):
        if p is not None and p not in kept:
            kept.append(p)
    report.kept = [v.id for v in kept]
    report.protected = protected.id if protected else None
    want = require_copy if isinstance(require_copy, str) else None
    copies = _Copies(root, report)
    may_delete = not require_copy or any(_has_copy(v, want, own, copies) for v in kept)
    doomed = []
    for v in newest_first:
        if v in kept:
            continue
        if not may_delete:
            report.kept_for_copy.append(v.id)
            continue
        report.deleted.append(v.id)
        doomed.append(v.id)
    return doomed


def _copy_destination(url: str, *, strict: bool = False) -> str:
    """A root URL as copy records name it (``copy``'s normalisation), local paths resolved.

    ``DEST``, ``./DEST``, ``/abs/DEST`` and ``file:///abs/DEST`` name one root; so do two local
    paths whose real paths agree (a symlinked parent). ``strict``: a malformed URL raises
    ``UsageError`` (else it is compared as written).
    """
    from portable_ckpt.io.copy import normalize_root_url

    try:
        text = normalize_root_url(url)
        local = local_path(text)
        if local is not None:
            return "file://" + os.path.realpath(local)
    except (CheckpointError, ValueError):  # ValueError: a NUL in a record's path (F10)
        if strict:
            raise
        return url.rstrip("/")
    return text


def _has_copy(v: VersionInfo, want: str | None, own: str | None, copies: _Copies) -> bool:
    """Whether a verified copy of ``v`` is still committed (on root ``want``; any when None).

    ``want`` and ``own`` (the root being collected) are :func:`_copy_destination` forms. A copy
    record alone is not trusted: the copy may have been deleted since. A record that names this
    root (a hand-written one, or a decoded name that lands here: attack review 3 F11) or no
    usable root (a NUL: F10) counts for nothing.
    """
    from portable_ckpt.io.copy import url_of_record

    for c in v.copies:
        dest = c.get("destination")
        if c.get("ok") is not True or not isinstance(dest, str):
            continue
        dest = url_of_record(dest)  # "/mnt/nightly%20backup" names "/mnt/nightly backup"
        if "\0" in dest:
            continue
        # A record's destination is compared resolved as well; only a URL is (a bare path in a
        # record would be resolved against this process's directory, not the copier's).
        named = _copy_destination(dest) if "://" in dest else dest.rstrip("/")
        if named == own or (want is not None and named != want):
            continue
        if copies.committed(dest, v.id):
            return True
    # A copier that could not write its record into this root (read-only credentials on the
    # training root: ops review F13) still left a committed copy there: asked directly.
    return want is not None and want != own and copies.committed(want, v.id)


class _Copies:
    """Asks destination roots whether they hold a version (each root opened once).

    A destination that is the collected root under another name holds no copy
    (:func:`same_root`, backend review B2).
    """

    def __init__(self, root: Storage | None, report: GcReport | None) -> None:
        self.root, self.report = root, report
        self._opened: dict[str, Storage | None] = {}

    def committed(self, dest: str, attempt_id: str) -> bool:
        """Whether root ``dest`` holds the commit record of ``attempt_id``.

        ``False`` when it cannot be asked (gc then keeps more, never less); the destination
        and the error are noted in ``report.copy_unasked``: "missing" is not what gc knows
        then (F16).
        """
        try:
            there = self._open(dest)
            return there is not None and there.exists(f"{attempt_id}/manifest.json")
        except (CheckpointError, OSError, ValueError) as e:
            self._note(f"{dest}: {getattr(e, 'message', None) or e}", retryable=may_pass(e))
            return False

    def _open(self, dest: str) -> Storage | None:
        if dest not in self._opened:
            from portable_ckpt.storage import open_storage

            there: Storage | None = open_storage(dest)
            # The probe goes into the collected root (gc writes there anyway; a backup root may
            # be read-only to it); a root that refuses it is not deleted from either.
            if self.root is not None and there is not None and same_root(there, self.root):
                self._note(f"{dest}: names the collected root {self.root.url} under another "
                           "name (a probe put into it showed there): no copy", retryable=False)
                there = None
            self._opened[dest] = there
        return self._opened[dest]

    def _note(self, note: str, *, retryable: bool) -> None:
        report = self.report
        if report is not None and not retryable:
            report.copy_unasked_retryable = False
        if report is not None and len(report.copy_unasked) < 16:
            note = note[:500]
            if note not in report.copy_unasked:
                report.copy_unasked.append(note)


def _abandoned(
    storage: Storage,
    versions: list[VersionInfo],
    grace: float,
    t_now: float,
    report: GcReport,
    delete_invalid: bool,
    spare_since: float | None = None,
    *,
    storage_now: Callable[[], float],
) -> list[str]:
    """Attempts without a commit record (or, if asked, an invalid one) quiet for ``grace`` s.

    Quiet is measured on the storage's clock, which set the files' times: a gc host whose clock
    was ahead by more than the grace period deleted saves in progress (multi-job review F2). So
    before the first deletion the storage is asked its time (:func:`storage_clock`), and an
    attempt id stamped after it (a writer whose clock was ahead) is dated by its files alone
    (F8: such an attempt was kept for years, "written to 0 s ago").
    """
    doomed = []
    for v in versions:
        if v.status == INVALID and not delete_invalid:
            report.damage(v)  # R-GC-10: a damaged version, not an abandoned save
            continue
        if v.status not in (INCOMPLETE, INVALID):
            continue
        born = attempt_time(v.id)
        if v.status == INCOMPLETE and spare_since is not None and born is not None and (
            born >= spare_since
        ):  # the caller's own save, perhaps still being written
            report.in_grace.append(
                {"id": v.id, "status": v.status, "age_seconds": round(max(0.0, t_now - born), 1),
                 "being_deleted": v.being_deleted, "empty": False}  # (not listed: unknown)
            )
            continue
        try:
            now = storage_now()  # asked before the first deletion, once
            last, anything = _last_activity(
                storage, v.id, record_absent=v.status == INCOMPLETE, not_after=now + 60.0
            )
            foreign = [] if anything else storage.list_foreign(f"{v.id}/")
        except StorageError as exc:
            if v.status == INCOMPLETE and _committed_now(storage, v.id):
                report.committed_meanwhile.append(v.id)  # a save's commit during the listing
                continue
            report.skip(v.id, v.status, exc)  # cannot date it: it may be a save in progress
            continue
        if foreign:  # only what the format never writes is left: not gc's to delete
            report.foreign_keys.extend(foreign)
            continue
        # An activity dated a little after "now" is "just now", age 0: the storage's clock
        # (a file system's coarse timestamps) may lag the writer's clock by a tick, and a grace
        # of 0 kept an attempt written milliseconds before (a flaky test, session 26).
        if max(0.0, now - last) < grace:
            report.in_grace.append(
                {"id": v.id, "status": v.status, "age_seconds": round(max(0.0, now - last), 1),
                 "being_deleted": v.being_deleted, "empty": not anything}
            )
            continue
        report.abandoned.append(v.id)
        doomed.append(v.id)
    return doomed


def _last_activity(
    storage: Storage,
    attempt_id: str,
    *,
    record_absent: bool = False,
    not_after: float = math.inf,
) -> tuple[float, bool]:
    """The latest of the attempt-id time, its file times and its unfinished uploads' activity.

    Also returns whether the attempt has any file or upload at all. An attempt-id time after
    ``not_after`` (the storage's now: a writer's clock was ahead) is not counted.

    Raises:
        StorageError: ``record_absent`` (the attempt was classified without a commit record),
            yet the listing shows one (a store that contradicts itself, or a save that
            committed since): not abandoned.

    """
    t = attempt_time(attempt_id) or 0.0
    t = 0.0 if t > not_after else t
    anything = False
    record = f"{attempt_id}/manifest.json"
    for info in storage.list(f"{attempt_id}/"):
        if record_absent and info.path == record:
            raise StorageError(
                f"{storage.url}/{record} is listed, though the attempt was classified without "
                "it (committed since, or a store that answered \"absent\" for it): left for "
                "the next gc",
                path=record,
            )
        t, anything = max(t, info.mtime), True
    for up in storage.list_uploads(f"{attempt_id}/", activity=True):
        t, anything = max(t, up.mtime), True
    return t, anything


#: A gc host clock further than this from the storage's is reported (``GcReport.clock_skew``).
CLOCK_SKEW_SAID = 60.0


def _clock_for_ages(storage: Storage, t_now: float, report: GcReport) -> float:
    """The "now" attempts are dated against: the storage's when it can be asked, else ours.

    A dry run asks too (a probe written and deleted): on this host's clock it predicted other
    deletions than the run made (attack review 3 F6).
    """
    there = storage_clock(storage, tidy=not report.dry_run)
    if there is None:
        return t_now
    skew = t_now - there
    if abs(skew) > CLOCK_SKEW_SAID:
        report.clock_skew = round(skew, 1)
        _log.warning(
            "%s: this host's clock is %.0f s %s the storage's; attempts are dated on the "
            "storage's clock", storage.url, abs(skew), "ahead of" if skew > 0 else "behind",
        )
    return there


def _committed_now(storage: Storage, attempt_id: str) -> bool:
    """Whether an attempt gc listed without a commit record holds a valid one now.

    A save that committed while gc ran (on-call review 23, N7: gc exited 75 and blamed "a
    storage that did not answer, or permissions"). Anything short of a record read and valid
    (a store that contradicts itself, a storage error) leaves the attempt unknown.
    """
    try:
        return classify_attempt(storage, attempt_id).status == COMMITTED
    except CheckpointError:
        return False


def _still_invalid(storage: Storage, attempt_id: str) -> None:
    """Raise unless a second read of an invalid commit record, deleted as asked, is invalid too.

    The listing read each record once: one GET whose bytes were damaged on the way (a proxy, a
    flaky link) made ``--delete-invalid`` delete the intact newest version (S3 attack 25, H2).
    The record is read again, and where the store keeps its CRC32C the bytes must match it;
    only a record invalid as stored is deleted.
    """
    from portable_ckpt.format import jsonio
    from portable_ckpt.io.checksum import crc32c
    from portable_ckpt.io.versions import classify_record

    rel = f"{attempt_id}/manifest.json"
    try:
        data = storage.read_all(rel, max_size=jsonio.MAX_MANIFEST_BYTES)
    except LimitError:
        return  # larger than any record may be, as the store says: invalid as stored
    again = classify_record(attempt_id, data)
    want = storage.checksum_crc32c(rel)
    if again.status != INVALID or (want is not None and want != crc32c(data)):
        how = (f"read again it is {again.status}" if again.status != INVALID
               else "the bytes read again do not match the CRC32C the store keeps for it")
        raise StorageError(
            f"{storage.url}/{rel} was invalid when gc listed the root, but {how}: a read was "
            "damaged on the way, or the record changed; not deleted (run gc again, and "
            f"`portable-ckpt verify {storage.url}/{attempt_id}`)", path=rel)


def _still_unrecorded(storage: Storage, attempt_id: str) -> None:
    """Raise if the commit record of an attempt classified ``incomplete`` exists by now.

    A save that committed between gc's listing and its deletion (a short grace period) would
    lose a version its committer reported as published.
    """
    rel = f"{attempt_id}/manifest.json"
    if storage.exists(rel):
        raise StorageError(
            f"{storage.url}/{rel} exists now: the attempt was committed while gc ran; not "
            "deleted",
            path=rel,
        )


