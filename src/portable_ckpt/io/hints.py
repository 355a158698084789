"""The commands a message gives to bring a version back: one wording, quoted for a shell.

A version a verification failed comes back in one of two ways (docs/recovery.md): its damaged
files are replaced by intact copies and a deep pass clears the failures (spec §14.5,
R-DRILL-10), or the whole version is set aside and copied back from a root that holds a
verified copy (spec §14.4). The CLI, ``copy`` and the manager's restore give these steps; a
message that wrote them in its own words told them differently (maintainer review 4, 11).
"""

from __future__ import annotations

import shlex

__all__ = ["clear_failed", "copy_back", "copy_back_commands"]


def _command(*words: str) -> str:
    return " ".join(["portable-ckpt", *(shlex.quote(w) for w in words)])


def clear_failed(path: str) -> str:
    """``verify PATH --deep --clear-failed``: after a damaged file was replaced (§14.5)."""
    return _command("verify", path, "--deep", "--clear-failed")


def copy_back_commands(path: str, copy_root: str) -> list[str]:
    """The copy of version ``path`` back from the root ``copy_root``, then its deep verify."""
    root, _, ident = path.rstrip("/").rpartition("/")
    return [_command("copy", f"{copy_root.rstrip('/')}/{ident}", root),
            _command("verify", path, "--deep")]


def copy_back(path: str, copy_root: str) -> str:
    """The steps that replace version ``path`` by its verified copy at ``copy_root``."""
    copy, verify = copy_back_commands(path, copy_root)
    return (f"set {shlex.quote(path)} aside (move it out of the root), then `{copy}`, then "
            f"`{verify}`")
