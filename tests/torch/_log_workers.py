"""Rank functions of tests/torch/test_logs_torch.py: each collects its own job log."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import portable_ckpt.torch as pckt
from portable_ckpt.errors import CheckpointError
from portable_ckpt.testing.logs import job_log


def save_load_refuse(rank: int, world: int, root: str) -> dict[str, Any]:
    """Save a sharded state, load it back, then try a load the checkpoint cannot satisfy."""
    with job_log() as log:
        out = _save_load_refuse(world, root)
    return {**out, "events": log.events(), "loggers": [r.name for r in log.records]}


def _save_load_refuse(world: int, root: str) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (world,))
    w = torch.arange(64 * 32, dtype=torch.float32).reshape(64, 32)
    state = {"model": {"w": distribute_tensor(w, mesh, [Shard(0)]), "b": torch.ones(16)}}
    pckt.save(state, root, step=7)
    target = {"model": {"w": distribute_tensor(torch.zeros(64, 32), mesh, [Shard(0)]),
                        "b": torch.zeros(16)}}
    pckt.load(target, root)
    code = None
    try:
        pckt.load({"model": {"missing": torch.zeros(2)}}, root)
    except CheckpointError as exc:
        code = exc.code
    return {"code": code, "restored": bool(torch.equal(target["model"]["w"].full_tensor(), w))}
