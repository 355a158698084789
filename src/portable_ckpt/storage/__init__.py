"""Storage backends behind one small interface (see :mod:`portable_ckpt.storage.base`)."""

from __future__ import annotations

import os

from portable_ckpt.storage.base import Capabilities, ObjectInfo, Storage, StreamWriter
from portable_ckpt.storage.local import LocalStorage

__all__ = ["Capabilities", "LocalStorage", "ObjectInfo", "Storage", "StreamWriter", "open_storage"]


def open_storage(url: str | os.PathLike[str] | Storage, *, create: bool = False) -> Storage:
    """Return the backend for ``url``: a local path, or ``s3://bucket/prefix``.

    A :class:`Storage` instance is returned unchanged.
    """
    if isinstance(url, Storage):
        return url
    text = os.fspath(url)
    if text.startswith("s3://"):
        from portable_ckpt.storage.s3 import S3Storage

        return S3Storage.from_url(text)
    if text.startswith("file://"):
        text = text[len("file://") :]
    return LocalStorage(text, create=create)
