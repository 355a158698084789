"""Something that is not a file under ``manifest.json`` is not an absent commit record.

Before: ``Storage.exists`` (regular files only) said no for a symlink, FIFO or directory named
``manifest.json``; the attempt was classified ``incomplete`` and gc deleted the foreign entry
and every file of the attempt (R-LAYOUT-7, R-GC-6), and a copy cleared the destination's
files as leftovers. Also: a gc whose delete failed part way reported nothing it had deleted.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.cli.main import main
from portable_ckpt.errors import PathUnsafeError
from portable_ckpt.io.copy import copy_version
from portable_ckpt.io.gc import gc
from portable_ckpt.io.versions import list_versions
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage


def _save(root: Path, step: int) -> Path:
    m = portable_ckpt.save_arrays(root, {"w": np.arange(6.0) + step}, step=step)
    return root / m.attempt_id


def _symlink(v: Path) -> None:
    (v / "manifest.json").rename(v / "manifest.real")
    os.symlink("manifest.real", v / "manifest.json")


def _fifo(v: Path) -> None:
    (v / "manifest.json").rename(v.parent / "kept.json")
    os.mkfifo(v / "manifest.json")


def _directory(v: Path) -> None:
    (v / "manifest.json").rename(v.parent / "kept.json")
    (v / "manifest.json").mkdir()
    (v / "manifest.json" / "keep.json").write_text("{}")


ODD: dict[str, Callable[[Path], None]] = {
    "symlink": _symlink,
    "fifo": _fifo,
    "directory": _directory,
}


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("kind", ODD)
def test_gc_leaves_an_attempt_whose_record_is_not_a_file(tmp_path: Path, kind: str) -> None:
    _save(tmp_path, 10)
    odd = _save(tmp_path, 20)
    ODD[kind](odd)
    before = _tree(tmp_path)
    info = {v.id: v for v in list_versions(tmp_path)}[odd.name]
    # Round 3: a foreign entry under the record's name (R-LAYOUT-7), not a storage error.
    assert info.status == "stray" and info.error_code == "PCK-PATH-UNSAFE"
    report = gc(tmp_path, keep=1, grace_seconds=0)
    assert report.deleted == [] and report.abandoned == [] and report.complete
    assert report.foreign_keys == [f"{odd.name}/manifest.json"]
    assert _tree(tmp_path) == before
    # Readers skip it (it is no version), they never fail for ever because of it.
    assert portable_ckpt.open(tmp_path).step == 10


@pytest.mark.parametrize("kind", ODD)
def test_cli_names_it(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    odd = _save(tmp_path, 20)
    ODD[kind](odd)
    assert main(["inspect", str(odd)]) == 1
    assert "is not a regular file" in capsys.readouterr().err
    assert main(["gc", str(tmp_path), "--keep", "1", "--grace", "0"]) == 0
    assert f"{odd.name}/manifest.json" in capsys.readouterr().out
    assert (odd / "manifest.json").exists() or (odd / "manifest.json").is_symlink()


def test_copy_does_not_clear_a_destination_attempt_with_an_odd_record(tmp_path: Path) -> None:
    src = _save(tmp_path / "src", 5)
    dst = tmp_path / "dst"
    shutil.copytree(src, dst / src.name)
    _symlink(dst / src.name)
    before = _tree(dst)
    with pytest.raises(PathUnsafeError, match="not a regular file"):
        copy_version(str(src), str(dst), partial_grace_s=0)
    assert _tree(dst) == before


def test_local_delete_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    store = open_storage(tmp_path, create=True)
    (tmp_path / "target").write_text("x")
    os.symlink("target", tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    for name in ("link", "fifo"):
        with pytest.raises(PathUnsafeError, match="not a regular file"):
            store.delete(name)
    assert sorted(os.listdir(tmp_path)) == ["fifo", "link", "target"]
    store.delete("target")
    store.delete("missing")  # deleting a missing path is not an error
    assert sorted(os.listdir(tmp_path)) == ["fifo", "link"]


def test_gc_reports_what_it_deleted_when_a_later_delete_fails(tmp_path: Path) -> None:
    old = [_save(tmp_path, s).name for s in (10, 20)]
    newest = _save(tmp_path, 30).name
    st = FaultyStorage(
        open_storage(tmp_path), [Fault(op="delete", path=f"{old[1]}/manifest.json", error="EIO")]
    )
    report = gc(st, keep=1, grace_seconds=0)
    assert report.deleted == [old[0]]
    assert [(u["id"], u["status"], u["code"]) for u in report.unknown] == [
        (old[1], "delete failed", "PCK-STORAGE")
    ]
    assert {v.id: v.status for v in list_versions(tmp_path)} == {
        old[1]: "committed", newest: "committed"
    }


def test_gc_names_the_incomplete_attempts_it_keeps_for_the_grace_period(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _save(tmp_path, 10)
    fresh = _save(tmp_path, 20)
    (fresh / "manifest.json").unlink()  # an interrupted save, just written
    report = gc(tmp_path, keep=1, grace_seconds=3600, dry_run=True)
    assert [(g["id"], g["status"]) for g in report.in_grace] == [(fresh.name, "incomplete")]
    assert report.to_json()["in_grace"][0]["age_seconds"] < 3600
    assert main(["gc", str(tmp_path), "--keep", "1", "--dry-run"]) == 0
    assert f"kept    {fresh.name}  (incomplete, written to" in capsys.readouterr().out
    assert gc(tmp_path, keep=1, grace_seconds=0).abandoned == [fresh.name]


def test_a_record_with_a_float_integer_does_not_count(tmp_path: Path) -> None:
    """R-SEC-18 for post-commit records: ``"chunks": 4.0`` does not validate, so a failed
    verification record written so does not make the version 'failed' (round 2)."""
    import json

    v = _save(tmp_path, 20)
    rec = {"format": "portable-ckpt-verification", "format_version": "1.0",
           "attempt_id": v.name, "verification_id": "v20260101T000000000000Z-0badf00d",
           "verified_at": "2026-01-01T00:00:00Z", "ok": False, "mode": "deep",
           "fraction": None, "chunks": 4.0, "seed": None,
           "errors": [{"code": "PCK-CHECKSUM", "message": "x"}]}
    (v / "verifications").mkdir()
    path = v / "verifications" / "v20260101T000000000000Z-0badf00d.json"
    path.write_text(json.dumps(rec))
    info = list_versions(tmp_path)[0]
    assert not info.verification_failed
    rec["chunks"] = 4
    path.write_text(json.dumps(rec))
    assert list_versions(tmp_path)[0].verification_failed
