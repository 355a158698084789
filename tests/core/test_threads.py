"""The per-process background workers (I/O, write): fresh in a forked child, reads work there."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt._threads import worker


def test_worker_is_one_thread_per_name_and_process() -> None:
    a, b = worker("pck-test-a"), worker("pck-test-b")
    assert worker("pck-test-a") is a and a is not b
    assert a.submit(lambda: 41 + 1).result(timeout=10) == 42


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_forked_child_gets_a_fresh_worker_and_can_read(tmp_path: Path) -> None:
    """A child forked after the parent used the I/O worker reads a version (no hang).

    The inherited executor has no thread in the child: a job submitted to it would never run,
    and a pipelined read waits on such jobs.
    """
    a = np.arange(6 << 20, dtype=np.float32).reshape(64, -1)  # 24 MiB: several read windows
    portable_ckpt.save_arrays(tmp_path, {"a": a}, step=1)
    ck = portable_ckpt.open(tmp_path)
    np.testing.assert_array_equal(ck.read("a"), a)  # the parent's I/O worker now exists
    parent = worker("pck-io")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child, reports through the pipe and exit code
        code = 1
        try:
            os.close(r)
            ok = worker("pck-io") is not parent
            got = portable_ckpt.open(tmp_path).read("a")
            ok = ok and bool(np.array_equal(got, a))
            os.write(w, b"ok" if ok else b"bad")
            code = 0
        finally:
            sys.stdout.flush()
            os._exit(code)
    os.close(w)
    import select

    ready, _, _ = select.select([r], [], [], 60)
    msg = os.read(r, 16) if ready else b"timeout"
    os.close(r)
    if not ready:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    assert msg == b"ok" and os.waitstatus_to_exitcode(status) == 0
    assert worker("pck-io") is parent


def _nice_of(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread niceness is Linux's")
def test_lowered_worker_and_the_workers_it_asks_for_run_lowered() -> None:
    import threading

    base = _nice_of(threading.get_native_id())
    plain = worker("pck-test-plain")

    def inside() -> tuple[int, str, int, str]:
        # A worker asked for from a lowered thread is a lowered one too (the save's writes).
        inner = worker("pck-test-inner")
        got = inner.submit(lambda: (_nice_of(threading.get_native_id()),
                                    threading.current_thread().name)).result(timeout=10)
        return _nice_of(threading.get_native_id()), threading.current_thread().name, *got

    low = worker("pck-test-bg", nice=5)
    nice, name, inner_nice, inner_name = low.submit(inside).result(timeout=10)
    assert nice == min(19, base + 5) and name.startswith("pck-test-bg-low")
    assert inner_nice == min(19, base + 5) and inner_name.startswith("pck-test-inner-low")
    # The caller's own thread and the workers it asks for keep their priority.
    assert _nice_of(threading.get_native_id()) == base
    assert plain.submit(lambda: _nice_of(threading.get_native_id())).result(timeout=10) == base
    assert worker("pck-test-inner") is not worker("pck-test-inner", nice=5)
