"""The job log of torch saves and loads (one process and a 2-rank gloo group), and drill's bar."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("torch")

import torch

import portable_ckpt
import portable_ckpt.torch as pckt
from portable_ckpt.errors import TensorMissingError
from portable_ckpt.logs import mib_per_s
from portable_ckpt.testing.logs import EventLog, job_log
from portable_ckpt.torch.launch import run_group

from ..core.test_cli_progress import BAR, run_cli

pytestmark = pytest.mark.torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def events() -> Iterator[EventLog]:
    with job_log() as log:
        yield log


def _named(docs: list[dict], name: str) -> list[dict]:
    return [d for d in docs if d["event"] == name]


def test_save_and_load_log_bytes_seconds_throughput(tmp_path, events: EventLog) -> None:
    state = {"w": torch.randn(256, 64), "step": 3}
    info = pckt.save(state, tmp_path, step=3)
    (started,) = _named(events.events(), "save.started")
    (saved,) = _named(events.events(), "save.finished")
    assert started["step"] == saved["step"] == 3 and saved["rank"] == 0
    assert saved["bytes"] == info.bytes_written > 256 * 64 * 4
    assert saved["total_bytes"] == info.total_bytes and saved["version"] == info.path
    assert saved["seconds"] > 0 and saved["mib_per_s"] == mib_per_s(saved["bytes"], saved["seconds"])
    target = {"w": torch.zeros(256, 64), "step": 0}
    loaded = pckt.load(target, tmp_path)
    (done,) = _named(events.events(), "load.finished")
    assert done["bytes"] == loaded.bytes_read >= 256 * 64 * 4 and done["step"] == 3
    assert done["version"] == info.path and done["contract"] == "exact"
    assert events.record("save.finished").name == "portable_ckpt.torch"
    assert events.record("load.finished").name == "portable_ckpt.torch"
    assert events.record("commit.finished").name == "portable_ckpt.io"


def test_a_refused_load_is_logged_with_its_code(tmp_path, events: EventLog) -> None:
    pckt.save({"w": torch.ones(4)}, tmp_path, step=1)
    with pytest.raises(TensorMissingError):
        pckt.load({"w": torch.ones(4), "extra": torch.ones(2)}, tmp_path)
    (refused,) = _named(events.events(), "load.refused")
    assert refused["code"] == "PCK-TENSOR-MISSING" and "'extra'" in refused["message"]
    assert not _named(events.events(), "load.finished")


def test_two_rank_gloo_run_logs_every_rank(tmp_path) -> None:
    res = run_group("tests.torch._log_workers:save_load_refuse", 2, (str(tmp_path),),
                    timeout=120, pg_timeout=45, sys_path=[ROOT])
    res.raise_for_errors()
    for rank, out in enumerate(res.results):
        docs = out["events"]
        assert out["restored"] and out["code"] == "PCK-TENSOR-MISSING"
        (saved,) = _named(docs, "save.finished")
        (loaded,) = _named(docs, "load.finished")
        (refused,) = _named(docs, "load.refused")
        assert saved["rank"] == loaded["rank"] == refused["rank"] == rank
        assert saved["bytes"] >= 32 * 32 * 4  # this rank's half of w (rank 0 also writes b)
        assert loaded["bytes"] >= 32 * 32 * 4
        assert saved["mib_per_s"] == mib_per_s(saved["bytes"], saved["seconds"])
        assert refused["code"] == "PCK-TENSOR-MISSING"
        commits = _named(docs, "commit.finished")
        assert len(commits) == (1 if rank == 0 else 0)  # rank 0 commits
    total = res.results[0]["events"]
    assert _named(total, "save.finished")[0]["total_bytes"] == sum(
        f.size for f in portable_ckpt.open(str(tmp_path)).manifest.files.values()
    )


def test_drill_draws_a_bar_of_ranks_on_a_terminal(tmp_path) -> None:
    root = str(tmp_path / "ck")
    portable_ckpt.save_arrays(root, {"w": np.ones((8, 4), np.float32)}, step=2)
    r = run_cli("drill", root, "--world-size", "2", "--no-record", tty=True)
    assert r.rc == 0 and r.stdout.startswith("drill PASSED")
    assert b"drill on 2 ranks:" in r.stderr and BAR in r.stderr and b"2/2" in r.stderr
