#!/usr/bin/env python3
"""Adapter of the reference implementation (portable_ckpt) for the writer harness.

Usage: ``python conformance/adapters/reference_writer.py JOB.json`` (protocol in
conformance/README.md). Fault points (``fail_at``) are injected by wrapping the storage object:
the process ends with ``os._exit(3)`` at the requested point, without any cleanup, exactly as a
crash would leave things. A job's ``tensor_table`` request (format 1.1) is passed on: the writer
then describes its records in a writer-index table and the committer publishes a manifest table.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from portable_ckpt.errors import CheckpointError
from portable_ckpt.format.dtypes import numpy_dtype
from portable_ckpt.format.manifest import Continuation, Mesh
from portable_ckpt.io.commit import commit
from portable_ckpt.io.writer import ShardWriter
from portable_ckpt.storage import open_storage

CRASH = 3


def _crash() -> None:
    sys.stdout.flush()
    os._exit(CRASH)


class _PartialWriter:
    """Stream writer that writes half of the first piece, closes, then crashes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def write(self, data: Any) -> None:
        mv = memoryview(data).cast("B")
        self.inner.write(mv[: max(1, len(mv) // 2)])
        self.inner.close()
        _crash()

    def close(self) -> None:
        self.inner.close()

    def abort(self) -> None:
        self.inner.abort()

    def __enter__(self) -> _PartialWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _inject(storage: Any, fail_at: str | None) -> None:
    """Wrap ``storage``'s methods so that the process crashes at ``fail_at``."""
    if fail_at is None:
        return
    open_writer, put, create = storage.open_writer, storage.put, storage.create_if_absent

    def is_data(path: str) -> bool:
        return "/data/" in path

    def is_index(path: str) -> bool:
        return "/index/" in path

    def open_writer_hook(path: str) -> Any:
        if fail_at == "mid_data" and is_data(path):
            return _PartialWriter(open_writer(path))
        if fail_at in ("after_data", "mid_data") and is_index(path):
            _crash()  # mid_data without any data file: fail where the data would have been
        return open_writer(path)

    def put_hook(path: str, data: Any) -> None:
        if fail_at in ("after_data", "mid_data") and is_index(path):
            _crash()
        put(path, data)

    def create_hook(path: str, data: bytes) -> bool:
        if path.endswith("/manifest.json"):
            if fail_at == "temp_written":
                put(f"{path}.00000000deadbeef.tmp", data)
                _crash()
            if fail_at == "before_publish":
                _crash()
        return bool(create(path, data))

    storage.open_writer, storage.put, storage.create_if_absent = (
        open_writer_hook, put_hook, create_hook)


def write(job: dict[str, Any], jobdir: Path) -> None:
    """Run a write job."""
    if job.get("fail_at") == "before_data":
        _crash()
    storage = open_storage(job["root"], create=True)
    _inject(storage, job.get("fail_at"))
    w = ShardWriter(storage, job["attempt_id"], writer=job["writer"], codec=job["codec"],
                    block_size=job.get("block_size", 4096),
                    tensor_table=bool(job.get("tensor_table")))
    for t in job["tensors"]:
        dt = numpy_dtype(t["dtype"])
        if not t["chunks"]:
            w.declare_tensor(t["key"], t["dtype"], t["shape"])
        for ch in t["chunks"]:
            raw = (jobdir / ch["data"]).read_bytes()
            arr = np.frombuffer(raw, dtype=dt.newbyteorder("<")).reshape(ch["lengths"])
            w.add_tensor(t["key"], arr, offsets=ch["offsets"], global_shape=t["shape"])
    for e in job["entries"]:
        w.add_entry(e["name"], e["value"], schema=e["schema"], scope=e["scope"],
                    rank=e.get("rank"), world_size_policy=e.get("world_size_policy"),
                    compress=e["encoding"] == "json+zstd")
    w.finish()


def do_commit(job: dict[str, Any]) -> None:
    """Run a commit job."""
    storage = open_storage(job["root"], create=False)
    _inject(storage, job.get("fail_at"))
    c = job["continuation"]
    mesh = Mesh(shape=c["mesh"]["shape"], dim_names=c["mesh"]["dim_names"]) if c["mesh"] else None
    commit(storage, job["attempt_id"], step=job["step"], indexes=None,
           expected_writers=job["writers"],
           continuation=Continuation(contract=c["contract"], world_size=c["world_size"],
                                     mesh=mesh),
           tensor_table=True if job.get("tensor_table") else None)


def main(argv: list[str]) -> int:
    """Entry point: ``reference_writer.py JOB.json``."""
    path = Path(argv[1])
    job = json.loads(path.read_text(encoding="utf-8"))
    try:
        if job["phase"] == "write":
            write(job, path.parent)
        elif job["phase"] == "commit":
            do_commit(job)
        else:
            print(json.dumps({"error": {"code": "PCK-USAGE", "message": "unknown phase"}}))
            return 2
    except CheckpointError as exc:
        print(json.dumps({"error": exc.to_json()}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
