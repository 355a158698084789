"""Writer harness: drives any writer and committer through the adapter protocol.

The protocol is described in conformance/README.md; the harness checks what they did.

A run has three suites:

* ``writer.save`` — hypothesis-generated logical states (one case exercising each codec first,
  then random ones), saved by concurrent writer processes
  and one committer, then checked deeply and compared byte for byte; under tracing, every
  writer's and the committer's system calls are checked for durability and atomic publication
  (:mod:`conformance.trace`);
* ``writer.publish`` — a committed state A, then an attempt at B broken by one fault point;
  every fault point of :data:`~conformance.cases.FAULT_POINTS` runs at least once (stratified),
  the rest are drawn at random; kills are timed on the victim's progress (:mod:`conformance.procs`);
* ``writer.committer`` — crafted writer output for every refusal of §4.2 and commit conflicts
  (:mod:`conformance.committer`).

Each case runs in a directory of its own holding ``case.json``; a failed case's directory is kept
and ``writer --replay CASE_DIR`` runs it again. Everything else is removed unless
``keep_work``; nothing is written into the working directory (hypothesis' database is off and its
home directory is inside the work directory).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.cases import (
    CONTINUATIONS,
    FAULT_POINTS,
    STRATUM_RANKS,
    TABLE_MODES,
    CrashCase,
    EntrySpec,
    SaveCase,
    TensorSpec,
    case_from_json,
    case_to_json,
    crash_cases,
    new_attempt_id,
    save_cases,
)
from conformance.checker import check
from conformance.committer import (
    REFUSALS,
    Refusal,
    run_commit_same_step,
    run_commit_twice,
    run_refusal,
    run_valid_commit,
    run_wide_commit,
)
from conformance.jobs import PROTOCOL, commit_job, write_jobs
from conformance.procs import (
    Adapter,
    InfrastructureError,
    KillPlan,
    Outcome,
    count_trace_progress,
    new_run_dir,
    progress_mode,
)
from conformance.report import CaseResult, RunReport, shell_join
from conformance.schemas import SchemasUnavailable, load_schemas
from conformance.trace import (
    FsEvent,
    committer_problems,
    fs_events,
    outside_writes,
    parse_trace,
    tracing_status,
    writer_problems,
)
from conformance.verify import (
    HarnessFailure,
    coverage_hint,
    publish_invariants,
    verify_saved,
    writer_rule,
)

__all__ = [
    "PROTOCOL",
    "CrashCase",
    "EntrySpec",
    "HarnessFailure",
    "InfrastructureError",
    "Options",
    "SaveCase",
    "TensorSpec",
    "check_writer",
    "commit_job",
    "crash_cases",
    "new_attempt_id",
    "replay",
    "run_crash_case",
    "run_save_case",
    "run_suite",
    "save_cases",
    "stratify",
    "verify_saved",
    "write_jobs",
]

TRACING_MODES = ("require", "auto", "off")


@dataclass
class Options:
    """What a ``writer`` run does (the CLI options of the same names)."""

    examples: int = 10
    crash_examples: int = len(FAULT_POINTS)
    committer: bool = True
    codecs: tuple[str, ...] = ("none", "zstd")
    max_writers: int = 4
    seed: int | None = None
    workdir: str | None = None
    keep_work: bool = False
    timeout: float = 60.0
    shrink: bool = True
    tables: str = "sometimes"
    tracing: str = "require"
    shrink_time: float = 120.0  # seconds hypothesis may spend minimising failures, in all
    #: environment variables recorded in every case.json (``--record-env``), which ``--replay``
    #: sets again: a defect behind a feature flag of the adapter replays as it failed
    record_env: tuple[str, ...] = ()

    def validate(self) -> None:
        """Raise ``ValueError`` for options no run can satisfy."""
        if self.tables not in TABLE_MODES:
            raise ValueError(f"--tensor-table must be one of {TABLE_MODES}")
        if self.tracing not in TRACING_MODES:
            raise ValueError(f"--tracing must be one of {TRACING_MODES}")
        if min(self.examples, self.crash_examples) < 0 or self.max_writers < 1:
            raise ValueError("--examples and --crash-examples must be >= 0, --max-writers >= 1")
        if 0 < self.crash_examples < len(FAULT_POINTS):
            raise ValueError(f"--crash-examples must be 0 or at least {len(FAULT_POINTS)}, so "
                             f"that every fault point runs at least once ({', '.join(FAULT_POINTS)})")
        if not set(self.codecs) <= {"none", "zstd"} or not self.codecs:
            raise ValueError("--codec takes a comma-separated subset of none,zstd")
        if 0 < self.examples < len(self.codecs):
            raise ValueError(f"--examples must be 0 or at least {len(self.codecs)}, so that "
                             f"every codec of --codec {','.join(self.codecs)} is saved at least "
                             "once (or narrow --codec)")


# ------------------------------------------------------------------------------------ one save
def _adapter(cmd: list[str] | Adapter, timeout: float) -> Adapter:
    if isinstance(cmd, Adapter):
        return cmd
    return Adapter(cmd, timeout=timeout, trace=False)


def _root(workdir: Path) -> Path:
    """The checkpoint root of a case, created; absolute with symlinks resolved (as in traces)."""
    root = workdir / "root"
    root.mkdir(parents=True, exist_ok=True)
    return root.resolve()


@dataclass
class _Saved:
    attempt_id: str
    writers: list[Outcome]
    commit: Outcome


def _outside(who: str, events: list[FsEvent], root: Path) -> list[str]:
    paths = outside_writes(events, str(root))
    if not paths:
        return []
    shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
    return [f"{who}: wrote outside root: {shown}; an adapter writes only below root (the "
            "working directory is the user's: the protocol of the README)"]


def _trace_check(outcomes: list[Outcome], commit: Outcome | None, adapter: Adapter, root: Path,
                 aid: str, details: dict[str, Any] | None) -> None:
    problems: list[str] = []
    advice: list[str] = []
    for w, o in enumerate(outcomes):
        if o.trace is not None and o.rc == 0:
            calls, end = parse_trace(o.trace)
            events = fs_events(calls, str(adapter.cwd))
            problems += [f"writer {w}: {p}" for p in writer_problems(events, str(root), aid, w,
                                                                      end)]
            advice += _outside(f"writer {w}", events, root)
    if commit is not None and commit.trace is not None and commit.rc == 0:
        calls, end = parse_trace(commit.trace)
        events = fs_events(calls, str(adapter.cwd))
        errs, warns = committer_problems(events, str(root), aid, end)
        problems += [f"committer: {p}" for p in errs]
        advice += [f"committer: {p}" for p in warns] + _outside("committer", events, root)
    if details is not None and advice:
        details.setdefault("warnings", []).extend(advice)
    if problems:
        raise HarnessFailure("system-call trace: " + "; ".join(problems[:8]))


def _save(adapter: Adapter, case: SaveCase, root: Path, jobdir: Path,
          details: dict[str, Any] | None = None) -> _Saved:
    """Write and commit ``case``; then check what was saved, and only then the trace.

    The version is checked first (:func:`verify_saved`): a defect it shows (a symbolic link in
    the attempt, R-SEC-2, say) is named as such, not by a system-call check it upsets.
    """
    aid = new_attempt_id(case.step)
    outs = adapter.run_all(write_jobs(case, jobdir, root, aid))
    for w, o in enumerate(outs):
        if o.rc != 0:
            raise HarnessFailure(f"writer {w} failed (exit {o.rc}, {o.code}) on "
                                 f"{case.summary()}: {o.tail()}")
    c = adapter.run(commit_job(case, jobdir, root, aid))
    if c.rc != 0:
        hint = coverage_hint(root, aid, case) if c.code in ("PCK-COVERAGE-OVERLAP",
                                                            "PCK-COVERAGE-GAP") else ""
        raise HarnessFailure(f"commit failed (exit {c.rc}, {c.code}) on {case.summary()}: "
                             f"{c.tail()}{hint}{writer_rule(c.code) if hint else ''}")
    warned = verify_saved(root, aid, case)
    if details is not None and warned:  # the checker's warnings reach the writer's report
        details.setdefault("warnings", []).extend(f"checker: {w}" for w in warned)
    _trace_check(outs, c, adapter, root, aid, details)
    return _Saved(aid, outs, c)


def run_save_case(cmd: list[str] | Adapter, case: SaveCase, workdir: Path,
                  timeout: float = 60.0, details: dict[str, Any] | None = None) -> None:
    """Save ``case`` through the adapter and verify it."""
    adapter = _adapter(cmd, timeout)
    root = _root(workdir)
    _save(adapter, case, root, workdir / "jobs", details)
    rep = check(root, deep=False)
    if not rep.ok:
        raise HarnessFailure(f"root does not conform: {[e.to_json() for e in rep.errors[:3]]}")


# ----------------------------------------------------------------------------- one crash case
def _kill_plan(cc: CrashCase, first: _Saved, root: Path, jobdir: Path,
               mode: str) -> KillPlan | None:
    """Where to kill the victim: a share ``cc.at`` of what the same role did in save A."""
    if cc.fault not in ("kill-writer", "kill-commit"):
        return None
    role = first.writers if cc.fault == "kill-writer" else [first.commit]
    if mode == "trace":
        total = sum(count_trace_progress(o.trace, str(root)) for o in role) / len(role)
    elif mode == "proc" and cc.fault == "kill-writer":
        total = sum(p.stat().st_size for p in (jobdir / "chunks").glob(f"w{cc.victim}-*"))
    elif mode == "proc":
        total = sum(p.stat().st_size for p in root.rglob("index/*") if p.is_file()) / 2
    else:
        total = sum(o.seconds for o in role) / len(role) * 1000
    victim = cc.victim if cc.fault == "kill-writer" else 0
    return KillPlan(victim, max(1, math.ceil(cc.at * max(1.0, total))), mode, str(root))


def run_crash_case(cmd: list[str] | Adapter, cc: CrashCase, workdir: Path,
                   timeout: float = 60.0, details: dict[str, Any] | None = None) -> None:
    """Commit A, break an attempt at B with the fault, then check the publish invariants."""
    adapter = _adapter(cmd, timeout)
    root = _root(workdir)
    first = _save(adapter, cc.first, root, workdir / "jobs-a", details)
    b, jobdir = cc.second, workdir / "jobs-b"
    aid_b = new_attempt_id(b.step)
    kind, _, point = cc.fault.partition(":")
    jobs = write_jobs(b, jobdir, root, aid_b, {cc.victim: point} if kind == "write" else None)
    mode = progress_mode(adapter.trace)
    plan = _kill_plan(cc, first, root, jobdir, mode)
    outs = adapter.run_all(jobs, plan if kind == "kill-writer" else None)
    if kind == "write" and outs[cc.victim].rc == 0:
        raise HarnessFailure(f"writer {cc.victim} exited 0 although asked to fail at {point}")
    for w, o in enumerate(outs):
        if o.rc != 0 and w != cc.victim:
            raise HarnessFailure(f"writer {w} failed (exit {o.rc}): {o.tail()}")
    c = adapter.run(commit_job(b, jobdir, root, aid_b, point if kind == "commit" else None),
                    plan if kind == "kill-commit" else None)
    if details is not None and plan is not None:
        victim = outs[cc.victim] if kind == "kill-writer" else c
        details.update(kill_after=plan.after, kill_unit=plan.mode, killed=victim.killed)
    _publish_outcome(cc, root, first, aid_b, outs, c)
    # Processes of attempt B that ran to their end (exit 0) are held to the trace rules too.
    _trace_check(outs, c, adapter, root, aid_b, details)


def _publish_outcome(cc: CrashCase, root: Path, first: _Saved, aid_b: str, outs: list[Outcome],
                     c: Outcome) -> None:
    kind = cc.fault.partition(":")[0]
    committed_b = (root / aid_b / "manifest.json").exists()
    rcs = [o.rc for o in outs]
    # The rule each outcome breaks (outside CI review, finding 7): a committer refuses an
    # attempt whose writer left no index (§4.2), and one stopped before its publish is complete
    # leaves no commit record (R-COMMIT-7's atomic publish).
    rule = " (R-COMMIT-4: a committer publishes nothing while an expected writer's index is " \
        "missing, and reports PCK-WRITER-MISSING)" if kind == "write" else \
        " (R-COMMIT-7: the publish is atomic; a committer that fails before it completes " \
        "leaves no commit record)"
    if kind in ("write", "commit") and c.rc == 0:
        raise HarnessFailure(f"commit exited 0 after fault {cc.fault} (writers exit {rcs})"
                             + (rule if kind == "write" else ""))
    if kind == "write" and c.code not in (None, "PCK-WRITER-MISSING"):
        raise HarnessFailure(f"the committer reported {c.code} after writer {cc.victim} failed "
                             f"before writing its index; expected PCK-WRITER-MISSING{rule}")
    if committed_b and kind in ("write", "commit"):
        raise HarnessFailure(f"attempt {aid_b} became visible as committed after fault "
                             f"{cc.fault} (writers exit {rcs}, commit exit {c.rc}){rule}")
    # A writer SIGKILLed after its index was durable leaves a complete attempt; publishing it is
    # then correct, and the invariants check that B is complete and equal to its state.
    if c.rc == 0 and not committed_b:
        raise HarnessFailure("commit exited 0 but published no manifest.json")
    allowed = {first.attempt_id: cc.first}
    if committed_b:
        allowed[aid_b] = cc.second
    publish_invariants(root, allowed, aid_b if committed_b else first.attempt_id)


# ------------------------------------------------------------------------------------- driver
def stratify(n: int, points: tuple[str, ...] = FAULT_POINTS,
             rng: random.Random | None = None) -> dict[str, int]:
    """How many cases each fault point gets: one each first, the rest drawn at random."""
    counts = dict.fromkeys(points, 0)
    if n <= 0:
        return counts
    for p in points[:n]:
        counts[p] += 1
    r = rng or random.Random()
    for _ in range(n - len(points)):
        counts[r.choice(points)] += 1
    return counts


class _Run:
    """One ``writer`` run: adapter, work directory, hypothesis settings, collected results."""

    def __init__(self, cmd: list[str], opts: Options, report: RunReport,
                 subdir: bool = True) -> None:
        self.opts, self.report = opts, report
        self.seed = opts.seed if opts.seed is not None else random.SystemRandom().randrange(2**32)
        status = tracing_status() if opts.tracing != "off" else None
        self.tracing = bool(status and status.available)
        if opts.tracing == "require" and not self.tracing:
            raise InfrastructureError(f"system-call tracing is required for the durability and "
                                      f"atomic-publish checks but unavailable: "
                                      f"{status.detail if status else ''}; pass --tracing auto "
                                      "to run without them (reported as not checked)")
        self.cwd = Path.cwd()
        self.adapter = Adapter(cmd, timeout=opts.timeout, trace=self.tracing, cwd=self.cwd)
        self.adapter.preflight()
        self.own_run_dir = subdir or opts.workdir is None  # finish() may remove it all
        if opts.workdir is None:
            self.base = Path(tempfile.mkdtemp(prefix="pck-conformance-")).resolve()
        elif not subdir:  # --replay: a new case directory below the case directory replayed
            self.base = Path(opts.workdir).resolve()
        else:
            # A directory of this run's own below --workdir: runs sharing one work directory
            # (two CI jobs, a retry) never take or delete each other's case directories (outside
            # CI review, finding 3: a run's clean-up deleted the names its passed cases had
            # freed, which the other run had taken in the meantime).
            self.base = new_run_dir(Path(opts.workdir), "writer-")
        self.counter = 0
        self.shrunk = 0.0  # seconds spent minimising failures so far (--shrink-time's budget)
        self.keep: set[Path] = set()
        self.made: list[Path] = []
        report.info.update(seed=self.seed, adapter=cmd, cwd=str(self.cwd), workdir=str(self.base),
                           tracing={"used": self.tracing, "detail": status.detail if status
                                    else "--tracing off"},
                           kill_timing=progress_mode(self.tracing), fault_points={},
                           codec_strata=[], shrink_seconds={})

    # -- case directories ------------------------------------------------------------------
    def case_dir(self, suite: str, doc: dict[str, Any]) -> Path:
        # The next free name: the directory of a case replayed holds the case's own files and
        # earlier replays (review C1); a run's own directory holds only its cases.
        while True:
            self.counter += 1
            d = self.base / f"{suite.split('.')[-1]}-{self.counter:04d}"
            try:
                d.mkdir()
                break
            except FileExistsError:
                continue
        self.made.append(d)
        meta = {"protocol": PROTOCOL, "suite": suite, "seed": self.seed, "cmd": self.adapter.cmd,
                "cwd": str(self.cwd), "timeout": self.opts.timeout,
                "env": {k: os.environ[k] for k in self.opts.record_env if k in os.environ},
                **doc}
        (d / "case.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False))
        return d

    def replay_line(self, d: Path) -> str:
        line = shell_join([sys.executable, "-m", "conformance", "writer", "--replay", str(d)])
        return line if _installed() else f"cd {shell_join([str(self.cwd)])} && {line}"

    def finish(self) -> None:
        """Remove what this run made and does not keep; never a path it did not create."""
        if self.opts.keep_work:
            return
        for d in self.made:
            if d not in self.keep:
                shutil.rmtree(d, ignore_errors=True)
        self.made = [d for d in self.made if d in self.keep]
        shutil.rmtree(self.base / ".hypothesis", ignore_errors=True)
        if self.own_run_dir and not self.keep:
            shutil.rmtree(self.base, ignore_errors=True)

    # -- running one case ------------------------------------------------------------------
    def run_case(self, suite: str, name: str, doc: dict[str, Any],
                 fn: Callable[[Path, dict[str, Any]], None]) -> CaseResult:
        d = self.case_dir(suite, doc)
        details: dict[str, Any] = {}
        t0 = time.monotonic()
        try:
            fn(d, details)
        except InfrastructureError as exc:
            if "past --timeout" in str(exc):  # a hang may be the writer's: keep the evidence
                self.keep.add(d)
                raise InfrastructureError(
                    f"{exc}; case directory {d} (kept), seed {self.seed}; replay: "
                    f"{self.replay_line(d)}"
                ) from None
            raise
        except SchemasUnavailable:
            raise
        except Exception as exc:  # any failure of the adapter's output is the case's failure
            missing = self.adapter.cannot_import
            if missing is not None:  # the adapter's environment, not a verdict: no shrinking
                self.keep.add(d)
                raise InfrastructureError(
                    f"every adapter process so far died of an import error, last: {missing} "
                    f"(see the *.err files of {d}, kept): the interpreter that runs the adapter "
                    f"cannot import what it needs (the reference adapter needs portable_ckpt: "
                    f"pip install the repository into that Python); command: "
                    f"{shell_join(self.adapter.cmd)}") from None
            msg = str(exc) if isinstance(exc, HarnessFailure) else \
                f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
            return CaseResult(suite, name, "failed", msg, time.monotonic() - t0, self.seed,
                              str(d), self.replay_line(d), details)
        for w in details.get("warnings", []):
            if w not in self.report.warnings:
                self.report.warnings.append(w)
        if not self.opts.keep_work:  # a passed case leaves nothing behind
            shutil.rmtree(d, ignore_errors=True)
            self.made.remove(d)  # its name is free: finish() must not delete it again
        return CaseResult(suite, name, "passed", "", time.monotonic() - t0, self.seed,
                          str(d) if self.opts.keep_work else None, None, details)


def _installed() -> bool:
    """True when ``conformance`` is importable from anywhere (installed, not the checkout)."""
    here = Path(__file__).resolve().parent
    return "site-packages" in here.parts or "dist-packages" in here.parts


class _ShrinkTimeSpent(BaseException):
    """Ends a hypothesis run whose shrinking spent ``--shrink-time``.

    Not a failure: a BaseException, which hypothesis lets through.
    """


def _hypothesis(run: _Run, suite: str, strategy: Any, n: int,
                fn: Callable[[Any, Path, dict[str, Any]], None], label: Callable[[Any], str],
                seed: int, name: str) -> None:
    """Run ``fn`` on ``n`` examples of ``strategy``; report passes and the (shrunk) failure.

    Cases are named ``name #k`` (the k-th example) and the failure ``name: failing example``,
    whatever the seed drew, so a CI's test history follows them across runs (conformance
    review C9); what was drawn (``label``) is in the case's details and failure text.
    """
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    from hypothesis.reporting import with_reporter

    results: list[CaseResult] = []
    infra: list[InfrastructureError] = []
    failed_at: list[float] = []
    drawn = [0]
    # Never Phase.explain: after shrinking it runs random variations of the minimal example,
    # each a whole save here, and each failing one became "the last failure" that was reported
    # and kept (outside review 21b: the kept case was a random state, step 5799 and 3 writers,
    # after 60 s of --shrink-time, where the minimal one was step 0 and 2 writers).
    phases = [Phase.explicit, Phase.reuse, Phase.generate,
              *([Phase.shrink] if run.opts.shrink else [])]

    @hseed(seed)
    @settings(deadline=None, database=None, derandomize=False, print_blob=False,
              suppress_health_check=list(HealthCheck), phases=phases, max_examples=max(1, n))
    @given(case=strategy)
    def prop(case: Any) -> None:
        if infra:
            return
        if failed_at and run.shrunk + time.monotonic() - failed_at[0] > run.opts.shrink_time:
            # Shrinking ran out of time: the last failure (the smallest yet) is reported. The
            # budget is the whole run's: per failing suite and fault point, a writer that broke
            # every publish case shrank for 16 minutes (conformance review C5). Stopped through
            # hypothesis: returning let it try candidates for seconds more under load.
            raise _ShrinkTimeSpent
        drawn[0] += 1
        what = label(case)

        def body(d: Path, det: dict[str, Any]) -> None:
            det["drawn"] = what
            fn(case, d, det)

        try:
            r = run.run_case(suite, f"{name} #{drawn[0]}", {"case": case_to_json(case)}, body)
        except InfrastructureError as exc:
            infra.append(exc)
            return
        if r.failed:
            r.name = f"{name}: failing example"
            r.message = f"{what}: {r.message}"
        results.append(r)
        if r.failed:
            failed_at[:] = failed_at or [time.monotonic()]
            raise HarnessFailure(r.message)

    log: list[str] = []
    try:
        with with_reporter(lambda text: log.append(str(text))):
            prop()
    except _ShrinkTimeSpent:
        pass
    except Exception:  # the failure (or hypothesis' Flaky) is in `results` with its case
        if not any(r.failed for r in results) and not infra:
            raise
    finally:
        if failed_at:  # the time spent minimising a failure, which no case's seconds show
            spent = time.monotonic() - failed_at[0]
            run.shrunk += spent
            shrink = run.report.info.setdefault("shrink_seconds", {})
            shrink[suite] = round(shrink.get(suite, 0.0) + spent, 1)
    _collect(run, results, log)  # also before an infrastructure error: the cases done
    if infra:
        raise infra[0]


def _collect(run: _Run, results: list[CaseResult], log: list[str]) -> None:
    """Passes before the first failure, and the last failure (hypothesis' minimal example)."""
    first_fail = next((i for i, r in enumerate(results) if r.failed), len(results))
    run.report.cases += results[:first_fail]
    fails = [r for r in results if r.failed]
    if fails:
        final = fails[-1]
        final.details["hypothesis"] = "\n".join(log)[-4000:]
        run.keep.add(Path(final.case_dir or ""))
        run.report.cases.append(final)


def _save_suite(run: _Run) -> None:
    """One case per codec first (each exercising that codec), then the rest drawn at random.

    The codec strata also ask for the continuations of :data:`~conformance.cases.CONTINUATIONS`
    in turn: the first a statistical contract with a mesh, the second exact without one; and
    for the world sizes of :data:`~conformance.cases.STRATUM_RANKS`: the first for more ranks
    than writers, the second for one rank per writer.

    The suite stops at its first failure (minimised), as one hypothesis run would.
    """
    o = run.opts
    if o.examples <= 0:
        return
    run.report.info["codec_strata"] = list(o.codecs)
    strata = [(save_cases(o.max_writers, (c,), tables=o.tables, exercise=True,
                          continuation_kind=CONTINUATIONS[i % len(CONTINUATIONS)],
                          rank_kind=STRATUM_RANKS[i % len(STRATUM_RANKS)]), 1,
               run.seed + 1000 + i) for i, c in enumerate(o.codecs)]
    strata.append((save_cases(o.max_writers, o.codecs, tables=o.tables),
                   o.examples - len(o.codecs), run.seed))
    names = [f"save (codec {c} stratum)" for c in o.codecs] + ["save"]
    for (strategy, n, seed), name in zip(strata, names, strict=True):
        if n <= 0 or any(c.failed for c in run.report.cases if c.suite == "writer.save"):
            return
        _hypothesis(run, "writer.save", strategy, n,
                    lambda c, d, det: run_save_case(run.adapter, c, d, details=det),
                    _save_label, seed, name)


def _save_label(c: SaveCase) -> str:
    ranks = f" for {c.ranks()} rank(s)" if c.ranks() != c.num_writers else ""
    return f"step {c.step}: {c.num_writers} writer(s){ranks}, codec {c.codec}, {len(c.tensors)} " \
           f"tensor(s), {len(c.entries)} entr(y/ies){', table' if c.tensor_table else ''}"


def _publish_suite(run: _Run) -> None:
    o = run.opts
    counts = stratify(o.crash_examples, FAULT_POINTS, random.Random(run.seed))
    run.report.info["fault_points"] = counts
    for i, (fault, n) in enumerate(counts.items()):
        if n == 0:
            continue
        _hypothesis(run, "writer.publish", crash_cases(min(o.max_writers, 3), o.codecs, o.tables,
                                                       fault=fault), n,
                    lambda c, d, det: run_crash_case(run.adapter, c, d, details=det),
                    lambda c: f"{c.fault} (victim {c.victim}, at {c.at:.2f})", run.seed + i + 1,
                    f"publish {fault}")


def _committer_suite(run: _Run) -> None:
    if not run.opts.committer:
        return
    tables = {"never": [False], "always": [True], "sometimes": [False, True]}[run.opts.tables]
    for t in tables:
        def valid(d: Path, det: dict[str, Any], t: bool = t) -> None:
            run_valid_commit(run.adapter, d, t, det)

        label = " (tensor table asked)" if t else ""
        run.report.cases.append(run.run_case(
            "writer.committer", f"commits a conforming attempt{label}",
            {"kind": "committer", "name": "valid", "tables": t}, valid))
    run.report.cases.append(run.run_case(
        "writer.committer", "PCK-COMMIT-CONFLICT: second commit of a committed attempt",
        {"kind": "committer", "name": "commit-twice", "tables": False},
        lambda d, det: run_commit_twice(run.adapter, d, details=det)))
    run.report.cases.append(run.run_case(
        "writer.committer", "R-COMMIT-16: a second version of a step commits after the first",
        {"kind": "committer", "name": "same-step", "tables": False},
        lambda d, det: run_commit_same_step(run.adapter, d, details=det)))

    def wide(d: Path, det: dict[str, Any]) -> None:
        run_wide_commit(run.adapter, d, details=det)

    run.report.cases.append(run.run_case(
        "writer.committer", "R-COMMIT-5: commits a job of 3 ranks saved by 2 writers (world "
        "size is not the number of writers)",
        {"kind": "committer", "name": "world-size-not-writers", "tables": False}, wide))
    for r in REFUSALS:
        def refuse(d: Path, det: dict[str, Any], r: Refusal = r) -> None:
            run_refusal(run.adapter, r, d)

        run.report.cases.append(run.run_case(
            "writer.committer", f"{r.code}: {r.name} ({r.what})",
            {"kind": "committer", "name": r.name, "tables": False}, refuse))
    for c in run.report.cases:
        if c.suite == "writer.committer" and c.failed:
            run.keep.add(Path(c.case_dir or ""))


def _trace_note(run: _Run) -> None:
    if not run.tracing:
        detail = run.report.info["tracing"]["detail"]
        run.report.cases.append(CaseResult(
            "writer.trace", "durability and atomic publish (system-call trace)", "skipped",
            f"NOT CHECKED: tracing unavailable ({detail})"))
        run.report.warnings.append(f"durability (fsync) and atomic-publish (link, no rename, no "
                                   f"direct write) checks were NOT run: {detail}")


def run_suite(cmd: list[str], opts: Options, report: RunReport) -> None:
    """Run every suite against ``cmd``, appending the results to ``report``.

    Raises:
        ValueError: options no run can satisfy (a usage error).
        SchemasUnavailable: the normative schemas are missing or incomplete.
        InfrastructureError: the adapter could not be run (not found, past the timeout, tracing
            required and unavailable).

    """
    from hypothesis.configuration import set_hypothesis_home_dir

    opts.validate()
    load_schemas().require_complete()  # a run that cannot validate proves nothing
    run = _Run(cmd, opts, report)
    set_hypothesis_home_dir(run.base / ".hypothesis")  # never ./.hypothesis
    try:
        _trace_note(run)
        _save_suite(run)
        _publish_suite(run)
        _committer_suite(run)
    finally:
        run.finish()


def replay(case_dir: Path, report: RunReport, cmd: list[str] | None = None,
           tracing: str = "auto") -> None:
    """Run the case of ``case_dir/case.json`` again (in a new directory below it)."""
    load_schemas().require_complete()
    try:
        meta = json.loads((case_dir / "case.json").read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{case_dir} is not a case directory of a writer run: cannot read its "
                         f"case.json ({exc.strerror or exc})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{case_dir / 'case.json'} is not a case description (a JSON object)")
    try:
        run, suite, fn = _replay_setup(case_dir, meta, cmd, tracing, report)
    except (KeyError, TypeError, StopIteration) as exc:
        raise ValueError(f"{case_dir / 'case.json'} is not a complete case description "
                         f"({type(exc).__name__}: {exc})") from None
    report.cases.append(run.run_case(suite, f"replay of {case_dir.name}",
                                     {k: v for k, v in meta.items() if k in ("kind", "name",
                                                                              "case", "tables")},
                                     fn))


def _replay_setup(case_dir: Path, meta: dict[str, Any], cmd: list[str] | None, tracing: str,
                  report: RunReport) -> tuple[_Run, str, Callable[[Path, dict[str, Any]], None]]:
    """The run, suite and case function that :func:`replay` runs, from ``case.json``."""
    env = meta.get("env") or {}
    if not isinstance(env, dict):
        raise TypeError("env is not an object")
    for name, value in env.items():  # what the run recorded (--record-env); set here wins
        os.environ.setdefault(str(name), str(value))
    opts = Options(workdir=str(case_dir), keep_work=True, tracing=tracing,
                   timeout=float(meta.get("timeout", 60.0)), seed=meta.get("seed"),
                   record_env=tuple(str(k) for k in env))
    cwd = Path(meta.get("cwd") or Path.cwd())
    try:
        os.chdir(cwd)  # relative adapter paths resolve as in the original run
    except OSError as exc:
        raise ValueError(f"the recorded working directory {cwd} of {case_dir} cannot be "
                         f"entered: {exc.strerror or exc}") from None
    run = _Run(cmd or list(meta["cmd"]), opts, report, subdir=False)
    run.counter = sum(1 for _ in case_dir.iterdir())
    suite = meta["suite"]
    if meta.get("kind") == "committer":
        name, tables = meta["name"], bool(meta.get("tables"))
        fn: Callable[[Path, dict[str, Any]], None]
        if name == "valid":
            def fn(d: Path, det: dict[str, Any]) -> None:
                run_valid_commit(run.adapter, d, tables, det)
        elif name == "commit-twice":
            def fn(d: Path, det: dict[str, Any]) -> None:
                run_commit_twice(run.adapter, d, tables, det)
        elif name == "same-step":
            def fn(d: Path, det: dict[str, Any]) -> None:
                run_commit_same_step(run.adapter, d, tables, det)
        elif name == "world-size-not-writers":
            def fn(d: Path, det: dict[str, Any]) -> None:
                run_wide_commit(run.adapter, d, tables, det)
        else:
            refusal = next(r for r in REFUSALS if r.name == name)

            def fn(d: Path, det: dict[str, Any]) -> None:
                run_refusal(run.adapter, refusal, d, tables)
    else:
        case = case_from_json(meta["case"])

        def fn(d: Path, det: dict[str, Any]) -> None:
            if isinstance(case, CrashCase):
                run_crash_case(run.adapter, case, d, details=det)
            else:
                run_save_case(run.adapter, case, d, details=det)
    return run, suite, fn


def check_writer(cmd: list[str], *, examples: int = 10, crash_examples: int = len(FAULT_POINTS),
                 committer: bool = False, codecs: tuple[str, ...] = ("none", "zstd"),
                 seed: int | None = None, workdir: str | None = None, max_writers: int = 4,
                 timeout: float = 60.0, shrink: bool = True, tables: str = "sometimes",
                 tracing: str = "auto", keep_work: bool = False) -> RunReport:
    """Run the suites against ``cmd`` and raise :class:`HarnessFailure` on the first failure."""
    report = RunReport("writer", cmd)
    run_suite(cmd, Options(examples, crash_examples, committer, codecs, max_writers, seed,
                           workdir, keep_work, timeout, shrink, tables, tracing), report)
    if report.failures:
        f = report.failures[0]
        raise HarnessFailure(f"{f.suite}: {f.name}: {f.message} [case {f.case_dir}]")
    return report
