"""Storage backends behind one small interface (see :mod:`portable_ckpt.storage.base`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from portable_ckpt.errors import UsageError
from portable_ckpt.storage.base import Capabilities, ObjectInfo, Storage, StreamWriter
from portable_ckpt.storage.local import LocalStorage

__all__ = [
    "Capabilities",
    "LocalStorage",
    "ObjectInfo",
    "Storage",
    "StreamWriter",
    "check_root_url",
    "open_process_spec",
    "open_storage",
    "root_text",
]


def check_root_url(url: str) -> None:
    """Raise ``UsageError`` unless ``url`` names a root: a path, ``file://PATH`` or ``s3://BUCKET[/PREFIX]``.

    ``s3://`` without a bucket must never fall through to a local folder named ``s3:``.
    """
    import urllib.parse

    from portable_ckpt.errors import UsageError

    if not url:
        raise UsageError("a root must not be empty")
    if url.startswith("s3://"):
        parts = urllib.parse.urlsplit(url)
        if not parts.netloc or "/" in parts.netloc or parts.query or parts.fragment:
            raise UsageError(f"{url!r} is not an S3 root; expected s3://BUCKET[/PREFIX]")
        return
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme and scheme != "file":
        raise UsageError(f"{url!r}: unsupported scheme {scheme!r}; use a path, file:// or s3://")
    if scheme == "file" and not url[len("file://") :]:
        raise UsageError(f"{url!r} names no directory")


def root_text(url: object) -> str:
    """The text of a root a caller gave (``str`` or ``os.PathLike``).

    Raises:
        UsageError: anything else (bytes, a number), or a NUL character, which no file system
            path holds.

    """
    from portable_ckpt.errors import UsageError

    try:
        text = os.fspath(url)  # type: ignore[call-overload]
    except TypeError:
        raise UsageError(
            f"a root is a path or URL string, got {type(url).__name__} {url!r:.80}"
        ) from None
    if not isinstance(text, str):
        raise UsageError(f"a root is a path or URL string, got bytes {text!r:.80}")
    if "\x00" in text:
        raise UsageError(f"root {text!r:.120} contains a NUL character; no path does")
    return text


def open_storage(url: str | os.PathLike[str] | Storage, *, create: bool = False) -> Storage:
    """Return the backend for ``url``: a local path, or ``s3://bucket/prefix``.

    A :class:`Storage` instance is returned unchanged.

    Raises:
        UsageError: ``url`` is not a root (see :func:`root_text`, :func:`check_root_url`).

    """
    if isinstance(url, Storage):
        return url
    text = root_text(url)
    check_root_url(text)
    if text.startswith("s3://"):
        from portable_ckpt.storage.s3 import S3Storage

        return S3Storage.from_url(text)
    if text.startswith("file://"):
        text = text[len("file://") :]
    return LocalStorage(text, create=create)


def open_process_spec(spec: Mapping[str, Any]) -> Storage:
    """Open the root that :meth:`Storage.process_spec` described (in another process).

    Raises:
        UsageError: the document names no known backend.

    """
    kind = spec.get("kind")
    if kind == "local":
        return LocalStorage(str(spec["root"]))
    if kind == "s3":
        from portable_ckpt.storage.s3 import S3Options, S3Storage

        options = S3Options(**dict(spec["options"]))
        return S3Storage(str(spec["bucket"]), str(spec["prefix"]), options=options)
    raise UsageError(f"storage description names no known backend: {kind!r}")
