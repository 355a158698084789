"""Per-rank programs of the CUDA tests (an NCCL default group; run by ``run_group(backend="nccl")``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import portable_ckpt.torch as pckt


def _busy(rank: int, world: int, dev: torch.device) -> bool:
    """NCCL training collectives while a save is in flight: results stay right."""
    ok = True
    for i in range(20):
        t = torch.tensor([float(rank + i)], device=dev)
        dist.all_reduce(t)
        ok = ok and float(t.item()) == sum(r + i for r in range(world))
    return ok


def nccl_save_load(rank: int, world: int, root: str) -> dict[str, Any]:
    """DTensors on a CUDA mesh: sync, thread and process saves; loads back onto the GPU."""
    dev = torch.device("cuda", torch.cuda.current_device())
    mesh = init_device_mesh("cuda", (world,))
    g = torch.arange(64 * 16, dtype=torch.float32).reshape(64, 16)

    def state(fill: torch.Tensor) -> dict[str, Any]:
        return {"w": distribute_tensor(fill.to(dev), mesh, [Shard(0)]),
                "r": distribute_tensor(fill[0].to(dev), mesh, [Replicate()]),
                "b": fill[1].to(torch.bfloat16).to(dev)}

    s = state(g)
    ids = [pckt.save(s, root, step=1, timeout=60).checkpoint_id]
    busy_ok = True
    for step, mode in ((2, "thread"), (3, "process")):
        h = pckt.async_save(s, root, step=step, mode=mode, timeout=60)
        busy_ok = busy_ok and _busy(rank, world, dev)
        ids.append(h.result(timeout=120).checkpoint_id)
    values_ok = []
    for step in (1, 2, 3):
        t = state(torch.zeros_like(g))
        pckt.load(t, root, step=step, timeout=60)
        values_ok.append(torch.equal(t["w"].full_tensor().cpu(), g)
                         and torch.equal(t["b"].cpu(), g[1].to(torch.bfloat16)))
    plain = {"w": torch.zeros(64, 16), "r": torch.zeros(16), "b": torch.zeros(16, dtype=torch.bfloat16)}
    pckt.load(plain, root, step=3, timeout=60, allow_statistical=True)
    values_ok.append(torch.equal(plain["w"], g) and torch.equal(plain["r"], g[0]))
    return {"busy_ok": busy_ok, "values_ok": values_ok, "ids": ids}
