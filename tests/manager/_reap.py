"""Child processes of the manager tests, reaped on every path (no orphan ever).

torchrun starts its workers in sessions of their own (their process group is not the test's),
and ``subprocess.run(timeout=...)`` kills only the launcher: before this helper, a timed-out test
left its workers running. Every process started here carries a unique token in its environment;
leaving the ``with`` block — normally, by an assertion, a timeout or an interrupt — kills every
process that still carries it, wherever it was re-parented. The launcher also gets
``PR_SET_PDEATHSIG`` (SIGTERM, which torchrun forwards to its workers) so that even a SIGKILLed
test run takes its children with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["Children", "children"]

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def carrying(token: str) -> list[int]:
    """Pids of the live processes whose environment holds ``token``."""
    needle = f"PCK_TEST_REAP={token}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if needle in env.split(b"\0") and stat.rsplit(")", 1)[-1].split()[0] != "Z":
            out.append(int(entry.name))
    return out


class Children:
    """The processes one test started (see :func:`children`)."""

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex
        self.procs: list[subprocess.Popen[str]] = []

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {
            **os.environ,
            "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            "PCK_TEST_REAP": self.token,
            **(extra or {}),
        }

    def start(self, cmd: Sequence[str], env: dict[str, str] | None = None, **kw: Any) -> Any:
        """Start one child (stdout and stderr merged into a text pipe unless given)."""
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.STDOUT)
        proc = subprocess.Popen(
            list(cmd),
            text=True,
            env=self.env(env),
            start_new_session=True,
            preexec_fn=_die_with_parent,
            **kw,
        )
        self.procs.append(proc)
        return proc

    def left(self) -> list[int]:
        """Pids of this test's processes still alive (launchers and their workers)."""
        return carrying(self.token)

    def reap(self) -> list[int]:
        """SIGKILL every process still carrying the token; return their pids."""
        found = self.left()
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
        return found


@contextlib.contextmanager
def children() -> Iterator[Children]:
    """Yield a :class:`Children`; on leaving, kill whatever of it is still alive."""
    kids = Children()
    try:
        yield kids
    finally:
        kids.reap()
