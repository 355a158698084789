"""The in-flight async save of this process (at most one): registering it, waiting for it."""

from __future__ import annotations

import concurrent.futures as cf
import threading
from dataclasses import dataclass

from portable_ckpt.errors import UsageError
from portable_ckpt.torch.info import CheckpointInfo

__all__ = ["LOCK", "track", "wait_for_pending_save", "wait_idle"]


@dataclass(frozen=True)
class _InFlight:
    step: int
    committed: cf.Future[CheckpointInfo]


class _Slot:
    current: _InFlight | None = None


#: Held while an async save stages and registers itself.
LOCK = threading.Lock()
_SLOT = _Slot()


def track(step: int, committed: cf.Future[CheckpointInfo]) -> None:
    """Record the async save of ``step`` as this process's in-flight save."""
    _SLOT.current = _InFlight(step, committed)


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
