"""Per-rank program of ``test_plan_reuse.py``'s multi-rank test (run through torch.launch)."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard

import portable_ckpt.torch as pckt
from portable_ckpt.torch.plan import plan_stats


def _state(mesh: Any, placements: list[Any], salt: float, zeros: bool = False) -> dict[str, Any]:
    g = torch.arange(48.0).reshape(8, 6) + salt
    g = torch.zeros_like(g) if zeros else g
    return {
        "w": distribute_tensor(g, mesh, placements, src_data_rank=None if zeros else 0),
        "plain": torch.full((3,), salt) if not zeros else torch.zeros(3),
    }


def placements_and_meshes(rank: int, world: int, root: str) -> dict[str, Any]:
    """Save six times (see the test); after each, load into zeros and compare whole tensors."""
    mesh = init_device_mesh("cpu", (world,))
    other = DeviceMesh("cpu", torch.arange(world))  # the same shape, another mesh object
    runs = [
        (mesh, [Shard(0)]),
        (mesh, [Shard(0)]),
        (mesh, [Replicate()]),
        (mesh, [_StridedShard(0, split_factor=2)]),
        (other, [Shard(0)]),
        (mesh, [Shard(0)]),
    ]
    deltas, problems = [], []
    for step, (m, placements) in enumerate(runs):
        state = _state(m, placements, float(step))
        before = plan_stats()
        pckt.save(state, root, step=step, timeout=60)
        after = plan_stats()
        deltas.append([after["planned"] - before["planned"], after["reused"] - before["reused"]])
        back = _state(m, placements, float(step), zeros=True)
        pckt.load(back, root, step=step, timeout=60)
        want = _state(m, placements, float(step))
        if not torch.equal(back["w"].full_tensor(), want["w"].full_tensor()):
            problems.append(f"step {step}: w differs")
        if not torch.equal(back["plain"], want["plain"]):
            problems.append(f"step {step}: plain differs")
    return {"deltas": deltas, "problems": problems}
