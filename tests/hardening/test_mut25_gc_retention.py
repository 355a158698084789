"""Mutation audit 25, gc's arguments and the attempts a job's own retention spares."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import UsageError
from portable_ckpt.format.naming import attempt_time
from portable_ckpt.io.gc import gc
from portable_ckpt.io.versions import list_versions
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage


@pytest.mark.parametrize("keep", [0, -1, True, 1.0])
def test_keep_below_one_is_refused_before_anything_is_deleted(tmp_path: Path, keep: object) -> None:
    """``keep`` must be an integer >= 1: ``keep=0`` (a typo, an unset variable read as 0) must
    not delete all but the protected version."""
    ids = [portable_ckpt.save_arrays(tmp_path, {"w": np.zeros(2)}, step=s).attempt_id
           for s in (1, 2, 3)]
    with pytest.raises(UsageError, match="keep"):
        gc(tmp_path, keep=keep, grace_seconds=0.0)  # type: ignore[arg-type]
    assert sorted(v.id for v in list_versions(tmp_path) if v.status == "committed") == ids


def test_an_attempt_created_at_the_jobs_start_is_spared(tmp_path: Path) -> None:
    """``spare_since``: an attempt created at or after that time is the caller's own save,
    perhaps being written; one stamped exactly at it is spared too, one a second before goes
    with a grace of 0."""
    portable_ckpt.save_arrays(tmp_path, {"w": np.zeros(2)}, step=1)
    storage = open_storage(tmp_path)
    ids = []
    for step in (2, 3):
        attempt = new_attempt_id(step)
        w = ShardWriter(storage, attempt, 0, write_index=False)
        w.add_tensor("w", np.ones(4))
        w.finish()
        ids.append(attempt)
    earlier, own = sorted(ids, key=lambda a: attempt_time(a) or 0.0)
    since = attempt_time(own)
    assert since is not None and (attempt_time(earlier) or 0.0) < since
    rep = gc(tmp_path, keep=1, grace_seconds=0.0, spare_since=since)
    assert [g["id"] for g in rep.in_grace] == [own] and rep.abandoned == [earlier]
    assert (tmp_path / own).exists() and not (tmp_path / earlier).exists()


def test_without_a_drill_the_newest_version_is_the_protected_one(tmp_path: Path) -> None:
    """R-GC-2: when no version is drilled, the newest is the one gc protects, and its report
    names it (``protected``; ``gc --json`` shows it)."""
    ids = [portable_ckpt.save_arrays(tmp_path, {"w": np.zeros(2)}, step=s).attempt_id
           for s in (1, 2, 3)]
    rep = gc(tmp_path, keep=1, grace_seconds=0.0)
    assert rep.protected == ids[2] and rep.to_json()["protected"] == ids[2]
    assert sorted(rep.deleted) == sorted(ids[:2])


def test_a_storage_clock_a_tick_behind_is_just_now_for_a_grace_of_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-GC-4 with a grace of 0: an attempt written milliseconds before gc is deleted. The
    storage's clock (a clock probe's modification time, a file system's coarse timestamps)
    may lag this host's by a tick, so the attempt's id came out dated after "now" and the
    attempt stayed "in grace" (the test above failed once so in a full run, session 26)."""
    import time

    import portable_ckpt.io.gc as gc_mod

    portable_ckpt.save_arrays(tmp_path, {"w": np.zeros(2)}, step=1)
    attempt = new_attempt_id(2)
    w = ShardWriter(open_storage(tmp_path), attempt, 0, write_index=False)
    w.add_tensor("w", np.ones(4))
    w.finish()
    behind = (attempt_time(attempt) or time.time()) - 0.004  # a 250 Hz tick
    monkeypatch.setattr(gc_mod, "storage_clock", lambda storage, tidy=True: behind)
    rep = gc(tmp_path, keep=1, grace_seconds=0.0)
    assert rep.abandoned == [attempt] and rep.in_grace == [], rep.to_json()
    # with a grace above 0 it is within its grace, aged 0 (not a negative age)
    attempt = new_attempt_id(3)
    w = ShardWriter(open_storage(tmp_path), attempt, 0, write_index=False)
    w.add_tensor("w", np.ones(4))
    w.finish()
    behind = (attempt_time(attempt) or time.time()) - 0.004
    rep = gc(tmp_path, keep=1, grace_seconds=1.0)
    assert [g["id"] for g in rep.in_grace] == [attempt]
