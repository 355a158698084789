"""Mutation audit 24, conformance/procs.py: what the harness does to adapter processes.

An adapter is often a shell wrapper around the real writer; the harness must end the whole
process tree it started (a kill case, a timeout), and count a trace's progress the same however
strace's writes and the harness's reads interleave.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from conformance.procs import (
    Adapter,
    InfrastructureError,
    KillPlan,
    _TraceProgress,
    count_trace_progress,
)

from .conftest import needs_tracing

#: a shell wrapper whose child (the "writer") records its pid, then works for a while
WRAPPER = """#!/bin/sh
"{py}" -c 'import os, sys, time
open(sys.argv[1] + ".pid", "w").write(str(os.getpid()))
time.sleep({sleep})' "$1"
"""


def _wrapper(tmp: Path, sleep: float) -> list[str]:
    sh = tmp / "adapter.sh"
    sh.write_text(WRAPPER.format(py=sys.executable, sleep=sleep))
    sh.chmod(0o755)
    return [str(sh)]


def _job(tmp: Path, name: str) -> Path:
    p = tmp / name
    p.write_text("{}")
    return p


def _child(job: Path) -> int:
    pidfile = Path(str(job) + ".pid")
    for _ in range(200):
        if pidfile.exists() and pidfile.read_text():
            return int(pidfile.read_text())
        time.sleep(0.01)
    raise AssertionError(f"the wrapper's child never started ({pidfile})")


def _alive(pid: int) -> bool:
    """A process that runs (a zombie, waiting for its reaper, is dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _dead_soon(pid: int) -> bool:
    for _ in range(200):
        if not _alive(pid):
            return True
        time.sleep(0.01)
    os.kill(pid, 9)  # clean up what the harness left
    return False


def test_a_timeout_ends_every_process_of_the_save(tmp_path: Path) -> None:
    """Two writers of one save, both hanging: --timeout ends both process trees, children of a
    wrapper script included (no writer left running on the user's CI machine)."""
    a = Adapter(_wrapper(tmp_path, 30), timeout=1.5, cwd=tmp_path)
    jobs = [_job(tmp_path, "w0.json"), _job(tmp_path, "w1.json")]
    with pytest.raises(InfrastructureError, match="past --timeout"):
        a.run_all(jobs)
    pids = [_child(j) for j in jobs]
    left = [pid for pid in pids if not _dead_soon(pid)]
    assert not left, f"adapter processes left running after the timeout: {left} of {pids}"


def test_a_kill_case_kills_the_wrappers_child(tmp_path: Path) -> None:
    """A kill case's SIGKILL reaches the writer below a shell wrapper, not the shell alone
    (else the writer goes on writing after the 'crash' the case is about)."""
    a = Adapter(_wrapper(tmp_path, 8), timeout=20, cwd=tmp_path)
    job = _job(tmp_path, "w0.json")
    o = a.run(job, KillPlan(victim=0, after=400, mode="time"))
    assert o.killed and o.rc == -9, (o.killed, o.rc)
    assert o.progress >= 400
    assert _dead_soon(_child(job)), "the wrapper's child outlived the kill"
    assert a.ended == 0  # a process the harness killed did not run to its end


@needs_tracing
def test_trace_progress_is_counted_whatever_the_reads_see(tmp_path: Path) -> None:
    """The live count of a trace (kill timing) equals the count of the finished trace when the
    trace is read while it grows, lines cut anywhere between two reads."""
    root = tmp_path / "root"
    root.mkdir()
    script = tmp_path / "w.py"
    script.write_text("import os, sys\nroot = sys.argv[1]\nfor i in range(6):\n"
                      "    with open(os.path.join(root, f'f{i}'), 'wb') as f:\n"
                      "        f.write(b'x' * 10)\n        os.fsync(f.fileno())\n")
    a = Adapter([sys.executable, str(script), str(root)], timeout=60, trace=True, cwd=tmp_path)
    o = a.run(_job(tmp_path, "job.json"))
    assert o.rc == 0 and o.trace is not None
    full = count_trace_progress(o.trace, str(root))
    assert full >= 18  # open, write and fsync of each of the 6 files
    data = o.trace.read_bytes()
    growing = tmp_path / "growing.strace"
    growing.write_bytes(b"")
    live = _TraceProgress(growing, str(root))
    seen = []
    for i in range(0, len(data), 37):
        with open(growing, "ab") as f:
            f.write(data[i:i + 37])
        seen.append(live.count())
    assert seen == sorted(seen) and seen[-1] == full, (seen[-5:], full)


def test_the_reported_error_is_the_last_error_line(tmp_path: Path) -> None:
    """README: the code an adapter reports is the LAST ``{"error": ...}`` line of its standard
    output (a committer may log a retried failure first)."""
    script = tmp_path / "a.py"
    script.write_text("import json\n"
                      "print(json.dumps({'error': {'code': 'PCK-STORAGE', 'message': 'retry'}}))\n"
                      "print('not json {')\n"
                      "print(json.dumps({'error': {'code': 'PCK-COMMIT-CONFLICT', 'message': 'x'}}))\n"
                      "print('[1, 2]')\n"
                      "raise SystemExit(1)\n")
    o = Adapter([sys.executable, str(script)], timeout=60, cwd=tmp_path).run(_job(tmp_path, "j.json"))
    assert o.rc == 1 and o.code == "PCK-COMMIT-CONFLICT", (o.rc, o.error)
