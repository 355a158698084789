"""``portable-ckpt pin CKPT`` and ``unpin CKPT``: keep a version from every gc (spec §15.3)."""

from __future__ import annotations

import argparse
import getpass
import json
import socket
from typing import Any

from portable_ckpt.cli import _args as A
from portable_ckpt.cli._text import safe
from portable_ckpt.errors import NotFoundError

__all__ = ["register"]


def _who() -> str:
    """``user@host`` of this process, for a pin's ``by`` (whoever runs the tool)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's numeric uid)
        user = "?"
    return f"{user}@{socket.gethostname()}"[:256]


def _pin(args: argparse.Namespace) -> int:
    import portable_ckpt
    from portable_ckpt.io.pins import pin

    storage, attempt, manifest = portable_ckpt._resolve(args.ckpt, args.step)
    rel = pin(storage, attempt, reason=args.reason, by=args.by if args.by is not None else _who())
    if args.json:
        print(json.dumps({"attempt_id": attempt, "step": manifest.step, "pin": rel}, indent=2))
    else:
        print(f"pinned {attempt} (step {manifest.step}): every gc keeps it until "
              f"`portable-ckpt unpin`; record {safe(storage.url.rstrip('/'))}/{rel}")
    return 0


def _unpin(args: argparse.Namespace) -> int:
    from portable_ckpt.io.pins import unpin

    storage, attempt, step = _unpin_target(args)
    removed = unpin(storage, attempt)
    if args.json:
        print(json.dumps({"attempt_id": attempt, "step": step, "removed": removed}, indent=2))
    elif removed:
        print(f"unpinned {attempt} (step {step}): {len(removed)} pin record(s) removed; "
              "retention applies to it again (a running CheckpointManager with pin_kept pins "
              "again what its policy keeps)")
    else:
        print(f"{attempt} (step {step}) was not pinned")
    return 0


def _unpin_target(args: argparse.Namespace) -> tuple[Any, str, int]:
    """The storage, attempt id and step of what ``unpin`` names.

    A version directory is taken by its name: its pins are removed also when its commit record
    is damaged or gone (attack review 5 F6: such a pinned version could be freed by no tool).
    """
    import portable_ckpt
    from portable_ckpt.format.naming import parse_attempt_step
    from portable_ckpt.storage import open_storage, root_text

    text = root_text(args.ckpt)
    split = portable_ckpt._split_version(text)
    if split is None:
        storage, attempt, manifest = portable_ckpt._resolve(args.ckpt, args.step)
        return storage, attempt, int(manifest.step)
    root, attempt = split
    step = parse_attempt_step(attempt) or 0  # the name matched the attempt id pattern
    if args.step is not None and args.step != step:
        raise NotFoundError(f"{text} is the version of step {step}, not {args.step}: drop --step")
    return open_storage(root), attempt, step


def register(subparsers: Any) -> None:
    """Add the ``pin`` and ``unpin`` subcommands."""
    for name, func, what in (
        ("pin", _pin, "pin a committed version: every gc keeps it until it is unpinned"),
        ("unpin", _unpin, "remove a version's pins: retention applies to it again"),
    ):
        p = subparsers.add_parser(
            name,
            help=what,
            description=(
                f"{what[0].upper()}{what[1:]}. Pins are records pins/<pin-id>.json at the root "
                "(spec §15.3): a pinned version takes no place among gc's --keep, is never "
                "retired or deleted, and readers never see the pins. Give a version directory, "
                "or a root (its latest version, or --step's newest)."
            ),
        )
        p.add_argument("ckpt", type=A.root_url, help="checkpoint root or version directory")
        p.add_argument("--step", type=A.step, default=None,
                       help="with a root: the newest version of this step")
        if name == "pin":
            p.add_argument("--reason", type=A.bounded_text(1024, "reason"), default=None,
                           help="why it is kept (shown by ls --json; at most 1,024 characters)")
            p.add_argument("--by", type=A.bounded_text(256, "by"), default=None,
                           help="who pinned it (default: user@host of this process)")
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        p.set_defaults(func=func)
