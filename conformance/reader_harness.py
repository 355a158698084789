"""The golden vectors run against any reader (spec §20): ``portable-ckpt-conformance reader``.

For every case of the reader and checker sets (:data:`~conformance.vectors.VECTOR_DIRS`; the
retention sets are ``gc``'s) the harness copies the case into the run's own work directory
(``materialize``: its ``setup`` applied, its ``expected.json`` left out) as a directory with
a neutral name, ``c<12 hex digits>``, so that the path names neither the case nor its set (the
report and the replay line do), writes a job file
``{"op": "read", "target": <absolute path>, "verification_status": <bool>}``
and runs ``CMD ... JOB.json`` once (the adapter protocol of the writer and gc harnesses: the
job file's absolute path is the last argument). The adapter opens ``target`` (a root: its
latest version; or a version directory), reads every tensor whole and every entry (each rank
of a per-rank entry at the saved world size), verifying every checksum block it reads
(R-CKSUM-3: a whole read reaches every block, so every defect of a case), and prints one line
on standard output::

    {"ok": true, "attempt_id": "...", "step": 10,
     "tensors": {key: {"dtype": "float32", "shape": [4, 3], "hex": "<little-endian C-order>"}},
     "entries": {name: value, per_rank_name: {"per_rank": {"0": value, ...}}},
     "failed_verification": true | false | null}      # only when the job asks for it

or ``{"ok": false, "code": "PCK-...", "message": "..."}`` (the last standard-output line that
is a JSON object with a boolean ``ok`` counts). Then it compares:

* a valid case, or an invalid one marked ``"reader": "accept"`` (a rule that binds writers
  only: a reader reads it): ``ok``, the version's ``attempt_id`` and ``step``, exactly the
  expected tensor keys with the same ``dtype``, ``shape`` and bytes, and exactly the expected
  entries, JSON values compared with their types (``1`` is not ``1.0``, ``true`` is not
  ``1``); a failure names the tensor or entry, the first differing byte (offset, element, the
  bytes got and expected) or the JSON path of the first differing value;
* an invalid case: not ``ok`` and exactly the case's ``code`` (for ``PCK-CHECKSUM``, a
  ``message``, optional, must name the damaged file by its path below the version, R-CKSUM-4;
  separated by a slash or a backslash); ``ok`` is a failure naming the
  rule the case breaks (the rule ids of its ``feature``), a wrong code one naming both codes;
  a case's ``deep`` (its defect lies in data blocks, which only a checker's deep verification
  reads, R-VERSION-13) concerns metadata-only checkers, not readers: the job never asks for a
  deep verification (a reader that verified data blocks only when asked passed every case);
* a case with ``failed_verification`` (sets 1.2 and errata-16): the job says
  ``"verification_status": true`` and the line's ``failed_verification`` must equal the case's
  (``null``: unknown to a tool of 1.x, R-DRILL-12); ``--no-verification-status`` (a reader
  that never chooses a version to restore) leaves it out of jobs and unchecked, and a run in
  which that left a case's status unchecked is a partial pass (exit 6; a skipped case
  ``reader.verification_status``), as the writer's run without its system-call checks.

A case whose adapter does not end within ``--timeout`` is that case's failure; one that
prints no result line (a crash) too.

``--known-failures FILE`` (a JSON list of case names and objects ``{"case": NAME, "got":
"ok" | "PCK-..." | null}``, or an object of case names and why) lets a team adopt the vectors
before its reader passes all of them: a listed case that fails as listed is ``skipped`` (its
failure kept in the message) and the run, if nothing else failed, ends with exit 6, a partial
pass (not exit 0: the reader does not conform); a listed case that passes is a failure (the
list shrinks as the reader is fixed, so a listed case cannot hide its next regression), and so
is one whose outcome is not its pinned ``got`` (``null``: no result line), or, listed by name
alone, an invalid case read without error (excused only when pinned as ``"got": "ok"``); a
name that is no reader case, or with a set that is not the case's, is a usage error. The
report's ``known_failures`` lists each excused case with its ``got``: a list the file may hold.
"""

from __future__ import annotations

import functools
import json
import re
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.procs import Adapter, AdapterTimeout, InfrastructureError, Outcome, hung
from conformance.report import CaseResult, RunReport, shell_join
from conformance.store import crc32c
from conformance.strictjson import loads_text
from conformance.vectors import RETENTION_DIRS, VECTOR_DIRS, all_cases, materialize

__all__ = ["KnownFailure", "ReaderOptions", "damaged_files", "judge", "load_known_failures",
           "result_line", "rules_of", "run_reader_vectors", "same_json"]

#: Bytes shown on each side of a difference in tensor data.
SHOWN = 8
#: A rule id of the spec in a case's ``feature``.
RULE_RE = re.compile(r"\bR-[A-Z0-9]+-[0-9]+\b")


@dataclass(frozen=True)
class ReaderOptions:
    """What the ``reader`` command was asked."""

    set_name: str | None = None
    timeout: float = 60.0
    verification_status: bool = True
    workdir: str | None = None
    keep_work: bool = False
    cases: tuple[str, ...] = ()  # only these (by name); empty: every case
    known_failures: str | None = None  # the --known-failures FILE
    jobs: int = 1  # cases run at once, each its own adapter process (--jobs)


@dataclass(frozen=True)
class KnownFailure:
    """One case of ``--known-failures``: why (``""`` when not said) and its pinned outcome."""

    why: str = ""
    pinned: bool = False
    got: str | None = None  # "ok", a code, or None (no result line); when pinned


#: what a pinned ``got`` may be: ``"ok"``, an error code, or null
_GOT_RE = re.compile(r"^(ok|PCK-[A-Z0-9-]+)$")


def load_known_failures(path: str, known: dict[str, str]) -> dict[str, KnownFailure]:
    """The cases ``path`` lists as known failures, by name.

    ``path`` holds a JSON list whose items are case names or objects ``{"case": NAME, "got":
    "ok" | "PCK-..." | null, "why": "..."}`` (``got`` pins the observed outcome, ``why`` is
    optional), or an object ``{name: why}``; a name may carry its set
    (``errata-3/writer-index-disagrees``), which must be the case's set. ``known``: every
    reader case's name, with its set.

    Raises:
        ValueError: the file cannot be read, is not such a document, names no reader case, or
            names a case with another set.

    """
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"--known-failures {path}: {exc}") from None
    what = (f"--known-failures {path}: not a JSON list of case names and objects "
            "{\"case\": NAME, \"got\": \"ok\" | \"PCK-...\" | null}, nor an object of case "
            "names and strings")
    items: list[tuple[str, KnownFailure]] = []
    if isinstance(doc, dict) and all(isinstance(v, str) for v in doc.values()):
        items = [(str(n), KnownFailure(why)) for n, why in doc.items()]
    elif isinstance(doc, list):
        for item in doc:
            if isinstance(item, str):
                items.append((item, KnownFailure()))
            elif isinstance(item, dict) and isinstance(item.get("case"), str) \
                    and set(item) <= {"case", "got", "why"} \
                    and isinstance(item.get("why", ""), str):
                got = item.get("got")
                if "got" in item and not (got is None or (isinstance(got, str)
                                                          and _GOT_RE.match(got))):
                    raise ValueError(f"{what}: \"got\" of {item['case']!r} is {_show(got)}")
                items.append((item["case"], KnownFailure(item.get("why", ""), "got" in item,
                                                         got)))
            else:
                raise ValueError(f"{what}: {_show(item)}")
    else:
        raise ValueError(what)
    out: dict[str, KnownFailure] = {}
    unknown: list[str] = []
    for name, entry in items:
        set_name, _, case = name.rpartition("/")
        if case not in known:
            unknown.append(name)
        elif set_name and set_name != known[case]:
            raise ValueError(f"--known-failures {path} names {name!r}, but {case!r} is a case "
                             f"of set {known[case]} ({known[case]}/{case})")
        else:
            out[case] = entry
    if unknown:
        raise ValueError(f"--known-failures {path} names no reader case "
                         f"{', '.join(map(repr, unknown[:5]))}"
                         + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""))
    return out


def rules_of(case: dict[str, Any]) -> list[str]:
    """The rule ids the case record names (in its ``feature``), in order, once each."""
    return list(dict.fromkeys(RULE_RE.findall(str(case.get("feature", "")))))


def result_line(stdout: str) -> tuple[dict[str, Any] | None, str]:
    """The adapter's result: the last standard-output line that is a JSON object with ``ok``.

    That line must be strict JSON: no duplicate keys, no ``NaN``/``Infinity``, no number out of
    a double's range (``1e400``), no leading byte order mark; such a last line is not passed
    over for an earlier one. Returns ``(result, problem)``: ``(None, why)`` when there is none,
    ``why`` saying what is wrong with the last line that looked like one (``""`` when no line
    did); a ``why`` that starts with "the last result line" is the adapter's fault for sure.
    """
    hint = ""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        bom = line.startswith("\ufeff")
        bare = line.lstrip("\ufeff").strip()
        if not bare.startswith("{"):
            continue
        try:  # the lenient reading says whether the line means to be the result line
            meant = json.loads(bare)
        except (ValueError, RecursionError) as exc:
            if '"ok"' in line and not hint:
                hint = f"a line that is not JSON ({str(exc)[:120]}): {line[:120]}"
            continue
        if not isinstance(meant, dict) or "ok" not in meant:
            continue
        if bom:
            return None, ("the last result line starts with a UTF-8 byte order mark (U+FEFF), "
                          f"which the protocol's line may not: {bare[:120]}")
        try:
            doc = loads_text(bare)
        except (ValueError, RecursionError) as exc:
            return None, f"the last result line is not strict JSON ({str(exc)[:120]}): " \
                f"{line[:120]}"
        return doc, ""
    return None, hint


def same_json(got: Any, want: Any, path: str) -> str:
    """``""`` when ``got`` is ``want`` with the same JSON types, else the first difference.

    ``1`` and ``1.0`` differ, so do ``true`` and ``1``; object keys are compared as sets.
    """
    if type(got) is not type(want):
        return (f"{path}: got {_show(got)} ({_kind(got)}), expected {_show(want)} "
                f"({_kind(want)})")
    if isinstance(want, dict):
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        if missing or extra:
            return (f"{path}: " + "; ".join(
                ([f"missing key(s) {', '.join(map(repr, missing[:5]))}"] if missing else [])
                + ([f"unexpected key(s) {', '.join(map(repr, extra[:5]))}"] if extra else [])))
        for k in want:
            diff = same_json(got[k], want[k], f"{path}[{json.dumps(k, ensure_ascii=False)}]")
            if diff:
                return diff
        return ""
    if isinstance(want, list):
        if len(got) != len(want):
            return f"{path}: a list of {len(got)} items, expected {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            diff = same_json(g, w, f"{path}[{i}]")
            if diff:
                return diff
        return ""
    if got != want or (isinstance(want, float) and str(got) != str(want)):  # -0.0 is not 0.0
        return f"{path}: got {_show(got)}, expected {_show(want)}"
    return ""


def _kind(v: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number with a fraction or exponent",
            str: "string", list: "array", dict: "object", type(None): "null"}.get(
                type(v), type(v).__name__)


def _show(v: Any) -> str:
    text = json.dumps(v, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _bytes_diff(key: str, got_hex: Any, want: dict[str, Any]) -> str:
    """The first difference of a tensor's bytes (offset, element, bytes got and expected)."""
    if not isinstance(got_hex, str):
        return f"tensor {key!r}: \"hex\" is {_show(got_hex)}, not a string of hex digits"
    try:
        got = bytes.fromhex(got_hex)
    except ValueError:
        return f"tensor {key!r}: \"hex\" is not hex digits: {got_hex[:40]!r}"
    exp = bytes.fromhex(want["hex"])
    if got == exp:
        return ""
    n = 1
    for d in want["shape"]:
        n *= d
    size = len(exp) // n if n else 0
    at = next((i for i, (a, b) in enumerate(zip(got, exp, strict=False)) if a != b),
              min(len(got), len(exp)))
    lo = at - at % size if size else at
    where = f"byte {at}" + (f" (element {at // size} in C order, {size} bytes each)"
                            if size else "")
    text = (f"tensor {key!r} ({want['dtype']} {want['shape']}): bytes differ from {where}: "
            f"got {got[lo:lo + SHOWN].hex() or '(end)'}, expected "
            f"{exp[lo:lo + SHOWN].hex() or '(end)'}")
    if len(got) != len(exp):
        text += f"; {len(got)} bytes, expected {len(exp)}"
    return text


def _tensor_problems(got: Any, want: dict[str, Any]) -> list[str]:
    if not isinstance(got, dict):
        return [f"\"tensors\" is {_show(got)}, not an object"]
    out: list[str] = []
    missing = [k for k in want if k not in got]
    extra = [k for k in got if k not in want]
    if missing:
        out.append(f"tensor(s) {', '.join(map(repr, missing[:5]))} not read "
                   f"({len(missing)} of {len(want)} missing)")
    if extra:
        out.append(f"tensor(s) {', '.join(map(repr, extra[:5]))} read that the version does "
                   "not hold")
    for key, w in want.items():
        g = got.get(key)
        if key not in got:
            continue
        if not isinstance(g, dict):
            out.append(f"tensor {key!r}: {_show(g)}, not {{\"dtype\", \"shape\", \"hex\"}}")
            continue
        if g.get("dtype") != w["dtype"]:
            out.append(f"tensor {key!r}: dtype {_show(g.get('dtype'))}, expected "
                       f"{w['dtype']!r}")
            continue
        shape_diff = same_json(g.get("shape"), w["shape"], "shape")
        if shape_diff:
            out.append(f"tensor {key!r}: {shape_diff}")
            continue
        diff = _bytes_diff(key, g.get("hex"), w)
        if diff:
            out.append(diff)
    return out


def _entry_problems(got: Any, want: dict[str, Any]) -> list[str]:
    if not isinstance(got, dict):
        return [f"\"entries\" is {_show(got)}, not an object"]
    out: list[str] = []
    missing = [k for k in want if k not in got]
    extra = [k for k in got if k not in want]
    if missing:
        out.append(f"entr(ies) {', '.join(map(repr, missing[:5]))} not read")
    if extra:
        out.append(f"entr(ies) {', '.join(map(repr, extra[:5]))} read that the version does not "
                   "hold")
    for name, w in want.items():
        if name in got:
            diff = same_json(got[name], w, f"entry {name!r}")
            if diff:
                out.append(diff)
    return out


def damaged_files(version: Path) -> list[str]:
    """The files of ``version`` whose checksum blocks do not match its manifest.

    ``version``: a version directory; relative paths below it (``[]`` without a manifest).
    """
    try:
        files = json.loads((version / "manifest.json").read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    out: list[str] = []
    for rel, record in sorted(files.items()):
        try:
            data = (version / rel).read_bytes()
            size = int(record["checksum"]["block_size"])
            blocks = "".join(f"{crc32c(data[i:i + size]):08x}"
                             for i in range(0, len(data), size))
            if blocks != record["checksum"]["blocks"]:
                out.append(rel)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def judge(case: dict[str, Any], expected: dict[str, Any] | None, result: dict[str, Any],
          verification_status: bool = True, damaged: list[str] | None = None) -> list[str]:
    """The failures of a reader's ``result`` line on ``case`` (``[]``: it passed).

    ``expected``: the case's ``expected.json`` (a valid case, or ``"reader": "accept"``).
    ``damaged``: the files of a ``PCK-CHECKSUM`` case whose blocks do not match
    (:func:`damaged_files`): a ``message``, when given, must name one (R-CKSUM-4).
    """
    rules = rules_of(case)
    why = f" ({', '.join(rules)})" if rules else ""
    ok = result.get("ok")
    if not isinstance(ok, bool):
        return [f"\"ok\" is {_show(ok)}, not true or false (the protocol's result line)"]
    if expected is None:  # an invalid case a reader refuses
        want = case["code"]
        if ok:
            deep = (" (a defect in data blocks, which a whole read reaches: every block read "
                    "is verified, R-CKSUM-3)") if case.get("deep") else ""
            return [f"read an invalid case without error: expected {want}{why}{deep}: "
                    f"{case['feature']}"]
        got = result.get("code")
        if got != want:
            message = str(result.get("message", ""))[:300]
            return [f"reported {_show(got) if not isinstance(got, str) else got}, expected "
                    f"{want}{why}" + (f": {message}" if message else "")
                    + f" (the case: {case['feature']})"]
        said = result.get("message")
        if want == "PCK-CHECKSUM" and damaged and isinstance(said, str) and said \
                and not any(rel in said or rel.replace("/", "\\") in said for rel in damaged):
            return [f"reported {want}, but its message does not name the damaged file "
                    f"{' or '.join(map(repr, damaged))} (R-CKSUM-4: a checksum failure names "
                    f"the file, by its path below the version): {said[:300]}"]
        return []
    if not ok:
        kind = ("a case a reader reads (\"reader\": \"accept\": the rule it breaks binds "
                f"writers only; a checker reports {case.get('code')})"
                if not case["valid"] else "a valid case")
        return [f"refused {kind}: reported {result.get('code')}"
                + (f": {str(result.get('message'))[:300]}" if result.get("message") else "")
                + f" (the case: {case['feature']})"]
    failures: list[str] = []
    for member in ("attempt_id", "step"):
        if member in expected:
            diff = same_json(result.get(member), expected[member], member)
            if diff:
                failures.append(f"opened another version: {diff} (R-ID-4: a root's latest "
                                "committed version, invalid commit records skipped, R-READ-1)"
                                if member == "attempt_id" else diff)
    failures += _tensor_problems(result.get("tensors"), expected.get("tensors", {}))
    failures += _entry_problems(result.get("entries"), expected.get("entries", {}))
    if verification_status and "failed_verification" in case:
        want_fv = case["failed_verification"]
        if "failed_verification" not in result:
            failures.append("no \"failed_verification\" in the result line (the job asked "
                            "for it: \"verification_status\": true; --no-verification-status "
                            "for a reader that never chooses a version to restore)")
        else:
            diff = same_json(result["failed_verification"], want_fv, "failed_verification")
            if diff:
                failures.append(f"{diff}{why or ' (R-DRILL-8)'}")
    return failures


def run_reader_vectors(cmd: list[str], opts: ReaderOptions, report: RunReport) -> None:
    """Run every reader case of the golden vectors (or ``opts.set_name``) through ``CMD``.

    Raises:
        ValueError: an unknown set or case name, a retention set or case, a ``--workdir``
            that is a file (usage errors).
        InfrastructureError: the adapter cannot be started, every process of it died of an
            import error, or the work directory cannot be made.

    """
    if opts.set_name is not None and opts.set_name not in VECTOR_DIRS:
        if opts.set_name in RETENTION_DIRS:
            raise ValueError(f"--set {opts.set_name} holds retention vectors: run them "
                             "through a gc (`portable-ckpt-conformance gc`)")
        raise ValueError(f"--set must be one of {', '.join(VECTOR_DIRS)}")
    known = {c["name"]: s for s, _, c in all_cases()}
    unknown = [n for n in opts.cases if n not in known]
    if unknown:
        raise ValueError(f"no reader case is named {', '.join(map(repr, unknown))} (retention "
                         "cases run with `gc`)")
    elsewhere = [n for n in opts.cases if opts.set_name not in (None, known[n])]
    if elsewhere:
        raise ValueError("--case " + ", ".join(f"{n} is a case of set {known[n]}"
                                               for n in elsewhere)
                         + f", not of --set {opts.set_name}: nothing of it would run")
    listed = {} if opts.known_failures is None else load_known_failures(opts.known_failures,
                                                                        known)
    adapter = Adapter(list(cmd), timeout=opts.timeout, trace=False)
    adapter.preflight()
    if opts.workdir is not None and Path(opts.workdir).exists() \
            and not Path(opts.workdir).is_dir():
        raise ValueError(f"--workdir {opts.workdir} exists and is not a directory")
    try:
        if opts.workdir is None:
            work = Path(tempfile.mkdtemp(prefix="pck-reader-vectors-"))
        else:  # a directory of this run's own: runs sharing --workdir do not meet
            Path(opts.workdir).mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(prefix="reader-", dir=opts.workdir))
    except OSError as exc:
        raise InfrastructureError(f"cannot make the work directory: {exc}") from None
    report.info["workdir"] = str(work)
    report.info["verification_status"] = opts.verification_status
    t0 = time.monotonic()
    unasked: list[str] = []  # the cases whose verification status was not asked
    chosen = [(set_name, vdir, case) for set_name, vdir, case in all_cases()
              if opts.set_name in (None, set_name)
              and (not opts.cases or case["name"] in opts.cases)]

    def take(i: int, result: CaseResult) -> None:
        set_name, _vdir, case = chosen[i]
        if not opts.verification_status and "failed_verification" in case:
            unasked.append(f"{set_name}/{case['name']}")
        if case["name"] in listed:
            result = _known(result, case, cmd, listed[case["name"]], opts,
                            expects_refusal=_expects_refusal(case))
        report.cases.append(result)

    try:  # --jobs N: N cases at once, each its own adapter process; reported in order
        adapter.run_cases([functools.partial(_run_case, adapter, cmd, set_name, vdir, case,
                                             work, opts) for set_name, vdir, case in chosen],
                          opts.jobs, take)
    except BaseException:
        report.seconds = time.monotonic() - t0
        raise  # the work directory stays: the message may name a case in it
    report.seconds = time.monotonic() - t0
    report.info["verification_status_unchecked"] = unasked
    if unasked:  # as the writer's writer.trace: a pass without them is no certification
        report.cases.append(CaseResult(
            "reader.verification_status", "verification status (R-DRILL-8, R-DRILL-12)",
            "skipped", f"NOT CHECKED (--no-verification-status): the status of "
            f"{len(unasked)} case(s) ({', '.join(unasked[:3])}"
            f"{', ...' if len(unasked) > 3 else ''}) was neither asked nor checked"))
        report.warnings.append(
            f"the verification status (failed_verification, R-DRILL-8, R-DRILL-12) of "
            f"{len(unasked)} case(s) was NOT checked (--no-verification-status): exit 6, a "
            "partial pass")
    # each with what it got: the list a team writes to --known-failures from a report
    report.info["known_failures"] = [{"case": c.name, "got": c.details.get("got")}
                                     for c in report.cases if c.details.get("known_failure")]
    if not opts.keep_work and not any(c.failed or c.details.get("known_failure")
                                      for c in report.cases):
        shutil.rmtree(work, ignore_errors=True)


def _expects_refusal(case: dict[str, Any]) -> bool:
    """Whether a reader must refuse ``case`` (invalid, and not ``"reader": "accept"``)."""
    return not case["valid"] and case.get("reader") != "accept"


def _got_text(got: Any) -> str:
    return "no result line (null)" if got is None else json.dumps(got)


def _known(result: CaseResult, case: dict[str, Any], cmd: list[str], entry: KnownFailure,
           opts: ReaderOptions, expects_refusal: bool) -> CaseResult:
    """``result`` of a case ``--known-failures`` lists: a failure is excused, a pass is not.

    A failure is excused only as it was: a pinned ``got`` must be the outcome observed; an
    entry without one excuses any failure but reading an invalid case without error.
    """
    where = f"--known-failures {opts.known_failures}"
    why = f": {entry.why}" if entry.why else ""
    if not result.failed:
        result.status = "failed"
        result.message = (f"{result.name}: passes, but {where} lists it as a known failure: "
                          "remove it from the list (a listed case that passes would hide its "
                          "next regression)")
        result.replay = _replay(case, cmd)
        return result
    got = result.details.get("got")
    changed = ""
    if entry.pinned and got != entry.got:
        changed = (f"the known failure changed: got {_got_text(got)}, pinned "
                   f"{_got_text(entry.got)} in {where}{why}")
    elif not entry.pinned and expects_refusal and got == "ok":
        changed = (f"read an invalid case without error, which {where} excuses only when "
                   f"pinned as {{\"case\": \"{result.name}\", \"got\": \"ok\"}} (a plain name "
                   "excuses a wrong code, a crash or a hang, not a reader that accepts damaged "
                   "data)")
    if changed:
        result.message = f"{result.name}: {changed}\n{result.message}"
        return result
    result.status = "skipped"
    result.details["known_failure"] = True
    result.message = (f"known failure (listed in {where}{why}), not a pass: {result.message}")
    return result


def _run_case(adapter: Adapter, cmd: list[str], set_name: str, vdir: Path,
              case: dict[str, Any], work: Path, opts: ReaderOptions) -> CaseResult:
    name = f"{set_name}/{case['name']}"
    t0 = time.monotonic()
    # A neutral name: the path the reader is given names neither the case nor its set (a
    # reader that looked its answers up by the path passed every case); the report names it.
    cdir = _neutral_dir(work)
    stage = Path(tempfile.mkdtemp(prefix=".stage-", dir=work))
    target = cdir / str(case["target"])
    materialize(case, stage, vdir)
    (stage / case["name"]).rename(cdir)
    stage.rmdir()
    expected: dict[str, Any] | None = None
    if case.get("expected") and (case["valid"] or case.get("reader") == "accept"):
        expected = json.loads((vdir / case["expected"]).read_text(encoding="utf-8"))
    # the reader is not handed the answers (it may still find them in the suite's package)
    (cdir / Path(str(case.get("expected") or "expected.json")).name).unlink(missing_ok=True)
    asked = opts.verification_status and "failed_verification" in case
    # found before the adapter runs: the files a checksum failure's message must name
    damaged = damaged_files(target) if case.get("code") == "PCK-CHECKSUM" else []
    job = cdir / "job.json"
    job.write_text(json.dumps({"op": "read", "target": str(target.resolve()),
                               "verification_status": asked}, indent=1) + "\n",
                   encoding="utf-8")
    details: dict[str, Any] = {"valid": case["valid"], "code": case.get("code"),
                               "reader": case.get("reader"), "deep": bool(case.get("deep")),
                               "rules": rules_of(case), "feature": case["feature"], "rc": None,
                               "got": None}
    if asked:
        details["failed_verification"] = case["failed_verification"]
    try:
        out = adapter.run(job)
    except AdapterTimeout:
        # A reader that does not end on a case (a loop on a hostile layout) is that case's
        # failure, with its directory kept; the run goes on.
        return CaseResult("reader", name, "failed",
                          f"{name}: {hung('a reader that hangs on this case', opts.timeout)}",
                          time.monotonic() - t0,
                          case_dir=str(cdir), replay=_replay(case, cmd), details=details)
    details["rc"] = out.rc
    stdout = out.out.read_text(encoding="utf-8", errors="replace") if out.out.exists() else ""
    result, problem = result_line(stdout)
    if result is None and problem.startswith("the last result line"):
        failures = [f"{problem}; exit status {out.rc}"]
    elif result is None:
        failures = [f"no result line on standard output ({{\"ok\": ...}}, the adapter "
                    f"protocol){': ' + problem if problem else ''}; the reader crashed? exit "
                    f"status {out.rc}; {out.tail(600)}"]
    else:
        details["got"] = "ok" if result.get("ok") is True else result.get("code")
        failures = judge(case, expected, result, opts.verification_status, damaged)
    if failures:
        message = f"{name}: " + "\n".join(failures) + _output_note(out)
        return CaseResult("reader", name, "failed", message, time.monotonic() - t0,
                          case_dir=str(cdir), replay=_replay(case, cmd), details=details)
    if not opts.keep_work:
        shutil.rmtree(cdir, ignore_errors=True)
    return CaseResult("reader", name, "passed", "", time.monotonic() - t0,
                      case_dir=str(cdir) if cdir.exists() else None, details=details)


def _neutral_dir(work: Path) -> Path:
    """A new name ``c<12 hex digits>`` in ``work``, not yet there."""
    while True:
        cdir = work / f"c{secrets.token_hex(6)}"
        if not cdir.exists():
            return cdir


def _output_note(out: Outcome) -> str:
    return f"\nadapter exit status {out.rc}; its output: {out.out}, {out.err}"


def _replay(case: dict[str, Any], cmd: list[str]) -> str:
    """The command that runs ``case`` again (case names are unique across sets)."""
    return shell_join(["portable-ckpt-conformance", "reader", "--case", case["name"],
                       "--keep-work", "--", *cmd])
