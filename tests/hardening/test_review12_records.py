"""Attack review 12: files an attacker drops among a version's post-commit records.

Each test is a reproduction from the review, on real files and the real CLI: a record that
costs far more to turn away than to parse (A1), records kept whole in memory (A2), the history of
a clearing forgotten by the checker once moved (A3), a non-file where a move puts a cleared
record (A5), a file named like a record directory (A6), and a malformed format version read as a
newer major one (A7).
"""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

import pytest

from portable_ckpt.errors import SchemaError
from portable_ckpt.format.schemas import validate_document
from portable_ckpt.io.annotations import read_annotations
from portable_ckpt.storage import open_storage

from ..rules.test_r_drill_10 import _cli, _failed_record, _latest, _root

FAILED = "v20260101T000000000000Z-00000001"


def _record(v: Path, vid: str, **changes: object) -> dict[str, object]:
    rec: dict[str, object] = {
        "format": "portable-ckpt-verification", "format_version": "1.0", "attempt_id": v.name,
        "verification_id": vid, "verified_at": "2026-01-01T00:00:00Z", "ok": False,
        "mode": "deep", "fraction": None, "chunks": 1, "seed": None,
        "errors": [{"code": "PCK-CHECKSUM", "message": "block 0"}]}
    rec.update(changes)
    (v / "verifications").mkdir(exist_ok=True)
    (v / "verifications" / f"{vid}.json").write_text(json.dumps(rec))
    return rec


def test_an_invalid_record_costs_about_what_parsing_it_costs(tmp_path: Path) -> None:
    """A1: a 4 MB failed record whose ``errors`` holds two million bad items took 100 s to
    turn away (an error object for each item, the best chosen among all), at every listing."""
    doc = {"format": "portable-ckpt-verification", "format_version": "1.0",
           "attempt_id": "s000000000001-20260101T000000000000Z-0123456789abcdef",
           "verification_id": FAILED, "verified_at": "2026-01-01T00:00:00Z", "ok": False,
           "mode": "deep", "fraction": None, "chunks": 1, "seed": None,
           "errors": [0] * 2_000_000}
    t0 = time.process_time()  # (CPU: other processes do not count)
    with pytest.raises(SchemaError, match="PCK-SCHEMA"):
        validate_document(doc, "1.2/verification.schema.json", what="x")
    assert time.process_time() - t0 < 5.0  # 100 s before (the parse alone: about 0.05 s)


def test_a_listing_keeps_what_tools_read_of_a_record(tmp_path: Path) -> None:
    """A2: a valid failed record may carry unknown members and 1,024 long messages; a listing
    kept each whole, about 20 times its bytes (three 60 MB records: 3.75 GB for ``ls``)."""
    _, (_, v2) = _root(tmp_path)
    _record(v2, FAILED, pad=["x" * 1000] * 5000,
            errors=[{"code": "PCK-CHECKSUM", "message": "m" * 60_000}] * 1024)
    tracemalloc.start()
    try:
        [rec] = read_annotations(open_storage(v2.parent), v2.name, "verifications")
        kept = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert "pad" not in rec and len(rec["errors"]) == 8
    assert all(len(e["message"]) == 4096 for e in rec["errors"])
    assert rec["ok"] is False and rec["verification_id"] == FAILED  # still counts: failed
    assert kept < 4 << 20  # (the record is 66 MB on disk)


def test_the_members_kept_are_the_schemas(tmp_path: Path) -> None:
    from portable_ckpt.io.annotations import _MEMBERS

    spec = Path(__file__).resolve().parents[2] / "spec" / "schemas"
    members = {k for kind in ("verification", "drill", "copy")
               for k in json.loads((spec / f"{kind}.schema.json").read_text())["properties"]}
    assert _MEMBERS == members | {"clears"}


def test_a_non_file_where_a_cleared_record_goes_is_a_problem_not_a_move(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A5: a directory at ``verifications/cleared/<id>.json`` read as "moved by another run":
    --clear-failed and gc said success while releases before 1.2 still counted the version
    as failed."""
    root, (_, v2) = _root(tmp_path)
    _failed_record(v2, FAILED)
    (v2 / "verifications" / "cleared" / f"{FAILED}.json").mkdir(parents=True)
    code, out, err = _cli(capsys, "verify", str(v2), "--deep", "--clear-failed")
    assert code == 1 and "or is no regular file" in out, (out, err)
    assert (v2 / "verifications" / f"{FAILED}.json").is_file()
    # The pass was recorded and clears it for 1.2 tools; the output does not contradict itself.
    assert "never restored" not in err
    assert _latest(capsys, root) == v2.name


def test_a_file_named_like_a_record_directory_is_reported_by_the_checker(
    tmp_path: Path,
) -> None:
    """A6: a regular file named ``verifications`` keeps every failure of the version from
    being recorded; the conformance checker called the root conformant."""
    from conformance.checker import check

    root, (_, v2) = _root(tmp_path)
    (v2 / "verifications").write_text("x")
    report = check(root)
    assert any("'verifications' is a regular file, not a directory" in e.message
               for e in report.errors), report.errors


@pytest.mark.parametrize("version", ["01.0", "0.9", "1.02"])
def test_a_malformed_format_version_is_no_newer_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], version: str
) -> None:
    """A7: a record of ``"01.0"`` or ``"0.9"`` was taken for a newer major version, and
    restores stopped (exit 69); malformed (§16.1), it is no record that counts."""
    root, (_, v2) = _root(tmp_path)
    _record(v2, FAILED, format_version=version)
    assert _latest(capsys, root) == v2.name  # exit 0: not failed, not unknown


def test_two_point_oh_is_still_a_newer_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, (_, v2) = _root(tmp_path)
    _record(v2, FAILED, format_version="10.0")
    code, _, err = _cli(capsys, "ls", str(root), "--latest")
    assert code == 69 and "newer than this tool implements" in err


def test_the_checker_compares_a_clearing_with_the_moved_failure(tmp_path: Path) -> None:
    """A3: a clearing dated before the failure it lists was warned of only while the failure
    was still in verifications/; once moved, the checker said nothing."""
    from conformance.checker import check

    root, (_, v2) = _root(tmp_path)
    _record(v2, FAILED, verified_at="2026-06-01T00:00:00Z")
    clearing = "v20250101T000000000000Z-0000000c"
    _record(v2, clearing, format_version="1.2", ok=True, errors=[], fraction=1.0,
            verified_at="2025-01-01T00:00:00Z", clears=[FAILED])
    cleared = v2 / "verifications" / "cleared"
    cleared.mkdir()
    (v2 / "verifications" / f"{FAILED}.json").rename(cleared / f"{FAILED}.json")
    report = check(root)
    assert any("finished after this verification did" in w.message for w in report.warnings), (
        report.warnings)


def test_the_checker_turns_away_a_huge_branch_of_a_one_of_quickly(tmp_path: Path) -> None:
    """B4 (attack review 12b): jsonschema's oneOf lists every error of each branch; a 4 MB
    manifest whose ``continuation.mesh.shape`` held a million strings took the checker 33 s
    and 3.5 GB. One error per branch decides it."""
    from conformance.checker import check

    root, (v1, _) = _root(tmp_path)
    doc = json.loads((v1 / "manifest.json").read_text())
    doc["continuation"]["mesh"] = {"shape": ["x"] * 300_000, "dim_names": ["a"]}
    (v1 / "manifest.json").write_text(json.dumps(doc))
    t0 = time.process_time()  # (CPU: other processes do not count)
    report = check(v1)
    assert not report.ok and "PCK-SCHEMA" in report.codes
    assert time.process_time() - t0 < 5.0  # 10 s and more before, growing with the array
