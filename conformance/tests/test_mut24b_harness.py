"""Mutation audit 24b, conformance/harness.py: a publish case with a killed writer."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conformance.cases import CrashCase
from conformance.harness import HarnessFailure, Options, run_crash_case, run_suite
from conformance.procs import progress_mode
from conformance.report import RunReport

from .conftest import MINIMAL_WRITER, adapter, explicit_case

#: the minimal writer whose committer, from step 8 on, exits 0 without publishing anything
LAZY_COMMITTER = '''
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("minimal_writer", MINIMAL)
mw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mw)
job = json.loads(open(sys.argv[1]).read())
if job["phase"] == "commit" and job["step"] >= 8:
    sys.exit(0)
sys.exit(mw.main(sys.argv))
'''


def test_a_commit_that_exits_0_without_a_manifest_fails_a_kill_case(tmp_path: Path) -> None:
    """After a writer of attempt B was killed, a committer that says it committed (exit 0) but
    published nothing is lying: the case fails, whatever state the root is in."""
    script = tmp_path / "lazy.py"
    script.write_text(LAZY_COMMITTER.replace("MINIMAL", repr(MINIMAL_WRITER[1])))
    cc = CrashCase(explicit_case(), explicit_case(8), "kill-writer", 1, 0.5)
    lazy = [sys.executable, str(script)]
    with pytest.raises(HarnessFailure, match=r"published no manifest\.json"):
        run_crash_case(adapter(lazy, trace=False), cc, tmp_path / "w")
    # the honest minimal writer passes the same case
    run_crash_case(adapter(MINIMAL_WRITER, trace=False), cc, tmp_path / "ok")


#: the minimal writer whose commit of step 8 pauses after each file it wrote (a slow disk): a
#: byte-timed kill has time to see every byte count the commit passes through
SLOW_COMMIT = '''
import importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("minimal_writer", MINIMAL)
mw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mw)
job = json.loads(open(sys.argv[1]).read())
if job["phase"] == "commit" and job["step"] == 8:
    write_file = mw.write_file
    def slow_write_file(path, data):
        write_file(path, data)
        time.sleep(0.3)
    mw.write_file = slow_write_file
sys.exit(mw.main(sys.argv))
'''


@pytest.mark.skipif(progress_mode(False) != "proc", reason="no /proc/<pid>/io")
def test_an_untraced_commit_kill_case_kills_the_commit(tmp_path: Path) -> None:
    """Without a trace, a kill-commit case is timed on the bytes the commit wrote: a share
    (``at``) of half the index bytes, about what a commit writes. Late in the commit (at 0.9)
    the commit is still killed: the case is the crash it names, not a commit that ran to its
    end. Drawn with victim 1 (the victim names a writer; the commit is one process)."""
    script = tmp_path / "slow.py"
    script.write_text(SLOW_COMMIT.replace("MINIMAL", repr(MINIMAL_WRITER[1])))
    cc = CrashCase(explicit_case(), explicit_case(8), "kill-commit", 1, 0.9)
    details: dict[str, object] = {}
    run_crash_case(adapter([sys.executable, str(script)], trace=False), cc, tmp_path / "w",
                   details=details)
    assert details["killed"] is True, details
    assert details["kill_unit"] == "proc"

def test_committer_suite_asks_for_tables_and_keeps_its_failures(tmp_path: Path) -> None:
    """``--tensor-table sometimes`` runs the conforming-attempt case with and without a table;
    a failed committer case keeps its directory (the report's case_dir and replay point at it),
    the passed ones leave nothing; and the run without tracing says what it did not check."""
    script = tmp_path / "lazy.py"
    script.write_text(LAZY_COMMITTER.replace("MINIMAL", repr(MINIMAL_WRITER[1]))
                      .replace('job["step"] >= 8', "True"))
    report = RunReport("writer", [])
    run_suite([sys.executable, str(script)],
              Options(examples=0, crash_examples=0, committer=True, tables="sometimes",
                      tracing="off", seed=5, workdir=str(tmp_path / "work")), report)
    names = [c.name for c in report.cases if c.suite == "writer.committer"]
    assert "commits a conforming attempt" in names
    assert "commits a conforming attempt (tensor table asked)" in names
    failed = [c for c in report.cases if c.failed]
    assert {c.name for c in failed} >= {"commits a conforming attempt",
                                        "commits a conforming attempt (tensor table asked)"}
    for c in failed:
        assert c.case_dir and (Path(c.case_dir) / "case.json").is_file(), c.name
    kept = {Path(c.case_dir).name for c in failed if c.case_dir}
    (run,) = (tmp_path / "work").iterdir()  # the run's own directory (outside CI review, 3)
    assert {p.name for p in run.iterdir()} == kept
    (note,) = [c for c in report.cases if c.suite == "writer.trace"]
    assert note.status == "skipped" and "NOT CHECKED" in note.message
    assert any("were NOT run" in w for w in report.warnings), report.warnings
