"""Mutation audit 32 of ``io/copy.py``: copying a version to another root, verified, with its
copy record (spec §14.4, R-DRILL-5, R-COMMIT-17), on real roots written by the library.

Each test names the mutant it kills (the audit's table is in its report).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import CheckpointError, CommitConflictError, StorageError
from portable_ckpt.io.annotations import write_verification_record
from portable_ckpt.io.copy import (
    copies_of,
    copy_version,
    normalize_root_url,
    record_url,
    url_of_record,
)
from portable_ckpt.storage import LocalStorage, ObjectInfo, open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage


def _save(root: Path, step: int) -> str:
    return portable_ckpt.save_arrays(root, {"w": np.arange(64.0) + step}, step=step).attempt_id


def _bind_mounts() -> bool:
    """Whether this machine lets an unprivileged user namespace bind-mount (``unshare -rm``)."""
    if shutil.which("unshare") is None:
        return False
    p = subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30)
    return p.returncode == 0


@pytest.mark.skipif(not _bind_mounts(), reason="needs unshare -rm (a user namespace) to bind-mount")
def test_a_destination_below_a_bind_mount_of_the_source_root_is_refused(tmp_path: Path) -> None:
    """A bind mount of the source root is the same directory under another path, which no
    real path resolves: only its device and inode tell. A copy to a root below it is a copy
    into the source root (no second copy; gc of the source deletes it), refused with exit 2
    before anything is written. Mutant C10 (``_check_not_inside`` trusts real paths only): the
    copy went into the source root."""
    src = tmp_path / "src"
    aid = _save(src, 1)
    alias = tmp_path / "alias"
    alias.mkdir()
    script = 'mount --bind "$1" "$2" && exec "$3" -m portable_ckpt.cli.main copy "$4" "$5"'
    p = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", str(src), str(alias), sys.executable,
         str(src / aid), str(alias / "backup")],
        capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 2, p
    assert "lies inside the source root" in p.stderr and "another mount" in p.stderr, p.stderr
    assert sorted(q.name for q in src.iterdir()) == [aid]  # nothing written into the source


class _ClockBehind(LocalStorage):
    """A local root on a file server whose clock runs an hour behind this machine's: every time
    it gives a file (a listing's ``mtime``) is an hour earlier than this machine's clock."""

    def list(self, prefix: str = "", *, recursive: bool = True) -> Iterator[ObjectInfo]:
        for info in super().list(prefix, recursive=recursive):
            yield dataclasses.replace(info, mtime=info.mtime - 3600)


def test_leftovers_written_just_now_by_a_server_whose_clock_is_behind_are_kept(
    tmp_path: Path,
) -> None:
    """Multi-job review F2: the age of an interrupted copy's leftovers at a local destination is
    measured on the destination's clock (a probe's time there), not this machine's: files
    another copy writes right now on a file server an hour behind are fresh, a conflict, and
    are not cleared. Mutant C17 (this machine's clock): they were an hour old, and the copy
    deleted the files of the copy in progress."""
    aid = _save(tmp_path / "src", 1)
    left = tmp_path / "dst" / aid / "data"
    left.mkdir(parents=True)
    (left / "w00000-0000.safetensors").write_bytes(b"another copy, writing now")
    with pytest.raises(CommitConflictError, match=r"written \d+s ago: another copy may be in"):
        copy_version(str(tmp_path / "src" / aid), _ClockBehind(tmp_path / "dst"))
    assert (left / "w00000-0000.safetensors").read_bytes() == b"another copy, writing now"


def test_leftovers_are_as_young_as_their_newest_file(tmp_path: Path) -> None:
    """A copy in progress wrote its first file long ago (a large version) and its latest just
    now: the leftovers' age is their newest file's, so they are a copy in progress, kept. Mutant
    C18 (their oldest file's): the copy cleared the files of the copy still writing them."""
    aid = _save(tmp_path / "src", 1)
    left = tmp_path / "dst" / aid / "data"
    left.mkdir(parents=True)
    (left / "w00000-0000.safetensors").write_bytes(b"written two hours ago")
    old = time.time() - 7200
    os.utime(left / "w00000-0000.safetensors", (old, old))
    (left / "w00001-0000.safetensors").write_bytes(b"written now")
    with pytest.raises(CommitConflictError, match=r"holds 2 files of an uncommitted copy"):
        copy_version(str(tmp_path / "src" / aid), str(tmp_path / "dst"))
    assert sorted(p.name for p in left.iterdir()) == [
        "w00000-0000.safetensors", "w00001-0000.safetensors"]


def test_a_copy_of_a_root_stops_where_the_newest_versions_verifications_cannot_be_read(
    tmp_path: Path,
) -> None:
    """R-ID-5, R-DRILL-8: ``copy ROOT`` copies what a restore takes; where the newest version's
    verification records cannot be read (one of a newer major format: it may say "failed"), a
    restore stops, and so does the copy: PCK-STORAGE naming that version, nothing copied.
    Mutant C19 (``_restorable`` ignores unread records): the newest version was copied as the
    backup. Mutant C20 (the walk does not stop): the older version was, silently."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    _save(src, 1)
    two = _save(src, 2)
    rel = write_verification_record(open_storage(src), two, ok=True, mode="deep", fraction=None,
                                    chunks=1)
    record = src / rel
    doc = json.loads(record.read_text())
    record.write_text(json.dumps({**doc, "format_version": "2.0"}))
    with pytest.raises(StorageError, match="cannot tell whether it is the version a restore"
                       ) as info:
        copy_version(str(src), str(dst))
    assert two in str(info.value)
    assert not dst.exists() or not any(dst.iterdir())


def test_a_failed_copy_leaves_the_files_of_a_version_another_copy_published(
    tmp_path: Path,
) -> None:
    """A copy that fails removes the files it created, unless the version was published there
    meanwhile: then the paths it wrote hold that version's files (a forced copy replaced its
    leftovers and committed). Mutant C25 (removed whatever happened): the failed copy deleted
    a file of the published version."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    aid = portable_ckpt.save_arrays(
        src, {"w": np.arange(4096.0), "v": np.ones(8)}, step=1, entries={"note": {"lr": 0.1}}
    ).attempt_id
    assert len(portable_ckpt.open(src / aid).manifest.files) >= 2

    def other_copy(op: str, path: str) -> None:  # after the first file was written and closed
        copy_version(str(src / aid), str(dst), force=True)

    hooked = FaultyStorage(open_storage(dst, create=True), [
        Fault(op="open", path=f"{aid}/*", after_ops=1, times=1, error="EIO", callback=other_copy)])
    with pytest.raises(CheckpointError):
        copy_version(str(src / aid), hooked, jobs=1)
    assert portable_ckpt.open(dst / aid).verify(deep=True) == []


def test_a_copy_that_meets_another_copy_removes_only_its_own_files(tmp_path: Path) -> None:
    """Two copies of one version to one root: the one that finds a file the other created
    (PCK-COMMIT-CONFLICT) removes the files it created itself, never the other copy's.
    Mutant C26 (removes the attempt's whole directory): the other copy's file was deleted
    under it."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    aid = portable_ckpt.save_arrays(
        src, {"w": np.arange(4096.0), "v": np.ones(8)}, step=1, entries={"note": {"lr": 0.1}}
    ).attempt_id
    files = sorted(portable_ckpt.open(src / aid).manifest.files.values(), key=lambda r: -r.size)
    theirs = dst / aid / files[1].path

    def other_copy_writes(op: str, path: str) -> None:  # as this copy opens its first file
        theirs.parent.mkdir(parents=True, exist_ok=True)
        theirs.write_bytes(b"the other copy's bytes")

    hooked = FaultyStorage(open_storage(dst, create=True), [
        Fault(op="open", path=f"{aid}/*", times=1, error=None, callback=other_copy_writes)])
    with pytest.raises(CommitConflictError, match="another copy of the version writes"):
        copy_version(str(src / aid), hooked, jobs=1)
    assert theirs.read_bytes() == b"the other copy's bytes"
    assert not (dst / aid / files[0].path).exists()  # its own file is removed


def test_a_failed_copy_record_names_no_copy(tmp_path: Path) -> None:
    """``copies_of`` (what a restore's report and ``recommit`` name as copies) counts verified
    copies only: a copy record whose ``ok`` is false names no root. Mutant C47 (every record
    with a destination): a failed copy was offered as the place to restore from."""
    src = tmp_path / "src"
    aid = _save(src, 1)
    res = copy_version(str(src / aid), tmp_path / "good")
    assert copies_of(open_storage(src), aid) == ([str(tmp_path / "good")], None)
    failed = copy_version(str(src / aid), tmp_path / "bad")
    assert failed.record is not None
    record = src / failed.record
    doc = json.loads(record.read_text())
    doc.update(ok=False, error={"code": "PCK-CHECKSUM", "message": "block 0 differs"})
    record.write_text(json.dumps(doc))
    assert copies_of(open_storage(src), aid) == ([str(tmp_path / "good")], None)
    assert res.record is not None


def _copied_with_record(tmp_path: Path) -> tuple[Path, str, Path, dict[str, Any]]:
    """A version at ``tmp_path/src`` copied to another root: the root, its id, the copy
    record's path and its document."""
    src = tmp_path / "src"
    aid = _save(src, 1)
    res = copy_version(str(src / aid), tmp_path / "other")
    assert res.record is not None
    record = src / res.record
    return src, aid, record, json.loads(record.read_text())


def test_a_copy_record_naming_the_source_root_names_no_copy(tmp_path: Path) -> None:
    """A copy record whose destination is the version's own root (written by hand or by a tool
    that was wrong) is no second copy: ``copies_of`` leaves it out. Mutant C48: the source
    root itself was named as the copy to restore from."""
    src, aid, record, doc = _copied_with_record(tmp_path)
    doc["destination"] = f"file://{src}"
    record.write_text(json.dumps(doc))
    assert copies_of(open_storage(src), aid) == ([], None)


def test_a_copy_record_that_cannot_be_read_is_said_with_the_copies(tmp_path: Path) -> None:
    """``copies_of`` never raises (a copy record never fails a restore) but says why its list
    may be short: a record of a newer major format is one it cannot read. Mutant C49 (the
    records' errors dropped): the list looked complete."""
    src, aid, record, doc = _copied_with_record(tmp_path)
    doc["format_version"] = "2.0"
    record.write_text(json.dumps(doc))
    copies, problem = copies_of(open_storage(src), aid)
    assert copies == [] and problem is not None and record.relative_to(src).as_posix() in problem


@pytest.mark.parametrize("path", ["/mnt/del\x7fname", "/mnt/a%20b", "/mnt/a b\tc"])
def test_a_copy_record_names_its_destination_reversibly(tmp_path: Path, path: str) -> None:
    """``record_url`` writes spaces, control characters (DEL among them) and ``%`` as ``%XX``
    (``copy.schema.json`` allows none of the first), and ``url_of_record`` gives the URL back:
    ``a%20b`` and ``a b`` are two roots. Mutant C51 (DEL kept): a destination with one got no
    record; C52 (``%`` kept): ``a%20b`` came back as ``a b``."""
    url = f"file://{path}"
    written = record_url(url)
    assert not any(ord(c) <= 0x20 or ord(c) == 0x7F for c in written)
    assert url_of_record(written) == url
    src = tmp_path / "src"
    aid = _save(src, 1)
    dst = tmp_path / path.lstrip("/")
    res = copy_version(str(src / aid), dst)
    assert res.record is not None and res.record_error is None
    assert copies_of(open_storage(src), aid) == ([str(dst)], None)


def test_a_remote_root_url_is_canonical_without_its_trailing_slash() -> None:
    """``normalize_root_url`` gives one spelling per root, which copy records name and
    ``gc --require-copy`` compares: ``s3://bucket/prefix/`` is ``s3://bucket/prefix``. Mutant
    C53 (the slash kept): the copy's version was named ``s3://bucket/prefix//<id>``."""
    assert normalize_root_url("s3://bucket/prefix/") == "s3://bucket/prefix"
    assert normalize_root_url("s3://bucket/prefix") == "s3://bucket/prefix"
