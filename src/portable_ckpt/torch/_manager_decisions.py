"""Save decisions agreed by every rank, and preemption by SIGTERM.

The manager has its own gloo group, so a decision never interleaves with a save's collectives.
One max-reduction of two integers per ``maybe_save`` carries rank 0's policy decision and every
rank's preemption flag: no rank decides alone, and a SIGTERM seen by one rank preempts all.

SIGTERM: the first one only sets a flag (the next ``maybe_save`` saves synchronously and
``preempted`` lets the loop stop); a second one, or one arriving once the manager is closing or
the interpreter exiting, gets the process's previous disposition (by default: terminate), so a
process that will never call ``maybe_save`` again can always be stopped.
"""

from __future__ import annotations

import datetime as _dt
import json
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from portable_ckpt.errors import DistributedError
from portable_ckpt.manager.decisions import Decision, decide

if TYPE_CHECKING:
    from portable_ckpt.torch.manager import CheckpointManager

__all__ = ["Preemption", "agree", "any_rank", "broadcast_json", "make_group"]


def make_group(process_group: Any, timeout: float | None) -> tuple[Any, int, int]:
    """The manager's own gloo group (None alone), this rank in it, and its size."""
    if not (dist.is_available() and dist.is_initialized()):
        return None, 0, 1
    pg = process_group if process_group is not None else dist.group.WORLD
    ranks = [int(r) for r in dist.get_process_group_ranks(pg)]
    rank = dist.get_rank(pg)
    if len(ranks) == 1:
        return None, 0, 1
    t = _dt.timedelta(seconds=timeout) if timeout is not None else None
    kwargs: dict[str, Any] = {"timeout": t} if t is not None else {}
    group = dist.new_group(ranks=ranks, backend="gloo", **kwargs)
    return group, rank, len(ranks)


class Preemption:
    """The SIGTERM handler of one manager (installed from the main thread only)."""

    def __init__(self, install: bool) -> None:
        self.seen = threading.Event()
        self._prev: Any = None
        self._installed = False
        if install and threading.current_thread() is threading.main_thread():
            self._prev = signal.signal(signal.SIGTERM, self._on_signal)
            self._installed = True

    def _on_signal(self, signum: int, frame: Any) -> None:
        if not self.seen.is_set():
            # Only set a flag: logging or collectives inside a signal handler can deadlock.
            self.seen.set()
            return
        prev = self._prev
        self.restore()
        if callable(prev):
            prev(signum, frame)
        elif prev is None or prev == signal.SIG_DFL:
            signal.raise_signal(signum)  # the default action: terminate

    def restore(self) -> None:
        """Give SIGTERM back its previous disposition (no-op outside the main thread)."""
        if not self._installed:
            return
        prev = self._prev if self._prev is not None else signal.SIG_DFL
        try:
            signal.signal(signal.SIGTERM, prev)
        except (ValueError, TypeError):  # pragma: no cover - not the main thread
            return
        self._installed = False


def _reduce_max(mgr: CheckpointManager, flags: torch.Tensor, step: int) -> None:
    if mgr._group is None:
        return
    try:
        work = dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=mgr._group, async_op=True)
        work.wait()
    except Exception as e:
        raise DistributedError(
            f"rank {mgr.rank}: the save decision for step {step} could not be agreed "
            f"({e}); a peer rank died or stopped calling maybe_save"
        ) from e


def agree(mgr: CheckpointManager, step: int, forced: Decision | None = None) -> Decision:
    """Rank 0's decision and every rank's preemption flag, combined by one max-reduction."""
    mine = Decision("none")
    if mgr.rank == 0:
        mine = forced or decide(
            mgr.policy,
            step,
            now=time.time(),
            last_save_time=mgr._last_save_time,
            last_save_step=mgr._last_save_step,
            has_fast="fast" in mgr.tiers,
        )
    flags = torch.tensor([mine.encode(), int(mgr._preemption.seen.is_set())], dtype=torch.int64)
    _reduce_max(mgr, flags, step)
    decision = Decision.decode(int(flags[0]))
    if int(flags[1]) and not mgr.preempted:
        mgr.preempted = True
        mgr.telemetry.emit("preempted", step=step, signal="SIGTERM")
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


def broadcast_json(group: Any, rank: int, obj: Any) -> Any:
    """Rank 0's JSON value on every rank of ``group`` (``obj`` itself without a group)."""
    if group is None:
        return obj
    data = json.dumps(obj).encode() if rank == 0 else b""
    size = torch.tensor([len(data)], dtype=torch.int64)
    src = dist.get_global_rank(group, 0)
    dist.broadcast(size, src=src, group=group)
    buf = torch.zeros(int(size.item()), dtype=torch.uint8)
    if rank == 0 and data:
        buf[:] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    dist.broadcast(buf, src=src, group=group)
    return json.loads(bytes(buf.numpy()))


def any_rank(group: Any, flag: bool) -> bool:
    """Whether ``flag`` is true on any rank of ``group``."""
    t = torch.tensor([int(flag)], dtype=torch.int64)
    if group is not None:
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return bool(int(t.item()))
