"""Publish a directory (HF, DCP) or file (torch.save) target atomically.

The target is built beside DST, then renamed into place with one ``rename``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator

from portable_ckpt.errors import StorageError, UsageError
from portable_ckpt.storage.local import fsync_dir

__all__ = ["check_dst_free", "staged", "staged_dir"]


def check_dst_free(dst: str, *, directory: bool = True) -> None:
    """Raise ``UsageError`` unless ``dst`` is free: absent, or (``directory``) an empty directory."""
    if not os.path.lexists(dst):
        return
    if directory and os.path.isdir(dst) and not os.listdir(dst):
        return
    what = "is not empty" if directory else "exists (a file target is never overwritten)"
    raise UsageError(f"destination {dst} already {what}; choose a new path")


@contextlib.contextmanager
def staged(dst: str, *, directory: bool = True) -> Iterator[str]:
    """Yield a private directory (or file path) next to ``dst``; rename it to ``dst`` on success.

    A staged file is fsynced before the rename, and the parent directory after it. On any
    exception the staging directory or file is removed and nothing appears at ``dst``.
    """
    check_dst_free(dst, directory=directory)
    parent = os.path.dirname(os.path.abspath(dst)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(os.path.abspath(dst))}.tmp-{secrets.token_hex(6)}")
    if directory:
        os.mkdir(tmp)
    try:
        yield tmp
        if not directory:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        check_dst_free(dst, directory=directory)
        try:
            os.rename(tmp, dst)
        except OSError as exc:
            raise StorageError(f"rename {tmp} -> {dst}: {exc.strerror}", path=dst) from None
        fsync_dir(parent)
    except BaseException:
        if directory:
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def staged_dir(dst: str) -> contextlib.AbstractContextManager[str]:
    """:func:`staged` for a directory target (HF, DCP)."""
    return staged(dst, directory=True)
