"""The storage contract (portable_ckpt.testing.storage.StorageTests) on the local backends."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Collection, Iterator
from pathlib import Path

import pytest

from portable_ckpt.errors import (
    FileMissingError,
    FileSizeError,
    LimitError,
    PathUnsafeError,
    StorageError,
)
from portable_ckpt.storage.base import Capabilities, ObjectInfo, Storage, StreamWriter, well_formed
from portable_ckpt.storage.faults import Fault, FaultyStorage
from portable_ckpt.storage.local import LocalStorage
from portable_ckpt.testing.storage import StorageTests, payload


class TestLocalStorage(StorageTests):
    writes_in_place = True  # an attempt's directory is private to its writer

    @pytest.fixture
    def store(self, tmp_path: Path) -> Storage:
        return LocalStorage(tmp_path / "root", create=True)


class TestFaultyStorage(StorageTests):
    """The fault-injecting wrapper passes the contract through (a fault that fires, fails nothing)."""

    writes_in_place = True

    @pytest.fixture
    def store(self, tmp_path: Path) -> FaultyStorage:
        return FaultyStorage(LocalStorage(tmp_path / "root", create=True), [Fault(error=None)])

    def test_injected_failures_are_storage_errors(self, store: FaultyStorage) -> None:
        """Contract: "any other I/O failure" is a StorageError, whatever the operation."""
        store.put("v/obj", payload(100))
        store.faults[:] = [
            Fault(op="read", error="EIO", times=1),
            Fault(op="write", error="ENOSPC"),
        ]
        with pytest.raises(StorageError, match="injected"):
            store.read_range("v/obj", 0, 10)
        assert store.read_range("v/obj", 0, 10) == payload(100)[:10]  # once only
        with pytest.raises(StorageError, match="No space left"):
            store.put("v/full", payload(10))
        assert not store.exists("v/full")


class _MemWriter(StreamWriter):
    def __init__(self, store: _MemStorage, path: str) -> None:
        self.store, self.path, self.buf = store, path, bytearray()

    def write(self, data: memoryview | bytes) -> None:
        self.buf += memoryview(data).cast("B")

    def close(self) -> None:
        self.store.objects[self.path] = (bytes(self.buf), time.time())

    def abort(self) -> None:
        self.buf.clear()


class _MemStorage(Storage):
    """The smallest backend: only the abstract methods, every default of ``Storage`` used.

    The defaults (``read_into_many``, ``read_extents``, ``put``, ``delete_prefix`` ...) run
    against the contract here: no in-tree backend used them (the default ``read_into_many``
    advanced by items, not bytes; extension review F4).
    """

    capabilities = Capabilities(atomic_create=True, ranged_read=True)

    def __init__(self) -> None:
        self.url = "mem://test"
        self.objects: dict[str, tuple[bytes, float]] = {}
        self.lock = threading.Lock()

    def _get(self, path: str) -> bytes:
        if not well_formed(path):
            raise PathUnsafeError(f"path {path!r} leaves the root", path=path)
        if path not in self.objects:
            raise FileMissingError(f"{path!r} does not exist", path=path)
        return self.objects[path][0]

    def read_into(self, path: str, offset: int, buf: memoryview) -> None:
        data, want = self._get(path), memoryview(buf).cast("B")
        if len(want) and offset + len(want) > len(data):  # nothing asked: nothing missing
            raise FileSizeError(f"{path!r} is {len(data)} bytes", path=path)
        want[:] = data[offset : offset + len(want)]

    def read_all(self, path: str, *, max_size: int) -> bytes:
        data = self._get(path)
        if len(data) > max_size:
            raise LimitError(f"{path!r} is above {max_size} bytes", path=path)
        return data

    def size(self, path: str) -> int:
        return len(self._get(path))

    def exists(self, path: str) -> bool:
        self._get(path) if not well_formed(path) else None
        return path in self.objects

    def open_writer(self, path: str, *, defer_sync: bool = False) -> StreamWriter:
        if not well_formed(path):
            raise PathUnsafeError(f"path {path!r} leaves the root", path=path)
        return _MemWriter(self, path)

    def create_if_absent(self, path: str, data: bytes) -> bool:
        if not well_formed(path):
            raise PathUnsafeError(f"path {path!r} leaves the root", path=path)
        with self.lock:
            if path in self.objects:
                return False
            self.objects[path] = (bytes(data), time.time())
            return True

    def _base(self, prefix: str) -> str:
        if prefix and not well_formed(prefix.rstrip("/")):
            raise PathUnsafeError(f"prefix {prefix!r} leaves the root", path=prefix)
        return prefix.rstrip("/") + "/" if prefix else ""

    def list(self, prefix: str = "", *, recursive: bool = True) -> Iterator[ObjectInfo]:
        base = self._base(prefix)
        for path in sorted(self.objects):
            rest = path[len(base):]
            if path.startswith(base) and (recursive or "/" not in rest):
                data, mtime = self.objects[path]
                yield ObjectInfo(path, len(data), mtime)

    def list_dirs(self, prefix: str = "") -> list[str]:
        base = self._base(prefix)
        return sorted({p[len(base):].split("/", 1)[0] for p in self.objects
                       if p.startswith(base) and "/" in p[len(base):]})

    def delete(self, path: str) -> None:
        if not well_formed(path):
            raise PathUnsafeError(f"path {path!r} leaves the root", path=path)
        self.objects.pop(path, None)


class TestMinimalStorage(StorageTests):
    """A backend that implements only what ``Storage`` requires passes with its defaults."""

    @pytest.fixture
    def store(self) -> Storage:
        return _MemStorage()


class _UploadWriter(_MemWriter):
    """A writer that is an unfinished upload from its first write until it closes or aborts."""

    def write(self, data: memoryview | bytes) -> None:
        super().write(data)
        self.store.uploads[self.path] = time.time()  # type: ignore[attr-defined]

    def close(self) -> None:
        super().close()
        self.store.uploads.pop(self.path, None)  # type: ignore[attr-defined]

    def abort(self) -> None:
        super().abort()
        self.store.uploads.pop(self.path, None)  # type: ignore[attr-defined]


class _MemUploads(_MemStorage):
    """An object store in memory whose open writers are uploads, with ``root_exists`` left to
    ``Storage``'s default (which counted objects only: a root whose one save was killed
    mid-upload did not exist for gc, backend review 27, M2)."""

    def __init__(self) -> None:
        super().__init__()
        self.uploads: dict[str, float] = {}

    def open_writer(self, path: str, *, defer_sync: bool = False) -> StreamWriter:
        super().open_writer(path)  # its path checks
        return _UploadWriter(self, path)

    def list_uploads(self, prefix: str = "", *, activity: bool = False) -> list[ObjectInfo]:
        base = self._base(prefix)
        return [ObjectInfo(p, 0, t) for p, t in sorted(self.uploads.items()) if p.startswith(base)]

    def abort_uploads(self, prefix: str = "", *, older_than_s: float = 0.0,
                      only: Collection[str] | None = None) -> int:
        gone = [p for p, _ in self.uploads.items() if p.startswith(self._base(prefix))
                and (only is None or p in only)]
        for p in gone:
            del self.uploads[p]
        return len(gone)


class TestMemUploads(StorageTests):
    """The contract on a backend with unfinished uploads and the defaults of ``Storage``."""

    @pytest.fixture
    def store(self) -> Storage:
        return _MemUploads()


def test_a_backend_instance_is_a_root_for_save_and_open() -> None:
    """docs/storage-backends.md: APIs that take a root take a backend instance as it is;
    ``portable_ckpt.open`` refused one (extension review F5)."""
    import numpy as np

    import portable_ckpt

    store = _MemStorage()
    for step in (1, 2):
        portable_ckpt.save_arrays(store, {"w": np.arange(4.0) * step}, step=step)
    ck = portable_ckpt.open(store)
    assert ck.manifest.step == 2 and ck.read("w").tolist() == [0.0, 2.0, 4.0, 6.0]
    assert portable_ckpt.open(store, step=1).read("w").tolist() == [0.0, 1.0, 2.0, 3.0]
    assert ck.verify(deep=True) == []


def test_an_installed_backend_names_its_roots_by_url_everywhere(tmp_path: Path) -> None:
    """A third-party backend could not be reached from the CLI, be a copy's source or count for
    ``gc --require-copy`` (extension review F6): an installed package registers its scheme
    through the entry-point group ``portable_ckpt.storage``; the CLI then takes its URLs."""
    import subprocess
    import sys

    site = tmp_path / "site"
    (site / "dirstore_pkg-0.1.dist-info").mkdir(parents=True)
    (site / "dirstore_pkg-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: dirstore-pkg\nVersion: 0.1\n")
    (site / "dirstore_pkg-0.1.dist-info" / "entry_points.txt").write_text(
        "[portable_ckpt.storage]\ndirstore = dirstore_pkg:open_url\n")
    (site / "dirstore_pkg.py").write_text(
        "from portable_ckpt.storage.local import LocalStorage\n\n"
        "class DirStore(LocalStorage):\n"
        "    def __init__(self, url):\n"
        "        super().__init__(url[len('dirstore://'):], create=True)\n"
        "        self.url = url\n\n"
        "    def process_spec(self):\n"
        "        return {'kind': 'url', 'url': self.url}\n\n"
        "def open_url(url):\n"
        "    return DirStore(url)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    root = f"dirstore://{tmp_path / 'r'}"

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True,
                              timeout=300)

    saved = run("-c", "import numpy as np, portable_ckpt; print(portable_ckpt.save_arrays("
                f"{root!r}, {{'w': np.arange(5.0)}}, step=3).attempt_id)")
    assert saved.returncode == 0, saved.stderr
    attempt = saved.stdout.strip()
    ls = run("-m", "portable_ckpt", "ls", root)
    assert ls.returncode == 0 and attempt in ls.stdout, ls.stderr
    assert run("-m", "portable_ckpt", "verify", root, "--deep").returncode == 0
    copied = run("-m", "portable_ckpt", "copy", f"{root}/{attempt}", str(tmp_path / "dst"))
    assert copied.returncode == 0, copied.stderr
    assert (tmp_path / "dst" / attempt / "manifest.json").is_file()
    unknown = run("-m", "portable_ckpt", "ls", "nostore://x")
    assert unknown.returncode == 2 and "entry point group portable_ckpt.storage" in unknown.stderr


def test_a_root_that_cannot_be_created_gets_advice_for_its_cause(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Manager review 25, L1: a root on a read-only mount was told to "pass a directory path";
    the advice now follows the cause (a parent that is a file keeps that advice)."""
    import errno as _errno

    from portable_ckpt.errors import StorageError
    from portable_ckpt.storage.local import LocalStorage

    (tmp_path / "afile").write_text("x")
    with pytest.raises(StorageError, match="pass a directory path"):
        LocalStorage(tmp_path / "afile" / "root", create=True)
    # /sys refuses new entries (EPERM as root in a container, EROFS or EACCES elsewhere)
    try:
        os.makedirs("/sys/pck-test-root")
    except OSError as exc:
        cause = exc.errno
    else:  # pragma: no cover - a writable /sys
        os.rmdir("/sys/pck-test-root")
        pytest.skip("/sys accepts new directories here")
    if cause not in (_errno.EPERM, _errno.EACCES, _errno.EROFS):
        pytest.skip(f"/sys answers errno {cause} here")
    with pytest.raises(StorageError) as ei:
        LocalStorage("/sys/pck-test-root", create=True)
    assert "pass a directory path" not in ei.value.message
    assert ("read-only" if cause == _errno.EROFS else "may not create it") in ei.value.message
