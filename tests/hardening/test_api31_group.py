"""Ranks that pass different steps to one save are refused on every rank, nothing committed.

Found by the API review 31 (two gloo ranks): ``save(state, root, step=1)`` on rank 0 and
``step=2`` on rank 1 committed one version named step 1 that held rank 1's state of step 2,
and rank 1's ``CheckpointInfo`` said step 2 with the id of that step-1 version. DCP's
``dcp.save`` with ``PortableStorageWriter(root, step=1 + rank)`` committed the same. Ranks
passing different continuation contracts committed rank 0's, while the others'
``CheckpointInfo.contract`` said their own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

import portable_ckpt
import portable_ckpt.torch as pckt
from portable_ckpt.errors import CheckpointError
from portable_ckpt.format.vocab import Contract
from portable_ckpt.torch.launch import run_group

pytestmark = pytest.mark.torch


def _steps_differ(rank: int, world: int, root: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    state = {"w": torch.arange(4.0)}
    for name, save in (("save", pckt.save), ("async_save", pckt.async_save)):
        try:
            got = save(state, f"{root}/{name}", step=1 + rank, continuation="statistical")
            info = got.result(60) if name == "async_save" else got  # type: ignore[union-attr]
            out[name] = ["saved", info.step]
        except CheckpointError as e:
            out[name] = [e.code, str(e)]
    try:
        contract: Contract = "exact" if rank == 0 else "statistical"
        out["contract"] = pckt.save(state, f"{root}/contract", step=1, continuation=contract)
    except CheckpointError as e:
        out["contract"] = [e.code, str(e)]
    # The group is usable afterwards: the next save with one step commits.
    out["next"] = pckt.save(state, f"{root}/save", step=3, continuation="statistical").step
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    from portable_ckpt.torch.dcp_saving import PortableStorageWriter
    from tests.dcp._workers import codes

    try:
        dcp_save(state, storage_writer=PortableStorageWriter(f"{root}/dcp", step=1 + rank))
        out["dcp"] = ["saved"]
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        out["dcp"] = [codes(e), str(e)]
    return out


def test_different_steps_on_the_ranks_commit_nothing(tmp_path: Path) -> None:
    res = run_group(_steps_differ, 2, (str(tmp_path),), timeout=180, pg_timeout=45)
    res.raise_for_errors()
    for rank, out in enumerate(res.results):
        for name in ("save", "async_save"):
            code, message = out[name]
            assert code == "PCK-USAGE", out
            assert "different steps (step 1 on rank(s) [0], step 2 on rank(s) [1]" in message
            assert f"this rank: {1 + rank}" in message
        assert out["contract"][0] == "PCK-USAGE"
        assert ("different continuation contracts (continuation 'exact' on rank(s) [0], "
                "continuation 'statistical' on rank(s) [1]") in out["contract"][1]
        assert out["next"] == 3
        assert out["dcp"][0] == ["PCK-USAGE"], out["dcp"]
        assert ("PortableStorageWriters have different steps (step 1 on rank(s) [0], step 2 on "
                "rank(s) [1])") in out["dcp"][1]
    assert [v.step for v in portable_ckpt.list_versions(tmp_path / "save")] == [3]
    for name in ("async_save", "dcp", "contract"):
        # (missing_ok: a save refused before anything is touched makes no root)
        assert portable_ckpt.list_versions(tmp_path / name, missing_ok=True) == []
