"""Mutation audit 27, the pins a manager keeps in step with its policy (``pin_kept``, spec §15.3,
docs/torch.md "Pins"): a version whose records could not be read keeps its pin.

Real versions on a local root; the one failing read is a real ``StorageError`` from a storage
subclass, as in tests/manager/test_policies.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import portable_ckpt
from portable_ckpt.errors import StorageError
from portable_ckpt.io.gc import gc
from portable_ckpt.io.pins import pin, read_pins
from portable_ckpt.manager.pinning import MANAGER_PIN_BY, sync_pins
from portable_ckpt.manager.records import candidates_of
from portable_ckpt.manager.retention import RetentionPolicy, plan_retention
from portable_ckpt.storage.local import LocalStorage


def test_a_pinned_version_whose_entry_could_not_be_read_keeps_its_pin(tmp_path: Path) -> None:
    """docs/torch.md: a version whose records could not be read at a retention pass keeps its
    pin until it is read as committed again (its decision says nothing about the policies).
    Here the listing reads step 2's commit record, and the read for its ``pck.manager`` entry
    fails (a 503 between the two): the version is "unclassified", keep_every says nothing of
    it. Mutant P03 (only "not committed" holds a pin): the manager removed its own pin of the
    keep_every=2 version, and a platform ``gc --keep 1`` then deleted it."""
    root = tmp_path / "r"
    for s in (2, 3, 4, 5):
        portable_ckpt.save_arrays(str(root), {"w": np.full(4, s, np.float32)}, step=s)
    ids = [v.id for v in portable_ckpt.list_versions(root)]
    for aid in (ids[0], ids[2]):  # what an earlier pass of keep_every=2 pinned
        pin(str(root), aid, reason="keep_every=2", by=MANAGER_PIN_BY)
    record = f"{ids[0]}/manifest.json"

    class FailsAfterListing(LocalStorage):
        reads = 0

        def read_all(self, path: str, *, max_size: int) -> bytes:
            if path == record:
                FailsAfterListing.reads += 1
                if FailsAfterListing.reads > 1:
                    raise StorageError(f"{path}: a transient read error", path=path)
            return super().read_all(path, max_size=max_size)

    st = FailsAfterListing(str(root))
    decisions = plan_retention(candidates_of(st), RetentionPolicy.build(keep_last=1,
                                                                        keep_every=2))
    assert FailsAfterListing.reads == 2
    by_id = {d.id: d for d in decisions}
    assert by_id[ids[0]].reasons == ["unclassified (its records could not be read)"]
    assert sync_pins(st, decisions) == {"pinned": [], "unpinned": []}
    assert set(read_pins(root)) == {ids[0], ids[2]}
    assert gc(str(root), keep=1, grace_seconds=0).deleted == [ids[1]]


def test_a_version_the_manager_pinned_is_not_pinned_again_at_each_pass(tmp_path: Path) -> None:
    """R-PIN-1: pin records are created, never modified; a manager runs retention after every
    commit, so a pass that pinned again what its pin already holds wrote one more record per
    kept version and pass (``pins/`` grew without bound, and every gc read them all). Mutant
    P06 (``aid not in ours`` dropped): the second pass pinned both milestones again."""
    root = tmp_path / "r"
    for s in (2, 3, 4, 5):
        portable_ckpt.save_arrays(str(root), {"w": np.full(4, s, np.float32)}, step=s)
    ids = [v.id for v in portable_ckpt.list_versions(root)]
    st = LocalStorage(str(root))
    pol = RetentionPolicy.build(keep_last=1, keep_every=2)
    assert sync_pins(st, plan_retention(candidates_of(st), pol))["pinned"] == [ids[0], ids[2]]
    for _ in range(2):
        assert sync_pins(st, plan_retention(candidates_of(st), pol)) == {"pinned": [],
                                                                         "unpinned": []}
    assert {aid: len(recs) for aid, recs in read_pins(root).items()} == {ids[0]: 1, ids[2]: 1}
    assert len(list((root / "pins").iterdir())) == 2
