"""Mutation audit 24b, conformance/jobs.py: every field of the job files, as the README's
"The adapter protocol" describes them (a writer reads nothing else)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from conformance.cases import EntrySpec, SaveCase, TensorSpec
from conformance.jobs import PROTOCOL, commit_job, write_jobs


def _case() -> SaveCase:
    return SaveCase(step=42, num_writers=2, codec="zstd", tensor_table=True, table_codec="zstd",
                    tensors=[TensorSpec("w", "float32", [4, 3], 1,
                                        [([0, 0], [2, 3], 0), ([2, 0], [2, 3], 1)]),
                             TensorSpec("empty", "int64", [0, 4], 2, [], declared_by=1)],
                    entries=[EntrySpec("r", {"id": "pck:json/1"}, "per_rank", "json",
                                       values=[5, 6, 7], policy="rank0")],
                    world_size=3)


def test_write_jobs_carry_the_case(tmp_path: Path) -> None:
    """Step, writer count, codec, table, a zero-size tensor's declaring writer, an entry's
    policy, and the fault of the one writer asked to fail; chunk ``data`` relative to the job's
    directory and holding the box's bytes."""
    case, root = _case(), tmp_path / "root"
    paths = write_jobs(case, tmp_path / "jobs", root, "aid", {1: "after_data"})
    jobs = [json.loads(p.read_text()) for p in paths]
    for w, j in enumerate(jobs):
        assert (j["protocol"], j["phase"], j["root"], j["attempt_id"], j["step"], j["writer"],
                j["num_writers"], j["world_size"], j["codec"], j["block_size"],
                j["tensor_table"], j["table_codec"]) == \
            (PROTOCOL, "write", str(root), "aid", 42, w, 2, 3, "zstd", 4096, True, "zstd")
    assert [j["fail_at"] for j in jobs] == [None, "after_data"]
    assert [[(t["key"], len(t["chunks"])) for t in j["tensors"]] for j in jobs] == \
        [[("w", 1)], [("w", 1), ("empty", 0)]]
    assert {e["world_size_policy"] for j in jobs for e in j["entries"]} == {"rank0"}
    full = case.tensors[0].data()
    for w, (p, j) in enumerate(zip(paths, jobs, strict=True)):
        chunk = j["tensors"][0]["chunks"][0]
        assert not os.path.isabs(chunk["data"]), chunk["data"]
        assert (p.parent / chunk["data"]).read_bytes() == \
            np.ascontiguousarray(full[2 * w:2 * w + 2]).tobytes()


def test_commit_job_carries_the_case(tmp_path: Path) -> None:
    case, root = _case(), tmp_path / "root"
    j = json.loads(commit_job(case, tmp_path / "jobs", root, "aid", "before_publish").read_text())
    assert (j["phase"], j["step"], j["writers"], j["tensor_table"], j["table_codec"],
            j["fail_at"]) == ("commit", 42, [0, 1], True, "zstd", "before_publish")
    assert j["continuation"] == {"contract": "exact", "world_size": 3, "mesh": None}


def test_job_paths_are_absolute_from_a_relative_job_directory(tmp_path: Path) -> None:
    """The adapter gets the absolute path of its job file (README), even where the harness
    was given a relative work directory."""
    old = Path.cwd()
    os.chdir(tmp_path)
    try:
        paths = write_jobs(_case(), Path("jobs"), tmp_path / "root", "aid")
        commit = commit_job(_case(), Path("jobs"), tmp_path / "root", "aid")
    finally:
        os.chdir(old)
    assert all(p.is_absolute() and p.is_file() for p in [*paths, commit]), paths
