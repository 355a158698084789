"""``portable-ckpt recommit ROOT/ID``: a new commit record for a version whose record was lost.

The data files and writer indexes of a committed version outlived its ``manifest.json`` and no
copy holds one (docs/recovery.md): the record is built again from the indexes with every check
of a commit, the continuation contract ``statistical`` (spec §15.4).
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from portable_ckpt.cli import _args as A
from portable_ckpt.cli._text import safe
from portable_ckpt.errors import UsageError

__all__ = ["register"]


def _recommit(args: argparse.Namespace) -> int:
    from portable_ckpt.format.naming import ATTEMPT_ID_RE
    from portable_ckpt.io.recommit import recommit
    from portable_ckpt.io.versions import root_must_exist
    from portable_ckpt.storage import open_storage

    root, _, ident = args.ckpt.rstrip("/").rpartition("/")
    if not (root and ATTEMPT_ID_RE.match(ident)):
        root_must_exist(open_storage(args.ckpt))  # a path that is not there: PCK-NOT-FOUND
        raise UsageError("recommit names the version: ROOT/ID (a version directory)")
    storage = open_storage(root)  # (recommit says a missing root, or attempt, by its name)
    m = recommit(storage, ident, world_size=args.world_size, was_committed=args.was_committed,
                 copies_lost=args.copies_lost, newest_of_step=args.newest_of_step)
    path = f"{root}/{ident}"
    # What the new record vouches for, to compare with what the job saved (on-call review 4,
    # R7: a forged extra index is merged like any writer's).
    # Writer indexes only (a tensor-table version lists its tables there too: Q3).
    writers = sorted(p for p in m.files if re.fullmatch(r"index/w[0-9]{5,}\.json", p))
    summary = {"writers": len(writers), "tensors": len(m.tensors), "entries": len(m.entries),
               "files": len(m.files), "bytes": sum(f.size for f in m.files.values())}
    if args.json:
        print(json.dumps({"path": path, "attempt_id": ident, "step": m.step,
                          "committed_at": m.committed_at,
                          "continuation": m.continuation.to_json(), **summary}, indent=2))
    else:
        print(f"recommitted {safe(path)} (step {m.step}) from {summary['writers']} writer "
              f"indexes: {summary['tensors']} tensors, {summary['entries']} entries, "
              f"{summary['files']} files, {summary['bytes']} bytes; continuation statistical on "
              f"{m.continuation.world_size} rank(s). Check that this is what the job saved, "
              f"then verify every byte: `portable-ckpt verify {safe(path)} --deep`")
    return 0


def register(sub: Any) -> None:
    """Add ``recommit``."""
    p = sub.add_parser(
        "recommit",
        help="publish a new commit record for a version whose manifest.json was lost, from its "
        "writer indexes (exit 0 published, 1 refused: nothing written, or a record it published "
        "over files deleted meanwhile removed again)",
        description="A version whose commit record was lost after the commit (ls: invalid, "
        "PCK-MANIFEST-MISSING) and of which no copy holds one: its record is built again from "
        "every writer's index with every check of a commit (coverage, entries, file sizes, "
        "shard headers) and published create-if-absent. The continuation contract is "
        "'statistical' (the original is not in the indexes) and committed_at is now. A copy "
        "of the version elsewhere keeps the original record. Then run verify --deep.",
    )
    p.add_argument("ckpt", type=A.root_url, help="the version directory, ROOT/ID")
    p.add_argument("--world-size", type=A.int_range(1, 1 << 20, "world size"), default=None,
                   help="the continuation's world size (default: the ranks its per-rank "
                   "entries hold, else its number of writers)")
    p.add_argument("--was-committed", action="store_true",
                   help="publish also when no drill, copy or verification record shows the "
                   "version was ever committed (it is 'incomplete'): on your word that it was")
    p.add_argument("--copies-lost", action="store_true",
                   help="publish also when copy records name verified copies of the version "
                   "(their record is the one to put back): on your word that none is left")
    p.add_argument("--newest-of-step", action="store_true",
                   help="publish also when another committed version holds the same step: the "
                   "new record, dated now, makes this one the version of that step a restore "
                   "takes")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_recommit)
