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


def test_inspect_step_and_json_show_what_was_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutants k23, k24: ``inspect --step`` was not passed on (the latest was shown), and
    ``--json`` without ``--ranges`` listed every range and block checksum."""
    first = _version(tmp_path, step=1)
    _version(tmp_path, step=2)
    assert cli_main(["inspect", str(tmp_path), "--step", "1"]) == 0
    out = capsys.readouterr().out
    assert f"version     {tmp_path / first}\nstep        1\n" in out, out
    assert cli_main(["inspect", str(tmp_path / first), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["tensors"]["w"]["ranges"] == 1
    assert all("blocks" not in f["checksum"] for f in doc["files"].values())
    assert cli_main(["inspect", str(tmp_path / first), "--json", "--ranges"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["tensors"]["w"]["ranges"]) == 1
    assert all("blocks" in f["checksum"] for f in doc["files"].values())


def test_an_uncommitted_attempt_of_the_committed_step_is_not_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutant t01: ``ls`` names attempts without a record *above* every committed step (a
    newer step may be brought back); one of the committed step itself is a save of a step
    already restorable and was named with a recommit to run."""
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id
    from portable_ckpt.storage import open_storage

    _version(tmp_path, step=2)
    storage = open_storage(tmp_path)
    for step in (2, 3):
        w = ShardWriter(storage, new_attempt_id(step), 0)
        w.add_tensor("w", np.ones(4, np.float32))
        w.finish()  # every writer's index, no commit record
    assert cli_main(["ls", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    named = [line for line in err.splitlines() if "no commit record, but every writer's index" in line]
    assert len(named) == 1 and named[0].startswith("portable-ckpt: s000000000003-"), err


def test_the_newest_three_uncommitted_attempts_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutants t02, t04: of the attempts without a record above the committed steps, the
    newest three are named (each costs a listing); a version whose record was lost is named
    once, as invalid with its code, not again as a save cut short."""
    from portable_ckpt.io.annotations import write_verification_record
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id
    from portable_ckpt.storage import open_storage

    _version(tmp_path, step=1)
    lost = _version(tmp_path, step=7)  # the newest attempt
    storage = open_storage(tmp_path)
    write_verification_record(storage, lost, ok=True, mode="sample", fraction=0.5, chunks=1)
    (tmp_path / lost / "manifest.json").unlink()  # committed, then its record was lost
    for step in (3, 4, 5, 6):
        w = ShardWriter(storage, new_attempt_id(step), 0)
        w.add_tensor("w", np.ones(4, np.float32))
        w.finish()
    assert cli_main(["ls", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    named = [line.split(":")[1].strip()[:13] for line in err.splitlines()
             if "no commit record, but every writer's index" in line]
    assert named == ["s000000000004", "s000000000005", "s000000000006"], err
    assert f"portable-ckpt: {lost}: invalid: " in err


def test_latest_with_only_uncommitted_attempts_is_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutant k31: attempts without a commit record are no versions: with nothing else, ``ls
    --latest`` is 1 ("none: start afresh"); counted as versions that failed verification it
    said 69 and a job never started."""
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id
    from portable_ckpt.storage import open_storage

    w = ShardWriter(open_storage(tmp_path, create=True), new_attempt_id(1), 0)
    w.add_tensor("w", np.ones(4, np.float32))
    w.finish()  # a first save cut short before its commit
    assert cli_main(["ls", str(tmp_path), "--latest"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "PCK-NOT-FOUND" in err and "failed verification" not in err
