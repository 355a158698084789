"""Mutation audit 24, conformance/harness.py."""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import pytest

from conformance.cases import FAULT_POINTS, CrashCase
from conformance.harness import (
    HarnessFailure,
    Options,
    check_writer,
    run_crash_case,
    run_save_case,
    run_suite,
    stratify,
)
from conformance.procs import InfrastructureError
from conformance.report import RunReport

from .conftest import MINIMAL_WRITER, adapter, explicit_case, needs_tracing


@needs_tracing
def test_a_save_case_in_a_workdir_behind_a_symbolic_link(tmp_path: Path) -> None:
    """A work directory reached through a symbolic link (macOS's /var/folders, a symlinked
    /tmp): the traces name the real path, and a conforming writer passes the save case."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    run_save_case(adapter(MINIMAL_WRITER, trace=True), explicit_case(), tmp_path / "link" / "w")


def test_every_publish_case_asked_for_runs() -> None:
    """``--crash-examples N`` runs N publish cases: one per fault point first, the rest drawn."""
    for n in (len(FAULT_POINTS), len(FAULT_POINTS) + 1, 20):
        counts = stratify(n, FAULT_POINTS, random.Random(n))
        assert sum(counts.values()) == n, (n, counts)
        assert set(counts) == set(FAULT_POINTS) and min(counts.values()) >= 1


#: the minimal writer, leaving its temporary manifest (always the same name) after the link:
#: allowed (R-COMMIT-10), a checker warning
KEEPS_TMP = '''
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("minimal_writer", MINIMAL)
mw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mw)
def publish(adir, data, fail_at):
    tmp = adir / "manifest.json.0123456789abcdef.tmp"
    mw.write_file(tmp, data)
    os.link(tmp, adir / "manifest.json")
    mw.fsync_dir(adir)
mw.publish = publish
sys.exit(mw.main(sys.argv))
'''


def test_a_warning_of_every_case_is_one_warning_of_the_run(tmp_path: Path) -> None:
    """The checker's warning about each save (its attempt id written <attempt>) is one warning
    of the run's report, not one per case."""
    script = tmp_path / "keeps_tmp.py"
    script.write_text(KEEPS_TMP.replace("MINIMAL", repr(MINIMAL_WRITER[1])))
    report = check_writer([sys.executable, str(script)], examples=3, crash_examples=0,
                          committer=False, tables="never", tracing="off", seed=3, shrink=False,
                          workdir=str(tmp_path / "work"))
    about = [w for w in report.warnings if "manifest.json.0123456789abcdef.tmp" in w]
    assert len(about) == 1 and "<attempt>" in about[0], report.warnings
    assert report.counts()["writer.save"]["passed"] == 3 and not report.failures


#: the minimal writer, failing every save of an odd step
ODD_STEPS_FAIL = '''
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("minimal_writer", MINIMAL)
mw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mw)
job = json.loads(open(sys.argv[1]).read())
if job["phase"] == "write" and job["step"] % 2:
    print(json.dumps({"error": {"code": "PCK-STORAGE", "message": "odd step"}}))
    sys.exit(1)
sys.exit(mw.main(sys.argv))
'''


def test_the_reported_failure_is_the_shrunk_one(tmp_path: Path) -> None:
    """The failure a save suite reports (and keeps) is hypothesis' last, minimal example: step 1
    for a writer that fails every odd step, not the random step that failed first."""
    script = tmp_path / "odd.py"
    script.write_text(ODD_STEPS_FAIL.replace("MINIMAL", repr(MINIMAL_WRITER[1])))
    report = RunReport("writer", [])
    run_suite([sys.executable, str(script)],
              Options(examples=6, crash_examples=0, committer=False, codecs=("none",),
                      max_writers=1, tables="never", seed=1, tracing="off", shrink_time=60,
                      workdir=str(tmp_path / "work")), report)
    (failure,) = report.failures
    assert failure.message.startswith("step 1: 1 writer(s), codec none, 0 tensor(s), "
                                      "0 entr(y/ies): writer 0 failed"), failure.message
    assert failure.case_dir and json.loads((Path(failure.case_dir) / "case.json").read_text(
    ))["case"]["step"] == 1


#: the minimal writer, hanging on every save of an odd step
HANGS = '''
import importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("minimal_writer", MINIMAL)
mw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mw)
if json.loads(open(sys.argv[1]).read())["step"] % 2:
    with open(sys.argv[1] + ".started", "w"):
        pass
    time.sleep(30)
sys.exit(mw.main(sys.argv))
'''


def test_an_adapter_past_its_timeout_stops_the_run(tmp_path: Path) -> None:
    """The first save past --timeout ends the run (infrastructure), in the random save suite
    too: no case is started after it (each would wait out --timeout again)."""
    script = tmp_path / "hangs.py"
    script.write_text(HANGS.replace("MINIMAL", repr(MINIMAL_WRITER[1])))
    work = tmp_path / "work"
    t0 = time.monotonic()
    with pytest.raises(InfrastructureError, match="past --timeout"):
        check_writer([sys.executable, str(script)], examples=6, crash_examples=0, committer=False,
                     codecs=("none",), max_writers=1, tables="never", tracing="off", seed=2,
                     timeout=1, workdir=str(work), keep_work=True)
    started = sorted(p.parent.parent.name for p in work.rglob("*.started"))
    cases = sorted(p.name for p in work.glob("writer-*/save-*"))  # the run's own directory
    assert len(started) == 1 and cases[-1] == started[0], (started, cases)  # the last case
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("bad", [{"examples": -1}, {"crash_examples": -1},
                                 {"crash_examples": len(FAULT_POINTS) - 1}, {"codecs": ()}])
def test_options_no_run_can_satisfy_are_refused(bad: dict[str, int]) -> None:
    """A negative count, or fewer publish cases than fault points (one would never run), is a
    usage error before anything runs."""
    with pytest.raises(ValueError, match=r"--examples|--crash-examples|--codec"):
        Options(**bad).validate()  # type: ignore[arg-type]
    Options(crash_examples=len(FAULT_POINTS)).validate()
    Options(examples=0, crash_examples=0).validate()


#: the minimal writer with a publish-case defect chosen by PCK_MUT24_MODE
PUBLISH_DEFECTS = '''
import importlib.util, json, os, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("minimal_writer", MINIMAL)
mw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mw)
MODE = os.environ["PCK_MUT24_MODE"]
job = json.loads(open(sys.argv[1]).read())
if MODE == "second-save-fails" and job["phase"] == "write" and job["writer"] == 1:
    if any(Path(job["root"]).glob("*/manifest.json")):  # a root that holds a version
        print(json.dumps({"error": {"code": "PCK-STORAGE", "message": "root not empty"}}))
        sys.exit(1)

def link_then_crash(adir, data, fail_at):
    """Links manifest.json first, then reaches the fault point temp_written."""
    tmp = adir / f"manifest.json.{os.urandom(8).hex()}.tmp"
    mw.write_file(tmp, data)
    os.link(tmp, adir / "manifest.json")
    if fail_at == "temp_written":
        mw.crash()
    os.unlink(tmp)
    mw.fsync_dir(adir)

if MODE == "link-then-crash":
    mw.publish = link_then_crash
sys.exit(mw.main(sys.argv))
'''


@pytest.mark.parametrize(("mode", "fault", "message"), [
    ("second-save-fails", "commit:before_publish", "writer 1 failed"),
    ("link-then-crash", "commit:temp_written", "became visible as committed"),
])
def test_publish_case_defects_that_end_in_a_failed_commit(
        mode: str, fault: str, message: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit fault makes the commit fail anyway; the case still fails a writer that cannot
    save into a root holding a version (the only save into such a root), and a committer
    that publishes before the fault point and then dies."""
    script = tmp_path / "defects.py"
    script.write_text(PUBLISH_DEFECTS.replace("MINIMAL", repr(MINIMAL_WRITER[1])))
    monkeypatch.setenv("PCK_MUT24_MODE", mode)
    cc = CrashCase(explicit_case(), explicit_case(8), fault, 0, 0.5)
    with pytest.raises(HarnessFailure, match=message):
        run_crash_case(adapter([sys.executable, str(script)], trace=False), cc, tmp_path / "w")
    monkeypatch.setenv("PCK_MUT24_MODE", "")
    run_crash_case(adapter([sys.executable, str(script)], trace=False), cc, tmp_path / "ok")
