"""Mutation audit 24, conformance/jobs.py: what each writer's job asks it to store."""

from __future__ import annotations

import json
from pathlib import Path

from conformance.cases import EntrySpec, SaveCase, TensorSpec
from conformance.jobs import commit_job, write_jobs


def test_a_global_entry_goes_to_the_writer_the_case_names(tmp_path: Path) -> None:
    """A global entry is stored by the writer the case draws, not always writer 0 (a writer that
    writes global entries only as writer 0 failed no case otherwise); a per-rank entry's ranks
    go to ``rank mod writers``."""
    case = SaveCase(step=3, num_writers=3, codec="none",
                    tensors=[TensorSpec("w", "float32", [3], 1, [([0], [3], 2)])],
                    entries=[EntrySpec("g1", {"id": "pck:json/1"}, "global", "json",
                                       value={"a": 1}, writer=1),
                             EntrySpec("g2", {"id": "pck:json/1"}, "global", "json",
                                       value=[2], writer=2),
                             EntrySpec("r", {"id": "pck:json/1"}, "per_rank", "json",
                                       values=[10, 11, 12, 13], policy="modulo")],
                    world_size=4)
    jobs = [json.loads(p.read_text()) for p in write_jobs(case, tmp_path / "jobs",
                                                          tmp_path / "root", "aid")]
    held = [sorted((e["name"], e.get("rank")) for e in j["entries"]) for j in jobs]
    assert held == [[("r", 0), ("r", 3)], [("g1", None), ("r", 1)], [("g2", None), ("r", 2)]]
    assert [j["world_size"] for j in jobs] == [4, 4, 4]
    assert [[t["key"] for t in j["tensors"]] for j in jobs] == [[], [], ["w"]]
    commit = json.loads(commit_job(case, tmp_path / "jobs", tmp_path / "root", "aid").read_text())
    assert commit["writers"] == [0, 1, 2] and commit["continuation"]["world_size"] == 4
