"""Publish a new commit record for a version whose record was lost, from its writer indexes.

A committed version's ``manifest.json`` can be lost after the commit (a script, a disk, an
operator's ``rm``) while its data files and writer indexes are intact: it is ``invalid`` (spec
§15.1, errata 13) and gc keeps it, but nothing can restore it. With a copy, the copy's record is
put back (docs/recovery.md); without one, this module builds the record again as the commit
did: every writer's index, the same checks (coverage, entries, sizes, shard headers), one
create-if-absent publish (spec §15.4). What the indexes do not hold is chosen safely: the
continuation contract becomes ``statistical`` (the original may have been ``exact``; nothing
recorded says so), and the producer names this tool.
"""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING, Any

from portable_ckpt.errors import (
    CheckpointError,
    CommitConflictError,
    ManifestMissingError,
    NotFoundError,
    UsageError,
    WriterMissingError,
)
from portable_ckpt.format.manifest import Continuation
from portable_ckpt.format.naming import parse_attempt_step
from portable_ckpt.io.damage import PLACEMENT_ENTRY
from portable_ckpt.io.deletion import DELETION_DIR, deletion_marks
from portable_ckpt.storage.base import Storage

if TYPE_CHECKING:
    from portable_ckpt.io.commit import CommittedManifest

__all__ = ["every_writer_indexed", "recommit"]

_INDEX = re.compile(r"w([0-9]{5,})\.json")
_DATA = re.compile(r"data/w([0-9]{5,})-[^/]*")


def recommit(
    storage: Storage,
    attempt_id: str,
    *,
    world_size: int | None = None,
    was_committed: bool = False,
    copies_lost: bool = False,
    newest_of_step: bool = False,
) -> CommittedManifest:
    """Publish a commit record for ``attempt_id`` from its writer indexes (spec §15.4).

    Args:
        storage: The checkpoint root.
        attempt_id: The version whose commit record was lost.
        world_size: The continuation's world size (default: the ranks its per-rank entries
            hold values for, else its number of writers).
        was_committed: The attempt holds no drill, copy or verification record, so nothing
            shows it was ever committed (``incomplete``): publish all the same, on the
            operator's word. Without it such an attempt is refused: a save that never
            committed may have been abandoned for a reason.
        copies_lost: Its copy records name verified copies, whose byte-identical record is
            the one to put back: publish all the same, on the operator's word that none is
            left.
        newest_of_step: Another committed version holds the same step: publish all the same,
            although the new record, dated now, makes this one the version of that step a
            restore takes (R-COMMIT-16).

    Returns:
        The published manifest.

    Raises:
        CommitConflictError: the attempt has a commit record; a copy is recorded; another
            version holds its step; its files went while the record was published.
        ManifestMissingError: an incomplete attempt without ``was_committed``.
        WriterMissingError: a writer's index is missing (its data cannot be told).
        CheckpointError: any check of the commit failed; nothing is published.

    """
    from portable_ckpt import __version__
    from portable_ckpt.io.commit import commit, read_writer_indexes
    from portable_ckpt.io.versions import (
        COMMITTED,
        INCOMPLETE,
        INVALID,
        classify_attempt,
        root_must_exist,
    )

    step = parse_attempt_step(attempt_id)
    if step is None:
        raise UsageError(f"{attempt_id!r} is no attempt id: name the version as ROOT/ID")
    root_must_exist(storage)  # a mistyped root is no attempt to rebuild
    names = [o.path.removeprefix(f"{attempt_id}/") for o in storage.list(f"{attempt_id}/")]
    if not names:
        raise NotFoundError(f"{attempt_id}: no such attempt in {storage.url}",
                            path=f"{attempt_id}/")
    c = classify_attempt(storage, attempt_id)
    lost = c.status == INVALID and isinstance(c.error, ManifestMissingError)
    if c.status == COMMITTED or (c.status == INVALID and not lost):
        raise CommitConflictError(
            f"{attempt_id} has a commit record: nothing to recommit" + (
                "" if c.status == COMMITTED else f" ({c.status}: `portable-ckpt verify "
                "ROOT/ID` names what is wrong with it; put a copy's record in its place)"),
            path=f"{attempt_id}/manifest.json")
    if c.being_deleted:
        # A gc deleted it on purpose and was stopped half-way (R-GC-13): rebuilding its record
        # would bring back what retention deleted (on-call review 23, F1).
        raise CommitConflictError(
            f"{attempt_id} is being deleted: a gc marked it (its {DELETION_DIR}/ records) and "
            "deleted its commit record, then stopped; a later gc removes the rest. Nothing was "
            f"rebuilt. If that gc was wrong, remove {attempt_id}/{DELETION_DIR}/ and run the "
            "command again", path=f"{attempt_id}/{DELETION_DIR}/")
    if c.status == INCOMPLETE and not was_committed:
        raise ManifestMissingError(
            f"{attempt_id} holds no record that it was ever committed (no drill, copy or "
            "verification record): it may be a save that never finished. If you know it was "
            "committed, pass --was-committed", path=f"{attempt_id}/manifest.json")
    if c.status not in (INCOMPLETE, INVALID):
        raise c.error if c.error is not None else UsageError(f"{attempt_id}: {c.status}")
    if not copies_lost:
        _refuse_if_copied(storage, attempt_id)
    if not newest_of_step:
        _refuse_if_reordered(storage, attempt_id, step)
    placed = [rel for rel in names if rel.startswith(f"entries/{PLACEMENT_ENTRY}")]
    try:
        writers = _writers(attempt_id, names)
        indexes = read_writer_indexes(storage, attempt_id, writers)
        _refuse_unclaimed(attempt_id, names, indexes)
    except WriterMissingError:
        if placed:  # a node root: the other nodes' writers are in their roots (Q1, #4)
            _refuse_node_root(attempt_id)
        raise
    if placed and len(writers) < _placed_writers(storage, attempt_id, placed):
        _refuse_node_root(attempt_id)  # every writer of a node root's own present: still short
    ranks = [v.rank for x in indexes for e in x.entries.values() for v in e.values
             if v.rank is not None]
    size = world_size if world_size is not None else (max(ranks) + 1 if ranks else len(writers))
    m = commit(storage, attempt_id, step=step, indexes=indexes, expected_writers=writers,
               continuation=Continuation("statistical", size, None),
               producer={"name": "portable-ckpt recommit", "version": __version__},
               check_headers=True)  # every shard header, at any size (on-call review 5, Q2)
    # A gc or retention that deleted the attempt meanwhile left a record over nothing, which
    # `ls --latest` named (on-call review 4, R5): said, with what to do; nothing removed.
    here = {o.path.removeprefix(f"{attempt_id}/") for o in storage.list(f"{attempt_id}/")}
    gone = sorted(set(m.files) - here)
    if gone:
        # Its own record over files that are gone: removed again, as a record writer removes
        # its record of a deleted version (R-DRILL-11; on-call review 5, R5), and only its
        # own: a record put back meanwhile (a copy's) stays (final review 20, 6).
        if _is_mine(storage, attempt_id, m):
            storage.delete(f"{attempt_id}/manifest.json")
        raise CommitConflictError(
            f"{attempt_id}: {len(gone)} of the files its new commit record names went while it "
            f"was published ({gone[0]}, ...: a gc or a job's retention deleted the version?); "
            "the record was removed again. Stop what deletes; what is left of the version "
            "cannot be rebuilt without those files", path=f"{attempt_id}/manifest.json")
    return m


def _is_mine(storage: Storage, attempt_id: str, m: Any) -> bool:
    """Whether ``manifest.json`` is still the record this run published (its commit time)."""
    from portable_ckpt.format import jsonio

    try:
        rel = f"{attempt_id}/manifest.json"
        doc = jsonio.loads(storage.read_all(rel, max_size=jsonio.MAX_MANIFEST_BYTES), what=rel)
    except CheckpointError:
        return False  # gone, or not readable: not positively this run's
    return (isinstance(doc, dict) and doc.get("committed_at") == m.committed_at
            and doc.get("producer") == m.producer)


def _placed_writers(storage: Storage, attempt_id: str, placed: list[str]) -> int:
    """The writers a node-local version has (its placement's ranks), or a count no root has.

    A durable copy holds all of them and is rebuilt as any version (final review 20, 4); a
    placement that cannot be read counts as a node root's (refused: the record to copy).
    """
    from portable_ckpt.format import jsonio

    try:
        rel = f"{attempt_id}/{placed[0]}"
        value = jsonio.loads(storage.read_all(rel, max_size=1 << 20), what=rel)
        ranks = value["node_of_rank"]
        if isinstance(ranks, list):
            return len(ranks)
    except (CheckpointError, KeyError, TypeError):
        pass
    return 1 << 62


def _refuse_node_root(attempt_id: str) -> None:
    """A node-local version read through a node root (spec §14.7): its own record to copy.

    Rebuilt from one node root, the record dropped the other nodes' writers (their files are
    in their roots by design), and `verify --deep` passed (on-call review 5, Q1). A durable
    copy holds every writer's files and is rebuilt as any version (final review 20, 4).
    """
    raise CommitConflictError(
        f"{attempt_id} is a node-local version (its {PLACEMENT_ENTRY} entry) whose writers are "
        "not all here: a node root holds only its nodes' writers' files, so its indexes cannot "
        f"rebuild the record. Copy `{attempt_id}/manifest.json` from another node root or "
        "from the durable root (the same bytes in each), then verify --deep "
        "(docs/recovery.md)", path=f"{attempt_id}/manifest.json")


#: Files of an attempt no writer index lists: its records, and the commit record's own table.
_NOT_A_WRITERS = re.compile(r"manifest\.json|(?:drills|copies|verifications|deleting)/.*"
                            r"|tensor-table-[^/]*\.safetensors(?:\.zst)?")


def _refuse_unclaimed(attempt_id: str, names: list[str], indexes: list[Any]) -> None:
    """Every file of the attempt is listed by a surviving writer index, or is no writer's.

    A lost writer's files that its name does not give away (a global entry's ``….g.json``)
    were left out of the record, with the world size wrong and `verify --deep` OK (final
    review 20, 2): what no index lists is a lost writer's, or a stray file.
    """
    claimed = {f for x in indexes for f in x.files}
    claimed |= {x.index_file.path for x in indexes if x.index_file is not None}
    loose = [rel for rel in names if rel not in claimed and not _NOT_A_WRITERS.fullmatch(rel)]
    if loose:
        raise WriterMissingError(
            f"{attempt_id}: {len(loose)} file(s) no writer index lists ({', '.join(loose[:3])}"
            f"{', ...' if len(loose) > 3 else ''}): a writer whose index was lost wrote them, "
            "or they are no writer's. Put the commit record back from a copy of the version if "
            "one exists (docs/recovery.md); move a file that is no writer's out of the version "
            "and run the command again", path=f"{attempt_id}/{loose[0]}")


def every_writer_indexed(storage: Storage, attempt_id: str) -> bool:
    """Whether every writer the attempt's files name left its index: what a recommit needs.

    Without a commit record that is a save cut short at its commit, or a committed version
    whose record was lost; a restore names it among what it passed over (on-call review 23,
    F2). Writers that wrote no file at all are not seen (no document records how many there
    were): a save killed before its last ranks wrote anything passes too; recommit's coverage
    check refuses it where their tensors were sharded. False where the listing fails (it tells
    nothing then).
    """
    try:
        names = [o.path.removeprefix(f"{attempt_id}/") for o in storage.list(f"{attempt_id}/")]
        _writers(attempt_id, names)
        # What a gc stopped while deleting the version left (R-GC-13): no recommit rebuilds it.
        if any(n.startswith(f"{DELETION_DIR}/") for n in names) and deletion_marks(
                storage, attempt_id, first=True):
            return False
    except CheckpointError:
        return False
    return True


def _writers(attempt_id: str, names: list[str]) -> list[int]:
    """The writers whose indexes are here: every writer any file of the attempt names.

    A writer known only from its data files has lost its index: refused,
    also the highest-numbered one, which holes between indexes did not show (on-call review
    4, R1: a DDP job's rank 1 went missing from the record). Index names are the canonical
    ``wNNNNN.json`` (§14.1); the holes are counted, never enumerated (R2: one file named
    ``w9999999999.json`` took all memory).
    """
    indexes = set()
    for rel in names:
        m = _INDEX.fullmatch(rel.removeprefix("index/")) if rel.startswith("index/") else None
        if m is not None and rel == f"index/w{int(m[1]):05d}.json":
            indexes.add(int(m[1]))
    # Data files name their writer; a per-rank entry's ``rNNNNN`` is a rank, not a writer
    # (final review 20, 3): a lost writer's entries are found by _refuse_unclaimed.
    named = {int(m[1]) for rel in names if (m := _DATA.fullmatch(rel))} | indexes
    if not indexes:
        raise WriterMissingError(f"{attempt_id}/index/ holds no writer index: nothing to "
                                 "rebuild the commit record from", path=f"{attempt_id}/index/")
    top = max(named)
    if top + 1 > len(indexes):
        missing: list[int] = []
        i = 0
        while len(missing) < 8 and i <= top:
            if i not in indexes:
                missing.append(i)
            i += 1
        more = " ..." if top + 1 - len(indexes) > 8 else ""
        files = ", ".join(f"index/w{w:05d}.json" for w in missing[:3])
        raise WriterMissingError(
            f"{attempt_id}: its files name writers up to {top}, but {top + 1 - len(indexes)} of "
            f"them have no index as a regular file here (writers {missing}{more}: {files} ...): "
            "what they wrote cannot be told. Put the commit record back from a copy of the "
            "version if one exists (docs/recovery.md); an index file that is no writer's can "
            "be moved away and the command run again", path=f"{attempt_id}/index/")
    return sorted(indexes)


def _refuse_if_copied(storage: Storage, attempt_id: str) -> None:
    """A verified copy recorded beside the version holds the record to put back (§15.4)."""
    from portable_ckpt.io.copy import copies_of
    from portable_ckpt.storage import local_path

    dests, _ = copies_of(storage, attempt_id)
    if dests:
        first = f"{dests[0].rstrip('/')}/{attempt_id}"
        here = local_path(storage.url) or storage.url
        raise CommitConflictError(
            f"{attempt_id}: a copy is recorded at {', '.join(dests[:3])} (verified when made, "
            f"not since): its commit "
            f"record is the one to put back (byte-identical: the copies keep agreeing), "
            f"`cp {shlex.quote(first)}/manifest.json "
            f"{shlex.quote(here.rstrip('/') + '/' + attempt_id)}/manifest.json`, then "
            "verify --deep; pass --copies-lost when no copy is left (docs/recovery.md)",
            path=f"{attempt_id}/manifest.json")


def _refuse_if_reordered(storage: Storage, attempt_id: str, step: int) -> None:
    """A rebuilt record is dated now (R-COMMIT-16): it must not reorder the root's versions.

    Another committed version of the step would come before it, and a restore take it instead
    (on-call review 4, R6); a version of a lower step committed after this attempt began is a
    rollback's branch, which this version, dated now, would make look abandoned: `gc --keep 1`
    then deleted the new branch (final review 20, 1).
    """
    from portable_ckpt.format.naming import attempt_time
    from portable_ckpt.io.annotations import timestamp_us
    from portable_ckpt.io.versions import COMMITTED, list_versions

    began = attempt_time(attempt_id)
    for v in list_versions(storage, annotations=False):
        if v.id == attempt_id or v.status != COMMITTED:
            continue
        later = began is not None and timestamp_us(v.committed_at) > began * 1e6
        if v.step == step or (v.step < step and later):
            why = (f"also holds step {step} (the job trained it again)" if v.step == step else
                   f"(step {v.step}) was committed after this version began: a rollback's branch")
            raise CommitConflictError(
                f"{attempt_id}: {v.id} {why}. A new commit record is dated now, after it "
                "(R-COMMIT-16): this version would be the one restores and gc take as the "
                "newest, undoing the newer branch. Pass --newest-of-step if that is what you "
                "want", path=f"{attempt_id}/manifest.json")
