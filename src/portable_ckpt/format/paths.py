"""Path rules of the format: every path in a document stays inside its attempt directory."""

from __future__ import annotations

import re

from portable_ckpt.errors import PathUnsafeError

__all__ = ["MAX_COMPONENTS", "check_relative_path", "join"]

_COMPONENT = re.compile(r"^[A-Za-z0-9._-]{1,255}\Z")
# The whole rule as one expression (fast path for the thousands of paths of a large manifest);
# anything it rejects goes through the step-by-step checks below, which explain the failure.
_SAFE_PATH = re.compile(r"(?:(?!\.\.?/)[A-Za-z0-9._-]{1,255}/){0,7}(?!\.\.?$)[A-Za-z0-9._-]{1,255}")
#: Maximum number of components of a path inside an attempt.
MAX_COMPONENTS = 8


def check_relative_path(path: object, *, what: str = "path") -> str:
    """Validate a relative path taken from a document and return it.

    Rules (spec §Paths): a string of at most ``MAX_COMPONENTS`` components separated by ``/``,
    each matching ``[A-Za-z0-9._-]{1,255}`` and not ``.`` or ``..``; no leading ``/``.

    Raises:
        PathUnsafeError: when any rule is broken.

    """
    if isinstance(path, str) and len(path) <= 4096 and _SAFE_PATH.fullmatch(path):
        return path
    if not isinstance(path, str) or not path:
        raise PathUnsafeError(f"{what} must be a non-empty string, got {path!r}")
    if len(path) > 4096:
        raise PathUnsafeError(f"{what} is longer than 4096 characters")
    if path.startswith("/") or "\\" in path:
        raise PathUnsafeError(
            f"{what} {path!r} is absolute or contains a backslash; paths are relative to the attempt",
            path=path,
        )
    parts = path.split("/")
    if len(parts) > MAX_COMPONENTS:
        raise PathUnsafeError(
            f"{what} {path!r} has more than {MAX_COMPONENTS} components", path=path
        )
    for part in parts:
        if part in (".", "..") or not _COMPONENT.match(part):
            raise PathUnsafeError(
                f"{what} {path!r} has an unsafe component {part!r} (allowed: [A-Za-z0-9._-], "
                "not '.' or '..')",
                path=path,
            )
    return path


def join(*parts: str) -> str:
    """Join relative path pieces with ``/``, skipping empty ones."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))
