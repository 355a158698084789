"""What a save or load reports: :class:`CheckpointInfo` and :class:`LoadInfo` (on every rank)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["CheckpointInfo", "LoadInfo"]


@dataclass(frozen=True)
class CheckpointInfo:
    """The outcome of a committed save, on every rank.

    Attributes:
        checkpoint_id: The attempt id of the published version.
        step: Its step.
        path: The version directory (``<root>/<attempt id>``).
        world_size: Ranks that wrote.
        contract: The continuation contract recorded.
        rank: This rank.
        bytes_written: Bytes this rank wrote (data, entries, index).
        total_bytes: Bytes of the whole version (all files).
        seconds: Wall time of the save on this rank (for async: staging to commit).
        blocking_seconds: Time the caller was blocked (for async: until ``staged``).
        staging_bytes: Size of this rank's reusable staging buffers (0 when none were needed).

    """

    checkpoint_id: str
    step: int
    path: str
    world_size: int
    contract: str
    rank: int
    bytes_written: int
    total_bytes: int
    seconds: float
    blocking_seconds: float
    staging_bytes: int


@dataclass
class LoadInfo:
    """The outcome of a load, on every rank.

    Attributes:
        step: The manifest's step.
        checkpoint_id: The attempt id loaded.
        contract: ``"exact"`` when the saved contract was exact and the world size and mesh are
            unchanged; ``"statistical"`` otherwise (only with ``allow_statistical=True``).
        saved_world_size: World size at save time.
        world_size: World size now.
        path: The version directory.
        rank: This rank.
        seconds: Wall time of the load on this rank.
        tensors_loaded: Tensor keys filled on this rank.
        target_bytes: Bytes of the local targets filled on this rank.
        bytes_read: Bytes this rank fetched from storage.
        blocks_verified: Checksum blocks verified by this rank.
        peak_temp_bytes: Largest temporary buffer this rank needed.
        elements_covered: Elements proven covered exactly once on this rank.
        entries_loaded: Non-tensor entries applied.
        missing_keys: Target keys absent from the checkpoint (only with ``strict=False``).
        fresh_optimizer_state: Target keys of an optimizer's state of parameters the version
            has no state of (they had none when saved: no gradient yet), left as the target
            holds them (a fresh state), with ``strict`` as well.
        left_from_failed: Of ``missing_keys``, those a newer candidate that failed part way
            holds (a manager's restore that fell back), or the version that retention deleted
            while it was read (a load that read the root's latest again): they may hold its
            values on some ranks.
        unexpected_keys: Stored tensor and plain-value keys the target did not ask for.
        casts: The tensors this rank loaded into another dtype than the stored one: ``{"key",
            "stored", "target", "elements", "flushed"}`` (``flushed``: non-zero values that
            became 0). A cast that made finite values infinite, more than half of a box's
            non-zero values 0, or changed an integer, was refused instead.
        changed_hyperparameters: The members of the target's optimizer param groups (all but
            ``params``) whose stored values differ from the values the optimizer held before
            the load (a changed config): ``{"optimizer", "group", "key", "stored", "current",
            "applied"}`` (``optimizer``: the key of its state, ``applied``: ``"checkpoint"`` or
            ``"current"``, as the load's ``optimizer_hyperparameters`` chose; a tensor
            member's values as numbers, a list for a tuple), by optimizer and group in the
            target's order. Not the members an LR scheduler in the state sets on the optimizer
            it drives (``lr``, ``initial_lr``; ``momentum`` and ``betas`` too where it cycles
            momentum, as ``OneCycleLR`` and ``CyclicLR`` do by default), nor those that
            choose kernels (``foreach``, ``fused``, ``capturable``, ``differentiable``: the
            current values kept), nor a member NaN on both sides.
        passed_over: With :meth:`CheckpointManager.restore`: the versions newer than the one
            restored that it passed over, newest first (at most 8; ``passed_over_more`` counts
            the rest): ``{"checkpoint_id", "step", "tier", "path", "reason", "code",
            "message", "recorded_failed", "copies", "copies_error", "commands"}``. ``reason``
            is ``"damaged"`` (found damaged while read), ``"unloadable"`` (failed otherwise
            while read), ``"invalid"`` (its commit record is invalid or lost),
            ``"failed_verification"`` (a recorded failed verification, R-DRILL-8) or
            ``"uncommitted"`` (no commit record and no other record, but every writer's index:
            a save cut short at its commit, or a version whose record was lost, which
            ``portable-ckpt recommit ROOT/ID --was-committed`` brings back), with the
            error's ``code`` and ``message``; ``recorded_failed``: it holds a failed
            verification record (retention deletes it unless pinned); ``copies`` the roots
            that hold a verified copy of it (its copy records with ``ok: true``),
            ``copies_error`` why its copy records could not all be read, ``commands`` the
            ``portable-ckpt copy`` and ``verify`` that bring the first copy back once the
            version is set aside (moved out of the root). The same on every rank.
        passed_over_more: Versions passed over beyond those listed in ``passed_over`` (not
            counting attempts without a commit record, reason ``"uncommitted"``).
        per_rank: Every rank's counters (from the final status exchange).
        range_map: With ``record_ranges=True``: for each key, the stored boxes (file, writer
            box) and the target box they fill on this rank.

    """

    step: int
    checkpoint_id: str
    contract: str
    saved_world_size: int
    world_size: int
    path: str
    rank: int
    seconds: float = 0.0
    tensors_loaded: int = 0
    target_bytes: int = 0
    bytes_read: int = 0
    blocks_verified: int = 0
    peak_temp_bytes: int = 0
    elements_covered: int = 0
    entries_loaded: int = 0
    missing_keys: list[str] = field(default_factory=list)
    fresh_optimizer_state: list[str] = field(default_factory=list)
    left_from_failed: list[str] = field(default_factory=list)
    unexpected_keys: list[str] = field(default_factory=list)
    casts: list[dict[str, Any]] = field(default_factory=list)
    changed_hyperparameters: list[dict[str, Any]] = field(default_factory=list)
    passed_over: list[dict[str, Any]] = field(default_factory=list)
    passed_over_more: int = 0
    per_rank: list[dict[str, Any]] = field(default_factory=list)
    range_map: list[dict[str, Any]] | None = None

    def counters(self) -> dict[str, Any]:
        """Return this rank's counters as a JSON object."""
        return {
            "rank": self.rank,
            "seconds": self.seconds,
            "tensors_loaded": self.tensors_loaded,
            "target_bytes": self.target_bytes,
            "bytes_read": self.bytes_read,
            "blocks_verified": self.blocks_verified,
            "peak_temp_bytes": self.peak_temp_bytes,
            "elements_covered": self.elements_covered,
            "entries_loaded": self.entries_loaded,
        }
