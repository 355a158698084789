#!/usr/bin/env python3
"""Adapter of the reference gc (``portable-ckpt gc``) for the retention vectors (spec §20.1).

Usage: ``python conformance/adapters/reference_gc.py JOB.json``, the job
``{"op": "gc", "root", "keep", "grace_seconds", "delete_invalid", "retire_abandoned"}``
(conformance/README.md, "gc"). Runs the command line (``--json``) in this process, prints the
protocol's report line ``{"reported": [ids]}`` (the attempts it kept as invalid, could not
classify or did not retire because they are pinned) and exits with its status: 0, or 1 when
the gc reported (R-GC-6, R-GC-10, R-GC-11, R-GC-12).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from portable_ckpt.cli.main import main as cli


def main(argv: list[str]) -> int:
    """Run the job of ``argv[-1]``; the command line's exit status."""
    if len(argv) < 2:
        print("usage: reference_gc.py JOB.json", file=sys.stderr)
        return 2
    with open(argv[-1], encoding="utf-8") as f:
        job = json.load(f)
    if job.get("op") != "gc":
        print(f"reference_gc.py: not a gc job: {argv[-1]}", file=sys.stderr)
        return 2
    args = ["gc", job["root"], "--keep", str(job["keep"]), "--grace", repr(job["grace_seconds"]),
            "--quiet", "--json"]
    if job.get("delete_invalid"):
        args.append("--delete-invalid")
    if job.get("retire_abandoned"):
        args.append("--retire-abandoned")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli(args)
    try:
        doc = json.loads(out.getvalue())
    except ValueError:
        print(out.getvalue(), file=sys.stderr)  # no report: said as it came
        return rc or 1
    reported = [d["id"] for d in doc["damaged"]] + [u["id"] for u in doc["unknown"] if u["id"]]
    print(json.dumps({"reported": reported + doc["retire_pinned"]}))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
