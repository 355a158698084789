"""The kill matrix driver, shared by tests/hardening/test_kill_matrix.py and bench/kill_matrix_long.py."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from portable_ckpt.io.versions import list_versions
from portable_ckpt.io.writer import new_attempt_id
from portable_ckpt.storage import open_storage
from tests.hardening._util import check_restores, check_root

CHILD = os.path.join(os.path.dirname(__file__), "_kill_child.py")
NWRITERS = 2

#: (role, phase) pairs: where a SIGKILL can land. ``published`` says whether the attempt must be
#: committed afterwards (True), must not be (False), or either is fine (None).
PHASES: list[dict[str, Any]] = [
    {"role": "writer", "name": "before-data", "op": "open", "path": "*/data/*", "published": False},
    {"role": "writer", "name": "mid-file", "op": "write", "path": "*/data/*", "bytes": True, "published": False},
    {"role": "writer", "name": "after-data", "op": "open", "path": "*/entries/*", "published": False},
    {"role": "writer", "name": "before-index", "op": "open", "path": "*/index/*", "published": False},
    {"role": "writer", "name": "mid-index", "op": "write", "path": "*/index/*", "bytes": True, "published": False},
    {"role": "committer", "name": "commit-start", "op": "exists", "path": "*/index/*", "published": False},
    {"role": "committer", "name": "reading-headers", "op": "read", "path": "*/data/*", "published": False},
    {"role": "committer", "name": "before-create", "op": "create", "path": "*/manifest.json", "published": False},
    {"role": "committer", "name": "written-not-linked", "os": "link", "published": False},
    {"role": "committer", "name": "linked-not-synced", "os": "unlink", "published": True},
    {"role": "gc", "name": "gc-after-manifest-delete", "op": "delete", "path": "*/data/*", "published": True},
    {"role": "gc", "name": "gc-mid", "op": "delete", "path": "*", "ops": True, "published": True},
]


@dataclass
class Trial:
    step: int
    phase: str
    victim: str
    killed: bool
    committed: bool
    seconds: float
    notes: list[str] = field(default_factory=list)


def run_child(root: str, role: str, attempt: str, step: int, phase: dict[str, Any] | None) -> tuple[bool, str]:
    """Run one role; SIGKILL it when it reports its phase. Return (killed, output)."""
    spec = "-" if phase is None else json.dumps(phase)
    env = dict(os.environ, PYTHONHASHSEED="0")
    p = subprocess.Popen(
        [sys.executable, CHILD, root, role, attempt, str(step), str(NWRITERS), spec],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    assert p.stdout is not None
    out = []
    killed = False
    for line in p.stdout:
        out.append(line)
        if line.startswith("PHASE "):
            os.kill(p.pid, signal.SIGKILL)
            killed = True
            break
    p.wait(timeout=60)
    err = p.stderr.read() if p.stderr else ""
    if p.stdin:
        p.stdin.close()
    if not killed and p.returncode not in (0, 3):
        raise AssertionError(f"{role} crashed (rc {p.returncode}):\n{''.join(out)}\n{err}")
    return killed, "".join(out)


def run_in_process(root: str, role: str, attempt: str, step: int) -> str | None:
    """Run a role without a hook in this process; return the CheckpointError text, if any."""
    import portable_ckpt
    from portable_ckpt.errors import CheckpointError
    from portable_ckpt.io.commit import commit
    from portable_ckpt.io.versions import gc
    from tests.hardening._util import write_share

    storage = open_storage(root, create=True)
    try:
        if role.startswith("writer"):
            write_share(storage, attempt, step, int(role[6:]), NWRITERS)
        elif role == "committer":
            commit(storage, attempt, step=step, indexes=None, expected_writers=list(range(NWRITERS)),
                   continuation=portable_ckpt.Continuation("exact", NWRITERS, None))
        else:
            gc(storage, keep=2, grace_seconds=0.0)
    except CheckpointError as exc:
        return str(exc)
    return None


def trial(root: str, step: int, rng: random.Random, prev: str | None) -> Trial:
    """One save at ``step`` with a SIGKILL at a random phase, then the invariants."""
    t0 = time.perf_counter()
    ph = dict(rng.choice(PHASES))
    victim = ph["role"] if ph["role"] != "writer" else f"writer{rng.randrange(NWRITERS)}"
    if ph.pop("bytes", False):
        ph["after_bytes"] = rng.randrange(1, 3000)
    if ph.pop("ops", False):
        ph["after_ops"] = rng.randrange(0, 12)
    attempt = new_attempt_id(step)
    killed_any = False
    notes: list[str] = []
    for role in [f"writer{w}" for w in range(NWRITERS)] + ["committer", "gc"]:
        if role == victim:  # the victim runs in its own process and is SIGKILLed at the phase
            killed, out = run_child(root, role, attempt, step, ph)
            killed_any |= killed
            if "CKERR" in out:
                notes.append(f"{role}: {out.strip().splitlines()[-1][:160]}")
        else:  # the others run here (same code path as the child, without a hook)
            err = run_in_process(root, role, attempt, step)
            if err:
                notes.append(f"{role}: {err[:160]}")
    storage = open_storage(root)
    committed_ids = check_root(storage)  # every committed version verifies and restores exactly
    committed = attempt in committed_ids
    want = ph["published"]
    if killed_any and want is False:
        assert not committed, f"{attempt} was published although killed at {ph['name']}"
    if want is True or not killed_any:
        assert committed, f"{attempt} is not committed after {ph['name']} (killed={killed_any}): {notes}"
    if prev is not None:
        assert prev in committed_ids, f"previous version {prev} vanished after {ph['name']}"
        check_restores(storage, prev)
    # Incomplete attempts are never listed committed; gc (grace 0) removes them on its next run.
    for v in list_versions(storage):
        assert v.status == "committed" or v.id not in committed_ids
    return Trial(step, ph["name"], victim, killed_any, committed, time.perf_counter() - t0, notes)


def run_matrix(root: str, trials: int, seed: int) -> list[Trial]:
    """``trials`` consecutive saves to one root, each killed somewhere."""
    rng = random.Random(seed)
    from tests.hardening._util import make_version

    make_version(root, 0)
    prev = make_version(root, 1)  # two versions before the first trial: gc always has work
    out = []
    for i in range(trials):
        t = trial(root, 2 + i, rng, prev)
        out.append(t)
        if t.committed:
            prev = [v.id for v in list_versions(root) if v.status == "committed"][-1]
    return out
