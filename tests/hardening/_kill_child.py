"""Child process of the kill matrix: one role of a save (writer, committer, gc) with a phase hook.

Usage: python _kill_child.py ROOT ROLE ATTEMPT STEP NWRITERS PHASE_JSON

When the operation described by PHASE_JSON is reached, the child prints ``PHASE <name>`` on stdout
and blocks; the parent SIGKILLs it there. No sleeps: the kill lands exactly at the phase.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import portable_ckpt
from portable_ckpt.errors import CheckpointError
from portable_ckpt.io.commit import commit
from portable_ckpt.io.gc import gc
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage
from tests.hardening._util import write_share


def pause(name: str) -> None:
    sys.stdout.write(f"PHASE {name}\n")
    sys.stdout.flush()
    sys.stdin.readline()  # the parent kills us while we wait here
    os._exit(99)  # not killed: the parent decided otherwise


def main() -> int:
    root, role, attempt, step_s, nw_s, phase_json = sys.argv[1:7]
    step, nwriters = int(step_s), int(nw_s)
    phase = json.loads(phase_json) if phase_json != "-" else None
    faults = []
    if phase is not None:
        name = phase["name"]
        if phase.get("os") == "link":
            real = os.link

            def link(src: str, dst: str, *a: object, **k: object) -> None:
                if dst.endswith("manifest.json"):
                    pause(name)
                real(src, dst)

            os.link = link  # type: ignore[assignment]
        elif phase.get("os") == "unlink":
            real_unlink = os.unlink

            def unlink(path: str, *a: object, **k: object) -> None:
                if str(path).endswith(".tmp") and "manifest.json" in str(path):
                    pause(name)
                real_unlink(path)

            os.unlink = unlink  # type: ignore[assignment]
        else:
            faults.append(Fault(op=phase["op"], path=phase["path"], error=None,
                                after_ops=phase.get("after_ops", 0), after_bytes=phase.get("after_bytes"),
                                times=1, callback=lambda op, p: pause(name)))
    if role == "gc" and phase is not None and phase.get("gc_fault"):
        from tests.hardening._killmatrix import gc_faults

        faults += gc_faults(phase["gc_fault"])  # a transient read error as well as the kill
    storage = FaultyStorage(open_storage(root, create=True), faults)
    try:
        if role.startswith("writer"):
            write_share(storage, attempt, step, int(role[6:]), nwriters)
        elif role == "committer":
            commit(storage, attempt, step=step, indexes=None, expected_writers=list(range(nwriters)),
                   continuation=portable_ckpt.Continuation("exact", nwriters, None))
        elif role == "gc":
            gc(storage, keep=2, grace_seconds=0.0)
        elif role == "torch":
            import torch

            import portable_ckpt.torch as pt

            state = {"w": torch.arange(12.0).reshape(3, 4) * step, "b": torch.full((5,), float(step))}
            pt.save(state, storage, step=step)
    except CheckpointError as exc:
        print(f"CKERR {exc.code} {exc}", flush=True)
        return 3
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
