"""Mutation audit 24b, conformance/report.py: what a CI reads from --json and --junit-xml.

Every status of a case (passed, failed, skipped, error) is counted and shown as itself, and a
failure carries what is needed to replay it.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from conformance.report import CaseResult, RunReport


def _report(exit_code: int) -> RunReport:
    return RunReport(command="writer", argv=["writer", "--", "x"], exit_code=exit_code, cases=[
        CaseResult("writer.save", "ok-case", "passed"),
        CaseResult("writer.save", "bad-case", "failed", "the manifest names a missing file",
                   seed=1234, case_dir="/tmp/c 1", replay="portable-ckpt-conformance replay x"),
        CaseResult("writer.trace", "no-strace", "skipped", "no strace here"),
        CaseResult("writer.trace", "stopped", "error", "internal error: boom", seed=99),
    ])


def test_json_counts_failures_and_verdict(tmp_path: Path) -> None:
    """Counts by status, failures are only the failed cases, and a partial pass (exit 6) is not
    "ok" (a CI gate that reads ``ok`` must not certify a run without system-call checks)."""
    rep = _report(1)
    dest = tmp_path / "r.json"
    rep.write_json(str(dest))
    doc = json.loads(dest.read_text())
    assert doc["counts"] == {"writer.save": {"passed": 1, "failed": 1, "skipped": 0, "error": 0},
                             "writer.trace": {"passed": 0, "failed": 0, "skipped": 1, "error": 1}}
    assert [f["name"] for f in doc["failures"]] == ["bad-case"]
    assert doc["failures"][0]["seed"] == 1234 and doc["failures"][0]["replay"]
    assert doc["ok"] is False and doc["verdict"] == "fail"
    assert [c.name for c in rep.failures] == ["bad-case"]
    partial = _report(6).to_json()
    assert partial["ok"] is False and partial["verdict"] == "partial"
    assert _report(0).to_json()["ok"] is True


def test_junit_shows_every_status_as_itself(tmp_path: Path) -> None:
    """A failed case has a <failure> whose text holds the message, seed, case directory and
    replay line; a skipped one <skipped>; an error <error>; the suite totals agree."""
    dest = tmp_path / "r.xml"
    _report(1).write_junit(str(dest))
    root = ET.parse(dest).getroot()
    assert root.get("tests") == "4" and root.get("failures") == "1"
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    save, trace = suites["writer.save"], suites["writer.trace"]
    assert (save.get("tests"), save.get("failures"), save.get("skipped"), save.get("errors")) \
        == ("2", "1", "0", "0")
    assert (trace.get("tests"), trace.get("failures"), trace.get("skipped"), trace.get("errors")) \
        == ("2", "0", "1", "1")
    cases = {tc.get("name"): tc for tc in root.iter("testcase")}
    assert list(cases["ok-case"]) == []
    failure = cases["bad-case"].find("failure")
    assert failure is not None and failure.get("message") == "the manifest names a missing file"
    assert failure.text is not None
    text = failure.text.splitlines()
    assert text == ["the manifest names a missing file", "seed: 1234", "case directory: /tmp/c 1",
                    "replay: portable-ckpt-conformance replay x"]
    skipped = cases["no-strace"].find("skipped")
    assert skipped is not None and skipped.get("message") == "no strace here"
    assert cases["no-strace"].find("failure") is None
    error = cases["stopped"].find("error")
    assert error is not None and error.get("message") == "internal error: boom"
    assert error.text is not None and "seed: 99" in error.text
    assert cases["stopped"].find("failure") is None
