"""Collect the job log in tests: a real ``logging.Handler`` on the ``portable_ckpt`` logger.

with job_log() as log:
portable_ckpt.save_arrays(root, arrays, step=1)
(done,) = log.events("commit.finished")
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from portable_ckpt.logs import EVENT_ATTR, LOGGER_NAME

__all__ = ["EventLog", "job_log"]


class EventLog(logging.Handler):
    """Every record that reaches it, as an application's own handler would receive them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record."""
        self.records.append(record)

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The event objects (``record.pck_event``), all or those named ``name``."""
        docs = [getattr(r, EVENT_ATTR) for r in self.records if hasattr(r, EVENT_ATTR)]
        return [d for d in docs if name is None or d["event"] == name]

    def record(self, name: str) -> logging.LogRecord:
        """The first record of event ``name``."""
        return next(r for r in self.records if getattr(r, EVENT_ATTR, {}).get("event") == name)


@contextmanager
def job_log(level: int = logging.INFO) -> Iterator[EventLog]:
    """Attach an :class:`EventLog` to the package logger at ``level`` while the block runs."""
    log = logging.getLogger(LOGGER_NAME)
    handler, saved = EventLog(), log.level
    log.addHandler(handler)
    log.setLevel(level)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(saved)
