"""When to save: step intervals, wall-clock intervals, listed steps and preemption (no torch).

A decision is computed by one process (rank 0 of the job) and shared with every rank, so no rank
ever decides alone: wall clocks drift between hosts, and a SIGTERM reaches ranks at different
moments. :func:`decide` is pure; :class:`Decision` travels between ranks as one small integer
(:meth:`Decision.encode`), combined with the other ranks' preemption flags by a max-reduction.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Final, Literal

from portable_ckpt.errors import UsageError

__all__ = ["TIERS", "Decision", "SavePolicy", "Tier", "decide", "next_rule_step"]

Tier = Literal["none", "fast", "durable"]
#: Tiers in encoding order (a larger index wins when decisions are combined).
TIERS: Final[tuple[Tier, ...]] = ("none", "fast", "durable")
_REASONS: Final[tuple[str, ...]] = (
    "",
    "fast_every",
    "save_every",
    "save_every_seconds",
    "save_steps",
    "requested",
    "preemption",
)


def _positive(name: str, value: float | None) -> None:
    # (a str such as "5" was a TypeError from the comparison: api review 31)
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
    ):
        raise UsageError(f"{name} must be a positive number or None, got {value!r}")


@dataclass(frozen=True)
class SavePolicy:
    """The save-decision policy of a :class:`~portable_ckpt.torch.CheckpointManager`.

    Attributes:
        save_every: Durable save every N steps (steps divisible by N).
        save_every_seconds: Durable save once S seconds passed since the last save started.
        save_steps: Steps that are always saved durably.
        fast_every: Save to the fast tier every N steps (when a fast tier is configured).

    """

    save_every: int | None = None
    save_every_seconds: float | None = None
    save_steps: frozenset[int] = field(default_factory=frozenset)
    fast_every: int | None = None

    @classmethod
    def build(
        cls,
        *,
        save_every: int | None = None,
        save_every_seconds: float | None = None,
        save_steps: Iterable[int] = (),
        fast_every: int | None = None,
    ) -> SavePolicy:
        """Validate the arguments (PCK-USAGE on nonsense) and build the policy."""
        _positive("save_every", save_every)
        _positive("save_every_seconds", save_every_seconds)
        _positive("fast_every", fast_every)
        for name, v in (("save_every", save_every), ("fast_every", fast_every)):
            if v is not None and not isinstance(v, int):
                raise UsageError(f"{name} must be an int, got {v!r}")
        if isinstance(save_steps, str | bytes) or not isinstance(save_steps, Iterable):
            raise UsageError(  # (5 was a TypeError: 'int' object is not iterable)
                f"save_steps must be a collection of steps, got {type(save_steps).__name__} "
                f"{save_steps!r:.80}"
            )
        steps = frozenset(save_steps)
        bad = [s for s in steps if isinstance(s, bool) or not isinstance(s, int) or s < 0]
        if bad:
            raise UsageError(f"save_steps must be non-negative ints, got {bad[:4]}")
        return cls(save_every, save_every_seconds, steps, fast_every)

    @cached_property
    def sorted_steps(self) -> tuple[int, ...]:
        """``save_steps`` in increasing order."""
        return tuple(sorted(self.save_steps))


@dataclass(frozen=True)
class Decision:
    """What one ``maybe_save`` call does, identical on every rank.

    Attributes:
        tier: ``"none"`` (no save), ``"fast"`` or ``"durable"``.
        reason: The policy that asked for the save (``save_every``, ``preemption``, ...).
        sync: Save synchronously (preemption: the process is about to be stopped).

    """

    tier: Tier
    reason: str = ""
    sync: bool = False

    @property
    def saves(self) -> bool:
        """Whether a save is started."""
        return self.tier != "none"

    def encode(self) -> int:
        """One non-negative integer: tier, reason and sync flag (for a max-reduction)."""
        return (TIERS.index(self.tier) << 8) | (_REASONS.index(self.reason) << 1) | int(self.sync)

    @classmethod
    def decode(cls, value: int) -> Decision:
        """Inverse of :meth:`encode`."""
        tier = TIERS[(value >> 8) & 0x3]
        return cls(tier, _REASONS[(value >> 1) & 0x7F], bool(value & 1))


def decide(
    policy: SavePolicy,
    step: int,
    *,
    now: float,
    last_save_time: float | None,
    last_save_step: int | None,
    has_fast: bool,
    preempted: bool = False,
) -> Decision:
    """Decide whether ``step`` is saved, and where.

    A step is never saved twice: once ``last_save_step == step`` nothing more is saved (a
    preemption after the step's save returns no new save). Preemption saves durably and
    synchronously. Wall-clock intervals count from the start of the previous save (or from the
    manager's creation, passed as ``last_save_time``).
    """
    if last_save_step is not None and step <= last_save_step:
        return Decision("none")
    if preempted:
        return Decision("durable", "preemption", sync=True)
    if step in policy.save_steps:
        return Decision("durable", "save_steps")
    if policy.save_every is not None and step % policy.save_every == 0:
        return Decision("durable", "save_every")
    if (
        policy.save_every_seconds is not None
        and last_save_time is not None
        and now - last_save_time >= policy.save_every_seconds
    ):
        return Decision("durable", "save_every_seconds")
    if has_fast and policy.fast_every is not None and step % policy.fast_every == 0:
        return Decision("fast", "fast_every")
    return Decision("none")


def next_rule_step(policy: SavePolicy, step: int, *, has_fast: bool) -> int | None:
    """The first step after ``step`` that a step rule saves (``None``: no rule ever does).

    ``save_every``, ``save_steps`` and ``fast_every`` save at steps known in advance: the ranks
    need not agree before such a step to know that nothing is saved (the manager's decisions
    between agreements rest on this).
    """
    found: list[int] = []
    at = bisect.bisect_right(policy.sorted_steps, step)
    if at < len(policy.sorted_steps):
        found.append(policy.sorted_steps[at])
    for every in (policy.save_every, policy.fast_every if has_fast else None):
        if every is not None:
            found.append((step // every + 1) * every)
    return min(found, default=None)
