"""Storage backends behind one small interface (see :mod:`portable_ckpt.storage.base`)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from portable_ckpt.errors import UsageError
from portable_ckpt.format.usage import path_text
from portable_ckpt.storage.base import (
    Capabilities,
    ObjectInfo,
    Storage,
    StreamWriter,
    well_formed,
)
from portable_ckpt.storage.local import LocalStorage

__all__ = [
    "Capabilities",
    "LocalStorage",
    "ObjectInfo",
    "Storage",
    "StreamWriter",
    "check_root_url",
    "check_s3_bucket",
    "check_s3_prefix",
    "local_path",
    "open_process_spec",
    "open_storage",
    "register_scheme",
    "root_text",
    "scheme_installed",
]

#: Entry-point group through which an installed package names its backends' URL schemes.
ENTRY_POINT_GROUP = "portable_ckpt.storage"
_SCHEMES: dict[str, Callable[[str], Storage]] = {}


def register_scheme(scheme: str, opener: Callable[[str], Storage]) -> None:
    """Let URLs ``scheme://...`` name roots of a third-party backend.

    ``opener(url)`` returns the backend for the whole URL (and refuses a malformed one with
    ``UsageError``). Then everything that takes a root as text works with it: the CLI, a copy's
    source and destination, ``gc --require-copy``, and the process-mode writer when the
    backend's :meth:`~portable_ckpt.storage.base.Storage.process_spec` returns
    ``{"kind": "url", "url": url}`` and the writer process finds the scheme too. This call
    reaches this process only: other processes (the CLI, the process-mode writer, spawned
    ranks) find a package's backend through an entry point of the group
    ``portable_ckpt.storage`` named after the scheme (its value: the opener), as fsspec's
    implementations do.
    """
    if not re.fullmatch(r"[a-z][a-z0-9+.-]*", scheme) or scheme in ("s3", "file"):
        raise UsageError(f"scheme {scheme!r}: lowercase letters, digits, '+', '.', '-', not "
                         "one of the built-in s3 or file")
    _SCHEMES[scheme] = opener


def scheme_installed(scheme: str) -> bool:
    """Whether another process finds ``scheme``: an installed package's entry point names it.

    :func:`register_scheme` reaches this process only; a writer process or a spawned rank
    imports nothing of the caller's (backend review B3).
    """
    from importlib.metadata import entry_points

    return any(True for _ in entry_points(group=ENTRY_POINT_GROUP, name=scheme))


def _opener(scheme: str) -> Callable[[str], Storage] | None:
    """The registered opener of ``scheme``, loading an installed package's entry point once."""
    if scheme not in _SCHEMES:
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP, name=scheme):
            _SCHEMES[scheme] = ep.load()
            break
    return _SCHEMES.get(scheme)


#: C0 controls and DEL: in no S3 root (a URL parser drops some, S3 clients refuse others).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_root_url(url: str) -> None:
    """Raise ``UsageError`` unless ``url`` names a root: a path, ``file://PATH`` or ``s3://BUCKET[/PREFIX]``.

    ``s3://`` without a bucket must never fall through to a local folder named ``s3:``.
    """
    import urllib.parse

    from portable_ckpt.errors import UsageError

    if not url:
        raise UsageError("a root must not be empty")
    if url.startswith("s3://"):
        if _CONTROL.search(url):  # urlsplit drops tabs and newlines: it would name another root
            raise UsageError(f"{url!r} contains a control character; no S3 root does")
        try:
            parts = urllib.parse.urlsplit(url)
        except ValueError as exc:  # "s3://[b/x": an unclosed IPv6 bracket
            raise UsageError(
                f"{url!r} is not an S3 root ({exc}); expected s3://BUCKET[/PREFIX]"
            ) from None
        if not parts.netloc or "/" in parts.netloc or parts.query or parts.fragment:
            raise UsageError(f"{url!r} is not an S3 root; expected s3://BUCKET[/PREFIX]")
        check_s3_bucket(parts.netloc, url=url)
        check_s3_prefix(parts.path, url=url)
        return
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if not scheme:
        _check_lost_slash(url)
    if scheme and scheme != "file" and _opener(scheme) is None:
        raise UsageError(
            f"{url!r}: unsupported scheme {scheme!r}; use a path, file:// or s3://, or install "
            f"the package of a backend that registers it (entry point group {ENTRY_POINT_GROUP})"
        )
    if scheme == "file" and not url[len("file://") :]:
        raise UsageError(f"{url!r} names no directory")


def _check_lost_slash(text: str) -> None:
    """Refuse ``s3:/bucket/run`` (a URL that lost a slash), which reads as a relative path.

    It was a local folder ``s3:`` in the working directory: the job saved there, on a disk
    that goes with the node, and every call said it worked (api review 31).
    """
    from portable_ckpt.errors import UsageError

    typo = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):(?!//)", text)
    if typo is not None and (
        typo[1].lower() in ("s3", "file") or _opener(typo[1].lower()) is not None
    ):
        raise UsageError(
            f"root {text!r} looks like a URL with a slash missing: write "
            f"{typo[1].lower()}://..., or ./{text} for a local folder of that name"
        )


#: A bucket name S3 accepts: 3 to 63 lowercase letters, digits, dots and hyphens, beginning and
#: ending with a letter or digit; or, for buckets created under the legacy us-east-1 rules, up to
#: 255 of those, uppercase letters and underscores. Nothing else can appear in a request URI
#: (obstore panics on a space or ``<``), and ``..`` could walk a path-style URI.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]{1,253}[A-Za-z0-9]")


def check_s3_bucket(bucket: str, *, url: str) -> None:
    """Raise ``UsageError`` unless ``bucket`` is a name S3 accepts (checked before any request).

    Lowercase letters, digits, ``.`` and ``-``, 3 to 63 characters, beginning and ending with a
    letter or digit, no ``..`` (legacy names: also uppercase and ``_``, up to 255).
    """
    if _BUCKET.fullmatch(bucket) is None or ".." in bucket:
        raise UsageError(
            f"{url!r}: {bucket!r} is not an S3 bucket name (3-63 lowercase letters, digits, "
            "'.' and '-', beginning and ending with a letter or digit); expected "
            "s3://BUCKET[/PREFIX]"
        )


def check_s3_prefix(path: str, *, url: str) -> str:
    """The key prefix of an S3 root (``path`` without its outer slashes), checked.

    A prefix is a relative path (:func:`~portable_ckpt.storage.base.well_formed`): no empty,
    ``.`` or ``..`` component, no backslash, no control character. S3 stores such keys but no
    listing by this library can name them again, so a save would leave objects no tool
    deletes: the root is refused before any request.

    Raises:
        UsageError: a malformed prefix.

    """
    prefix = path.strip("/")
    if prefix and not well_formed(prefix):
        raise UsageError(
            f"{url!r}: the key prefix {prefix!r} is not a relative path (empty, '.' or '..' "
            "components, a backslash or a control character); expected s3://BUCKET[/PREFIX] "
            "with PREFIX like 'runs/job1'"
        )
    return prefix


def root_text(url: object) -> str:
    """The text of a root a caller gave (``str`` or ``os.PathLike``), ``~/`` expanded.

    Raises:
        UsageError: anything else (bytes, a number), or a NUL character, which no file system
            path holds.

    """
    from portable_ckpt.errors import UsageError

    if isinstance(url, Storage):  # backend review B5: the manager, convert
        raise UsageError(
            f"this call takes a root as a path or URL, not a backend object ({type(url).__name__}"
            f" at {url.url!r}): register the backend's URL scheme (register_scheme, or an "
            "entry point: docs/storage-backends.md) and pass its URL"
        )
    text = path_text(url, "a root is a path or URL string")
    if "\x00" in text:
        raise UsageError(f"root {text!r:.120} contains a NUL character; no path does")
    _check_lost_slash(text)
    if text == "~" or text.startswith("~/"):
        # A config file's "~/ckpts/run1" (no shell to expand it) made a directory named "~"
        # in the job's working directory (integrator review F12).
        text = os.path.expanduser(text)
    return text


def local_path(text: str) -> str | None:
    """The local path a root's text names (a path, or ``file://PATH``), else ``None``.

    ``None``: a URL of another scheme (``s3://``, a registered one). The one reading of a root's text wherever a local root is told from a remote one (the
    CLI's arguments, copy records, conversions, tiers: maintainer review M6).
    """
    rest = text.removeprefix("file://")
    return None if "://" in rest else rest


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
    local = local_path(text)
    if local is None:
        opener = _opener(text.split("://", 1)[0])
        if opener is not None:  # check_root_url found it
            return opener(text)
    return LocalStorage(text if local is None else local, create=create)


def open_process_spec(spec: Mapping[str, Any]) -> Storage:
    """Open the root that :meth:`Storage.process_spec` described (in another process).

    Raises:
        UsageError: the document names no known backend.

    """
    kind = spec.get("kind")
    if kind == "url":  # a registered scheme's backend, opened again from its URL
        url = str(spec["url"])
        if local_path(url) is not None:
            # A path opened the local directory, not the backend: a writer process committed
            # where the backend never looks (backend review B1).
            raise UsageError(
                f"storage description {{'kind': 'url', 'url': {url!r}}}: a 'url' names a root "
                "of a registered scheme (scheme://...), not a path; give the backend a URL "
                "scheme and return it (docs/storage-backends.md)"
            )
        return open_storage(url)
    if kind == "local":
        return LocalStorage(str(spec["root"]))
    if kind == "s3":
        from portable_ckpt.storage.s3 import S3Options, S3Storage

        options = S3Options(**dict(spec["options"]))
        return S3Storage(str(spec["bucket"]), str(spec["prefix"]), options=options)
    raise UsageError(f"storage description names no known backend: {kind!r}")
