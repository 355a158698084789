"""Faults injected by editing a job file before the adapter reads it (bad_writer, bad_reference).

Each edit is a defect a real writer or committer could have, expressed on the job it receives:
``with_job_edit(main, JOB_EDITS[mode])`` wraps an adapter's ``main``. A job the edit leaves as
it was is not rewritten: other writers of the same save may read it concurrently.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["JOB_EDITS", "with_job_edit"]

Edit = Callable[[dict[str, Any], Path], None]


def with_job_edit(main: Callable[[list[str]], int], edit: Edit) -> Callable[[list[str]], int]:
    """``main`` that first applies ``edit`` to its job file (``argv[1]``)."""
    def edited(argv: list[str]) -> int:
        path = Path(argv[1])
        job = json.loads(path.read_text())
        before = json.dumps(job)
        edit(job, path)
        if json.dumps(job) != before:
            path.write_text(json.dumps(job))
        return int(main(argv))
    return edited


def _ignore_fail(job: dict[str, Any], path: Path) -> None:
    job["fail_at"] = None


def _zstd_as_none(job: dict[str, Any], path: Path) -> None:
    if job["phase"] == "write":
        job["codec"] = "none"


def _json_zstd_as_json(job: dict[str, Any], path: Path) -> None:
    for e in job.get("entries", []):
        e["encoding"] = "json"


def _write_twice(job: dict[str, Any], path: Path) -> None:
    """Every writer but 0 stores writer 0's chunks too: a region written twice."""
    if job["phase"] != "write" or job["writer"] == 0:
        return
    mine = {t["key"]: t for t in job["tensors"]}
    for t in json.loads((path.parent / "write-w0.json").read_text())["tensors"]:
        if t["chunks"]:
            mine.setdefault(t["key"], {**t, "chunks": []})["chunks"] += t["chunks"]
    job["tensors"] = list(mine.values())


def _listing(job: dict[str, Any], path: Path) -> None:
    if job["phase"] == "commit":
        idx = Path(job["root"]) / job["attempt_id"] / "index"
        job["writers"] = sorted(int(p.name[1:6]) for p in idx.glob("w?????.json")) \
            if idx.is_dir() else []


def _drop_range(job: dict[str, Any], path: Path) -> None:
    if job["phase"] != "write" or job["writer"] != 0:
        return
    for t in job["tensors"]:
        if t["chunks"]:
            t["chunks"].pop()
            return


def _always_statistical(job: dict[str, Any], path: Path) -> None:
    if job["phase"] == "commit":
        job["continuation"]["contract"] = "statistical"


def _mesh_dropped(job: dict[str, Any], path: Path) -> None:
    if job["phase"] == "commit":
        job["continuation"]["mesh"] = None


def _mesh_invented(job: dict[str, Any], path: Path) -> None:
    c = job["continuation"] if job["phase"] == "commit" else None
    if c is not None and c["mesh"] is None:
        c["mesh"] = {"shape": [c["world_size"]], "dim_names": ["dp"]}


def _ws_from_writers(job: dict[str, Any], path: Path) -> None:
    """The committer takes the number of writers for the job's world size (outside review
    21b, finding 1): it records it and checks per-rank entries against it."""
    if job["phase"] == "commit":
        job["continuation"]["world_size"] = len(job["writers"])


def _true_as_1(value: Any) -> Any:
    if value is True:
        return 1
    if isinstance(value, dict):
        return {k: _true_as_1(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_true_as_1(v) for v in value]
    return value


def _schema_true_as_1(job: dict[str, Any], path: Path) -> None:
    """Embedded schemas recorded with ``1`` for ``true`` (equal in Python, not in JSON)."""
    for e in job.get("entries", []):
        if "json_schema" in e["schema"]:
            e["schema"] = _true_as_1(e["schema"])


def _as_float(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _as_float(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_as_float(x) for x in v]
    return float(v) if type(v) is int and abs(v) < 2**53 else v


def _int_as_float(job: dict[str, Any], path: Path) -> None:
    """Entry integers stored as floats (``3.0`` for ``3``: equal in Python, not in JSON)."""
    for e in job.get("entries", []):
        if "value" in e:
            e["value"] = _as_float(e["value"])


#: mode -> edit
JOB_EDITS: dict[str, Edit] = {
    "ignore-fail": _ignore_fail,  # fail_at ignored by writer and committer
    "zstd-as-none": _zstd_as_none,  # asked for zstd, stores none (the codec is binding)
    "json-zstd-as-json": _json_zstd_as_json,  # json+zstd entries stored and recorded as json
    "write-twice": _write_twice,  # a region stored by two writers (R-COMMIT-4: overlap)
    "listing-writers": _listing,  # expected writers from a listing of index/ (R-COMMIT-5)
    "drop-range": _drop_range,  # writer 0 leaves out one of its chunks
    # the committer records another continuation than the job's (R-CONTRACT-1)
    "always-statistical": _always_statistical,  # contract "statistical" whatever was asked
    "mesh-dropped": _mesh_dropped,  # the job's mesh is not recorded
    "mesh-invented": _mesh_invented,  # a mesh where the job has none
    "ws-from-writers": _ws_from_writers,  # world size = number of writers (R-COMMIT-5)
    "int-as-float": _int_as_float,  # entry integers stored as floats
    "schema-true-as-1": _schema_true_as_1,  # an entry's declaration is not the job's (JSON)
}
