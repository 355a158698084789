"""Run one measured operation in a fresh subprocess and collect its time and peak RSS.

Every operation gets its own process, so ``ru_maxrss`` (from ``os.wait4`` on exactly that
child) is the peak resident memory of that one operation, including whatever setup the child did
(the child reports its own RSS right before the timed part, so the operation's increment is
visible separately).

Two kinds of operations:

* Python operations: ``python -m bench.child OP '<json args>'``. The child times only the
  operation itself (after imports and data preparation) with ``time.perf_counter`` and prints one
  ``BENCH_RESULT {json}`` line.
* External commands (``dd``, ``cat``): timed by the parent around the whole process.

Cache control: ``cache="cold"`` runs ``sync`` and writes ``3`` to ``/proc/sys/vm/drop_caches``
before the operation (root only; :func:`can_drop_caches` tells), ``cache="warm"`` reads the
given files once before the operation so they are in the page cache, ``None`` does nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Measurement", "can_drop_caches", "drop_caches", "run_child", "run_command", "warm_files"]

REPO = Path(__file__).resolve().parent.parent
RESULT_TAG = "BENCH_RESULT "


@dataclass
class Measurement:
    """One run of one operation."""

    name: str
    seconds: float
    wall_seconds: float
    maxrss_bytes: int
    cache: str | None = None
    ok: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def can_drop_caches() -> bool:
    """Whether this process may drop the page cache (root with a writable drop_caches)."""
    try:
        return os.geteuid() == 0 and os.access("/proc/sys/vm/drop_caches", os.W_OK)
    except OSError:
        return False


def drop_caches() -> None:
    """Flush dirty pages and drop the clean page cache, dentries and inodes."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def warm_files(paths: Sequence[str]) -> None:
    """Read every file once so that it sits in the page cache."""
    buf = bytearray(16 << 20)
    mv = memoryview(buf)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(mv):
                pass


def _prepare_cache(cache: str | None, files: Sequence[str]) -> None:
    if cache == "cold":
        drop_caches()
    elif cache == "warm":
        warm_files(files)
    elif cache == "sync":
        os.sync()


def _spawn(argv: list[str], env: dict[str, str] | None, timeout: float) -> tuple[int, str, str, float, int]:
    """Run argv; return (status, stdout, stderr, wall seconds, maxrss bytes of that child)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=str(REPO))
        deadline = t0 + timeout
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                p.kill()
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.002)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)  # already reaped: keep Popen quiet
        out.seek(0)
        err.seek(0)
        return (
            p.returncode,
            out.read().decode("utf-8", "replace"),
            err.read().decode("utf-8", "replace"),
            wall,
            int(ru.ru_maxrss) * 1024,  # Linux reports KiB
        )


def child_env() -> dict[str, str]:
    """Environment for child processes: the repo's src/ and bench/ importable, one thread pool."""
    env = dict(os.environ)
    paths = [str(REPO / "src"), str(REPO)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def run_child(
    name: str,
    op: str,
    args: dict[str, Any],
    *,
    cache: str | None = None,
    cache_files: Sequence[str] = (),
    timeout: float = 1800.0,
) -> Measurement:
    """Run ``bench.child`` operation ``op`` in a fresh interpreter and return its measurement."""
    _prepare_cache(cache, cache_files)
    argv = [sys.executable, "-m", "bench.child", op, json.dumps(args)]
    rc, out, err, wall, rss = _spawn(argv, child_env(), timeout)
    result: dict[str, Any] | None = None
    for line in out.splitlines():
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG) :])
    if rc != 0 or result is None:
        tail = (err or out)[-2000:]
        return Measurement(name, float("nan"), wall, rss, cache, ok=False, error=f"exit {rc}: {tail}")
    seconds = float(result.pop("seconds"))
    return Measurement(name, seconds, wall, rss, cache, extra=result)


def run_command(
    name: str,
    argv: list[str],
    *,
    cache: str | None = None,
    cache_files: Sequence[str] = (),
    timeout: float = 1800.0,
    extra: dict[str, Any] | None = None,
) -> Measurement:
    """Run an external command, timed by the parent around the whole process."""
    _prepare_cache(cache, cache_files)
    rc, _out, err, wall, rss = _spawn(argv, None, timeout)
    if rc != 0:
        return Measurement(name, float("nan"), wall, rss, cache, ok=False, error=f"exit {rc}: {err[-2000:]}")
    return Measurement(name, wall, wall, rss, cache, extra=dict(extra or {}))
