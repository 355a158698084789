"""Mutation audit 25b, ``require_copy``: which copy records count (a verified copy on another
root), which count for nothing."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

import portable_ckpt
from portable_ckpt.io.copy import copy_version
from portable_ckpt.io.gc import gc
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage


def _copied(tmp_path: Path) -> tuple[Path, str, str, Path]:
    """A root of two versions whose newest was copied to ``backup`` (its copy record's path)."""
    src = tmp_path / "src"
    old, new = (portable_ckpt.save_arrays(src, {"w": np.full(4, s, np.int64)}, step=s).attempt_id
                for s in (1, 2))
    copy_version(str(src / new), str(tmp_path / "backup"))
    (record,) = (src / new / "copies").glob("*.json")
    return src, old, new, record


def _rewrite(record: Path, **members: object) -> None:
    doc = json.loads(record.read_text())
    doc.update(members)
    record.write_text(json.dumps(doc))


def test_a_failed_copy_is_no_copy_though_its_destination_holds_the_version(tmp_path: Path) -> None:
    """A copy record that says the copy failed (``ok: false``) counts for nothing, even where its
    destination holds the version's commit record (a copy that failed its verification there):
    ``require_copy`` keeps the older versions."""
    src, old, new, record = _copied(tmp_path)
    assert (tmp_path / "backup" / new / "manifest.json").exists()
    _rewrite(record, ok=False, error={"code": "PCK-CHECKSUM", "message": "verification failed"})
    rep = gc(src, keep=1, grace_seconds=0.0, require_copy=True)
    assert (rep.deleted, rep.kept_for_copy) == ([], [old]), rep.to_json()
    assert (src / old / "manifest.json").exists()
    _rewrite(record, ok=True, error=None)  # the same record, passed: the copy counts
    assert gc(src, keep=1, grace_seconds=0.0, require_copy=True).deleted == [old]


def test_a_copy_record_naming_this_root_counts_for_nothing(tmp_path: Path) -> None:
    """A copy record whose destination is the collected root itself (hand-written, or a decoded
    name that lands here) is no copy, and is not even asked: not where a root refuses the probe
    that would tell it is the same root (it would count as a copy of itself), and not in
    ``copy_unasked`` either."""
    src, old, _, record = _copied(tmp_path)
    shutil.rmtree(tmp_path / "backup")
    _rewrite(record, destination=f"file://{os.path.realpath(src)}")
    refusing = FaultyStorage(open_storage(src), [Fault(op=("open", "write", "create"),
                                                       path=".pck-clock-*", error="EACCES")])
    for root in (refusing, src):
        rep = gc(root, keep=1, grace_seconds=0.0, require_copy=True)
        assert (rep.deleted, rep.kept_for_copy) == ([], [old]), rep.to_json()
        assert rep.copy_unasked == [] and rep.copy_unasked_retryable
    assert (src / old / "manifest.json").exists()


def test_require_copy_naming_the_collected_root_finds_no_copy(tmp_path: Path) -> None:
    """``require_copy=<this root>`` (a script that passed the wrong variable): the version in
    the root itself is no copy, whether or not the root takes the probe that would show it is
    the same root; nothing is deleted."""
    src = tmp_path / "src"
    old = portable_ckpt.save_arrays(src, {"w": np.zeros(4)}, step=1).attempt_id
    portable_ckpt.save_arrays(src, {"w": np.ones(4)}, step=2)
    refusing = FaultyStorage(open_storage(src), [Fault(op=("open", "write", "create"),
                                                       path=".pck-clock-*", error="EACCES")])
    for root in (refusing, src):
        for want in (str(src), f"file://{os.path.realpath(src)}"):
            rep = gc(root, keep=1, grace_seconds=0.0, require_copy=want)
            assert (rep.deleted, rep.kept_for_copy) == ([], [old]), (want, rep.to_json())
    assert (src / old / "manifest.json").exists()
