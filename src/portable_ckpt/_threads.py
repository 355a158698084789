"""One background thread per job kind, per process: the I/O, write and read-batch workers.

Each worker is a single-thread executor created on first use. It is remembered with the pid that
created it: a process forked after the first use inherits the executor object but not its
thread, and a job submitted to it would wait forever, so the child gets a fresh one.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["worker"]

_WORKERS: dict[str, tuple[int, ThreadPoolExecutor]] = {}
_LOCK = threading.Lock()


def worker(name: str) -> ThreadPoolExecutor:
    """Return the single-thread executor for ``name`` of this process (its thread: ``name``)."""
    pid = os.getpid()
    hit = _WORKERS.get(name)
    if hit is not None and hit[0] == pid:
        return hit[1]
    with _LOCK:
        hit = _WORKERS.get(name)
        if hit is None or hit[0] != pid:
            hit = _WORKERS[name] = (pid, ThreadPoolExecutor(1, thread_name_prefix=name))
        return hit[1]
