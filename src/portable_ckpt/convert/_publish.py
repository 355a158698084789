"""Publish a directory target (HF, DCP) atomically: build it beside DST, then one ``rename``."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator

from portable_ckpt.errors import StorageError, UsageError

__all__ = ["check_dst_free", "staged_dir"]


def check_dst_free(dst: str) -> None:
    """Raise ``UsageError`` unless ``dst`` does not exist or is an empty directory."""
    if os.path.lexists(dst) and not (os.path.isdir(dst) and not os.listdir(dst)):
        raise UsageError(f"destination {dst} already exists and is not empty; choose a new path")


@contextlib.contextmanager
def staged_dir(dst: str) -> Iterator[str]:
    """Yield a private directory next to ``dst``; rename it to ``dst`` when the block succeeds.

    On any exception the staging directory is removed and nothing appears at ``dst``.
    """
    check_dst_free(dst)
    parent = os.path.dirname(os.path.abspath(dst)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(os.path.abspath(dst))}.tmp-{secrets.token_hex(6)}")
    os.mkdir(tmp)
    try:
        yield tmp
        check_dst_free(dst)
        try:
            os.rename(tmp, dst)
        except OSError as exc:
            raise StorageError(f"rename {tmp} -> {dst}: {exc.strerror}", path=dst) from None
        fd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
