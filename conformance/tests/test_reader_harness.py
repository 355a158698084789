"""``portable-ckpt-conformance reader``: the golden vectors run through a reader adapter.

The reference reader (``conformance/adapters/reference_reader.py``, ``portable_ckpt.open``)
passes every case of every reader set, through the command other teams run; the same reader
with one deliberate defect each (``bad_reader.py``) fails exactly the case that shows it, with
a message that names what differs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from conformance.reader_harness import _bytes_diff, judge, result_line, rules_of, same_json
from conformance.vectors import all_cases, retention_cases

from ._interrupt import assert_an_interrupt_kills_every_adapter

REPO = Path(__file__).resolve().parents[2]
ADAPTER = REPO / "conformance" / "adapters" / "reference_reader.py"
BAD = REPO / "conformance" / "tests" / "bad_reader.py"


def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 300
         ) -> tuple[int, dict[str, Any] | None, str]:
    out = subprocess.run([sys.executable, "-m", "conformance", "reader", *args], cwd=REPO,
                         capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, **(env or {})})
    try:
        doc = json.loads(out.stdout) if "--json" in args else None
    except json.JSONDecodeError:
        doc = None
    return out.returncode, doc, out.stdout + out.stderr


def _case(name: str) -> dict[str, Any]:
    return next(c for _, _, c in all_cases() if c["name"] == name)


@pytest.mark.timeout(1500)  # about 50 s on two cores with --jobs 4 (100 s one at a time)
def test_the_reference_reader_passes_every_vector(tmp_path: Path) -> None:
    """Every case of every reader set (235 and more as sets are added), one process each, four
    at a time (``--jobs 4``): exit 0, nothing failed or skipped, the cases reported in their
    order, the JUnit report agrees, the work directory is gone."""
    xml = tmp_path / "reader.xml"
    rc, doc, text = _run("--json", "--junit-xml", str(xml), "--jobs", "4", "--",
                         sys.executable, str(ADAPTER), timeout=1400)
    assert rc == 0, text[-4000:]
    assert doc is not None and doc["verdict"] == "pass" and doc["command"] == "reader"
    names = [f"{s}/{c['name']}" for s, _, c in all_cases()]
    assert [c["name"] for c in doc["cases"]] == names
    assert doc["counts"] == {"reader": {"passed": len(names), "failed": 0, "skipped": 0,
                                        "error": 0}}
    retention = {c["name"] for _, _, c in retention_cases()}
    assert not any(n.split("/", 1)[1] in retention for n in names)
    suite = ET.parse(xml).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == str(len(names))
    assert suite.get("failures") == "0"
    assert not Path(doc["workdir"]).exists()


# mode: (cases run, the one that must fail, what its message must say)
BAD_MODES = {
    "no-checksum": (["invalid-bad-checksum", "valid-per-rank"], "invalid-bad-checksum",
                    "read an invalid case without error: expected PCK-CHECKSUM"),
    "deep-only": (["invalid-checksum-last-block", "valid-per-rank"], "invalid-checksum-last-block",
                  "read an invalid case without error: expected PCK-CHECKSUM"),
    "first-block": (["invalid-bad-checksum", "invalid-checksum-middle-block-of-a-range"],
                    "invalid-checksum-middle-block-of-a-range",
                    "read an invalid case without error: expected PCK-CHECKSUM"),
    "big-endian": (["valid-per-rank", "invalid-bad-checksum"], "valid-per-rank",
                   "tensor 'w' (float32 [3]): bytes differ from byte 0 (element 0 in C order, "
                   "4 bytes each): got 3f80000040000000, expected 0000803f00000040"),
    "float-integers": (["valid-per-rank", "invalid-bad-checksum"], "valid-per-rank",
                       "entry 'rank_state'[\"per_rank\"][\"0\"][\"r\"]: got 0.0 (number with a "
                       "fraction or exponent), expected 0 (integer)"),
    "bool-as-int": (["valid-entries", "valid-per-rank"], "valid-entries",
                    "entry 'anything'[3]: got 1 (integer), expected true (boolean)"),
    "rank-zero": (["valid-per-rank", "valid-entries"], "valid-per-rank",
                  "entry 'rank_state'[\"per_rank\"][\"1\"][\"r\"]: got 0, expected 1"),
    "oldest": (["valid-latest-of-two", "valid-per-rank"], "valid-latest-of-two",
               "opened another version: attempt_id"),
    "decode-first": (["invalid-checksum-undecodable-zstd-frame-own-block", "valid-zstd",
                      "invalid-checksum-undecodable-zstd-frame"],
                     "invalid-checksum-undecodable-zstd-frame-own-block",
                     "reported PCK-CODEC, expected PCK-CHECKSUM"),
    "no-bool-check": (["invalid-bool-byte", "valid-bool-zstd"], "invalid-bool-byte",
                      "expected PCK-DTYPE-VALUE (R-DTYPE-2, R-DTYPE-4)"),
    "one-code": (["invalid-bad-checksum", "valid-per-rank"], "invalid-bad-checksum",
                 "reported PCK-ERROR, expected PCK-CHECKSUM"),
    "anonymous-checksum": (["invalid-checksum-later-block-of-a-zstd-frame", "valid-per-rank"],
                           "invalid-checksum-later-block-of-a-zstd-frame",
                           "its message does not name the damaged file "
                           "'data/w00001-0000.safetensors' (R-CKSUM-4"),
    "fv-false": (["valid-verification-one-of-two-cleared", "valid-verification-cleared"],
                 "valid-verification-one-of-two-cleared",
                 "failed_verification: got false, expected true (R-DRILL-8)"),
    "strict": (["writer-index-disagrees", "valid-per-rank"], "writer-index-disagrees",
               "refused a case a reader reads (\"reader\": \"accept\""),
    "crash": (["valid-zstd", "valid-per-rank"], "valid-zstd", "no result line"),
    "hang": (["valid-per-rank", "valid-zstd"], "valid-per-rank", "did not end within"),
}


@pytest.mark.parametrize("mode", sorted(BAD_MODES))
def test_harness_fails_a_reader_with_a_defect(mode: str) -> None:
    """Each deliberate defect fails exactly the case that shows it (exit 1), naming why."""
    cases, failing, want = BAD_MODES[mode]
    rc, doc, text = _run("--json", "--timeout", "5" if mode == "hang" else "60",
                         *[f"--case={n}" for n in cases], "--", sys.executable,
                         str(BAD), env={"PCK_BAD_MODE": mode})
    assert rc == 1, text
    assert doc is not None
    (failure,) = doc["failures"]
    assert failure["name"].endswith(f"/{failing}")
    assert failure["message"].startswith(failure["name"] + ": ")
    assert want in failure["message"], failure["message"]
    assert f"reader --case {failing} --keep-work -- " in failure["replay"]
    kept = Path(failure["case_dir"])
    assert (kept / "job.json").is_file() and (kept / "root").is_dir()
    assert failing not in str(kept)  # a neutral name, c<hex>
    assert not (kept / "expected.json").exists()  # the reader sees the checkpoint only
    shutil.rmtree(doc["workdir"])


def test_cases_run_at_once_are_judged_and_reported_each_as_its_own() -> None:
    """``--jobs 3``: a case whose reader hangs fails alone (past ``--timeout``) while the two
    others ran meanwhile and pass; the report lists the three in the vectors' order."""
    cases = ["valid-per-rank", "valid-zstd", "invalid-bad-checksum"]
    rc, doc, text = _run("--json", "--timeout", "5", "--jobs", "3",
                         *[f"--case={n}" for n in cases], "--", sys.executable, str(BAD),
                         env={"PCK_BAD_MODE": "hang"})
    assert rc == 1, text
    assert doc is not None
    order = [c["name"] for _, _, c in all_cases() if c["name"] in cases]  # the sets' order
    assert [c["name"].split("/")[1] for c in doc["cases"]] == order
    assert {c["name"].split("/")[1]: c["status"] for c in doc["cases"]} == {
        "valid-per-rank": "failed", "valid-zstd": "passed", "invalid-bad-checksum": "passed"}
    assert "did not end within" in doc["failures"][0]["message"]
    assert doc["seconds"] < 5 * 3  # at once: not one after the other
    shutil.rmtree(doc["workdir"])


def test_an_interrupt_kills_every_adapter_running_at_once(tmp_path: Path) -> None:
    """Ctrl-C with ``--jobs 2``: each adapter runs in a session of its own (the terminal's
    signal does not reach it) and the threads waiting for them are not the one interrupted;
    the run ends 130 at once and no adapter outlives it."""
    assert_an_interrupt_kills_every_adapter(tmp_path, "reader", "--set", "1.3")


def test_a_reader_that_restores_nothing_opts_out_of_the_status(tmp_path: Path) -> None:
    """--no-verification-status: the jobs do not ask, the lines are not checked, and the run
    is a partial pass (exit 6, a skipped reader.verification_status case, a warning), not
    exit 0 "reader passed"; a run with no case that has a status to check exits 0."""
    xml = tmp_path / "r.xml"
    rc, doc, text = _run("--json", "--junit-xml", str(xml), "--no-verification-status",
                         "--case=valid-verification-one-of-two-cleared", "--case=valid-per-rank",
                         "--", sys.executable, str(BAD), env={"PCK_BAD_MODE": "fv-false"})
    assert rc == 6, text
    assert doc is not None and doc["verification_status"] is False
    assert doc["verdict"] == "partial" and doc["failures"] == []
    assert doc["verification_status_unchecked"] == ["1.2/valid-verification-one-of-two-cleared"]
    (skipped,) = [c for c in doc["cases"] if c["status"] == "skipped"]
    assert skipped["suite"] == "reader.verification_status"
    assert "NOT CHECKED (--no-verification-status)" in skipped["message"]
    assert any("NOT checked" in w for w in doc["warnings"])
    assert "verification status, R-DRILL-8 and R-DRILL-12: NOT CHECKED" in text
    assert "reader passed the cases that ran, WITHOUT the verification status (exit 6" in text
    root = ET.parse(xml).getroot()
    assert [s.get("name") for s in root.iter("testsuite")] == ["reader",
                                                               "reader.verification_status"]
    reader, status = root.iter("testsuite")
    assert reader.get("skipped") == "0" and status.get("skipped") == "1"
    # the root's totals, and the reader's own exit texts (not the writer's tracing text)
    assert (root.get("tests"), root.get("failures"), root.get("errors"),
            root.get("skipped")) == ("3", "0", "0", "1")
    assert "--no-verification-status" in doc["exit_meaning"]
    assert "tracing" not in doc["exit_meaning"] and "strace" not in doc["exit_meaning"]
    rc, doc, text = _run("--json", "--no-verification-status", "--case=valid-per-rank", "--",
                         sys.executable, str(ADAPTER))
    assert rc == 0 and doc is not None and doc["verification_status_unchecked"] == [], text
    assert doc["exit_meaning"].startswith("reader passed") and "writer" not in \
        doc["exit_meaning"]


def test_the_job_file(tmp_path: Path) -> None:
    """The job names the target by its absolute path, never asks for a deep verification and
    asks for the verification status where the case has one; --keep-work keeps each case directory
    below the run's own directory in --workdir, so runs sharing --workdir do not meet."""
    picked = ["invalid-bad-checksum", "valid-verification-cleared", "valid-latest-of-two"]
    runs = []
    for _ in range(2):
        rc, doc, text = _run("--json", "--keep-work", "--workdir", str(tmp_path),
                             *[f"--case={n}" for n in picked], "--", sys.executable,
                             str(ADAPTER))
        assert rc == 0 and doc is not None, text
        runs.append(Path(doc["workdir"]))
        jobs = {c["name"].split("/", 1)[1]: json.loads(
            (Path(c["case_dir"]) / "job.json").read_text()) for c in doc["cases"]}
        # a reader verifies every block it reads: no job asks for a deep verification (a
        # reader that verified data blocks only when asked passed every case)
        assert all("deep" not in job for job in jobs.values())
        assert jobs["valid-verification-cleared"]["verification_status"] is True
        latest = jobs["valid-latest-of-two"]
        assert latest == {"op": "read", "verification_status": False,
                          "target": latest["target"]}
        assert Path(latest["target"]).is_absolute() and Path(latest["target"]).name == "root"
        # the path names neither the case nor its set (a reader that looked its answers up by
        # the path passed every case); the report does
        for c in doc["cases"]:
            case_dir = Path(c["case_dir"])
            assert re.fullmatch(r"c[0-9a-f]{12}", case_dir.name) and \
                case_dir.parent == runs[-1], c
            target = jobs[c["name"].split("/", 1)[1]]["target"]
            assert target.startswith(str(case_dir) + "/")
            set_name, name = c["name"].split("/", 1)
            assert name not in target and f"/{set_name}/" not in target, target
    assert runs[0] != runs[1] and {r.parent for r in runs} == {tmp_path}
    # without --keep-work a passing run leaves nothing in --workdir
    shutil.rmtree(tmp_path)
    rc, doc, text = _run("--json", "--workdir", str(tmp_path), "--case=valid-per-rank", "--",
                         sys.executable, str(ADAPTER))
    assert rc == 0 and doc is not None and list(tmp_path.iterdir()) == [], text


def test_usage_and_infrastructure_errors(tmp_path: Path) -> None:
    """Usage errors exit 2 before anything runs; an adapter that cannot start is exit 4, as is
    one whose every process dies of an import error (found at the first case)."""
    assert _run()[0] == 2
    assert _run("--set", "errata-99", "--", sys.executable, str(ADAPTER))[0] == 2
    rc, _, text = _run("--set", "errata-20", "--", sys.executable, str(ADAPTER))
    assert rc == 2 and "retention" in text
    rc, _, text = _run("--case", "keep-two-of-four", "--", sys.executable, str(ADAPTER))
    assert rc == 2 and "no reader case is named 'keep-two-of-four'" in text
    assert _run("--timeout", "0", "--", sys.executable, str(ADAPTER))[0] == 2
    (tmp_path / "a-file").write_text("x")
    rc, _, text = _run("--workdir", str(tmp_path / "a-file"), "--", sys.executable,
                       str(ADAPTER))
    assert rc == 2 and "not a directory" in text and "Traceback" not in text
    rc, _, text = _run("--case", "valid-per-rank", "--", str(tmp_path / "missing.py"))
    assert rc == 4 and "not an executable file" in text
    rc, doc, text = _run("--json", "--", sys.executable, "-c", "import pck_no_such_module")
    assert rc == 4 and "import error" in text and doc is not None
    assert "--timeout is that case's failure" in doc["exit_meaning"]  # the reader's own text
    assert [c["status"] for c in doc["cases"]] == ["error"]
    assert doc["cases"][0]["suite"] == "reader"


@pytest.mark.parametrize("args", [[], ["--"], ["--timeout", "0", "--", "true"],
                                  ["--timeout", "nan", "--", "true"],
                                  ["--jobs", "0", "--", "true"]],
                         ids=["no-cmd", "no-cmd-after-dashes", "timeout-0", "timeout-nan",
                              "jobs-0"])
def test_a_usage_error_writes_both_reports(tmp_path: Path, args: list[str]) -> None:
    """Every usage error leaves --json and --junit-xml, with one `error` case named `usage
    error`, as `writer` and `gc` do (no CMD and a --timeout that is not positive wrote none)."""
    js, xml = tmp_path / "r.json", tmp_path / "r.xml"
    rc, _, text = _run("--json", str(js), "--junit-xml", str(xml), *args)
    assert rc == 2, text
    doc = json.loads(js.read_text())
    assert doc["verdict"] == "none" and doc["exit_code"] == 2
    assert [(c["suite"], c["name"], c["status"]) for c in doc["cases"]] == [
        ("reader", "usage error", "error")]
    root = ET.parse(xml).getroot()
    assert root.get("errors") == "1" and root.get("skipped") == "0"
    suite = root.find("testsuite")
    assert suite is not None and suite.get("errors") == "1"


def test_a_crash_and_a_line_that_is_no_protocol() -> None:
    """A process that prints nothing, or not the protocol's line, fails each case (exit 1)."""
    rc, doc, text = _run("--json", "--case=valid-per-rank", "--", sys.executable, "-c",
                         "print('{\"ok\": true, \"ok\": false}')")
    assert rc == 1 and doc is not None, text
    assert "the last result line is not strict JSON (duplicate key 'ok')" in \
        doc["failures"][0]["message"]
    rc, doc, text = _run("--json", "--case=valid-per-rank", "--", sys.executable, "-c",
                         "print('{\"ok\": \"yes\"}')")
    assert rc == 1 and doc is not None, text
    assert "\"ok\" is \"yes\", not true or false" in doc["failures"][0]["message"]
    shutil.rmtree(doc["workdir"])


def test_json_values_are_compared_with_their_types() -> None:
    assert same_json({"a": [1, 2.5, True, None, "x"]}, {"a": [1, 2.5, True, None, "x"]}, "v") == ""
    assert same_json(1.0, 1, "v") == "v: got 1.0 (number with a fraction or exponent), " \
        "expected 1 (integer)"
    assert "got 1 (integer), expected true (boolean)" in same_json(1, True, "v")
    assert "got false (boolean), expected 0 (integer)" in same_json(False, 0, "v")
    assert same_json(-0.0, 0.0, "v") == "v: got -0.0, expected 0.0"
    assert same_json({"a": 1}, {"a": 1, "b": 2}, "v") == "v: missing key(s) 'b'"
    assert same_json([1], [1, 2], "v") == "v: a list of 1 items, expected 2"
    assert same_json({"k": {"x": [0, 1]}}, {"k": {"x": [0, 2]}}, "e") == \
        'e["k"]["x"][1]: got 1, expected 2'


def test_byte_differences_name_offset_element_and_bytes() -> None:
    hexed = "01000000020000000300000004000000"
    want: dict[str, Any] = {"dtype": "int32", "shape": [4], "hex": hexed}
    assert _bytes_diff("t", hexed.upper(), want) == ""  # hex digits in either case
    text = _bytes_diff("t", "01000000020000000300000005000000", want)
    assert text == ("tensor 't' (int32 [4]): bytes differ from byte 12 (element 3 in C order, "
                    "4 bytes each): got 05000000, expected 04000000")
    text = _bytes_diff("t", "0100000002000000", want)
    assert "from byte 8" in text and "got (end)" in text and "8 bytes, expected 16" in text
    assert "not hex digits" in _bytes_diff("t", "zz", want)


def test_judge_of_an_invalid_case() -> None:
    case = _case("invalid-bool-byte")
    assert rules_of(case) == ["R-DTYPE-2", "R-DTYPE-4"]
    assert judge(case, None, {"ok": False, "code": "PCK-DTYPE-VALUE"}) == []
    (text,) = judge(case, None, {"ok": False, "code": "PCK-CHECKSUM", "message": "m"})
    assert text.startswith("reported PCK-CHECKSUM, expected PCK-DTYPE-VALUE (R-DTYPE-2, "
                           "R-DTYPE-4): m")
    # R-CKSUM-4: a checksum failure's message, when given, names the damaged file
    bad, rel = _case("invalid-bad-checksum"), ["data/w00000-0000.safetensors"]
    ok_code = {"ok": False, "code": "PCK-CHECKSUM"}
    assert judge(bad, None, ok_code, damaged=rel) == []  # message is optional
    assert judge(bad, None, {**ok_code, "message": "s1/data/w00000-0000.safetensors: block 0"},
                 damaged=rel) == []
    assert judge(bad, None, {**ok_code, "message": "data\\w00000-0000.safetensors"},
                 damaged=rel) == []
    (text,) = judge(bad, None, {**ok_code, "message": "crc mismatch"}, damaged=rel)
    assert "does not name the damaged file 'data/w00000-0000.safetensors'" in text
    (text,) = judge(_case("invalid-bad-checksum"), None, {"ok": True})
    assert "expected PCK-CHECKSUM" in text and "which a whole read reaches" in text


def test_result_line_is_the_last_protocol_line() -> None:
    out = 'noise\n{"ok": false, "code": "A"}\n{"other": 1}\n{"ok": false, "code": "B"}\nbye\n'
    assert result_line(out) == ({"ok": False, "code": "B"}, "")
    assert result_line("nothing\n") == (None, "")
    doc, problem = result_line('{"ok": true, "x": NaN}\n')
    assert doc is None and "NaN is not JSON" in problem


@pytest.mark.parametrize(("last", "why"), [
    ('{"ok": true, "ok": true, "tensors": {}}', "not strict JSON (duplicate key 'ok')"),
    ('{"ok": true, "x": NaN}', "not strict JSON (NaN is not JSON)"),
    ('{"ok": true, "x": -Infinity}', "not strict JSON (-Infinity is not JSON)"),
    ('{"ok": true, "v": 1e400}', "the number 1e400 is out of range"),
    ('\ufeff{"ok": true}', "starts with a UTF-8 byte order mark"),
])
def test_a_last_result_line_that_is_not_strict_json_fails(last: str, why: str) -> None:
    """The last line meant as the result is judged, not passed over for an earlier one (a
    non-strict last line let an earlier `{"ok": false, ...}` count); a BOM said "no result
    line" without a hint; 1e400 was read as infinity."""
    good = '{"ok": false, "code": "PCK-CHECKSUM"}\n'
    doc, problem = result_line(good + last + "\n")
    assert doc is None and problem.startswith("the last result line ") and why in problem, \
        problem
    doc, problem = result_line(last + "\n")
    assert doc is None and why in problem
    assert result_line('{"ok": true, "v": 1e300, "w": 12345678901234567890123}\n')[0] == \
        {"ok": True, "v": 1e300, "w": 12345678901234567890123}


def test_known_failures_are_a_partial_pass_and_must_keep_failing(tmp_path: Path) -> None:
    """--known-failures: a listed case that fails is skipped, its failure kept, and the run
    ends with exit 6 (a partial pass, not 0: the reader does not conform); a listed case that
    passes fails the run (the list cannot hide its next regression); a case not listed fails
    as ever; a name that is no reader case is a usage error."""
    known = tmp_path / "known.json"
    known.write_text(json.dumps({"1.0/valid-per-rank": "our per-rank entries are late"}))
    picked = ["--case=valid-per-rank", "--case=invalid-bad-checksum"]
    bad = {"PCK_BAD_MODE": "rank-zero"}
    rc, doc, text = _run("--json", "--known-failures", str(known), *picked, "--",
                         sys.executable, str(BAD), env=bad)
    assert rc == 6, text
    assert doc is not None and doc["verdict"] == "partial" and doc["failures"] == []
    assert doc["known_failures"] == [{"case": "1.0/valid-per-rank", "got": "ok"}]
    (skipped,) = [c for c in doc["cases"] if c["status"] == "skipped"]
    assert skipped["message"].startswith("known failure (listed in --known-failures ")
    assert "our per-rank entries are late" in skipped["message"]
    assert "got 0, expected 1" in skipped["message"]
    assert Path(skipped["case_dir"]).is_dir()  # kept, as a failure's
    assert "1 known failure(s) of" in text and "NOT conformant (exit 6" in text
    shutil.rmtree(doc["workdir"])
    # the reader fixed: the listed case passes, which fails the run until it leaves the list
    rc, doc, text = _run("--json", "--known-failures", str(known), *picked, "--",
                         sys.executable, str(ADAPTER))
    assert rc == 1 and doc is not None, text
    (failure,) = doc["failures"]
    assert "passes, but --known-failures" in failure["message"]
    assert "reader --case valid-per-rank --keep-work" in failure["replay"]
    # another case that fails is a failure as ever
    rc, doc, text = _run("--json", "--known-failures", str(known), *picked, "--",
                         sys.executable, str(BAD), env={"PCK_BAD_MODE": "one-code"})
    assert rc == 1 and doc is not None, text
    assert sorted(f["name"] for f in doc["failures"]) == ["1.0/invalid-bad-checksum",
                                                          "1.0/valid-per-rank"]
    shutil.rmtree(doc["workdir"])
    known.write_text(json.dumps(["valid-per-rank", "valid-per-rnak"]))
    rc, _, text = _run("--known-failures", str(known), *picked, "--", sys.executable,
                       str(ADAPTER))
    assert rc == 2 and "names no reader case 'valid-per-rnak'" in text
    known.write_text("{")
    assert _run("--known-failures", str(known), *picked, "--", sys.executable,
                str(ADAPTER))[0] == 2


def test_a_known_failure_is_excused_only_as_it_failed(tmp_path: Path) -> None:
    """An entry may pin the outcome (`got`): one that changes fails the run; a plain name does
    not excuse an invalid case read without error (a reader that regressed from a wrong code to
    accepting damaged data stayed exit 6); the report's list is a file that pins; a name's set
    must be the case's."""
    known = tmp_path / "known.json"
    case = "invalid-checksum-middle-block-of-a-range"
    first_block = {"PCK_BAD_MODE": "first-block"}  # reads that case without error

    def run(entries: Any, env: dict[str, str]) -> tuple[int, dict[str, Any] | None, str]:
        known.write_text(json.dumps(entries))
        return _run("--json", "--known-failures", str(known), f"--case={case}",
                    "--workdir", str(tmp_path / "work"), "--",
                    sys.executable, str(BAD), env=env)

    rc, doc, text = run([case], first_block)
    assert rc == 1 and doc is not None, text
    (failure,) = doc["failures"]
    assert "excuses only when pinned as" in failure["message"]
    assert "read an invalid case without error: expected PCK-CHECKSUM" in failure["message"]
    rc, doc, text = run([{"case": f"errata-21/{case}", "got": "PCK-STORAGE"}], first_block)
    assert rc == 1 and doc is not None, text
    assert "the known failure changed: got \"ok\", pinned \"PCK-STORAGE\"" in \
        doc["failures"][0]["message"]
    rc, doc, text = run([{"case": case, "got": "ok", "why": "blocks past the first"}],
                        first_block)
    assert rc == 6 and doc is not None, text
    assert doc["known_failures"] == [{"case": f"errata-21/{case}", "got": "ok"}]
    # the report's list, written as the file, pins what it saw
    rc, doc, text = run(doc["known_failures"], {"PCK_BAD_MODE": "one-code"})
    assert rc == 1 and doc is not None, text
    assert "got \"PCK-ERROR\", pinned \"ok\"" in doc["failures"][0]["message"]
    rc, doc, text = run([{"case": case, "got": "PCK-ERROR"}], {"PCK_BAD_MODE": "one-code"})
    assert rc == 6, text
    rc, doc, text = run([{"case": case, "got": None}], {"PCK_BAD_MODE": "one-code"})
    assert rc == 1 and "pinned no result line (null)" in text, text
    for entries, want in (
            (["nonsense-set/" + case], "is a case of set errata-21"),
            ([{"case": "1.0/" + case}], "is a case of set errata-21"),
            ([{"case": case, "got": 3}], "\"got\" of"),
            ([{"case": case, "got": "fine"}], "\"got\" of"),
            ([{"name": case}], "not a JSON list")):
        rc, _, text = run(entries, {})
        assert rc == 2 and want in text, (entries, text)


def test_a_case_of_another_set_is_a_usage_error() -> None:
    """--set 1.1 --case <a 1.0 case> ran nothing (exit 3, "no reader case ran"): exit 2,
    naming the case's set."""
    rc, _, text = _run("--set", "1.1", "--case", "valid-per-rank", "--", sys.executable,
                       str(ADAPTER))
    assert rc == 2 and "valid-per-rank is a case of set 1.0, not of --set 1.1" in text, text
