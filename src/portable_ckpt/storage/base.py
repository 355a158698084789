"""The storage interface: the only thing a new backend implements.

Paths are relative POSIX paths below the storage root (e.g. ``"<attempt>/data/w00000-0000.safetensors"``).
Backends must refuse paths that leave the root; callers validate paths read from disk with
:func:`portable_ckpt.format.paths.check_relative_path` before they ever reach a backend.

The rules below are tested by :class:`portable_ckpt.testing.storage.StorageTests`, which every
backend (and any third-party one, see ``docs/storage-backends.md``) subclasses.
"""

from __future__ import annotations

import abc
import builtins
import contextlib
import re
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from portable_ckpt.errors import PathUnsafeError

__all__ = ["Capabilities", "ObjectInfo", "Storage", "StreamWriter", "well_formed"]


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def well_formed(path: str) -> bool:
    """Whether ``path`` is a relative path that a backend addresses.

    Its components are not empty, ``.`` or ``..``; it has no backslash and no control character
    (C0 or DEL; an S3 client cannot address some of them) and is UTF-8. Objects under a root
    whose keys are not well formed were not written by this format; they are *foreign*:
    listings skip them, gc never deletes them, reads never name them (spec §2.1).
    """
    if not path or "\\" in path or _CONTROL.search(path):
        return False
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:  # a non-UTF-8 file name (surrogate-escaped by the OS layer)
        return False
    return all(p not in ("", ".", "..") for p in path.split("/"))


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do; planners consult it instead of the backend's type.

    Attributes:
        atomic_create: ``create_if_absent`` is atomic against concurrent creators.
        ranged_read: ``read_into`` reads only the requested bytes (descriptive: readers ask
            for ranges whatever it says).
        durable_fsync: writes are made durable (fsync) when a writer closes (descriptive:
            writers call :meth:`Storage.sync` before any commit record whatever it says).
        local_path: the backend maps to a local directory (``local_root`` is set).
        native_crc32c: the backend verifies CRC32C checksums of uploaded objects itself.

    """

    atomic_create: bool = True
    ranged_read: bool = True
    durable_fsync: bool = True
    local_path: bool = False
    native_crc32c: bool = False


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object: its relative path, size in bytes and modification time (epoch s)."""

    path: str
    size: int
    mtime: float


class StreamWriter(abc.ABC):
    """A file being written sequentially. Nothing is visible under its name before ``close``.

    Local backends write in place (the attempt directory is private to its writer); object
    stores upload parts and complete the upload on ``close``.
    """

    @abc.abstractmethod
    def write(self, data: memoryview | bytes) -> None:
        """Append ``data``; the caller may reuse its buffer when this returns."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flush and make the file durable (fsync on POSIX, complete upload on object stores)."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Abandon the file, removing what was written where possible."""

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            with contextlib.suppress(Exception):  # the body's error is the one that counts
                self.abort()
            return
        try:
            self.close()
        except BaseException:
            # A close that failed (an fsync error, an object stored with other bytes than were
            # sent) leaves nothing a reader could mistake for the file. The close's error is
            # the one the caller gets, also when the abort fails too.
            with contextlib.suppress(Exception):
                self.abort()
            raise


class Storage(abc.ABC):
    """Ranged get, put, list, atomic create-if-absent, delete; plus capabilities."""

    capabilities: Capabilities = Capabilities()

    #: Location of the root: the local backend's directory path, ``s3://bucket/prefix``, or a
    #: registered scheme's URL, as its opener gives it (one spelling per root where it can:
    #: copy records name roots by it; two spellings of one root are told apart by a probe).
    url: str = ""

    @abc.abstractmethod
    def read_into(self, path: str, offset: int, buf: memoryview) -> None:
        """Fill ``buf`` with ``len(buf)`` bytes of ``path`` starting at ``offset``.

        Raises:
            FileMissingError: the object does not exist.
            FileSizeError: fewer bytes than requested exist.
            StorageError: any other I/O failure.

        """

    def read_into_many(self, path: str, offset: int, bufs: list[memoryview]) -> None:
        """Fill ``bufs`` in order from consecutive bytes of ``path`` starting at ``offset``."""
        for b in bufs:
            self.read_into(path, offset, b)
            offset += memoryview(b).nbytes  # bytes: len() counts a typed view's items

    def read_extents(self, path: str, extents: Sequence[tuple[int, list[memoryview]]]) -> None:
        """Fill several extents of ``path``: each ``(offset, bufs)`` like :meth:`read_into_many`.

        One call per pipeline window of a planned read. Backends override it to open the file
        once (local) or to fetch the extents concurrently (object stores); the default reads
        them one after another.
        """
        for offset, bufs in extents:
            self.read_into_many(path, offset, bufs)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """Return ``length`` bytes of ``path`` from ``offset`` (a ranged get)."""
        buf = bytearray(length)
        self.read_into(path, offset, memoryview(buf))
        return bytes(buf)

    @abc.abstractmethod
    def read_all(self, path: str, *, max_size: int) -> bytes:
        """Return the whole object, refusing (``LimitError``) one larger than ``max_size``."""

    @abc.abstractmethod
    def size(self, path: str) -> int:
        """Return the size in bytes (``FileMissingError`` when absent)."""

    @abc.abstractmethod
    def exists(self, path: str) -> bool:
        """Return whether ``path`` exists (as a regular object, not following links out)."""

    @abc.abstractmethod
    def open_writer(self, path: str, *, defer_sync: bool = False) -> StreamWriter:
        """Start writing a new object at ``path`` (parents are created as needed).

        With ``defer_sync`` the file is durable only after the next :meth:`sync` (local
        backends then fsync in the background while the caller writes its next file).
        """

    def put(self, path: str, data: bytes | memoryview) -> None:
        """Write a whole object durably, replacing nothing that a reader relies on."""
        with self.open_writer(path) as w:
            w.write(data)

    @abc.abstractmethod
    def create_if_absent(self, path: str, data: bytes) -> bool:
        """Atomically create ``path`` with ``data`` unless it exists; return whether it did.

        This is the commit primitive: readers see either nothing or the whole object. A
        failure after the object may have become visible (its directory not synced, an
        object store's answer lost) raises :class:`CommitOutcomeUnknownError`, never a plain
        error that would read as "not created" (R-COMMIT-19).
        """

    @abc.abstractmethod
    def list(self, prefix: str = "", *, recursive: bool = True) -> Iterator[ObjectInfo]:
        """List objects under ``prefix`` (a directory-like prefix, ``""`` for the root)."""

    def list_foreign(self, prefix: str = "", *, recursive: bool = True) -> builtins.list[str]:
        """Entries under ``prefix`` that :meth:`list` skips as foreign (see :func:`well_formed`).

        Object stores: keys that are not well-formed paths; local directories also FIFOs,
        sockets, devices and symlinks. The default (a backend without such entries) is none.
        """
        return []

    @abc.abstractmethod
    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """Return the names of the immediate 'directories' under ``prefix``."""

    @abc.abstractmethod
    def delete(self, path: str) -> bool | None:
        """Delete one object; deleting a missing object is not an error.

        Returns whether this call removed it (``False``: it was absent), or ``None`` where the
        backend cannot tell (an object store's DELETE answers alike). gc counts what it
        deleted by this: two overlapping runs do not both report one version.
        """

    def delete_prefix(self, prefix: str) -> bool | None:
        """Delete every object under ``prefix`` (used by gc after the manifest is gone).

        ``prefix`` names a directory below the root (a trailing ``/`` allowed): never the root
        itself, never a path that leaves it, whatever the backend's listing accepts. Returns
        ``None``, or where the backend can tell, whether this call removed the prefix itself
        (of two processes deleting one attempt at once, one does: gc counts by it).
        """
        if not well_formed(prefix.rstrip("/")):
            raise PathUnsafeError(
                f"delete_prefix {prefix!r}: not a directory below the root {self.url}",
                path=prefix,
            )
        for info in list(self.list(prefix)):
            self.delete(info.path)
        return None

    def delete_many(self, paths: Sequence[str]) -> None:
        """Delete these objects (missing ones are not an error), in as few requests as can be.

        gc deletes a version's records and writer indexes this way, before its data (R-GC-3):
        an object store deletes up to 1,000 keys a request. The default deletes one by one. A
        malformed path (``..``, absolute, empty components) is refused before anything is
        deleted; one that leaves the root through a symbolic link is refused when reached.
        """
        for path in paths:
            if not well_formed(path):
                raise PathUnsafeError(f"delete {path!r}: not a path below the root {self.url}",
                                      path=path)
        for path in paths:
            self.delete(path)

    def remove_empty_dirs(self, prefix: str) -> None:  # noqa: B027 - optional hook
        """Remove the empty directories under ``prefix``, and ``prefix`` if it is left empty.

        A writer that aborted removes its attempt's directories this way (never a file, never
        a directory that holds one). Object stores have no directories: the default does
        nothing.
        """

    def sync(self) -> None:  # noqa: B027 - optional hook
        """Make every file closed so far durable, names included.

        POSIX: wait for the deferred fsyncs, then fsync the directories. Writers call it once after their data files instead of once per file.
        """

    def list_uploads(
        self, prefix: str = "", *, activity: bool = False
    ) -> builtins.list[ObjectInfo]:
        """Unfinished uploads under ``prefix``: their paths (``size`` 0) and times.

        ``mtime`` is when the upload started; with ``activity``, the time of its newest part
        (costs a request per upload on object stores). Listings never show these objects, so
        gc reads them to date an attempt and to find attempts that have nothing else. Only
        object stores have unfinished uploads; the default returns none.
        """
        return []

    def checksum_crc32c(self, path: str) -> int | None:
        """The whole-object CRC32C the store keeps for ``path``, or None where it keeps none.

        ``copy`` compares it with the verified source bytes of each file it wrote, instead of
        reading the file back, where the store checks the checksums it is sent
        (:meth:`validates_checksums`). The default keeps none.
        """
        return None

    def validates_checksums(self) -> bool:
        """Whether the store refuses an upload whose CRC32C differs from the one sent with it.

        A store that stores what it is sent whatever its checksum may echo that checksum back
        (:meth:`checksum_crc32c` then proves nothing). The default answers the
        ``native_crc32c`` capability; the S3 backend probes the store once.
        """
        return self.capabilities.native_crc32c

    def root_exists(self) -> bool:
        """Whether the root exists: a directory, or (object stores) a prefix with an object.

        Or with an unfinished upload: a root whose only save was killed mid-upload exists for
        gc, which cleans it (backend review 27, M2).
        """
        return (bool(self.list_dirs("")) or next(iter(self.list("", recursive=False)), None)
                is not None or bool(self.list_uploads("")))

    def abort_uploads(
        self,
        prefix: str = "",
        *,
        older_than_s: float = 0.0,
        only: Collection[str] | None = None,
    ) -> int:
        """Abort unfinished uploads under ``prefix`` older than ``older_than_s``; return how many.

        ``only``: abort just the uploads of these paths (relative to the root, as
        :meth:`list_uploads` gives them). Only object stores have such uploads; the default
        does nothing.
        """
        return 0

    @contextlib.contextmanager
    def one_root_listing(self) -> Iterator[None]:
        """Within: the root's top level may be listed once and that listing reused.

        For a read-only command that looks at the root from several sides (its attempts, its
        pins, its foreign entries): one view, and one request where a listing is a request.
        Never around what must see the storage change (a clock probe, a gc's deletions). The
        view belongs to the caller's context (a context variable, not the object): another
        thread of the process using the same object never sees it. The default lists every
        time.
        """
        yield

    @contextlib.contextmanager
    def fresh_listing(self) -> Iterator[None]:
        """Within: listings ask the storage again, even inside :meth:`one_root_listing`.

        Around a second look that must see the storage now (a record answered absent that the
        listing showed: pruned since, or a store that contradicts itself). The default does
        nothing (it lists every time anyway).
        """
        yield

    def cached(self, path: str, offset: int, length: int) -> bool | None:
        """Whether bytes ``[offset, offset + length)`` of ``path`` are in memory already.

        A hint for planning reads (a cold read gains from reading files side by side, a read
        from memory only pays for the extra threads); ``None`` when the backend cannot tell
        (the default). Never raises for a missing file: the read reports that.
        """
        return None

    def local_root(self) -> str | None:
        """Return the local directory of the root, when ``capabilities.local_path``."""
        return None

    def process_spec(self) -> dict[str, Any] | None:
        """A JSON document from which another process opens this same root, or ``None``.

        :func:`~portable_ckpt.storage.open_process_spec` turns it back into a storage (the
        writer process of an async save in ``mode="process"`` opens the root this way). The
        default is ``None``: a backend object that cannot travel (in memory, wrapped, holding
        live connections or credentials) is used only by the process that made it.
        """
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and thread pools."""
