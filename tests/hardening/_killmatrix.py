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


#: Transient read errors injected into gc (issue 12 item 1): the operation, which path, errno.
#: ``target`` is resolved per trial: the new attempt's or the previous version's manifest, any
#: manifest, the previous version's drill records, or the root listing.
GC_FAULT_OPS = ("exists", "size", "read", "list")
GC_FAULT_TARGETS = ("newest", "previous", "any-manifest", "drill", "root")


@dataclass
class Trial:
    step: int
    phase: str
    victim: str
    killed: bool
    committed: bool
    seconds: float
    notes: list[str] = field(default_factory=list)
    gc_fault: dict[str, Any] | None = None


def gc_fault_spec(rng: random.Random, attempt: str, prev: str | None) -> dict[str, Any] | None:
    """A transient storage fault for this trial's gc (about every other trial), or None."""
    if rng.random() < 0.5:
        return None
    target = rng.choice(GC_FAULT_TARGETS)
    if target == "root":
        op, path = "list", ""
    elif target == "drill":
        op = rng.choice(("read", "list"))
        path = f"{prev}/drills/*" if op == "read" else f"{prev}/drills/"
    else:
        op = rng.choice(GC_FAULT_OPS[:3])
        path = {"newest": attempt, "previous": prev, "any-manifest": "*"}[target] + "/manifest.json"
    return {"op": op, "path": path, "error": rng.choice(("EIO", "EACCES")), "target": target,
            "times": rng.choice((1, None))}


def gc_faults(spec: dict[str, Any] | None) -> list[Any]:
    """The :class:`Fault` list of a :func:`gc_fault_spec` (shared with the child process)."""
    from portable_ckpt.storage.faults import Fault

    if spec is None:
        return []
    return [Fault(op=spec["op"], path=spec["path"], error=spec["error"], times=spec["times"])]


def run_child(
    root: str, role: str, attempt: str, step: int, phase: dict[str, Any] | None,
    gc_fault: dict[str, Any] | None = None,
) -> tuple[bool, str]:
    """Run one role; SIGKILL it when it reports its phase. Return (killed, output)."""
    spec = "-" if phase is None else json.dumps(dict(phase, gc_fault=gc_fault))
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


def run_in_process(
    root: str, role: str, attempt: str, step: int, gc_fault: dict[str, Any] | None = None
) -> str | None:
    """Run a role without a hook in this process; return the CheckpointError text, if any."""
    import portable_ckpt
    from portable_ckpt.errors import CheckpointError
    from portable_ckpt.io.commit import commit
    from portable_ckpt.io.gc import gc
    from portable_ckpt.storage.faults import FaultyStorage
    from tests.hardening._util import write_share

    storage: Any = open_storage(root, create=True)
    if role == "gc" and gc_fault is not None:
        storage = FaultyStorage(storage, gc_faults(gc_fault))
    try:
        if role.startswith("writer"):
            write_share(storage, attempt, step, int(role[6:]), NWRITERS)
        elif role == "committer":
            commit(storage, attempt, step=step, indexes=None, expected_writers=list(range(NWRITERS)),
                   continuation=portable_ckpt.Continuation("exact", NWRITERS, None))
        else:
            rep = gc(storage, keep=2, grace_seconds=0.0)
            if not rep.complete:
                return f"gc skipped {[u['id'] for u in rep.unknown]}"
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
    fault = gc_fault_spec(rng, attempt, prev)
    guarded: set[str] = set()
    for role in [f"writer{w}" for w in range(NWRITERS)] + ["committer", "gc"]:
        if role == "gc":
            guarded = _before_gc(root, prev, rng)
        if role == victim:  # the victim runs in its own process and is SIGKILLed at the phase
            killed, out = run_child(root, role, attempt, step, ph, fault if role == "gc" else None)
            killed_any |= killed
            if "CKERR" in out:
                notes.append(f"{role}: {out.strip().splitlines()[-1][:160]}")
        else:  # the others run here (same code path as the child, without a hook)
            err = run_in_process(root, role, attempt, step, fault if role == "gc" else None)
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
    # gc (keep=2), killed or facing a transient read error, never deletes the two newest
    # versions nor the newest drilled one that existed when it started (R-GC-1, R-GC-2, R-GC-6).
    lost = guarded - set(committed_ids)
    assert not lost, f"gc deleted {sorted(lost)} (phase {ph['name']}, fault {fault}): {notes}"
    # Incomplete attempts are never listed committed; gc (grace 0) removes them on its next run.
    for v in list_versions(storage):
        assert v.status == "committed" or v.id not in committed_ids
    return Trial(step, ph["name"], victim, killed_any, committed, time.perf_counter() - t0, notes,
                 fault)


def _before_gc(root: str, prev: str | None, rng: random.Random) -> set[str]:
    """Before gc runs: maybe drill the previous version; return the versions gc must keep."""
    from portable_ckpt.io.annotations import write_drill_record

    storage = open_storage(root)
    if prev is not None and rng.random() < 0.3:
        write_drill_record(storage, prev, {
            "ok": True, "started_at": "2030-01-01T00:00:00Z", "finished_at": "2030-01-01T00:00:01Z",
            "world_size": 1, "saved_world_size": NWRITERS, "contract": "exact", "measurements": {},
            "error": None})
    committed = [v for v in list_versions(storage) if v.status == "committed"]
    guarded = {v.id for v in committed[-2:]}
    drilled = [v.id for v in committed if v.drilled]
    return guarded | set(drilled[-1:])


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
