"""Command line of the conformance suite: ``portable-ckpt-conformance check|vectors|writer|gc|reader``.

Also run as ``python -m conformance``.

Exit status (:data:`conformance.report.EXIT_CODES`): 0 conformant, 1 not conformant, 2 usage
error (``check`` of a path that is not a directory, ``--replay`` of no case directory
included), 3 nothing was checked (schemas missing or incomplete, zero cases), 4 infrastructure
error (adapter not found — a missing script or ``python -m`` module —, every adapter process
dead of an import error, an adapter process past ``--timeout``, tracing required but
unavailable, a report that could not be written after a verdict of 0; a non-zero verdict is
kept, the run has failed either way), 5 a bug of the suite, 6 a ``writer`` run whose cases all
passed without the system-call checks that ``--tracing auto`` could not run.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from conformance import __version__
from conformance.report import (
    EXIT_CODES,
    GC_EXIT_CODES,
    READER_EXIT_CODES,
    CaseResult,
    RunReport,
    shell_join,
    vectors_sha256,
)
from conformance.spec import VERSIONS_TEXT

__all__ = ["EXIT_INFRA", "EXIT_INTERNAL", "EXIT_NONCONFORMANT", "EXIT_NOTHING", "EXIT_OK",
           "EXIT_PARTIAL", "EXIT_USAGE", "main"]

EXIT_OK, EXIT_NONCONFORMANT, EXIT_USAGE, EXIT_NOTHING, EXIT_INFRA, EXIT_INTERNAL = 0, 1, 2, 3, 4, 5
#: every case passed, but ``--tracing auto`` found no tracer: the system-call rules (durability,
#: atomic publish) were not checked, so the run certifies less than a pass (outside review 21b,
#: finding 4: it exited 0 with ``"ok": true``). ``--tracing off`` opts out on purpose: exit 0.
EXIT_PARTIAL = 6
PROG = "portable-ckpt-conformance"


def _emit(report: RunReport, args: argparse.Namespace) -> None:
    """Write ``--json`` / ``--junit-xml`` (each failure with its seed, case and replay line)."""
    try:
        if args.junit_xml:
            report.write_junit(args.junit_xml)
        if args.json:
            report.write_json(args.json)
    except BrokenPipeError:  # e.g. `... --json | head`: the exit status still tells
        sys.stderr.close()
    except OSError as exc:
        # Precedence: a failing status (1, 2, 3) is kept, so that a CI gate still reads the
        # verdict; a run that passed (0, or 6 untraced) but could not leave its report exits 4.
        print(f"error: cannot write the report: {exc}", file=sys.stderr)
        if report.exit_code in (EXIT_OK, EXIT_PARTIAL):
            report.exit_code = EXIT_INFRA


def _abort(report: RunReport, args: argparse.Namespace, code: int, message: str) -> int:
    """End a run that reached no verdict: the message on stderr and in the reports.

    A run stopped by a usage error (2), with nothing to check (3), by its infrastructure (4) or
    by a bug of the suite (5) keeps the cases it finished, and gets one case in state ``error``
    that says why: a CI test tab showed "0 tests" on a red step (conformance review C4), and a
    JUnit report of exit 2 or 3 had zero tests and no properties, green for a gate that reads
    JUnit alone (outside CI review, finding 4).
    """
    print(message, file=sys.stderr)
    report.exit_code = code
    report.warnings.append(message)
    report.cases.append(CaseResult(args.command, _ERROR_CASES.get(code, "error"), "error",
                                   message))
    _emit(report, args)
    return code


#: the name of the ``error`` case of a run stopped without a verdict, by exit status
_ERROR_CASES = {EXIT_USAGE: "usage error", EXIT_NOTHING: "nothing was checked",
                EXIT_INFRA: "infrastructure", EXIT_INTERNAL: "internal error"}


def _internal(report: RunReport, args: argparse.Namespace, exc: Exception) -> int:
    """A bug of the suite: exit 5, never 1 (not conformant), with the reports written."""
    detail = "".join(traceback.format_exception(exc, limit=6))
    return _abort(report, args, EXIT_INTERNAL,
                  f"internal error of portable-ckpt-conformance (not a conformance verdict; "
                  f"please report it): {type(exc).__name__}: {exc}\n{detail}")


# ---------------------------------------------------------------------------------- check
def _cmd_check(args: argparse.Namespace, argv: list[str]) -> int:
    from conformance.checker import check
    from conformance.schemas import SchemasUnavailable

    report = RunReport("check", argv)
    if not os.path.lexists(args.path):  # nothing to check: no verdict (review C8)
        hint = (" (the argument after --json, which takes an optional FILE, was read as the "
                "path to check: it is the only one that can be; to name a report file, give "
                "the path too: `check --json FILE ROOT` or `check ROOT --json=FILE`)") \
            if getattr(args, "json_was_path", False) else ""
        return _abort(report, args, EXIT_USAGE, f"error: {args.path} does not exist{hint}")
    t0 = time.monotonic()
    try:
        found = check(args.path, deep=args.deep, schema_dir=args.schemas)
    except SchemasUnavailable as exc:
        return _abort(report, args, EXIT_NOTHING, f"error: {exc}")
    except Exception as exc:  # a bug of the suite is no verdict (review C1)
        return _internal(report, args, exc)
    report.seconds = time.monotonic() - t0
    report.exit_code = EXIT_OK if found.ok else EXIT_NONCONFORMANT
    if found.codes == {"PCK-USAGE"}:  # a path that is not a directory: nothing was checked
        return _abort(report, args, EXIT_USAGE, f"error: {found.errors[0].message}")
    _check_cases(report, found, args)
    report.info.update(errors=[e.to_json() for e in found.errors], versions=found.versions)
    report.warnings += [w.message for w in found.warnings]
    if not args.json or args.json != "-":
        for e in found.errors:
            print(f"{e.code}: {e.message}")
        for w in found.warnings:
            print(f"warning: {w.message}", file=sys.stderr)
        print(f"{'conformant' if found.ok else 'NOT conformant'}: {args.path} "
              f"({len(found.versions)} version(s) checked, {len(found.errors)} error(s))")
    _emit(report, args)
    return report.exit_code


def _check_cases(report: RunReport, found: object, args: argparse.Namespace) -> None:
    """One JUnit/JSON case per version checked (and one for the root's own errors)."""
    errors = getattr(found, "errors", [])
    base = Path(args.path)
    names = list(getattr(found, "versions", []))
    if any(not e.version for e in errors) or not names:
        names.append("")
    for v in names:
        mine = [e for e in errors if e.version == v]
        target = base / v if v and base.name != v else base
        replay = shell_join([PROG, "check", *(["--deep"] if args.deep else []), str(target)])
        report.cases.append(CaseResult(
            "check", v or str(base), "failed" if mine else "passed",
            "\n".join(f"{e.code}: {e.message}" for e in mine), case_dir=str(target),
            replay=replay if mine else None, details={"codes": sorted({e.code for e in mine})}))


# --------------------------------------------------------------------------------- writer
def _cmd_writer(args: argparse.Namespace, argv: list[str]) -> int:
    from conformance.harness import Options, replay, run_suite

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    report = RunReport("writer", argv)
    if not cmd and not args.replay:
        return _abort(report, args, EXIT_USAGE, f"usage: {PROG} writer [options] -- CMD ...  "
                      "(or writer --replay CASE_DIR)")
    opts = Options(args.examples, args.crash_examples, not args.no_committer,
                   tuple(dict.fromkeys(c for c in args.codec.split(",") if c)),
                   args.max_writers, args.seed,
                   args.workdir, args.keep_work, args.timeout, not args.no_shrink,
                   args.tensor_table, args.tracing, args.shrink_time,
                   tuple(dict.fromkeys(args.record_env)))
    if not args.replay and opts.examples == 0 and opts.crash_examples == 0 and not opts.committer:
        return _abort(report, args, EXIT_NOTHING, "error: zero cases requested (--examples 0 "
                      "--crash-examples 0 --no-committer): nothing would be checked")
    t0 = time.monotonic()
    stopped = _guarded(report, args, lambda: replay(
        Path(args.replay).resolve(), report, cmd or None, args.tracing) if args.replay
        else run_suite(cmd, opts, report))
    if stopped is not None:
        return stopped
    report.seconds = time.monotonic() - t0
    report.exit_code = EXIT_NONCONFORMANT if report.failures else EXIT_OK
    if report.exit_code == EXIT_OK and args.tracing == "auto" \
            and not report.info.get("tracing", {}).get("used"):
        report.exit_code = EXIT_PARTIAL
    _print_writer(report, args)
    _emit(report, args)
    return report.exit_code


def _guarded(report: RunReport, args: argparse.Namespace, run: Callable[[], None]) -> int | None:
    """Run a harness; the exit status of what stopped it without a verdict, or None."""
    from conformance.procs import InfrastructureError
    from conformance.schemas import SchemasUnavailable

    try:
        run()
    except ValueError as exc:  # an argument only the harness could check
        return _abort(report, args, EXIT_USAGE, f"error: {exc}")
    except SchemasUnavailable as exc:
        return _abort(report, args, EXIT_NOTHING, f"error: {exc}")
    except InfrastructureError as exc:
        return _abort(report, args, EXIT_INFRA,
                      f"error (infrastructure, not a conformance verdict): {exc}")
    except Exception as exc:  # a bug of the suite is no verdict (review C1)
        return _internal(report, args, exc)
    return None


def _print_failures(report: RunReport, args: argparse.Namespace) -> TextIO:
    """Print each failed case and each warning; return the stream the summary goes to.

    A failure shows its message, seed (writer cases), case directory and replay line; the
    stream is stderr when the JSON report takes stdout.
    """
    out = sys.stderr if args.json == "-" else sys.stdout
    for f in report.failures:
        seed = f"\n  seed: {f.seed}" if f.seed is not None else ""
        print(f"FAIL [{f.suite}] {f.name}\n  {f.message.strip()}{seed}\n"
              f"  case directory: {f.case_dir}\n  replay: {f.replay}", file=out)
    for w in report.warnings:
        print(f"warning: {w}", file=out)
    return out


def _print_writer(report: RunReport, args: argparse.Namespace) -> None:
    out = _print_failures(report, args)
    shrink = report.info.get("shrink_seconds") or {}
    if sum(shrink.values()) >= 1:
        spent = ", ".join(f"{s} {t:.0f} s" for s, t in shrink.items())
        print(f"minimising the failures took {spent} (bound it with --shrink-time SECONDS, or "
              "--no-shrink in CI)", file=out)
    counts = ", ".join(f"{s} {n['passed']}/{n['passed'] + n['failed']}"
                       + (f" ({n['skipped']} not checked)" if n["skipped"] else "")
                       for s, n in report.counts().items())
    tracing = report.info.get("tracing", {})
    verdict = "writer FAILED" if report.failures else \
        "writer passed the cases that ran, WITHOUT the system-call checks (exit 6: durability " \
        "and atomic publish not certified; install strace, or --tracing off to opt out)" \
        if report.exit_code == EXIT_PARTIAL else "writer passed"
    print(f"{verdict}: {counts} in {report.seconds:.1f}s (seed {report.info.get('seed')}; "
          f"system-call checks: {'on, ' + tracing.get('detail', '') if tracing.get('used') else 'NOT CHECKED'})",
          file=out)


# -------------------------------------------------------------------------------- vectors
def _cmd_vectors(args: argparse.Namespace, argv: list[str]) -> int:
    """Check every golden vector (or one set): the installed suite proves itself first.

    A valid vector must be conformant, shallow and deep; an invalid one must be refused with
    exactly its code (by the deep check where only that finds it), as R-VERSION-13 asks.
    """
    import tempfile

    from conformance.checker import check
    from conformance.schemas import SchemasUnavailable
    from conformance.vectors import VECTOR_DIRS, all_cases, materialize

    report = RunReport("vectors", argv)
    report.info["vectors_sha256"] = vectors_sha256()  # what a CI pins (CI review, finding 9)
    if args.set is not None and args.set not in VECTOR_DIRS:
        return _abort(report, args, EXIT_USAGE, f"error: --set must be one of "
                      f"{', '.join(VECTOR_DIRS)}")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pck-vectors-") as tmp:
        for version, vdir, case in all_cases():
            if args.set not in (None, version):
                continue
            t1 = time.monotonic()
            target = materialize(case, Path(tmp) / version, vdir)
            problems: list[str] = []
            try:
                for deep in (False, True):
                    rep = check(target, deep=deep, schema_dir=args.schemas)
                    how = "check --deep" if deep else "check"
                    if case["valid"] and not rep.ok:
                        problems.append(f"{how} refused a valid vector: "
                                        + "; ".join(f"{e.code}: {e.message}" for e in rep.errors[:3]))
                    elif not case["valid"] and (deep or not case.get("deep")) \
                            and rep.codes != {case["code"]}:
                        problems.append(f"{how}: expected exactly {case['code']}, got "
                                        f"{sorted(rep.codes) or 'conformant'}")
            except SchemasUnavailable as exc:
                return _abort(report, args, EXIT_NOTHING, f"error: {exc}")
            report.cases.append(CaseResult(
                "vectors", f"{version}/{case['name']}", "failed" if problems else "passed",
                "\n".join(problems), time.monotonic() - t1,
                details={"valid": case["valid"], "code": case.get("code")}))
    report.seconds = time.monotonic() - t0
    failed = [c for c in report.cases if c.failed]
    report.exit_code = EXIT_NONCONFORMANT if failed else EXIT_OK
    out = sys.stderr if args.json == "-" else sys.stdout
    for c in failed:
        print(f"FAIL {c.name}\n  {c.message}", file=out)
    verdict = "the checker agrees with" if not failed else f"the checker DISAGREES on {len(failed)} of"
    print(f"{verdict} {len(report.cases)} golden vectors in {report.seconds:.1f}s (vectors "
          f"sha256 {report.info['vectors_sha256']})", file=out)
    _emit(report, args)
    return report.exit_code


def _adapter_command(
    report: RunReport, args: argparse.Namespace, name: str
) -> list[str] | int:
    """``CMD ...`` of a vector command (``gc``, ``reader``), or the exit status of its refusal.

    A missing command or a ``--timeout`` that is not a positive number (0, negative, nan) is a
    usage error, with a report when one was asked for.
    """
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        return _abort(report, args, EXIT_USAGE, f"usage: {PROG} {name} [options] -- CMD ...")
    if not args.timeout > 0:
        return _abort(report, args, EXIT_USAGE,
                      "error: --timeout must be a positive number of seconds")
    return cmd


# ------------------------------------------------------------------------------------- gc
def _cmd_gc(args: argparse.Namespace, argv: list[str]) -> int:
    """Run the retention vectors (spec §20.1) through a gc adapter."""
    from conformance.gc_harness import GcOptions, run_gc_vectors

    report = RunReport("gc", argv)
    cmd = _adapter_command(report, args, "gc")
    if isinstance(cmd, int):
        return cmd
    if args.jobs < 1:
        return _abort(report, args, EXIT_USAGE, "error: --jobs must be at least 1")
    opts = GcOptions(args.set, args.timeout, not args.no_retire_abandoned, args.workdir,
                     args.keep_work, tuple(args.case), args.tracing, args.jobs)
    stopped = _guarded(report, args, lambda: run_gc_vectors(cmd, opts, report))
    if stopped is not None:
        return stopped
    ran = [c for c in report.cases if c.suite == "gc" and c.status != "skipped"]
    if not ran:
        return _abort(report, args, EXIT_NOTHING, "error: no retention case ran")
    report.exit_code = EXIT_NONCONFORMANT if report.failures else EXIT_OK
    traced = report.info.get("tracing", {}).get("used")
    if report.exit_code == EXIT_OK and args.tracing == "auto" and not traced:
        report.exit_code = EXIT_PARTIAL
    out = _print_failures(report, args)
    skipped = sum(1 for c in report.cases if c.suite == "gc") - len(ran)
    verdict = "gc FAILED" if report.failures else "gc passed"
    order = "on" if traced else "NOT CHECKED (exit 6; install strace, or --tracing off)" \
        if args.tracing == "auto" else "off"
    print(f"{verdict}: {len(ran) - len(report.failures)}/{len(ran)} retention vectors"
          + (f" ({skipped} skipped: options this gc does not offer)" if skipped else "")
          + f" in {report.seconds:.1f}s (order checks, R-GC-3 and R-GC-13: {order})", file=out)
    _emit(report, args)
    return report.exit_code


# --------------------------------------------------------------------------------- reader
def _cmd_reader(args: argparse.Namespace, argv: list[str]) -> int:
    """Run the golden vectors (spec §20) through a reader adapter."""
    from conformance.reader_harness import ReaderOptions, run_reader_vectors

    report = RunReport("reader", argv)
    cmd = _adapter_command(report, args, "reader")
    if isinstance(cmd, int):
        return cmd
    if args.jobs < 1:
        return _abort(report, args, EXIT_USAGE, "error: --jobs must be at least 1")
    opts = ReaderOptions(args.set, args.timeout, not args.no_verification_status, args.workdir,
                         args.keep_work, tuple(args.case), args.known_failures, args.jobs)
    stopped = _guarded(report, args, lambda: run_reader_vectors(cmd, opts, report))
    if stopped is not None:
        return stopped
    if not report.cases:
        return _abort(report, args, EXIT_NOTHING, "error: no reader case ran")
    excused = report.info.get("known_failures", [])
    unchecked = report.info.get("verification_status_unchecked", [])
    report.exit_code = EXIT_NONCONFORMANT if report.failures else \
        EXIT_PARTIAL if excused or unchecked else EXIT_OK
    out = _print_failures(report, args)
    n = sum(1 for c in report.cases if c.suite == "reader")
    verdict = "reader FAILED" if report.failures else \
        "reader passed all but its known failures, NOT conformant (exit 6, a partial pass)" \
        if excused else "reader passed the cases that ran, WITHOUT the verification status " \
        "(exit 6, a partial pass)" if unchecked else "reader passed"
    known = f"; {len(excused)} known failure(s) of {args.known_failures} still fail" \
        if excused else ""
    status = "checked" if opts.verification_status else \
        f"NOT CHECKED (--no-verification-status: {len(unchecked)} case(s))"
    print(f"{verdict}: {n - len(report.failures) - len(excused)}/{n} golden vectors in "
          f"{report.seconds:.1f}s{known} (verification status, R-DRILL-8 and R-DRILL-12: "
          f"{status})", file=out)
    _emit(report, args)
    return report.exit_code


# ----------------------------------------------------------------------------------- main
class _Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults in ``--help``, but never "(default: None)" after a help that says its own."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or action.default is False or "(default" in text:
            return text
        return super()._get_help_string(action) or text


class _Version(argparse.Action):
    """``--version``: the version line, then the vector set's fingerprint (read when asked)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(version_text())
        parser.exit()


def version_text() -> str:
    """What ``--version`` prints: the version line, then the vector set's fingerprint.

    ``PROG VERSION (checks format ...)``, and on a line of its own ``vectors sha256 HEX``
    (:func:`conformance.report.vectors_sha256`).
    """
    return (f"{PROG} {__version__} (checks format {VERSIONS_TEXT})\n"
            f"vectors sha256 {vectors_sha256()}")


def _parser() -> argparse.ArgumentParser:
    fmt = _Defaults
    ap = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=f"Conformance suite of the portable-ckpt format 1.x ({VERSIONS_TEXT}).",
        epilog="exit status:\n" + "\n".join(f"  {k}  {v}" for k, v in EXIT_CODES.items())
        + "".join(f"\n  {k}  (gc) {v}" for k, v in GC_EXIT_CODES.items())
        + "".join(f"\n  {k}  (reader) {v}" for k, v in READER_EXIT_CODES.items()))
    ap.add_argument("--version", action=_Version, nargs=0,
                    help="print the suite's version and its vector set's sha256, and exit")
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", formatter_class=fmt,
                       help="statically check a checkpoint root or version directory")
    c.add_argument("path")
    c.add_argument("--deep", action="store_true", help="verify every checksum block and zstd frame")
    c.add_argument("--schemas", default=None, help="directory of the spec's JSON Schemas "
                   "(default: $PCK_SPEC_SCHEMAS, the package's copy, or spec/schemas)")
    _report_args(c)
    c.set_defaults(func=_cmd_check)
    v = sub.add_parser("vectors", formatter_class=fmt,
                       help="check every golden vector: proves an installed suite before CI "
                       "trusts its verdicts (exit 0: all agree)")
    v.add_argument("--set", default=None, help="one vector set (1.0, 1.1, errata-1, ...)")
    v.add_argument("--schemas", default=None, help="directory of the spec's JSON Schemas")
    _report_args(v)
    v.set_defaults(func=_cmd_vectors)
    w = sub.add_parser("writer", formatter_class=fmt,
                       help="drive a writer and committer through the adapter protocol")
    w.add_argument("--examples", type=int, default=10, help="generated save cases (0, or at least one per "
                   "codec: one case exercising each codec first, the rest drawn at random)")
    w.add_argument("--crash-examples", type=int, default=7,
                   help="atomic-publish cases (0, or at least 7: one per fault point first)")
    w.add_argument("--no-committer", action="store_true",
                   help="skip the committer cases (crafted refusals of spec §4.2, conflicts)")
    w.add_argument("--codec", default="none,zstd", help="codecs to exercise (comma-separated)")
    w.add_argument("--max-writers", type=int, default=4, help="writers per save, at most")
    w.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random, "
                   "printed and reported)")
    w.add_argument("--workdir", default=None, help="directory in which the run makes a "
                   "directory of its own for its case directories; runs may share it (default: "
                   "a new temporary directory)")
    w.add_argument("--keep-work", action="store_true", help="keep every case directory (failed "
                   "cases are always kept)")
    w.add_argument("--timeout", type=float, default=60.0, help="seconds per adapter process")
    w.add_argument("--no-shrink", action="store_true",
                   help="report the first failing example without minimising it")
    w.add_argument("--shrink-time", type=float, default=120.0,
                   help="seconds hypothesis may spend minimising failures, in all (the whole run)")
    w.add_argument("--tensor-table", choices=["never", "sometimes", "always"],
                   default="sometimes", help="how often jobs ask for a tensor table (format 1.1; "
                   "writers may honour it)")
    w.add_argument("--tracing", choices=["require", "auto", "off"], default="require",
                   help="system-call tracing (strace) for the durability and atomic-publish "
                   "checks: require it (exit 4 without), use it when available, or skip them")
    w.add_argument("--record-env", action="append", default=[], metavar="NAME",
                   help="record the value of environment variable NAME (repeatable) in every "
                   "case.json; --replay sets it again unless its own environment sets NAME "
                   "(default: none; an environment may hold secrets)")
    w.add_argument("--replay", default=None, metavar="CASE_DIR",
                   help="run one case again from its case directory (CMD optional)")
    _report_args(w)
    w.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the adapter command")
    w.set_defaults(func=_cmd_writer)
    g = sub.add_parser("gc", formatter_class=fmt,
                       help="run the retention vectors (spec §20.1) through a gc adapter")
    g.add_argument("--set", default=None, help="one retention set (errata-20)")
    g.add_argument("--case", action="append", default=[], metavar="NAME",
                   help="run only the case NAME (repeatable; default: every case)")
    g.add_argument("--no-retire-abandoned", action="store_true",
                   help="the gc does not offer retire_abandoned (optional, spec §15.2): skip "
                   "the cases that need it")
    g.add_argument("--timeout", type=float, default=60.0, help="seconds per adapter process")
    g.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                   help="run N cases at once, each on its own root in its own adapter process "
                   "(the report lists them in order, as with one); raise --timeout if the "
                   "machine is busy")
    g.add_argument("--tracing", choices=["require", "auto", "off"], default="require",
                   help="system-call tracing (strace) for the order checks (the mark before "
                   "the commit record, the commit record first: R-GC-13, R-GC-3): require it "
                   "(exit 4 without), use it when available (exit 6 without), or skip them")
    g.add_argument("--workdir", default=None, help="directory in which the run makes a "
                   "directory of its own for its case directories; runs may share it (default: "
                   "a new temporary directory)")
    g.add_argument("--keep-work", action="store_true", help="keep every case directory (failed "
                   "cases are always kept)")
    _report_args(g)
    g.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the adapter command")
    g.set_defaults(func=_cmd_gc)
    r = sub.add_parser("reader", formatter_class=fmt,
                       help="run the golden vectors (spec §20) through a reader adapter: "
                       "exact bytes and values, exact error codes")
    r.add_argument("--set", default=None, help="one vector set (1.0, 1.1, errata-1, ...)")
    r.add_argument("--case", action="append", default=[], metavar="NAME",
                   help="run only the case NAME (repeatable; default: every case)")
    r.add_argument("--no-verification-status", action="store_true",
                   help="the reader never chooses a version to restore: do not ask for nor "
                   "check failed_verification (R-DRILL-8, R-DRILL-12)")
    r.add_argument("--known-failures", default=None, metavar="FILE",
                   help="a JSON list of the cases the reader is known to fail, names or "
                   "{\"case\": NAME, \"got\": \"ok\"|\"PCK-...\"|null} (the outcome pinned): "
                   "those are skipped when they fail as listed (exit 6, a partial pass, when "
                   "nothing else failed), and fail when they pass or fail otherwise")
    r.add_argument("--timeout", type=float, default=60.0, help="seconds per adapter process "
                   "(one per case; a case past it fails)")
    r.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                   help="run N cases at once, each in its own adapter process (the report "
                   "lists them in order, as with one); raise --timeout if the machine is busy")
    r.add_argument("--workdir", default=None, help="directory below which the run makes its own "
                   "work directory (default: a new temporary directory)")
    r.add_argument("--keep-work", action="store_true", help="keep every case directory (failed "
                   "cases are always kept)")
    _report_args(r)
    r.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the adapter command")
    r.set_defaults(func=_cmd_reader)
    return ap


def _report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                   help="write the JSON report to FILE (standard output without FILE)")
    p.add_argument("--junit-xml", default=None, metavar="FILE", help="write a JUnit XML report")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    argv, json_was_path = _json_rewrite(list(sys.argv[1:] if argv is None else argv))
    args = _parser().parse_args(argv)
    args.json_was_path = json_was_path
    previous = signal.signal(signal.SIGTERM, _terminate)  # clean up as after Ctrl-C
    try:
        return int(args.func(args, argv))
    except KeyboardInterrupt:
        print("interrupted: running adapters killed, work directory removed"
              if args.command == "writer" else "interrupted: nothing was reported",
              file=sys.stderr)
        return 130
    except Exception as exc:  # a bug of the suite in any command: never exit 1 (review C1)
        print(f"internal error of {PROG} (not a conformance verdict; please report it): "
              f"{''.join(traceback.format_exception(exc, limit=6))}", file=sys.stderr)
        return EXIT_INTERNAL
    finally:
        signal.signal(signal.SIGTERM, previous)


def _json_before_path(argv: list[str]) -> list[str]:
    """``check --json ROOT``: ROOT after ``--json`` is the path, not the report file.

    ``--json`` takes an optional FILE, so argparse gave it the path and then asked for the
    path (exit 2, "the following arguments are required: path"). The value is read as the path
    where it is an existing directory (no report can be written over one), or where it is the
    only argument that can be the path: ``check --json /nonexistent`` then says that
    ``/nonexistent`` does not exist (outside CI review, finding 8), and a report file is named
    with ``--json=FILE`` or before the path (``--json FILE ROOT``).
    """
    return _json_rewrite(argv)[0]


def _json_rewrite(argv: list[str]) -> tuple[list[str], bool]:
    """:func:`_json_before_path`, and whether ``--json``'s value became the path."""
    out = list(argv)
    if not out or out[0] != "check":  # only check's own options: never an adapter's after --
        return out, False
    at: int | None = None  # the index of a "--json VALUE"
    positional = 0
    i = 1
    while i < len(out):
        a = out[i]
        if a == "--":
            positional += len(out) - i - 1
            break
        if a in ("--schemas", "--junit-xml"):  # options that take a value
            i += 2
            continue
        if a == "--json" and i + 1 < len(out) and not out[i + 1].startswith("-"):
            if Path(out[i + 1]).is_dir():
                out[i] = "--json=-"
                return out, True
            at = i
            i += 2
            continue
        if not a.startswith("-"):
            positional += 1
        i += 1
    if at is not None and positional == 0:  # the only argument that can be the path
        out[at] = "--json=-"
        return out, True
    return out, False


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
