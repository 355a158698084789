"""Long kill matrix: >= 200 saves to one root, each SIGKILLed at a random phase.

About every other trial also injects a transient read error (EIO/EACCES at exists, size, read
or list of a manifest, a drill record or the root) into gc; the invariants include that gc never
deletes the two newest versions nor the newest drilled one.

    .venv/bin/python bench/kill_matrix_long.py --trials 200 --seed 1 [--json out.json]

See tests/hardening/_killmatrix.py for the phases and the invariants checked after every trial.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from tests.hardening._killmatrix import run_matrix


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pck-kill-") as d:
        results = run_matrix(os.path.join(d, "root"), args.trials, args.seed)
    by_phase = collections.Counter(t.phase for t in results)
    killed = collections.Counter(t.phase for t in results if t.killed)
    faulted = [t for t in results if t.gc_fault is not None]
    by_target = collections.Counter(str(t.gc_fault["target"]) for t in faulted if t.gc_fault)
    report = {
        "trials": len(results), "seed": args.seed, "seconds": round(time.perf_counter() - t0, 1),
        "killed": sum(t.killed for t in results), "committed_new_versions": sum(t.committed for t in results),
        "per_phase": {p: {"trials": n, "killed": killed[p]} for p, n in sorted(by_phase.items())},
        # Transient read errors injected into gc (issue 12 item 1), by what they hit.
        "gc_read_faults": {"trials": len(faulted), "per_target": dict(sorted(by_target.items())),
                           "gc_reported_skips": sum(any("gc skipped" in n for n in t.notes) for t in faulted)},
        "invariant_violations": 0,
    }
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
