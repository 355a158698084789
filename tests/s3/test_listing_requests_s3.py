"""A listing of versions on S3 lists each prefix once (scale review A).

``list_versions`` and ``gc`` listed each version's directory three times and its
verifications twice (7 LISTs where 3 prefixes were asked). Requests are counted by the fault
proxy in front of moto (real HTTP). The one view never hides a change from a second look: a
record pruned between the listing and its read is gone, not "unreadable".
"""

from __future__ import annotations

import collections
import threading

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.format.naming import utc_now_iso
from portable_ckpt.io import annotations
from portable_ckpt.io.annotations import write_drill_record, write_verification_record
from portable_ckpt.io.gc import gc
from portable_ckpt.io.versions import list_versions
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.s3 import S3Storage

from .conftest import S3Env

pytestmark = [pytest.mark.s3]



def _root_with_records(s3: S3Env, name: str, versions: int) -> tuple[str, list[str]]:
    root = s3.root(name)
    storage = open_storage(root)
    ids = []
    for step in range(1, versions + 1):
        aid = portable_ckpt.save_arrays(root, {"w": np.arange(4.0) * step}, step=step).attempt_id
        for _ in range(2):
            write_verification_record(storage, aid, ok=True, mode="deep", fraction=None, chunks=1)
            now = utc_now_iso()
            write_drill_record(storage, aid, {
                "ok": True, "started_at": now, "finished_at": now, "world_size": 1,
                "saved_world_size": 1, "contract": "exact", "measurements": {}, "error": None})
        ids.append(aid)
    return root, ids


def test_list_versions_and_gc_list_each_prefix_once(s3_proxied: S3Env) -> None:
    root, ids = _root_with_records(s3_proxied, "lv", 4)
    for listing in (True, False):
        s3_proxied.proxy.reset()
        if listing:
            list_versions(root)
        else:
            gc(root, keep=10, grace_seconds=3600.0, dry_run=True)
        seen = s3_proxied.listings()
        for aid in ids:
            # was 3 (list_dirs, odd_record_dirs' list and list_foreign) and 3 (the records,
            # then _odd_records' list_foreign and list_dirs)
            assert seen[(f"lv/{aid}/", True)] == 1, seen
            assert seen[(f"lv/{aid}/verifications/", True)] == 1, seen
            assert seen[(f"lv/{aid}/drills/", True)] == 1, seen
        # the root too (gc's own looks at the root and pins/ are not the listing's: the pins
        # are read again before any deletion, R-GC-11)
        assert max(seen.values()) == 1 or not listing, seen


def test_one_listing_stays_in_the_callers_context(s3: S3Env) -> None:
    """Another thread using the same storage object (a save committing) lists anew."""
    root, ids = _root_with_records(s3, "ctx", 1)
    storage = open_storage(root)
    seen: list[list[str]] = []
    with storage.one_root_listing():
        assert storage.list_dirs("") == ids
        portable_ckpt.save_arrays(root, {"w": np.ones(2)}, step=9)
        assert storage.list_dirs("") == ids  # this view: listed once
        other = threading.Thread(target=lambda: seen.append(storage.list_dirs("")))
        other.start()
        other.join()
        with storage.fresh_listing():
            assert len(storage.list_dirs("")) == 2
    assert len(seen[0]) == 2 and len(storage.list_dirs("")) == 2


class _PrunedOnRead(S3Storage):
    """Deletes each verification record just before reading it: a prune between the listing
    and the read (another process's ``prune_annotations``)."""

    def read_all(self, path: str, *, max_size: int) -> bytes:
        if "/verifications/" in path:
            self.delete(path)
        return super().read_all(path, max_size=max_size)


def test_a_record_pruned_after_the_listing_is_gone_not_unreadable(
    s3: S3Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second look of a record answered absent lists again (annotations.listed_info)."""
    root, ids = _root_with_records(s3, "pruned", 2)
    monkeypatch.setattr(annotations, "_RECORDS", collections.OrderedDict())  # records written
    storage = _PrunedOnRead.from_url(root)
    with storage.one_root_listing():  # as `ls` lists (it reported them unreadable)
        versions = list_versions(storage)
    assert [v.id for v in versions] == ids
    for v in versions:
        assert v.status == "committed" and not v.annotations_unreadable, v.error
        assert v.verifications == [] and len(v.drills) == 2
