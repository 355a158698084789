"""``portable-ckpt demo``: FSDP2 training on CPU, save, stop every process, resume on another size."""

from __future__ import annotations

import argparse
import json
from typing import Any

from portable_ckpt.cli import _args as A
from portable_ckpt.errors import UsageError
from portable_ckpt.format.vocab import CODECS

__all__ = ["register"]


def _check(args: argparse.Namespace) -> str | None:
    """Checks between arguments (before anything runs)."""
    if not args.save_step < args.steps:
        return f"--save-step ({args.save_step}) must be below --steps ({args.steps})"
    return None


def _run(args: argparse.Namespace) -> int:
    try:
        from portable_ckpt.torch.demo import DemoConfig, run_demo
    except ImportError as e:  # torch is an optional dependency: said on stderr, exit 2
        raise UsageError(f"demo needs torch: pip install 'portable-ckpt[torch]' ({e})") from None
    cfg = DemoConfig(
        ranks=args.ranks,
        resume_ranks=args.resume_ranks,
        steps=args.steps,
        save_step=args.save_step,
        hidden=args.hidden,
        layers=args.layers,
        batch=args.batch,
        seed=args.seed,
        out=args.out,
        root=args.root,
        same_size=not args.no_same_size,
        codec=args.codec,
    )
    report: dict[str, Any] = run_demo(cfg)
    if args.json:
        print(json.dumps({k: report[k] for k in ("ok", "seconds", "checks", "manifest")}, indent=2))
    return 0 if report["ok"] else 1


def register(subparsers: Any) -> None:
    """Add the ``demo`` subcommand."""
    p = subparsers.add_parser(
        "demo",
        help="train with FSDP2 on CPU, save, kill every process, resume on another rank count",
        description=(
            "Trains a small MLP with FSDP2 (fully_shard) on CPU/gloo on --ranks processes with "
            "AdamW, an LR schedule, a gradient scaler, RNG and a data cursor; saves at --save-step "
            "(async); all processes exit; fresh groups of --ranks and --resume-ranks processes "
            "restore and continue; the results are compared with the uninterrupted run. Writes "
            "demo-report.json and loss.png into --out."
        ),
    )
    ranks = A.int_range(1, A.MAX_LOCAL_RANKS, "ranks")
    p.add_argument("--ranks", type=ranks, default=4, help="world size of the first run (default 4)")
    p.add_argument(
        "--resume-ranks", type=ranks, default=3, help="world size of the resized resume (default 3)"
    )
    steps = A.int_range(1, 10**6, "steps")
    p.add_argument("--steps", type=steps, default=12, help="total optimizer steps (default 12)")
    p.add_argument(
        "--save-step", type=steps, default=6, help="save after this step, < --steps (default 6)"
    )
    p.add_argument(
        "--hidden", type=A.int_range(1, 1 << 16, "hidden"), default=50,
        help="hidden width (default 50: uneven shards)",
    )
    p.add_argument(
        "--layers", type=A.int_range(1, 64, "layers"), default=2, help="hidden layers (default 2)"
    )
    p.add_argument(
        "--batch", type=A.int_range(1, 1 << 20, "batch"), default=24,
        help="global batch size (default 24)",
    )
    p.add_argument("--seed", type=A.int_range(0, 2**63 - 1, "seed"), default=1234)
    p.add_argument("--codec", choices=CODECS, default="none")
    p.add_argument("--out", default="demo-output", help="output directory (default ./demo-output)")
    p.add_argument(
        "--root", type=A.new_root, default=None,
        help=(
            "checkpoint root (default <out>/checkpoints); each run starts it empty: a root an "
            "earlier demo run made is emptied, one holding anything else is refused"
        ),
    )
    p.add_argument("--no-same-size", action="store_true", help="skip the same-size (exact) resume")
    p.add_argument("--json", action="store_true", help="also print the summary as JSON")
    p.set_defaults(func=_run, check=_check)
