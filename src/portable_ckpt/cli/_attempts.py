"""Attempts without a commit record that hold every writer's index, as ``ls`` and ``verify`` name them.

A save cut short at its commit, or a version whose ``manifest.json`` was lost: a restore names
it among what it passed over (reason ``uncommitted``); ``ls`` and ``verify ROOT --all`` name the
newest few on stderr with the recommit that brings one back.
"""

from __future__ import annotations

import sys
from typing import Any

from portable_ckpt.cli._text import safe

__all__ = ["say_uncommitted", "uncommitted"]


def say_uncommitted(found: list[Any]) -> None:
    """Name, on stderr, the newest attempts without a commit record that hold every index.

    Attempts above every committed step: a save cut short at its commit, or a version whose
    record was lost. A restore names them (``passed_over``, reason ``uncommitted``); ``ls`` said nothing, so
    an operator looking at a root after an incident did not learn that a newer step may be
    brought back (on-call review 23, N5). A save in progress may be one for a moment.
    """
    for v in found:
        print(f"portable-ckpt: {v.id}: no commit record, but every writer's index (a save "
              "in progress or cut short at its commit, or a version whose record was lost): "
              f"if it was committed, `portable-ckpt recommit {safe(v.path)} --was-committed` "
              "brings it back", file=sys.stderr)


def uncommitted(storage: Any, versions: list[Any]) -> list[Any]:
    """The newest few attempts above every committed step without record, with every index.

    What ``ls`` and ``verify ROOT --all`` name (:func:`say_uncommitted`).
    """
    from portable_ckpt.io.recommit import every_writer_indexed

    top = max((v.step for v in versions if v.status == "committed"), default=-1)
    newer = [v for v in versions if v.status == "incomplete" and v.step > top
             and not v.being_deleted]
    # the newest few: each costs a listing
    return [v for v in newer[-3:] if every_writer_indexed(storage, v.id)]
