"""Mutation audit 30, ``portable-ckpt ls``: the statuses a script or a cron reads from it.

``ls --latest`` exits 1 only for "no version"; ``ls`` is no success where a version's records
could not be read. Real roots; the CLI in process, or unprivileged where a permission counts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.cli.main import main as cli_main
from tests._cli import unprivileged_cli


def _version(root: Path, step: int = 1) -> str:
    return portable_ckpt.save_arrays(root, {"w": np.arange(8.0)}, step=step).attempt_id


@pytest.mark.parametrize("brk", ["\n", "\r"])
def test_latest_whose_path_holds_a_line_break_is_69_not_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], brk: str
) -> None:
    """Mutants k03, k05: a latest version whose path holds a line break cannot be printed as
    one line; it exists, so the status is 69 (never 1, "start afresh"), and ``--json`` gives it."""
    root = tmp_path / f"a{brk}b"
    aid = _version(root)
    assert cli_main(["ls", str(root), "--latest"]) == 69
    out, err = capsys.readouterr()
    assert out == "" and "holds a line break" in err and "use --json" in err
    assert cli_main(["ls", str(root), "--latest", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["path"] == str(root / aid)


def test_ls_is_no_success_when_verification_records_cannot_be_read(tmp_path: Path) -> None:
    """Mutant k08: a committed version whose verification records could not be read (one may
    have failed: a restore stops there) was listed with exit 0 and nothing said."""
    aid = _version(tmp_path)
    assert cli_main(["verify", str(tmp_path / aid), "--deep", "-q"]) == 0  # records a pass
    os.chmod(tmp_path / aid / "verifications", 0)
    try:
        p = unprivileged_cli("ls", str(tmp_path))
    finally:
        os.chmod(tmp_path / aid / "verifications", 0o755)
    assert p.returncode == 1, (p.returncode, p.stderr)  # a permission: a person must act
    assert f"{aid}: its verification records could not be read" in p.stderr, p.stderr
    assert "unreadable" in p.stdout


def test_ls_is_no_success_when_the_pins_cannot_be_read(tmp_path: Path) -> None:
    """Mutant k09: pins that could not be read (any version may be pinned) were said on
    stderr with exit 0; a permission is 1, as for any record ``ls`` could not read."""
    aid = _version(tmp_path)
    assert cli_main(["pin", str(tmp_path / aid), "-q"]) == 0
    os.chmod(tmp_path / "pins", 0)
    try:
        p = unprivileged_cli("ls", str(tmp_path))
    finally:
        os.chmod(tmp_path / "pins", 0o755)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "the pins could not be read (any version may be pinned)" in p.stderr, p.stderr
    assert aid in p.stdout
