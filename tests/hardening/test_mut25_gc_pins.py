"""Mutation audit 25, pins looked at again while gc deletes (R-GC-11, attack review 5 F2): when
the second look at ``pins/`` fails, gc deletes no more versions, and says why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.io.gc import gc
from portable_ckpt.io.pins import pin
from portable_ckpt.io.versions import list_versions
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage


@pytest.mark.parametrize("op", ["list", "read"])
def test_pins_that_cannot_be_read_again_stop_the_deletions(tmp_path: Path, op: str) -> None:
    """gc read the pins for its plan (one pin, on the newest version); right before it deletes
    the oldest version it lists ``pins/`` again and (the listing being new to it) reads them
    again. That second listing, or that second read, fails: the version may have been pinned
    in between, so it is kept, named in ``report.pinned``, and the run is incomplete."""
    root = tmp_path / "r"
    ids = [portable_ckpt.save_arrays(root, {"w": np.full(4, s, np.int64)}, step=s).attempt_id
           for s in (1, 2, 3)]
    pin(root, ids[2])
    # the plan lists pins/ three times (the directory, its records) and reads the pin once
    path, seen = ("pins/", 3) if op == "list" else ("pins/*", 1)
    st = FaultyStorage(open_storage(root), [Fault(op=op, path=path, after_ops=seen, times=1,
                                                  error="EIO")])
    rep = gc(st, keep=1, grace_seconds=0.0)
    # (the plan read the pins: ids[1] is kept by retention, not held as possibly pinned)
    assert rep.deleted == [] and sorted(rep.pinned) == sorted([ids[0], ids[2]]), rep.to_json()
    assert not rep.complete and {u["status"] for u in rep.unknown} == {"pins unreadable"}
    assert sorted(v.id for v in list_versions(root) if v.status == "committed") == sorted(ids)
    # without the fault the same run deletes it
    assert gc(root, keep=1, grace_seconds=0.0).deleted == [ids[0]]
