"""Mutation audit 25b, attempts without a commit record: what gc leaves alone (foreign entries
only) and how it dates them."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from portable_ckpt.io.gc import gc
from portable_ckpt.io.writer import ShardWriter
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage
from tests.hardening._util import make_version


def _old_id(step: int, age: float = 7200.0) -> str:
    """An attempt id stamped ``age`` seconds ago (a grace of 0 keeps an attempt stamped within
    the last milliseconds: the storage's clock, a file's time, may be that much behind)."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() - age))
    return f"s{step:012d}-{stamp}000000Z-00000000000000ab"


def _old_attempt(root: Path, step: int, age: float = 7200.0) -> str:
    """An attempt without a commit record, created and last written ``age`` seconds ago."""
    then = time.time() - age
    aid = _old_id(step, age)
    w = ShardWriter(open_storage(root), aid, 0)
    w.add_tensor("w", np.zeros((4, 4), np.float32))
    w.finish()
    for dirpath, _, files in os.walk(root / aid):
        for f in files:
            os.utime(os.path.join(dirpath, f), (then, then))
    return aid


def test_an_attempt_left_with_foreign_entries_only_is_not_acted_on(tmp_path: Path) -> None:
    """R-LAYOUT-7: an attempt directory holding only entries the format never writes (a FIFO, a
    link someone put there) is not gc's: it is neither deleted nor reported as abandoned or as
    deleted by another process; its entries are named once in ``foreign_keys``, run after run."""
    root = tmp_path / "root"
    make_version(str(root), 1)
    dead = _old_id(2)
    (root / dead / "data").mkdir(parents=True)
    os.mkfifo(root / dead / "data" / "fifo")
    os.symlink(tmp_path, root / dead / "link")
    for _ in range(2):
        rep = gc(str(root), keep=1, grace_seconds=0.0)
        assert rep.complete and (rep.abandoned, rep.deleted, rep.gone) == ([], [], []), rep.to_json()
        assert sorted(rep.foreign_keys) == [f"{dead}/data/fifo", f"{dead}/link"]
        assert os.path.lexists(root / dead / "data" / "fifo") and os.path.islink(root / dead / "link")


def test_a_host_clock_behind_the_storages_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This host's clock 2 h behind the storage's: attempts are dated on the storage's clock
    (an attempt written 90 min ago is abandoned with a grace of an hour, though to this host
    its files are from the future) and the offset is reported, negative."""
    root = tmp_path / "r"
    make_version(str(root), 1)
    stale = _old_attempt(root, 2, age=5400.0)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 7200)
    rep = gc(root, keep=1, grace_seconds=3600.0)
    monkeypatch.setattr(time, "time", real)
    assert rep.abandoned == [stale] and not (root / stale).exists(), rep.to_json()
    assert rep.clock_skew is not None and -7300 < rep.clock_skew < -7100


def test_the_storages_clock_is_asked_once_per_run(tmp_path: Path) -> None:
    """The grace period of every attempt and the age of every stale mark are measured on one
    answer of the storage's clock: one probe per run, however many attempts it dates (asked
    per attempt, a run over many abandoned attempts wrote as many probes and warned of a skew
    as many times: maintainer review 24, 9)."""
    from portable_ckpt.io.deletion import mark_deletion

    root = tmp_path / "r"
    old = make_version(str(root), 1)
    make_version(str(root), 2)
    stale = [_old_attempt(root, s) for s in (3, 4, 5)]
    rel = mark_deletion(open_storage(root), old, reason="retention")
    os.utime(root / rel, (time.time() - 7200, time.time() - 7200))
    probes: set[str] = set()
    seen = Fault(op="*", path=".pck-clock-*", error=None, callback=lambda op, p: probes.add(p))
    rep = gc(FaultyStorage(open_storage(root), [seen]), keep=2, grace_seconds=60.0)
    assert sorted(rep.abandoned) == sorted(stale) and rep.marks_cleared == [rel], rep.to_json()
    assert len(probes) == 1
