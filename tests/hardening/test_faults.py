"""Storage faults (fault-injecting wrapper and a real size-limited tmpfs).

Invariant: nothing is published, earlier versions are untouched and still restore, and the error
is a PCK-STORAGE error naming the operation and the file.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import CheckpointError, StorageError
from portable_ckpt.io.commit import commit
from portable_ckpt.io.reader import Checkpoint
from portable_ckpt.io.versions import latest, list_versions
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage, parse_faults
from tests.hardening._util import check_restores, make_version, write_share


def _snapshot(root: Path) -> dict[str, tuple[int, float]]:
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            st = os.stat(os.path.join(d, f))
            out[os.path.relpath(os.path.join(d, f), root)] = (st.st_size, st.st_mtime)
    return out


def _assert_nothing_published(root: Path, prev: str, before: dict[str, tuple[int, float]]) -> None:
    committed = [v.id for v in list_versions(str(root)) if v.status == "committed"]
    assert committed == [prev], committed
    after = _snapshot(root)
    for rel, meta in before.items():
        assert after.get(rel) == meta, f"{rel} of the earlier version changed"
    check_restores(open_storage(str(root)), prev)


def _save(storage: FaultyStorage, step: int) -> None:
    a = new_attempt_id(step)
    idx = [write_share(storage, a, step, w, 2) for w in range(2)]
    commit(storage, a, step=step, indexes=idx, expected_writers=[0, 1],
           continuation=portable_ckpt.Continuation("exact", 2, None))


@pytest.mark.parametrize(
    ("fault", "op", "pattern"),
    [
        (Fault(op="write", path="*/data/*", error="ENOSPC", after_bytes=3000), "write", "/data/"),
        (Fault(op="write", path="*/index/*", error="ENOSPC"), "write", "/index/"),
        (Fault(op="write", path="*/data/*", error="EIO", after_ops=2), "write", "/data/"),
        (Fault(op="fsync", path="*/data/*", error="EIO"), "fsync", "/data/"),
        (Fault(op="open", path="*/entries/*", error="EDQUOT"), "open", "/entries/"),
        (Fault(op="create", path="*/manifest.json", error="ENOSPC"), "create", "manifest.json"),
        (Fault(op="read", path="*/data/*", error="EIO"), "read", "/data/"),  # committer's header check
        (Fault(op="size", path="*/data/*", error="EIO"), "size", "/data/"),
    ],
    ids=["enospc-mid-data", "enospc-index", "eio-write", "fsync-data", "edquot-open", "enospc-commit-record",
         "eio-read-at-commit", "eio-stat-at-commit"],
)
def test_save_fault_publishes_nothing(tmp_path: Path, fault: Fault, op: str, pattern: str) -> None:
    root = tmp_path / "root"
    prev = make_version(str(root), 1)
    before = _snapshot(root)
    storage = FaultyStorage(open_storage(str(root)), [fault])
    with pytest.raises(StorageError) as info:
        _save(storage, 2)
    msg = str(info.value)
    assert info.value.code == "PCK-STORAGE"
    assert msg.split("] ", 1)[1].startswith(op), msg  # names the operation...
    assert pattern in msg and "s000000000002-" in msg, msg  # ...and the file
    assert fault.fired >= 1
    _assert_nothing_published(root, prev, before)


def test_eio_on_read_names_file(tmp_path: Path) -> None:
    root = tmp_path / "root"
    a = make_version(str(root), 1)
    storage = FaultyStorage(open_storage(str(root)), [Fault(op="read", path="*/data/w00001-*", error="EIO")])
    att, man = latest(storage)
    ck = Checkpoint(storage, att, man)
    with pytest.raises(StorageError, match=r"read '.*data/w00001-0000.safetensors'.*Input/output error"):
        ck.read("model.w")
    errs = ck.verify(deep=True)
    assert errs and all(e.code == "PCK-STORAGE" for e in errs)
    check_restores(open_storage(str(root)), a)  # the fault was in the wrapper, the version is fine


def test_transient_read_fault_then_success(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_version(str(root), 1)
    f = Fault(op="read", path="*.safetensors", error="EIO", times=1)
    storage = FaultyStorage(open_storage(str(root)), [f])
    att, man = latest(storage)
    ck = Checkpoint(storage, att, man)
    with pytest.raises(StorageError):
        ck.read("model.w")
    assert ck.read("model.w").shape == (64, 48)  # the next attempt succeeds: no poisoned cache


def test_slow_io_still_correct(tmp_path: Path) -> None:
    root = tmp_path / "root"
    storage = FaultyStorage(open_storage(str(root), create=True), [Fault(op="*", error=None, delay=0.002)])
    t0 = time.perf_counter()
    _save(storage, 3)
    assert time.perf_counter() - t0 > 0.002 * len(storage.ops) * 0.9
    check_restores(open_storage(str(root)), latest(open_storage(str(root)))[0])


def test_abort_removes_partial_files(tmp_path: Path) -> None:
    root = tmp_path / "root"
    storage = FaultyStorage(open_storage(str(root), create=True),
                            [Fault(op="write", path="*/data/w00000-0001*", error="ENOSPC")])
    a = new_attempt_id(4)
    with pytest.raises(StorageError):
        write_share(storage, a, 4, 0, 2)
    left = [p for p in _snapshot(root) if p.startswith(a)]
    assert left == [], left


def test_parse_faults() -> None:
    fs = parse_faults("write:*/data/*:ENOSPC:after_bytes=4096;read:*:EIO:times=1;*:*:none:delay=0.01")
    assert [f.op for f in fs] == ["write", "read", "*"]
    assert fs[0].after_bytes == 4096 and fs[1].times == 1 and fs[2].error == "none" and fs[2].delay == 0.01
    with pytest.raises(CheckpointError):
        parse_faults("bogus:*:EIO")


# -- a real size-limited filesystem --------------------------------------------------------------
@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs here ({r.stderr.strip() or 'mount failed'}); "
                    "the fault wrapper covers ENOSPC instead")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_real_enospc_during_finish(tmpfs: Path) -> None:
    root = tmpfs / "root"
    prev = make_version(str(root), 1)
    before = _snapshot(root)
    big = np.ones((2 << 20) // 4, dtype=np.float32)  # 2 MiB > the 1 MiB filesystem
    with pytest.raises(StorageError) as info:
        portable_ckpt.save_arrays(str(root), {"big": big}, step=2)
    assert "No space left on device" in str(info.value) and "data/w00000-0000.safetensors" in str(info.value)
    _assert_nothing_published(root, prev, before)


def _enospc_commit_record(tmpfs: Path) -> Path:
    root = tmpfs / "root"
    prev = make_version(str(root), 1)
    storage = open_storage(str(root))
    a = new_attempt_id(2)
    w = ShardWriter(storage, a, 0, write_index=False)
    w.add_tensor("x", np.arange(1000, dtype=np.float32))
    idx = w.finish()
    before = _snapshot(root)
    fd = os.open(tmpfs / "filler", os.O_WRONLY | os.O_CREAT)  # fill the disk to the last byte
    try:
        for chunk in (65536, 4096, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError:
                pass
    finally:
        os.close(fd)
    with pytest.raises(StorageError) as info:
        commit(storage, a, step=2, indexes=[idx], expected_writers=[0])
    assert str(info.value).split("] ", 1)[1].startswith("create") and "manifest.json" in str(info.value)
    os.unlink(tmpfs / "filler")
    _assert_nothing_published(root, prev, {k: v for k, v in before.items() if not k.startswith(a)})
    return root


def test_real_enospc_during_commit_record(tmpfs: Path) -> None:
    _enospc_commit_record(tmpfs)


def test_real_enospc_commit_record_leaves_no_temp(tmpfs: Path) -> None:
    root = _enospc_commit_record(tmpfs)
    assert not any(p.endswith(".tmp") for p in _snapshot(root)), "temporary commit record left behind"


@pytest.mark.parametrize("probe", ["readable", "unreadable"])
def test_a_lost_answer_to_the_commit_record_create_loses_nothing(tmp_path: Path, probe: str) -> None:
    """R-COMMIT-19: a backend that reports a create whose answer was lost as a plain storage
    error (as "any other failure" reads in the backend guide) made the save fail and its data
    files go, while the record was there: a committed version without data, and gc then
    deleted the one before (extension review F1). The committer looks the record up: our bytes
    there are a success; a record it cannot look up leaves the outcome unknown, files kept."""
    from portable_ckpt.errors import CommitOutcomeUnknownError

    root = tmp_path / "root"
    make_version(str(root), 1)
    faults = [Fault(op="create", path="*/manifest.json", error="ETIMEDOUT", lost_answer=True)]
    if probe == "unreadable":
        faults.append(Fault(op=("exists", "read"), path="*/manifest.json", error="EIO"))
    storage = FaultyStorage(open_storage(str(root)), faults)
    if probe == "readable":
        _save(storage, 2)  # the answer was lost, the create took effect: committed
    else:
        with pytest.raises(CommitOutcomeUnknownError, match="may be committed"):
            _save(storage, 2)
    assert faults[0].fired == 1
    newest = max(list_versions(str(root)), key=lambda v: v.step)
    assert newest.step == 2 and newest.status == "committed"
    ck = portable_ckpt.open(root)
    assert ck.verify(deep=True) == []  # every data file is still there


def test_lost_answer_is_for_creates_only() -> None:
    with pytest.raises(portable_ckpt.errors.UsageError, match="create"):
        Fault(op="write", lost_answer=True)


def test_a_failed_deferred_fsync_fails_sync_and_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mutation audit 22 A-94: an fsync deferred by ``close`` (``defer_sync=True``, data files)
    that fails (EIO) makes ``LocalStorage.sync`` raise PCK-STORAGE, and a save through it
    publishes no record: a commit never proceeds over data whose durability failed
    (R-COMMIT-17)."""
    import errno

    from portable_ckpt.storage import local

    real = local._fsync_close
    failed: list[str] = []

    def fsync_close(fd: int, rel: str, full: str) -> None:  # the real close, fsync says EIO
        if "/data/" not in rel:
            return real(fd, rel, full)
        failed.append(rel)
        os.close(fd)
        raise local._os_error("fsync", rel, OSError(errno.EIO, os.strerror(errno.EIO)), full)

    root = tmp_path / "root"
    prev = make_version(str(root), 1)
    monkeypatch.setattr(local, "_fsync_close", fsync_close)
    st = open_storage(str(root))
    assert isinstance(st, local.LocalStorage)
    with st.open_writer("scratch/data/x", defer_sync=True) as w:
        w.write(b"abc")
    with pytest.raises(StorageError) as info:
        st.sync()
    assert info.value.code == "PCK-STORAGE" and "fsync" in str(info.value), info.value
    assert failed == ["scratch/data/x"]
    st.sync()  # reported once
    st.delete("scratch/data/x")
    st.remove_empty_dirs("scratch")
    before = _snapshot(root)
    with pytest.raises(StorageError) as info:
        _save(st, 2)  # type: ignore[arg-type]
    assert info.value.code == "PCK-STORAGE" and "fsync" in str(info.value), info.value
    assert not list(root.glob("s000000000002-*/manifest.json"))
    _assert_nothing_published(root, prev, before)


def test_a_put_whose_fsync_fails_leaves_no_file(tmp_path: Path) -> None:
    """A writer used as a context manager whose close fails (here an fsync error) is aborted:
    nothing stays under its name that a later look could take for the file (the close's error
    reaches the caller unchanged)."""
    storage = FaultyStorage(open_storage(str(tmp_path / "root")),
                            [Fault(op="fsync", path="a/data/*", error="EIO", times=1)])
    with pytest.raises(StorageError, match="fsync") as info:
        storage.put("a/data/f", b"x" * 100)
    assert info.value.code == "PCK-STORAGE"
    assert not (tmp_path / "root" / "a" / "data" / "f").exists()
    storage.put("a/data/g", b"y")  # the fault fired once: the next put works
    assert (tmp_path / "root" / "a" / "data" / "g").read_bytes() == b"y"


def test_the_module_docstring_faults_fire(tmp_path: Path) -> None:
    """DCP integrator review 23, 11: the docstring's example "fsync fails on commit" matched no
    call (the commit record is made by ``create``, which syncs itself): a test copied from it
    tested nothing. The example's faults on commit records and indexes fire on a save (the
    others need a larger save or a read)."""
    import re

    from portable_ckpt.storage import faults

    examples = re.findall(r"^        (Fault\(.*\)),  #", str(faults.__doc__), re.M)
    commit = [t for t in examples if "manifest.json" in t or "index" in t]
    assert len(examples) == 5 and len(commit) == 2, examples
    for text in commit:
        fault = eval(text, {"Fault": Fault})  # the docstring's own text
        root = tmp_path / str(len(list(tmp_path.iterdir())))
        storage = FaultyStorage(open_storage(str(root), create=True), [fault])
        try:
            _save(storage, 1)
            check_restores(open_storage(str(root)), list_versions(str(root))[0].id)
        except StorageError:
            pass
        assert fault.fired >= 1, text


def test_the_callers_error_stands_when_the_abort_fails_too(tmp_path: Path) -> None:
    """Review of stop 23, E6 and maintainer review 10: an abort that fails (an S3 delete that
    did not answer) replaced the error that made the writer abort, in the body of a `with` and
    after a failed close."""
    from portable_ckpt.storage.base import StreamWriter

    class Failing(StreamWriter):
        def __init__(self, close_fails: bool) -> None:
            self.close_fails = close_fails

        def write(self, data: memoryview | bytes) -> None:
            pass

        def close(self) -> None:
            if self.close_fails:
                raise StorageError("close: the upload failed", path="f")

        def abort(self) -> None:
            raise StorageError("abort: the delete did not answer", path="f")

    with pytest.raises(RuntimeError, match="the body's own"):
        with Failing(close_fails=False):
            raise RuntimeError("the body's own error")
    with pytest.raises(StorageError, match="close: the upload failed"):
        with Failing(close_fails=True) as w:
            w.write(b"x")


def _backend_exceptions() -> list[BaseException]:
    return [KeyboardInterrupt(), RuntimeError("client: read timeout after the request was sent"),
            ConnectionResetError(104, "connection reset")]


@pytest.mark.parametrize("raises", _backend_exceptions(), ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("api", ["save_arrays", "writers", "dcp", "convert"])
def test_an_interrupt_or_a_backend_exception_after_the_record_took_effect_loses_nothing(
    tmp_path: Path, api: str, raises: BaseException
) -> None:
    """R-COMMIT-19 (backend review 27, H1): a Ctrl-C between the commit record's create and its
    answer, or a backend's own exception after its request went (an SDK's timeout), reached
    the save's clean-up, which deleted the data of what was now the latest version: its
    record alone was left. The committer looks the record up after any exception of the
    backend (ours there: committed), and a failed save removes nothing of an attempt that holds
    a commit record. The interrupt still stops the save."""
    import torch
    import torch.distributed.checkpoint as dcp

    from portable_ckpt.torch.dcp import PortableStorageWriter

    root = tmp_path / "root"
    make_version(str(root), 1)
    fault = Fault(op="create", path="*/manifest.json", lost_answer=True, raises=raises)
    storage = FaultyStorage(open_storage(str(root)), [fault])

    def save() -> None:
        if api == "save_arrays":
            portable_ckpt.save_arrays(storage, {"w": np.ones((4, 4))}, step=2)
        elif api == "writers":
            _save(storage, 2)
        elif api == "dcp":
            dcp.save({"w": torch.ones(8, 8)}, storage_writer=PortableStorageWriter(storage, step=2))
        else:  # convert takes a root's text: the faulty store by a scheme of its own
            from portable_ckpt.convert import convert
            from portable_ckpt.storage import register_scheme

            torch.save({"w": torch.ones(8, 8)}, tmp_path / "src.pt")
            scheme = f"lost{os.getpid()}{type(raises).__name__.lower()}"
            register_scheme(scheme, lambda url: storage)
            convert(str(tmp_path / "src.pt"), f"{scheme}://{root}", step=2)

    if isinstance(raises, KeyboardInterrupt):
        with pytest.raises(BaseException) as info:  # dcp wraps it in its CheckpointException
            save()
        assert "KeyboardInterrupt" in repr(info.value) or isinstance(info.value, KeyboardInterrupt)
    else:
        save()  # the record is ours: committed
    assert fault.fired == 1
    newest = max(list_versions(str(root)), key=lambda v: v.step)
    assert newest.step == 2 and newest.status == "committed"
    ck = portable_ckpt.open(root)
    assert ck.step == 2 and ck.verify(deep=True) == []  # every data file is still there


def test_a_failed_save_keeps_the_files_of_an_attempt_whose_record_cannot_be_looked_for(
    tmp_path: Path,
) -> None:
    """Could not read is never abandoned: a writer aborted while the attempt's commit record
    cannot be looked for (EIO) keeps its files, with a WARNING; gc removes them once the
    attempt is known abandoned. Where the record is known absent, its files go as before."""
    root = tmp_path / "root"
    make_version(str(root), 1)
    for unreadable in (True, False):
        faults = [Fault(op="exists", path="*/manifest.json", error="EIO")] if unreadable else []
        storage = FaultyStorage(open_storage(str(root)), faults)
        a = new_attempt_id(2)
        w = ShardWriter(storage, a, 0)
        w.add_tensor("w", np.ones((4, 4)))
        w.finish()
        w.abort()
        left = sorted(p.name for p in (root / a).rglob("*") if p.is_file())
        assert left == (["w00000-0000.safetensors", "w00000.json"] if unreadable else []), left


def test_an_abandoned_attempt_on_a_read_only_root_is_not_deleted_and_not_said_to_be(
    tmp_path: Path,
) -> None:
    """Fault review 27, F5: on a read-only root gc said "deleted ... (abandoned attempt)" and
    "is deleted (its commit record is gone), but files of it are left" for an attempt that
    never had a record and kept every file. Now: not deleted, named with its error."""
    from portable_ckpt.io.gc import gc

    root = tmp_path / "root"
    make_version(str(root), 1)
    storage = open_storage(str(root))
    old = time.time() - 7200
    a = f"s000000000002-{time.strftime('%Y%m%dT%H%M%S', time.gmtime(old))}000000Z-00000000000000bb"
    w = ShardWriter(storage, a, 0)
    w.add_tensor("w", np.ones((4, 4)))
    w.finish()  # no commit: an abandoned save, two hours old
    for p in [*(root / a).rglob("*"), root / a]:
        os.utime(p, (old, old))
    before = _snapshot(root)
    # A read-only file system: removing what is not there is no error, the rest is EROFS.
    faulty = FaultyStorage(storage, [Fault(op="delete", path=f"{a}/{d}/*", error="EROFS")
                                     for d in ("data", "index")])
    report = gc(faulty, keep=1, grace_seconds=3600)
    assert a not in report.deleted and a not in report.abandoned and report.left_behind == []
    [skipped] = [u for u in report.unknown if u["id"] == a]
    assert skipped["status"] == "delete failed" and skipped["retryable"] is False
    after = {k: v for k, v in _snapshot(root).items() if ".pck-clock-" not in k}  # (its probe)
    assert after == before


def test_a_backend_exception_with_no_record_after_it_removes_nothing(tmp_path: Path) -> None:
    """Re-attack 27, 3: a backend's own exception from the commit record's create (a client's
    timeout while its request is still in flight), the record not there when looked for: the
    save removed its data, then the request landed, and the latest version had no files. The
    outcome is unknown (``CommitOutcomeUnknownError``): nothing of the attempt is removed.
    A ``StorageError`` keeps its documented meaning (not created)."""
    from portable_ckpt.errors import CommitOutcomeUnknownError

    root = tmp_path / "root"
    make_version(str(root), 1)
    fault = Fault(op="create", path="*/manifest.json",
                  raises=TimeoutError("read timed out; the request was sent"))
    storage = FaultyStorage(open_storage(str(root)), [fault])
    with pytest.raises(CommitOutcomeUnknownError, match="still in flight") as info:
        portable_ckpt.save_arrays(storage, {"w": np.ones((4, 4))}, step=2)
    assert isinstance(info.value.__cause__, TimeoutError)
    [attempt] = [p for p in root.iterdir() if p.name.startswith("s000000000002-")]
    assert sorted(p.name for p in attempt.rglob("*") if p.is_file()) == [
        "w00000-0000.safetensors"]  # its data is kept: the request may still land
    storage.faults[:] = [Fault(op="create", path="*/manifest.json", error="ENOSPC")]
    with pytest.raises(StorageError) as plain:
        portable_ckpt.save_arrays(storage, {"w": np.ones((4, 4))}, step=3)
    assert not isinstance(plain.value, CommitOutcomeUnknownError)
    assert not [p for p in root.iterdir() if p.name.startswith("s000000000003-")
                and any(q.is_file() for q in p.rglob("*"))]
