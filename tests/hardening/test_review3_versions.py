"""Review round 3, findings 5, 7, 9 and 11: ordering at the end of time, stray records,
``gc --require-copy`` with a path, and terminal escapes in the text CLI.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import CommitConflictError, StorageError
from portable_ckpt.io.gc import gc
from portable_ckpt.io.versions import commit_time, latest, list_versions
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage
from tests._cli import unprivileged_cli

ESC = "evil\x1b]0;PWNED\x07\x1b[31mRED\x9b2J"


def _save(root: Path, step: int) -> str:
    m = portable_ckpt.save_arrays(root, {"w": np.arange(16.0) + step}, step=step)
    return m.attempt_id


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "portable_ckpt.cli.main", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd,
    )


def _set_record(root: Path, aid: str, **members: object) -> None:
    path = root / aid / "manifest.json"
    doc = json.loads(path.read_text())
    doc.update(members)
    path.write_text(json.dumps(doc))


# -- finding 5: committed_at at the end of time -------------------------------------------------


@pytest.mark.parametrize(
    "claimed", ["9999-12-31T23:59:59.999999Z", "9999-12-31T23:59:60.5Z", "9999-12-31T23:59:59.9999999Z"]
)
def test_a_step_whose_version_claims_the_end_of_time(tmp_path: Path, claimed: str) -> None:
    aid = _save(tmp_path, 5)
    _set_record(tmp_path, aid, committed_at=claimed)
    assert portable_ckpt.open(tmp_path).verify(deep=True) == []
    with pytest.raises(CommitConflictError, match="end of the timestamps") as ei:
        portable_ckpt.save_arrays(tmp_path, {"w": np.ones(4)}, step=5)
    assert aid in str(ei.value) and "nothing is published" in str(ei.value)
    assert [v.id for v in list_versions(tmp_path) if v.status == "committed"] == [aid]
    _save(tmp_path, 6)  # other steps are not affected


def test_the_last_microsecond_is_still_given(tmp_path: Path) -> None:
    aid = _save(tmp_path, 5)
    _set_record(tmp_path, aid, committed_at="9999-12-31T23:59:59.999998Z")
    nxt = f"s{5:012d}-20260101T000000000000Z-00000000000000aa"
    assert commit_time(open_storage(tmp_path), nxt) == "9999-12-31T23:59:59.999999Z"


def test_versions_of_one_step_committed_at_the_same_time_are_ordered_by_id(tmp_path: Path) -> None:
    """mutation audit 22 A-71: R-ID-4: of two versions of one step with the same committed_at,
    the latest is the one of the greater attempt id, for open(root) as for list_versions."""
    ids = sorted([_save(tmp_path, 5), _save(tmp_path, 5)])
    for aid in reversed(ids):
        _set_record(tmp_path, aid, committed_at="2026-01-01T00:00:00.000001Z")
    assert [v.id for v in list_versions(tmp_path)] == ids
    assert portable_ckpt.open(tmp_path).id == ids[1]
    assert portable_ckpt.open(tmp_path, step=5).id == ids[1]


def test_a_newer_foreign_record_of_the_answers_step_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """mutation audit 22 A-77: within the answer's step, an attempt of a format this reader does
    not implement that claims a later committed_at is named in a warning (R-COMMIT-1); one that
    claims an earlier one does not change the answer and is not named."""
    older, good, newer = _save(tmp_path, 5), _save(tmp_path, 5), _save(tmp_path, 5)
    for aid in (older, newer):
        _set_record(tmp_path, aid, format_version="2.0")
    assert {v.id: v.status for v in list_versions(tmp_path)} == {
        older: "foreign", good: "committed", newer: "foreign"}
    with caplog.at_level("WARNING", logger="portable_ckpt"):
        assert portable_ckpt.open(tmp_path).id == good
    said = " ".join(r.getMessage() for r in caplog.records)
    assert newer in said and "does not implement" in said and older not in said


# -- finding 7: a commit record that is a symlink, FIFO or directory ----------------------------


def _stray(root: Path, kind: str) -> str:
    aid = f"s{99:012d}-20261203T000000000000Z-00000000000000cc"
    (root / aid).mkdir()
    rec = root / aid / "manifest.json"
    if kind == "symlink":
        os.symlink("/etc/hostname", rec)
    elif kind == "fifo":
        os.mkfifo(rec)
    else:
        rec.mkdir()
    return aid


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_a_stray_record_is_skipped_by_readers_and_kept_by_gc(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    old = _save(tmp_path, 1)
    aid = _stray(tmp_path, kind)
    with caplog.at_level(logging.WARNING):
        assert portable_ckpt.open(tmp_path).id == old
    assert any(aid in r.getMessage() and "R-LAYOUT-7" in r.getMessage() for r in caplog.records)
    assert {v.id: v.status for v in list_versions(tmp_path)} == {old: "committed", aid: "stray"}
    # A save of the stray attempt's step is not blocked either (R-COMMIT-16 reads that step).
    new99 = portable_ckpt.save_arrays(tmp_path, {"w": np.zeros(2)}, step=99).attempt_id
    assert portable_ckpt.open(tmp_path).id == new99
    report = gc(tmp_path, keep=1, grace_seconds=0)
    assert report.complete and report.deleted == [old]
    assert report.foreign_keys == [f"{aid}/manifest.json"]
    assert os.path.lexists(tmp_path / aid / "manifest.json")  # never deleted
    p = _cli("ls", str(tmp_path))
    assert p.returncode == 0 and f"{aid}  99    stray" in p.stdout
    assert "not a regular file" in p.stdout
    p = _cli("gc", str(tmp_path), "--keep", "1", "--grace", "0")
    assert p.returncode == 0 and f"{aid}/manifest.json" in p.stdout
    assert os.path.lexists(tmp_path / aid / "manifest.json")


def test_a_record_that_cannot_be_read_is_still_no_answer(tmp_path: Path) -> None:
    """R-ID-5 is unchanged: an I/O error on a greater attempt's record is PCK-STORAGE."""
    _save(tmp_path, 1)
    aid = _save(tmp_path, 2)
    st = FaultyStorage(open_storage(tmp_path), [Fault(op="read", path=f"{aid}/manifest.json")])
    with pytest.raises(StorageError, match="cannot tell whether"):
        latest(st)
    assert {v.id: v.status for v in list_versions(st)}[aid] == "unreadable"
    assert not gc(st, keep=1, grace_seconds=0, dry_run=True).complete


# -- finding 9: gc --require-copy DEST as a path -----------------------------------------------


def test_require_copy_matches_however_the_destination_is_spelt(tmp_path: Path) -> None:
    src = tmp_path / "src"
    old = _save(src, 1)
    _save(src, 2)
    p = _cli("copy", "src", "backup", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    os.symlink(".", tmp_path / "here")
    for dest in ("backup", "./backup/", str(tmp_path / "backup"),
                 f"file://{tmp_path}/backup", str(tmp_path / "here" / "backup")):
        p = _cli("gc", "src", "--keep", "1", "--dry-run", "--require-copy", dest, "--json",
                 cwd=tmp_path)
        doc = json.loads(p.stdout)
        assert (doc["deleted"], doc["kept_for_copy"]) == ([old], []), dest
    # Another root: nothing is deleted, and the text says which versions wait for a copy.
    # Multi-job review F13: exit 1, said on stderr: a cron must hear that copies are missing.
    p = _cli("gc", "src", "--keep", "1", "--require-copy", "elsewhere", cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    assert "1 version(s) kept for want of a verified copy" in p.stderr
    assert f"kept    {old}  (--require-copy" in p.stdout and "elsewhere" in p.stdout
    assert "kept for want of a copy: 1" in p.stdout
    assert (src / old / "manifest.json").exists()
    # Operator review: a copy deleted since its record was written is no copy.
    shutil.rmtree(tmp_path / "backup")
    for argv in (["--require-copy", "backup"], ["--require-copy"]):
        p = _cli("gc", "src", "--keep", "1", "--dry-run", *argv, "--json", cwd=tmp_path)
        doc = json.loads(p.stdout)
        assert (doc["deleted"], doc["kept_for_copy"]) == ([], [old]), argv


# -- finding 11: terminal escapes from a root ---------------------------------------------------


def test_names_and_strings_from_a_root_are_escaped(tmp_path: Path) -> None:
    aid = _save(tmp_path, 3)
    (tmp_path / ESC).write_text("x")
    _set_record(tmp_path, aid, producer={"name": "x" + ESC, "version": "1\x1b[2J"})
    for argv in (["ls", str(tmp_path)], ["inspect", str(tmp_path)]):
        p = _cli(*argv)
        assert p.returncode == 0, p.stderr
        both = p.stdout + p.stderr  # ls says its notes on stderr (scripting review F10)
        assert "\x1b" not in both and "\x07" not in both and "\x9b" not in both
        assert "evil\\x1b]0;PWNED\\x07\\x1b[31mRED\\x9b2J" in both
    # JSON output carries the strings as they are (JSON escapes them itself).
    doc = json.loads(_cli("ls", str(tmp_path), "--json").stdout)
    assert ESC in doc["foreign_keys"]
    doc = json.loads(_cli("inspect", str(tmp_path), "--json").stdout)
    assert doc["producer"]["name"] == "x" + ESC


def test_error_messages_are_escaped(tmp_path: Path) -> None:
    """An error that quotes a hostile path reaches stderr escaped (cli/main.py)."""
    p = _cli("ls", str(tmp_path / ("missing" + ESC)))
    assert p.returncode == 1 and "PCK-NOT-FOUND" in p.stderr
    assert "\x1b" not in p.stderr and "\x07" not in p.stderr and "\x9b" not in p.stderr
    assert "missingevil\\x1b]0;PWNED\\x07\\x1b[31mRED\\x9b2J" in p.stderr


def test_the_escaping_helpers() -> None:
    from portable_ckpt.cli._text import safe

    assert safe("ok ünïcode") == "ok ünïcode"
    assert safe("a\nb\u202e\x7f") == "a\\x0ab\\u202e\\x7f"
    assert safe("a\tb") == "a\\x09b"


def test_a_path_with_a_newline_stays_on_one_line(tmp_path: Path) -> None:
    """A newline in a path cannot forge a line of the CLI's output (an "OK" after the error)."""
    forged = tmp_path / "missing\nOK  all versions verified"
    for argv in (("ls", str(forged)), ("verify", str(forged)), ("gc", str(forged), "--keep", "1")):
        p = _cli(*argv)
        assert p.returncode == 1 and "PCK-NOT-FOUND" in p.stdout + p.stderr, argv
        for line in (p.stdout + p.stderr).splitlines():
            assert not line.startswith("OK"), (argv, line)
        assert "missing\\x0aOK" in p.stdout + p.stderr, argv


def test_require_copy_counts_a_copy_whose_record_the_source_could_not_take(
    tmp_path: Path,
) -> None:
    """Ops review F13: a copier with read-only access to the source root could not write its
    copy record there (exit 0, a warning), and `gc --require-copy DEST` then kept everything
    for ever; a named destination is now asked directly."""
    src = tmp_path / "src"
    old = _save(src, 1)
    new = _save(src, 2)
    p = _cli("copy", "src", "backup", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    shutil.rmtree(src / new / "copies")  # as if the source had refused the record
    p = _cli("gc", "src", "--keep", "1", "--dry-run", "--require-copy", "backup", "--json",
             cwd=tmp_path)
    doc = json.loads(p.stdout)
    assert (doc["deleted"], doc["kept_for_copy"]) == ([old], []), doc
    # Without a named destination there is nothing to ask: the record is what counts.
    p = _cli("gc", "src", "--keep", "1", "--dry-run", "--require-copy", "--json", cwd=tmp_path)
    assert json.loads(p.stdout)["kept_for_copy"] == [old]


def test_a_copy_to_a_path_with_a_space_is_recorded_and_counted(tmp_path: Path) -> None:
    """Multi-job review F4: ``copy`` to "nightly backup" wrote no copy record (its URL failed the
    schema) and exited 0; ``gc --require-copy`` then kept everything for ever. The record names
    the destination with ``%20``, and gc matches it however the path is given."""
    src = tmp_path / "src"
    old = _save(src, 1)
    new = _save(src, 2)
    p = _cli("copy", "src", "nightly backup", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    record = next((src / new / "copies").iterdir()).read_text()
    assert f"file://{tmp_path}/nightly%20backup" in record
    for dest in ("nightly backup", str(tmp_path / "nightly backup")):
        p = _cli("gc", "src", "--keep", "1", "--dry-run", "--require-copy", dest, "--json",
                 cwd=tmp_path)
        doc = json.loads(p.stdout)
        assert (doc["deleted"], doc["kept_for_copy"]) == ([old], []), (dest, doc)
    p = _cli("gc", "src", "--keep", "1", "--dry-run", "--require-copy", "--json", cwd=tmp_path)
    assert json.loads(p.stdout)["deleted"] == [old]  # any destination: the record counts


def test_copy_records_name_every_destination_reversibly_and_never_the_source(
    tmp_path: Path,
) -> None:
    """Attack review 3 F2, F10, F11: ``%`` was not encoded, so a copy to "bk%20x" was recorded as
    "bk x" and never counted, a copy of "a b" to "a%20b" counted the source itself as its copy
    (gc deleted versions with no copy anywhere), and a record with ``%00`` crashed every gc."""
    from portable_ckpt.io.copy import record_url, url_of_record

    for url in ("file:///a%20b", "s3://b/p%25q", "file:///x y/%7F", "file:///\u00e9%"):
        assert url_of_record(record_url(url)) == url
    src = tmp_path / "a b"
    old = _save(src, 1)
    new = _save(src, 2)
    p = _cli("copy", "a b", "bk%20x", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "bk%2520x" in next((src / new / "copies").iterdir()).read_text()
    p = _cli("gc", "a b", "--keep", "1", "--dry-run", "--require-copy", "bk%20x", "--json",
             cwd=tmp_path)
    assert json.loads(p.stdout)["deleted"] == [old], p.stdout
    # A copy to "a%20b" (another directory) that is deleted since: no copy anywhere, though
    # the record's name, misread, named the source root.
    p = _cli("copy", "a b", "a%20b", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    shutil.rmtree(tmp_path / "bk%20x")
    shutil.rmtree(tmp_path / "a%20b")
    p = _cli("gc", "a b", "--keep", "1", "--require-copy", cwd=tmp_path)
    assert p.returncode == 1 and (src / old / "manifest.json").exists(), p.stdout
    # A record that names the source root itself, or a NUL: no copy, no crash.
    for dest in (f"file://{src}".replace(" ", "%20"), "file:///tmp/a%00b"):
        record = {"format": "portable-ckpt-copy", "format_version": "1.0", "attempt_id": new,
                  "copy_id": f"c20261204T120000{len(dest):06d}Z-0badc0de",
                  "destination": dest, "verified_at": "2026-12-04T12:00:00Z", "ok": True}
        (src / new / "copies" / f"{record['copy_id']}.json").write_text(json.dumps(record))
        p = _cli("gc", "a b", "--keep", "1", "--require-copy", cwd=tmp_path)
        assert p.returncode == 1 and "internal error" not in p.stderr, p.stderr
        assert (src / old / "manifest.json").exists()


def test_require_copy_says_when_a_destination_could_not_be_asked(tmp_path: Path) -> None:
    """Attack review 3 F16: "the copies are missing" when the destination only failed to
    answer; the operator re-copied instead of fixing access."""
    src = tmp_path / "src"
    old = _save(src, 1)
    _save(src, 2)
    assert _cli("copy", "src", "backup", cwd=tmp_path).returncode == 0
    os.chmod(tmp_path / "backup", 0)
    try:
        p = unprivileged_cli("gc", "src", "--keep", "1", "--require-copy", cwd=tmp_path)
    finally:
        os.chmod(tmp_path / "backup", 0o755)
    assert p.returncode == 1 and (src / old / "manifest.json").exists()
    assert "could not be asked whether it holds the copy" in p.stderr, p.stderr


def test_a_copy_whose_record_cannot_be_written_fails_even_quiet(tmp_path: Path) -> None:
    """Multi-job review F4: the copy exited 0 and, with -q, said nothing at all. A file in
    place of the records' directory does not pass by waiting: 1, not 75 (scripting F6)."""
    src = tmp_path / "src"
    new = _save(src, 1)
    (src / new / "copies").write_text("not a directory")  # the record cannot go there
    p = _cli("copy", "src", "backup", "-q", cwd=tmp_path)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "the copy is made, but its record was not written" in p.stderr
    assert (tmp_path / "backup" / new / "manifest.json").exists()
