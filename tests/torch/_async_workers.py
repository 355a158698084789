"""Per-rank programs of the process-mode async save tests (run through portable_ckpt.torch.launch)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard

import portable_ckpt
import portable_ckpt.torch as pckt
from portable_ckpt.errors import CheckpointError
from portable_ckpt.torch import _process_write

STRIDED = [_StridedShard(0, split_factor=2)]


def _globals() -> dict[str, torch.Tensor]:
    return {
        "rows": torch.arange(48.0).reshape(8, 6),
        "strided": torch.arange(48.0).reshape(8, 6) * -1,  # same shape and mesh as "rows"
        "rep": torch.arange(5, dtype=torch.int32),
        "plain": torch.full((3,), 2.5, dtype=torch.bfloat16),
    }


def _state(mesh: Any, zeros: bool = False) -> dict[str, Any]:
    g = {k: torch.zeros_like(v) if zeros else v for k, v in _globals().items()}
    return {
        "model": {
            "rows": distribute_tensor(g["rows"], mesh, [Shard(0)]),
            "strided": distribute_tensor(g["strided"], mesh, STRIDED, src_data_rank=None),
            "rep": distribute_tensor(g["rep"], mesh, [Replicate()]),
        },
        "plain": g["plain"],
        "meta": {"epoch": 0 if zeros else 3},
    }


def _full(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    m = state["model"]
    return {
        "rows": m["rows"].full_tensor(),
        "strided": m["strided"].full_tensor(),
        "rep": m["rep"].full_tensor(),
        "plain": state["plain"],
    }


def _train_group_busy(rank: int, world: int) -> bool:
    """Training collectives on the default group while the save runs: none interleave."""
    ok = True
    for i in range(20):
        t = torch.tensor([float(rank + i)])
        dist.all_reduce(t)
        ok = ok and float(t) == sum(r + i for r in range(world))
    return ok


def process_save_and_writer_death(rank: int, world: int, root: str) -> dict[str, Any]:
    """A process-mode save (mutated after staging), then rank 1's writer dies mid-save."""
    mesh = init_device_mesh("cpu", (world,))
    state = _state(mesh)
    h = pckt.async_save(state, root, step=1, mode="process", timeout=60)
    staged = h.staged.done()
    for t in (state["model"]["rows"], state["model"]["strided"], state["model"]["rep"]):
        t.to_local().add_(1000)
    state["plain"].zero_()
    state["meta"]["epoch"] = 99
    busy_ok = _train_group_busy(rank, world)
    info = h.result(timeout=120)
    target = _state(mesh, zeros=True)
    pckt.load(target, root, timeout=60)
    values_ok = all(torch.equal(a, b) for a, b in zip(
        _full(target).values(), _globals().values(), strict=True))
    out: dict[str, Any] = {
        "staged": staged, "busy_ok": busy_ok, "values_ok": values_ok,
        "epoch": target["meta"]["epoch"], "id": info.checkpoint_id,
    }
    out.update(_writer_dies_on_rank1(rank, state, root))
    return out


def _writer_dies_on_rank1(rank: int, state: dict[str, Any], root: str) -> dict[str, Any]:
    big = {**state, "big": torch.ones(8 << 20)}  # rank 0 writes it: a long write there
    writer = _process_write.writer_process()
    dist.barrier()
    if rank == 1:  # stopped before the job arrives, so it cannot finish it: killed inside it
        os.kill(writer.pid, signal.SIGSTOP)
    h = pckt.async_save(big, root, step=2, mode="process", timeout=60)
    if rank == 1:
        # Killed once the job was sent (its request holds the lock until the answer): a kill
        # before that (a slow background thread under load) let a new writer do the job.
        deadline = time.monotonic() + 60
        while not writer.lock.locked() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        os.kill(writer.pid, signal.SIGKILL)
    code, message = None, ""
    try:
        h.result(timeout=120)
    except CheckpointError as e:
        code, message = e.code, str(e)
    dist.barrier()
    committed = [v.step for v in portable_ckpt.list_versions(root) if v.status == "committed"]
    again = pckt.async_save(state, root, step=3, mode="process", timeout=60).result(timeout=120)
    return {
        "death_code": code, "death_message": message[:600], "committed_after_death": committed,
        "new_writer": _process_write.writer_process().pid != writer.pid,
        "after": again.step,
    }
