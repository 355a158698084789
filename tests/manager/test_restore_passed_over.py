"""A restore that resumes older than the newest version names what it passed over (R4).

Incident review R4: ``CheckpointManager.restore`` passed over a newer version it could not or
must not restore (damaged on read, an invalid or lost commit record, a recorded failed
verification) and resumed an older step: for the last two nothing was said at all, for the
first nothing of the verified copy its copy records named; the job retrained the steps in
between and its retention later deleted the damaged version. Rank 0 now says, once, which
versions it passed over, why, where a verified copy of each is and how to bring it back; the
same rows are in ``LoadInfo.passed_over``.

Single-process managers on real files; one two-rank case runs real processes (gloo).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

import portable_ckpt
import portable_ckpt.torch as pckt
from portable_ckpt.cli.main import main
from portable_ckpt.errors import TensorMissingError, UsageError
from portable_ckpt.io.annotations import write_verification_record
from portable_ckpt.io.copy import copy_version
from portable_ckpt.logs import EVENT_ATTR
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage
from portable_ckpt.torch.launch import GroupResult, run_group

pytestmark = pytest.mark.torch

ROOT = str(Path(__file__).resolve().parents[2])


def _state(v: float = 0.0) -> dict[str, Any]:
    return {"w": torch.arange(64.0) + v}


def _job(tmp_path: Path, *, copy: bool = True) -> tuple[str, str, str, str]:
    """A root with steps 3 and 6 (and a verified copy of step 6 at a backup root)."""
    root, backup = str(tmp_path / "ckpt"), str(tmp_path / "backup")
    with pckt.CheckpointManager(root, save_every=3, keep_last=3, async_save=False) as mgr:
        for step in (3, 6):
            mgr.save(step, _state(step))
    three, six = (v.id for v in portable_ckpt.list_versions(root))
    if copy:
        copy_version(f"{root}/{six}", backup)
        assert [v.copied for v in portable_ckpt.list_versions(root)] == [False, True]
    return root, backup, three, six


def _flip_data(version: Path) -> None:
    for data in sorted((version / "data").iterdir()):
        raw = bytearray(data.read_bytes())
        raw[-5] ^= 0xFF
        data.write_bytes(bytes(raw))


def _restore(
    root: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
    *, save: int | None = None, keep_last: int | None = 3,
    faults: list[Fault] | None = None, step: int | None = None,
) -> tuple[Any, list[logging.LogRecord], str]:
    """Restore ``root`` (then save ``save``); the info, the WARNINGs logged, stderr."""
    capsys.readouterr()
    caplog.clear()
    state = _state(1000.0)
    with caplog.at_level(logging.WARNING, logger="portable_ckpt"), pckt.CheckpointManager(
        root, save_every=3, keep_last=keep_last, async_save=False
    ) as mgr:
        if faults:
            tier = mgr.tiers["durable"]
            mgr.tiers["durable"] = dataclasses.replace(
                tier, storage=FaultyStorage(tier.storage, faults))
        info = mgr.restore(state, step=step)
        if save is not None:
            mgr.save(save, state)
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    return info, records, capsys.readouterr().err


def _said(records: list[logging.LogRecord]) -> logging.LogRecord:
    found = [r for r in records if getattr(r, EVENT_ATTR, {}).get("event") ==
             "restore.passed_over"]
    assert len(found) == 1, [r.getMessage() for r in records]
    return found[0]


def _bring_back(root: str, backup: str, ident: str, aside: Path) -> None:
    """What the warning says: set the version aside, copy it back, verify it."""
    shutil.move(f"{root}/{ident}", aside / ident)
    assert main(["copy", f"{backup}/{ident}", root]) == 0
    assert main(["verify", f"{root}/{ident}", "--deep"]) == 0


def test_a_version_damaged_on_read_names_its_verified_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    root, backup, three, six = _job(tmp_path)
    _flip_data(Path(root, six))
    info, records, err = _restore(root, caplog, capsys, save=4)
    assert info.step == 3 and info.checkpoint_id == three  # which version: unchanged
    text = _said(records).getMessage()
    assert _said(records).levelno == logging.WARNING
    assert "restored step 3" in text and "passing over 1 newer version" in text
    assert f"step 6, {root}/{six}: damaged on read ([PCK-CHECKSUM]" in text
    assert f"a copy is recorded at {backup} (verified when made, not since: check it is still there with `portable-ckpt ls`): set {root}/{six} aside" in text
    assert f"`portable-ckpt copy {backup}/{six} {root}`" in text
    assert f"`portable-ckpt verify {root}/{six} --deep`" in text
    assert f"unless they are pinned (`portable-ckpt pin {root}/{six}`)" in text
    # the same lines on stderr, without logging set up (once: one summary line)
    assert err.count("passing over 1 newer version") == 1
    assert f"portable_ckpt:   step 6, {root}/{six}: damaged on read" in err
    [row] = info.passed_over
    assert row["checkpoint_id"] == six and row["step"] == 6 and row["tier"] == "durable"
    assert row["reason"] == "damaged" and row["code"] == "PCK-CHECKSUM"
    assert row["recorded_failed"] is True and row["copies"] == [backup]
    assert row["commands"] == [f"portable-ckpt copy {backup}/{six} {root}",
                               f"portable-ckpt verify {root}/{six} --deep"]
    assert info.passed_over_more == 0
    # the first save after it does not name step 6 as the one a restore resumes
    assert "already holds newer" not in err
    # what it says to do brings step 6 back
    _bring_back(root, backup, six, tmp_path)
    info, records, _ = _restore(root, caplog, capsys)
    assert info.step == 6 and info.passed_over == []
    assert not [r for r in records if getattr(r, EVENT_ATTR, {}).get("event")
                == "restore.passed_over"]


@pytest.mark.parametrize("how", ["truncated", "lost"])
def test_an_invalid_commit_record_is_named_not_silently_passed_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
    how: str,
) -> None:
    root, backup, _three, six = _job(tmp_path)
    record = Path(root, six, "manifest.json")
    if how == "truncated":
        record.write_bytes(record.read_bytes()[: record.stat().st_size // 2])
    else:  # lost: the version still holds its copy record (status invalid, R1)
        record.unlink()
    info, records, err = _restore(root, caplog, capsys, save=4)
    assert info.step == 3
    text = _said(records).getMessage()
    code = "PCK-MANIFEST-MISSING" if how == "lost" else "PCK-JSON-INVALID"
    assert f"step 6, {root}/{six}: invalid commit record ([{code}]" in text
    [row] = info.passed_over
    assert row["checkpoint_id"] == six and row["reason"] == "invalid" and row["code"] == code
    assert row["copies"] == [backup] and row["recorded_failed"] is False
    assert f"`portable-ckpt copy {backup}/{six} {root}`" in text
    assert "portable-ckpt pin" not in text  # gc keeps an invalid version (R-GC-10)
    assert "passing over 1 newer version" in err
    assert "already holds newer" not in err
    _bring_back(root, backup, six, tmp_path)
    assert _restore(root, caplog, capsys)[0].step == 6


def test_a_recorded_failed_verification_is_named_with_its_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    root, backup, _three, six = _job(tmp_path)
    write_verification_record(open_storage(root), six, ok=False, mode="deep", fraction=None,
                              chunks=1, verifier="test",
                              errors=[{"code": "PCK-CHECKSUM", "message": "block 0 differs"}])
    info, records, err = _restore(root, caplog, capsys, save=4)
    assert info.step == 3
    text = _said(records).getMessage()
    assert f"step 6, {root}/{six}: failed verification ([PCK-CHECKSUM] block 0 differs)" in text
    assert f"unless they are pinned (`portable-ckpt pin {root}/{six}`)" in text
    assert f"`portable-ckpt copy {backup}/{six} {root}`" in text
    assert "passing over 1 newer version" in err
    [row] = info.passed_over
    assert row["reason"] == "failed_verification" and row["code"] == "PCK-CHECKSUM"
    assert row["message"] == "block 0 differs" and row["copies"] == [backup]
    # the first save's message still reads right (incident review R7)
    assert "already holds newer" not in err
    _bring_back(root, backup, six, tmp_path)
    assert _restore(root, caplog, capsys)[0].step == 6


def test_without_a_copy_it_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _backup, _three, six = _job(tmp_path, copy=False)
    _flip_data(Path(root, six))
    info, records, _ = _restore(root, caplog, capsys, keep_last=None)
    [row] = info.passed_over
    assert row["copies"] == [] and row["commands"] == [] and row["copies_error"] is None
    text = _said(records).getMessage()
    assert "damaged on read" in text and "no verified copy of it is recorded" in text
    assert "portable-ckpt pin" not in text  # no retention policy: nothing deletes it


def test_unreadable_copy_records_are_mentioned_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _backup, _three, six = _job(tmp_path)
    record = Path(root, six, "manifest.json")
    record.write_bytes(b"{")
    fault = Fault(op="list", path=f"{six}/copies*")
    info, records, _ = _restore(root, caplog, capsys, faults=[fault])
    assert fault.fired and info.step == 3
    [row] = info.passed_over
    assert row["copies"] == [] and row["copies_error"] and "EIO" in row["copies_error"]
    text = _said(records).getMessage()
    assert "its copy records could not all be read" in text
    assert "no verified copy" not in text


def test_only_newer_versions_are_named_a_handful_at_most(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(tmp_path / "ckpt")
    with pckt.CheckpointManager(root, save_every=1, async_save=False) as mgr:
        for step in range(1, 13):
            mgr.save(step, _state(step))
    versions = portable_ckpt.list_versions(root)
    for v in versions[:2] + versions[3:]:  # step 3 restorable; 1, 2 older, 4..12 newer
        write_verification_record(open_storage(root), v.id, ok=False, mode="deep",
                                  fraction=None, chunks=1, verifier="test",
                                  errors=[{"code": "PCK-CHECKSUM", "message": "x"}])
    info, records, _ = _restore(root, caplog, capsys, keep_last=None)
    assert info.step == 3
    assert [r["step"] for r in info.passed_over] == [12, 11, 10, 9, 8, 7, 6, 5]
    assert info.passed_over_more == 1
    text = _said(records).getMessage()
    assert "passing over 9 newer version(s)" in text and "and 1 more" in text
    assert "step 4," not in text and "step 2," not in text
    # asked for step 3, newer steps are not passed over but not asked for; those that failed
    # verification are not named as the steps the next restore() resumes either
    info, records, err = _restore(root, caplog, capsys, keep_last=None, step=3)
    assert info.step == 3 and info.passed_over == [] and "passing over" not in err
    assert "this job also holds newer steps" not in err
    shutil.rmtree(Path(versions[3].path, "verifications"))  # step 4 repaired by hand
    info, records, err = _restore(root, caplog, capsys, keep_last=None, step=3)
    assert "this job also holds newer steps [4]:" in err and "resumes step 4" in err


def test_a_newest_save_without_its_record_is_named_with_the_recommit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """On-call review 23, F2: the newest version lost its `manifest.json` in a job without
    verification records (`verify_sample=0`): it is `incomplete`, and the restart resumed step
    3 without naming it (no passed-over row, the metric 0) before retention deleted its intact
    data. Every writer's index being there, it is named, with the recommit that brings it back;
    a save that never got that far (an index missing) is not."""
    root, _backup, _three, six = _job(tmp_path, copy=False)
    Path(root, six, "manifest.json").unlink()
    info, records, err = _restore(root, caplog, capsys)
    assert info.step == 3
    [row] = info.passed_over
    assert row["checkpoint_id"] == six and row["reason"] == "uncommitted"
    assert row["code"] == "PCK-MANIFEST-MISSING" and row["recorded_failed"] is False
    text = _said(records).getMessage()
    assert f"portable-ckpt recommit {root}/{six} --was-committed" in text
    # An attempt without its record alone: most often a run killed while committing, not an
    # incident (stop 27 review: "trained again unless you bring one back" alarmed for it).
    assert "passing over 1 newer version(s) without a commit record: most often the last " \
        "run was killed while committing that save, and nothing needs doing" in err
    assert "unless you stop the job" not in err
    # counted apart from the versions passed over: a crash during a commit leaves the same
    import json

    events = tmp_path / "events.jsonl"
    with pckt.CheckpointManager(root, save_every=3, async_save=False, events=str(events)) as mgr:
        assert mgr.restore(_state(1000.0)).step == 3
    (ev,) = [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "restore"]
    assert ev["passed_over_count"] == 0 and ev["uncommitted_count"] == 1, ev
    # a restart loop killed during ten commits: still not counted as versions passed over
    # (review E2: the ones beyond the eight named were)
    copies = [Path(root, f"s{7 + i:012d}-20990101T000000000000Z-{i:016x}") for i in range(10)]
    for c in copies:
        shutil.copytree(Path(root, six), c)
    events.unlink()
    with pckt.CheckpointManager(root, save_every=3, async_save=False, events=str(events)) as mgr:
        info = mgr.restore(_state(1000.0))
    (ev,) = [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "restore"]
    assert ev["passed_over_count"] == 0 and info.passed_over_more == 0, ev
    assert ev["uncommitted_count"] == 8 and info.passed_over[0]["checkpoint_id"] == copies[-1].name
    # beside an invalid commit record, the attempts without a record are no reason for calm
    invalid = Path(root, f"s{99:012d}-20990101T000000000000Z-{0:016x}")
    shutil.copytree(sorted(Path(root).glob("s000000000003-*"))[0], invalid)  # its id differs
    info, records, err = _restore(root, caplog, capsys)
    assert [r["reason"] for r in info.passed_over][:2] == ["invalid", "uncommitted"], \
        info.passed_over
    assert "trained again unless you stop the job and bring one back" in err
    assert "nothing needs doing" not in err
    shutil.rmtree(invalid)
    for c in copies:
        shutil.rmtree(c)
    assert main(["recommit", f"{root}/{six}", "--was-committed"]) == 0  # as it says
    assert _restore(root, caplog, capsys)[0].step == 6
    # a save cut short before every writer finished: nothing to bring back, nothing said
    Path(root, six, "manifest.json").unlink()
    for index in Path(root, six, "index").iterdir():
        index.unlink()
    info, records, err = _restore(root, caplog, capsys)
    assert info.step == 3 and info.passed_over == [] and "passing over" not in err


def test_a_restore_of_the_newest_version_says_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _backup, _three, _six = _job(tmp_path)
    info, records, err = _restore(root, caplog, capsys)
    assert info.step == 6 and info.passed_over == [] and info.passed_over_more == 0
    assert not records and "passing over" not in err


def _run(fn: str, *args: Any) -> list[Any]:
    res: GroupResult = run_group(f"tests.manager._restore_workers:{fn}", 2, args, timeout=120,
                                 pg_timeout=45, sys_path=[ROOT])
    res.raise_for_errors()
    return list(res.results)


def test_two_ranks_rank_zero_says_it_every_rank_lists_it(tmp_path: Path) -> None:
    root, backup = tmp_path / "ckpt", tmp_path / "backup"
    _run("populate", str(root))
    old, new = portable_ckpt.list_versions(root)
    copy_version(new.path, str(backup))
    _flip_data(Path(new.path))
    out = _run("restore_passed_over", str(root))
    assert [o["step"] for o in out] == [2, 2]
    said = [line for line in out[0]["said"] if "passing over 1 newer version" in line]
    assert len(said) == 1 and f"restored step 2 ({old.id})" in said[0]
    assert [line for line in out[0]["said"] if f"portable-ckpt copy {backup}/{new.id}" in line]
    assert not [line for line in out[1]["said"] if "passing over" in line or "step 4" in line]
    assert out[0]["passed_over"] == out[1]["passed_over"]
    [row] = out[0]["passed_over"]
    assert row["checkpoint_id"] == new.id and row["reason"] == "damaged"
    assert row["copies"] == [str(backup)]


def _fail(root: str, ident: str) -> None:
    write_verification_record(open_storage(root), ident, ok=False, mode="deep", fraction=None,
                              chunks=1, verifier="test",
                              errors=[{"code": "PCK-CHECKSUM", "message": "block 0 differs"}])


def test_when_every_version_failed_the_error_names_the_copy_and_the_repair(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """R4 for a restore that resumes nothing: the error names the newest failed version's
    recorded copy and the clearing of a version repaired in place (R-DRILL-10)."""
    root, backup, three, six = _job(tmp_path)
    _fail(root, three)
    _fail(root, six)
    with pytest.raises(portable_ckpt.CheckpointError) as err:
        _restore(root, caplog, capsys)
    text = err.value.message
    assert f"a copy of {six} is recorded at {backup} (verified when made, not since)" in text
    assert f"`portable-ckpt copy {backup}/{six} {root}`" in text
    assert f"`portable-ckpt verify {root}/{six} --deep --clear-failed`" in text


def test_a_version_whose_failure_was_cleared_is_restored_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-DRILL-8, R-DRILL-10: the manager passes over a failed version, and resumes it once a
    deep verification asked to clear the failure passed (its bytes are intact)."""
    root, _backup, _three, six = _job(tmp_path, copy=False)
    _fail(root, six)
    assert _restore(root, caplog, capsys)[0].step == 3
    assert main(["verify", f"{root}/{six}", "--deep", "--clear-failed"]) == 0
    info, records, _ = _restore(root, caplog, capsys)
    assert info.step == 6 and info.passed_over == []


def test_the_metrics_count_the_versions_passed_over(tmp_path: Path) -> None:
    """An alert needs a number: ``pck_restore_passed_over`` in the Prometheus textfile."""
    root, _backup, _three, six = _job(tmp_path, copy=False)
    _fail(root, six)
    prom = tmp_path / "metrics.prom"
    with pckt.CheckpointManager(root, save_every=3, async_save=False, events=str(prom)) as mgr:
        assert mgr.restore(_state()).step == 3
    assert 'pck_restore_passed_over{tier="durable",rank="0",' in prom.read_text()
    line = next(x for x in prom.read_text().splitlines()
                if x.startswith("pck_restore_passed_over{"))
    assert line.endswith(" 1.0")


def test_copy_records_are_read_within_a_time_budget(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The other ranks wait while rank 0 reads copy records: past its budget it reads no more
    and says so, and the restore stands (review of the change)."""
    from portable_ckpt.torch import _restore_passed_over

    root, _backup, three, six = _job(tmp_path)
    _fail(root, six)
    monkeypatch.setattr(_restore_passed_over, "COPIES_SECONDS", 0.0)
    info, _, _ = _restore(root, caplog, capsys)
    assert info.checkpoint_id == three
    [row] = info.passed_over
    assert row["copies"] == [] and "ran out" in str(row["copies_error"])


def test_a_failure_that_could_not_be_recorded_is_not_called_recorded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """Maintainer review, 4: when the failed verification could not be written, the report
    said ``recorded_failed`` and warned that retention deletes the version."""
    root, _backup, three, six = _job(tmp_path)
    _flip_data(Path(root, six))
    info, records, _ = _restore(root, caplog, capsys, keep_last=None, faults=[
        Fault(op="create", path="*/verifications/*", error="EIO")])
    assert info.checkpoint_id == three
    [row] = info.passed_over
    assert row["reason"] == "damaged" and row["recorded_failed"] is False


def test_what_a_record_says_reaches_the_terminal_escaped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """Attack review 12b, B2: a failed record's message (anyone who can write the root writes
    it) reached the restore's stderr and log with its escape sequences: 22 raw ESC characters
    erased and rewrote lines of the terminal."""
    root, _backup, _three, six = _job(tmp_path)
    write_verification_record(open_storage(root), six, ok=False, mode="deep", fraction=None,
                              chunks=1, verifier="test", errors=[{
                                  "code": "PCK-CHECKSUM",
                                  "message": "block 0\x1b[2J\x1b[1;1Hall good\rrestored 6\x07"}])
    info, records, err = _restore(root, caplog, capsys)
    assert info.step == 3
    text = _said(records).getMessage()
    for out in (err, text):
        assert not any(c in out for c in "\x1b\r\x07"), out
    assert "block 0\\x1b[2J" in err and "\\x07" in text


@pytest.mark.parametrize("grown", ["shape", "key"])
def test_a_target_the_newest_version_does_not_fit_is_raised_not_passed_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
    grown: str,
) -> None:
    """An error of the caller's own target (another shape: PCK-USAGE; a key the newest version
    lacks: PCK-TENSOR-MISSING) would repeat on every version: restore() raises it and never
    passes over to an older version it happens to fit, nor records the newest as damaged.

    Test audit 21b, R01 (every CheckpointError taken as a reason to fall back) and R02
    (TensorMissingError left out of the caller's errors): no test had a newest version the
    target does not fit beside an older one it does, and restore() silently resumed the older
    step, reporting success."""
    root = str(tmp_path / "ckpt")
    old, new = (({"w": torch.ones(4)}, {"w": torch.ones(6)}) if grown == "shape"  # model grew
                else ({"w": torch.ones(4), "head": torch.ones(2)}, {"w": torch.ones(4)}))
    with pckt.CheckpointManager(root, save_every=1, async_save=False,
                                continuation="statistical") as mgr:
        mgr.save(1, old)
        mgr.save(2, new)
    target = {k: torch.zeros_like(v) for k, v in old.items()}  # fits step 1 only
    error, says = ((UsageError, "the checkpoint holds shape \\[6\\]") if grown == "shape"
                   else (TensorMissingError, "'head'"))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="portable_ckpt"), pckt.CheckpointManager(
        root, save_every=1, async_save=False
    ) as mgr, pytest.raises(error, match=says):  # what step 2 holds: the newest was tried
        mgr.restore(target)
    assert all(bool((t == 0).all()) for t in target.values())  # nothing of step 1 loaded
    assert "passing over" not in capsys.readouterr().err
    assert not [r for r in caplog.records if getattr(r, EVENT_ATTR, {}).get("event")
                == "restore.passed_over"]
    assert [(v.step, v.verification_failed) for v in portable_ckpt.list_versions(root)] == [
        (1, False), (2, False)]
