"""The listings' caches past their caps (scale review C).

A listing reads every version in the same order. With more versions than a least-recently-used
cache holds, each entry was evicted just before the next listing asked for it: every listing
missed everything (every record read and validated, every commit record parsed, every manager
entry read again). A listing now never evicts what it used itself, so past a cap it misses only
what did not fit. The caches stay keyed as before: what changed on the storage is seen.
"""

from __future__ import annotations

import collections
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.io import annotations, versions
from portable_ckpt.io.annotations import write_drill_record, write_verification_record
from portable_ckpt.io.versions import list_versions
from portable_ckpt.manager import records
from portable_ckpt.manager.records import candidates_of, manager_entry_value
from portable_ckpt.storage.local import LocalStorage


class _Counting(LocalStorage):
    """A local storage that counts the reads of post-commit records."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.record_reads = 0

    def read_all(self, path: str, *, max_size: int) -> bytes:
        if "/verifications/" in path or "/drills/" in path:
            self.record_reads += 1
        return super().read_all(path, max_size=max_size)


def _drill(storage: LocalStorage, aid: str) -> str:
    return write_drill_record(storage, aid, {
        "ok": True, "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:01Z",
        "world_size": 2, "saved_world_size": 1, "contract": "exact", "measurements": {},
        "error": None})


def _root(root: Path, n: int) -> tuple[_Counting, list[str]]:
    """``n`` versions with a manager entry, one verification and one drill record each."""
    storage = _Counting(str(root))
    for s in range(1, n + 1):
        entry = manager_entry_value(s, "save_every", {"loss": float(s)})
        portable_ckpt.save_arrays(storage, {"w": np.full(4, s, np.float32)}, step=s,
                                  entries={"pck.manager": entry})
    ids = [v.id for v in list_versions(storage)]
    for aid in ids:
        write_verification_record(storage, aid, ok=True, mode="deep", fraction=None, chunks=1)
        _drill(storage, aid)
    return storage, ids


def _fresh_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty caches of this test's own (as in a fresh process)."""
    monkeypatch.setattr(versions, "_SUMMARIES", collections.OrderedDict())
    monkeypatch.setattr(annotations, "_RECORDS", collections.OrderedDict())
    monkeypatch.setattr(annotations, "_records_bytes", 0)
    monkeypatch.setattr(records, "_ENTRIES", collections.OrderedDict())


def _counting_parses(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """Counts of commit records parsed (classified) and manager entries read."""
    calls: collections.Counter[str] = collections.Counter()
    classify, entry = versions.classify_record, records.read_manager_entry

    def counted_classify(*a: Any) -> Any:
        calls["classify"] += 1
        return classify(*a)

    def counted_entry(*a: Any) -> Any:
        calls["entry"] += 1
        return entry(*a)

    monkeypatch.setattr(versions, "classify_record", counted_classify)
    monkeypatch.setattr(records, "read_manager_entry", counted_entry)
    return calls


def _seen(storage: LocalStorage) -> list[tuple[str, str, bool, bool, bool]]:
    return [(v.id, v.status, v.verified, v.drilled, v.verification_failed)
            for v in list_versions(storage)]


def test_listings_past_the_caches_caps_still_hit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Caps lowered to half the root: the second and later listings hit on the half kept (a
    plain LRU missed every record, commit record and entry, at every listing)."""
    storage, ids = _root(tmp_path, 6)
    _fresh_caches(monkeypatch)
    list_versions(storage)
    assert len(annotations._RECORDS) == 12 and len(versions._SUMMARIES) == 6
    cost = annotations._records_bytes
    _fresh_caches(monkeypatch)
    monkeypatch.setattr(versions, "_SUMMARIES_MAX", 3)
    monkeypatch.setattr(annotations, "_RECORDS_BYTES_MAX", cost // 2)
    monkeypatch.setattr(records, "_ENTRIES_MAX", 3)
    calls = _counting_parses(monkeypatch)
    first = _seen(storage)
    assert [(v.id, v.metrics) for v in candidates_of(storage)] == [
        (aid, {"loss": float(s)}) for s, aid in enumerate(ids, 1)]
    for _ in range(3):
        calls.clear()
        storage.record_reads = 0
        assert _seen(storage) == first
        assert calls["classify"] == 3, calls  # was 6: every one
        assert 0 < storage.record_reads <= 7, storage.record_reads  # was 12: every one
        assert len(versions._SUMMARIES) == 3
        assert annotations._records_bytes <= annotations._RECORDS_BYTES_MAX
        calls.clear()
        cands = candidates_of(storage)
        assert [c.metrics for c in cands] == [{"loss": float(s)} for s in range(1, 7)]
        assert calls["entry"] == 3, calls  # was 6
        assert len(records._ENTRIES) == 3


def test_a_pass_past_the_cap_evicts_what_earlier_passes_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a finished listing used makes room for the next one (of another root here): only
    the running listing's entries stay."""
    storage, _ = _root(tmp_path / "a", 4)
    other, _ = _root(tmp_path / "b", 2)
    _fresh_caches(monkeypatch)
    monkeypatch.setattr(versions, "_SUMMARIES_MAX", 4)
    list_versions(storage)
    assert len(versions._SUMMARIES) == 4
    list_versions(other)  # evicts two of the first root's
    calls = _counting_parses(monkeypatch)
    list_versions(other)
    assert calls["classify"] == 0, calls
    assert {k[0] for k in versions._SUMMARIES} >= {v.id for v in list_versions(other)}


def test_full_caches_still_see_every_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Caches full of a listing's own entries: a record replaced and put back from a copy, a
    record added or removed and a version deleted are seen by the next listing, as with no
    cache."""
    storage, ids = _root(tmp_path, 6)
    _fresh_caches(monkeypatch)
    monkeypatch.setattr(versions, "_SUMMARIES_MAX", 3)
    monkeypatch.setattr(annotations, "_RECORDS_BYTES_MAX", 4000)
    before = _seen(storage)
    assert _seen(storage) == before
    cached = {k[0] for k in versions._SUMMARIES}
    assert ids[0] in cached  # the oldest were kept: damage them
    manifest = tmp_path / ids[0] / "manifest.json"
    shutil.copy2(manifest, tmp_path / "copy.json")
    manifest.write_bytes(manifest.read_bytes()[:-2])
    assert _seen(storage)[0][1] == "invalid"
    shutil.copy2(tmp_path / "copy.json", manifest)
    assert _seen(storage) == before
    bad = [{"code": "PCK-CHECKSUM", "message": "block 0"}]
    write_verification_record(storage, ids[0], ok=False, mode="deep", fraction=None, chunks=1,
                              errors=bad)
    assert _seen(storage)[0][4] is True  # a failed verification added to a cached version
    drills = [k[1] for k in annotations._RECORDS if "/drills/" in k[1]]
    assert drills, "no drill record was kept"
    (tmp_path / drills[0]).unlink()
    gone = drills[0].split("/")[0]
    assert {v.id: v.drilled for v in list_versions(storage)}[gone] is False
    shutil.rmtree(tmp_path / ids[1])  # deleted by another process
    assert [v.id for v in list_versions(storage)] == [ids[0], *ids[2:]]
