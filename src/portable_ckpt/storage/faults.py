"""A fault-injecting :class:`~portable_ckpt.storage.base.Storage` wrapper for tests and drills.

Wrap any backend and describe what should go wrong; every other call passes through unchanged::

    from portable_ckpt.storage import open_storage
    from portable_ckpt.storage.faults import Fault, FaultyStorage

    st = FaultyStorage(open_storage("/ckpts/run1", create=True), [
        Fault(op="write", path="*/data/*", error="ENOSPC", after_bytes=1 << 20),  # disk fills
        Fault(op="read", path="*.safetensors", error="EIO", after_ops=3, times=1),  # one bad read
        Fault(op="create", path="*/manifest.json", error="EIO"),  # the commit record fails
        Fault(op="fsync", path="*/index/*", error="EIO"),  # a writer index is not made durable
        Fault(op="*", delay=0.05),  # every call 50 ms slower
    ])

Operations (``Fault.op``): ``open`` (start writing a file), ``write``, ``fsync`` (closing a written
file, which makes it durable), ``read`` (``read_into``/``read_into_many``/``read_all``), ``size``,
``exists``, ``create`` (the atomic create-if-absent of commit records, which makes the record
durable itself: an ``fsync`` fault never matches it), ``list`` (``list`` and
``list_dirs``), ``delete``; ``*`` matches all. ``path`` is an :func:`fnmatch.fnmatch` pattern on the
storage-relative path (``"*"`` matches ``/`` too).

An injected failure is a :class:`~portable_ckpt.errors.StorageError` whose message names the
operation, the file, the errno name and the word ``injected``, exactly like a real backend failure
(``write 'a/data/w00000-0000.safetensors': No space left on device (errno 28) [injected]``).
A write that fails ``after_bytes`` first writes the bytes that still fit, as a full disk does.

Faults can also be given as text (``PCK_FAULTS`` in drills, see :func:`parse_faults`)::

    write:*/data/*:ENOSPC:after_bytes=4096;read:*:EIO:times=1;*:*:none:delay=0.01

A ``callback`` (``Fault(op=..., callback=fn)``) is called as ``fn(op, path)`` when the fault fires,
before the error (if any) is raised; tests use it as a phase hook (pause, signal, kill).
"""

from __future__ import annotations

import builtins
import errno as _errno
import fnmatch
import os
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field

from portable_ckpt.errors import StorageError, UsageError, transient_errno
from portable_ckpt.storage.base import ObjectInfo, Storage, StreamWriter

__all__ = ["OPS", "Fault", "FaultyStorage", "OpRecord", "parse_faults"]

#: Operation names a fault can match.
OPS = ("open", "write", "fsync", "read", "size", "exists", "create", "list", "delete")


def _errno_of(error: int | str | None) -> int | None:
    if error is None or isinstance(error, int):
        return error
    name = error.upper()
    if name in ("", "NONE"):
        return None
    code = getattr(_errno, name, None)
    if not isinstance(code, int):
        raise UsageError(f"unknown errno name {error!r} (use e.g. ENOSPC, EIO, EDQUOT, or none)")
    return code


@dataclass
class Fault:
    """One injected misbehaviour.

    Attributes:
        op: Operation name from :data:`OPS`, a tuple of them, or ``"*"``.
        path: fnmatch pattern on the storage-relative path.
        error: errno (int or name such as ``"ENOSPC"``) to fail with; ``None`` fails nothing
            (only ``delay``/``callback`` apply).
        after_ops: Let this many matching operations succeed first.
        after_bytes: For ``write``/``read``: fire once more than this many bytes have gone through
            matching operations (a failing write first writes what still fits).
        times: Fire at most this many times (``None``: every time).
        delay: Seconds to sleep before each matching operation (slow I/O); applies whether or not
            the fault has fired.
        bandwidth: Bytes per second for matching reads and writes (slow I/O by volume).
        callback: ``callback(op, path)`` when the fault fires (phase hooks in tests).
        lost_answer: For ``create`` only: the create takes effect, then the error is raised (an
            object store's answer lost after the request was sent, R-COMMIT-19).
        raises: Raised instead of the injected ``StorageError`` (a backend's own exception, a
            ``KeyboardInterrupt``); with ``lost_answer``, after the create took effect. Not for
            ``write``.

    """

    op: str | tuple[str, ...] = "*"
    path: str = "*"
    error: int | str | None = "EIO"
    after_ops: int = 0
    after_bytes: int | None = None
    times: int | None = None
    delay: float = 0.0
    bandwidth: float | None = None
    callback: Callable[[str, str], None] | None = None
    lost_answer: bool = False
    raises: BaseException | None = None
    fired: int = field(default=0, init=False)
    _ops_seen: int = field(default=0, init=False, repr=False)
    _bytes_seen: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        ops = (self.op,) if isinstance(self.op, str) else tuple(self.op)
        for o in ops:
            if o != "*" and o not in OPS:
                raise UsageError(f"unknown storage operation {o!r} (one of {', '.join(OPS)} or *)")
        if self.lost_answer and ops != ("create",):
            raise UsageError(f"lost_answer applies to op 'create' only, not {self.op!r}")
        if self.raises is not None and ("write" in ops or "*" in ops):
            raise UsageError("raises applies to operations other than 'write' (name them)")
        self._errno = _errno_of(self.error)

    def matches(self, op: str, path: str) -> bool:
        """Whether this fault applies to ``op`` on ``path``."""
        ops = (self.op,) if isinstance(self.op, str) else self.op
        return ("*" in ops or op in ops) and fnmatch.fnmatchcase(path, self.path)


@dataclass(frozen=True)
class OpRecord:
    """One operation seen by a :class:`FaultyStorage` (``nbytes`` for reads and writes)."""

    op: str
    path: str
    nbytes: int = 0
    failed: bool = False


def _raise(op: str, path: str, code: int) -> None:
    name = _errno.errorcode.get(code, str(code))
    raise StorageError(
        f"{op} {path!r}: {os.strerror(code)} ({name}, errno {code}) [injected]", path=path,
        retryable=transient_errno(code),
    )


class _FaultyWriter(StreamWriter):
    def __init__(self, owner: FaultyStorage, path: str, inner: StreamWriter) -> None:
        self._owner = owner
        self._path = path
        self._inner = inner

    def write(self, data: memoryview | bytes) -> None:
        mv = memoryview(data).cast("B")
        failure = self._owner._before("write", self._path, len(mv))
        if failure is not None:
            allowed, code = failure
            if allowed > 0:
                self._inner.write(mv[:allowed])
            _raise("write", self._path, code)
        self._inner.write(mv)

    def close(self) -> None:
        """Close the wrapped backend."""
        try:
            self._owner._before("fsync", self._path, 0)
        except StorageError:
            # A failed fsync still leaves the file behind (the data may or may not be durable).
            self._inner.close()
            raise
        self._inner.close()

    def abort(self) -> None:
        self._inner.abort()


class FaultyStorage(Storage):
    """Wrap ``inner`` and inject the given faults.

    Args:
        inner: The real backend.
        faults: What to inject (see :class:`Fault`); more can be appended to ``faults`` later.
        record: Keep a log of every operation in ``ops`` (thread-safe).

    """

    def __init__(
        self, inner: Storage, faults: list[Fault] | None = None, *, record: bool = True
    ) -> None:
        self.inner = inner
        self.faults: list[Fault] = list(faults or [])
        self.capabilities = inner.capabilities
        self.url = inner.url
        self.record = record
        self.ops: list[OpRecord] = []
        self._lock = threading.Lock()
        self._lost_raises: dict[str, BaseException] = {}  # create path -> what its fault raises

    # -- fault machinery -------------------------------------------------------------------------
    def _before(self, op: str, path: str, nbytes: int) -> tuple[int, int] | None:
        """Apply delays and decide whether ``op`` fails.

        Returns ``None`` when the operation proceeds in full. A failing ``write`` returns
        ``(bytes that still fit, errno)``; any other failing operation raises here.
        """
        sleep = 0.0
        fire: Fault | None = None
        allowed: int | None = None
        with self._lock:
            for f in self.faults:
                if not f.matches(op, path):
                    continue
                sleep += f.delay
                if f.bandwidth:
                    sleep += nbytes / f.bandwidth
                if fire is not None or (f.times is not None and f.fired >= f.times):
                    continue
                f._ops_seen += 1
                before = f._bytes_seen
                f._bytes_seen += nbytes
                if f._ops_seen <= f.after_ops:
                    continue
                if f.after_bytes is not None:
                    if f._bytes_seen <= f.after_bytes:
                        continue
                    room = max(0, f.after_bytes - before)
                else:
                    room = 0
                f.fired += 1
                fire = f
                allowed = room
            if self.record:
                self.ops.append(
                    OpRecord(op, path, nbytes, fire is not None and fire._errno is not None)
                )
        if sleep:
            time.sleep(sleep)
        if fire is None:
            return None
        if fire.callback is not None:
            fire.callback(op, path)
        if fire._errno is None:
            return None
        if op != "write" and not fire.lost_answer:
            if fire.raises is not None:
                raise fire.raises
            _raise(op, path, fire._errno)
        if fire.lost_answer and fire.raises is not None:
            with self._lock:
                self._lost_raises[path] = fire.raises
        return (allowed or 0), fire._errno

    def ops_for(self, op: str | None = None, pattern: str = "*") -> list[OpRecord]:
        """Recorded operations, filtered by name and path pattern."""
        with self._lock:
            return [
                r
                for r in self.ops
                if (op is None or r.op == op) and fnmatch.fnmatchcase(r.path, pattern)
            ]

    # -- Storage interface ---------------------------------------------------------------------
    def read_into(self, path: str, offset: int, buf: memoryview) -> None:
        """Read, after the faults for ``read``."""
        self._before("read", path, len(buf))
        self.inner.read_into(path, offset, buf)

    def read_into_many(self, path: str, offset: int, bufs: list[memoryview]) -> None:
        """Read several buffers, after the faults for ``read``."""
        self._before("read", path, sum(len(b) for b in bufs))
        self.inner.read_into_many(path, offset, bufs)

    def read_all(self, path: str, *, max_size: int) -> bytes:
        """Read a whole object, after the faults for ``read``."""
        self._before("read", path, 0)
        return self.inner.read_all(path, max_size=max_size)

    def size(self, path: str) -> int:
        """Size, after the faults for ``size``."""
        self._before("size", path, 0)
        return self.inner.size(path)

    def exists(self, path: str) -> bool:
        """Existence, after the faults for ``exists``."""
        self._before("exists", path, 0)
        return self.inner.exists(path)

    def open_writer(self, path: str, *, defer_sync: bool = False) -> StreamWriter:
        """Start a file, after the faults for ``open``."""
        self._before("open", path, 0)
        return _FaultyWriter(self, path, self.inner.open_writer(path, defer_sync=defer_sync))

    def sync(self) -> None:
        """Pass through: make the inner storage's closed files durable."""
        self.inner.sync()

    def abort_uploads(
        self,
        prefix: str = "",
        *,
        older_than_s: float = 0.0,
        only: Collection[str] | None = None,
    ) -> int:
        """Pass through to the inner storage."""
        return self.inner.abort_uploads(prefix, older_than_s=older_than_s, only=only)

    def list_uploads(
        self, prefix: str = "", *, activity: bool = False
    ) -> builtins.list[ObjectInfo]:
        """List unfinished uploads, after the faults for ``list``."""
        self._before("list", prefix, 0)
        return self.inner.list_uploads(prefix, activity=activity)

    def checksum_crc32c(self, path: str) -> int | None:
        """The inner store's CRC32C of ``path``, after the faults for ``exists`` (a HEAD)."""
        self._before("exists", path, 0)
        return self.inner.checksum_crc32c(path)

    def validates_checksums(self) -> bool:
        """Pass through to the inner storage."""
        return self.inner.validates_checksums()

    def root_exists(self) -> bool:
        """Whether the root exists, after the faults for ``list``."""
        self._before("list", "", 0)
        return self.inner.root_exists()

    def create_if_absent(self, path: str, data: bytes) -> bool:
        """Atomic create, after the faults for ``create``."""
        lost = self._before("create", path, len(data))
        done = self.inner.create_if_absent(path, data)
        if lost is not None:  # lost_answer: it took effect, and the caller hears an error
            with self._lock:
                raises = self._lost_raises.pop(path, None)
            if raises is not None:
                raise raises
            _raise("create", path, lost[1])
        return done

    def list(self, prefix: str = "", *, recursive: bool = True) -> Iterator[ObjectInfo]:
        """List, after the faults for ``list``."""
        self._before("list", prefix, 0)
        return self.inner.list(prefix, recursive=recursive)

    def list_foreign(self, prefix: str = "", *, recursive: bool = True) -> builtins.list[str]:
        """List foreign entries, after the faults for ``list``."""
        self._before("list", prefix, 0)
        return self.inner.list_foreign(prefix, recursive=recursive)

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """List directories, after the faults for ``list``."""
        self._before("list", prefix, 0)
        return self.inner.list_dirs(prefix)

    def delete(self, path: str) -> bool | None:
        """Delete, after the faults for ``delete``."""
        self._before("delete", path, 0)
        return self.inner.delete(path)

    def delete_prefix(self, prefix: str) -> bool | None:
        """Delete a prefix object by object (each a ``delete``); the wrapped backend's answer."""
        for info in list(self.list(prefix)):
            self.delete(info.path)
        return self.inner.delete_prefix(prefix)  # removes what is left (empty directories)

    def local_root(self) -> str | None:
        """The wrapped backend's local root."""
        return self.inner.local_root()

    def close(self) -> None:
        """Close the wrapped backend."""
        self.inner.close()


def parse_faults(text: str) -> list[Fault]:
    """Parse ``op:pattern:errno[:key=value,...]`` items separated by ``;``.

    Keys: ``after_ops``, ``after_bytes``, ``times`` (ints), ``delay``, ``bandwidth`` (floats).
    ``errno`` is a name (``ENOSPC``, ``EIO``...) or ``none``. Example:
    ``write:*/data/*:ENOSPC:after_bytes=4096;*:*:none:delay=0.01``.
    """
    out: list[Fault] = []
    for item in filter(None, (s.strip() for s in text.split(";"))):
        parts = item.split(":", 3)
        if len(parts) < 3:
            raise UsageError(f"fault {item!r}: expected op:pattern:errno[:key=value,...]")
        op, pattern, err = parts[0], parts[1], parts[2]
        kwargs: dict[str, float | int] = {}
        for kv in filter(None, (parts[3] if len(parts) > 3 else "").split(",")):
            k, _, v = kv.partition("=")
            k = k.strip()
            try:
                if k in ("after_ops", "after_bytes", "times"):
                    kwargs[k] = int(v)
                elif k in ("delay", "bandwidth"):
                    kwargs[k] = float(v)
                else:
                    raise UsageError(f"fault {item!r}: unknown key {k!r}")
            except ValueError:
                raise UsageError(f"fault {item!r}: {k}={v!r} is not a number") from None
        out.append(Fault(op=op, path=pattern, error=err, **kwargs))  # type: ignore[arg-type]
    return out
