"""The manager's restore never silently resumes older than it can prove is newest (R-ID-5).

Found by an outside review: one EIO while listing the root made ``restore`` return ``None``
(the job retrained from scratch, and retention then deleted its new versions); one EIO reading
the newest record restored the one before; ``restore(step=N)`` for a missing step returned
``None``; and a version found damaged was tried first again by every restart (R-DRILL-8).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import portable_ckpt
from portable_ckpt.cli.main import main
from portable_ckpt.torch.launch import GroupResult, run_group

ROOT = str(Path(__file__).resolve().parents[2])
W = "tests.manager._restore_workers"


def _run(fn: str, *args: Any) -> list[Any]:
    res: GroupResult = run_group(f"{W}:{fn}", 2, args, timeout=120, pg_timeout=45, sys_path=[ROOT])
    res.raise_for_errors()
    return list(res.results)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("restore-safety") / "ckpt"
    _run("populate", str(root))
    assert [v.step for v in portable_ckpt.list_versions(root)] == [2, 4]
    return root


def _copy(saved: Path, tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    shutil.copytree(saved, root)
    return root


def test_a_failed_listing_is_an_error_not_a_first_run(saved: Path, tmp_path: Path) -> None:
    root = _copy(saved, tmp_path)
    for out in _run("restore", str(root), "list:*", None):
        assert out["code"] == "PCK-STORAGE" and "R-ID-5" in out["message"]


def test_an_unreadable_newest_record_stops_the_restore(saved: Path, tmp_path: Path) -> None:
    root = _copy(saved, tmp_path)
    newest = portable_ckpt.list_versions(root)[-1].id
    for out in _run("restore", str(root), f"read+size+exists:{newest}/manifest.json", None):
        assert out["code"] == "PCK-STORAGE" and newest in out["message"]
    # The fault was transient: the next restore takes the newest version.
    assert [o["step"] for o in _run("restore", str(root), None, None)] == [4, 4]


def test_a_step_that_is_not_there_is_not_found(saved: Path, tmp_path: Path) -> None:
    root = _copy(saved, tmp_path)
    for out in _run("restore", str(root), None, 3):
        assert out["code"] == "PCK-NOT-FOUND" and "step 3" in out["message"]
    back = _run("restore", str(root), None, 2)
    assert [o["step"] for o in back] == [2, 2]
    # Rolling back: rank 0 says that the newer step 4 would win again (and keep_last).
    assert [line for line in back[0]["said"] if "newer steps [4]" in line]
    assert back[1]["said"] == []
    empty = tmp_path / "empty"
    for out in _run("restore", str(empty), None, 5):
        assert out["code"] == "PCK-NOT-FOUND"
    assert [o["step"] for o in _run("restore", str(empty), None, None)] == [None, None]


def test_a_version_found_damaged_is_recorded_and_skipped_next_time(
    saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _copy(saved, tmp_path)
    newest = portable_ckpt.list_versions(root)[-1]
    for data in sorted(Path(newest.path, "data").iterdir()):
        raw = bytearray(data.read_bytes())
        raw[-5] ^= 0xFF
        data.write_bytes(bytes(raw))
    first = _run("restore", str(root), None, None)
    assert [o["step"] for o in first] == [2, 2]
    assert [f["checkpoint_id"] for f in first[0]["fallbacks"]] == [newest.id]
    # the skipped version is said on stderr by rank 0, without logging set up
    assert [line for line in first[0]["said"] if newest.id in line and "next candidate" in line]
    after = {v.id: v for v in portable_ckpt.list_versions(root)}[newest.id]
    assert after.status == "committed" and after.verification_failed
    again = _run("restore", str(root), None, None)
    assert [o["step"] for o in again] == [2, 2] and again[0]["fallbacks"] == []
    # Asked for by its step, it is named as failed, not as missing.
    for out in _run("restore", str(root), None, 4):
        assert out["code"] == "PCK-NOT-FOUND" and "failed verification" in out["message"]
    assert main(["ls", str(root)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(newest.id))
    assert " failed " in line


def test_a_retry_after_every_version_failed_is_no_first_run(saved: Path, tmp_path: Path) -> None:
    """Operator review: with every version damaged, the first restore failed (right) and marked
    them failed; the same command again returned None, the job trained from step 1 and its
    retention deleted the damaged versions. Now the retry fails too, naming them."""
    root = _copy(saved, tmp_path)
    for v in portable_ckpt.list_versions(root):
        for data in sorted(Path(v.path, "data").iterdir()):
            raw = bytearray(data.read_bytes())
            raw[-5] ^= 0xFF
            data.write_bytes(bytes(raw))
    for out in _run("restore", str(root), None, None):
        assert out["code"] == "PCK-DISTRIBUTED"
    assert all(v.verification_failed for v in portable_ckpt.list_versions(root))
    for out in _run("restore", str(root), None, None):
        assert out["code"] == "PCK-NOT-FOUND" and "failed verification" in out["message"]
        assert "checkpoint=" in out["message"]
