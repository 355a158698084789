#!/usr/bin/env python3
"""Adapter of the reference reader (``portable_ckpt.open``) for the golden vectors.

Usage: ``python conformance/adapters/reference_reader.py JOB.json``, the job
``{"op": "read", "target", "verification_status"}`` (conformance/README.md, "reader"). Opens
``target`` (a root: its latest version; or a version directory), reads every tensor whole
(``read`` verifies every checksum block it reads, R-CKSUM-3) and every entry (each rank of a
per-rank entry at the saved world size) and prints one line::

    {"ok": true, "attempt_id", "step", "tensors": {key: {"dtype", "shape", "hex"}},
     "entries": {name: value or {"per_rank": {"<rank>": value}}}, "failed_verification"}

or ``{"ok": false, "code": "PCK-...", "message": "..."}`` for a ``CheckpointError``. It exits 0
either way; anything else (a bug of the reader) ends in a traceback and exit 1, which the
harness reports as a crash.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

import portable_ckpt
from portable_ckpt.errors import CheckpointError


def _tensor(ck: Any, key: str) -> dict[str, Any]:
    t = ck.tensors[key]
    arr = np.ascontiguousarray(ck.read(key))
    if arr.dtype.byteorder == ">":  # the protocol's bytes are little-endian
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return {"dtype": t.dtype, "shape": [int(n) for n in t.shape], "hex": arr.tobytes().hex()}


def _entry(ck: Any, name: str) -> Any:
    e = ck.entries[name]
    if e.scope == "global":
        return ck.entry(name)
    ranks = range(ck.continuation.world_size)
    return {"per_rank": {str(r): ck.entry(name, rank=r) for r in ranks}}


def _failed_verification(target: Path, attempt: str) -> bool | None:
    """Whether the version failed verification (``None``: its status is unknown, R-DRILL-12).

    What a tool restoring automatically decides on it (``restore_decision``): take it (not
    failed), skip it (failed) or stop (its verification records cannot be read).
    """
    from portable_ckpt.io.versions import list_versions, restore_decision

    root = target if target.name != attempt else target.parent
    (info,) = [v for v in list_versions(str(root)) if v.id == attempt]
    decision = restore_decision(info)
    return None if decision == "stop" else decision == "skip"


def read(job: dict[str, Any]) -> dict[str, Any]:
    """The protocol's result line for ``job``."""
    target = Path(job["target"])
    try:
        with warnings.catch_warnings():  # a newer attempt passed over: said on stderr only
            warnings.simplefilter("ignore")
            ck = portable_ckpt.open(str(target))
        out: dict[str, Any] = {
            "ok": True, "attempt_id": ck.id, "step": ck.step,
            "tensors": {key: _tensor(ck, key) for key in ck.tensors},
            "entries": {name: _entry(ck, name) for name in ck.entries},
        }
        if job.get("verification_status"):
            out["failed_verification"] = _failed_verification(target, ck.id)
        return out
    except CheckpointError as exc:
        return {"ok": False, "code": exc.code, "message": str(exc)}


def main(argv: list[str]) -> int:
    """Run the job of ``argv[-1]``; 0 once the result line is printed."""
    if len(argv) < 2:
        print("usage: reference_reader.py JOB.json", file=sys.stderr)
        return 2
    with open(argv[-1], encoding="utf-8") as f:
        job = json.load(f)
    if job.get("op") != "read":
        print(f"reference_reader.py: not a read job: {argv[-1]}", file=sys.stderr)
        return 2
    print(json.dumps(read(job), ensure_ascii=False, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
