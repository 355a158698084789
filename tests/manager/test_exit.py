"""Exit safety: a process that exits with an async save in flight finishes it, within a bound.

Every child is started through :mod:`tests.manager._reap` (killed on every path, no orphan).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

import portable_ckpt
from tests.manager._reap import Children, children

pytestmark = pytest.mark.torch

HERE = Path(__file__).resolve().parent
REPO = str(HERE.parents[1])
MODES = ["manager", "plain", "process"]


def _torchrun(kids: Children, *args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    return kids.start([*cmd, *args], env={"PYTHONPATH": REPO})  # type: ignore[no-any-return]


def test_exit_with_pending_async_save_finishes_it(tmp_path: Path) -> None:
    with children() as kids:
        proc = _torchrun(kids, str(HERE / "_exit_script.py"), str(tmp_path), *MODES)
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out[-3000:]
        assert kids.left() == []  # the launcher reaped its workers
    assert "terminate called" not in out and "ABANDONED" not in out
    assert "exiting with saves in flight" in out
    for mode in MODES:
        root = str(tmp_path / mode)
        versions = portable_ckpt.list_versions(root)
        assert [(v.step, v.status) for v in versions] == [(1, "committed")], (mode, out[-3000:])
        assert portable_ckpt.open(root).verify(deep=True) == []


def test_a_group_destroyed_under_a_pending_save_exits_1_and_says_why(tmp_path: Path) -> None:
    """The example's ``finally: destroy_process_group()`` ran before the manager was closed:
    the pending save was lost, the process exited 0 (a scheduler saw success), and the
    message blamed a dead or hung peer. Now: ABANDONED, the destroyed group named, status 1."""
    with children() as kids:
        proc = _torchrun(kids, str(HERE / "_exit_script.py"), str(tmp_path), "destroy")
        out, _ = proc.communicate(timeout=240)
        assert kids.left() == []
    assert proc.returncode != 0, out[-3000:]
    assert out.count("pending True") == 2, out[-3000:]
    assert out.count("ABANDONED") == 2 and "process group was destroyed" in out, out[-3000:]
    assert "Training continues" not in out and "a peer rank died" not in out, out[-3000:]
    versions = portable_ckpt.list_versions(str(tmp_path / "destroy"))
    assert [(v.step, v.status) for v in versions] == [(1, "incomplete")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _read_until(proc: subprocess.Popen[str], text: str, seen: list[str], limit: float) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return
    raise AssertionError(f"{text!r} not seen: {''.join(seen)[-3000:]}")


def test_exit_is_bounded_and_sigterm_still_stops_it(tmp_path: Path) -> None:
    """Rank 0's save waits on a stuck peer: ABANDONED at exit_timeout; rank 1 dies by SIGTERM."""
    root, port = str(tmp_path / "r"), str(_free_port())
    base = {"PYTHONPATH": REPO, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    script = [sys.executable, str(HERE / "_stall_script.py"), root]
    with children() as kids:
        procs = [
            kids.start(script, env={**base, "RANK": str(r), "WORLD_SIZE": "2"}) for r in (0, 1)
        ]
        out0: list[str] = []
        out1: list[str] = []
        _read_until(procs[1], "finishing the pending checkpoint of step 1", out1, 180)
        _read_until(procs[0], "ABANDONED (not finished after 2 s)", out0, 60)
        assert procs[0].wait(30) == 1  # os._exit at the bound, not a join of the stuck thread
        time.sleep(0.5)
        assert procs[1].poll() is None  # still waiting (its bound is 300 s)
        t0 = time.monotonic()
        procs[1].terminate()
        assert procs[1].wait(30) == -15 and time.monotonic() - t0 < 10
        assert kids.left() == []
    text = "".join(out0 + out1)
    assert "terminate called" not in text
    assert [v for v in portable_ckpt.list_versions(root) if v.status == "committed"] == []


def test_first_sigterm_preempts_a_second_one_terminates(tmp_path: Path) -> None:
    from portable_ckpt.torch.launch import run_group

    res = run_group("tests.manager._workers:sigterm_chain", 1, (str(tmp_path),), sys_path=[REPO])
    assert res.exitcodes == [-15] and res.results == [None], res.errors
    assert json.loads((tmp_path / "after-one.json").read_text()) == [True, True]
    assert [v.step for v in portable_ckpt.list_versions(str(tmp_path))] == [1]


_CLOSED_STUCK = """
import sys, time
import torch
import portable_ckpt.io.copy as pcopy
from portable_ckpt.torch import CheckpointManager
pcopy.copy_version = lambda *a, **k: time.sleep(10**6)  # a durable root that hangs (NFS, S3)
root = sys.argv[1]
m = CheckpointManager(root + "/durable", fast_root=root + "/fast", replicate=True, save_every=1,
                      continuation="statistical", exit_timeout=3)
m.maybe_save(1, {"w": torch.zeros(8)})
try:
    m.close(timeout=1)
except TimeoutError:
    print("close gave up", flush=True)
"""


def test_a_manager_closed_with_work_left_behind_still_bounds_the_exit(tmp_path: Path) -> None:
    """Race review F7: after ``close(timeout=...)`` gave up on a stuck replication, the
    interpreter joined the stuck pool thread for ever (the exit hook skipped closed managers)."""
    with children() as kids:
        proc = kids.start([sys.executable, "-c", _CLOSED_STUCK, str(tmp_path)],
                          env={"PYTHONPATH": REPO})
        t0 = time.monotonic()
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 1, out
        assert time.monotonic() - t0 < 60
    assert "close gave up" in out and "ABANDONED (not finished after 3 s)" in out


_POST_FAILS = """
import sys, time, torch
import portable_ckpt.torch as pckt
import portable_ckpt.torch._manager_post as post
import portable_ckpt.torch.manager as manager_mod

real, calls = post.after_save, []

def after_save(mgr, step, *a, **k):  # step 1's post-commit work fails unexpectedly
    calls.append(step)
    if step == 1:
        real(mgr, step, *a, **k)
        raise RuntimeError("unexpected failure in step 1's post-commit work")
    if step == 2:
        time.sleep(1.0)  # step 3's work is queued behind this one
    return real(mgr, step, *a, **k)

manager_mod.after_save = after_save
mgr = pckt.CheckpointManager(sys.argv[1], save_every=1, verify_sample=1.0,
                             continuation="statistical", handle_sigterm=False)
for s in (1, 2, 3):
    mgr.maybe_save(s, {"w": torch.arange(10.0) * s})
seen = []
for _ in range(2):
    try:
        mgr.wait()
        seen.append("ok")
    except RuntimeError as e:
        seen.append(str(e))
print("WAITS", seen, "CALLS", calls, flush=True)
for s in (4,):
    mgr.maybe_save(s, {"w": torch.arange(10.0) * s})
calls.clear()
manager_mod.after_save = lambda mgr, step, *a, **k: (_ for _ in ()).throw(RuntimeError("late"))
mgr.maybe_save(5, {"w": torch.arange(10.0) * 5})
# exit without close(): step 5 is committed; its post-commit work failed
"""


def test_a_failed_post_commit_job_is_raised_once_and_never_called_abandoned(
    tmp_path: Path,
) -> None:
    """Attack review 4 A8: a post-commit job that raised stayed in the manager: every wait()
    raised it again, the first returned without waiting for the work queued behind it, and at
    exit the newest step, committed, was called ABANDONED ("never restored"), status 1."""
    root = tmp_path / "r"
    with children() as kids:
        proc = kids.start([sys.executable, "-c", _POST_FAILS, str(root)],
                          env={"PYTHONPATH": REPO})
        out, _ = proc.communicate(timeout=120)
    assert """WAITS ["unexpected failure in step 1's post-commit work", 'ok'] CALLS [1, 2, 3]""" \
        in out, out
    assert proc.returncode == 0 and "ABANDONED" not in out, out
    assert "work after a checkpoint's commit failed" in out and "step 5 is committed" in out, out
    versions = portable_ckpt.list_versions(root)
    assert [v.step for v in versions if v.status == "committed"] == [1, 2, 3, 4, 5]
    assert all(v.verified for v in versions if v.step in (2, 3)), versions


_COPY_FAILS = """
import os, sys, torch
import portable_ckpt.torch as pckt
from portable_ckpt.errors import StorageError
from portable_ckpt.storage.local import LocalStorage
fast, root = sys.argv[1] + "/fast", sys.argv[1] + "/durable"
real = LocalStorage.open_writer
def bad(self, path, **kw):
    if self.root.startswith(root):
        raise StorageError(f"write {path}: Input/output error [injected]", path=path)
    return real(self, path, **kw)
LocalStorage.open_writer = bad
os.makedirs(root, exist_ok=True)
mgr = pckt.CheckpointManager(root, fast_root=fast, replicate=True, save_every=1,
                             handle_sigterm=False, continuation="statistical")
mgr.maybe_save(1, {"w": torch.arange(4.0)})
"""


def test_a_failed_durable_copy_at_exit_is_still_abandoned(tmp_path: Path) -> None:
    """Review of the change F4: with replicate=True, the newest step committed on the fast tier
    only, its durable copy failed, and the exit hook said "committed", status 0."""
    with children() as kids:
        proc = kids.start([sys.executable, "-c", _COPY_FAILS, str(tmp_path)],
                          env={"PYTHONPATH": REPO})
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "ABANDONED" in out and "is committed" not in out, out
