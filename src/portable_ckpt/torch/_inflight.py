"""The in-flight async save of this process (at most one): registering it, waiting for it.

At interpreter exit a save still in flight is finished, or the process says loudly on stderr
that it was abandoned. ``atexit`` is too late for that: Python runs it only after ``threading``
shut down, when ``concurrent.futures`` pools refuse new work and the save would fail with
"cannot schedule new futures after interpreter shutdown" (the version then stayed incomplete);
:func:`at_interpreter_exit` hooks in before that.
"""

from __future__ import annotations

import concurrent.futures as cf
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from portable_ckpt.errors import UsageError
from portable_ckpt.torch.info import CheckpointInfo

__all__ = ["LOCK", "at_interpreter_exit", "track", "wait_for_pending_save", "wait_idle"]


@dataclass(frozen=True)
class _InFlight:
    step: int
    committed: cf.Future[CheckpointInfo]


class _Slot:
    current: _InFlight | None = None


#: Held while an async save stages and registers itself.
LOCK = threading.Lock()
_SLOT = _Slot()


_HOOKED: set[str] = set()
_HOOK_LOCK = threading.Lock()  # not LOCK: track() runs while an async save holds LOCK


def at_interpreter_exit(name: str, fn: Callable[[], None]) -> None:
    """Run ``fn`` once at interpreter exit, before thread pools stop accepting work.

    ``threading._register_atexit`` callbacks run at the start of interpreter shutdown, in reverse
    order of registration, so one registered after ``concurrent.futures`` was imported runs
    before the pools' own shutdown. Registered once per ``name``.
    """
    with _HOOK_LOCK:
        if name in _HOOKED:
            return
        _HOOKED.add(name)
    hook = getattr(threading, "_register_atexit", None)
    if hook is not None:
        hook(fn)
    else:  # pragma: no cover - interpreters without it
        import atexit

        atexit.register(fn)


def _finish_at_exit() -> None:
    h = _SLOT.current
    if h is None or h.committed.done():
        return
    try:
        h.committed.result()
    except BaseException as e:
        print(
            f"portable_ckpt: the async save of step {h.step} could not be finished at exit and "
            f"was ABANDONED: {e}. Its attempt stays incomplete (never restored); the previous "
            "version remains the latest. Wait for handle.committed (or call "
            "wait_for_pending_save()) before destroy_process_group() and exit.",
            file=sys.stderr,
            flush=True,
        )


def track(step: int, committed: cf.Future[CheckpointInfo]) -> None:
    """Record the async save of ``step`` as this process's in-flight save (finished at exit)."""
    _SLOT.current = _InFlight(step, committed)
    at_interpreter_exit("pending-async-save", _finish_at_exit)


def wait_for_pending_save(timeout: float | None = None) -> CheckpointInfo | None:
    """Wait for this process's in-flight async save (if any); return its result or re-raise."""
    h = _SLOT.current
    return None if h is None else h.committed.result(timeout)


def wait_idle(if_busy: str) -> None:
    """Before a new save: wait for the in-flight one (its outcome is its own), or raise."""
    h = _SLOT.current
    if h is None or h.committed.done():
        return
    if if_busy == "raise":
        raise UsageError(
            f"an async save of step {h.step} is still in flight on this rank; wait for "
            f"handle.committed (or call wait_for_pending_save()) before saving again, or pass "
            f"if_busy='wait'"
        )
    try:
        h.committed.result()
    except BaseException:
        pass  # that save's failure was reported through its own handle
