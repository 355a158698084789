"""Publish a directory (HF, DCP) or file (torch.save) target atomically.

The target is built beside DST, inside a private staging directory, then renamed into place
with one ``rename``.

The staging directory is :mod:`portable_ckpt.convert._staging`'s: named by its owner, and
swept by a later conversion once provably stale.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from typing import Any

from portable_ckpt.convert._staging import make_staging
from portable_ckpt.errors import StorageError, UsageError, transient_errno
from portable_ckpt.storage.local import fsync_dir

__all__ = [
    "check_dst_free",
    "check_parents",
    "fsync_files",
    "open_staged",
    "staged",
    "staged_dir",
]


def check_dst_free(dst: str, *, directory: bool = True) -> None:
    """Raise ``UsageError`` unless ``dst`` is free: absent, or (``directory``) an empty directory.

    A symbolic link is never free (the result is renamed onto ``dst``, which a link to a
    directory refuses only after all the work), and the nearest existing directory above
    ``dst`` must be a directory (a torch target below a file failed as an internal error).
    """
    # "link/" follows the link: the name itself is checked (conversion review atkconv2 N7)
    if os.path.islink(dst.rstrip("/" + os.sep) or dst):
        raise UsageError(
            f"destination {dst} is a symbolic link; give the path it names, or a new path"
        )
    name = os.path.basename(dst.rstrip("/" + os.sep))
    if name.startswith((".pck-staging-", ".pck-swept-", ".pck-clock-", ".pck-probe-")):
        # names a later conversion's sweep (or gc) would take for its own and remove (re-attack
        # 25, L3: an export published under one was deleted by the next conversion there)
        raise UsageError(f"destination {dst}: names starting with {name[:12]!r} are this "
                         "tool's staging and probes, which it removes; choose another name")
    if not directory and dst.endswith(("/", os.sep)):
        # (the whole export ran, then its rename onto "new.pt/" failed: conversion review 25, L4)
        raise UsageError(f"destination {dst} ends with a '/', but this target is one file; "
                         "drop the slash")
    if not os.path.lexists(dst):
        check_parents(dst)
        return
    if directory and os.path.isdir(dst) and not os.listdir(dst):
        return
    what = (
        "is not empty (a directory target is new or empty)"
        if directory and os.path.isdir(dst)
        else "already exists (a target is never overwritten)"
    )
    raise UsageError(f"destination {dst} {what}; choose a new path")


def check_parents(dst: str) -> None:
    """Raise ``UsageError`` when the nearest existing path above ``dst`` is not a directory."""
    parent = os.path.dirname(os.path.abspath(dst))
    while parent and not os.path.lexists(parent):
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    if parent and os.path.lexists(parent) and not os.path.isdir(parent):
        what = (
            "is a symbolic link to nothing" if os.path.islink(parent)
            else "exists and is not a directory"
        )
        raise UsageError(f"destination {dst}: {parent} {what}; choose a path in a directory")


@contextlib.contextmanager
def staged(dst: str, *, directory: bool = True) -> Iterator[str]:
    """Yield a private directory (or file path) next to ``dst``; rename it to ``dst`` on success.

    It lies in a staging directory of its own (:func:`make_staging`), so that what a
    ``kill -9`` leaves is one directory a later conversion can tell for stale and remove
    (:func:`sweep_staging`). A staged file exists (empty, made exclusively) when yielded: write
    it with :func:`open_staged`. It is fsynced before the rename (a directory: its entries; its
    files are fsynced by whoever wrote them), and the parent directory after it. On any
    exception the staging directory is removed and nothing appears at ``dst``.
    """
    check_dst_free(dst, directory=directory)
    parent = os.path.dirname(os.path.abspath(dst)) or "."
    os.makedirs(parent, exist_ok=True)
    stage = make_staging(parent)
    tmp = os.path.join(stage, os.path.basename(os.path.abspath(dst)))
    fd = -1
    try:
        if directory:
            os.mkdir(tmp)
        else:
            # Made here, exclusively and not through a symlink; its inode is checked before the
            # rename: in a directory another user can write, a symlink planted at the name made
            # the export write (and publish) the file it named (tenant review F4). (The staging
            # directory is 0700 as well.)
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o666)
            _STAGED[tmp] = fd
        yield tmp
        if directory:
            # The files' names are entries of tmp: durable before tmp is published under dst
            # (each file's own fsync is its writer's: DCP's export, HF's shards)
            fsync_dir(tmp)
        else:
            os.fsync(fd)
            mine, there = os.fstat(fd), os.lstat(tmp)
            if (mine.st_dev, mine.st_ino) != (there.st_dev, there.st_ino):
                raise StorageError(
                    f"{tmp} was replaced while it was written (another user of {parent}?); "
                    f"nothing was published at {dst}", path=dst)
        check_dst_free(dst, directory=directory)
        try:
            os.rename(tmp, dst)
        except OSError as exc:
            gone = ("; its staging directory was removed meanwhile (another conversion took it "
                    "for stale: was this one stopped for over an hour?); nothing was published"
                    if exc.errno == errno.ENOENT and not os.path.lexists(stage) else "")
            raise StorageError(f"rename {tmp} -> {dst}: {exc.strerror}{gone}", path=dst,
                               retryable=transient_errno(exc.errno)) from None
        fsync_dir(parent)
    finally:
        if fd >= 0:
            _STAGED.pop(tmp, None)
            os.close(fd)
        # Empty after a publish (a torch export's scratch is removed inside); a kill before
        # this line leaves it to the next conversion's sweep.
        shutil.rmtree(stage, ignore_errors=True)


#: Staged files being written, by name: their descriptors (made with the file).
_STAGED: dict[str, int] = {}


def open_staged(tmp: str) -> Any:
    """Open a staged file for writing: the file :func:`staged` made, not what its name is now.

    Written through the descriptor made with it (a name another user swapped for a symlink
    in between would not be followed, and its inode check stops the publish).
    """
    fd = os.dup(_STAGED[tmp])  # a file staged(directory=False) made and is still writing
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    return os.fdopen(fd, "wb")


#: Files fsynced at once by :func:`fsync_files`: a journaling file system commits the
#: concurrent ones together, where one after another each waits for a flush of its own.
FSYNC_THREADS = 16


def fsync_files(directory: str) -> None:
    """Make every regular file directly in ``directory`` (a staged target) durable, together.

    Raises:
        StorageError: a file could not be opened or synced (naming it).

    """
    from concurrent.futures import ThreadPoolExecutor

    def sync(name: str) -> None:
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StorageError(f"fsync {path}: {exc.strerror}", path=path,
                               retryable=transient_errno(exc.errno)) from None

    with os.scandir(directory) as it:
        names = [e.name for e in it if e.is_file(follow_symlinks=False)]
    with ThreadPoolExecutor(min(FSYNC_THREADS, max(1, len(names))),
                            thread_name_prefix="pck-fsync") as pool:
        list(pool.map(sync, names))


def staged_dir(dst: str) -> contextlib.AbstractContextManager[str]:
    """:func:`staged` for a directory target (HF, DCP)."""
    return staged(dst, directory=True)
