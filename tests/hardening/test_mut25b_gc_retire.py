"""Mutation audit 25b, ``retire_abandoned``: a version is retired only when the store's times of
the two commit records say the later commit was stored later."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

import portable_ckpt
from portable_ckpt.io.gc import gc
from portable_ckpt.io.versions import list_versions


def _save(root: Path, step: int) -> str:
    return portable_ckpt.save_arrays(root, {"w": np.full(4, step, np.int64)}, step=step).attempt_id


def test_a_rollback_the_stores_order_contradicts_is_doubted(tmp_path: Path) -> None:
    """A job resumed from step 1 saved step 2 again, after step 3: by the writers' clocks step 3
    was abandoned. But the store's times of the records say the new step 2 was stored *before*
    step 3 (records stored a second apart in the other order: within the minute by which the
    writers' times may differ from the store's). That order is not confirmed: step 3 is kept
    and doubted, and stays the latest; the first step 2, stored before both, is retired."""
    root = tmp_path / "r"
    first2, three = _save(root, 2), _save(root, 3)
    again2 = _save(root, 2)
    now = time.time() - 600
    for i, aid in enumerate((first2, again2, three)):  # stored in this order, 1 s apart
        os.utime(root / aid / "manifest.json", (now + i, now + i))
    rep = gc(root, keep=3, grace_seconds=0.0, retire_abandoned=True)
    assert rep.retired == [first2] and [d["id"] for d in rep.retire_doubted] == [three], rep.to_json()
    assert "root was copied" in rep.retire_doubted[0]["reason"]
    assert three in {v.id for v in list_versions(root) if v.status == "committed"}
    assert portable_ckpt.open(str(root)).id == three
    # stored in the order committed (as written), the same rollback is retired
    for i, aid in enumerate((three, again2)):
        os.utime(root / aid / "manifest.json", (now + i, now + i))
    rep = gc(root, keep=3, grace_seconds=0.0, retire_abandoned=True)
    assert rep.retired == [three] and portable_ckpt.open(str(root)).id == again2


def test_a_retired_version_is_among_the_deleted(tmp_path: Path) -> None:
    """``report.deleted`` (``gc --json``'s ``deleted``, the ``gc.finished`` count) is what the
    run deleted: a version ``retire_abandoned`` retired is in it as well as in ``retired``."""
    root = tmp_path / "r"
    one, three = _save(root, 1), _save(root, 3)
    again2 = _save(root, 2)
    rep = gc(root, keep=3, grace_seconds=0.0, retire_abandoned=True)
    assert rep.retired == [three] and rep.deleted == [three], rep.to_json()
    assert rep.to_json()["deleted"] == [three] and sorted(rep.kept) == sorted([one, again2])
    assert not (root / three).exists()
