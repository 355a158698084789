"""Runs sharing one ``--workdir`` (outside CI review, finding 3).

Two CI jobs, or a retry beside a run still going, point ``--workdir`` at the same directory. A
writer run's clean-up deleted every case directory it had made, also the names its passed cases
had already freed and the other run had taken since ("writer-missing ... the committer exited
1"); the gc harness used fixed ``<workdir>/<set>/<case>`` paths and deleted any it found (exit 5,
or exit 1 on a correct gc). Each run now works in a directory of its own below the work
directory and deletes nothing it did not create.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conformance.harness import Options, _Run
from conformance.report import RunReport

from .conftest import REPO

ADAPTER = [sys.executable, "-c", "pass"]  # found by preflight; never run here


def _noop(d: Path, det: dict[str, object]) -> None:
    """A case that passes at once."""


def test_writer_runs_sharing_a_workdir_keep_each_others_cases(tmp_path: Path) -> None:
    """Run A passes a case (its directory removed, the name free), run B makes a case
    directory, A finishes: B's directory, and anything else in the work directory, is left."""
    work = tmp_path / "shared"
    work.mkdir()
    (work / "someone-else.txt").write_text("not the suite's")
    opts = Options(workdir=str(work), tracing="off")
    a = _Run(ADAPTER, opts, RunReport("writer", []))
    passed = a.run_case("writer.save", "save #1", {}, _noop)
    assert passed.status == "passed"
    b = _Run(ADAPTER, opts, RunReport("writer", []))
    live = b.case_dir("writer.save", {})
    (live / "job.out").write_text("run B is using this case")
    a.finish()
    assert (live / "job.out").read_text() == "run B is using this case"
    assert (work / "someone-else.txt").is_file()
    assert a.base.parent == b.base.parent == work.resolve() and a.base != b.base
    assert not a.base.exists()  # A's own directory goes: nothing of it was kept
    b.finish()
    assert sorted(p.name for p in work.iterdir()) == ["someone-else.txt"]


def test_a_kept_case_stays_below_the_runs_own_directory(tmp_path: Path) -> None:
    """A failed case is kept (and named in the reports) below the run's directory."""
    work = tmp_path / "w"  # created by the run, with its parents
    run = _Run(ADAPTER, Options(workdir=str(work), tracing="off"), RunReport("writer", []))

    def fails(d: Path, det: dict[str, object]) -> None:
        raise AssertionError("a defect")

    failed = run.run_case("writer.save", "save #1", {}, fails)
    run.keep.add(Path(failed.case_dir or ""))
    run.finish()
    kept = Path(failed.case_dir or "")
    assert kept.parent == run.base and kept.parent.parent == work.resolve()
    assert run.base.name.startswith("writer-") and (kept / "case.json").is_file()


def test_gc_runs_sharing_a_workdir_leave_each_others_cases(tmp_path: Path) -> None:
    """A case directory of another run at the path this run used to take (``<workdir>/<set>/
    <case>``) is left alone, and the run passes a correct gc."""
    work = tmp_path / "gc-work"
    other = work / "errata-20" / "keep-two-of-four"
    other.mkdir(parents=True)
    (other / "job.out").write_text("another run's live case")
    out = subprocess.run([sys.executable, "-m", "conformance", "gc", "--tracing", "off",
                          "--case", "keep-two-of-four", "--workdir", str(work), "--json", "--",
                          sys.executable, str(REPO / "conformance" / "examples" / "minimal_gc.py")],
                         cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert (other / "job.out").read_text() == "another run's live case"
    doc = json.loads(out.stdout)
    assert Path(doc["workdir"]).parent == work.resolve()
    assert sorted(p.name for p in work.iterdir()) == ["errata-20"]  # its own directory: gone
