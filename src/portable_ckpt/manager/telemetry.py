"""Structured checkpoint events: the ``portable_ckpt`` logger, JSON lines, a Prometheus textfile.

Every event is one flat JSON object ``{"event": ..., "ts": ..., "rank": ..., ...}``. It is always
logged through the ``logging`` logger ``portable_ckpt`` (INFO; the object is attached to the
record as ``record.pck_event``). With ``events=PATH``:

* ``PATH`` ending in ``.prom``: a Prometheus textfile (node-exporter textfile collector format),
  rewritten atomically after each event with the latest value of every gauge, the times of the
  last commit and verification, and counters since the process started;
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
from collections.abc import Iterable, Mapping
from typing import Any

from portable_ckpt.errors import UsageError
from portable_ckpt.format.usage import path_text
from portable_ckpt.logs import LOGGER_NAME, log_event

__all__ = ["COUNTERS", "EVENTS", "LOGGER_NAME", "Telemetry", "events_path", "prometheus_text"]

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
     "Newer versions the last restore passed over, attempts without a record apart "
     "(alert when above 0)"),
    ("pck_restore_uncommitted", "restore", "uncommitted_count",
     "Newer attempts without commit record beside every writer index (a commit cut short, or "
     "a record lost)"),
    ("pck_time_to_resume_seconds", "resume", "seconds", "Restore end to first completed step"),
    ("pck_retention_deleted", "retention", "deleted_count", "Versions deleted by retention"),
    ("pck_verify_ok", "verify", "ok", "1 when the last sampled verification passed"),
    ("pck_replicate_mib_per_s", "replicate", "mib_per_s", "Throughput of the last replication"),
)

# Timestamp gauges: metric name -> (events that set it, help). Kept per tier apart from the
# latest event: a failed commit replaced the commit event, and a job that hung kept
# ``pck_commit_ok 1`` with no sign of its age (SRE review 2, W5).
_STAMPS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("pck_last_commit_timestamp_seconds", ("commit", "replicate"),
     "Unix time of the newest committed save of the tier (a copy to the durable root counts; "
     "seeded at restore from the restored version's committed_at)"),
    ("pck_last_verify_timestamp_seconds", ("verify",),
     "Unix time of the last sampled verification (passed or failed)"),
)
# Counters: metric name -> (event, help). Since the process started (a restart is a counter
# reset to Prometheus); the gauges said only the last event's count (SRE review 2, W5).
_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("pck_retention_deleted_total", "retention",
     "Versions retention deleted since the process started"),
    ("pck_save_failed_total", "commit",
     "Saves whose commit failed or was refused since the process started"),
    ("pck_replicate_failed_total", "replicate",
     "Copies to the durable root that failed since the process started"),
)
#: The textfile's counters (:meth:`Telemetry.start_counters` starts them at 0).
COUNTERS = tuple(name for name, _, _ in _COUNTERS)
#: Counters of one tier only: copies go to the durable root (``replicate`` events' tier).
_COUNTER_TIER = {"pck_replicate_failed_total": "durable"}


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
    *,
    stamps: Mapping[tuple[str, str], float] | None = None,
    counters: Mapping[tuple[str, str], float] | None = None,
) -> str:
    """Render the textfile from the latest event per ``(event, tier)``.

    ``labels`` (e.g. ``rank``, ``root``) follow ``tier`` on every sample: per-rank files and
    several jobs on one node exported the same series, which a collector rejects as duplicates
    (multi-job review F15). ``stamps`` (timestamp gauges) and ``counters`` are keyed by
    ``(metric name, tier)``.
    """
    extra = "".join(f',{k}="{_label(v)}"' for k, v in (labels or {}).items())
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, values: list[tuple[str, float]]) -> None:
        if values:
            lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
            lines.extend(f'{name}{{tier="{_label(t)}"{extra}}} {v!r}' for t, v in values)

    for name, event, fld, help_text in _GAUGES:
        values = []
        for (ev, tier), doc in sorted(latest.items()):
            value = _number(doc.get(fld)) if ev == event else None
            if value is not None:
                values.append((tier, value))
        family(name, "gauge", help_text, values)
    for name, _, help_text in _STAMPS:
        family(name, "gauge", help_text,
               [(t, float(v)) for (n, t), v in sorted((stamps or {}).items()) if n == name])
    for name, _, help_text in _COUNTERS:
        family(name, "counter", help_text,
               [(t, float(v)) for (n, t), v in sorted((counters or {}).items()) if n == name])
    return "\n".join(lines) + "\n"


def _stamp_of(event: str, doc: Mapping[str, Any]) -> list[tuple[str, float]]:
    """The timestamp gauges ``doc`` sets: a published commit or copy, any verification."""
    when = _number(doc.get("ts"))
    if when is None or (event in ("commit", "replicate") and doc.get("ok") is not True):
        return []
    return [(name, when) for name, events, _ in _STAMPS if event in events]


def _increments(event: str, doc: Mapping[str, Any]) -> list[tuple[str, float]]:
    """What ``doc`` adds to the counters: retention's deletions, a failed commit or copy."""
    out = []
    for name, ev, _ in _COUNTERS:
        if ev != event:
            continue
        if event == "retention":
            n = _number(doc.get("deleted_count"))
            if n:
                out.append((name, n))
        elif doc.get("ok") is False:
            out.append((name, 1.0))
    return out


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


def events_path(events: str | os.PathLike[str] | None, rank: int) -> str | None:
    """The file ``rank`` writes its events to (``None``: none), checked (``UsageError``).

    ``events=5`` was a ``TypeError`` from ``os.fspath``, and a directory was taken, after
    which no event was ever written (api review 31).
    """
    if events is None:
        return None
    # "~/events.jsonl" (notebook F6)
    text = os.path.expanduser(path_text(events, "events must be a file path or None"))
    if "{rank}" in text:
        path: str | None = text.replace("{rank}", str(rank))
    else:
        path = text if rank == 0 else None
    if path is not None and os.path.isdir(path):
        raise UsageError(
            f"events {path!r} is a directory: name a file in it (events.jsonl, or ckpt.prom "
            "for a Prometheus textfile)"
        )
    return path


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
        self._stamps: dict[tuple[str, str], float] = {}  # (metric, tier) -> unix seconds
        self._counters: dict[tuple[str, str], float] = {}  # (metric, tier) -> since start
        self._said_unwritable = False
        self.history: list[dict[str, Any]] = []
        self.path: str | None = events_path(events, rank)
        if self.path is not None:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)

    @property
    def prometheus(self) -> bool:
        """Whether the file is a Prometheus textfile."""
        return self.path is not None and self.path.endswith(".prom")

    def start_counters(self, tiers: Iterable[str]) -> None:
        """Start the textfile's counters at 0 for each of ``tiers`` (written with the next event).

        A counter that first appears at 1 shows no increase to ``rate()`` or ``increase()``:
        a restarted job's first failed save went unseen (SRE review 2, W5).
        """
        with self._lock:
            for tier in tiers:
                for name in COUNTERS:
                    if _COUNTER_TIER.get(name, tier) == tier:
                        self._counters.setdefault((name, tier), 0.0)

    def seed(
        self, tier: str, *, step: int | None = None, committed_at: float | None = None
    ) -> None:
        """Carry a restored version's step and commit time into the textfile (not an event).

        A restart rebuilt the file from the new process's events only: once its saves failed,
        ``pck_save_step`` was gone, and no gauge said how old the newest commit was (SRE
        review 2, W5). ``step`` becomes ``pck_save_step`` of ``tier`` unless a save of this
        process set it already; ``committed_at`` (unix seconds)
        ``pck_last_commit_timestamp_seconds`` unless a newer commit set it. Written with the
        next event.
        """
        with self._lock:
            last = self._latest.get(("save", tier))
            if step is not None and (last is None or last.get("seeded")):
                self._latest[("save", tier)] = {"event": "save", "step": step, "seeded": True}
            if committed_at is not None:
                key = ("pck_last_commit_timestamp_seconds", tier)
                self._stamps[key] = max(self._stamps.get(key, committed_at), committed_at)

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
                    tier = "none" if tier in (None, "") else str(tier)
                    self._latest[(event, tier)] = doc
                    for name, when in _stamp_of(event, doc):
                        self._stamps[(name, tier)] = when
                    for name, n in _increments(event, doc):
                        self._counters[(name, tier)] = self._counters.get((name, tier), 0.0) + n
                    _publish_text(self.path, prometheus_text(
                        self._latest, self.labels, stamps=self._stamps, counters=self._counters))
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
