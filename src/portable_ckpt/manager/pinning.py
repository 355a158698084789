"""Pins a checkpoint manager keeps in step with its retention policy (``pin_kept``, spec §15.3).

No torch: the versions ``keep_every`` and ``keep_best`` keep are pinned, so that a gc outside the
job (a platform's ``gc --keep N``) keeps them too, and the manager's own pins of versions its
policy let go are removed. A pin written by anyone else is never touched.
"""

from __future__ import annotations

from collections.abc import Sequence

from portable_ckpt.manager.retention import RetentionDecision
from portable_ckpt.storage import Storage

__all__ = ["MANAGER_PIN_BY", "manager_pins", "sync_pins"]

#: ``by`` of the pins a manager writes (``pin_kept``): the only pins it ever removes.
MANAGER_PIN_BY = "portable_ckpt CheckpointManager (pin_kept)"
_PINNING = ("keep_every=", "keep_best=")


def sync_pins(storage: Storage, decisions: Sequence[RetentionDecision]) -> dict[str, list[str]]:
    """Pin what ``keep_every``/``keep_best`` keep; unpin this manager's pins of what they let go.

    Only the pin of a version read as committed, which the policies let go, or of a version
    no longer at the root, is removed: a version whose records could not be read, or are
    damaged, keeps its pin (its decision says nothing about the policies). Returns
    ``{"pinned": [...], "unpinned": [...]}`` for the retention event.

    Raises:
        CheckpointError: a storage error (retention is skipped this time; pins already written
            or removed stay so).

    """
    from portable_ckpt.io.pins import pin, read_pins, unpin

    wanted = {d.id: [r for r in d.reasons if r.startswith(_PINNING)] for d in decisions}
    # Only a version read as committed is let go: one whose commit record could not be read
    # this time (a 503, EACCES), or is damaged, is "not committed" to the policy, and one
    # failed read unpinned it for the next platform gc (attack review 5 F3).
    clear = {d.id for d in decisions
             if not any(r.startswith(("unclassified", "not committed")) for r in d.reasons)}
    ours = {aid for aid, recs in read_pins(storage).items()
            if any(r.get("by") == MANAGER_PIN_BY for r in recs)}
    added = [aid for aid, why in wanted.items() if why and aid not in ours]
    for aid in added:
        pin(storage, aid, reason="; ".join(wanted[aid]), by=MANAGER_PIN_BY)
    # A version no longer in the listing may be gone (deleted by hand): its pin names nothing
    # (diff review 3 F10). Or it was committed and pinned after the listing (another job, a
    # manager starting while this one finishes): asked again, one commit record still there,
    # or a storage that cannot tell, keeps the pin (last review F1).
    gone = {aid for aid in ours - {d.id for d in decisions} if _no_record(storage, aid)}
    dropped = sorted(aid for aid in (ours & clear) | gone if not wanted.get(aid))
    for aid in dropped:
        unpin(storage, aid, by=MANAGER_PIN_BY)
    return {"pinned": added, "unpinned": dropped}


def manager_pins(storage: Storage) -> list[str]:
    """The attempt ids a manager's ``pin_kept`` pinned (``by`` :data:`MANAGER_PIN_BY`), sorted.

    A manager without ``pin_kept`` leaves them (removing them could let its own retention
    delete the milestones they hold in the same pass) and says so once (on-call review 23, F7:
    a relaunch without ``pin_kept`` kept an earlier run's pins for good, without a word).

    Raises:
        CheckpointError: the pins could not be read.

    """
    from portable_ckpt.io.pins import read_pins

    return sorted(aid for aid, recs in read_pins(storage).items()
                  if any(r.get("by") == MANAGER_PIN_BY for r in recs))


def _no_record(storage: Storage, attempt_id: str) -> bool:
    """Whether ``attempt_id`` has, as asked now, no commit record (an error: it may have one)."""
    from portable_ckpt.errors import CheckpointError

    try:
        return not storage.exists(f"{attempt_id}/manifest.json")
    except CheckpointError:
        return False
