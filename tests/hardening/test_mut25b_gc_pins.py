"""Mutation audit 25b, pinned versions in gc (R-GC-11): every attempt with a commit record is
held while the pins cannot be read, an invalid one as well; a pinned version is a kept one for
everything gc does to kept versions."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

import portable_ckpt
from portable_ckpt.io.deletion import mark_deletion
from portable_ckpt.io.gc import gc
from portable_ckpt.io.pins import pin
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage


def test_unreadable_pins_hold_an_invalid_version_under_delete_invalid(tmp_path: Path) -> None:
    """The plan's read of ``pins/`` fails once: any version may be pinned, the damaged one too
    (a pin is what keeps a damaged milestone whose record a copy may restore). Asked to delete
    invalid versions, gc keeps it, names it in ``report.pinned``, and the run is incomplete;
    a later look at the pins that succeeds does not make it deletable in the same run."""
    root = tmp_path / "r"
    ids = [portable_ckpt.save_arrays(root, {"w": np.full(4, s, np.int64)}, step=s).attempt_id
           for s in (1, 2, 3)]
    (root / ids[0] / "manifest.json").write_text('{"damaged": true}')
    st = FaultyStorage(open_storage(root), [Fault(op="list", path="pins*", times=1,
                                                  error="EIO")])
    rep = gc(st, keep=1, grace_seconds=0.0, delete_invalid=True)
    assert ids[0] in rep.pinned and ids[0] not in rep.abandoned + rep.deleted, rep.to_json()
    assert not rep.complete and [u["status"] for u in rep.unknown] == ["pins unreadable"]
    assert [d["id"] for d in rep.damaged] == [ids[0]]
    assert (root / ids[0] / "manifest.json").exists()
    # with the pins readable the same run deletes it, as asked
    assert gc(root, keep=1, grace_seconds=0.0, delete_invalid=True).abandoned == [ids[0]]
    assert not (root / ids[0]).exists()


def test_a_pinned_version_has_its_stale_mark_cleared(tmp_path: Path) -> None:
    """Two versions gc would delete but keeps for pins, one pinned before the run and one pinned
    while it ran (seen when gc looks at ``pins/`` again before deleting it), each with the mark
    of a gc stopped two hours ago: both are kept versions, so their stale marks are cleared
    (R-GC-13: left there, a record lost later would make the version deletable), as for the
    versions retention keeps."""
    root = tmp_path / "r"
    ids = [portable_ckpt.save_arrays(root, {"w": np.full(4, s, np.int64)}, step=s).attempt_id
           for s in (1, 2, 3)]
    storage = open_storage(root)
    marks = []
    for aid in ids[:2]:
        rel = mark_deletion(storage, aid, reason="retention")
        os.utime(root / rel, (time.time() - 7200, time.time() - 7200))
        marks.append(rel)
    pin(root, ids[0])
    # gc's plan lists pins/ three times; its look before the first deletion is the fourth
    late = Fault(op="list", path="pins/", after_ops=3, times=1, error=None,
                 callback=lambda op, path: pin(root, ids[1]))
    rep = gc(FaultyStorage(storage, [late]), keep=1, grace_seconds=0.0)
    assert late.fired == 1 and rep.deleted == [] and rep.pinned == ids[:2], rep.to_json()
    assert sorted(rep.marks_cleared) == sorted(marks)
    assert not any((root / rel).exists() for rel in marks)
