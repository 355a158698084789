"""The retention vectors run against any gc (spec §20.1): ``portable-ckpt-conformance gc``.

For every case of a retention set the harness copies the case's root into its work directory,
applies ``setup`` (which dates the files), records every file's bytes, writes a job file
(``{"op": "gc", "root", "keep", "grace_seconds", "delete_invalid", "retire_abandoned"}``) and
runs ``CMD ... JOB.json`` once (the adapter protocol of the writer harness: the job file's
absolute path is the last argument). Then it compares what is left with the case:

* an attempt whose outcome is ``keep`` MUST still hold every file it held, byte for byte, but
  the records gc may prune (``drills/``, ``copies/``, ``verifications/``, ``deleting/``,
  R-DRILL-9, R-GC-13): a failure otherwise; ``should-keep`` (a SHOULD): a warning;
* ``delete``: no file of the attempt may be left (the rules let it go, and a gc that follows
  §15 with the case's policy removes it): a failure otherwise;
* ``either``: nothing is checked;
* every file outside the case's attempts (pins, notes, directories that are not attempts) MUST
  be left as it was (R-GC-5); probes (``.pck-clock-*``, ``.pck-probe-*``) may come and go;
* ``reports``: the gc had something it MUST report (an attempt it could not classify or kept as
  invalid, pins it could not read, R-GC-6, R-GC-10, R-GC-11, R-GC-12): the adapter exits
  non-zero, as a command-line gc does; otherwise it exits 0.

Cases whose ``requires`` names an option the gc under test does not offer
(``--no-retire-abandoned``) are skipped.

Under system-call tracing (``strace``, as the writer harness; ``--tracing require`` by
default) the order of what the gc did is checked too, which files at rest cannot show: in every
attempt whose ``manifest.json`` it removed, a deletion mark ``deleting/<deletion_id>.json`` was
created before (R-GC-13) and no other file of the attempt was removed or renamed before it
(R-GC-3): failures; the records before the writer indexes before the data and entry files, the
mark last (R-GC-3's SHOULD): warnings; a file removed or renamed outside the root (R-GC-5): a
failure, other writes there a warning.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.procs import Adapter, InfrastructureError, Outcome
from conformance.report import CaseResult, RunReport, shell_join
from conformance.trace import FsEvent, fs_events, outside_writes, parse_trace, tracing_status
from conformance.vectors import RETENTION_DIRS, load_cases, materialize

__all__ = ["GcOptions", "judge", "order_problems", "run_gc_vectors", "snapshot"]

#: Directories of an attempt whose records a gc may prune from a version it keeps.
PRUNABLE = ("drills", "copies", "verifications", "deleting")
#: Root entries a gc may create and delete (spec §15.2, probes).
PROBE_PREFIXES = (".pck-clock-", ".pck-probe-")


@dataclass(frozen=True)
class GcOptions:
    """What the ``gc`` command was asked."""

    set_name: str | None = None
    timeout: float = 60.0
    retire_abandoned: bool = True
    workdir: str | None = None
    keep_work: bool = False
    cases: tuple[str, ...] = ()  # only these (by name); empty: every case
    tracing: str = "require"  # require | auto | off, as for ``writer``


def snapshot(root: Path) -> dict[str, str]:
    """Every regular file below ``root`` (relative path) and the SHA-256 of its bytes."""
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[p.relative_to(root).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def judge(case: dict[str, Any], before: dict[str, str], root: Path, rc: int
          ) -> tuple[list[str], list[str]]:
    """``(failures, warnings)`` of a gc run on ``case`` that left ``root`` and exited ``rc``."""
    after = snapshot(root)
    failures: list[str] = []
    warnings: list[str] = []
    attempts: dict[str, dict[str, Any]] = case["attempts"]
    for aid, exp in attempts.items():
        mine = {rel: h for rel, h in before.items() if rel.startswith(aid + "/")}
        left = sorted(rel for rel in after if rel.startswith(aid + "/"))
        what = f"{aid} ({exp['class']}; {exp['why']})"
        if exp["outcome"] in ("keep", "should-keep"):
            lost = sorted(rel for rel, h in mine.items() if after.get(rel) != h
                          and rel.split("/")[1] not in PRUNABLE)
            if lost:
                verb = "deleted or changed" if exp["outcome"] == "keep" else "deleted (a SHOULD)"
                text = f"{verb} {', '.join(lost[:3])}{' ...' if len(lost) > 3 else ''} of {what}"
                (failures if exp["outcome"] == "keep" else warnings).append(text)
        elif exp["outcome"] == "delete" and left:
            failures.append(f"left {', '.join(left[:3])}{' ...' if len(left) > 3 else ''} of "
                            f"{what}: the rules let it go and a gc following spec §15 with this "
                            "policy removes it")
    inside = tuple(a + "/" for a in attempts)
    for rel, h in before.items():
        if rel.startswith(inside) or rel.startswith(PROBE_PREFIXES):
            continue
        if after.get(rel) != h:
            failures.append(f"{'changed' if rel in after else 'deleted'} {rel}, which is no "
                            "attempt of the root (R-GC-5: gc deletes nothing outside the "
                            "attempts it removes)")
    if case["reports"] and rc == 0:
        failures.append("exit status 0, but the gc had to report an attempt (R-GC-6, R-GC-10, "
                        "R-GC-11, R-GC-12: a command-line gc exits non-zero)")
    elif not case["reports"] and rc != 0:
        failures.append(f"exit status {rc}: the gc failed, or reported what needs no report "
                        "(see its standard error)")
    return failures, warnings


def run_gc_vectors(cmd: list[str], opts: GcOptions, report: RunReport) -> None:
    """Run every case of the retention sets (or ``opts.set_name``) through ``CMD``.

    Raises:
        ValueError: an unknown set or case name (a usage error).
        InfrastructureError: the adapter cannot be started, or ran past ``opts.timeout``.

    """
    if opts.set_name is not None and opts.set_name not in RETENTION_DIRS:
        raise ValueError(f"--set must be one of {', '.join(RETENTION_DIRS)}")
    known = {c["name"] for d in RETENTION_DIRS.values() for c in load_cases(d)}
    unknown = [n for n in opts.cases if n not in known]
    if unknown:
        raise ValueError(f"no retention case is named {', '.join(map(repr, unknown))}")
    status = tracing_status() if opts.tracing != "off" else None
    traced = bool(status and status.available)
    if opts.tracing == "require" and not traced:
        raise InfrastructureError(f"system-call tracing is required for the order checks "
                                  f"(R-GC-3, R-GC-13) but unavailable: "
                                  f"{status.detail if status else ''}; pass --tracing auto to "
                                  "run without them (reported as not checked)")
    report.info["tracing"] = {"used": traced, "detail": status.detail if status else "off"}
    adapter = Adapter(cmd, timeout=opts.timeout, trace=traced)
    adapter.preflight()
    own = opts.workdir is None
    work = Path(tempfile.mkdtemp(prefix="pck-gc-vectors-") if own else str(opts.workdir))
    work.mkdir(parents=True, exist_ok=True)
    report.info["workdir"] = str(work)
    t0 = time.monotonic()
    try:
        for set_name, vdir in RETENTION_DIRS.items():
            if opts.set_name not in (None, set_name):
                continue
            for case in load_cases(vdir):
                if opts.cases and case["name"] not in opts.cases:
                    continue
                result = _run_case(adapter, cmd, set_name, vdir, case, work, opts)
                report.cases.append(result)
                report.warnings += [f"{result.name}: {w}" for w in
                                    result.details.get("warnings", [])]
        if adapter.cannot_import is not None:
            raise InfrastructureError(f"every adapter process died of an import error: "
                                      f"{adapter.cannot_import}")
    finally:
        report.seconds = time.monotonic() - t0
        if own and not opts.keep_work and not any(c.failed for c in report.cases):
            shutil.rmtree(work, ignore_errors=True)


def _run_case(adapter: Adapter, cmd: list[str], set_name: str, vdir: Path,
              case: dict[str, Any], work: Path, opts: GcOptions) -> CaseResult:
    name = f"{set_name}/{case['name']}"
    if case.get("requires") == "retire_abandoned" and not opts.retire_abandoned:
        return CaseResult("gc", name, "skipped", "needs retire_abandoned, which this gc does "
                          "not offer (--no-retire-abandoned)")
    t0 = time.monotonic()
    cdir = work / set_name / case["name"]
    if cdir.exists():  # a workdir of an earlier run
        shutil.rmtree(cdir)
    root = materialize(case, cdir.parent, vdir)
    before = snapshot(root)
    job = cdir / "job.json"
    job.write_text(json.dumps({"op": "gc", "root": str(root.resolve()), **case["policy"]},
                              indent=1) + "\n", encoding="utf-8")
    out = adapter.run(job)
    failures, warnings = judge(case, before, root, out.rc)
    if out.trace is not None:
        errors, advice = order_problems(_events(out, adapter), root, case, out)
        failures += errors
        warnings += advice
    status = "failed" if failures else "passed"
    if not failures and not warnings and not opts.keep_work:
        shutil.rmtree(cdir, ignore_errors=True)
    message = "\n".join(failures + [f"warning: {w}" for w in warnings])
    if failures:
        message += f"\nadapter exit status {out.rc}; its output: {out.out}, {out.err}"
    return CaseResult("gc", name, status, message, time.monotonic() - t0,
                      case_dir=str(cdir) if cdir.exists() else None,
                      # the root as the gc left it is kept; a replay starts from the case again
                      replay=shell_join(["portable-ckpt-conformance", "gc", "--case",
                                         case["name"], "--keep-work", "--", *cmd])
                      if failures else None,
                      details={"policy": case["policy"], "rc": out.rc,
                               "warnings": warnings, "feature": case["feature"]})


def _events(out: Outcome, adapter: Adapter) -> list[FsEvent]:
    assert out.trace is not None
    calls, _ = parse_trace(out.trace)
    return fs_events(calls, str(adapter.cwd))


#: An attempt's top-level directories in the order R-GC-3 recommends removing them: the
#: records, then the writer indexes, then the data and entry files (the mark last).
_ORDER = ({"drills", "copies", "verifications"}, {"index"}, {"data", "entries"})


def order_problems(events: list[FsEvent], root: Path, case: dict[str, Any], out: Outcome
                   ) -> tuple[list[str], list[str]]:
    """``(failures, warnings)`` of a traced gc run: R-GC-3 and R-GC-13 order, R-GC-5 outside.

    Only attempts whose ``manifest.json`` the gc removed are looked at (an attempt without a
    commit record has none to remove first, and needs no mark).
    """
    failures: list[str] = []
    warnings: list[str] = []
    base = str(root.resolve())
    for aid in case["attempts"]:
        adir = f"{base}/{aid}"
        mine = [e for e in events if e.kind in ("unlink", "rename", "link", "open")
                and (e.path.startswith(adir + "/") or e.src.startswith(adir + "/"))]
        gone = [i for i, e in enumerate(mine) if e.kind in ("unlink", "rename")
                and (e.src or e.path) == f"{adir}/manifest.json"]
        if not gone:
            continue
        first = gone[0]
        marks = [i for i, e in enumerate(mine) if e.kind in ("link", "rename", "open")
                 and _is_mark(e.path, adir) and (e.kind != "open" or "O_CREAT" in e.flags)]
        if not any(i < first for i in marks):
            failures.append(f"removed {aid}/manifest.json without storing a deletion mark "
                            "deleting/<deletion_id>.json in the attempt first (R-GC-13: a gc "
                            "stopped right after leaves what every tool takes for a version "
                            "whose record was lost)")
        early = sorted({_rel(e.src if e.kind == "rename" else e.path, adir)
                        for e in mine[:first] if e.kind in ("unlink", "rename")
                        and (e.src if e.kind == "rename" else e.path) != f"{adir}/manifest.json"
                        and not _is_mark(e.src or e.path, adir)
                        and not (e.src or e.path).endswith(".tmp")})
        if early:
            failures.append(f"removed {', '.join(early[:3])} of {aid} before its manifest.json "
                            "(R-GC-3: the commit record goes first, so that the version stops "
                            "existing before any of its files)")
        dirs = {d for e in mine for d in _parents(e.path, adir)}
        tops = [_rel(e.path, adir).split("/", 1)[0] for e in mine[first + 1:]
                if e.kind == "unlink" and e.path not in dirs]  # files: rmdir comes at the end
        rank = [next((r for r, group in enumerate(_ORDER) if t in group), None) for t in tops]
        seen = [r for r in rank if r is not None]
        if any(a > b for a, b in itertools.pairwise(seen)):
            warnings.append(f"{aid}: removed its files in another order than records, writer "
                            "indexes, then data and entry files (R-GC-3, a SHOULD: a gc "
                            "stopped half-way then leaves what classifies as invalid)")
        if "deleting" in tops and any(t not in ("deleting", "") for t in
                                      tops[tops.index("deleting"):]):
            warnings.append(f"{aid}: removed its deletion mark before its other files "
                            "(R-GC-13, a SHOULD: the mark goes last)")
    own = {str(out.out.resolve()), str(out.err.resolve())}
    outside = [p for p in outside_writes(events, base) if p not in own
               and not p.startswith(str(out.job.parent.resolve()) + "/job")]
    removed = sorted({e.src or e.path for e in events if e.kind in ("unlink", "rename")
                      and (e.src or e.path) in outside})
    if removed:
        failures.append(f"removed or renamed {', '.join(removed[:3])} outside the root (R-GC-5)")
    rest = [p for p in outside if p not in removed]
    if rest:
        warnings.append(f"wrote outside the root: {', '.join(rest[:3])} (the adapter protocol: "
                        "a gc writes only below its root)")
    return failures, warnings


def _parents(path: str, adir: str) -> list[str]:
    """The directories between ``adir`` (excluded) and ``path`` (excluded)."""
    parts = _rel(path, adir).split("/")[:-1]
    return [f"{adir}/{'/'.join(parts[:i])}" for i in range(1, len(parts) + 1)]


def _is_mark(path: str, adir: str) -> bool:
    rel = _rel(path, adir)
    return rel.startswith("deleting/g") and rel.endswith(".json") and rel.count("/") == 1


def _rel(path: str, adir: str) -> str:
    return path[len(adir) + 1:] if path.startswith(adir + "/") else path
