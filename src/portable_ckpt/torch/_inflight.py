"""The in-flight async save of this process (at most one): registering it, waiting for it.

At interpreter exit a save still in flight is finished, or the process says loudly on stderr
that it was abandoned. ``atexit`` is too late for that: Python runs it only after ``threading``
shut down, when ``concurrent.futures`` pools refuse new work and the save would fail with
"cannot schedule new futures after interpreter shutdown" (the version then stayed incomplete);
:func:`at_interpreter_exit` hooks in before that.

The exit wait is bounded by the save's ``exit_timeout`` (``async_save(exit_timeout=...)``, the
same setting and default as ``CheckpointManager(exit_timeout=...)``). A save still running after
it (storage that hangs: an NFS stall, a dead S3 endpoint, a peer stuck in a collective) is
reported ABANDONED, naming its step and attempt, and the process ends at once with
:data:`EXIT_STATUS_ABANDONED` (``os._exit``): the interpreter would otherwise join the blocked
save thread for ever. A save that failed at exit (a process group destroyed before it finished,
a full disk) ends the process with the same status: the newest checkpoint is lost, and a job
scheduler must not see success.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import math
import os
import sys
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import NoReturn, TypeVar

from portable_ckpt.errors import UsageError
from portable_ckpt.torch.info import CheckpointInfo

__all__ = [
    "DEFAULT_EXIT_TIMEOUT",
    "EXIT_STATUS_ABANDONED",
    "LOCK",
    "InFlight",
    "at_interpreter_exit",
    "end_abandoned",
    "inflight_save",
    "say",
    "track",
    "wait_bound",
    "wait_for_pending_save",
    "wait_idle",
    "WatchedFuture",
]

#: Seconds interpreter exit waits for a pending save (``async_save`` and ``CheckpointManager``).
DEFAULT_EXIT_TIMEOUT = 300.0
#: Exit status of a process whose pending save failed at exit or did not finish within its bound.
EXIT_STATUS_ABANDONED = 1


@dataclass
class InFlight:
    """The in-flight async save: its step, future, exit bound and (once agreed) attempt id."""

    step: int
    committed: cf.Future[CheckpointInfo]
    exit_timeout: float = DEFAULT_EXIT_TIMEOUT
    attempt_id: str | None = None
    #: The root's storage URL (None when it could not be opened).
    root: str | None = None
    #: The caller's own Ctrl-C (or sys.exit) stopped it while staging: the caller saw that,
    #: so neither the exit hook nor wait_for_pending_save() reports it again (notebook F2).
    interrupted: bool = False

    def agreed(self, attempt_id: str) -> None:
        """Record the attempt id the ranks agreed on (named if the save is abandoned)."""
        self.attempt_id = attempt_id


class _Slot:
    current: InFlight | None = None


#: Held while an async save stages and registers itself.
LOCK = threading.Lock()
_SLOT = _Slot()


def _forget_after_fork() -> None:
    # A forked child does not own its parent's save: at its exit it must neither wait for it
    # nor call it ABANDONED (async review F10: a plain fork child waited exit_timeout, exit 1).
    _SLOT.current = None


os.register_at_fork(after_in_child=_forget_after_fork)


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


def wait_bound(seconds: float) -> float | None:
    """A wait's ``timeout=`` for an exit bound: ``None`` for ``math.inf`` (threading refuses it)."""
    return None if math.isinf(seconds) else seconds


def say(text: str) -> None:
    """One line on stderr, flushed (exit hooks: stdout may be a closed pipe).

    Escaped for a terminal: messages quote paths and records from the root (attack review
    12b, B2).
    """
    from portable_ckpt._printable import printable

    print(f"portable_ckpt: {printable(text)}", file=sys.stderr, flush=True)


def _abandoned(h: InFlight, why: str) -> None:
    attempt = f"Attempt {h.attempt_id}" if h.attempt_id else "Its attempt (no id agreed yet)"
    say(
        f"the async save of step {h.step} could not be finished at exit and was ABANDONED "
        f"({why}). {attempt} stays incomplete (never restored); the newest "
        "committed version remains the latest. Wait for handle.committed (or call "
        "wait_for_pending_save()) before exit, and before destroy_process_group() in a job."
    )


def end_abandoned() -> NoReturn:
    """End the process with :data:`EXIT_STATUS_ABANDONED`: a checkpoint was lost at exit.

    A scheduler must not see success when the last checkpoint is gone, and a save still
    running would be joined for ever. Output and log handlers are flushed first.
    """
    with contextlib.suppress(Exception):  # a closed stdout must not stop the exit
        sys.stdout.flush()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    with contextlib.suppress(Exception):
        logging.shutdown()
    os._exit(EXIT_STATUS_ABANDONED)


T = TypeVar("T")


class WatchedFuture(cf.Future[T]):
    """A future that knows whether its outcome was asked for (``result``/``exception``)."""

    asked = False

    def result(self, timeout: float | None = None) -> T:
        """As :meth:`concurrent.futures.Future.result`; marks the outcome as seen."""
        self.asked = True
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """As :meth:`concurrent.futures.Future.exception`; marks the outcome as seen."""
        self.asked = True
        return super().exception(timeout)


def _finish_at_exit() -> None:
    h = _SLOT.current
    if h is None:
        return
    if h.committed.done():
        # A save that failed before exit, its handle never asked: the process would exit 0
        # with its newest checkpoint lost and nothing said (async review F7).
        e = cf.Future.exception(h.committed)  # not through the handle: not "asked"
        if e is not None and not h.interrupted and not getattr(h.committed, "asked", True):
            _abandoned(h, f"it failed and its handle was never asked: {str(e) or type(e).__name__}")
            end_abandoned()
        return
    if not h.interrupted:
        say(f"finishing the async save of step {h.step} before exit (at most "
            f"{h.exit_timeout:g} s)")
    cf.wait([h.committed], timeout=wait_bound(h.exit_timeout))
    if not h.committed.done():  # stuck in I/O or a collective: the exit would join it for ever
        _abandoned(h, f"not finished after {h.exit_timeout:g} s")
        end_abandoned()
    e = h.committed.exception()
    if e is not None and not h.interrupted:  # the caller's Ctrl-C: seen already (last review F1)
        _abandoned(h, str(e) or type(e).__name__)
        end_abandoned()


def track(
    step: int,
    committed: cf.Future[CheckpointInfo],
    exit_timeout: float = DEFAULT_EXIT_TIMEOUT,
    root: str | None = None,
) -> InFlight:
    """Record the async save of ``step`` as this process's in-flight save (finished at exit)."""
    h = _SLOT.current = InFlight(step, committed, exit_timeout, root=root)
    at_interpreter_exit("pending-async-save", _finish_at_exit)
    return h


def wait_for_pending_save(timeout: float | None = None) -> CheckpointInfo | None:
    """Wait for this process's in-flight async save (if any); return its result or re-raise.

    ``None`` when there is none, or when the caller's own Ctrl-C stopped it while staging (the
    caller has seen that interrupt already).
    """
    h = _SLOT.current
    if h is None:
        return None
    if h.interrupted:  # the caller stopped it while staging and saw its own interrupt
        cf.wait([h.committed], timeout=timeout)
        return None
    return h.committed.result(timeout)


def inflight_save(
    roots: Collection[str],
) -> tuple[cf.Future[CheckpointInfo], float | None] | None:
    """Find an async save of this process still in flight to one of ``roots`` (storage URLs).

    Returns its ``committed`` future and the wait its exit would allow it, else ``None``.
    """
    h = _SLOT.current
    if h is None or h.committed.done() or h.root not in roots:
        return None
    return h.committed, wait_bound(h.exit_timeout)


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
    cf.wait([h.committed])  # its outcome is its handle's to tell (not asked here)
