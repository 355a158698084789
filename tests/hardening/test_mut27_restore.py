"""Mutation audit 27, a manager's restore: which version it resumes and what it says it passed
over (spec §3 R-ID-4/R-ID-5, §14.5 R-DRILL-8, §15.2 R-GC-13; docs/torch.md "What restore
never takes for nothing to resume"; ``torch/_manager_restore.py``,
``torch/_restore_passed_over.py``).

Single-process managers on real local roots; each test names the mutant it kills.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

import portable_ckpt
import portable_ckpt.torch as pckt
from portable_ckpt.io.copy import copy_version
from portable_ckpt.io.deletion import mark_deletion
from portable_ckpt.storage import open_storage

pytestmark = pytest.mark.torch


def _state(v: float = 0.0) -> dict[str, Any]:
    return {"w": torch.arange(16.0) + v}


def _job(root: Path, steps: tuple[int, ...] = (3, 6)) -> list[str]:
    with pckt.CheckpointManager(str(root), save_every=3, async_save=False) as mgr:
        for step in steps:
            mgr.save(step, _state(step))
    return [v.id for v in portable_ckpt.list_versions(root)]


def _restore(root: Path, fast: Path | None = None, **kw: Any) -> Any:
    """A fresh job's restore (with a fast tier at ``fast``): ``(its LoadInfo, the state)``."""
    state = _state(1000.0)
    tiers: dict[str, Any] = {} if fast is None else {"fast_root": str(fast),
                                                    "handle_sigterm": False}
    with pckt.CheckpointManager(str(root), save_every=3, async_save=False, **tiers) as mgr:
        info = mgr.restore(state, **kw)
    return info, state


def test_a_version_a_gc_was_deleting_is_not_named_as_passed_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """R-GC-13: an attempt that holds a deletion mark and no commit record is a version a gc
    began to delete (retention's, on purpose), not a save cut short at its commit: the restore
    resumes the version before it and names nothing (no "recommit --was-committed", which
    R-GC-13 forbids for it). Two guards say so: ``not v.being_deleted`` in the report and the
    mark check of ``every_writer_indexed``; mutant PO05 dropped the first alone (equivalent,
    the second holds), and with both gone the version was named "uncommitted", with the
    recommit advice, every writer's index being still there."""
    root = tmp_path / "ckpt"
    three, six = _job(root)
    mark_deletion(open_storage(root), six, reason="retention (test)")
    (root / six / "manifest.json").unlink()
    assert [v.being_deleted for v in portable_ckpt.list_versions(root)] == [False, True]
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="portable_ckpt"):
        info, state = _restore(root)
    assert info.checkpoint_id == three and info.step == 3
    assert info.passed_over == [] and info.passed_over_more == 0
    err = capsys.readouterr().err
    assert "passing over" not in err and "recommit" not in err
    assert torch.equal(state["w"], _state(3)["w"])


def _damage(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("fast_copy", ["data damaged", "record invalid"])
def test_a_fast_copy_that_cannot_be_restored_is_not_passed_over_when_the_durable_one_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fast_copy: str
) -> None:
    """One version in both tiers: its fast-tier copy is damaged (found on read, then recorded)
    or its commit record there is invalid (not a candidate), and the restore resumes the same
    version from the durable tier. Nothing newer was passed over, so nothing is named (the
    steps since are not "trained again"). Mutants PO01 (a failed candidate named when its id
    is the restored one, ``>=``) and PO02 (the listing's versions named from the restored id
    up, ``<``): the fast copy was named as a newer version passed over."""
    root, fast = tmp_path / "ckpt", tmp_path / "fast"
    _three, six = _job(root)
    copy_version(str(root / six), str(fast))
    if fast_copy == "data damaged":
        for data in sorted((fast / six / "data").iterdir()):
            _damage(data)
    else:
        _damage(fast / six / "manifest.json")
    capsys.readouterr()
    info, state = _restore(root, fast)
    assert info.checkpoint_id == six and info.step == 6
    assert info.passed_over == [] and info.passed_over_more == 0, info.passed_over
    assert torch.equal(state["w"], _state(6)["w"])
    err = capsys.readouterr().err
    assert "passing over" not in err
    [fast_six] = portable_ckpt.list_versions(fast)
    if fast_copy == "data damaged":  # tried, failed, recorded
        assert "from the fast tier failed" in err and fast_six.verification_failed
    else:
        assert fast_six.status == "invalid"


def test_a_newer_version_passed_over_in_both_tiers_is_named_once_by_its_fast_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """"One version in both tiers is one version passed over (the fast tier's row is
    named)": step 6's commit record is invalid in both tiers, the restore resumes step 3, and
    says it passed over one newer version. Mutants PO10 (no merging by id: step 6 named twice,
    "passing over 2 newer version(s)") and PO09 (the durable tier's row kept on the tie)."""
    root, fast = tmp_path / "ckpt", tmp_path / "fast"
    three, six = _job(root)
    copy_version(str(root / six), str(fast))
    for tier in (root, fast):
        _damage(tier / six / "manifest.json")
    capsys.readouterr()
    info, state = _restore(root, fast)
    assert info.checkpoint_id == three and info.step == 3
    assert [(r["checkpoint_id"], r["tier"], r["reason"]) for r in info.passed_over] == [
        (six, "fast", "invalid")], info.passed_over
    assert info.passed_over_more == 0
    assert "passing over 1 newer version(s)" in capsys.readouterr().err


def _commit_after(version: Path, other: str) -> None:
    """Edit ``version``'s commit record: committed 1 ms after ``other`` (a retried save)."""
    rec = version / "manifest.json"
    doc = json.loads(rec.read_text())
    when = dt.datetime.strptime(other, "%Y-%m-%dT%H:%M:%S.%fZ") + dt.timedelta(milliseconds=1)
    doc["committed_at"] = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    rec.write_text(json.dumps(doc))


def test_an_older_commit_of_the_restored_step_is_not_named_as_passed_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-ID-4: of two versions of one step the later commit is the newer, whatever the ids
    (creation times) say. Here the version of step 6 created first was committed last: the
    restore resumes it, and the other one, created later but committed earlier, is older:
    nothing newer was passed over. Mutant PO07 (every committed version with a greater id
    named): the older commit was named as a newer version passed over, with a made-up reason
    ("failed verification", no code)."""
    root = tmp_path / "ckpt"
    _job(root, (3, 6))
    with pckt.CheckpointManager(str(root), save_every=3, async_save=False) as mgr:
        mgr.save(6, _state(6.5))  # a second version of step 6, created and committed later
    three, six_a, six_b = (v.id for v in portable_ckpt.list_versions(root))
    assert six_a < six_b
    _commit_after(root / six_a, str(portable_ckpt.list_versions(root)[2].committed_at))
    assert [v.id for v in portable_ckpt.list_versions(root)] == [three, six_b, six_a]
    capsys.readouterr()
    info, state = _restore(root)
    assert info.checkpoint_id == six_a and info.step == 6
    assert info.passed_over == [] and info.passed_over_more == 0, info.passed_over
    assert torch.equal(state["w"], _state(6)["w"])
    assert "passing over" not in capsys.readouterr().err


def test_a_newer_commit_of_a_step_on_the_durable_tier_wins_over_the_fast_copy_of_an_older(
    tmp_path: Path,
) -> None:
    """R-ID-4 across tiers: the candidates are ordered by (step, committed_at), the tier only
    breaks a tie. Step 6 was saved again (a retry) on the durable tier after the first save
    was copied to the fast tier: the later commit is resumed. Mutant MR05 (the tier before
    the commit time): the fast tier's older commit of step 6 was resumed."""
    root, fast = tmp_path / "ckpt", tmp_path / "fast"
    _three, six = _job(root)
    copy_version(str(root / six), str(fast))
    with pckt.CheckpointManager(str(root), save_every=3, async_save=False) as mgr:
        mgr.save(6, _state(6.5))
    [again] = [v.id for v in portable_ckpt.list_versions(root) if v.step == 6 and v.id != six]
    info, state = _restore(root, fast)
    assert info.checkpoint_id == again, info.checkpoint_id
    assert torch.equal(state["w"], _state(6.5)["w"])


def test_an_older_commit_of_the_step_created_later_is_not_named_passed_over(
    tmp_path: Path,
) -> None:
    """Mutation audit 27 (the bug it found): the passed-over report ordered attempts by id
    (step, then creation time), not as §3 does (step, commit time, id): at one step, A created
    first and committed last is the newest; B, created later and committed first, failed
    verification; the restore resumed A and named B "passed over: the steps after step 6 are
    trained again"."""
    from portable_ckpt.io.annotations import write_verification_record
    from portable_ckpt.storage import open_storage

    def st(v: float) -> dict[str, Any]:
        return {"w": torch.arange(16.0) + v}

    root = tmp_path / "ckpt"
    with pckt.CheckpointManager(str(root), save_every=3, async_save=False) as m:
        m.save(3, st(3))
        m.save(6, st(6))
    with pckt.CheckpointManager(str(root), save_every=3, async_save=False) as m:
        m.save(6, st(6.5))
    _, a, b = (v.id for v in portable_ckpt.list_versions(root))
    rec = root / a / "manifest.json"
    doc = json.loads(rec.read_text())
    later = portable_ckpt.list_versions(root)[2].committed_at
    doc["committed_at"] = (dt.datetime.strptime(later, "%Y-%m-%dT%H:%M:%S.%fZ")
                           + dt.timedelta(milliseconds=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    rec.write_text(json.dumps(doc))  # A committed last: the newest of step 6 (R-ID-4)
    write_verification_record(open_storage(root), b, ok=False, mode="deep", fraction=None,
                              chunks=1, verifier="test",
                              errors=[{"code": "PCK-CHECKSUM", "message": "x"}])
    with pckt.CheckpointManager(str(root), save_every=3, async_save=False) as m:
        info = m.restore(st(1000.0))
    assert info is not None and info.checkpoint_id == a
    assert info.passed_over == []
