"""Mutation audit 30, ``portable-ckpt copy``: what each option changes, said as documented.

The library's ``copy_version`` is tested at length; these pin the command line's own part: its
options reach the copy, its destination check refuses before anything is made, and its report
tells a copy from a version already there. Real files, the real CLI in process.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.cli.main import main as cli_main


def _version(root: Path) -> str:
    return portable_ckpt.save_arrays(root, {"w": np.arange(64.0)}, step=3).attempt_id


def test_no_record_writes_no_copy_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Mutant c02: ``--no-record`` was ignored, and a copy record was written into the source."""
    aid = _version(tmp_path / "src")
    assert cli_main(["copy", str(tmp_path / "src"), str(tmp_path / "dst"), "--no-record",
                     "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["record"] is None and doc["record_error"] is None
    assert not (tmp_path / "src" / aid / "copies").exists()
    assert (tmp_path / "dst" / aid / "manifest.json").is_file()
    assert cli_main(["copy", str(tmp_path / "src"), str(tmp_path / "dst2"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["record"].startswith(f"{aid}/copies/")  # without it, recorded
    assert (tmp_path / "src" / doc["record"]).is_file()


def test_force_replaces_a_fresh_leftover(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Mutant c03: ``--force`` was not passed on: fresh leftovers of a copy stayed a conflict
    (75, retry) however often the operator forced it."""
    aid = _version(tmp_path / "src")
    left = tmp_path / "dst" / aid / "data"
    left.mkdir(parents=True)
    (left / "w00000-0000.safetensors").write_bytes(b"half a copy")  # a copy killed just now
    argv = ["copy", str(tmp_path / "src" / aid), str(tmp_path / "dst"), "-q"]
    assert cli_main(argv) == 75
    assert "PCK-COMMIT-CONFLICT" in capsys.readouterr().err
    assert cli_main([*argv, "--force"]) == 0
    assert portable_ckpt.open(tmp_path / "dst" / aid).verify(deep=True) == []


def test_a_second_copy_says_the_version_is_already_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutant c08: a copy that found the version at the destination (and verified it there)
    said "copied to", as if bytes had moved; c12: the copy record's line."""
    aid = _version(tmp_path / "src")
    argv = ["copy", str(tmp_path / "src"), str(tmp_path / "dst")]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert f"{aid} (step 3) copied to " in out
    # where the copy is recorded (mutant c12: the line was dropped)
    assert f"  copy record: {tmp_path / 'src'}/{aid}/copies/c" in out, out
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert f"{aid} (step 3) already present at file://{tmp_path / 'dst'}/{aid}" in out, out
    assert cli_main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["already_present"] is True and doc["bytes"] == 0 and doc["files"] >= 1


def test_a_dangling_symlink_is_no_destination(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Mutant a09: a destination that is a symbolic link to nothing passed the check (it does
    not "exist"); it is refused as any non-directory is, exit 2, before anything is made."""
    _version(tmp_path / "src")
    link = tmp_path / "dst"
    os.symlink(tmp_path / "nowhere", link)
    with pytest.raises(SystemExit) as ei:
        cli_main(["copy", str(tmp_path / "src"), str(link)])
    assert ei.value.code == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    assert os.path.islink(link) and not (tmp_path / "nowhere").exists()


def test_step_copies_that_steps_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Mutant c06: ``--step`` was not passed on, and the latest version was copied instead."""
    first = _version(tmp_path / "src")
    portable_ckpt.save_arrays(tmp_path / "src", {"w": np.arange(8.0)}, step=7)
    assert cli_main(["copy", str(tmp_path / "src"), str(tmp_path / "dst"), "--step", "3",
                     "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["attempt_id"], doc["step"]) == (first, 3)
    assert sorted(p.name for p in (tmp_path / "dst").iterdir()) == [first]


def test_a_corrupt_source_block_fails_the_copy_and_publishes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutant x02: a source data file with a flipped byte (its size unchanged) was copied and
    published, and the copy recorded as verified: the per-block CRC32C check is what stops it."""
    aid = _version(tmp_path / "src")
    [data] = (tmp_path / "src" / aid / "data").iterdir()
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF  # in the last tensor's bytes
    data.write_bytes(bytes(raw))
    assert cli_main(["copy", str(tmp_path / "src"), str(tmp_path / "dst"), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["code"] == "PCK-CHECKSUM" and "the source is corrupt" in doc["error"]["message"]
    assert not (tmp_path / "dst" / aid).exists()
    assert not (tmp_path / "src" / aid / "copies").exists()


def test_a_chunk_that_is_no_whole_number_of_blocks_copies(tmp_path: Path) -> None:
    """Mutant x01: ``copy_version(chunk_size=...)`` is rounded down to whole checksum blocks;
    unrounded, a block split across two reads failed its CRC32C on a sound source."""
    from portable_ckpt.io.copy import copy_version

    m = portable_ckpt.save_arrays(tmp_path / "src", {"w": np.arange(8192.0)}, step=1,
                                  block_size=4096)
    res = copy_version(str(tmp_path / "src"), str(tmp_path / "dst"), chunk_size=4096 * 3 + 100)
    assert res.bytes == sum(f.size for f in m.files.values()) and res.files == len(m.files)
    assert portable_ckpt.open(tmp_path / "dst").verify(deep=True) == []


def test_leftovers_dated_ahead_are_a_conflict_that_waiting_does_not_mend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutant x15: leftovers whose times are ahead of this clock may be a copy in progress or
    a clock that runs ahead: waiting does not tell, so the conflict is 1, not 75 (retry)."""
    aid = _version(tmp_path / "src")
    left = tmp_path / "dst" / aid / "data" / "w00000-0000.safetensors"
    left.parent.mkdir(parents=True)
    left.write_bytes(b"half a copy")
    future = time.time() + 3600
    os.utime(left, (future, future))
    assert cli_main(["copy", str(tmp_path / "src"), str(tmp_path / "dst"), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["code"] == "PCK-COMMIT-CONFLICT" and doc["error"]["retryable"] is False
    assert "ahead of this machine's clock" in doc["error"]["message"]
    assert left.read_bytes() == b"half a copy"


def test_a_destination_inside_a_remote_source_root_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutant x09: only the URLs tell a destination below the source root on a store without
    local paths (no real path to compare); such a copy is deleted with the source."""
    from tests.core.test_exit_classes import _scheme

    scheme = _scheme()
    _version(tmp_path / "src")
    assert cli_main(["copy", f"{scheme}://{tmp_path}/src", f"{scheme}://{tmp_path}/src/backup"]) == 2
    assert "lies inside the source root" in capsys.readouterr().err
    assert not (tmp_path / "src" / "backup").exists()


def test_the_same_root_as_a_local_path_and_a_remote_url_is_no_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutant x21: with one side local and the other a store without local paths, no real
    path compares them: the probe must run when either side is not local."""
    from tests.core.test_exit_classes import _scheme

    scheme = _scheme()
    aid = _version(tmp_path / "q")
    assert cli_main(["copy", str(tmp_path / "q"), f"{scheme}://{tmp_path}/./q"]) == 2
    assert "same root" in capsys.readouterr().err
    assert not (tmp_path / "q" / aid / "copies").exists()


def test_a_different_record_published_concurrently_fails_the_copy(tmp_path: Path) -> None:
    """Mutant x28: another copy published a different commit record under the same id while
    this one copied: its create-if-absent fails, and the record there is not this version's,
    so no copy is vouched for."""
    from portable_ckpt.errors import CommitConflictError
    from portable_ckpt.io.copy import copy_version
    from portable_ckpt.storage import open_storage
    from tests.hardening.test_review3_copy import _HookedStorage

    aid = _version(tmp_path / "src")
    dst = tmp_path / "dst"

    def publish_another() -> None:
        (dst / aid / "manifest.json").write_bytes(b'{"other": "record"}')

    hooked = _HookedStorage(open_storage(dst, create=True), publish_another)
    with pytest.raises(CommitConflictError, match="committed concurrently with a different record"):
        copy_version(str(tmp_path / "src"), hooked)
    assert not (tmp_path / "src" / aid / "copies").exists()


def test_step_copies_a_version_that_failed_verification_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutant x42: a root copies the version a restore takes, but ``--step`` names the version
    to copy; it copied the restore's choice (another step) instead of the one asked for."""
    from portable_ckpt.io.annotations import write_verification_record
    from portable_ckpt.storage import open_storage

    asked = _version(tmp_path / "src")  # step 3
    portable_ckpt.save_arrays(tmp_path / "src", {"w": np.arange(8.0)}, step=2)
    write_verification_record(open_storage(tmp_path / "src"), asked, ok=False, mode="deep",
                              fraction=None, chunks=1, errors=[{"code": "PCK-CHECKSUM",
                                                                "message": "x"}])
    assert cli_main(["copy", str(tmp_path / "src"), str(tmp_path / "dst"), "--step", "3",
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["attempt_id"] == asked


def test_a_copy_over_a_version_that_failed_verification_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutant x25: the destination already held the version, every byte verified there, but
    a failed verification record there keeps it from restores: the copy warns and names how
    to clear it, or the operator believes the destination restorable."""
    from portable_ckpt.io.annotations import write_verification_record
    from portable_ckpt.storage import open_storage

    aid = _version(tmp_path / "src")
    argv = ["copy", str(tmp_path / "src"), str(tmp_path / "dst")]
    assert cli_main(argv) == 0
    write_verification_record(open_storage(tmp_path / "dst"), aid, ok=False, mode="deep",
                              fraction=None, chunks=1, errors=[{"code": "PCK-CHECKSUM",
                                                                "message": "x"}])
    capsys.readouterr()
    assert cli_main(argv) == 0
    out, err = capsys.readouterr()
    assert "already present at" in out
    assert f"warning: file://{tmp_path / 'dst'}/{aid} failed verification earlier" in err, err
    assert "--clear-failed" in err



def test_a_relative_destination_is_recorded_as_an_absolute_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutant x39: ``copy ROOT backup`` run from a directory recorded ``file://backup``, which
    names nothing from anywhere else (``ls``, ``gc --require-copy``, recommit read it)."""
    aid = _version(tmp_path / "src")
    monkeypatch.chdir(tmp_path)
    assert cli_main(["copy", "src", "backup", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["destination"] == f"file://{tmp_path}/backup"
    [info] = portable_ckpt.list_versions(tmp_path / "src")
    assert [c["destination"] for c in info.copies] == [f"file://{tmp_path}/backup"]
    assert (tmp_path / "backup" / aid / "manifest.json").is_file()


def test_json_names_why_the_copy_record_was_not_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutant x45: ``copy --json`` whose record could not be written lost ``record_error``
    from its document: the one field that says why ``gc --require-copy`` sees no copy."""
    from portable_ckpt.storage.faults import Fault
    from tests.core.test_exit_classes import _scheme

    _version(tmp_path / "src")
    scheme = _scheme([Fault(op="create", path="*/copies/*", error="EIO")])
    assert cli_main(["copy", f"{scheme}://{tmp_path}/src", str(tmp_path / "dst"), "--json"]) == 75
    doc = json.loads(capsys.readouterr().out)
    assert doc["record"] is None and "Input/output error" in doc["record_error"], doc
