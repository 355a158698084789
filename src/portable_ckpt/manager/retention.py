"""Which versions to keep: last N, every M-th step, best N by a metric (no torch, no I/O).

:func:`plan_retention` classifies every attempt of a root and says, with reasons, what is kept
and what may be deleted. A version is kept when any policy keeps it (as Orbax's
``AnyPreservationPolicy``). Whatever happens, it never marks for deletion: the newest committed
version, the newest drilled version, a save in flight, an attempt without a valid commit record
(that is gc's job, after its grace period), or a version whose records could not be read
(unclassified). When no policy is configured every version is kept. Deleting is done by the core
gc (:func:`portable_ckpt.io.gc.gc`), which removes the commit record first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from portable_ckpt.errors import UsageError
from portable_ckpt.io.annotations import timestamp_key

__all__ = ["Candidate", "KeepBest", "RetentionDecision", "RetentionPolicy", "plan_retention"]


@dataclass(frozen=True)
class KeepBest:
    """Keep the ``n`` versions with the best value of ``metric`` (``mode`` ``"min"`` or ``"max"``)."""

    metric: str
    n: int
    mode: Literal["min", "max"] = "min"

    @classmethod
    def parse(cls, value: Any) -> KeepBest | None:
        """Accept ``None``, a :class:`KeepBest` or a ``(metric, n, mode)`` tuple."""
        if value is None or isinstance(value, KeepBest):
            return value
        try:
            metric, n, mode = value
        except (TypeError, ValueError):
            raise UsageError(
                f"keep_best must be (metric, n, 'min'|'max'), e.g. ('loss', 3, 'min'); got {value!r}"
            ) from None
        if not isinstance(metric, str) or not metric:
            raise UsageError(f"keep_best metric must be a non-empty str, got {metric!r}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UsageError(f"keep_best n must be an int >= 1, got {n!r}")
        if mode not in ("min", "max"):
            raise UsageError(f"keep_best mode must be 'min' or 'max', got {mode!r}")
        return cls(metric, n, mode)

    def score(self, metrics: Mapping[str, Any] | None) -> float | None:
        """The finite value of :attr:`metric` in ``metrics``; ``None``: the version is unranked.

        An unranked version is never deleted (it may be among the best): a manager warns once
        when a durable save carries no such value.
        """
        value = (metrics or {}).get(self.metric)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value) if math.isfinite(value) else None


@dataclass(frozen=True)
class RetentionPolicy:
    """Retention of a manager's tier: any of keep_last, keep_every, keep_best (``None``: off)."""

    keep_last: int | None = None
    keep_every: int | None = None
    keep_best: KeepBest | None = None

    @classmethod
    def build(
        cls, *, keep_last: int | None = None, keep_every: int | None = None, keep_best: Any = None
    ) -> RetentionPolicy:
        """Validate and build (PCK-USAGE on nonsense)."""
        for name, v in (("keep_last", keep_last), ("keep_every", keep_every)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise UsageError(f"{name} must be an int >= 1 or None, got {v!r}")
        return cls(keep_last, keep_every, KeepBest.parse(keep_best))

    @property
    def active(self) -> bool:
        """Whether any policy is configured (otherwise everything is kept)."""
        return any(v is not None for v in (self.keep_last, self.keep_every, self.keep_best))

    def describe(self) -> str:
        """Human-readable form for messages."""
        parts = [f"keep_last={self.keep_last}"] if self.keep_last else []
        if self.keep_every:
            parts.append(f"keep_every={self.keep_every}")
        if self.keep_best:
            b = self.keep_best
            parts.append(f"keep_best=({b.metric!r}, {b.n}, {b.mode!r})")
        return ", ".join(parts) or "no policy"


@dataclass(frozen=True)
class Candidate:
    """One attempt of a root as retention sees it.

    Attributes:
        id: The attempt id.
        step: Its step.
        committed: A valid commit record exists.
        metrics: Metrics stored in the version (``None``: none stored).
        drilled: A restore drill passed.
        verification_failed: A verification of it failed and none cleared it (never restored).
        in_flight: A save of this attempt is still running in this job.
        classified: Its records could be read (``False``: something about it is unknown).
        committed_at: Its commit record's time (orders a rollback's new branch).

    """

    id: str
    step: int
    committed: bool = True
    metrics: Mapping[str, Any] | None = None
    drilled: bool = False
    verification_failed: bool = False
    in_flight: bool = False
    classified: bool = True
    committed_at: str | None = None


@dataclass
class RetentionDecision:
    """The verdict on one attempt: ``delete`` or keep, with every reason that applied."""

    id: str
    step: int
    delete: bool
    reasons: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """JSON form (telemetry)."""
        return {"id": self.id, "step": self.step, "delete": self.delete, "reasons": self.reasons}


def _best(good: Sequence[Candidate], best: KeepBest) -> tuple[set[str], set[str]]:
    """Ids among the best ``n`` and ids without a usable metric value."""
    scored = [(v, c) for c in good if (v := best.score(c.metrics)) is not None]
    unscored = {c.id for c in good if best.score(c.metrics) is None}
    # Ties: the newer version wins (it continues furthest).
    scored.sort(key=lambda vc: (vc[0] if best.mode == "min" else -vc[0], -vc[1].step))
    return {c.id for _, c in scored[: best.n]}, unscored


def plan_retention(
    candidates: Sequence[Candidate], policy: RetentionPolicy
) -> list[RetentionDecision]:
    """Classify ``candidates`` (any order); return one decision per candidate, oldest first."""
    ordered = sorted(candidates, key=lambda c: (c.step, c.id))
    committed = [c for c in ordered if c.committed]
    good = [c for c in committed if c.classified and not c.verification_failed]
    keep: dict[str, list[str]] = {c.id: [] for c in ordered}
    for c in ordered:
        if not c.committed:
            keep[c.id].append("not committed (left to gc's grace period)")
        if c.in_flight:
            keep[c.id].append("save in flight")
        if not c.classified:
            keep[c.id].append("unclassified (its records could not be read)")
    if committed:
        keep[committed[-1].id].append("newest committed")
    drilled = [c for c in committed if c.drilled]
    if drilled:
        keep[drilled[-1].id].append("newest drilled")
    if not policy.active:
        for c in committed:
            keep[c.id].append("no retention policy")
    if policy.keep_last:
        for c in good[-policy.keep_last :]:
            keep[c.id].append(f"keep_last={policy.keep_last}")
        # A rollback's new branch (committed after the greatest step, at lower steps) keeps its
        # own keep_last newest, as gc does: counted by step, the abandoned steps took their
        # places (docs review F12: keep_last=2 left the branch one version).
        top = timestamp_key(committed[-1].committed_at) if committed else (-1,)
        branch = sorted((c for c in good if timestamp_key(c.committed_at) > top),
                        key=lambda c: timestamp_key(c.committed_at))
        for c in branch[-policy.keep_last :]:
            keep[c.id].append(f"keep_last={policy.keep_last} (a rollback's new branch)")
    if policy.keep_every:
        for c in good:
            if c.step % policy.keep_every == 0:
                keep[c.id].append(f"keep_every={policy.keep_every}")
    if policy.keep_best:
        best, unscored = _best(good, policy.keep_best)
        b = policy.keep_best
        for c in good:
            if c.id in best:
                keep[c.id].append(f"keep_best={b.n} by {b.mode} {b.metric}")
            elif c.id in unscored:
                keep[c.id].append(f"no {b.metric!r} metric stored (unclassified for keep_best)")
    out = []
    for c in ordered:
        if keep[c.id]:
            out.append(RetentionDecision(c.id, c.step, False, keep[c.id]))
        elif c.verification_failed:
            out.append(RetentionDecision(c.id, c.step, True, ["failed sampled verification"]))
        else:
            out.append(RetentionDecision(c.id, c.step, True, [f"outside {policy.describe()}"]))
    return out
