"""Mutation audit 30, ``portable-ckpt gc``: exit statuses where gc kept what it was asked to remove.

Real roots, the CLI in process.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.cli.main import main as cli_main


def _save(root: Path, step: int) -> str:
    return portable_ckpt.save_arrays(root, {"w": np.full(4, step, np.int64)}, step=step).attempt_id


def test_retire_abandoned_that_meets_a_pin_is_1(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Mutant k14: a version a rollback abandoned but pinned stays the latest, not the new
    branch: ``--retire-abandoned`` did not do what was asked, which a person must settle
    (unpin it), so exit 1; it said so and exited 0."""
    first2, three = _save(tmp_path, 2), _save(tmp_path, 3)
    again2 = _save(tmp_path, 2)  # the job resumed from step 1 and saved step 2 again
    now = time.time() - 600
    for i, aid in enumerate((first2, three, again2)):  # stored in the order committed
        os.utime(tmp_path / aid / "manifest.json", (now + i, now + i))
    assert cli_main(["pin", f"{tmp_path}/{three}", "-q"]) == 0
    capsys.readouterr()
    assert cli_main(["gc", str(tmp_path), "--keep", "3", "--grace", "0",
                     "--retire-abandoned"]) == 1
    out = capsys.readouterr().out
    assert f"kept    {three}  (--retire-abandoned: abandoned by a rollback, but pinned" in out
    assert (tmp_path / three / "manifest.json").is_file()
    assert portable_ckpt.open(str(tmp_path)).id == three  # still the latest, as said
    assert cli_main(["unpin", f"{tmp_path}/{three}", "-q"]) == 0
    assert cli_main(["gc", str(tmp_path), "--keep", "3", "--grace", "0", "-q",
                     "--retire-abandoned"]) == 0
    assert portable_ckpt.open(str(tmp_path)).id == again2


def test_dry_run_says_would_delete_and_deletes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutant k11: ``--dry-run`` printed "deleted" for what it only would delete; the report
    of a dry run must not read as a run that happened."""
    old, new = _save(tmp_path, 1), _save(tmp_path, 2)
    assert cli_main(["gc", str(tmp_path), "--keep", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"would delete  {old}" in out and "deleted  " not in out.replace("would delete  ", "")
    assert f"kept 1: {new}" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([old, new])
    assert cli_main(["gc", str(tmp_path), "--keep", "1"]) == 0
    assert f"deleted  {old}" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == [new]


def test_require_copy_without_any_copy_is_1_not_retry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutant k17: versions kept for want of a copy when no destination was even asked (no
    copy exists): waiting mends nothing, a copy must be made: 1, not 75."""
    old, new = _save(tmp_path, 1), _save(tmp_path, 2)
    assert cli_main(["gc", str(tmp_path), "--keep", "1", "--require-copy"]) == 1
    err = capsys.readouterr().err
    assert "kept for want of a verified copy: no destination holds a copy" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([old, new])
