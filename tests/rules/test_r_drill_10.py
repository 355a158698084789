"""Clearing a failed verification of a version repaired in place (spec §14.5, format 1.2).

Incident review R2: bit flips in a data file were found by ``verify --deep`` and recorded as a
failed verification; the engineer replaced the file with the backup's intact copy and a deep
verification passed, but the version stayed failed for good (R-DRILL-8): every restore fell back
past it, and the only way out was to delete records that R-DRILL-9 keeps. ``verify ROOT/ID
--deep --clear-failed`` now records a pass that clears the failed records it read first.
Also here: ``verify ROOT --all`` and drills that record the damage they meet (incident review R5).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.cli.main import main as cli_main
from portable_ckpt.io.annotations import (
    RECORDS_KEPT,
    failed_verifications,
    read_annotations,
    write_verification_record,
)
from portable_ckpt.io.gc import gc
from portable_ckpt.io.versions import list_versions
from portable_ckpt.storage import open_storage

from .._corrupt import flip_byte

_W = np.arange(300_000, dtype=np.float32)


def _root(tmp_path: Path, steps: tuple[int, ...] = (1, 2)) -> tuple[Path, list[Path]]:
    """A root of one-process versions; the data file of each is a few checksum blocks."""
    root = tmp_path / "root"
    for step in steps:
        portable_ckpt.save_arrays(root, {"w": _W + step, "b": np.ones(7, np.float32)}, step=step)
    versions = sorted(p for p in root.iterdir() if p.name.startswith("s"))
    return root, versions


def _data(vdir: Path) -> Path:
    (f,) = sorted((vdir / "data").iterdir())
    return f


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli_main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _latest(capsys: pytest.CaptureFixture[str], root: Path) -> str:
    code, out, _ = _cli(capsys, "ls", str(root), "--latest")
    assert code == 0
    return out.strip().rsplit("/", 1)[-1]


def _records(vdir: Path) -> list[dict[str, Any]]:
    return read_annotations(open_storage(vdir.parent), vdir.name, "verifications")


def test_a_deep_pass_clears_the_failures_of_a_repaired_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-DRILL-10, R-DRILL-8: only an explicit --clear-failed pass clears; a plain pass says
    that the failure still bars the version; damage found again fails it again."""
    root, (v1, v2) = _root(tmp_path)
    good = tmp_path / "good.bin"
    shutil.copyfile(_data(v2), good)
    flip_byte(_data(v2), 5000)
    assert _cli(capsys, "verify", str(v2), "--deep")[0] == 1
    (failed,) = [r["verification_id"] for r in _records(v2) if r["ok"] is False]
    assert _latest(capsys, root) == v1.name

    shutil.copyfile(good, _data(v2))  # the repair: the intact copy of the file
    code, out, _ = _cli(capsys, "verify", str(v2), "--deep")
    # The version still failed verification: a problem of it whatever this pass found (SRE
    # review 2, W2), with the command that clears it.
    assert code == 1
    assert out.startswith(f"PCK-VERIFICATION-FAILED  {v2.name}: an earlier verification failed "
                          f"({failed}) and no pass cleared it"), out
    assert f"`portable-ckpt verify {v2} --deep --clear-failed` clears it" in out
    assert _latest(capsys, root) == v1.name  # a plain pass clears nothing

    code, out, err = _cli(capsys, "verify", str(v2), "--deep", "--clear-failed", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["cleared"] == [failed] and doc["failed_verifications"] == []
    (clearing,) = [r for r in _records(v2) if r.get("clears")]
    assert clearing["format_version"] == "1.2" and clearing["mode"] == "deep"
    assert clearing["clears"] == [failed] and clearing["ok"] is True
    assert _latest(capsys, root) == v2.name
    (info,) = [v for v in list_versions(root) if v.id == v2.name]
    assert not info.verification_failed and info.verified
    assert info.failures_cleared == [failed]
    assert info.to_json()["failures_cleared"] == [failed]
    # The cleared record is history below verifications/cleared/, where no tool counts it: a
    # tool of format 1.0 or 1.1 (which ignores clears) sees no failure either.
    assert not [r for r in _records(v2) if r["ok"] is False]
    assert (v2 / "verifications" / "cleared" / f"{failed}.json").is_file()
    assert not (v2 / "verifications" / f"{failed}.json").exists()

    flip_byte(_data(v2), 9000)  # damaged again: a new failure, which nothing cleared
    assert _cli(capsys, "verify", str(v2), "--deep")[0] == 1
    assert _latest(capsys, root) == v1.name
    assert len(failed_verifications(_records(v2))) == 1


def test_clear_failed_clears_nothing_while_the_damage_remains(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-DRILL-10: a verification that finds a problem records it and clears nothing."""
    root, (v1, v2) = _root(tmp_path)
    flip_byte(_data(v2), 5000)
    assert _cli(capsys, "verify", str(v2), "--deep")[0] == 1
    code, out, _ = _cli(capsys, "verify", str(v2), "--deep", "--clear-failed", "--json")
    assert code == 1 and json.loads(out)["cleared"] == []
    assert not any(r.get("clears") for r in _records(v2))
    assert len(failed_verifications(_records(v2))) == 2
    assert _latest(capsys, root) == v1.name


@pytest.mark.parametrize("argv", [
    ["--clear-failed"],  # not deep
    ["--sample", "0.5", "--clear-failed"],
    ["--deep", "--clear-failed", "--no-record"],
    ["--deep", "--clear-failed", "--record-unreadable"],
    ["--deep", "--clear-failed", "--node-root"],
    ["ROOT", "--deep", "--clear-failed"],  # a root alone: the version is not named
    ["ROOT", "--all", "--deep", "--clear-failed"],
    ["ROOT", "--all", "--step", "1"],
    ["--all"],  # a version, not a root
])
def test_clear_failed_and_all_refuse_usage_before_anything_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """CLI usage errors exit 2 and write no record (R-DRILL-10: only at an explicit request)."""
    root, (_, v2) = _root(tmp_path)
    target = [str(root)] if argv[0] == "ROOT" else [str(v2)]
    before = _records(v2)
    code, _, err = _cli(capsys, "verify", *target, *[a for a in argv if a != "ROOT"])
    assert code == 2, err
    assert _records(v2) == before


def test_a_clearing_record_outlives_pruning_and_gc_counts_the_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-DRILL-9 with R-DRILL-10: later passes prune older records, never the cleared one
    (history below verifications/cleared/); gc --keep 1 keeps the repaired newest version."""
    root, (v1, v2) = _root(tmp_path)
    storage = open_storage(root)
    failed = write_verification_record(
        storage, v2.name, ok=False, mode="sample", fraction=0.5, chunks=1,
        errors=[{"code": "PCK-CHECKSUM", "message": "block 0"}])
    assert _cli(capsys, "verify", str(v2), "--deep", "--clear-failed")[0] == 0
    for _ in range(RECORDS_KEPT + 3):
        assert _cli(capsys, "verify", str(v2), "--deep")[0] == 0
    recs = _records(v2)
    assert (v2 / "verifications" / "cleared" / Path(failed).name).is_file()
    assert [r["clears"] for r in recs if r.get("clears")] == [[Path(failed).stem]]  # kept
    assert len(recs) <= RECORDS_KEPT + 3
    assert not failed_verifications(recs)
    rep = gc(root, keep=1, grace_seconds=0)
    assert v1.name in rep.deleted and v2.exists()


def _failed_and_a_passed_record_clearing_it(
    tmp_path: Path, format_version: str, mode: str, fraction: float
) -> tuple[Path, Path, str, Path]:
    """A failed deep record of the newest version, and a passed record of ``format_version``
    and ``mode`` whose ``clears`` names it, planted by hand: root, version, failed id, record."""
    root, (_, v2) = _root(tmp_path)
    failed = Path(write_verification_record(
        open_storage(root), v2.name, ok=False, mode="deep", fraction=None, chunks=1,
        errors=[{"code": "PCK-CHECKSUM", "message": "block 0"}])).stem
    rec = {"format": "portable-ckpt-verification", "format_version": format_version,
           "attempt_id": v2.name, "verification_id": "v20990101T000000000000Z-0000abcd",
           "verified_at": "2099-01-01T00:00:00Z", "ok": True, "mode": mode,
           "fraction": fraction, "chunks": 1, "seed": None, "errors": [], "clears": [failed]}
    planted = v2 / "verifications" / f"{rec['verification_id']}.json"
    planted.write_text(json.dumps(rec))
    return root, v2, failed, planted


def test_clears_in_a_1_0_record_clears_nothing(tmp_path: Path) -> None:
    """R-VERSION-6, R-VERSION-2: in a record of format 1.0 the member is unknown, ignored."""
    root, v2, failed, _ = _failed_and_a_passed_record_clearing_it(tmp_path, "1.0", "deep", 1.0)
    recs = _records(v2)
    assert len(recs) == 2  # the record counts (a passed deep verification) ...
    assert [r["verification_id"] for r in failed_verifications(recs)] == [failed]  # ... no more
    (info,) = [v for v in list_versions(root) if v.id == v2.name]
    assert info.verification_failed


def test_clears_in_a_passed_sample_record_clears_nothing(tmp_path: Path) -> None:
    """mutation audit 22 A-83: only a passed *deep* verification clears (spec §14.5,
    R-DRILL-10): a valid format-1.2 sample-mode pass naming a failed record in ``clears`` (from
    another tool, or by hand) leaves the version failed; the same record in deep mode clears."""
    from portable_ckpt.io.annotations import cleared_ids

    root, v2, failed, planted = _failed_and_a_passed_record_clearing_it(
        tmp_path, "1.2", "sample", 0.5)
    recs = _records(v2)
    assert len(recs) == 2  # the sample record counts (valid) ...
    assert cleared_ids(recs) == set()  # ... and clears nothing
    assert [r["verification_id"] for r in failed_verifications(recs)] == [failed]
    (info,) = [v for v in list_versions(root) if v.id == v2.name]
    assert info.verification_failed
    rec = json.loads(planted.read_text())
    planted.write_text(json.dumps({**rec, "mode": "deep", "fraction": 1.0}))  # the control
    assert cleared_ids(_records(v2)) == {failed}


def test_verify_all_names_the_newest_version_good_now(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Incident review R5: after a storage incident, every committed version is verified (and
    recorded), invalid attempts are problems of the root, and the newest version a manager
    restores is named; a version that passed at save time but is damaged now is not it."""
    root, (v1, v2, v3) = _root(tmp_path, (1, 2, 3))
    flip_byte(_data(v3), 5000)
    flip_byte(_data(v2), 7000)
    bad = root / "s000000000009-20261205T000000000000Z-00000000000000ff"
    shutil.copytree(v1, bad)
    (bad / "manifest.json").write_text("{")
    code, out, err = _cli(capsys, "verify", str(root), "--all", "--deep", "--json")
    assert code == 1, err
    doc = json.loads(out)
    assert [d["step"] for d in doc["versions"]] == [3, 2, 1]
    assert [d["ok"] for d in doc["versions"]] == [False, False, True]
    assert doc["newest_restorable"]["attempt_id"] == v1.name and not doc["ok"]
    assert [e["attempt_id"] for e in doc["root_errors"]] == [bad.name]
    for v in (v2, v3):  # each damage recorded: managers will not restore them
        assert failed_verifications(_records(v))
    code, out, _ = _cli(capsys, "verify", str(root), "--all")
    assert code == 1
    assert ("1 of 3 committed versions OK (2 more without a problem in this check, but kept "
            "from restores by an earlier failed verification); the newest a manager restores: "
            f"{v1}") in out


def test_verify_all_exits_0_when_every_version_is_good(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, (_, v2) = _root(tmp_path)
    code, out, _ = _cli(capsys, "verify", str(root), "--all", "--sample", "0.5", "--seed", "3")
    assert code == 0
    assert out.count("OK ") == 2 and f"the newest a manager restores: {v2} (step 2)" in out


def test_a_drill_that_meets_damage_records_a_failed_verification(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Incident review R5: a failed drill did not count against the version (R-DRILL-4), so
    ``ls --latest`` and gc kept naming the damaged version; the damage a second read confirms
    is now recorded as a restore records it (R-DRILL-8). --no-record records nothing."""
    pytest.importorskip("torch")
    root, (v1, v2) = _root(tmp_path)
    flip_byte(_data(v2), 5000)
    code, out, _ = _cli(capsys, "drill", str(v2), "--world-size", "1", "--no-record")
    assert code == 1 and not (v2 / "verifications").exists()
    code, out, _ = _cli(capsys, "drill", str(root), "--world-size", "1")
    assert code == 1
    assert "damage recorded as a failed verification" in out
    (rec,) = failed_verifications(_records(v2))
    assert rec["errors"][0]["code"] == "PCK-CHECKSUM" and rec["verifier"] == "portable-ckpt drill"
    assert _latest(capsys, root) == v1.name


def test_a_drill_restoring_non_finite_values_fails_and_drill_json_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutation audit B DR02 and C11 (mut-08, mut-20): a drill whose restored state holds a NaN
    fails (its synthetic step refuses non-finite values: the drill would vouch for a restart
    that diverges), and ``drill --json`` of a failed drill exits 1, like the text output."""
    pytest.importorskip("torch")
    root = tmp_path / "root"
    w = np.arange(8, dtype=np.float32)
    w[3] = np.nan
    portable_ckpt.save_arrays(root, {"w": w}, step=1)
    code, out, _ = _cli(capsys, "drill", str(root), "--world-size", "1", "--json")
    rec = json.loads(out)
    assert rec["ok"] is False, rec
    assert "non-finite" in rec["error"]["message"], rec
    assert code == 1
    assert [v.drilled for v in list_versions(root)] == [False]


def test_ls_shows_the_kind_and_age_of_the_newest_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Incident review R5: VERIFIED "passed" read as "good now" after a storage incident, when
    it was a sampled check at save time: ``ls`` says which kind of check passed, and when."""
    root, (v1, v2) = _root(tmp_path)
    assert _cli(capsys, "verify", str(v1), "--sample", "0.5")[0] == 0
    assert _cli(capsys, "verify", str(v2), "--deep")[0] == 0
    code, out, _ = _cli(capsys, "ls", str(root))
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("s0")}
    assert " passed sample " in rows[v1.name] and "s " in rows[v1.name].split("sample")[1]
    assert " passed deep " in rows[v2.name]
    code, out, _ = _cli(capsys, "ls", str(root), "--json")
    docs = {d["id"]: d for d in json.loads(out)["versions"]}
    assert docs[v1.name]["last_verified"]["mode"] == "sample"
    assert docs[v2.name]["last_verified"]["verified_at"].endswith("Z")


def _failed_record(v: Path, vid: str, verified_at: str = "2026-01-01T00:00:00Z") -> None:
    rec = {"format": "portable-ckpt-verification", "format_version": "1.0",
           "attempt_id": v.name, "verification_id": vid, "verified_at": verified_at,
           "ok": False, "mode": "deep", "fraction": None, "chunks": 1, "seed": None,
           "errors": [{"code": "PCK-CHECKSUM", "message": "block 0"}]}
    (v / "verifications").mkdir(exist_ok=True)
    (v / "verifications" / f"{vid}.json").write_text(json.dumps(rec))


def test_a_record_that_cannot_be_read_stops_a_clearing_not_a_verification(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Review of the change: every verify read the failed records first and stopped on a record
    it could not read (one of a newer major format), checking nothing; now it verifies and
    warns, and a clearing asked for does not happen (a problem that may pass: 75)."""
    _, (_, v2) = _root(tmp_path)
    _failed_record(v2, "v20260101T000000000000Z-00000001")
    bad = {"format": "portable-ckpt-verification", "format_version": "2.0",
           "attempt_id": v2.name, "verification_id": "v20260101T000000000000Z-00000002"}
    (v2 / "verifications" / f"{bad['verification_id']}.json").write_text(json.dumps(bad))
    code, out, err = _cli(capsys, "verify", str(v2), "--deep", "--no-record")
    assert code == 1 and "could not all be read" in err  # verified all the same:
    assert out.splitlines()[0].startswith("PCK-VERIFICATION-FAILED"), out  # the one problem
    code, out, err = _cli(capsys, "verify", str(v2), "--deep", "--clear-failed", "--json")
    doc = json.loads(out)
    assert doc["cleared"] == [] and code == 1, (code, doc)  # a newer format's record: upgrade
    assert (v2 / "verifications" / "v20260101T000000000000Z-00000001.json").exists()
    # verify --all: a restore stops at a version whose records it cannot read (R-ID-5), so no
    # older version is named as the one it takes (maintainer review, 1)
    code, out, _ = _cli(capsys, "verify", str(v2.parent), "--all", "--json")
    doc = json.loads(out)
    assert doc["newest_restorable"] is None and doc["undecided"]["attempt_id"] == v2.name
    assert code == 1


def test_more_than_1024_failures_are_cleared_in_two_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-DRILL-10: a record clears at most 1,024 (the schema's bound), the oldest first; the
    rest are named as still barring, and the next clearing clears them (review of the change:
    1,030 failures made the pass unrecordable and nothing was cleared)."""
    root, (v1, v2) = _root(tmp_path)
    ids = [f"v20260101T0000{i // 100:02d}{i % 100:02d}0000Z-{i:08x}" for i in range(1030)]
    for vid in ids:
        _failed_record(v2, vid)
    code, out, err = _cli(capsys, "verify", str(v2), "--deep", "--clear-failed", "--json")
    doc = json.loads(out)
    assert code == 1, err  # still failed: a script's `&& restart` must not run yet
    assert doc["cleared"] == sorted(ids)[:1024] and doc["failed_verifications"] == sorted(ids)[1024:]
    assert doc["still_failed"] and "6 still keep the version from restores" in err
    assert _latest(capsys, root) == v1.name
    code, out, _ = _cli(capsys, "verify", str(v2), "--deep", "--clear-failed", "--json")
    assert code == 0 and json.loads(out)["cleared"] == sorted(ids)[1024:]
    assert _latest(capsys, root) == v2.name
    assert len(list((v2 / "verifications" / "cleared").iterdir())) == 1030


def test_a_failure_recorded_while_the_clearing_pass_runs_is_not_cleared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-DRILL-10: only records read before the verification began are listed; one recorded
    meanwhile (by a restore on another host) still fails the version, and the output says so
    (review of the change: it said the version was restorable again)."""
    from portable_ckpt.io.reader import Checkpoint

    root, (v1, v2) = _root(tmp_path)
    _failed_record(v2, "v20260101T000000000000Z-00000001")
    real = Checkpoint.verify

    def verify(self: Any, *args: Any, **kw: Any) -> Any:
        out = real(self, *args, **kw)
        _failed_record(v2, "v20260101T000001000000Z-00000002", "2026-01-01T00:00:01Z")
        return out

    monkeypatch.setattr(Checkpoint, "verify", verify)
    code, out, err = _cli(capsys, "verify", str(v2), "--deep", "--clear-failed", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["still_failed"]  # (on-call review 3, F2: it exited 0)
    assert doc["cleared"] == ["v20260101T000000000000Z-00000001"]
    assert doc["failed_verifications"] == ["v20260101T000001000000Z-00000002"]
    assert "1 still keep the version from restores" in err and "may restore" not in err
    assert _latest(capsys, root) == v1.name


def _cut_short(root: Path, v: Path) -> Path:
    """A failed record and the record that clears it, the move not made (a kill before it).

    Returns where the move puts the failed record.
    """
    _failed_record(v, "v20260101T000000000000Z-00000001")
    write_verification_record(open_storage(root), v.name, ok=True, mode="deep", fraction=1.0,
                              chunks=1, clears=["v20260101T000000000000Z-00000001"])
    # (writing the clearing record moved it already: put it back)
    moved = v / "verifications" / "cleared" / "v20260101T000000000000Z-00000001.json"
    moved.rename(v / "verifications" / moved.name)
    return moved


def test_a_move_cut_short_is_finished_by_the_next_clearing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-DRILL-10: the clearing record stored, the failed record still in verifications/ (the
    tool was killed before the move): 1.2 tools count it cleared, older ones do not; the next
    --clear-failed moves it."""
    root, (_, v2) = _root(tmp_path)
    moved = _cut_short(root, v2)
    assert _latest(capsys, root) == v2.name
    assert (v2 / "verifications" / moved.name).exists()
    code, _, err = _cli(capsys, "ls", str(root))
    assert code == 0 and "1 cleared verification record(s) not yet moved" in err
    code, _, err = _cli(capsys, "verify", str(v2), "--deep", "--clear-failed")
    assert code == 0 and "no failed verification of this version to clear" in err
    assert "finished moving 1 record(s)" in err
    assert not (v2 / "verifications" / moved.name).exists() and moved.exists()


@pytest.mark.parametrize("finisher", ["verify", "gc"])
def test_a_move_cut_short_is_finished_by_any_record_writer_or_gc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], finisher: str
) -> None:
    """R-DRILL-10 (SHOULD): every tool of 1.2 that writes or prunes a version's verification
    records finishes a cut-short move (on-call review 3, F1: only --clear-failed did, and the
    previous release's job then resumed an older step and deleted the repaired version)."""
    root, (_, v2) = _root(tmp_path)
    moved = _cut_short(root, v2)
    if finisher == "verify":
        assert _cli(capsys, "verify", str(v2), "--sample", "0.5")[0] == 0
    else:
        assert gc(root, keep=5, grace_seconds=0).kept
    assert moved.is_file() and not (v2 / "verifications" / moved.name).exists()


def test_a_move_never_overwrites_nor_loses_the_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-DRILL-10: the copy is created create-if-absent; a file there with other bytes leaves
    the failed record where it is, reported (implementer review 2, N2: it was deleted, and the
    history lost)."""
    from portable_ckpt.io.annotations import move_cleared

    root, (_, v2) = _root(tmp_path)
    _failed_record(v2, "v20260101T000000000000Z-00000001")
    (v2 / "verifications" / "cleared").mkdir()
    (v2 / "verifications" / "cleared" / "v20260101T000000000000Z-00000001.json").write_text("{}")
    code, out, err = _cli(capsys, "verify", str(v2), "--deep", "--clear-failed")
    assert code == 1 and "exists with other bytes" in out, (out, err)
    assert (v2 / "verifications" / "v20260101T000000000000Z-00000001.json").is_file()
    # A record the version's files list is part of the version: never moved (N9).
    from ._util import edit_manifest, rechecksum

    rel = "verifications/v20260101T000000000000Z-00000001.json"
    (v2 / "verifications" / "cleared" / "v20260101T000000000000Z-00000001.json").unlink()
    edit_manifest(v2, lambda d: d["files"].__setitem__(rel, json.loads(json.dumps(
        next(iter(d["files"].values()))))))
    rechecksum(v2, rel)
    moved, errors = move_cleared(open_storage(root), v2.name, _records(v2))
    assert moved == [] and errors == [] and (v2 / rel).is_file()


def test_clear_failed_refuses_a_step_two_versions_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Incident review 2, F5: --step took the newer of two versions of one step, not the one
    repaired; the version must be named."""
    root, _ = _root(tmp_path, (1, 2))
    portable_ckpt.save_arrays(root, {"w": _W, "b": np.ones(7, np.float32)}, step=2)
    code, _, err = _cli(capsys, "verify", str(root), "--step", "2", "--deep", "--clear-failed")
    assert code == 2 and "2 versions hold step 2" in err


def test_verify_all_cannot_tell_when_the_version_a_restore_takes_is_unreadable(
    tmp_path: Path,
) -> None:
    """Incident review 2, F2: the newest version's file unreadable (a permission): a restore
    stops there (it does not resume an older step), so --all names no older version."""
    from .._cli import unprivileged_cli

    root, (v1, v2) = _root(tmp_path)
    _data(v2).chmod(0)
    try:
        r = unprivileged_cli("verify", str(root), "--all", "--deep", "--json")
    finally:
        _data(v2).chmod(0o644)
    doc = json.loads(r.stdout)
    assert r.returncode == 1, r.stderr
    assert doc["newest_restorable"] is None and doc["undecided"]["attempt_id"] == v2.name
    assert doc["undecided"]["code"] == "PCK-STORAGE"


def test_ls_says_when_verification_records_cannot_be_read(tmp_path: Path) -> None:
    """Incident review 2, F3: the table showed "-" (never verified) and exited 0."""
    from .._cli import unprivileged_cli

    root, (_, v2) = _root(tmp_path)
    _failed_record(v2, "v20260101T000000000000Z-00000001")
    (v2 / "verifications").chmod(0)
    try:
        r = unprivileged_cli("ls", str(root))
    finally:
        (v2 / "verifications").chmod(0o755)
    assert r.returncode == 1, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith(v2.name))
    assert " unreadable " in row and "verification records could not be read" in r.stderr


def test_gc_names_the_kept_versions_that_failed_verification(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Incident review 2, F7: "kept 2: 12, 9" did not say that only one could be restored."""
    root, (v1, v2, v3) = _root(tmp_path, (1, 2, 3))
    _failed_record(v2, "v20260101T000000000000Z-00000001")
    code, out, _ = _cli(capsys, "gc", str(root), "--keep", "2", "--dry-run", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["failed_verification"] == [v2.name]
    code, out, _ = _cli(capsys, "gc", str(root), "--keep", "2", "--dry-run")
    assert f"of the kept, failed verification (never restored): {v2.name}" in out


def test_drill_of_a_root_drills_the_version_a_restore_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Incident review 2, F6: ``drill ROOT`` drilled the newest version though a verification
    had failed it, and failed again on a version no restore takes."""
    pytest.importorskip("torch")
    root, (v1, v2) = _root(tmp_path)
    _failed_record(v2, "v20260101T000000000000Z-00000001")
    code, out, _ = _cli(capsys, "drill", str(root), "--world-size", "1")
    assert code == 0 and v1.name in out and v2.name not in out


def test_verify_all_and_drill_name_a_root_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistyped root is not "no committed version" (user check of the change)."""
    code, _, err = _cli(capsys, "verify", str(tmp_path / "nope"), "--all")
    assert code == 1 and "does not exist" in err
    pytest.importorskip("torch")
    code, _, err = _cli(capsys, "drill", str(tmp_path / "nope"), "--world-size", "1")
    assert code == 1 and "does not exist" in err


def test_clears_max_is_the_schemas_bound() -> None:
    """The bound one clearing record names, in messages and in the clearing, is the schema's."""
    from portable_ckpt.format.manifest import CLEARS_MAX

    spec = Path(__file__).resolve().parents[2] / "spec/schemas/1.2/verification.schema.json"
    clears = json.loads(spec.read_text())["allOf"][1]["then"]["properties"]["clears"]
    assert clears["maxItems"] == CLEARS_MAX


def test_recovery_commands_are_quoted_for_a_shell(tmp_path: Path) -> None:
    """Every message gives the same commands, each word quoted (maintainer review 4, 11: the
    restore's hint left a root with a space unquoted)."""
    import shlex

    from portable_ckpt.io.hints import clear_failed, copy_back, copy_back_commands

    path = str(tmp_path / "my root" / "s000000000012-20261205T000000000000Z-0123456789abcdef")
    assert shlex.split(clear_failed(path)) == [
        "portable-ckpt", "verify", path, "--deep", "--clear-failed"]
    copy, verify = copy_back_commands(path, "/backup root/")
    ident = path.rsplit("/", 1)[1]
    assert shlex.split(copy) == [
        "portable-ckpt", "copy", f"/backup root/{ident}", str(tmp_path / "my root")]
    assert shlex.split(verify) == ["portable-ckpt", "verify", path, "--deep"]
    assert f"set {shlex.quote(path)} aside" in copy_back(path, "/backup root")


def _vector_cases_with_a_status() -> list[tuple[Path, dict[str, Any]]]:
    from conformance.vectors import all_cases

    return [(d, c) for _, d, c in all_cases() if "failed_verification" in c]


@pytest.mark.parametrize(("vdir", "case"), _vector_cases_with_a_status(),
                         ids=[c["name"] for _, c in _vector_cases_with_a_status()])
def test_ls_latest_over_an_older_version_agrees_with_the_vectors(
    vdir: Path, case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-VERSION-14, R-DRILL-8, R-DRILL-12 (vectors 1.2 and errata-16): with an older version
    saved beside the vector's, ``ls --latest`` takes the vector's version when
    ``failed_verification`` is false, passes over it to the older one when true, and stops
    (exit 69, ``PCK-STORAGE``) when null, an unknown status: it takes neither."""
    from conformance.vectors import materialize

    target = materialize(case, tmp_path, vdir)
    root = target.parent
    portable_ckpt.save_arrays(root, {"w": np.arange(4, dtype=np.int64)}, step=1)
    (older,) = [v.id for v in list_versions(root) if v.step == 1]
    code, out, err = _cli(capsys, "ls", str(root), "--latest")
    if case["failed_verification"] is None:
        assert code == 69 and out == "" and "PCK-STORAGE" in err and target.name in err, err
        return
    assert code == 0, err
    want = older if case["failed_verification"] else target.name
    assert out.strip().rsplit("/", 1)[-1] == want


@pytest.mark.parametrize(
    ("vdir", "case"), [(d, c) for d, c in _vector_cases_with_a_status() if c["failed_verification"] is None],
    ids=[c["name"] for _, c in _vector_cases_with_a_status() if c["failed_verification"] is None])
def test_gc_keeps_a_version_of_unknown_status_and_gives_it_no_place(
    vdir: Path, case: dict[str, Any], tmp_path: Path
) -> None:
    """R-GC-12 (errata 17), on the vectors whose status is unknown (errata-16): gc does not
    delete the version, it is not among the `keep` greatest (the newest known version is kept
    as well, an older one deleted), and gc reports it as not classified."""
    from conformance.vectors import materialize
    from portable_ckpt.io.gc import gc
    from portable_ckpt.storage import open_storage

    target = materialize(case, tmp_path, vdir)
    root = target.parent
    for step in (1, 2):
        portable_ckpt.save_arrays(root, {"w": np.arange(4, dtype=np.int64)}, step=step)
    by_step = {v.step: v.id for v in list_versions(root) if v.id != target.name}
    report = gc(open_storage(root), keep=1, grace_seconds=0.0)
    assert (target / "manifest.json").exists() and target.name not in report.deleted
    assert target.name in [u["id"] for u in report.unknown] and not report.complete
    assert report.deleted == [by_step[1]] and by_step[2] in report.kept, report


def test_gc_does_not_take_a_drilled_version_of_unknown_status_for_the_newest_drilled(
    tmp_path: Path,
) -> None:
    """R-GC-12: a version whose status is unknown is not the newest drilled version of R-GC-2
    either. Here it (step 10) and step 1 were drilled: gc keeps step 1 as the newest drilled
    of the versions it knows, and step 2 as the greatest; nothing is deleted."""
    from conformance.vectors import materialize
    from portable_ckpt.io.annotations import write_drill_record
    from portable_ckpt.io.gc import gc
    from portable_ckpt.storage import open_storage

    [(vdir, case)] = [(d, c) for d, c in _vector_cases_with_a_status()
                      if c["name"] == "verification-record-of-major-2"]
    target = materialize(case, tmp_path, vdir)
    root = target.parent
    for step in (1, 2):
        portable_ckpt.save_arrays(root, {"w": np.arange(4, dtype=np.int64)}, step=step)
    by_step = {v.step: v.id for v in list_versions(root) if v.id != target.name}
    drill = {"ok": True, "started_at": "2026-11-29T00:00:00Z", "finished_at": "2026-11-29T00:00:01Z",
             "world_size": 1, "saved_world_size": 1, "contract": "exact", "measurements": {},
             "error": None}
    storage = open_storage(root)
    for ident in (by_step[1], target.name):
        write_drill_record(storage, ident, drill)
    report = gc(storage, keep=1, grace_seconds=0.0)
    assert report.deleted == [] and report.protected == by_step[1], report
    assert {by_step[1], by_step[2]} <= set(report.kept) and target.name not in report.kept
