"""Entry point of ``portable-ckpt``: finds every ``cmd_*`` module and lets it add subcommands.

Exit codes: 0 success, 1 a checkpoint problem (the error's code is printed), 2 usage errors.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from portable_ckpt import __version__
from portable_ckpt.errors import CheckpointError, UsageError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """Build the parser with every subcommand module found in this package."""
    parser = argparse.ArgumentParser(
        prog="portable-ckpt",
        description="Versioned, sharded, portable training checkpoints (format 1.0).",
    )
    parser.add_argument("--version", action="version", version=f"portable-ckpt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    import portable_ckpt.cli as pkg

    for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if mod.name.startswith("cmd_"):
            module = importlib.import_module(f"portable_ckpt.cli.{mod.name}")
            module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"portable-ckpt: {exc}", file=sys.stderr)
        return 2
    except CheckpointError as exc:
        print(f"portable-ckpt: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
