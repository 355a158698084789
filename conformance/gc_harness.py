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
(R-GC-3): failures. A mark is a file named ``deleting/g<8 digits>T<12 digits>Z-<8 hex>.json``
(the deletion id's pattern, spec §15.2) created (link or rename target, creating open) before the
manifest went and not removed in between; its content is not in the trace (strace runs with
``-s 0``). A rename of the attempt directory itself removes its ``manifest.json`` (when it held
a regular one). Files of an attempt the case keeps are never removed or renamed, even when put
back (a failure for ``keep``, a warning for ``should-keep``), but its marks beside a regular
commit record; anything done through ``/proc/`` paths (``/proc/self/fd/N/...``) fails the case:
the order cannot be checked. The records before the writer indexes before the data and entry files, the
mark last (R-GC-3's SHOULD): warnings; a file removed or renamed outside the root (R-GC-5): a
failure, other writes there a warning.

A case's failures that lost data (a file of an attempt it keeps deleted or changed, at rest or
in the trace) come first: the first line is a JUnit report's headline.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.procs import (
    Adapter,
    AdapterTimeout,
    InfrastructureError,
    Outcome,
    hung,
    new_run_dir,
)
from conformance.report import CaseResult, RunReport, shell_join
from conformance.spec import DELETION_NAME_RE
from conformance.trace import FsEvent, fs_events, outside_writes, parse_trace, tracing_status
from conformance.vectors import RETENTION_DIRS, load_cases, materialize

__all__ = ["GcOptions", "judge", "order_problems", "reported_ids", "run_gc_vectors",
           "snapshot"]

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
    jobs: int = 1  # cases run at once, each its own adapter process (--jobs)


def snapshot(root: Path) -> dict[str, str]:
    """Every entry below ``root``: ``file:<SHA-256>:<inode>:<mtime ns>``, ``link:…``, ``dir``.

    Links are not followed: a gc that replaced a stray ``manifest.json`` link by a copy, or
    removed a ``manifest.json`` directory, changed what the case keeps.
    """
    out: dict[str, str] = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(top) / name
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = f"link:{os.readlink(p)}"
            elif p.is_dir():
                out[rel] = "dir"
            elif p.is_file():
                # its bytes, and which file it is: a gc that removed a kept file and wrote it
                # back with the same bytes changed the version under its readers (re-attack 26b)
                st = p.stat()
                out[rel] = (f"file:{hashlib.sha256(p.read_bytes()).hexdigest()}:"
                            f"{st.st_ino}:{st.st_mtime_ns}")
            else:
                out[rel] = "special"
    return out


def reported_ids(stdout: str) -> list[str] | None:
    """The attempt ids of the adapter's report line (None: none, e.g. the gc crashed).

    The report line is the last standard-output line that is a JSON object with a
    ``reported`` list.
    """
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and isinstance(doc.get("reported"), list):
                return [str(x) for x in doc["reported"]]
    return None


def judge(case: dict[str, Any], before: dict[str, str], root: Path, rc: int,
          reported: list[str] | None = None) -> tuple[list[str], list[str]]:
    """``(failures, warnings)`` of a gc run on ``case``.

    The run left ``root``, exited ``rc`` and reported ``reported`` (the ids of its report
    line, :func:`reported_ids`). The failures that lost data (a file of an attempt the case
    keeps deleted or changed, a MUST) come first.
    """
    lost, failures, warnings = _judge(case, before, root, rc, reported)
    return lost + failures, warnings


def _judge(case: dict[str, Any], before: dict[str, str], root: Path, rc: int,
           reported: list[str] | None) -> tuple[list[str], list[str], list[str]]:
    """``(lost, failures, warnings)``: :func:`judge`'s failures that lost data, the others."""
    after = snapshot(root)
    lost_data: list[str] = []
    failures: list[str] = []
    warnings: list[str] = []
    attempts: dict[str, dict[str, Any]] = case["attempts"]
    for aid, exp in attempts.items():
        mine = {rel: h for rel, h in before.items() if rel.startswith(aid + "/")}
        left = sorted(rel for rel, h in after.items() if rel.startswith(aid + "/")
                      and h != "dir")
        what = f"{aid} ({exp['class']}; {exp['why']})"
        if exp["outcome"] in ("keep", "should-keep"):
            # Only its deletion marks may go (cleared beside a commit record, R-GC-13); its
            # drill, copy and verification records are each the newest of their kind or a
            # failure, which R-DRILL-9 keeps. Nothing new but a mark may appear.
            clearable = before.get(f"{aid}/manifest.json", "").startswith("file:")
            lost = sorted(rel for rel, h in mine.items() if after.get(rel) != h and not (
                clearable and rel.startswith(f"{aid}/deleting") and rel not in after))
            added = sorted(rel for rel in after if rel.startswith(aid + "/")
                           and rel not in mine and not _mark_path(rel, aid))
            if lost:
                verb = "deleted or changed" if exp["outcome"] == "keep" else "deleted (a SHOULD)"
                text = f"{verb} {_few(lost)} of {what}"
                (lost_data if exp["outcome"] == "keep" else warnings).append(text)
            if added:
                failures.append(f"added {_few(added)} to {what}: a gc adds nothing to a version "
                                "it keeps but a deletion mark")
        elif exp["outcome"] == "delete" and left:
            failures.append(f"left {_few(left)} of {what}: the rules let it go and a gc "
                            "following spec §15 with this policy removes it")
    inside = tuple(a + "/" for a in attempts)
    for rel, h in before.items():
        if rel.startswith(inside) or rel in attempts or rel.startswith(PROBE_PREFIXES):
            continue
        if after.get(rel) != h:
            failures.append(f"{'changed' if rel in after else 'deleted'} {rel}, which is no "
                            "attempt of the root (R-GC-5: gc deletes nothing outside the "
                            "attempts it removes)")
    new = sorted(rel for rel in after if rel not in before and not rel.startswith(inside)
                 and rel not in attempts and not (rel.startswith(PROBE_PREFIXES) and "/" not in rel))
    if new:
        failures.append(f"wrote {_few(new)} into the root: a gc writes nothing there but its "
                        "probes (spec §15.2) and deletion marks")
    must = sorted(a for a, exp in attempts.items() if exp.get("reported"))
    if case["reports"] is True:
        if rc == 0:
            failures.append("exit status 0, but the gc had to report (R-GC-6, R-GC-10, R-GC-11, "
                            "R-GC-12: a command-line gc exits non-zero)")
        if reported is None:
            failures.append("no report line on standard output ({\"reported\": [...]}, the "
                            "adapter protocol): a gc that had to report said nothing, or "
                            "crashed")
        else:
            missing = [a for a in must if a not in reported]
            if missing:
                failures.append(f"its report does not name {_few(missing)}, which it had to "
                                "report (R-GC-10, R-GC-12, R-GC-11)")
    elif case["reports"] is False and rc != 0:
        failures.append(f"exit status {rc}: the gc failed, or reported what needs no report "
                        "(see its standard error)")
    junk = sorted(set(reported or ()) - set(attempts))
    if junk:
        failures.append(f"its report names {_few(junk)}, which no attempt of the root is")
    return lost_data, failures, warnings


def _mark_path(rel: str, aid: str) -> bool:
    """A deletion mark of ``aid`` (or its ``deleting/`` directory), which a gc may store."""
    return rel == f"{aid}/deleting" or (rel.startswith(f"{aid}/deleting/")
                                        and rel.count("/") == 2)


def _few(paths: list[str]) -> str:
    return ", ".join(paths[:3]) + (" ..." if len(paths) > 3 else "")


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
    if not traced:  # as the writer's writer.trace: a pass without them is no certification
        detail = status.detail if status else "--tracing off"
        report.cases.append(CaseResult(
            "gc.trace", "order of deletions (system-call trace: R-GC-3, R-GC-13)", "skipped",
            f"NOT CHECKED: tracing unavailable ({detail})" if status else
            "NOT CHECKED: --tracing off"))
        report.warnings.append(f"the order checks of the gc's deletions (a deletion mark stored "
                               f"before the commit record is removed, R-GC-13; the commit "
                               f"record first, R-GC-3; nothing removed of a kept version) were "
                               f"NOT run: {detail}")
    adapter = Adapter(cmd, timeout=opts.timeout, trace=traced)
    adapter.preflight()
    # The run's own directory: a new temporary one, or one below --workdir that no other run
    # uses (outside CI review, finding 3: runs sharing --workdir deleted each other's cases).
    work = Path(tempfile.mkdtemp(prefix="pck-gc-vectors-")) if opts.workdir is None else \
        new_run_dir(Path(opts.workdir), "gc-")
    report.info["workdir"] = str(work)
    t0 = time.monotonic()
    chosen = [(set_name, vdir, case) for set_name, vdir in RETENTION_DIRS.items()
              if opts.set_name in (None, set_name) for case in load_cases(vdir)
              if not opts.cases or case["name"] in opts.cases]

    def take(_i: int, result: CaseResult) -> None:
        report.cases.append(result)
        report.warnings += [f"{result.name}: {w}" for w in result.details.get("warnings", [])]

    try:  # --jobs N: N cases at once, each its own root, adapter process and trace; in order
        adapter.run_cases([functools.partial(_run_case, adapter, cmd, set_name, vdir, case,
                                             work, opts) for set_name, vdir, case in chosen],
                          opts.jobs, take)
    except BaseException:
        report.seconds = time.monotonic() - t0
        raise  # the work directory stays: the message may name a case in it
    report.seconds = time.monotonic() - t0
    if opts.keep_work:
        return
    if opts.workdir is None and not any(c.failed for c in report.cases):
        shutil.rmtree(work, ignore_errors=True)
        return
    # Below --workdir the cases that failed or warned stay; the run's directory goes when
    # nothing is left in it. Never a path this run did not create.
    for d in [*(d for d in work.iterdir() if d.is_dir()), work]:
        try:
            d.rmdir()
        except OSError:
            pass


def _run_case(adapter: Adapter, cmd: list[str], set_name: str, vdir: Path,
              case: dict[str, Any], work: Path, opts: GcOptions) -> CaseResult:
    name = f"{set_name}/{case['name']}"
    if case.get("requires") == "retire_abandoned" and not opts.retire_abandoned:
        return CaseResult("gc", name, "skipped", "needs retire_abandoned, which this gc does "
                          "not offer (--no-retire-abandoned)")
    t0 = time.monotonic()
    cdir = work / set_name / case["name"]  # the run's own directory: no earlier run's case
    root = materialize(case, cdir.parent, vdir)
    before = snapshot(root)
    job = cdir / "job.json"
    job.write_text(json.dumps({"op": "gc", "root": str(root.resolve()), **case["policy"]},
                              indent=1) + "\n", encoding="utf-8")
    try:
        out = adapter.run(job)
    except AdapterTimeout:
        # A gc that does not end on a case (a loop on a stray attempt) is that case's failure,
        # with its directory kept; the run goes on (re-attack 26: exit 4 and no verdict).
        return CaseResult("gc", name, "failed", hung("a gc that hangs on this root", opts.timeout),
                          time.monotonic() - t0,
                          case_dir=str(cdir), replay=_replay(case, cmd),
                          details={"policy": case["policy"], "rc": None, "warnings": [],
                                   "feature": case["feature"]})
    stdout = out.out.read_text(encoding="utf-8", errors="replace") if out.out.exists() else ""
    lost, failures, warnings = _judge(case, before, root, out.rc, reported_ids(stdout))
    if out.trace is not None:
        lost_too, errors, advice = _order(_events(out, adapter), root, case, out, before)
        lost += lost_too
        failures += errors
        warnings += advice
    # Data lost first: the first line is the JUnit headline (outside CI review, finding 6: it
    # said that two old versions were left, where the gc had deleted the two newest).
    failures = lost + failures
    status = "failed" if failures else "passed"
    if not failures and not warnings and not opts.keep_work:
        shutil.rmtree(cdir, ignore_errors=True)
    message = "\n".join(failures + [f"warning: {w}" for w in warnings])
    if failures:
        message += f"\nadapter exit status {out.rc}; its output: {out.out}, {out.err}"
    return CaseResult("gc", name, status, message, time.monotonic() - t0,
                      case_dir=str(cdir) if cdir.exists() else None,
                      replay=_replay(case, cmd) if failures else None,
                      details={"policy": case["policy"], "rc": out.rc,
                               "warnings": warnings, "feature": case["feature"]})


def _replay(case: dict[str, Any], cmd: list[str]) -> str:
    """The command that runs ``case`` again, from the case's root (not the one the gc left)."""
    return shell_join(["portable-ckpt-conformance", "gc", "--case", case["name"], "--keep-work",
                       "--", *cmd])


def _events(out: Outcome, adapter: Adapter) -> list[FsEvent]:
    assert out.trace is not None
    calls, _ = parse_trace(out.trace)
    return fs_events(calls, str(adapter.cwd))


#: An attempt's top-level directories in the order R-GC-3 recommends removing them: the
#: records, then the writer indexes, then the data and entry files (the mark last).
_ORDER = ({"drills", "copies", "verifications"}, {"index"}, {"data", "entries"})


def order_problems(events: list[FsEvent], root: Path, case: dict[str, Any], out: Outcome,
                   before: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
    """``(failures, warnings)`` of a traced gc run: R-GC-3 and R-GC-13 order, R-GC-5 outside.

    Only attempts whose ``manifest.json`` the gc removed are looked at for the order (an attempt
    without a commit record has none to remove first, and needs no mark). A rename of the
    attempt directory itself removes its commit record at that moment. ``before``: the root's
    :func:`snapshot` before the run (which attempts held a regular ``manifest.json``); without
    it every attempt is taken to have held one. The failures that lost data (a file of an
    attempt the case keeps removed) come first.
    """
    lost, failures, warnings = _order(events, root, case, out, before)
    return lost + failures, warnings


def _order(events: list[FsEvent], root: Path, case: dict[str, Any], out: Outcome,
           before: dict[str, str] | None) -> tuple[list[str], list[str], list[str]]:
    """``(lost, failures, warnings)``: :func:`order_problems`' data-loss failures, the rest."""
    lost: list[str] = []
    failures: list[str] = []
    warnings: list[str] = []
    base = str(root.resolve())
    proc = sorted({p for e in events if e.kind in ("unlink", "rename", "link", "mkdir", "open")
                   and (e.kind != "open" or "O_CREAT" in e.flags)
                   for p in (e.path, e.src) if p.startswith("/proc/")})
    if proc:
        failures.append(f"acted on files through /proc paths ({', '.join(proc[:3])}); the order "
                        "cannot be checked (R-GC-3, R-GC-13)")
    for aid, exp in case["attempts"].items():
        adir = f"{base}/{aid}"
        recorded = before is None or before.get(f"{aid}/manifest.json", "").startswith("file:")
        if exp["outcome"] in ("keep", "should-keep"):
            _kept_problems(events, aid, adir, recorded, exp["outcome"], lost, warnings)
        mine = [e for e in events if e.kind in ("unlink", "rename", "link", "open")
                and (e.path.startswith(adir + "/") or e.src.startswith(adir + "/")
                     or (e.kind == "rename" and e.src == adir))]
        gone = [i for i, e in enumerate(mine) if e.kind in ("unlink", "rename")
                and ((e.src or e.path) == f"{adir}/manifest.json"
                     or (e.kind == "rename" and e.src == adir and recorded))]
        if not gone:
            continue
        first = gone[0]
        if not _marked_before(mine, first, adir):
            failures.append(f"removed {aid}/manifest.json without storing a deletion mark "
                            "deleting/<deletion_id>.json in the attempt first (R-GC-13: a gc "
                            "stopped right after leaves what every tool takes for a version "
                            "whose record was lost)" + (
                                f" (it renamed {aid} away, which removes its manifest.json)"
                                if mine[first].src == adir else ""))
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
    return lost, failures, warnings


def _marked_before(mine: list[FsEvent], first: int, adir: str) -> bool:
    """A deletion mark was created before ``mine[first]`` and was still there then.

    Created: the target of a link or rename, or a file opened ``O_CREAT``, named
    ``deleting/<deletion_id>.json`` (R-GC-13, spec §15.2); its content is not in the trace.
    """
    for i, e in enumerate(mine[:first]):
        if e.kind in ("link", "rename", "open") and _is_mark(e.path, adir) and \
                (e.kind != "open" or "O_CREAT" in e.flags) and not any(
                    (later.kind == "unlink" and later.path == e.path)
                    or (later.kind == "rename" and later.src == e.path)
                    for later in mine[i + 1:first]):
            return True
    return False


def _kept_problems(events: list[FsEvent], aid: str, adir: str, recorded: bool, outcome: str,
                   failures: list[str], warnings: list[str]) -> None:
    """A version the case keeps sees no file removed or renamed, but its deletion marks.

    Its files at rest may be the same bytes when the gc put them back (re-attack 26: every kept
    file unlinked and written again, or every version deleted and the kept ones restored from a
    copy); the trace shows it. Marks may be cleared beside a regular commit record (R-GC-13).
    """
    touched = sorted({_rel(p, adir) for e in events if e.kind in ("unlink", "rename")
                      for p in [e.src if e.kind == "rename" else e.path]
                      if p == adir or p.startswith(adir + "/")})
    touched = [r for r in touched if not (recorded and (r == "deleting"
                                                          or r.startswith("deleting/")))]
    if not touched:
        return
    # What the final state shows: files gone were deleted, not put back (outside CI review,
    # finding 6: a gc that deleted two kept versions was said to have put them back).
    gone = [r for r in touched if not os.path.lexists(r if r == adir else f"{adir}/{r}")]
    back = [r for r in touched if r not in gone]
    named = {adir: "its directory"}
    if not back:
        text = (f"deleted {_few([named.get(r, r) for r in gone])} of {aid}, an attempt the case "
                "keeps: they are gone (a gc removes nothing of a version it keeps)")
    else:
        text = (f"removed {_few([named.get(r, r) for r in back])} of {aid}, an attempt the case "
                "keeps, and put it back" + (
                    f", and deleted {_few([named.get(r, r) for r in gone])}" if gone else "")
                + " (a gc removes nothing of a version it keeps: a crash in between loses it)")
    if outcome == "keep":
        failures.append(text)
    else:
        warnings.append(f"{text} (a SHOULD keep)")


def _parents(path: str, adir: str) -> list[str]:
    """The directories between ``adir`` (excluded) and ``path`` (excluded)."""
    parts = _rel(path, adir).split("/")[:-1]
    return [f"{adir}/{'/'.join(parts[:i])}" for i in range(1, len(parts) + 1)]


def _is_mark(path: str, adir: str) -> bool:
    """``path`` is ``<adir>/deleting/<deletion_id>.json`` (spec §15.2, R-GC-13)."""
    return (path.startswith(f"{adir}/deleting/")
            and DELETION_NAME_RE.fullmatch(path[len(adir) + len("/deleting/"):]) is not None)


def _rel(path: str, adir: str) -> str:
    return path[len(adir) + 1:] if path.startswith(adir + "/") else path
