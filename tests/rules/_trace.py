"""Record the POSIX calls the local backend makes (real calls, observed through wrappers)."""

from __future__ import annotations

import os
from typing import Any

import pytest


class SyscallLog:
    """Ordered ``(call, path, flags)`` events of open/fsync/link/unlink/rename/replace/write."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, int]] = []

    def names(self, call: str) -> list[str]:
        return [p for c, p, _ in self.events if c == call]

    def index(self, call: str, pred: Any) -> int:
        for i, (c, p, _f) in enumerate(self.events):
            if c == call and pred(p):
                return i
        raise AssertionError(f"no {call} matching the predicate in {self.events}")


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"<fd {fd}>"


def trace_posix(monkeypatch: pytest.MonkeyPatch) -> SyscallLog:
    """Wrap the ``os`` functions (process-wide) so every call is logged, then performed."""
    log = SyscallLog()
    real = {n: getattr(os, n) for n in ("open", "fsync", "link", "unlink", "rename", "replace",
                                        "write")}

    def w_open(path: Any, flags: int, *a: Any, **k: Any) -> int:
        fd = real["open"](path, flags, *a, **k)
        log.events.append(("open", os.fsdecode(path), flags))
        return fd

    def w_fsync(fd: int) -> None:
        log.events.append(("fsync", _fd_path(fd), 0))
        real["fsync"](fd)

    def w_link(src: Any, dst: Any, *a: Any, **k: Any) -> None:
        log.events.append(("link", os.fsdecode(src) + " -> " + os.fsdecode(dst), 0))
        real["link"](src, dst, *a, **k)

    def w_unlink(path: Any, *a: Any, **k: Any) -> None:
        log.events.append(("unlink", os.fsdecode(path), 0))
        real["unlink"](path, *a, **k)

    def w_rename(src: Any, dst: Any, *a: Any, **k: Any) -> None:
        log.events.append(("rename", os.fsdecode(src) + " -> " + os.fsdecode(dst), 0))
        real["rename"](src, dst, *a, **k)

    def w_replace(src: Any, dst: Any, *a: Any, **k: Any) -> None:
        log.events.append(("replace", os.fsdecode(src) + " -> " + os.fsdecode(dst), 0))
        real["replace"](src, dst, *a, **k)

    def w_write(fd: int, data: Any) -> int:
        n: int = real["write"](fd, data)
        ev = log.events[-1] if log.events else None
        path = _fd_path(fd)
        if not (ev and ev[0] == "write" and ev[1] == path):
            log.events.append(("write", path, 0))
        return n

    for name, fn in (("open", w_open), ("fsync", w_fsync), ("link", w_link), ("unlink", w_unlink),
                     ("rename", w_rename), ("replace", w_replace), ("write", w_write)):
        monkeypatch.setattr(os, name, fn)
    return log
