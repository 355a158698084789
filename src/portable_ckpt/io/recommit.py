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
from typing import TYPE_CHECKING

from portable_ckpt.errors import (
    CommitConflictError,
    ManifestMissingError,
    NotFoundError,
    UsageError,
    WriterMissingError,
)
from portable_ckpt.format.manifest import Continuation
from portable_ckpt.format.naming import parse_attempt_step
from portable_ckpt.storage.base import Storage

if TYPE_CHECKING:
    from portable_ckpt.io.commit import CommittedManifest

__all__ = ["recommit"]

_INDEX = re.compile(r"w([0-9]{5,})\.json")


def recommit(
    storage: Storage,
    attempt_id: str,
    *,
    world_size: int | None = None,
    was_committed: bool = False,
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

    Returns:
        The published manifest.

    Raises:
        CommitConflictError: the attempt has a commit record.
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
    if next(iter(storage.list(f"{attempt_id}/")), None) is None:
        raise NotFoundError(f"{attempt_id}: no such attempt in {storage.url}",
                            path=f"{attempt_id}/")
    c = classify_attempt(storage, attempt_id)
    lost = c.status == INVALID and isinstance(c.error, ManifestMissingError)
    if c.status == COMMITTED or (c.status == INVALID and not lost):
        raise CommitConflictError(
            f"{attempt_id} has a commit record ({c.status}): nothing to recommit; "
            "`portable-ckpt verify ROOT/ID` names what is wrong with it",
            path=f"{attempt_id}/manifest.json")
    if c.status == INCOMPLETE and not was_committed:
        raise ManifestMissingError(
            f"{attempt_id} holds no record that it was ever committed (no drill, copy or "
            "verification record): it may be a save that never finished. If you know it was "
            "committed, pass --was-committed", path=f"{attempt_id}/manifest.json")
    if c.status not in (INCOMPLETE, INVALID):
        raise c.error if c.error is not None else UsageError(f"{attempt_id}: {c.status}")
    writers = sorted(int(m[1]) for o in storage.list(f"{attempt_id}/index/", recursive=False)
                     if (m := _INDEX.fullmatch(o.path.rsplit("/", 1)[-1])))
    if not writers:
        raise WriterMissingError(f"{attempt_id}/index/ holds no writer index: nothing to "
                                 "rebuild the commit record from", path=f"{attempt_id}/index/")
    missing = sorted(set(range(writers[-1] + 1)) - set(writers))
    if missing:
        raise WriterMissingError(
            f"{attempt_id}: the indexes of writers {missing[:8]} are missing (writers 0 to "
            f"{writers[-1]} wrote it): their data cannot be told; a copy of the version may "
            "hold them", path=f"{attempt_id}/index/")
    indexes = read_writer_indexes(storage, attempt_id, writers)
    ranks = [v.rank for x in indexes for e in x.entries.values() for v in e.values
             if v.rank is not None]
    size = world_size if world_size is not None else (max(ranks) + 1 if ranks else len(writers))
    return commit(storage, attempt_id, step=step, indexes=indexes, expected_writers=writers,
                  continuation=Continuation("statistical", size, None),
                  producer={"name": "portable-ckpt recommit", "version": __version__})
