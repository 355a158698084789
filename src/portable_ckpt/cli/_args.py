"""Argument types of every subcommand: each value is checked while parsing, before anything runs.

argparse turns a ``type=`` function's ``ArgumentTypeError`` into a usage message and exit 2, so a
bad value never reaches a checkpoint (``gc --grace nan`` used to delete a save in progress,
``copy CKPT s3://`` copied into a local folder ``s3:``, ``drill --world-size 100000000`` started
processes). Checks that need two arguments are the subcommand's ``check`` (``set_defaults(check=
...)``), which ``cli/main.py`` runs after parsing, also before anything is touched.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable

from portable_ckpt.errors import UsageError

__all__ = [
    "MAX_LOCAL_RANKS",
    "bounded_text",
    "factory_spec",
    "fraction",
    "grace_seconds",
    "root_only",
    "int_range",
    "new_root",
    "positive_seconds",
    "root_url",
    "shard_size",
    "step",
]

#: Most processes a local drill or demo group may start (they all run on this machine).
MAX_LOCAL_RANKS = 256
_MAX_STEP = 999_999_999_999


def int_range(lo: int, hi: int, what: str) -> Callable[[str], int]:
    """An integer in ``[lo, hi]``."""

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be an integer, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{what} must be between {lo} and {hi}, got {value}")
        return value

    parse.__name__ = what  # argparse names the type in its messages
    return parse


#: A training step: 0 to 999,999,999,999 (spec §3).
step = int_range(0, _MAX_STEP, "step")


def bounded_text(most: int, what: str) -> Callable[[str], str]:
    """A text of at most ``most`` characters."""

    def parse(text: str) -> str:
        if len(text) > most:
            raise argparse.ArgumentTypeError(
                f"{what} must be at most {most} characters, got {len(text)}")
        return text

    parse.__name__ = what
    return parse


def _finite(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{what} must be a finite number, got {text!r}")
    return value


def grace_seconds(text: str) -> float:
    """A grace period: finite seconds >= 0 (NaN and negative values would delete saves)."""
    value = _finite(text, "grace")
    if value < 0:
        raise argparse.ArgumentTypeError(f"grace must be >= 0 seconds, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """A timeout: finite seconds > 0."""
    value = _finite(text, "timeout")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"timeout must be > 0 seconds, got {text!r}")
    return value


def fraction(text: str) -> float:
    """A fraction in (0, 1]."""
    value = _finite(text, "fraction")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"fraction must be in (0, 1], got {text!r}")
    return value


def _checked(check: Callable[[str], object], text: str) -> str:
    """``text`` once ``check`` accepted it; its ``UsageError`` becomes a usage message."""
    try:
        check(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


def root_url(text: str) -> str:
    """A root or version: a local path, ``file://`` path, or ``s3://BUCKET[/PREFIX]``."""
    from portable_ckpt.storage import check_root_url

    return _checked(check_root_url, text)


def _version_dir(text: str) -> str | None:
    """The local path ``text`` names when it is a version directory (an attempt), else None."""
    from portable_ckpt.io.versions import enclosing_version

    return enclosing_version(text)


def root_only(text: str) -> str:
    """A root (as :func:`root_url`), never a version directory.

    ``ls`` or ``gc`` of a version directory found nothing and exited 0, which a script reads as
    "no checkpoints".
    """
    root_url(text)
    version = _version_dir(text)
    if version is not None:
        raise argparse.ArgumentTypeError(
            f"{text} is a version directory or lies in one ({version}), not a root: pass its "
            f"root ({os.path.dirname(version)}); `portable-ckpt inspect {version}` shows this "
            "version"
        )
    return text


def new_root(text: str) -> str:
    """A destination root: like :func:`root_url`, and not an existing non-directory file."""
    from portable_ckpt.storage import local_path

    root_url(text)
    if _version_dir(text) is not None:
        raise argparse.ArgumentTypeError(
            f"{text} is a version directory of another root or lies in one; a destination "
            "root is a directory that holds versions, or s3://BUCKET/PREFIX"
        )
    local = local_path(text)
    if local is not None and os.path.lexists(local) and not os.path.isdir(local):
        raise argparse.ArgumentTypeError(
            f"{text} exists and is not a directory; a destination root is a directory or "
            "s3://BUCKET/PREFIX"
        )
    return text


_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def factory_spec(text: str) -> str:
    """``module:function`` (imported only when the command runs)."""
    if not _FACTORY.match(text):
        raise argparse.ArgumentTypeError(f"factory must be MODULE:FUNCTION, got {text!r}")
    return text


def shard_size(text: str) -> str:
    """A size such as ``5GB``, ``2GiB`` or ``1048576`` (parsed again by the converter)."""
    from portable_ckpt.convert.hf import parse_size

    return _checked(parse_size, text)
