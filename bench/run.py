"""Benchmark driver: ``python -m bench [--quick] [--only SECTION[,SECTION]] [--out DIR]``.

Runs the sections of :mod:`bench.sections` (every measured operation in its own subprocess, see
:mod:`bench.runner`) and writes ``<out>/<date>-<mode>.md``, ``.json`` and ``-*.png``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import tempfile
import time
import traceback
from typing import Any

from bench import sections
from bench.machine import describe
from bench.report import write_all
from bench.runner import can_drop_caches

__all__ = ["main"]

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
DEFAULT_ORDER = ["save", "read", "verify", "checksum", "zstd", "scale", "torch", "s3", "realistic"]


def _expand(only: str | None) -> list[str]:
    if not only:
        return list(DEFAULT_ORDER)
    out: list[str] = []
    for part in only.split(","):
        part = part.strip()
        names = sections.GROUPS.get(part, [part])
        for n in names:
            if n not in sections.SECTIONS:
                raise SystemExit(f"unknown section {n!r}; known: {', '.join(sections.SECTIONS)} "
                                 f"and groups {', '.join(sections.GROUPS)}")
            if n not in out:
                out.append(n)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="small sizes, few repetitions (minutes)")
    ap.add_argument("--only", default=None,
                    help="comma-separated sections or groups: " + ", ".join([*sections.SECTIONS, *sections.GROUPS]))
    ap.add_argument("--out", default=DEFAULT_OUT, help="report directory (default bench/results/)")
    ap.add_argument("--scratch", default=None, help="directory for big temporary files (default: a new dir in $TMPDIR)")
    ap.add_argument("--no-cold", action="store_true", help="never drop the page cache (even as root)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one repetition (used by the test suite)")
    ap.add_argument("--name", default=None, help="report file stem (default <date>-<mode>)")
    args = ap.parse_args(argv)

    names = _expand(args.only)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    scratch = tempfile.mkdtemp(prefix="pck-bench-", dir=args.scratch)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    ctx = sections.Ctx(quick=args.quick or args.smoke, scratch=scratch, out=out, smoke=args.smoke)
    if args.no_cold:
        ctx.cold = False
    started = time.time()
    results: dict[str, Any] = {}
    print(f"bench: {mode} mode, sections {', '.join(names)}, scratch {scratch}, "
          f"cold cache {'available' if ctx.cold else 'not available'}", flush=True)
    try:
        for name in names:
            print(f"== {name}", flush=True)
            t0 = time.time()
            load0 = os.getloadavg()
            try:
                results[name] = sections.SECTIONS[name](ctx)
            except Exception:
                tb = traceback.format_exc()
                print(tb, file=sys.stderr)
                results[name] = {"title": name, "rows": [], "notes": ["section failed:\n" + tb[-1500:]], "failed": True}
            results[name]["seconds"] = time.time() - t0
            load1 = os.getloadavg()
            results[name]["loadavg"] = {"start": load0[0], "end": load1[0]}
            results[name].setdefault("notes", []).append(
                f"Load average (1 min) of the machine: {load0[0]:.2f} at the start of the section, "
                f"{load1[0]:.2f} at its end ({os.cpu_count()} cores); other work on the machine "
                "slows every contender, the alternated per-pair ratios are the robust numbers.")
            for t in results[name].get("targets", []):
                print(f"   {'MET   ' if t['met'] else 'MISSED'} {t['name']}: {t['value']} (target {t['target']})", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    date = dt.datetime.now().strftime("%Y-%m-%d")
    stem = args.name or f"{date}-{mode}" + ("" if not args.only else "-" + args.only.replace(",", "+"))
    meta = {"mode": mode, "date": dt.datetime.now().isoformat(timespec="seconds"), "sections": names,
            "command": "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:]),
            "wall_s": time.time() - started, "cold": ctx.cold and can_drop_caches()}
    path = write_all(results, describe(tempfile.gettempdir()), meta, out, stem)
    print(f"report: {path}", flush=True)
    return 1 if any(r.get("failed") for r in results.values()) else 0
