"""Job files of the adapter protocol (conformance/README.md, "The adapter protocol")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from conformance.cases import SaveCase, rank_writer

__all__ = ["PROTOCOL", "commit_job", "write_jobs"]

PROTOCOL = "portable-ckpt-writer-job/1"


def _per_writer(case: SaveCase, jobdir: Path) -> list[dict[str, Any]]:
    """What each writer stores: its chunks (raw files written below ``jobdir``) and entries."""
    per: list[dict[str, Any]] = [{"tensors": [], "entries": []} for _ in range(case.num_writers)]
    for ti, t in enumerate(case.tensors):
        full = t.data()
        chunks: dict[int, list[dict[str, Any]]] = {}
        for bi, (offs, lens, w) in enumerate(t.boxes):
            sl = tuple(slice(o, o + n) for o, n in zip(offs, lens, strict=True))
            rel = f"chunks/w{w}-t{ti}-b{bi}.bin"
            (jobdir / rel).parent.mkdir(exist_ok=True)
            (jobdir / rel).write_bytes(np.ascontiguousarray(full[sl]).tobytes())
            chunks.setdefault(w, []).append({"offsets": offs, "lengths": lens, "data": rel})
        if not t.boxes:
            chunks[t.declared_by] = []
        for w, ch in chunks.items():
            per[w]["tensors"].append({"key": t.key, "dtype": t.dtype, "shape": t.shape,
                                      "chunks": ch})
    for e in case.entries:
        base = {"name": e.name, "schema": e.schema, "scope": e.scope, "encoding": e.encoding}
        if e.scope == "global":
            per[e.writer]["entries"].append({**base, "value": e.value})
        else:
            for r, v in enumerate(e.values):  # rank r of the job's world size
                per[rank_writer(r, case.num_writers)]["entries"].append({**base, "rank": r, "world_size_policy": e.policy,
                                          "value": v})
    return per


def write_jobs(case: SaveCase, jobdir: Path, root: Path, attempt_id: str,
               fail_at: dict[int, str] | None = None) -> list[Path]:
    """Write one job file (and its raw chunk files) per writer; return their absolute paths."""
    jobdir.mkdir(parents=True, exist_ok=True)
    per = _per_writer(case, jobdir)
    paths = []
    for w in range(case.num_writers):
        job = {"protocol": PROTOCOL, "phase": "write", "root": str(root), "attempt_id": attempt_id,
               "step": case.step, "writer": w, "num_writers": case.num_writers,
               "world_size": case.ranks(), "codec": case.codec, "block_size": 4096,
               "tensor_table": case.tensor_table, "table_codec": case.table_codec,
               **per[w], "fail_at": (fail_at or {}).get(w)}
        p = jobdir / f"write-w{w}.json"
        p.write_text(json.dumps(job, indent=1))
        paths.append(p.resolve())
    return paths


def commit_job(case: SaveCase, jobdir: Path, root: Path, attempt_id: str,
               fail_at: str | None = None, name: str = "commit.json") -> Path:
    """Write the commit job file; return its absolute path."""
    jobdir.mkdir(parents=True, exist_ok=True)
    job = {"protocol": PROTOCOL, "phase": "commit", "root": str(root), "attempt_id": attempt_id,
           "step": case.step, "writers": list(range(case.num_writers)),
           "continuation": case.continuation(),
           "tensor_table": case.tensor_table, "table_codec": case.table_codec,
           "fail_at": fail_at}
    p = jobdir / name
    p.write_text(json.dumps(job, indent=1))
    return p.resolve()
