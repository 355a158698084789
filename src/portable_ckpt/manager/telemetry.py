"""Structured checkpoint events: the ``portable_ckpt`` logger, JSON lines, a Prometheus textfile.

Every event is one flat JSON object ``{"event": ..., "ts": ..., "rank": ..., ...}``. It is always
logged through the ``logging`` logger ``portable_ckpt`` (INFO; the object is attached to the
record as ``record.pck_event``). With ``events=PATH``:

* ``PATH`` ending in ``.prom``: a Prometheus textfile (node-exporter textfile collector format),
  rewritten atomically after each event with the latest value of every gauge;
* any other ``PATH``: one JSON line appended per event.

``{rank}`` in ``PATH`` is replaced by the rank, so every rank writes its own file; without it only
rank 0 writes (the other ranks still log).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import sys
import tempfile
import threading
from collections.abc import Mapping
from typing import Any

from portable_ckpt.logs import LOGGER_NAME, log_event

__all__ = ["EVENTS", "LOGGER_NAME", "Telemetry", "prometheus_text"]

#: Event names and what they report.
EVENTS = {
    "save": "pause (blocking s), seconds, bytes, MiB/s of one rank's save, per tier",
    "commit": "commit completeness: expected vs reported writers; failure code when refused",
    "restore": "restore success, tier, bytes, seconds, slowest rank, fallbacks, newer versions "
    "passed over (damaged, invalid, failed verification) and their copies",
    "resume": "time from the end of restore to the caller's first completed step",
    "retention": "what retention deleted and kept, and why",
    "verify": "sampled verification of a committed version",
    "replicate": "background copy of a version from the fast tier to the durable root",
    "preempted": "a preemption signal was received",
    "abandoned": "a pending async save could not be finished at exit",
}

# Gauges of the textfile: metric name -> (event, field, help).
_GAUGES: tuple[tuple[str, str, str, str], ...] = (
    ("pck_save_pause_seconds", "save", "pause_s", "Seconds the training loop was blocked"),
    ("pck_save_seconds", "save", "seconds", "Seconds from the start of a save to its commit"),
    ("pck_save_bytes", "save", "bytes", "Bytes this rank wrote in its last save"),
    ("pck_save_mib_per_s", "save", "mib_per_s", "Write throughput of the last save"),
    ("pck_save_step", "save", "step", "Step of the last committed save"),
    ("pck_commit_expected_writers", "commit", "expected_writers", "Writers the commit expected"),
    ("pck_commit_reported_writers", "commit", "reported_writers", "Writers that reported"),
    ("pck_commit_ok", "commit", "ok", "1 when the last commit was published"),
    ("pck_restore_seconds", "restore", "seconds", "Seconds of the last restore"),
    ("pck_restore_bytes", "restore", "bytes", "Bytes read by all ranks in the last restore"),
    ("pck_restore_ok", "restore", "ok", "1 when the last restore succeeded"),
    ("pck_restore_slowest_rank_seconds", "restore", "slowest_rank_seconds", "Slowest rank"),
    ("pck_restore_passed_over", "restore", "passed_over_count",
     "Newer versions the last restore passed over (alert when above 0)"),
    ("pck_time_to_resume_seconds", "resume", "seconds", "Restore end to first completed step"),
    ("pck_retention_deleted", "retention", "deleted_count", "Versions deleted by retention"),
    ("pck_verify_ok", "verify", "ok", "1 when the last sampled verification passed"),
    ("pck_replicate_mib_per_s", "replicate", "mib_per_s", "Throughput of the last replication"),
)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(
    latest: Mapping[tuple[str, str], Mapping[str, Any]],
    labels: Mapping[str, Any] | None = None,
) -> str:
    """Render the textfile from the latest event per ``(event, tier)``.

    ``labels`` (e.g. ``rank``, ``root``) follow ``tier`` on every sample: per-rank files and
    several jobs on one node exported the same series, which a collector rejects as duplicates
    (multi-job review F15).
    """
    extra = "".join(f',{k}="{_label(v)}"' for k, v in (labels or {}).items())
    lines: list[str] = []
    for name, event, fld, help_text in _GAUGES:
        samples = []
        for (ev, tier), doc in sorted(latest.items()):
            value = _number(doc.get(fld)) if ev == event else None
            if value is not None:
                samples.append(f'{name}{{tier="{_label(tier)}"{extra}}} {value!r}')
        if samples:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", *samples]
    return "\n".join(lines) + "\n"


#: Events :attr:`Telemetry.history` keeps in memory (between this many and twice as many): it
#: grew by every event of the job (soak review F3). The sinks get every event.
HISTORY_KEPT = 1000


def _publish_text(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` atomically, through a temporary file of a random name.

    The temporary name was ``<path>.<pid>.tmp``: another user who can write the directory
    (a node exporter's textfile directory, shared by a team) planted symlinks at the next
    pids, and the job truncated and wrote the files they named (tenant review F2).
    """
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # what open() would have made, not mkstemp's 0600
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _open_append(path: str) -> int:
    """Open the JSON-lines file to append, through a symlink only if this user or root owns it.

    A symlink another user planted at the path (a directory others can write) made the job
    append to the file it names (tenant review F2); a link of the job's own, or ``/dev/stdout``
    (root's), is followed as before (last review 4 F2).
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
    try:
        return os.open(path, flags | os.O_NOFOLLOW, 0o666)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
    owner = os.lstat(path).st_uid
    if owner not in (os.geteuid(), 0):
        raise PermissionError(errno.EPERM, f"a symlink of user id {owner}, not followed", path)
    return os.open(path, flags, 0o666)


def _umask() -> int:
    """The process's umask, read (setting it to read it would race other threads' files)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o077  # unknown: the private mode


class Telemetry:
    """Emit events for one rank (see the module docstring)."""

    def __init__(
        self, events: str | os.PathLike[str] | None, rank: int, root: str | None = None
    ) -> None:
        self.rank = rank
        #: Labels of every Prometheus sample besides ``tier``: which rank, and which job's root.
        self.labels: dict[str, Any] = {"rank": rank} | ({} if root is None else {"root": root})
        self.log = logging.getLogger(LOGGER_NAME)
        self._lock = threading.Lock()
        self._latest: dict[tuple[str, str], dict[str, Any]] = {}
        self.path: str | None = None
        self._said_unwritable = False
        self.history: list[dict[str, Any]] = []
        if events is not None:
            text = os.path.expanduser(os.fspath(events))  # "~/events.jsonl" (notebook F6)
            if "{rank}" in text:
                self.path = text.replace("{rank}", str(rank))
            elif rank == 0:
                self.path = text
            if self.path is not None:
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)

    @property
    def prometheus(self) -> bool:
        """Whether the file is a Prometheus textfile."""
        return self.path is not None and self.path.endswith(".prom")

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        """Record one event; return it. Never raises for an I/O problem of the sink."""
        doc = log_event(
            self.log, event, fields, "checkpoint %s %s", event, json.dumps(fields, default=str),
            rank=self.rank,
        )
        with self._lock:
            self.history.append(doc)
            if len(self.history) > 2 * HISTORY_KEPT:  # a long job's events: the newest only
                del self.history[:-HISTORY_KEPT]
            if self.path is None:
                return doc
            try:
                if self.prometheus:
                    tier = fields.get("tier")  # no tier (a first run's restore): "none"
                    self._latest[(event, "none" if tier in (None, "") else str(tier))] = doc
                    _publish_text(self.path, prometheus_text(self._latest, self.labels))
                else:
                    line = json.dumps(doc, default=str, allow_nan=False) + "\n"
                    with os.fdopen(_open_append(self.path), "a", encoding="utf-8") as f:
                        f.write(line)
            except (OSError, ValueError) as e:
                self.log.warning("checkpoint telemetry: cannot write %s: %s", self.path, e)
                if not self._said_unwritable:  # the package logger is silent by default
                    self._said_unwritable = True
                    print(f"portable_ckpt: checkpoint events are not written to {self.path}: "
                          f"{e}", file=sys.stderr)
        return doc
