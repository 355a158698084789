"""The command line as a CI job sees it: exit codes, --json / --junit-xml, replay, clean-up."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conformance.spec import (
    FORMAT_VERSIONS,
    NEWEST_FORMAT_VERSION,
    NEWEST_MINOR,
    VERSIONS_TEXT,
    newer_minor,
)
from conformance.vectors import RETENTION_DIRS, VECTOR_DIRS, load_cases, materialize

from .conftest import BAD_WRITER, MINIMAL_WRITER, REPO, TRACING, needs_tracing

QUICK = ["--examples", "1", "--codec", "zstd", "--crash-examples", "0", "--no-committer",
         "--tracing", "auto"]
#: the exit status of a QUICK run that passes: 6 where ``--tracing auto`` finds no strace
QUICK_PASS = 0 if TRACING else 6


def _run(args: list[str], cwd: Path, tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmp), **env)
    if "PCK_SPEC_SCHEMAS" not in env:
        e.pop("PCK_SPEC_SCHEMAS", None)
    return subprocess.run([sys.executable, "-m", "conformance", *args], cwd=cwd, env=e,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture
def dirs(fast_tmp: Path) -> tuple[Path, Path]:
    """An empty working directory and an empty TMPDIR: both must stay empty."""
    cwd, tmp = fast_tmp / "cwd", fast_tmp / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    return cwd, tmp


def test_check_exit_codes_and_reports(dirs: tuple[Path, Path], fast_tmp: Path) -> None:
    cwd, tmp = dirs
    valid = next(c for c in load_cases() if c["valid"])
    invalid = next(c for c in load_cases() if not c["valid"] and not c.get("setup"))
    ok = _run(["check", str(materialize(valid, fast_tmp / "v")), "--junit-xml",
               str(fast_tmp / "ok.xml")], cwd, tmp)
    assert ok.returncode == 0 and "conformant" in ok.stdout, ok.stderr
    suite = ET.parse(fast_tmp / "ok.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "0" and int(suite.get("tests", 0)) >= 1
    target = materialize(invalid, fast_tmp / "i")
    bad = _run(["check", "--deep", str(target), "--json"], cwd, tmp)
    assert bad.returncode == 1
    doc = json.loads(bad.stdout)
    # --json before the path: the path is not taken for the report file (it was exit 2)
    same = _run(["check", "--deep", "--json", str(target)], cwd, tmp)
    assert same.returncode == 1 and json.loads(same.stdout)["errors"] == doc["errors"]
    assert doc["exit_code"] == 1 and not doc["ok"]
    assert invalid["code"] in {e["code"] for e in doc["errors"]}
    (fail,) = doc["failures"]
    assert fail["replay"].startswith("portable-ckpt-conformance check --deep ")
    assert invalid["code"] in fail["details"]["codes"]
    # review C8: a path that does not exist is nothing checked (2), not "not conformant" (1)
    gone = _run(["check", str(fast_tmp / "no-such-root")], cwd, tmp)
    assert gone.returncode == 2 and "does not exist" in gone.stderr, gone.stdout + gone.stderr
    assert list(cwd.iterdir()) == [] and list(tmp.iterdir()) == []


def test_missing_schemas_are_a_hard_error(dirs: tuple[Path, Path], fast_tmp: Path) -> None:
    """No schemas: exit 3, never "conformant" with validation skipped."""
    cwd, tmp = dirs
    valid = materialize(next(c for c in load_cases() if c["valid"]), fast_tmp / "v")
    r = _run(["check", str(valid), "--schemas", str(fast_tmp / "none")], cwd, tmp)
    assert r.returncode == 3 and "conformant" not in r.stdout, r.stdout
    partial = fast_tmp / "partial"
    partial.mkdir()
    (partial / "manifest.schema.json").write_text("{}")
    r = _run(["check", str(valid), "--json"], cwd, tmp, PCK_SPEC_SCHEMAS=str(partial))
    assert r.returncode == 3 and "lacks" in r.stderr
    w = _run(["writer", *QUICK, "--", *MINIMAL_WRITER], cwd, tmp,
             PCK_SPEC_SCHEMAS=str(partial))
    assert w.returncode == 3, w.stderr


def test_vendored_without_spec_is_not_a_pass(dirs: tuple[Path, Path], fast_tmp: Path) -> None:
    """Issue 17: `conformance/` copied into another tree without `spec/` warned "schema
    validation skipped" and reported conformant. Its schema link now dangles: exit 3."""
    cwd, tmp = dirs
    vendor = fast_tmp / "vendor"
    shutil.copytree(REPO / "conformance", vendor / "conformance", symlinks=True,
                    ignore=shutil.ignore_patterns("vectors", "tests", "__pycache__"))
    valid = materialize(next(c for c in load_cases() if c["valid"]), fast_tmp / "v")
    env = dict(os.environ, PYTHONPATH=str(vendor), TMPDIR=str(tmp))
    env.pop("PCK_SPEC_SCHEMAS", None)
    for args in (["check", str(valid)], ["writer", *QUICK, "--", *MINIMAL_WRITER]):
        r = subprocess.run([sys.executable, "-m", "conformance", *args], cwd=cwd, env=env,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 3, (args, r.stdout, r.stderr)
        assert "conformant" not in r.stdout and "passed" not in r.stdout
    assert list(cwd.iterdir()) == [] and list(tmp.iterdir()) == []


def test_a_committer_that_does_nothing_fails(dirs: tuple[Path, Path]) -> None:
    """Issue 17's `writer --examples 0 --crash-examples 0 -- true` passed; the committer cases
    run by default, and a committer that publishes nothing and refuses nothing fails them."""
    cwd, tmp = dirs
    r = _run(["writer", "--examples", "0", "--crash-examples", "0", "--tracing", "auto",
              "--json", "-", "--", "true"], cwd, tmp)
    assert r.returncode == 1, r.stdout + r.stderr
    counts = json.loads(r.stdout)["counts"]["writer.committer"]
    assert counts["passed"] == 0 and counts["failed"] >= 20, counts


def test_zero_cases_usage_and_infrastructure_codes(dirs: tuple[Path, Path]) -> None:
    cwd, tmp = dirs
    zero = _run(["writer", "--examples", "0", "--crash-examples", "0", "--no-committer", "--",
                 *MINIMAL_WRITER], cwd, tmp)
    assert zero.returncode == 3 and "zero cases" in zero.stderr
    few = _run(["writer", "--crash-examples", "3", "--", *MINIMAL_WRITER], cwd, tmp)
    assert few.returncode == 2 and "every fault point" in few.stderr
    one = _run(["writer", "--examples", "1", "--", *MINIMAL_WRITER], cwd, tmp)  # two codecs
    assert one.returncode == 2 and "every codec" in one.stderr
    assert _run(["writer", "--bogus"], cwd, tmp).returncode == 2
    assert _run(["writer"], cwd, tmp).returncode == 2
    for cmd in (["/nonexistent/adapter"], [sys.executable, "missing_adapter.py"],
                ["no-such-adapter-command"]):
        r = _run(["writer", *QUICK, "--", *cmd], cwd, tmp)
        assert r.returncode == 4 and "infrastructure" in r.stderr, (cmd, r.stderr)
    reports = tmp.parent / "reports"
    reports.mkdir()
    hang = _run(["writer", *QUICK, "--timeout", "2", "--json", str(reports / "r.json"),
                 "--junit-xml", str(reports / "r.xml"), "--", sys.executable, "-c",
                 "import time; time.sleep(60)"], cwd, tmp)
    assert hang.returncode == 4 and "--timeout" in hang.stderr
    # Review C4: the reports held no case ("0 tests" in a CI tab on a red step)
    doc = json.loads((reports / "r.json").read_text())
    assert [c["status"] for c in doc["cases"]] == ["error"], doc["cases"]
    assert "--timeout" in doc["cases"][0]["message"]
    xml = (reports / "r.xml").read_text()
    assert 'errors="1"' in xml and "<error " in xml, xml
    # a hang may be the writer's own: its case is kept and named, with the seed and a replay
    kept = hang.stderr.split("case directory ", 1)[1].split(" (kept)", 1)[0]
    assert Path(kept).is_dir() and "seed " in hang.stderr and "--replay" in hang.stderr
    for left in tmp.iterdir():  # the kept case, which the fixture would call a leftover
        shutil.rmtree(left)
    # tracing required (the default) but no strace on PATH
    no_strace = _run(["writer", *QUICK[:-2], "--", *MINIMAL_WRITER], cwd, tmp, PATH=str(cwd))
    assert no_strace.returncode == 4 and "--tracing auto" in no_strace.stderr
    assert list(cwd.iterdir()) == [] and list(tmp.iterdir()) == []


def test_untraced_run_says_not_checked(dirs: tuple[Path, Path], fast_tmp: Path) -> None:
    """``--tracing off`` is a deliberate opt-out: exit 0, ``ok``, the checks NOT CHECKED."""
    cwd, tmp = dirs
    r = _run(["writer", *QUICK[:-2], "--tracing", "off", "--junit-xml", str(fast_tmp / "r.xml"),
              "--json", str(fast_tmp / "r.json"), "--", *MINIMAL_WRITER], cwd, tmp)
    assert r.returncode == 0 and "NOT CHECKED" in r.stdout, r.stdout + r.stderr
    skipped = [tc for tc in ET.parse(fast_tmp / "r.xml").getroot().iter("testcase")
               if tc.find("skipped") is not None]
    assert skipped and "durability" in str(skipped[0].get("name"))
    doc = json.loads((fast_tmp / "r.json").read_text())
    assert doc["ok"] and doc["verdict"] == "pass" and not doc["tracing"]["used"]
    # Outside review 21b, finding 9: a passed case had no `message`, `case_dir` or `replay`
    # (a KeyError for a CI parser), `shrink_seconds` only after a shrink. All always there.
    keys = {"suite", "name", "status", "message", "seconds", "seed", "case_dir", "replay",
            "details"}
    assert all(set(c) == keys for c in doc["cases"]), doc["cases"]
    passed = next(c for c in doc["cases"] if c["status"] == "passed")
    assert passed["message"] == "" and passed["replay"] is None and passed["case_dir"] is None
    assert doc["shrink_seconds"] == {} and doc["fault_points"] == dict.fromkeys(
        doc["fault_points"], 0)
    assert set(doc["counts"]["writer.save"]) == {"passed", "failed", "skipped", "error"}


def test_an_untraced_auto_pass_is_not_exit_0(dirs: tuple[Path, Path], fast_tmp: Path) -> None:
    """Outside review 21b, finding 4: `--tracing auto` without strace passed a writer that never
    fsyncs and writes manifest.json in place with exit 0 and ``"ok": true``. Such a pass is
    exit 6, ``ok`` false, ``verdict`` "partial"; a failure is still 1."""
    cwd, tmp = dirs
    rep = fast_tmp / "r.json"
    r = _run(["writer", *QUICK, "--json", str(rep), "--junit-xml", str(fast_tmp / "r.xml"),
              "--", *MINIMAL_WRITER], cwd, tmp, PATH=str(cwd))  # no strace on PATH
    assert r.returncode == 6, r.stdout + r.stderr
    # The JUnit report says so too, as a property of every suite (a CI parser that reads only
    # the XML saw passes and one skipped case: the stop-23 review's left-open item).
    for suite in ET.parse(fast_tmp / "r.xml").getroot().iter("testsuite"):
        props = {p.get("name"): p.get("value") for p in suite.iter("property")}
        assert props["exit_code"] == "6" and props["verdict"] == "partial", props
    assert "WITHOUT the system-call checks" in r.stdout and "NOT CHECKED" in r.stdout
    doc = json.loads(rep.read_text())
    assert doc["exit_code"] == 6 and not doc["ok"] and doc["verdict"] == "partial"
    assert "not a certification" in doc["exit_meaning"]
    assert doc["counts"]["writer.save"]["failed"] == 0
    bad = _run(["writer", *QUICK, "--no-shrink", "--", *BAD_WRITER], cwd, tmp, PATH=str(cwd),
               PCK_BAD_MODE="wrong-crc")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    for left in tmp.iterdir():  # the failing case is kept
        shutil.rmtree(left)
    from conformance.report import EXIT_CODES

    assert set(EXIT_CODES) == {0, 1, 2, 3, 4, 5, 6}
    table = (REPO / "conformance" / "README.md").read_text().split("## Exit status", 1)[1]
    assert "\n| 6 | " in table.split("## Reports", 1)[0]


def test_an_adapter_that_cannot_import_is_infrastructure(dirs: tuple[Path, Path],
                                                         fast_tmp: Path) -> None:
    """Outside review 21b, finding 3: the reference adapter run by a Python without
    portable_ckpt failed every case with ModuleNotFoundError and the run reported "not
    conformant" (exit 1) after two minutes of minimising. Every process dead of an import
    error is an infrastructure error (4) at the first case, without shrinking. An adapter
    whose writers run and whose committer alone cannot import is still a verdict (1)."""
    cwd, tmp = dirs
    script = fast_tmp / "adapter.py"
    script.write_text("import no_such_module_of_the_adapter  # noqa\n")
    rep = fast_tmp / "r.json"
    t0 = time.monotonic()
    r = _run(["writer", "--examples", "2", "--crash-examples", "7", "--json", str(rep), "--",
              sys.executable, str(script)], cwd, tmp)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "import error" in r.stderr and "no_such_module_of_the_adapter" in r.stderr
    assert "minimising" not in r.stdout + r.stderr and time.monotonic() - t0 < 60
    doc = json.loads(rep.read_text())
    assert doc["verdict"] == "none" and [c["status"] for c in doc["cases"]] == ["error"]
    for left in tmp.iterdir():  # the case with the adapters' *.err is kept
        shutil.rmtree(left)
    half = fast_tmp / "half.py"
    half.write_text(
        "import json, runpy, sys\n"
        "if json.load(open(sys.argv[-1]))['phase'] == 'commit':\n"
        "    import no_such_module_of_the_committer  # noqa\n"
        f"sys.argv = [{str(MINIMAL_WRITER[-1])!r}, sys.argv[-1]]\n"
        f"runpy.run_path({str(MINIMAL_WRITER[-1])!r}, run_name='__main__')\n")
    r = _run(["writer", *QUICK, "--no-shrink", "--", sys.executable, str(half)], cwd, tmp)
    assert r.returncode == 1 and "no_such_module_of_the_committer" in r.stdout, \
        r.stdout + r.stderr
    for left in tmp.iterdir():
        shutil.rmtree(left)
    # Re-review 21c, 1: a module imported inside the job's work (a codec's), whatever job
    # comes first, is the writer's failure (1), not its environment's (4).
    lazy = fast_tmp / "lazy.py"
    lazy.write_text("def write_job():\n    import no_such_codec_module  # noqa\n\nwrite_job()\n")
    r = _run(["writer", *QUICK, "--no-shrink", "--", sys.executable, str(lazy)], cwd, tmp)
    assert r.returncode == 1 and "no_such_codec_module" in r.stdout, r.stdout + r.stderr
    for left in tmp.iterdir():
        shutil.rmtree(left)


@needs_tracing
def test_failure_reports_replay_and_cleanup(dirs: tuple[Path, Path], fast_tmp: Path) -> None:
    """A failing run: JSON and JUnit name seed, case directory and a replay line that fails the
    same way; passing cases leave nothing, the failing case directory stays. (`no-fsync` fails
    every save, the empty state too: its writer index is never synced.)"""
    cwd, tmp = dirs
    rep, xml = fast_tmp / "r.json", fast_tmp / "r.xml"
    r = _run(["writer", "--examples", "3", "--crash-examples", "0", "--no-committer",
              "--seed", "5", "--no-shrink", "--json", str(rep),
              "--junit-xml", str(xml), "--", *BAD_WRITER], cwd, tmp, PCK_BAD_MODE="no-fsync")
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads(rep.read_text())
    (fail,) = doc["failures"]
    assert fail["seed"] == 5 and doc["seed"] == 5 and "fsync" in fail["message"]
    case_dir = Path(fail["case_dir"])
    assert (case_dir / "case.json").is_file() and case_dir.parent.parent == tmp
    assert sorted(p.name for p in case_dir.parent.iterdir()) == [case_dir.name]
    failure = next(tc for tc in ET.parse(xml).getroot().iter("testcase")
                   if tc.find("failure") is not None).find("failure")
    assert failure is not None and str(case_dir) in str(failure.text)
    assert "replay: " in str(failure.text) and "seed: 5" in str(failure.text)
    again = subprocess.run(fail["replay"], shell=True, capture_output=True, text=True,
                           cwd=cwd, env=dict(os.environ, PCK_BAD_MODE="no-fsync",
                                             PYTHONPATH=str(REPO), TMPDIR=str(tmp)), timeout=600)
    assert again.returncode == 1 and "fsync" in again.stdout, again.stdout + again.stderr
    fixed = subprocess.run([*shlex.split(fail["replay"].split("&& ")[-1])], capture_output=True,
                           text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                           timeout=600)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr  # PCK_BAD_MODE unset: it passes
    assert list(cwd.iterdir()) == []


def test_replay_sets_the_recorded_environment(dirs: tuple[Path, Path], fast_tmp: Path) -> None:
    """Outside review 21b, finding 13: a defect behind an environment variable of the adapter
    (a feature flag; PCK_BAD_MODE here) passed on replay. ``--record-env NAME`` records it in
    case.json and ``--replay`` sets it again; the replay's own environment wins."""
    cwd, tmp = dirs
    rep = fast_tmp / "r.json"
    r = _run(["writer", *QUICK, "--no-shrink", "--record-env", "PCK_BAD_MODE", "--json",
              str(rep), "--", *BAD_WRITER], cwd, tmp, PCK_BAD_MODE="wrong-crc")
    assert r.returncode == 1, r.stdout + r.stderr
    case_dir = Path(json.loads(rep.read_text())["failures"][0]["case_dir"])
    meta = json.loads((case_dir / "case.json").read_text())
    assert meta["env"] == {"PCK_BAD_MODE": "wrong-crc"}
    again = _run(["writer", "--replay", str(case_dir), "--tracing", "auto"], cwd, tmp)
    assert again.returncode == 1 and "PCK-CHECKSUM" in again.stdout, again.stdout + again.stderr
    fixed = _run(["writer", "--replay", str(case_dir), "--tracing", "auto"], cwd, tmp,
                 PCK_BAD_MODE="")
    assert fixed.returncode == QUICK_PASS, fixed.stdout + fixed.stderr
    work = fast_tmp / "work"  # nothing is recorded unless asked: an environment holds secrets
    plain = _run(["writer", *QUICK, "--workdir", str(work), "--keep-work", "--",
                  *MINIMAL_WRITER], cwd, tmp, SECRET_TOKEN="x")
    assert plain.returncode == QUICK_PASS, plain.stdout + plain.stderr
    (kept,) = work.glob("writer-*/save-*/case.json")  # below the run's own directory
    assert json.loads(kept.read_text())["env"] == {}
    for left in tmp.iterdir():
        shutil.rmtree(left)


def test_keep_work_and_workdir(dirs: tuple[Path, Path], fast_tmp: Path) -> None:
    cwd, tmp = dirs
    work = fast_tmp / "work"
    r = _run(["writer", *QUICK, "--workdir", str(work), "--keep-work", "--", *MINIMAL_WRITER],
             cwd, tmp)
    assert r.returncode == QUICK_PASS, r.stderr
    (run,) = work.iterdir()  # the run's own directory (finding 3 of the outside CI review)
    assert run.name.startswith("writer-")
    (case,) = [p for p in run.iterdir() if p.name.startswith("save-")]
    assert (case / "case.json").is_file() and list(case.rglob("manifest.json"))
    r = _run(["writer", *QUICK, "--workdir", str(work / "again"), "--", *MINIMAL_WRITER],
             cwd, tmp)
    assert r.returncode == QUICK_PASS and list((work / "again").iterdir()) == []
    # Review C1: a --workdir holding an earlier run's case (kept, or a run beside this one)
    # crashed the run with FileExistsError, exit 1 ("not conformant"), no report.
    again = _run(["writer", *QUICK, "--workdir", str(work), "--", *MINIMAL_WRITER], cwd, tmp)
    assert again.returncode == QUICK_PASS, again.stderr
    assert (case / "case.json").is_file()  # the earlier case is left alone
    assert list(cwd.iterdir()) == [] and list(tmp.iterdir()) == []


@needs_tracing
def test_full_default_run_of_the_minimal_writer(dirs: tuple[Path, Path], fast_tmp: Path) -> None:
    """The default suites (small) with tracing required: JSON counts per suite, every fault
    point, the committer table; nothing left behind."""
    assert TRACING
    cwd, tmp = dirs
    r = _run(["writer", "--examples", "2", "--json", "-", "--", *MINIMAL_WRITER], cwd, tmp)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["tracing"]["used"] and doc["counts"]["writer.publish"]["passed"] == 7
    assert doc["codec_strata"] == ["none", "zstd"] and doc["counts"]["writer.save"]["passed"] == 2
    assert set(doc["fault_points"].values()) == {1}
    assert doc["counts"]["writer.committer"]["failed"] == 0
    assert doc["counts"]["writer.committer"]["passed"] >= 20
    assert list(cwd.iterdir()) == [] and list(tmp.iterdir()) == []


def test_help_shows_defaults_and_exit_codes(dirs: tuple[Path, Path]) -> None:
    cwd, tmp = dirs
    top = _run(["--help"], cwd, tmp)
    assert "exit status" in top.stdout and "infrastructure" in top.stdout
    w = _run(["writer", "--help"], cwd, tmp)
    assert "(default: 10)" in w.stdout and "(default: require)" in w.stdout


# -- errata 4: exit codes a CI gate reads -------------------------------------------------------
def _schema_copy(base: Path, name: str, edit: str) -> Path:
    d = base / name
    shutil.copytree(REPO / "spec" / "schemas", d)
    if edit == "no-verification":
        (d / "verification.schema.json").unlink()
    elif edit == "no-errata":
        shutil.rmtree(d / "errata")
    elif edit == "no-table-ref":
        (d / "1.1" / "table-ref.schema.json").unlink()
    elif edit == "released-errata":  # a pre-errata pattern (lookahead) in the errata's place
        shutil.copy(d / "common.schema.json", d / "errata" / "common.schema.json")
    elif edit == "broken-ref":
        m = d / "1.1" / "manifest.schema.json"
        m.write_text(m.read_text().replace("table-ref.schema.json", "table-reff.schema.json"))
    return d


@pytest.mark.parametrize(("edit", "message"), [
    ("no-verification", "lacks verification.schema.json"),
    ("no-errata", "lacks errata/common.schema.json, errata/copy.schema.json"),
    ("no-table-ref", "lacks 1.1/table-ref.schema.json"),
    ("released-errata", "outside the portable subset"),
    ("broken-ref", "does not resolve"),
])
def test_incomplete_schemas_are_exit_3(edit: str, message: str, dirs: tuple[Path, Path],
                                       fast_tmp: Path) -> None:
    """FP-6, CRASH-2: every schema the checker uses is required; a directory without one (or a
    pre-errata copy) is exit 3 with a message, never a skipped validation or a traceback."""
    cwd, tmp = dirs
    schemas = _schema_copy(fast_tmp, edit, edit)
    table = next(c for c in load_cases(VECTOR_DIRS["1.1"]) if c["name"] == "valid-table-none")
    target = materialize(table, fast_tmp / "v", VECTOR_DIRS["1.1"])
    r = _run(["check", str(target), "--schemas", str(schemas)], cwd, tmp)
    assert r.returncode == 3 and message in r.stderr, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "conformant" not in r.stdout
    if edit == "no-verification":
        w = _run(["writer", *QUICK, "--", *MINIMAL_WRITER], cwd, tmp,
                 PCK_SPEC_SCHEMAS=str(schemas))
        assert w.returncode == 3 and message in w.stderr, w.stderr


def test_replay_of_no_case_directory_is_a_usage_error(dirs: tuple[Path, Path],
                                                      fast_tmp: Path) -> None:
    """CRASH-3: a message and exit 2, no traceback (and nothing created at the path)."""
    cwd, tmp = dirs
    empty, broken = fast_tmp / "empty", fast_tmp / "broken"
    empty.mkdir()
    broken.mkdir()
    (broken / "case.json").write_text('{"suite": "writer.save"}')
    for path, says in ((fast_tmp / "nonexistent" / "case", "not a case directory"),
                       (empty, "not a case directory"), (broken, "not a complete case")):
        r = _run(["writer", "--replay", str(path)], cwd, tmp)
        assert r.returncode == 2 and says in r.stderr, (path, r.stderr)
        assert "Traceback" not in r.stderr
    assert not (fast_tmp / "nonexistent").exists()
    assert list(cwd.iterdir()) == [] and list(tmp.iterdir()) == []


def test_exit_codes_a_ci_gate_reads(dirs: tuple[Path, Path], fast_tmp: Path) -> None:
    """LOW-1: a file to check is a usage error (2); a report that cannot be written keeps a
    failing verdict (1) and turns a passing one into 4; `python -m` of a missing module is an
    infrastructure error (4) found before any case runs."""
    cwd, tmp = dirs
    afile = fast_tmp / "afile"
    afile.write_text("x")
    r = _run(["check", str(afile)], cwd, tmp)
    assert r.returncode == 2 and "not a directory" in r.stderr, r.stdout + r.stderr
    valid = materialize(next(c for c in load_cases() if c["valid"]), fast_tmp / "v")
    invalid_case = next(c for c in load_cases() if not c["valid"] and not c.get("setup")
                        and not c.get("deep"))
    invalid = materialize(invalid_case, fast_tmp / "i")
    nowhere = str(fast_tmp / "no-such-dir" / "r.json")
    bad = _run(["check", str(invalid), "--json", nowhere], cwd, tmp)
    assert bad.returncode == 1 and "cannot write the report" in bad.stderr, bad.stderr
    good = _run(["check", str(valid), "--json", nowhere], cwd, tmp)
    assert good.returncode == 4 and "cannot write the report" in good.stderr, good.stderr
    t0 = time.monotonic()
    m = _run(["writer", *QUICK, "--", sys.executable, "-m", "no_such_adapter_module"], cwd, tmp)
    assert m.returncode == 4 and "no_such_adapter_module" in m.stderr, m.stdout + m.stderr
    assert "infrastructure" in m.stderr and time.monotonic() - t0 < 60
    ok = _run(["writer", *QUICK, "--", sys.executable, "-m", "conformance.examples.minimal_writer"],
              cwd, tmp)
    assert ok.returncode == QUICK_PASS, ok.stdout + ok.stderr  # a module that exists runs
    assert list(cwd.iterdir()) == [] and list(tmp.iterdir()) == []


def test_the_json_path_rewrite_leaves_an_adapters_arguments_alone(tmp_path: Path) -> None:
    """``check --json ROOT`` reads ROOT as the path; the rewrite also changed an adapter's own
    ``--json DIR`` after ``--`` in a writer run (attack review F5)."""
    from conformance.cli import _json_before_path

    d = str(tmp_path)
    assert _json_before_path(["check", "--json", d]) == ["check", "--json=-", d]
    writer = ["writer", "--json", "r.json", "--", "python", "a.py", "--json", d]
    assert _json_before_path(writer) == writer
    check = ["check", d, "--", "--json", d]
    assert _json_before_path(check) == check


def test_a_bug_of_the_suite_is_exit_5_with_its_reports(dirs: tuple[Path, Path]) -> None:
    """Review C1: an exception of the suite itself exited 1, "not conformant", and wrote no
    report: a correct writer got a red verdict. It is exit 5, with the reports written."""
    cwd, tmp = dirs
    code = (
        "import sys, conformance.checker as c\n"
        "def boom(*a, **k): raise FileNotFoundError('a directory removed meanwhile')\n"
        "c.check = boom\n"
        "from conformance.cli import main\n"
        f"sys.exit(main(['check', '--json', {str(tmp / 'r.json')!r}, {str(cwd)!r}]))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert r.returncode == 5, r.stdout + r.stderr
    assert "internal error of portable-ckpt-conformance" in r.stderr
    doc = json.loads((tmp / "r.json").read_text())
    assert doc["exit_code"] == 5 and doc["cases"][0]["status"] == "error"
    assert "a directory removed meanwhile" in doc["cases"][0]["message"]
    (tmp / "r.json").unlink()


@needs_tracing
def test_the_shrink_budget_is_the_whole_runs(dirs: tuple[Path, Path], fast_tmp: Path) -> None:
    """Review C5: --shrink-time bounded each failing suite (and fault point) on its own: a
    writer that broke every publish case spent about 16 minutes minimising with the default.
    It is now the whole run's: the time spent in all suites stays within it (plus the one
    example running when it ran out)."""
    cwd, tmp = dirs
    rep = fast_tmp / "r.json"
    r = _run(["writer", "--examples", "2", "--crash-examples", "7", "--no-committer", "--seed",
              "3", "--shrink-time", "1", "--json", str(rep), "--", *BAD_WRITER], cwd, tmp,
             PCK_BAD_MODE="no-dir-fsync")
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads(rep.read_text())
    spent = doc.get("shrink_seconds", {})
    longest = max(c["seconds"] for c in doc["cases"])
    assert sum(spent.values()) <= 1 + 2 * longest + 1, (spent, longest)
    for left in tmp.iterdir():  # the failing cases are kept
        shutil.rmtree(left)


def test_case_names_do_not_depend_on_the_seed(fast_tmp: Path) -> None:
    """JUnit names were the drawn states (`step 118: 3 writer(s), codec none, ...`), new in
    every run of a random seed: a CI's test history could not follow a case (review C9). The
    names are the example's place now; what was drawn is in the details. A failure is
    `…: failing example`, its message starting with what was drawn."""
    from conformance.harness import check_writer

    names = []
    for seed in (1, 2):
        report = check_writer(MINIMAL_WRITER, examples=3, crash_examples=0, seed=seed,
                              tracing="off", workdir=str(fast_tmp / str(seed)))
        names.append([c.name for c in report.cases])
        assert all(c.details.get("drawn", "").startswith("step ") for c in report.cases
                   if c.suite == "writer.save")
    assert names[0] == names[1], names
    assert "save (codec none stratum) #1" in names[0] and "save #1" in names[0], names[0]
    r = _run(["writer", "--examples", "2", "--crash-examples", "0", "--no-committer", "--seed",
              "3", "--no-shrink", "--tracing", "off", "--junit-xml", str(fast_tmp / "r.xml"),
              "--", *BAD_WRITER], fast_tmp, fast_tmp, PCK_BAD_MODE="one-block")
    assert r.returncode == 1, r.stdout + r.stderr
    failed = [tc for tc in ET.parse(fast_tmp / "r.xml").getroot().iter("testcase")
              if tc.find("failure") is not None]
    assert [tc.get("name") for tc in failed] == ["save (codec none stratum): failing example"]
    assert str(failed[0].find("failure").text).startswith("step ")  # type: ignore[union-attr]


def test_version_says_which_suite_ran(fast_tmp: Path) -> None:
    """Something to pin to (review C11): `--version`, and the same in the JSON report."""
    from conformance import __version__

    r = _run(["--version"], fast_tmp, fast_tmp)
    first, second = r.stdout.strip().splitlines()
    assert r.returncode == 0 and first == \
        f"portable-ckpt-conformance {__version__} (checks format {VERSIONS_TEXT})", r.stdout + r.stderr
    # Outside CI review, finding 9: the vector set's fingerprint, as a CI computes it
    h = hashlib.sha256()
    base = REPO / "conformance" / "vectors"
    for p in sorted(base.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(base)).encode() + b"\0" + p.read_bytes())
    assert second == f"vectors sha256 {h.hexdigest()}"
    r = _run(["vectors", "--set", "1.0", "--json"], fast_tmp, fast_tmp)
    assert r.returncode == 0 and json.loads(r.stdout)["vectors_sha256"] == h.hexdigest()


def test_the_newest_version_is_named_once() -> None:
    """Contributor review D5: "1.2 is the newest" was written out in the checker, the CLI, the
    README and the package version. They now read ``spec.FORMAT_VERSIONS``; what cannot (the
    literal ``__version__`` hatchling reads, the README's prose) is held to it here."""
    from conformance import __version__

    assert VERSIONS_TEXT.endswith(f" and {NEWEST_FORMAT_VERSION}")
    assert all(v in VERSIONS_TEXT for v in FORMAT_VERSIONS)
    assert __version__.startswith(f"{NEWEST_FORMAT_VERSION}."), __version__
    readme = (REPO / "conformance" / "README.md").read_text()
    assert readme.startswith(f"# portable-ckpt conformance suite (format {VERSIONS_TEXT})\n")
    assert f"(checks format {VERSIONS_TEXT})" in readme  # the --version example
    assert newer_minor(str(NEWEST_MINOR + 1)) and newer_minor("1" + "0" * 5000)
    assert not any(newer_minor(v.split(".")[1]) for v in FORMAT_VERSIONS)


def test_every_version_directory_is_known() -> None:
    """Contributor review D4, D10: a new MINOR's schemas and vector set are named by hand in
    ``REQUIRED_SCHEMAS`` and ``VECTOR_DIRS``, and nothing failed where one was left out."""
    from conformance.schemas import ERRATA_SCHEMAS, REQUIRED_SCHEMAS

    schemas = REPO / "spec" / "schemas"
    later = {p.relative_to(schemas).as_posix() for p in schemas.glob("1.*/*.json")}
    assert later <= set(REQUIRED_SCHEMAS), later - set(REQUIRED_SCHEMAS)
    errata = {p.relative_to(schemas).as_posix() for p in schemas.glob("errata/*.json")}
    assert errata == set(ERRATA_SCHEMAS)
    sets = {p.parent.name for p in (REPO / "conformance" / "vectors").glob("*/cases.json")}
    assert sets == set(VECTOR_DIRS) | set(RETENTION_DIRS) and set(FORMAT_VERSIONS) <= sets


def test_runs_without_a_verdict_are_red_in_junit(dirs: tuple[Path, Path], fast_tmp: Path) -> None:
    """Outside CI review, finding 4: exit 2 (usage) and 3 (nothing checked) wrote a JUnit
    report of zero tests and no properties, green for a gate that reads JUnit alone. Like 4 and
    5 they now hold one ``error`` case, and every suite the run's ``exit_code``."""
    cwd, tmp = dirs
    empty = fast_tmp / "empty-schemas"
    empty.mkdir()
    runs = {  # name: (arguments, exit status, the error case's name)
        "missing-path": (["check", str(fast_tmp / "no-such-root")], 2, "usage error"),
        "no-schemas": (["check", "--schemas", str(empty), str(fast_tmp)], 3,
                       "nothing was checked"),
        "zero-cases": (["writer", "--examples", "0", "--crash-examples", "0", "--no-committer",
                        "--", *MINIMAL_WRITER], 3, "nothing was checked"),
        "writer-no-cmd": (["writer"], 2, "usage error"),
        "writer-bad-option": (["writer", "--crash-examples", "3", "--", *MINIMAL_WRITER], 2,
                              "usage error"),
        "gc-no-cmd": (["gc"], 2, "usage error"),
        "vectors-bad-set": (["vectors", "--set", "errata-99"], 2, "usage error"),
    }
    for name, (args, code, case) in runs.items():
        xml, js = fast_tmp / f"{name}.xml", fast_tmp / f"{name}.json"
        r = _run([args[0], "--junit-xml", str(xml), "--json", str(js), *args[1:]], cwd, tmp)
        assert r.returncode == code, (name, r.stdout, r.stderr)
        root = ET.parse(xml).getroot()
        assert root.get("tests") == "1", (name, xml.read_text())
        (suite,) = root.findall("testsuite")
        assert suite.get("errors") == "1" and suite.get("name") == args[0], name
        props = {p.get("name"): p.get("value") for p in suite.iter("property")}
        assert props["exit_code"] == str(code) and props["verdict"] == "none", (name, props)
        (tc,) = suite.findall("testcase")
        assert tc.get("name") == case and tc.find("error") is not None, name
        doc = json.loads(js.read_text())
        assert doc["exit_code"] == code and doc["verdict"] == "none" and not doc["ok"], name
        assert [c["status"] for c in doc["cases"]] == ["error"], name
        assert doc["cases"][0]["message"].strip() in r.stderr, name
    assert list(cwd.iterdir()) == [] and list(tmp.iterdir()) == []


def test_json_before_a_missing_path_is_the_path(dirs: tuple[Path, Path], fast_tmp: Path) -> None:
    """Outside CI review, finding 8: ``check --json /nonexistent`` took the path for the report
    file, then argparse said "the following arguments are required: path". The only argument
    that can be the path is the path: exit 2, it does not exist, and how to name a report file;
    a report file named before the path still is one."""
    from conformance.cli import _json_before_path

    cwd, tmp = dirs
    gone = str(fast_tmp / "no-such-root")
    assert _json_before_path(["check", "--json", gone]) == ["check", "--json=-", gone]
    assert _json_before_path(["check", "--deep", "--json", gone, "--schemas", "s"]) == \
        ["check", "--deep", "--json=-", gone, "--schemas", "s"]
    kept = ["check", "--json", "r.json", gone]  # FILE, then the path
    assert _json_before_path(kept) == kept
    assert _json_before_path(["check", "--junit-xml", "x.xml", "--json", "r.json"]) == \
        ["check", "--junit-xml", "x.xml", "--json=-", "r.json"]
    r = _run(["check", "--json", gone], cwd, tmp)
    assert r.returncode == 2 and "required" not in r.stderr, r.stderr
    assert f"error: {gone} does not exist (the argument after --json" in r.stderr, r.stderr
    assert "`check --json FILE ROOT`" in r.stderr
    assert json.loads(r.stdout)["exit_code"] == 2  # the report went to standard output
    report = fast_tmp / "r.json"
    r = _run(["check", "--json", str(report), gone], cwd, tmp)
    assert r.returncode == 2 and "(the argument after --json" not in r.stderr, r.stderr
    assert json.loads(report.read_text())["exit_code"] == 2
    assert list(cwd.iterdir()) == [] and list(tmp.iterdir()) == []
