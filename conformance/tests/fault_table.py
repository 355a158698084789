#!/usr/bin/env python3
"""Measure the fault table: every PCK_BAD_MODE of a broken adapter, run through the whole suite.

Usage (from the repository root)::

    python conformance/tests/fault_table.py [--adapter reference|minimal] [--seed N] [MODE ...]

Prints a Markdown table: mode, caught or not, the suites with failures and the first failure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ADAPTERS = {"reference": HERE / "bad_reference.py", "minimal": HERE / "bad_writer.py"}
REFERENCE_MODES = ["none", "no-fsync", "no-dir-fsync", "direct-manifest", "rename-publish",
                   "index-first", "skip-checks", "wrong-code", "zstd-as-none",
                   "json-zstd-as-json", "drop-range", "write-twice", "listing-writers", "ignore-fail",
                   "flip"]


def run_mode(adapter: Path, mode: str, seed: int, extra: list[str]) -> dict[str, object]:
    """One suite run against ``adapter`` with ``PCK_BAD_MODE=mode``; the JSON report."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        env = dict(os.environ, PCK_BAD_MODE="" if mode == "none" else mode,
                   PYTHONPATH=str(HERE.parents[1]))
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "conformance", "writer", "--seed", str(seed),
                            "--no-shrink", "--json", str(out), *extra, "--", sys.executable,
                            str(adapter)], env=env, capture_output=True, text=True,
                           cwd=HERE.parents[1])
        doc = json.loads(out.read_text()) if out.is_file() else {}
        doc["_rc"], doc["_seconds"] = r.returncode, time.monotonic() - t0
        if r.returncode not in (0, 1):  # no verdict: show why
            doc["failures"] = [{"message": r.stderr.strip()[-300:]}]
        return doc


#: --stop-early: the suites one at a time, stopping at the first that catches the mode
STAGES = (["--crash-examples", "0", "--no-committer"],
          ["--examples", "0", "--no-committer"],
          ["--examples", "0", "--crash-examples", "0"])


def run_staged(adapter: Path, mode: str, seed: int, extra: list[str]) -> dict[str, object]:
    """The suites one after the other (save, publish, committer) until one fails."""
    total = 0.0
    doc: dict[str, object] = {}
    for stage in STAGES:
        doc = run_mode(adapter, mode, seed, [*extra, *stage])
        total += float(doc["_seconds"])  # type: ignore[arg-type]
        if doc["_rc"] != 0:
            break
    doc["_seconds"] = total
    return doc


def main() -> int:
    """Run the modes and print the table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--adapter", choices=sorted(ADAPTERS), default="reference")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--examples", default="3")
    ap.add_argument("--stop-early", action="store_true",
                    help="run the suites one at a time and stop at the first that catches")
    ap.add_argument("modes", nargs="*")
    args = ap.parse_args()
    extra = ["--examples", args.examples, "--crash-examples", "7", "--max-writers", "3",
             "--timeout", "600"]
    print("| mode | caught | exit | suites failing | first failure | seconds |")
    print("|---|---|---|---|---|---|", flush=True)
    for mode in args.modes or REFERENCE_MODES:
        runner = run_staged if args.stop_early else run_mode
        doc = runner(ADAPTERS[args.adapter], mode, args.seed, extra)
        counts: dict[str, dict[str, int]] = doc.get("counts", {})  # type: ignore[assignment]
        failing = [s for s, n in counts.items() if n.get("failed")]
        fails: list[dict[str, str]] = doc.get("failures") or [{}]  # type: ignore[assignment]
        first = str(fails[0].get("message", ""))[:160].replace("|", "/").replace("\n", " ")
        caught = "n/a (control)" if mode == "none" else ("yes" if doc["_rc"] == 1 else "NO")
        print(f"| {mode} | {caught} | {doc['_rc']} | {', '.join(failing) or '-'} | {first} | "
              f"{doc['_seconds']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
