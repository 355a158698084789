"""Command line of the conformance suite: ``python -m conformance check|writer``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["main"]


def _cmd_check(args: argparse.Namespace) -> int:
    from conformance.checker import check

    report = check(args.path, deep=args.deep, schema_dir=args.schemas)
    try:
        _print_report(report, args)
    except BrokenPipeError:  # e.g. `... --json | head`: the exit status still tells
        sys.stderr.close()
    return 0 if report.ok else 1


def _print_report(report: Any, args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        for e in report.errors:
            print(f"{e.code}: {e.message}")
        for w in report.warnings:
            print(f"warning: {w.message}", file=sys.stderr)
        print(f"{'conformant' if report.ok else 'NOT conformant'}: {args.path} "
              f"({len(report.versions)} version(s) checked, {len(report.errors)} error(s))")


def _cmd_writer(args: argparse.Namespace) -> int:
    from conformance.harness import run_writer_suite

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("usage: python -m conformance writer [options] -- CMD ...", file=sys.stderr)
        return 2
    return run_writer_suite(cmd, examples=args.examples, crash_examples=args.crash_examples,
                            codecs=args.codec.split(","), seed=args.seed, workdir=args.workdir,
                            max_writers=args.max_writers, timeout=args.timeout,
                            verbose=args.verbose, shrink=not args.no_shrink,
                            tables=args.tensor_table)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    ap = argparse.ArgumentParser(prog="python -m conformance",
                                 description="portable-ckpt format 1.x conformance suite "
                                             "(1.0 and 1.1)")
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="statically check a checkpoint root or version directory")
    c.add_argument("path")
    c.add_argument("--deep", action="store_true", help="verify every checksum block and zstd frame")
    c.add_argument("--json", action="store_true", help='print {"ok", "errors": [{code, message}]}')
    c.add_argument("--schemas", default=None, help="directory of the spec's JSON Schemas")
    c.set_defaults(func=_cmd_check)
    w = sub.add_parser("writer", help="drive a writer through the adapter protocol")
    w.add_argument("--examples", type=int, default=10, help="generated save cases (default 10)")
    w.add_argument("--crash-examples", type=int, default=4, help="atomic-publish cases (default 4)")
    w.add_argument("--codec", default="none,zstd", help="codecs to exercise (comma-separated)")
    w.add_argument("--max-writers", type=int, default=4)
    w.add_argument("--seed", type=int, default=None, help="derandomise hypothesis with this seed")
    w.add_argument("--workdir", default=None, help="keep jobs and checkpoints here")
    w.add_argument("--timeout", type=float, default=60.0, help="seconds per adapter process")
    w.add_argument("--no-shrink", action="store_true",
                   help="report the first failing example without minimising it")
    w.add_argument("--tensor-table", choices=["never", "sometimes", "always"],
                   default="sometimes", help="how often jobs ask for a tensor table (format 1.1; "
                   "writers may honour it); default sometimes")
    w.add_argument("-v", "--verbose", action="store_true")
    w.add_argument("cmd", nargs=argparse.REMAINDER)
    w.set_defaults(func=_cmd_writer)
    args = ap.parse_args(argv)
    return int(args.func(args))
