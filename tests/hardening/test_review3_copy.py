"""Review round 3, findings 2 and 10: what ``copy`` publishes, and where it refuses to copy.

Finding 2: ``copy --force`` of a version cleared the files of a copy of the same version that was
still running; that copy then published a commit record over missing files, reported success and
recorded a verified copy in the source (which ``gc --require-copy`` trusts). A copy now checks
every copied file's size right before creating the destination's record (R-COMMIT-4 item 5) and
once more before writing its copy record; ``partial_grace_s`` is checked like gc's grace.

Finding 10: a destination that is the source root under another name (a symlink) or lies inside
the source root was accepted, and a copy record of the version "to itself" was written.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import ChecksumError, FileMissingError, FileSizeError, UsageError
from portable_ckpt.io.checksum import crc32c
from portable_ckpt.io.copy import copy_version
from portable_ckpt.io.gc import gc
from portable_ckpt.io.versions import list_versions
from portable_ckpt.storage import LocalStorage, Storage, open_storage
from portable_ckpt.storage.base import Capabilities, StreamWriter
from portable_ckpt.storage.faults import Fault, FaultyStorage


def _save(root: Path, step: int) -> str:
    m = portable_ckpt.save_arrays(root, {"w": np.arange(4096, dtype=np.float32) + step}, step=step)
    return m.attempt_id


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "portable_ckpt.cli.main", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd,
    )


class _HookedStorage(FaultyStorage):
    """Runs ``hook()`` once, after the copy made its files durable (right before it publishes)."""

    def __init__(self, inner: Storage, hook: object) -> None:
        super().__init__(inner)
        self.hook = hook

    def sync(self) -> None:
        super().sync()
        hook, self.hook = self.hook, None
        if callable(hook):
            hook()


def _forced_copy_that_fails(src: Path, dst: Path) -> None:
    """Copy B of the same version with --force: clears A's files, then fails (a full disk)."""
    b_dst = FaultyStorage(open_storage(dst), [Fault(op="open", path="*", error="ENOSPC")])
    with pytest.raises(portable_ckpt.CheckpointError):
        copy_version(str(src), b_dst, force=True)


def test_a_copy_does_not_publish_files_a_forced_copy_removed(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    _save(src, 1)
    aid = _save(src, 2)
    dst.mkdir()
    a_dst = _HookedStorage(open_storage(dst), lambda: _forced_copy_that_fails(src, dst))
    with pytest.raises(FileMissingError, match="before the commit record was created"):
        copy_version(str(src), a_dst)
    assert not (dst / aid / "manifest.json").exists()  # nothing published
    assert list_versions(dst) == [] or all(v.status != "committed" for v in list_versions(dst))
    assert [v.copies for v in list_versions(src)] == [[], []]  # no copy record vouches for it
    # A copy run again (its leftovers cleared) publishes a version that verifies.
    res = copy_version(str(src), str(dst), force=True)
    assert res.record is not None
    assert portable_ckpt.open(dst).verify(deep=True) == []


def test_no_copy_record_when_the_files_vanish_as_the_record_is_created(tmp_path: Path) -> None:
    """The reviewer's interleaving: B clears A's files while A creates ``manifest.json``."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    old = _save(src, 1)
    aid = _save(src, 2)
    dst.mkdir()
    a_dst = FaultyStorage(open_storage(dst), [Fault(
        op="create", path="*/manifest.json", error=None, times=1,
        callback=lambda op, path: _forced_copy_that_fails(src, dst),
    )])
    with pytest.raises(FileMissingError, match="no copy record was written"):
        copy_version(str(src), a_dst)
    assert [v.copies for v in list_versions(src)] == [[], []]
    # So gc --require-copy finds no copy and keeps the older source version.
    report = gc(src, keep=1, grace_seconds=0, require_copy=True)
    assert report.deleted == [] and report.kept_for_copy == [old]
    assert (dst / aid / "manifest.json").exists()  # published, damaged: named in the error


def _grow(path: Path) -> None:
    with open(path, "ab") as f:
        f.write(b"\0" * 8)


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_copied_file_another_program_changed_is_not_vouched_for(
    tmp_path: Path, when: str
) -> None:
    """Finding 2's size half: a copied file that another program made longer after the copy
    wrote it (before the destination's commit record is created, or as it is created) is
    PCK-FILE-SIZE naming the file and the moment: before, nothing is published; after, the
    damaged version is named and no copy record vouches for it. Test audit 21b, CP04: only
    files gone were tested, and the size comparison of ``_check_copied`` could go."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    aid = _save(src, 1)
    dst.mkdir()
    [shard] = portable_ckpt.open(src).manifest.files  # the one data shard
    assert shard.startswith("data/")
    grow = lambda *_: _grow(dst / aid / shard)  # noqa: E731
    a_dst: Storage = (_HookedStorage(open_storage(dst), grow) if when == "before" else
                      FaultyStorage(open_storage(dst), [Fault(
                          op="create", path="*/manifest.json", error=None, times=1,
                          callback=grow)]))
    moment = ("before the commit record was created" if when == "before" else
              "just after the commit record was created")
    with pytest.raises(FileSizeError, match=f"{aid}/{shard} was copied and holds "
                       f"\\d+ bytes {moment}"):
        copy_version(str(src), a_dst)
    assert (dst / aid / "manifest.json").exists() == (when == "after")
    assert [v.copies for v in list_versions(src)] == [[]]


class _ChecksummingStore(LocalStorage):
    """A local store that, like S3 with checksums on, checks uploads and reports each object's
    whole CRC32C as stored; it flips one bit of the first bytes written to ``data/`` files
    (damage on the way in, which the copy's reads of the source cannot see)."""

    capabilities = Capabilities(atomic_create=True, ranged_read=True, durable_fsync=True,
                                local_path=True, native_crc32c=True)

    def __init__(self, root: Path, *, damage: bool) -> None:
        super().__init__(root, create=True)
        self.damage = damage

    def validates_checksums(self) -> bool:
        return True

    def checksum_crc32c(self, path: str) -> int | None:
        return crc32c(Path(self.root, path).read_bytes())

    def open_writer(self, path: str, *, defer_sync: bool = False) -> StreamWriter:
        inner = super().open_writer(path, defer_sync=defer_sync)
        return _FlipFirstBit(inner) if self.damage and "/data/" in path else inner


class _FlipFirstBit(StreamWriter):
    def __init__(self, inner: StreamWriter) -> None:
        self.inner, self.first = inner, True

    def write(self, data: memoryview | bytes) -> None:
        raw = bytes(data)
        if self.first and raw:
            raw, self.first = bytes([raw[0] ^ 1]) + raw[1:], False
        self.inner.write(raw)

    def close(self) -> None:
        self.inner.close()

    def abort(self) -> None:
        self.inner.abort()


def test_a_store_checksum_that_disagrees_with_the_verified_bytes_fails_the_copy(
    tmp_path: Path,
) -> None:
    """Where the store checks uploads, its whole-object CRC32C is compared with that of the
    verified source bytes: an object stored otherwise than sent is PCK-CHECKSUM naming both
    values, and nothing is published; an honest store's checksums are counted. Test audit 21b,
    CP06: moto does not check uploads, so the comparison was never reached and could go (a
    damaged copy published and vouched for)."""
    src = tmp_path / "src"
    aid = _save(src, 1)
    files = len(portable_ckpt.open(src).manifest.files)
    with pytest.raises(ChecksumError, match=r"the store reports CRC32C [0-9a-f]{8}, the verified "
                       r"source bytes have [0-9a-f]{8}"):
        copy_version(str(src), _ChecksummingStore(tmp_path / "bad", damage=True))
    assert not (tmp_path / "bad" / aid / "manifest.json").exists()
    assert [v.copies for v in list_versions(src)] == [[]]
    res = copy_version(str(src), _ChecksummingStore(tmp_path / "good", damage=False))
    assert res.server_checksums == files and res.record is not None
    assert portable_ckpt.open(tmp_path / "good").verify(deep=True) == []


@pytest.mark.parametrize("grace", [float("nan"), -1.0, float("inf"), True, "300"])
def test_partial_grace_must_be_finite_and_non_negative(tmp_path: Path, grace: object) -> None:
    _save(tmp_path / "src", 1)
    dst = tmp_path / "dst"
    with pytest.raises(UsageError, match="partial_grace_s"):
        copy_version(str(tmp_path / "src"), str(dst), partial_grace_s=grace)  # type: ignore[arg-type]
    assert not dst.exists()


def test_copy_to_a_symlink_of_the_source_root_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _save(src, 1)
    os.symlink("src", tmp_path / "alias")
    before = _tree(src)
    p = _cli("copy", str(src), str(tmp_path / "alias"))
    assert p.returncode == 2, p.stdout + p.stderr
    assert "PCK-USAGE" in p.stderr and "same root" in p.stderr
    assert _tree(src) == before  # no copy record "to itself"
    # A symlinked parent, and a Storage given directly, are caught too.
    os.symlink(".", tmp_path / "here")
    with pytest.raises(UsageError, match="same root"):
        copy_version(str(src), str(tmp_path / "here" / "src"))
    with pytest.raises(UsageError, match="same root"):
        copy_version(str(src), open_storage(tmp_path / "alias"))
    assert _tree(src) == before


def test_copy_into_the_source_root_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    aid = _save(src, 1)
    before = _tree(src)
    for dst in (src / aid, src / "backup", src / "backup" / "deeper"):
        p = _cli("copy", str(src), str(dst))
        assert p.returncode == 2, p.stdout + p.stderr
        # a version directory is no destination root at all (said before the source is read)
        want = "is a version directory" if dst == src / aid else "inside the source root"
        assert want in p.stderr
    os.symlink("src/backup", tmp_path / "into")  # dangling until created: resolved anyway
    with pytest.raises(UsageError, match="inside the source root"):
        copy_version(str(src), str(tmp_path / "into"))
    assert _tree(src) == before  # nothing created, no copy record
    # A sibling whose name merely starts like the source's is another root.
    assert copy_version(str(src), str(tmp_path / "src-backup")).record is not None


def test_a_copy_that_may_be_in_progress_is_a_conflict_not_a_usage_error(tmp_path: Path) -> None:
    """After a killed copy, retries were refused for the grace period as PCK-USAGE (exit 2,
    "wrong arguments"), which automation cannot tell from a real usage error (SRE review F3).
    It is PCK-COMMIT-CONFLICT (exit 75, EX_TEMPFAIL: scripting review F6), naming when to
    retry; a quiet leftover is replaced."""
    from portable_ckpt.cli.main import main
    from portable_ckpt.errors import CommitConflictError

    m = portable_ckpt.save_arrays(tmp_path / "src", {"w": np.arange(8.0)}, step=1)
    left = tmp_path / "dst" / m.attempt_id / "data"
    left.mkdir(parents=True)
    (left / "w00000-0000.safetensors").write_bytes(b"half a copy")  # a copy killed just now
    src = str(tmp_path / "src" / m.attempt_id)
    with pytest.raises(CommitConflictError, match=r"retry in \d+s"):
        copy_version(src, str(tmp_path / "dst"))
    assert main(["copy", src, str(tmp_path / "dst")]) == 75
    # A destination whose clock runs ahead said "written -97132927s ago ... retry in 97133227s"
    # (attack review F3): a time in the future is named as such.
    future = time.time() + 3600
    os.utime(left / "w00000-0000.safetensors", (future, future))
    with pytest.raises(CommitConflictError, match=r"36\d\ds ahead of this machine's clock") as ei:
        copy_version(src, str(tmp_path / "dst"))
    assert "retry in" not in str(ei.value) and "-" not in str(ei.value).split("ahead")[0][-12:]
    copy_version(src, str(tmp_path / "dst"), partial_grace_s=0)  # no copy runs: replaced
    assert portable_ckpt.open(tmp_path / "dst").verify(deep=True) == []


def test_a_file_the_other_copy_made_and_removed_again_is_a_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race of the test below, made certain: this copy's exclusive create meets the other
    copy's file, and that copy (failing too) has removed it again before this one looks: the
    FileExistsError says "another copy", not a storage fault (a full run, session 26)."""
    from portable_ckpt.errors import CommitConflictError
    from portable_ckpt.storage.local import LocalStorage

    portable_ckpt.save_arrays(tmp_path / "src", {"a": np.arange(8.0)}, step=1)
    real_open = LocalStorage.open_writer

    def other_copy_was_here(self: Any, path: str, **k: Any) -> Any:
        if path.endswith(".safetensors"):
            full = os.path.join(self.root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            open(full, "wb").close()  # the other copy's file ...
            try:
                return real_open(self, path, **k)
            finally:
                os.remove(full)  # ... which it removes again, failing
        return real_open(self, path, **k)

    monkeypatch.setattr(LocalStorage, "open_writer", other_copy_was_here)
    with pytest.raises(CommitConflictError, match="another copy"):
        copy_version(str(tmp_path / "src"), str(tmp_path / "dst"))


def test_two_copies_started_together_are_conflicts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two copies into one root that both passed the leftovers check failed with PCK-STORAGE
    "file already exists" (attack review F7): a file that appears while a copy runs is
    PCK-COMMIT-CONFLICT, and --force copies again."""
    import threading

    import portable_ckpt.io.copy as copy_module
    from portable_ckpt.errors import CheckpointError

    portable_ckpt.save_arrays(tmp_path / "src", {"a": np.arange(1 << 16, dtype=np.float64)},
                              step=1, entries={f"e{i}": {"v": i} for i in range(4)})
    barrier = threading.Barrier(2)
    clear = copy_module._clear_partial

    def both_checked(*a: Any, **k: Any) -> None:
        clear(*a, **k)
        barrier.wait(30)  # both copies have seen no leftovers before either writes

    monkeypatch.setattr(copy_module, "_clear_partial", both_checked)
    codes: list[str] = []

    def run() -> None:
        try:
            copy_version(str(tmp_path / "src"), str(tmp_path / "dst"))
            codes.append("ok")
        except CheckpointError as e:
            codes.append(e.code)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert "PCK-COMMIT-CONFLICT" in codes and set(codes) <= {"ok", "PCK-COMMIT-CONFLICT"}, codes
    monkeypatch.setattr(copy_module, "_clear_partial", clear)
    if "ok" not in codes:
        copy_version(str(tmp_path / "src"), str(tmp_path / "dst"), force=True)
    assert portable_ckpt.open(tmp_path / "dst").verify(deep=True) == []


def test_a_destination_file_grown_since_the_copy_is_not_vouched_for(tmp_path: Path) -> None:
    """mutation audit 22 A-40: a destination that already holds the version is checked file by
    file before copy vouches for it: a data file there with one byte appended (its recorded
    bytes all verify) is PCK-FILE-SIZE naming the destination, and no copy record is written."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    attempt = _save(src, 1)
    first = copy_version(src / attempt, dst)
    assert not first.already_present and first.record is not None
    copies = _tree(src / attempt / "copies")
    [data] = (dst / attempt / "data").iterdir()
    with open(data, "ab") as f:
        f.write(b"\0")
    with pytest.raises(FileSizeError) as ei:
        copy_version(src / attempt, dst)
    assert str(dst) in ei.value.message and "damaged" in ei.value.message
    assert _tree(src / attempt / "copies") == copies  # no copy record for a damaged copy


def test_a_store_reporting_another_size_after_the_upload_fails_the_copy(tmp_path: Path) -> None:
    """mutation audit 22 A-35: after writing a file, copy asks the destination its size: a
    store that reports another size than the manifest's (once: a truncating or extending store)
    fails the copy with PCK-FILE-SIZE naming the file, and no commit record is published."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    attempt = _save(src, 1)
    storage = open_storage(dst, create=True)
    real_size = storage.size
    told: list[str] = []

    def size(path: str) -> int:
        n = real_size(path)
        if "/data/" in path and not told:  # the first answer about the data file: one short
            told.append(path)
            return n - 1
        return n

    storage.size = size  # type: ignore[method-assign]
    with pytest.raises(FileSizeError, match=r"destination holds .* bytes after the copy") as ei:
        copy_version(src / attempt, storage)
    assert len(told) == 1 and told[0] in ei.value.message
    assert not (dst / attempt / "manifest.json").exists()
    assert not (src / attempt / "copies").exists() or _tree(src / attempt / "copies") == []


def test_a_copy_that_fails_removes_its_files_and_its_retry_need_not_wait(tmp_path: Path) -> None:
    """On-call review 23, F5: a copy cut short by a full disk left its files there (using the
    space it needed), and its retry was refused for 300 s as "another copy may be in progress"
    although they were its own. It removes what it wrote; the retry runs at once."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    aid = portable_ckpt.save_arrays(src, {"w": np.arange(4096, dtype=np.float32)}, step=1,
                                    entries={"note": {"lr": 0.1}}).attempt_id
    dst.mkdir()
    *first, last = portable_ckpt.open(src).manifest.files  # the disk fills at the last file
    assert first, last
    full = FaultyStorage(open_storage(dst), [Fault(op="write", path=f"*/{last}", error="ENOSPC")])
    with pytest.raises(portable_ckpt.CheckpointError, match="No space left"):
        copy_version(str(src), full, jobs=1)
    assert [p for p in _tree(dst) if (dst / p).is_file()] == []  # nothing of it left
    res = copy_version(str(src), str(dst))  # no --force, no wait
    assert res.record is not None and (dst / aid / "manifest.json").exists()
    assert portable_ckpt.open(dst).verify(deep=True) == []


def test_copy_of_a_root_copies_the_version_a_restore_takes(tmp_path: Path) -> None:
    """Review of stop 23, E1: `copy ROOT DEST` (the backup cron operations.md gives) copied the
    greatest committed version also when a verification of it had failed, which the copy then
    refused as damaged every night. It copies what a restore takes, as `ls --latest` names it."""
    from tests.rules.test_r_drill_10 import _failed_record

    src, dst = tmp_path / "src", tmp_path / "dst"
    one = _save(src, 1)
    two = _save(src, 2)
    _failed_record(src / two, "v20260101T000000000000Z-00000001")
    res = copy_version(str(src), str(dst))
    assert res.attempt_id == one and (dst / one / "manifest.json").exists()
    assert not (dst / two).exists()
    _failed_record(src / one, "v20260101T000000000000Z-00000002")
    with pytest.raises(portable_ckpt.CheckpointError, match="no version a restore takes") as ei:
        copy_version(str(src), str(tmp_path / "dst2"))
    assert ei.value.code == "PCK-NOT-FOUND" and "copy one explicitly as ROOT/ID" in str(ei.value)
    assert copy_version(str(src / two), str(tmp_path / "dst3"), force=True).attempt_id == two
