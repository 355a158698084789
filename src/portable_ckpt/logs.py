"""The job log of portable_ckpt: the ``portable_ckpt`` loggers, their events, progress callbacks.

Loggers (standard :mod:`logging`): ``portable_ckpt`` and one child per layer —
``portable_ckpt.io`` (commits; ``gc`` and ``copy_version`` on ``portable_ckpt.io.versions`` and
``portable_ckpt.io.copy``), ``portable_ckpt.torch`` (collective save and load),
``portable_ckpt.storage.s3`` (retries). The package logger has a :class:`logging.NullHandler`, so
nothing is printed unless the application configures logging, e.g.
``logging.basicConfig(level=logging.INFO)``; a job log then reads::

    INFO portable_ckpt.torch: save of step 100 started (rank 0) to /ckpt
    INFO portable_ckpt.io: commit of step 100 finished: 18.0 MiB in 0.02 s (810.4 MiB/s) ...
    INFO portable_ckpt.torch: save of step 100 finished: 18.0 MiB in 0.31 s (58.2 MiB/s) ...
    WARNING portable_ckpt.storage.s3: retrying PUT s3://b/ck/... after HTTP 500 (attempt 2 of 5)
    WARNING portable_ckpt.torch: load refused: [PCK-CONTRACT] checkpoint ... (rank 1)

Every record this module emits carries ``record.pck_event``: one flat JSON object
``{"event", "ts", "rank", ...fields}`` — the shape of the CheckpointManager's telemetry events
(:mod:`portable_ckpt.manager.telemetry` emits through :func:`log_event` too), so a handler can
forward either to a metrics system. Events: ``<op>.started`` and ``<op>.finished`` (INFO, with
``bytes``, ``seconds``, ``mib_per_s``), ``<op>.refused`` (WARNING: a ``CheckpointError``, with
its ``code``), ``<op>.failed`` (ERROR: any other exception), ``storage.retry`` (WARNING).

Progress: long operations (``copy_version``, ``Checkpoint.verify(deep=True)``, ``gc``, ``drill``)
take ``progress=``, a :data:`Progress` callable ``progress(done, total)`` called from worker
threads as work completes; the CLI draws its progress bars with it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from portable_ckpt.errors import CheckpointError

__all__ = [
    "EVENT_ATTR",
    "LOGGER_NAME",
    "Progress",
    "event_doc",
    "get_logger",
    "human_bytes",
    "log_event",
    "logged",
    "mib_per_s",
]

#: The package logger; layers log to its children (``portable_ckpt.io``, ...).
LOGGER_NAME = "portable_ckpt"
#: The attribute of a log record that holds its event object.
EVENT_ATTR = "pck_event"

#: ``progress(done, total)``: units of work done so far out of ``total`` (bytes, attempts, ranks).
Progress = Callable[[int, int], None]

def get_logger(layer: str = "") -> logging.Logger:
    """The logger of one layer (``"io"``, ``"torch"``, ``"storage.s3"``), or the package's."""
    return logging.getLogger(f"{LOGGER_NAME}.{layer}" if layer else LOGGER_NAME)


def human_bytes(n: float) -> str:
    """``1536`` → ``"1.5 KiB"`` (whole bytes below 1 KiB)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def mib_per_s(nbytes: int, seconds: float) -> float:
    """Throughput in MiB/s (0 for an empty or instantaneous operation)."""
    return round(nbytes / (1 << 20) / seconds, 3) if nbytes and seconds > 0 else 0.0


def event_doc(event: str, rank: int | None, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The event object of a record: ``{"event", "ts", "rank", **fields}``."""
    return {"event": event, "ts": round(time.time(), 6), "rank": rank, **fields}


def log_event(
    log: logging.Logger,
    event: str,
    fields: Mapping[str, Any],
    msg: str,
    *args: Any,
    rank: int | None = None,
    level: int = logging.INFO,
) -> dict[str, Any]:
    """Log ``msg % args`` with the event object attached; return the object.

    The object is built even when the level is disabled (the manager's telemetry keeps it).
    """
    doc = event_doc(event, rank, fields)
    if log.isEnabledFor(level):
        log.log(level, msg, *args, extra={EVENT_ATTR: doc})
    return doc


@contextmanager
def logged(
    log: logging.Logger,
    op: str,
    what: str,
    *,
    rank: int | None = None,
    t0: float | None = None,
    **fields: Any,
) -> Iterator[dict[str, Any]]:
    """Log ``<what> started``, then ``finished`` / ``refused`` / ``failed`` with the time taken.

    The caller fills the yielded dict: ``bytes`` (for the throughput) and any other field of the
    ``finished`` event; ``detail`` is appended to its message. ``t0`` (``time.perf_counter()``)
    dates the start when the operation began before this block. Exceptions propagate unchanged.
    """
    suffix = "" if rank is None else f" (rank {rank})"
    log_event(log, f"{op}.started", fields, "%s started%s", what, suffix, rank=rank)
    out: dict[str, Any] = {}
    t0 = time.perf_counter() if t0 is None else t0
    try:
        yield out
    except CheckpointError as exc:
        doc = {**fields, "code": exc.code, "message": exc.message}
        log_event(log, f"{op}.refused", doc, "%s refused: %s%s", what, exc, suffix,
                  rank=rank, level=logging.WARNING)
        raise
    except Exception as exc:
        doc = {**fields, "error": f"{type(exc).__name__}: {exc}"}
        log_event(log, f"{op}.failed", doc, "%s failed: %s: %s%s", what, type(exc).__name__, exc,
                  suffix, rank=rank, level=logging.ERROR)
        raise
    # The throughput is computed from the recorded (rounded) seconds, so a record agrees with
    # itself: mib_per_s == mib_per_s(bytes, seconds) for whoever reads it.
    seconds = round(time.perf_counter() - t0, 6)
    nbytes = int(out.get("bytes", 0))
    detail = out.pop("detail", "")
    done = {**fields, **out, "bytes": nbytes, "seconds": seconds,
            "mib_per_s": mib_per_s(nbytes, seconds)}
    log_event(log, f"{op}.finished", done, "%s finished: %s in %.2f s (%.1f MiB/s)%s%s", what,
              human_bytes(nbytes), seconds, done["mib_per_s"], f"; {detail}" if detail else "",
              suffix, rank=rank)
