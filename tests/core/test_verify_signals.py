"""What a scheduled ``verify`` tells an alert (SRE review 2): its exit status and ``ok`` agree.

W2: a version that failed verification, with a sampled pass that missed its damage, exited 0
one hour and 1 the next for one unchanged incident. W3: a verification whose record could not
be written exited 1 with ``"ok": true`` and no problem listed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..rules.test_r_drill_10 import _cli, _failed_record, _root

FAILED = "v20260101T000000000000Z-00000001"


@pytest.mark.parametrize("how", [["--sample", "0.5"], ["--deep"], []])
def test_a_version_that_failed_verification_is_a_problem_whatever_this_pass_finds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: list[str]
) -> None:
    root, (_, v2) = _root(tmp_path)
    _failed_record(v2, FAILED)  # an earlier verification failed; this pass finds nothing
    code, out, _ = _cli(capsys, "verify", str(v2), *how, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False and doc["still_failed"], doc
    assert [e["code"] for e in doc["errors"]] == ["PCK-VERIFICATION-FAILED"], doc
    assert FAILED in doc["errors"][0]["message"] and "--clear-failed" in doc["errors"][0]["message"]
    code, out, _ = _cli(capsys, "verify", str(root), "--all", *how, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False
    assert [d["ok"] for d in doc["versions"]] == [False, True]
    assert doc["newest_restorable"]["step"] == 1  # the failed one is no restore's


def test_a_verification_that_could_not_be_recorded_is_not_ok(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    from portable_ckpt.storage import LocalStorage, register_scheme
    from portable_ckpt.storage.faults import Fault, FaultyStorage

    root, (_, v2) = _root(tmp_path)
    # No record can be stored (a read-only store alike). Not a file in the records' place:
    # that is records that cannot be read (re-attack 27, 2), which no restore takes.
    scheme = f"norec{os.getpid()}"
    register_scheme(scheme, lambda url: FaultyStorage(LocalStorage(url.split("://", 1)[1]), [
        Fault(op=("create", "open"), path=f"{v2.name}/verifications/*", error="EROFS")]))
    root_url, v2_url = f"{scheme}://{root}", f"{scheme}://{v2}"
    code, out, _ = _cli(capsys, "verify", v2_url, "--sample", "0.5", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False and doc["record"] is None, doc
    [e] = doc["errors"]
    assert e["code"] == "PCK-STORAGE" and e["message"].startswith(
        "the verification was not recorded"), e
    assert doc["record_error"]
    # --all: the version's bytes were fine, so it is still the one a restore takes
    code, out, _ = _cli(capsys, "verify", root_url, "--all", "--sample", "0.5", "--json")
    doc = json.loads(out)
    assert code == 1 and not doc["ok"] and doc["newest_restorable"]["attempt_id"] == v2.name
    code, out, _ = _cli(capsys, "verify", root_url, "--all", "--sample", "0.5")
    assert "1 of 2 committed versions OK (1 more without a problem in this check, but its " \
           "record could not be written)" in out, out


def test_a_pass_dated_ahead_is_not_the_last_verification(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """W4: a host whose clock ran 30 days ahead left a pass that ``ls`` showed as 0 s old for
    30 days (``last_verified`` in the future): an alert on the age of the last verification
    stayed quiet although the crons had stopped."""
    import datetime as dt

    root, (_, v2) = _root(tmp_path)
    assert _cli(capsys, "verify", str(v2), "--deep")[0] == 0
    real = json.loads(_cli(capsys, "ls", str(root), "--json")[1])["versions"][1]["last_verified"]
    ahead = (dt.datetime.now(dt.UTC) + dt.timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    vid = "v20991231T000000000000Z-000000aa"
    rec = {"format": "portable-ckpt-verification", "format_version": "1.0",
           "attempt_id": v2.name, "verification_id": vid, "verified_at": ahead, "ok": True,
           "mode": "deep", "fraction": 1.0, "chunks": 1, "seed": None, "errors": []}
    (v2 / "verifications" / f"{vid}.json").write_text(json.dumps(rec))
    code, out, err = _cli(capsys, "ls", str(root), "--json")
    assert code == 0 and f"1 record(s) dated after now ({vid})" in err, err
    assert json.loads(out)["versions"][1]["last_verified"] == real
    # Only passes dated ahead: shown, and marked.
    (v2 / "verifications").rename(tmp_path / "kept")
    (v2 / "verifications").mkdir()
    (tmp_path / "kept" / f"{vid}.json").rename(v2 / "verifications" / f"{vid}.json")
    code, out, _ = _cli(capsys, "ls", str(root))
    assert "passed deep (dated ahead)" in out, out


def test_a_record_of_a_newer_format_is_no_problem_of_a_recorded_verification(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Review of the change 20, 1: a record of a newer format (another host upgraded first)
    made every recorded verify exit 1 with "a cleared verification record could not be moved";
    it is said, and the verification is what it found (exit 0). A clearing, which must read
    every failed record, does not happen (exit 1 or 75)."""
    _, (_, v2) = _root(tmp_path)
    (v2 / "verifications").mkdir()
    newer = {"format": "portable-ckpt-verification", "format_version": "2.0",
             "attempt_id": v2.name, "verification_id": "v20260101T000000000000Z-00000002"}
    (v2 / "verifications" / f"{newer['verification_id']}.json").write_text(json.dumps(newer))
    code, out, err = _cli(capsys, "verify", str(v2), "--sample", "0.5", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["errors"] == [], doc
    assert "could not all be read" in err and "moved" not in err
    code, out, err = _cli(capsys, "verify", str(v2), "--deep", "--clear-failed")
    assert code in (1, 75) and "nothing cleared" in out, (out, err)


def test_a_clearing_whose_records_cannot_be_read_again_does_not_say_restorable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clearing that cannot read the version's records after its own is stored cannot tell
    whether a failure recorded meanwhile still bars the version: it says so, never "managers
    may restore this version again"."""
    from portable_ckpt.io import annotations

    _, (_, v2) = _root(tmp_path)
    _failed_record(v2, FAILED)
    real = annotations.read_annotations
    calls = {"n": 0}

    def read(storage, attempt, kind, *, errors=None):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        out = real(storage, attempt, kind, errors=errors)
        if calls["n"] > 2 and kind == "verifications" and errors is not None:
            from portable_ckpt.errors import StorageError

            errors.append(StorageError("injected: EIO", path=f"{attempt}/verifications/"))
        return out

    # The third read (after the clearing record is stored) meets a storage error.
    monkeypatch.setattr(annotations, "read_annotations", read)
    code, out, err = _cli(capsys, "verify", str(v2), "--deep", "--clear-failed")
    assert "could not be read again afterwards" in err, err
    assert "may restore this version again" not in err
    assert code != 0


def test_a_record_written_into_a_version_deleted_meanwhile_is_removed_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-DRILL-11 (SRE review 2, V1): a nightly copy wrote its record into a version the job's
    retention had just deleted; the directory of records left was an "invalid" attempt gc kept for good
    (advising to put back a commit record whose data was gone), and every verify --all and gc
    exited 1. The writer removes its own record when the version is gone, and an attempt of
    records only is incomplete (gc deletes it after its grace period)."""
    import shutil

    from portable_ckpt.errors import VersionDeletedError
    from portable_ckpt.io.annotations import write_verification_record
    from portable_ckpt.io.gc import gc
    from portable_ckpt.io.versions import list_versions
    from portable_ckpt.storage.local import LocalStorage

    root, (_, v2) = _root(tmp_path)

    class RacingGc(LocalStorage):
        """The version is deleted (as a gc does) between the writer's check and its write."""

        def create_if_absent(self, path: str, data: bytes) -> bool:
            shutil.rmtree(v2)
            return super().create_if_absent(path, data)

    with pytest.raises(VersionDeletedError, match="was deleted"):
        write_verification_record(RacingGc(str(root)), v2.name, ok=True, mode="deep",
                                  fraction=1.0, chunks=1)
    assert not v2.exists()
    # Records left by a release without that check: incomplete, deleted by gc after its grace.
    (v2 / "copies").mkdir(parents=True)
    (v2 / "copies" / "c20260101T000000000000Z-00000001.json").write_text("{}")
    [v] = [v for v in list_versions(root) if v.id == v2.name]
    assert v.status == "incomplete"
    report = gc(root, keep=1, grace_seconds=0)
    assert v2.name in report.abandoned and not v2.exists()
    # A lost commit record with its data files is still kept (errata 13).
    (_, v1) = (None, next(p for p in root.iterdir() if p.name.startswith("s")))
    (v1 / "copies").mkdir(exist_ok=True)
    (v1 / "copies" / "c20260101T000000000000Z-00000002.json").write_text("{}")
    (v1 / "manifest.json").unlink()
    [v] = [v for v in list_versions(root) if v.id == v1.name]
    assert v.status == "invalid"


def test_a_version_deleted_while_verify_all_runs_is_no_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SRE review 2, V2: the job's retention deleted a version while the nightly `verify --all`
    ran; it exited 1 (PCK-MANIFEST-MISSING) and paged, for nothing a person can do."""
    import shutil

    from portable_ckpt.cli import cmd_verify

    root, (v1, v2, v3) = _root(tmp_path, (1, 2, 3))
    real = cmd_verify._verify_one

    def with_retention(args, ckpt, step, seed):  # type: ignore[no-untyped-def]
        if ckpt.endswith(v1.name):
            shutil.rmtree(v1)  # a retention pass, between the listing and this version
        return real(args, ckpt, step, seed)

    monkeypatch.setattr(cmd_verify, "_verify_one", with_retention)
    code, out, err = _cli(capsys, "verify", str(root), "--all", "--sample", "0.5", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"], (doc, err)
    assert [d["step"] for d in doc["versions"]] == [3, 2]
    assert f"1 version(s) deleted while they were verified (a job's retention or a gc): {v1.name}" in err


def test_versions_committed_while_verify_all_runs_are_no_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On-call review 23, F3: a job that saves more often than a deep check takes commits
    while every `verify --all` runs. Such a version made the run exit 75 ("committed while this
    verification ran"), a 75 that persisted on a healthy root and paged; and a run whose versions
    were all deleted meanwhile by the job's retention exited 1 ("no committed version to
    verify"). Both exit 0 now, naming what was committed meanwhile; a root with no version
    left still exits 1."""
    import shutil

    import numpy as np

    import portable_ckpt
    from portable_ckpt.cli import cmd_verify

    root, (v1, v2) = _root(tmp_path)
    real = cmd_verify._verify_one
    saved: list[str] = []

    def with_a_save(args, ckpt, step, seed):  # type: ignore[no-untyped-def]
        if not saved:  # the job commits step 9 while the first version is checked
            portable_ckpt.save_arrays(root, {"w": np.arange(4.0)}, step=9)
            saved.append("9")
        return real(args, ckpt, step, seed)

    monkeypatch.setattr(cmd_verify, "_verify_one", with_a_save)
    code, out, err = _cli(capsys, "verify", str(root), "--all", "--sample", "0.5", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["undecided"] is None, (doc, err)
    (new,) = doc["committed_meanwhile"]
    assert new.startswith("s000000000009-") and new not in [d["attempt_id"] for d in doc["versions"]]
    assert doc["newest_restorable"]["attempt_id"] == v2.name  # the newest of those checked
    assert "1 version(s) committed while this ran, not checked (the next run checks them)" in err
    code, out, _ = _cli(capsys, "verify", str(root), "--all", "--sample", "0.5")
    assert code == 0 and "committed while this ran" not in out  # the next run checked it

    def retention(args, ckpt, step, seed):  # type: ignore[no-untyped-def]
        name = ckpt.rsplit("/", 1)[-1]
        if not name.startswith("s000000000010-"):  # the job's retention keeps only step 10
            if not saved or saved[-1] != "10":
                portable_ckpt.save_arrays(root, {"w": np.arange(4.0)}, step=10)
                saved.append("10")
            shutil.rmtree(root / name)
        return real(args, ckpt, step, seed)

    monkeypatch.setattr(cmd_verify, "_verify_one", retention)
    code, out, err = _cli(capsys, "verify", str(root), "--all", "--sample", "0.5", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["versions"] == [] and len(doc["committed_meanwhile"]) == 1, (doc, err)
    assert "deleted while they were verified" in err
    for p in root.iterdir():  # nothing left at all: a person must look
        shutil.rmtree(p)
    monkeypatch.setattr(cmd_verify, "_verify_one", real)
    code, _, err = _cli(capsys, "verify", str(root), "--all")
    assert code == 1 and "no committed version to verify" in err, err


def test_ls_names_the_newest_deep_pass_and_a_commit_dated_ahead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SRE review 2, V6: no command's JSON gave the last deep pass, so "no deep verification in
    7 days" could not be alerted on; V4: a commit record dated ahead went without comment."""
    root, (_, v2) = _root(tmp_path)
    assert _cli(capsys, "verify", str(v2), "--deep")[0] == 0
    assert _cli(capsys, "verify", str(v2), "--sample", "0.5")[0] == 0
    code, out, _ = _cli(capsys, "ls", str(root), "--json")
    [_, mine] = json.loads(out)["versions"]
    assert mine["last_verified"]["mode"] == "sample"
    assert mine["last_deep_verified"]["mode"] == "deep"
    doc = json.loads((v2 / "manifest.json").read_text())
    doc["committed_at"] = "2099-01-01T00:00:00.000000Z"
    (v2 / "manifest.json").write_text(json.dumps(doc))
    code, out, err = _cli(capsys, "ls", str(root))
    assert code == 0 and "record(s) dated after now (manifest.json)" in err, err


def test_a_version_deleted_between_its_check_and_its_record_is_no_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Maintainer review 5, 1: deleted after its bytes were checked and before its record was
    written, a version still made `verify --all` exit 1 ("the verification was not
    recorded")."""
    import shutil

    from portable_ckpt.cli import cmd_verify

    root, (v1, v2) = _root(tmp_path)
    real = cmd_verify._record

    def retention_first(storage, attempt, *a, **k):  # type: ignore[no-untyped-def]
        if attempt == v1.name:
            shutil.rmtree(v1)  # a retention pass between the check and the record
        return real(storage, attempt, *a, **k)

    monkeypatch.setattr(cmd_verify, "_record", retention_first)
    code, out, err = _cli(capsys, "verify", str(root), "--all", "--sample", "0.5", "--json")
    assert code == 0 and [d["step"] for d in json.loads(out)["versions"]] == [2], (out, err)
    assert "deleted while they were verified" in err


def test_a_record_whose_create_fails_because_the_version_went_is_no_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On-call review 23, N3: retention deleted the version between its check and its record,
    and the record's create failed with ENOENT (a plain storage error, not "deleted"): the
    nightly `verify --all --deep` exited 1 on a healthy root. A record that failed for a
    version whose commit record is gone now is a deletion, no problem."""
    import shutil

    import portable_ckpt.io.annotations as annotations
    from portable_ckpt.errors import StorageError

    root, (v1, v2) = _root(tmp_path)
    real = annotations.write_verification_record

    def deleted_under_it(storage, attempt, **kw):  # type: ignore[no-untyped-def]
        if attempt == v1.name:
            shutil.rmtree(v1)  # the job's retention, as the record is created
            raise StorageError(f"create {attempt}/verifications/x.json: No such file or directory "
                               "(errno 2)", path=f"{attempt}/verifications/x.json", retryable=False)
        return real(storage, attempt, **kw)

    monkeypatch.setattr(annotations, "write_verification_record", deleted_under_it)
    code, out, err = _cli(capsys, "verify", str(root), "--all", "--deep", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and [d["step"] for d in doc["versions"]] == [2], (doc, err)
    assert "deleted while they were verified" in err
    # a record that fails while the version is still there stays a problem
    monkeypatch.setattr(annotations, "write_verification_record", lambda storage, attempt, **kw: (
        _ for _ in ()).throw(StorageError("create: disk full", path="x", retryable=False)))
    code, out, _ = _cli(capsys, "verify", str(root), "--all", "--deep", "--json")
    assert code == 1 and not json.loads(out)["ok"]


def test_a_check_that_cannot_tell_keeps_the_record(tmp_path: Path) -> None:
    """Maintainer review 5, 2: a storage error in the check after the record was stored left
    the record but reported it as not written; only a definite "absent" removes it."""
    from portable_ckpt.errors import StorageError
    from portable_ckpt.io.annotations import read_annotations, write_verification_record
    from portable_ckpt.storage.local import LocalStorage

    root, (_, v2) = _root(tmp_path)

    class Flaky(LocalStorage):
        """The storage fails to answer about the commit record once the record is stored."""

        stored = False

        def create_if_absent(self, path: str, data: bytes) -> bool:
            Flaky.stored = super().create_if_absent(path, data)
            return Flaky.stored

        def exists(self, path: str) -> bool:
            if Flaky.stored and path.endswith("manifest.json"):
                raise StorageError("injected: EIO", path=path, retryable=True)
            return super().exists(path)

    path = write_verification_record(Flaky(str(root)), v2.name, ok=True, mode="deep",
                                     fraction=1.0, chunks=1)
    assert path.rsplit("/", 1)[1].removesuffix(".json") in [
        r["verification_id"] for r in read_annotations(LocalStorage(str(root)), v2.name,
                                                       "verifications")]


def test_a_newest_version_that_failed_to_open_is_not_committed_meanwhile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """rev23 maintainer review 5: a version that failed to open (an EIO on its record) was
    taken for one committed while the run went: exit 0 with an older newest_restorable, and
    nobody paged. It is undecided (a restore stops there)."""
    import portable_ckpt
    from portable_ckpt.errors import StorageError

    root, (v1, v2) = _root(tmp_path)
    real = portable_ckpt._resolve

    def flaky(ckpt, step):  # type: ignore[no-untyped-def]
        if str(ckpt).endswith(v2.name):
            raise StorageError(f"read {ckpt}/manifest.json: EIO", path="manifest.json", retryable=True)
        return real(ckpt, step)

    monkeypatch.setattr(portable_ckpt, "_resolve", flaky)
    code, out, err = _cli(capsys, "verify", str(root), "--all", "--sample", "0.5", "--json")
    doc = json.loads(out)
    assert doc["committed_meanwhile"] == [], "v2 existed at the start: not committed meanwhile"
    # a restore stops at v2 (it may be the latest): undecided, which operations.md pages on
    assert doc["newest_restorable"] is None and doc["undecided"]["attempt_id"] == v2.name, doc
    assert code == 75 and not doc["ok"], err
