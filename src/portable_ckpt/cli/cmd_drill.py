"""``portable-ckpt drill CKPT --world-size M``: restore a version on M fresh processes and record it."""

from __future__ import annotations

import argparse
import json
from typing import Any

from portable_ckpt.cli import _args as A
from portable_ckpt.cli._output import EXIT_RETRY, progress_bar
from portable_ckpt.cli._text import safe
from portable_ckpt.errors import UsageError

__all__ = ["register"]


def _run(args: argparse.Namespace) -> int:
    try:
        from portable_ckpt.torch.drill import drill
    except ImportError as e:  # torch is an optional dependency: said on stderr, exit 2
        raise UsageError(f"drill needs torch: pip install 'portable-ckpt[torch]' ({e})") from None
    with progress_bar(args, f"drill on {args.world_size} ranks", unit="rank") as bar:
        rec: dict[str, Any] = drill(
            args.ckpt,
            args.world_size,
            step=args.step,
            factory=args.factory,
            record=not args.no_record,
            timeout=args.timeout,
            progress=bar,
        )
    unstored = rec.get("record_error")
    # Not stored: the command did not do what was asked (75 where it may pass, as verify).
    rc = 1 if not rec["ok"] else (0 if unstored is None else
                                  EXIT_RETRY if unstored["retryable"] else 1)
    if args.json:
        print(json.dumps(rec, indent=2))
        return rc
    status = "PASSED" if rec["ok"] else "FAILED"
    print(
        f"drill {status}: {rec['attempt_id']} (step {rec['step']}) saved on {rec['saved_world_size']} "
        f"ranks, restored on {rec['world_size']} (contract {safe(rec['contract'])})"
    )
    m = rec["measurements"]
    if rec["ok"]:
        print(
            f"  restore {m['restore_seconds']:.3f} s, {m['restore_bytes']} bytes read, "
            f"{m['restore_mib_per_s']:.1f} MiB/s; slowest rank {m['slowest_rank_seconds']:.3f} s; "
            f"first post-restore step {m['first_step_seconds']:.3f} s"
        )
        print(f"  peak temporary memory per rank: {m['peak_temp_bytes_per_rank']} bytes")
    else:
        print(f"  error: [{safe(rec['error']['code'])}] {safe(rec['error']['message'])}")
    if rec.get("path"):
        print(f"  record: {safe(rec['path'])}")
    if unstored is not None:
        print(f"  the drill record was NOT stored: [{safe(unstored['code'])}] "
              f"{safe(unstored['message'])} (gc and managers do not know this drill; run it "
              "again once the root can be written, or with --no-record to drill without "
              "writing)")
    if rec.get("verification"):  # damage a second read confirmed: never restored again
        print(f"  damage recorded as a failed verification: {safe(rec['verification'])} "
              "(managers no longer restore this version; see docs/recovery.md)")
    return rc


def register(subparsers: Any) -> None:
    """Add the ``drill`` subcommand."""
    p = subparsers.add_parser(
        "drill",
        help="restore a version on M fresh processes, run one step, record the drill",
        description=(
            "Starts a fresh local gloo group of --world-size processes, restores the version into "
            "freshly allocated state (from the checkpoint's metadata, or --factory module:function), "
            "runs one step, and stores drills/<drill-id>.json beside the manifest with restore "
            "bandwidth, slowest rank, peak temporary memory per rank and time to the first step."
        ),
    )
    p.add_argument(
        "ckpt", type=A.root_url,
        help="checkpoint root (the version a restore takes: the newest no verification failed) "
        "or version directory",
    )
    p.add_argument(
        "--world-size",
        type=A.int_range(1, A.MAX_LOCAL_RANKS, "world-size"),
        required=True,
        help=f"ranks of the drill group (processes on this machine, 1-{A.MAX_LOCAL_RANKS})",
    )
    p.add_argument(
        "--step", type=A.step, default=None, help="with a root: drill this step's newest version"
    )
    p.add_argument(
        "--factory",
        type=A.factory_spec,
        default=None,
        help="module:function building (state[, step_fn]) per rank",
    )
    p.add_argument(
        "--timeout",
        type=A.positive_seconds,
        default=600.0,
        help="seconds before the group is killed (default 600)",
    )
    p.add_argument("--no-record", action="store_true", help="do not store the drill record")
    p.add_argument("--json", action="store_true", help="print the record as JSON")
    p.set_defaults(func=_run)
