"""Interpreter exit with a manager still open: finish its pending work, within a bound.

At exit every open manager gives SIGTERM back to its previous disposition (nothing will call
``maybe_save`` again, so a SIGTERM now means "stop"), says on stderr that it is finishing the
pending checkpoint, and waits for it at most ``exit_timeout`` seconds. A save that failed is
reported ABANDONED and the process ends with status 1 once every manager finished (the newest
checkpoint is lost: a job scheduler must not see success). A save still running after the bound
is reported ABANDONED and the process ends at once with status 1 (``os._exit``): the thread running it is
blocked in I/O or in a collective whose peer is gone or stuck, and the interpreter would
otherwise join it until that collective's own timeout (30 minutes by default), and before this
bound existed such a process also ignored SIGTERM (the manager's handler only set a flag).

The hook must run before ``portable_ckpt.torch._inflight``'s (which waits for the same async
save, bounded by the same ``exit_timeout``, but knows nothing of the manager's SIGTERM handler
and telemetry): it is registered again after each async save, and hooks registered later run
first. The exit status and the stderr line are :mod:`~portable_ckpt.torch._inflight`'s.
"""

from __future__ import annotations

import math
import os
import time
import weakref
from typing import TYPE_CHECKING, Any

from portable_ckpt.torch._inflight import (
    EXIT_STATUS_ABANDONED,
    at_interpreter_exit,
    end_abandoned,
    say,
    wait_bound,
)

if TYPE_CHECKING:
    from portable_ckpt.torch.manager import CheckpointManager

__all__ = [
    "EXIT_STATUS_ABANDONED",
    "finish_at_exit",
    "open_on_root",
    "register_after_async_save",
    "register_exit",
]

_MANAGERS: weakref.WeakSet[CheckpointManager] = weakref.WeakSet()
# A forked child owns none of its parent's managers: its exit finishes none of them.
os.register_at_fork(after_in_child=_MANAGERS.clear)


def _abandoned(mgr: CheckpointManager, step: int | None, e: BaseException, stuck: bool) -> None:
    why = f"not finished after {mgr.exit_timeout:g} s" if stuck else str(e)
    mgr.telemetry.emit(
        "abandoned",
        step=step,
        code=getattr(e, "code", None),
        message=why[:2000],
        stuck=stuck,
    )
    say(
        f"rank {mgr.rank}: the checkpoint of step {step} could not be finished at exit and was "
        f"ABANDONED ({why}). Its attempt stays incomplete (never restored); the previous "
        f"version remains the latest. Call mgr.close() before destroy_process_group() and "
        f"before the process exits."
    )


def finish_at_exit(mgr: CheckpointManager) -> bool:
    """Finish ``mgr``'s pending work at exit; return False when it was abandoned.

    Abandoned: it failed, or it is still running after the bound (stuck).
    """
    if mgr._closed:
        return _left_behind_finished(mgr)
    mgr._exiting = True  # a failure now is reported ABANDONED, not "training continues"
    mgr._preemption.restore()
    step = mgr._pending.step if mgr._pending is not None else mgr._last_save_step
    if mgr._busy():
        say(
            f"rank {mgr.rank}: finishing the pending checkpoint of step {step} before exit "
            f"(at most {mgr.exit_timeout:g} s; SIGTERM stops the process)"
        )
    pending = mgr._pending
    try:
        mgr.close(timeout=wait_bound(mgr.exit_timeout))
    except TimeoutError as e:
        _abandoned(mgr, step, e, stuck=True)
        return False
    except BaseException as e:
        if pending is not None and _committed(pending) and mgr._failed_saves == 0:
            # (not when a durable checkpoint failed since: with replicate=True the pending
            # save committed on the fast tier only, and its copy may be what failed: review
            # of the change F4)
            # The newest save is a version: what failed is work after a commit (a
            # verification, a copy), said as such; nothing was abandoned (attack review 4 A8).
            say(f"rank {mgr.rank}: at exit, work after a checkpoint's commit failed "
                f"([{getattr(e, 'code', type(e).__name__)}] {str(e)[:1000]}); the checkpoint of "
                f"step {step} is committed")
            return True
        _abandoned(mgr, step, e, stuck=False)
        return False
    return True


def _committed(handle: Any) -> bool:
    """Whether an async save's commit succeeded (its ``committed`` future)."""
    fut = handle.committed
    return bool(fut.done() and not fut.cancelled() and fut.exception() is None)


def _left_behind_finished(mgr: CheckpointManager) -> bool:
    """Wait (bounded) for the work a closed manager left behind; False when it is stuck.

    ``close(timeout=...)`` gave up on it: the stuck thread is a pool worker the interpreter
    would join for ever (race review F7: the process never exited).
    """
    if not mgr._busy():
        return True
    bound = mgr.exit_timeout
    deadline = time.monotonic() + (bound if math.isfinite(bound) else 1e12)
    while mgr._busy() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not mgr._busy():
        return True
    _abandoned(mgr, mgr._last_save_step, TimeoutError(), stuck=True)
    return False


def _finish_all() -> None:
    finished = [finish_at_exit(m) for m in list(_MANAGERS)]
    if not all(finished):
        end_abandoned()


def open_on_root(url: str, but: CheckpointManager) -> CheckpointManager | None:
    """Another manager of this process, not closed, on the durable root ``url``."""
    for m in list(_MANAGERS):
        if m is not but and not m._closed and m.tiers["durable"].storage.url == url:
            return m
    return None


def register_exit(mgr: CheckpointManager) -> None:
    """Finish ``mgr`` at interpreter exit; call again after each async save (hook order)."""
    _MANAGERS.add(mgr)
    at_interpreter_exit("checkpoint-managers", _finish_all)


def register_after_async_save() -> None:
    """Run the managers' hook before the in-flight async save's own (which knows no manager)."""
    at_interpreter_exit("checkpoint-managers-before-inflight", _finish_all)
