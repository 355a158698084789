"""What an operator's alerts and pager see of a running job (SRE review 2, W5 and W6).

W5: the Prometheus textfile had no freshness signal, and a restart rebuilt it from the new
process's events only: once its saves failed, ``pck_save_step`` was gone, and a job that hung
kept ``pck_commit_ok 1`` for ever. Now ``pck_last_commit_timestamp_seconds`` dates the newest
commit (seeded at restore from the restored version's ``committed_at``), ``pck_save_step`` is
seeded with the restored step, ``pck_last_verify_timestamp_seconds`` dates the last sampled
verification, and counters (``*_total``) count deletions and failed saves since the start.

W6: the job's retention deleted a version a cron verify had marked failed at its next save,
inside ``keep_last``, with nothing on stderr. Rank 0 now says which versions it deleted.

Single-process managers on real files; one two-rank case runs real processes (gloo).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

import portable_ckpt
import portable_ckpt.torch as pckt
from portable_ckpt.io.annotations import write_verification_record
from portable_ckpt.io.copy import copy_version
from portable_ckpt.io.pins import pin
from portable_ckpt.logs import EVENT_ATTR
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage
from portable_ckpt.torch.launch import run_group

pytestmark = pytest.mark.torch

ROOT = str(Path(__file__).resolve().parents[2])
_SAMPLE = re.compile(r'^([a-z_]+)\{tier="([a-z]+)",rank="(\d+)",root="[^"]*"\} (\S+)$')


def _state(v: float = 0.0) -> dict[str, Any]:
    return {"w": torch.arange(64.0) + v}


def _metrics(path: Path) -> dict[tuple[str, str], float]:
    """The samples of a textfile by ``(metric, tier)``, checking its format on the way.

    Every family has one HELP and one TYPE line before its samples, counters end in
    ``_total``, and every sample parses (what node-exporter's textfile collector requires).
    """
    kinds: dict[str, str] = {}
    helped: set[str] = set()
    out: dict[tuple[str, str], float] = {}
    for line in path.read_text().splitlines():
        if line.startswith("# HELP "):
            name = line.split()[2]
            assert name not in helped, f"family {name} declared twice"
            helped.add(name)
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name in helped and name not in kinds and kind in ("gauge", "counter")
            assert (kind == "counter") == name.endswith("_total"), line
            kinds[name] = kind
        else:
            m = _SAMPLE.match(line)
            assert m is not None, f"not a sample: {line!r}"
            assert m.group(1) in kinds, f"a sample before its TYPE line: {line!r}"
            out[(m.group(1), m.group(2))] = float(m.group(4))
    return out


def _epoch(committed_at: str | None) -> float:
    assert committed_at is not None
    return datetime.fromisoformat(committed_at.replace("Z", "+00:00")).timestamp()


def _full(mgr: Any) -> None:
    """The durable root's disk is full: every data file write fails (ENOSPC)."""
    tier = mgr.tiers["durable"]
    mgr.tiers["durable"] = dataclasses.replace(tier, storage=FaultyStorage(
        tier.storage, [Fault(op="write", path="*/data/*", error="ENOSPC")]))


# -- W5: the textfile after a restart --------------------------------------------------------


def test_a_restart_whose_saves_fail_keeps_the_step_and_the_age_of_the_last_commit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """W5 (a), (b), (d): after a restart whose saves fail (disk full), the file still says the
    step and the commit time of the restored version, and counts the failure from 0."""
    root, prom = tmp_path / "ckpt", tmp_path / "metrics.prom"
    with pckt.CheckpointManager(root, save_every=3, async_save=False, events=prom) as mgr:
        for step in (3, 6):
            mgr.save(step, _state(step))
    six = portable_ckpt.list_versions(root)[-1]
    first = _metrics(prom)
    assert first[("pck_save_step", "durable")] == 6.0
    # set at the commit: within the commit's second (the event follows the record)
    assert abs(first[("pck_last_commit_timestamp_seconds", "durable")]
               - _epoch(six.committed_at)) < 5.0

    mgr = pckt.CheckpointManager(root, save_every=3, async_save=False, events=prom)
    try:
        assert mgr.restore(_state(1000.0)).step == 6
        seeded = _metrics(prom)  # the restore event wrote the file
        assert seeded[("pck_save_step", "durable")] == 6.0
        assert seeded[("pck_last_commit_timestamp_seconds", "durable")] == pytest.approx(
            _epoch(six.committed_at), abs=1e-5)
        assert seeded[("pck_save_failed_total", "durable")] == 0.0  # an increase() sees 0 -> 1
        assert seeded[("pck_retention_deleted_total", "durable")] == 0.0
        _full(mgr)
        with pytest.raises(portable_ckpt.CheckpointError):
            mgr.save(9, _state(9))  # a synchronous save raises its failure
        mgr.wait()
    finally:
        mgr.tiers["durable"] = dataclasses.replace(
            mgr.tiers["durable"], storage=open_storage(str(root)))
        mgr.close()
    after = _metrics(prom)
    assert after[("pck_commit_ok", "durable")] == 0.0
    assert after[("pck_save_step", "durable")] == 6.0  # the last committed save's step
    assert after[("pck_last_commit_timestamp_seconds", "durable")] == pytest.approx(
        _epoch(six.committed_at), abs=1e-5)  # not moved by the failure: time() - it ages
    assert after[("pck_save_failed_total", "durable")] == 1.0
    capsys.readouterr()


def test_an_explicit_restore_of_an_own_version_seeds_and_a_foreign_one_does_not(
    tmp_path: Path,
) -> None:
    """``checkpoint=`` of a version of the manager's root is its own save: seeded like any
    restore. A version of another root (a seed for a fine-tune) is no save of this job."""
    root, other, prom = tmp_path / "ckpt", tmp_path / "other", tmp_path / "metrics.prom"
    with pckt.CheckpointManager(root, save_every=3, async_save=False) as mgr:
        for step in (3, 6):
            mgr.save(step, _state(step))
    with pckt.CheckpointManager(other, save_every=3, async_save=False) as mgr:
        mgr.save(5, _state(5))
    three = portable_ckpt.list_versions(root)[0]
    with pckt.CheckpointManager(root, save_every=3, async_save=False, events=prom) as mgr:
        assert mgr.restore(_state(), checkpoint=three.path).step == 3
        got = _metrics(prom)
    assert got[("pck_save_step", "durable")] == 3.0
    assert got[("pck_last_commit_timestamp_seconds", "durable")] == pytest.approx(
        _epoch(three.committed_at), abs=1e-5)
    prom.unlink()
    with pckt.CheckpointManager(root, save_every=3, async_save=False, events=prom) as mgr:
        foreign = portable_ckpt.list_versions(other)[0].path
        assert mgr.restore(_state(), checkpoint=foreign).step == 5
        got = _metrics(prom)
    assert ("pck_save_step", "durable") not in got
    assert not [k for k in got if k[0] == "pck_last_commit_timestamp_seconds"]
    assert got[("pck_restore_ok", "explicit")] == 1.0


def _save_then_restore_an_older_own_version(tmp_path: Path) -> tuple[dict[Any, float], float]:
    """Steps 3 and 6 saved; a new manager saves step 9, then restores step 3 (a rollback)."""
    root, prom = tmp_path / "ckpt", tmp_path / "metrics.prom"
    with pckt.CheckpointManager(root, save_every=3, async_save=False) as mgr:
        for step in (3, 6):
            mgr.save(step, _state(step))
    three = portable_ckpt.list_versions(root)[0]
    with pckt.CheckpointManager(root, save_every=3, async_save=False, events=prom) as mgr:
        before = time.time()
        mgr.save(9, _state(9))
        assert mgr.restore(_state(), checkpoint=three.path).step == 3
        got = _metrics(prom)  # the restore event wrote the file
    assert before > _epoch(three.committed_at)
    return got, before


def test_a_restore_after_a_save_keeps_the_step_of_the_save(tmp_path: Path) -> None:
    """mutation audit 22 B2-24: the seed of a restore sets ``pck_save_step`` only while no
    save of this process did: after a real save (step 9), restoring step 3 must not say the
    last committed save was step 3."""
    got, _ = _save_then_restore_an_older_own_version(tmp_path)
    assert got[("pck_save_step", "durable")] == 9.0


def test_a_restore_after_a_save_keeps_the_time_of_the_newer_commit(tmp_path: Path) -> None:
    """mutation audit 22 B2-29: restoring an older version after a save seeds its (older)
    commit time; the last-commit timestamp must stay the save's, not move back (a freshness
    alert would fire on a job that just committed)."""
    got, before = _save_then_restore_an_older_own_version(tmp_path)
    assert got[("pck_last_commit_timestamp_seconds", "durable")] >= before - 1e-3


def test_commit_and_verify_are_dated_and_deletions_are_counted(tmp_path: Path) -> None:
    """W5 (a), (c), (d): the newest commit and the last sampled verification have a time;
    ``pck_retention_deleted`` is the last pass's count, ``..._total`` counts every pass."""
    root, prom = tmp_path / "ckpt", tmp_path / "metrics.prom"
    with pckt.CheckpointManager(root, save_every=1, keep_last=1, verify_sample=1.0,
                                async_save=False, events=prom) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, _state(step))
            mgr.wait()
        t0 = time.time()
        mgr.save(4, _state(4))
        mgr.wait()
        t1 = time.time()
        got = _metrics(prom)
    assert t0 <= got[("pck_last_commit_timestamp_seconds", "durable")] <= t1
    assert t0 <= got[("pck_last_verify_timestamp_seconds", "durable")] <= t1
    assert got[("pck_verify_ok", "durable")] == 1.0
    assert got[("pck_retention_deleted", "durable")] == 1.0  # the gauge: kept as it was
    assert got[("pck_retention_deleted_total", "durable")] == 3.0
    assert got[("pck_save_failed_total", "durable")] == 0.0
    assert got[("pck_replicate_failed_total", "durable")] == 0.0
    assert [v.step for v in portable_ckpt.list_versions(root)] == [4]


# -- W6: retention deletes a version that failed verification --------------------------------


def _fail(root: Path, ident: str) -> None:
    """What a cron ``portable-ckpt verify`` records for a damaged version."""
    write_verification_record(open_storage(str(root)), ident, ok=False, mode="deep",
                              fraction=None, chunks=1, verifier="cron",
                              errors=[{"code": "PCK-CHECKSUM", "message": "block 0 differs"}])


def _said(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if getattr(r, EVENT_ATTR, {}).get("event") == "retention.deleted_failed"]


def test_retention_says_it_deleted_a_version_that_failed_verification(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """W6: inside keep_last, the failed version goes at the next save: said once on stderr
    and as a WARNING, with its step, path, verified copy and the pin that keeps the next."""
    root, backup = tmp_path / "ckpt", tmp_path / "backup"
    with caplog.at_level(logging.WARNING, logger="portable_ckpt"), pckt.CheckpointManager(
        root, save_every=1, keep_last=3, async_save=False
    ) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, _state(step))
        mgr.wait()
        two = portable_ckpt.list_versions(root)[1].id
        copy_version(f"{root}/{two}", str(backup))
        _fail(root, two)
        capsys.readouterr()
        mgr.save(4, _state(4))
        mgr.wait()
        err = capsys.readouterr().err
        assert [v.step for v in portable_ckpt.list_versions(root)] == [1, 3, 4]
        [record] = _said(caplog)
        assert record.levelno == logging.WARNING
        text = record.getMessage()
        assert "durable tier: retention deleted 1 version(s) that failed verification" in text
        assert f"step 2, {root}/{two} (a copy is recorded at {backup}, verified when made, not since)" in text
        assert "inside keep_last too, unless it is pinned" in text
        assert f"`portable-ckpt pin {root}/ID`" in text and "docs/recovery.md" in text
        assert err.count("retention deleted") == 1 and text in err  # once, on stderr
        doc = getattr(record, EVENT_ATTR)
        assert [(r["step"], r["path"], r["copies"]) for r in doc["deleted"]] == [
            (2, f"{root}/{two}", [str(backup)])]
        # a later pass that deletes only what the policy lets go says nothing of it
        caplog.clear()
        mgr.save(5, _state(5))
        mgr.wait()
        assert [v.step for v in portable_ckpt.list_versions(root)] == [3, 4, 5]
        assert not _said(caplog) and "failed verification" not in capsys.readouterr().err


def test_a_pass_names_a_few_failed_versions_then_counts_and_spares_pinned_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """W6, bounded: three versions named (newest first), the rest counted; a pinned failed
    version is kept for its repair and not named."""
    root = tmp_path / "ckpt"
    with caplog.at_level(logging.WARNING, logger="portable_ckpt"), pckt.CheckpointManager(
        root, save_every=1, keep_last=10, async_save=False
    ) as mgr:
        for step in range(1, 8):
            mgr.save(step, _state(step))
        mgr.wait()
        ids = [v.id for v in portable_ckpt.list_versions(root)]
        for ident in ids[:6]:  # steps 1..6 failed; 7 did not
            _fail(root, ident)
        pin(str(root), ids[5], reason="repair in place", by="oncall")  # step 6 kept
        capsys.readouterr()
        mgr.save(8, _state(8))
        mgr.wait()
    err = capsys.readouterr().err
    assert [v.step for v in portable_ckpt.list_versions(root)] == [6, 7, 8]
    [record] = _said(caplog)
    text = record.getMessage()
    assert "retention deleted 5 version(s) that failed verification" in text
    named = re.findall(r"step (\d+), ", text)
    assert named == ["5", "4", "3"] and "; and 2 more (the retention event lists them)" in text
    assert "(no verified copy of it is recorded)" in text
    assert f"{root}/{ids[5]}" not in text  # pinned: kept, not deleted
    assert err.count("retention deleted") == 1


# -- two ranks --------------------------------------------------------------------------------


def test_two_ranks_every_rank_keeps_its_step_rank_zero_dates_and_says(tmp_path: Path) -> None:
    """Real processes: after a restart every rank's file says the restored step and counts
    its failed save; the commit time is rank 0's (it reports the commits) and so is the
    retention line."""
    root, prom = tmp_path / "ckpt", tmp_path / "metrics-{rank}.prom"
    _run("ops_signals_first_run", str(root), str(prom))
    one, two = portable_ckpt.list_versions(root)
    _fail(root, one.id)
    out = _run("ops_signals_restart", str(root), str(prom))
    assert [o["restored"] for o in out] == [2, 2]
    assert [o["raised"] for o in out] == [None, None]  # an async save's failure goes on
    for rank in (0, 1):
        seeded, after = out[rank]["seeded"], out[rank]["after"]
        assert seeded["pck_save_step|durable"] == 2.0
        assert seeded["pck_save_failed_total|durable"] == 0.0
        assert after["pck_save_failed_total|durable"] == 1.0  # step 3: rank 1's disk was full
        assert after["pck_save_step|durable"] == 4.0  # step 4 committed
    r0, r1 = out[0]["seeded"], out[1]["seeded"]
    assert r0["pck_last_commit_timestamp_seconds|durable"] == pytest.approx(
        _epoch(two.committed_at), abs=1e-5)
    assert "pck_last_commit_timestamp_seconds|durable" not in r1
    assert "pck_last_commit_timestamp_seconds|durable" not in out[1]["after"]
    assert [v.step for v in portable_ckpt.list_versions(root) if v.status == "committed"] == [
        2, 4]  # 3 failed, 1 deleted
    said = [line for line in out[0]["stderr"].splitlines() if "failed verification" in line]
    assert len(said) == 1 and f"step 1, {root}/{one.id}" in said[0]
    assert "failed verification" not in out[1]["stderr"]


def _run(fn: str, *args: Any) -> list[Any]:
    res = run_group(f"tests.manager._workers:{fn}", 2, args, timeout=120, pg_timeout=45,
                    sys_path=[ROOT])
    res.raise_for_errors()
    return list(res.results)


def test_a_restart_from_the_fast_tier_seeds_the_durable_tier_and_never_a_future_time(
    tmp_path: Path,
) -> None:
    """SRE review 2, V5: restored from the fast tier, the durable tier's commit time was absent
    until its next save (an ``absent()`` alert paged at every restart). V4: a version committed
    by a host whose clock was 30 days ahead seeded a commit time 30 days in the future, and the
    freshness alert stayed silent in just the case the seed was added for."""
    import json

    root, fast, prom = tmp_path / "ckpt", tmp_path / "fast", tmp_path / "metrics.prom"
    kw: dict[str, Any] = dict(save_every=4, fast_root=str(fast), fast_every=1,
                              async_save=False)
    with pckt.CheckpointManager(root, **kw) as mgr:
        for step in (4, 5):
            mgr.maybe_save(step, _state(step))
    durable = portable_ckpt.list_versions(root)[-1]
    newest = portable_ckpt.list_versions(fast)[-1]
    assert (durable.step, newest.step) == (4, 5)
    # The fast version's commit record dated 30 days ahead (its host's clock).
    doc = json.loads((Path(newest.path) / "manifest.json").read_text())
    doc["committed_at"] = "2099-01-01T00:00:00.000000Z"
    (Path(newest.path) / "manifest.json").write_text(json.dumps(doc))
    before = time.time()
    with pckt.CheckpointManager(root, events=prom, **kw) as mgr:
        assert mgr.restore(_state(1000.0)).step == 5
        got = _metrics(prom)
    assert before - 1 <= got[("pck_last_commit_timestamp_seconds", "fast")] <= time.time() + 1
    assert got[("pck_last_commit_timestamp_seconds", "durable")] == pytest.approx(
        _epoch(durable.committed_at), abs=1e-5)
    assert got[("pck_save_step", "fast")] == 5.0
