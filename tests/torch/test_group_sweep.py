"""A run of ``run_group`` killed with SIGKILL left its ``pck-group-*`` directory for good.

``drill`` and ``demo`` run their ranks through ``run_group``, whose temporary directory (the
rendezvous store and the ranks' results) is removed by a ``finally`` that SIGKILL skips. The
next run removes such a directory once it is positively abandoned: its run and ranks, named in
it, are all gone. Anything not known to be one is kept.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from portable_ckpt.torch.launch import (
    GROUP_PREFIX,
    _pid_space,
    _started,
    _write_owners,
    sweep_abandoned_groups,
)

REPO = Path(__file__).resolve().parents[2]

_PARENT = """
import sys
from portable_ckpt.torch.launch import run_group
run_group("tests.torch._group_workers:sleep_for", 2, (float(sys.argv[1]),), sys_path=[sys.argv[2]])
"""


def _wait_for(cond, seconds: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _group_dirs(base: Path) -> list[Path]:
    return sorted(base.glob(GROUP_PREFIX + "*"))


def test_a_killed_runs_directory_is_removed_once_its_ranks_are_gone(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, "3", str(REPO)], env=env)
    try:
        def ranks_named() -> bool:
            dirs = _group_dirs(tmp_path)
            owners = dirs[0] / "owners.json" if dirs else None
            return owners is not None and owners.exists() and len(
                json.loads(owners.read_text())["ranks"]) == 2

        _wait_for(ranks_named, 90)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
    finally:
        parent.kill()
    (group,) = _group_dirs(tmp_path)
    ranks = json.loads((group / "owners.json").read_text())["ranks"]
    assert all(_started(pid) == t for pid, t in ranks)  # orphaned, still sleeping
    assert sweep_abandoned_groups(str(tmp_path)) == []  # its ranks still run: kept
    assert group.is_dir()
    _wait_for(lambda: all(_started(pid) != t for pid, t in ranks), 60)
    # The next run (of any group: a drill, the demo) removes it, and its own directory too.
    subprocess.run([sys.executable, "-c", _PARENT, "0", str(REPO)], env=env, check=True,
                   timeout=120)
    assert _group_dirs(tmp_path) == []


def test_what_is_not_known_abandoned_is_kept(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = int(gone.stdout)
    me = [os.getpid(), _started(os.getpid())]

    def plant(name: str, owners: object | None) -> Path:
        d = tmp_path / name
        d.mkdir()
        (d / "store").write_text("x")
        if isinstance(owners, dict):
            owners = {"pid_space": _pid_space(), **owners}
        if owners is not None:  # a str is the file's text
            text = owners if isinstance(owners, str) else json.dumps(owners)
            (d / "owners.json").write_text(text)
        return d

    kept = [
        plant(GROUP_PREFIX + "live", {"owner": me, "ranks": []}),  # this process runs it
        plant(GROUP_PREFIX + "live-rank", {"owner": [dead, 1], "ranks": [me]}),
        plant(GROUP_PREFIX + "no-owners", None),  # written by something else, or cut short
        plant(GROUP_PREFIX + "unknown-start", {"owner": [dead, None], "ranks": []}),
        plant(GROUP_PREFIX + "odd", {"owner": "x", "ranks": []}),
        plant("other-prefix", {"owner": [dead, 1], "ranks": []}),
        # Its pids are another container's (a shared /tmp) or an earlier boot's.
        plant(GROUP_PREFIX + "other-space", {"owner": [dead, 1], "ranks": [], "pid_space": "x"}),
        plant(GROUP_PREFIX + "no-space", {"owner": [dead, 1], "ranks": [], "pid_space": None}),
        # Forged or damaged: too deep for json to read (a RecursionError stopped the run).
        plant(GROUP_PREFIX + "deep", "[" * 100_000 + "]" * 100_000),
    ]
    (tmp_path / (GROUP_PREFIX + "link")).symlink_to(kept[0])
    # An owners file that is a FIFO (open blocked the sweep for good), or a link to /dev/zero.
    fifo = tmp_path / (GROUP_PREFIX + "fifo")
    fifo.mkdir()
    os.mkfifo(fifo / "owners.json")
    zero = tmp_path / (GROUP_PREFIX + "zero")
    zero.mkdir()
    (zero / "owners.json").symlink_to("/dev/zero")
    kept += [fifo, zero]
    # Its owner's pid is dead, or reused by a process of another start time.
    gone_dir = plant(GROUP_PREFIX + "gone", {"owner": [dead, 1], "ranks": [[os.getpid(), 1]]})
    swept = subprocess.run(  # in a child: a sweep that blocks fails here, not hangs
        [sys.executable, "-c", "import sys; from portable_ckpt.torch.launch import "
         "sweep_abandoned_groups as s; print(s(sys.argv[1]))", str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=True)
    assert swept.stdout.strip() == repr([str(gone_dir)])
    assert all(d.is_dir() for d in kept) and not gone_dir.exists()
    assert (tmp_path / (GROUP_PREFIX + "link")).is_symlink()


def test_a_live_run_of_another_pid_namespace_is_kept(tmp_path: Path) -> None:
    """Containers sharing ``$TMPDIR`` (a pod's shared /tmp): this process's run is invisible
    from another PID namespace, whose sweep took its pids for gone and removed the live run's
    directory (re-attack 29)."""
    live = tmp_path / (GROUP_PREFIX + "live")
    live.mkdir()
    _write_owners(str(live), [])  # this process runs it
    code = ("import sys; from portable_ckpt.torch.launch import sweep_abandoned_groups; "
            "print(sweep_abandoned_groups(sys.argv[1]))")
    try:
        out = subprocess.run(["unshare", "-Urpf", "--mount-proc", sys.executable, "-c", code,
                              str(tmp_path)], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("no unshare(1)")
    if out.returncode != 0 and "unshare" in out.stderr:
        pytest.skip(f"no PID namespace here: {out.stderr.strip()[:200]}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert live.is_dir()
