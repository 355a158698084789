"""Save decisions agreed by every rank, and preemption by SIGTERM (and, on request, SIGINT).

The manager has its own gloo group, so a decision never interleaves with a save's collectives.
One max-reduction of a few integers (an *agreement*) carries rank 0's policy decision, every
rank's preemption flag and every rank's count of consecutive failed saves: no rank decides
alone, a SIGTERM seen by one rank preempts all, and every rank raises at the same call once
``max_failed_saves`` saves in a row failed.

An agreement is a blocking collective (1.7 ms per step at 2 ranks on loopback, more across
hosts: soak review F1), so the ranks do not agree at every ``maybe_save``. Each agreement also
carries the step of the next one, chosen by rank 0: about ``decision_interval`` seconds of steps
ahead (by its measured pace, at most :data:`MAX_DECISION_GAP` steps), never after the next step
that ``save_every``/``save_steps``/``fast_every`` saves. Until then every rank knows that
nothing is saved without asking. So step rules save at exactly their steps, as before, and a
signal or a ``save_every_seconds`` interval is acted on within about ``decision_interval``
seconds. ``decision_interval=0`` agrees at every call. Every agreement also compares the ranks'
steps: the schedule rests on every rank passing the same ones.

SIGTERM (and SIGINT with ``handle_sigint=True``: Ctrl-C, which torchrun forwards to its workers):
the first one only sets a flag (the next ``maybe_save`` saves synchronously and ``preempted``
lets the loop stop); a second one, or one arriving once the manager is closing or the
interpreter exiting, gets the process's previous disposition (SIGTERM by default terminates,
SIGINT raises ``KeyboardInterrupt``), so a process that will never call ``maybe_save`` again can
always be stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from portable_ckpt.errors import DistributedError, UsageError
from portable_ckpt.manager.decisions import Decision, decide, next_rule_step
from portable_ckpt.torch._collectives import new_gloo_group
from portable_ckpt.torch._inflight import say

if TYPE_CHECKING:
    from portable_ckpt.torch.manager import CheckpointManager

__all__ = [
    "MAX_DECISION_GAP",
    "Preemption",
    "agree",
    "agreement_due",
    "any_rank",
    "broadcast_json",
    "make_group",
]

#: Most steps from one agreement to the next: if the steps slow down after rank 0 chose the gap
#: (evaluation, a slower phase), a signal waits at most this many of the slower steps.
MAX_DECISION_GAP = 32


def make_group(process_group: Any, timeout: float | None) -> tuple[Any, int, int]:
    """The manager's own gloo group (None alone), this rank in it, and its size."""
    if not (dist.is_available() and dist.is_initialized()):
        return None, 0, 1
    pg = process_group if process_group is not None else dist.group.WORLD
    ranks = [int(r) for r in dist.get_process_group_ranks(pg)]
    rank = dist.get_rank(pg)
    if len(ranks) == 1:
        return None, 0, 1
    # Only this group's ranks call: disjoint groups may each have a manager of their own.
    group = new_gloo_group(ranks, timeout)
    return group, rank, len(ranks)


class Preemption:
    """The preemption signal handling of one manager (installed from the main thread only).

    One handler per signal serves every open manager of the process: the first signal sets
    the flag of each of them (each saves at its next ``maybe_save``), the second gets the
    disposition the process had before the first manager. Each manager installing its own
    handler lost the preemption save of all but the newest, and closing them in creation
    order left a closed manager's handler installed: the next SIGTERM was swallowed, the one
    after recursed (async review F12).
    """

    def __init__(self, sigterm: bool, sigint: bool = False) -> None:
        self.seen = threading.Event()
        self.signal_name = "SIGTERM"  # the first signal received (telemetry)
        self.signals: list[int] = []
        wanted = [s for s, on in ((signal.SIGTERM, sigterm), (signal.SIGINT, sigint)) if on]
        if not wanted or threading.current_thread() is not threading.main_thread():
            return
        for sig in wanted:
            if sig in _PREVIOUS:
                self.signals.append(sig)  # installed by an open manager: shared
            elif not (sig == signal.SIGINT and signal.getsignal(sig) == signal.SIG_IGN):
                # (a process started with SIGINT ignored, ``cmd &``, keeps ignoring it)
                _PREVIOUS[sig] = signal.signal(sig, _on_signal)
                self.signals.append(sig)
        _OPEN.append(self)

    def restore(self) -> None:
        """Stop handling signals for this manager.

        The last one out puts back the dispositions the process had before (no-op outside the
        main thread).
        """
        if self in _OPEN:
            _OPEN.remove(self)
        for sig in self.signals:
            if any(sig in p.signals for p in _OPEN) or sig not in _PREVIOUS:
                continue
            try:
                if signal.getsignal(sig) is _on_signal:  # not if someone installed one since
                    prev = _PREVIOUS[sig]
                    signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
            except (ValueError, TypeError):  # pragma: no cover - not the main thread
                return
            del _PREVIOUS[sig]
        self.signals = []


#: Dispositions before the first open manager installed its handler, by signal.
_PREVIOUS: dict[int, Any] = {}
#: Open managers' preemption states, oldest first.
_OPEN: list[Preemption] = []


def _forget_after_fork() -> None:
    """A forked child owns none of its parent's managers: its signals act as before them.

    It inherited the handler, which only set the flag of a manager it never polls: the
    child swallowed its first SIGTERM (race review F6).
    """
    for sig, prev in list(_PREVIOUS.items()):
        with contextlib.suppress(ValueError, TypeError, OSError):
            if signal.getsignal(sig) is _on_signal:
                signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
    _PREVIOUS.clear()
    _OPEN.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def _on_signal(signum: int, frame: Any) -> None:
    targets = [p for p in _OPEN if signum in p.signals]
    fresh = [p for p in targets if not p.seen.is_set()]
    if fresh:
        # Only set flags: logging or collectives inside a signal handler can deadlock.
        for p in fresh:
            p.signal_name = signal.Signals(signum).name
            p.seen.set()
        return
    prev = _PREVIOUS.pop(signum, None)
    for p in targets:
        p.signals = [s for s in p.signals if s != signum]
    with contextlib.suppress(OSError):  # one line before the default action (async review F13)
        os.write(2, f"portable_ckpt: a second {signal.Signals(signum).name}: the process stops "
                    "now, and a checkpoint still being written is lost\n".encode())
    signal.signal(signum, prev if prev is not None else signal.SIG_DFL)
    if callable(prev):
        prev(signum, frame)  # e.g. SIGINT's default_int_handler: KeyboardInterrupt
    elif prev is None or prev == signal.SIG_DFL:
        signal.raise_signal(signum)  # the default action: terminate


def _on_group(mgr: CheckpointManager, what: str, run: Callable[[Any], None]) -> None:
    """Run a collective on the manager's group; a failure marks the group for renewal.

    A gloo group whose collective failed never works again (a timeout closes its pairs);
    every rank saw it fail, so every rank makes the new one at its next collective, at the
    same call (async review F8). The restore's collectives failed with gloo's own
    ``RuntimeError`` and left the group unmarked: the next ``maybe_save`` failed too (race
    review F4).
    """
    if mgr._group is None:
        return
    if mgr._group_broken:
        mgr._spent_groups.append(mgr._group)  # released at close (a peer may still be in it)
        mgr._group, _, _ = make_group(mgr.process_group, mgr.timeout)
        mgr._group_broken = False
    try:
        run(mgr._group)
    except Exception as e:
        mgr._group_broken = True
        raise DistributedError(
            f"rank {mgr.rank}: {what} could not be agreed ({e}); a peer rank died, stopped "
            f"calling the manager, or is later than timeout={mgr.timeout} s"
        ) from e


def _reduce_max(mgr: CheckpointManager, flags: torch.Tensor, step: int) -> None:
    def run(group: Any) -> None:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group, async_op=True).wait()

    _on_group(mgr, f"the save decision for step {step}", run)


def agreement_due(mgr: CheckpointManager, step: int) -> bool:
    """Whether ``maybe_save(step)`` agrees with the other ranks (else nothing is saved).

    Alone, a rank decides at every call (no collective). In a group the last agreement named
    the next one's step; a step at or before the previous call's (a loop restarted after a
    restore, a repeated call) agrees at once. Every rank computes the same answer from the
    same steps.
    """
    previous, mgr._last_call_step = mgr._last_call_step, step
    if mgr._group is None or mgr._agreed is None:
        return True
    return step >= mgr._agreed or (previous is not None and step <= previous)


def _next_agreement(mgr: CheckpointManager, step: int, now: float) -> int:
    """Rank 0's choice of the next agreement's step (see the module docstring)."""
    gap = 1
    prev = mgr._agreed_at
    if mgr.decision_interval > 0 and prev is not None and step > prev[0]:
        per_step = max(now - prev[1], 0.0) / (step - prev[0])
        gap = MAX_DECISION_GAP
        if per_step > 0:  # (min before int: an interval of inf is the largest gap, D4)
            gap = max(1, int(min(float(MAX_DECISION_GAP), mgr.decision_interval / per_step)))
    mgr._agreed_at = (step, now)
    rule = next_rule_step(mgr.policy, step, has_fast="fast" in mgr.tiers)
    return step + gap if rule is None else min(step + gap, rule)


#: A step no rank saw fail, in the agreement's max-reduction (steps are at least 0).
_NO_STEP = -(1 << 62)


def agree(mgr: CheckpointManager, step: int, forced: Decision | None = None) -> Decision:
    """Rank 0's decision, every rank's preemption flag and failure count: one max-reduction.

    Also the next agreement's step (rank 0's) and the ranks' smallest and largest ``step``.
    """
    mine = Decision("none")
    following = 0
    if mgr.rank == 0:
        now = time.monotonic()  # as _last_save_time (multi-job review F9)
        mine = forced or decide(
            mgr.policy,
            step,
            now=now,
            last_save_time=mgr._last_save_time,
            last_save_step=mgr._last_save_step,
            has_fast="fast" in mgr.tiers,
        )
        following = _next_agreement(mgr, step, now)
        _say_skipped(mgr, step, mine, now)
    seen = int(mgr._preemption.seen.is_set())
    failed = mgr._failed_steps
    flags = torch.tensor(
        [mine.encode(), seen, mgr._failed_saves, following, step, -step, int(mgr._bg_broken),
         int(mgr._fast_failed), failed[-1] if failed else _NO_STEP,
         -failed[0] if failed else _NO_STEP],
        dtype=torch.int64,
    )
    mgr._agreed = None  # until this agreement is known (a failed one: the next call agrees)
    _reduce_max(mgr, flags, step)
    mgr._agreements += 1
    if int(flags[4]) != -int(flags[5]):
        raise UsageError(
            f"rank {mgr.rank}: the ranks called maybe_save/save with different steps (from "
            f"{-int(flags[5])} to {int(flags[4])}; this rank: {step}). Every rank must pass the "
            "same step at the same call"
        )
    if int(flags[6]):  # a rank's background group broke: every rank makes a new one, here
        _renew_background(mgr)
    mgr._fast_failing = bool(int(flags[7]))  # where replicate's durable saves go (_target)
    decision = Decision.decode(int(flags[0]))
    mgr._agreed_failed_saves = int(flags[2])  # the most any rank has seen so far
    # (Ranks other than the one that saw them said "steps ?" when the job stopped: audit 32.)
    mgr._agreed_failed_range = (
        None if int(flags[8]) == _NO_STEP else (-int(flags[9]), int(flags[8])))
    if int(flags[1]) and not mgr.preempted:
        mgr.preempted = True
        name = mgr._preemption.signal_name if seen else None  # None: a peer rank's signal
        mgr.telemetry.emit("preempted", step=step, signal=name)
    # Once preempted, every call agrees (and saves, as ever; the loop is meant to stop).
    mgr._agreed = step + 1 if mgr.preempted else max(int(flags[3]), step + 1)
    if mgr.preempted and forced is None:
        pre = decide(
            mgr.policy,
            step,
            now=0.0,
            last_save_time=None,
            last_save_step=mgr._last_save_step,
            has_fast=False,
            preempted=True,
        )
        decision = pre if pre.saves else decision
    return decision


def _say_skipped(mgr: CheckpointManager, step: int, decision: Decision, now: float) -> None:
    """A rule step below the restored or last saved step is not saved: say so once (rank 0).

    It is never saved twice, and a lower one would sort below it (a restore takes the higher
    step): a loop that counts from 1 again in the same root saved nothing, silently, until it
    passed that step (fine-tuning review F1).
    """
    last = mgr._last_save_step
    if decision.saves or last is None or step >= last or "below-last" in mgr._warned:
        return
    would = decide(mgr.policy, step, now=now, last_save_time=mgr._last_save_time,
                   last_save_step=None, has_fast="fast" in mgr.tiers)
    if not would.saves:
        return
    mgr._warned.add("below-last")
    say(f"step {step} is not saved ({would.reason}): this root's last version is step {last}, "
        "and no step up to it is saved again (a restore would take the higher step). Continue "
        "the step count from the restored step, or start a new run in another root (said once)")


def _renew_background(mgr: CheckpointManager) -> None:
    """A new background group, made by every rank at one agreement.

    On the main thread: groups are made in one order on every rank. Work that was already in a
    collective of the old group fails; work queued with it runs on this one
    (:func:`~portable_ckpt.torch._manager_post.usable_comm`).
    """
    from portable_ckpt.torch._manager_nodelocal import background_comm

    mgr._bg_broken = False
    if mgr._bg_comm is not None:
        mgr._spent_groups.append(mgr._bg_comm.group)
    mgr._bg_comm = background_comm(mgr.process_group, mgr.timeout)


def release_groups(mgr: CheckpointManager) -> None:
    """Destroy the groups this manager made (at close, its work done).

    Each held ~5 file descriptors and 2 sockets for the life of the process (integrator review
    F10: a sweep that made a manager per trial ran out of descriptors).
    """
    groups = [*mgr._spent_groups, mgr._group, None if mgr._bg_comm is None else mgr._bg_comm.group]
    mgr._spent_groups, mgr._group, mgr._bg_comm = [], None, None
    for group in groups:
        if group is not None:
            with contextlib.suppress(Exception):  # a group torch already tore down
                dist.destroy_process_group(group)


def broadcast_json(mgr: CheckpointManager, obj: Any, what: str) -> Any:
    """Rank 0's JSON value on every rank of the manager's group (``obj`` itself alone)."""
    out: list[Any] = [obj]

    def run(group: Any) -> None:
        data = json.dumps(obj).encode() if mgr.rank == 0 else b""
        size = torch.tensor([len(data)], dtype=torch.int64)
        src = dist.get_global_rank(group, 0)
        dist.broadcast(size, src=src, group=group)
        buf = torch.zeros(int(size.item()), dtype=torch.uint8)
        if mgr.rank == 0 and data:
            buf[:] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        dist.broadcast(buf, src=src, group=group)
        out[0] = json.loads(bytes(buf.numpy()))

    _on_group(mgr, what, run)
    return out[0]


def any_rank(mgr: CheckpointManager, flag: bool, what: str) -> bool:
    """Whether ``flag`` is true on any rank of the manager's group."""
    t = torch.tensor([int(flag)], dtype=torch.int64)
    _on_group(mgr, what, lambda group: dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group))
    return bool(int(t.item()))
