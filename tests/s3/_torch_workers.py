"""Functions run on spawned ranks by test_entrypoints_s3 (importable by forkserver children)."""

from __future__ import annotations

import os
from typing import Any


def save_sharded(rank: int, world: int, root: str, env: dict[str, str]) -> dict[str, Any]:
    os.environ.update(env)
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import portable_ckpt.torch as pckt

    mesh = init_device_mesh("cpu", (world,))
    full = torch.arange(10 * 6, dtype=torch.float32).reshape(10, 6)
    state = {"w": distribute_tensor(full, mesh, [Shard(0)]), "b": torch.ones(3, dtype=torch.bfloat16),
             "step_note": 7}
    pckt.save(state, root, step=6, continuation="statistical")
    # async_save to the object store: staged first, then uploaded and committed in the background.
    handle = pckt.async_save(state, root, step=7, continuation="statistical")
    handle.staged.result(timeout=120)
    state["w"].to_local().fill_(-1.0)  # training mutates the state: the checkpoint must not see it
    info = handle.committed.result(timeout=120)
    return {"id": info.checkpoint_id}


def load_resharded(rank: int, world: int, root: str, env: dict[str, str]) -> dict[str, Any]:
    os.environ.update(env)
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import portable_ckpt.torch as pckt

    mesh = init_device_mesh("cpu", (world,))
    state = {"w": distribute_tensor(torch.zeros(10, 6), mesh, [Shard(0)]),
             "b": torch.zeros(3, dtype=torch.bfloat16), "step_note": 0}
    info = pckt.load(state, root)
    full = state["w"].full_tensor()
    return {"step": info.step, "contract": info.contract,
            "ok": bool(torch.equal(full, torch.arange(60, dtype=torch.float32).reshape(10, 6)))
            and bool(torch.equal(state["b"], torch.ones(3, dtype=torch.bfloat16)))
            and state["step_note"] == 7}


def save_many(rank: int, world: int, root: str, env: dict[str, str]) -> None:
    """A version whose commit record is over 3 x 64 KiB (1,500 tensors)."""
    os.environ.update(env)
    import torch

    import portable_ckpt.torch as pckt

    state = {"epoch": 3, **{f"t{i:04d}": torch.full((1,), float(i)) for i in range(1500)}}
    pckt.save(state, root, step=3)


def load_many(rank: int, world: int, root: str, env: dict[str, str]) -> dict[str, Any]:
    """Load it; return this rank's reads of the commit record (ranged GETs and whole GETs)."""
    os.environ.update(env)
    import torch

    import portable_ckpt.torch as pckt
    from portable_ckpt.storage.s3 import S3Storage

    reads: list[list[Any]] = []
    ranged, whole = S3Storage.read_into, S3Storage.read_all

    def read_into(self: Any, path: str, offset: int, buf: memoryview) -> None:
        if path.endswith("/manifest.json"):
            reads.append(["range", offset, len(buf)])
        ranged(self, path, offset, buf)

    def read_all(self: Any, path: str, *, max_size: int) -> bytes:
        if path.endswith("/manifest.json"):
            reads.append(["all", 0, 0])
        return whole(self, path, max_size=max_size)

    S3Storage.read_into = read_into  # type: ignore[method-assign]
    S3Storage.read_all = read_all  # type: ignore[method-assign]
    state = {"epoch": 0, **{f"t{i:04d}": torch.zeros(1) for i in range(1500)}}
    info = pckt.load(state, root)
    ok = state["epoch"] == 3 and all(float(state[f"t{i:04d}"]) == i for i in range(1500))
    return {"step": info.step, "ok": ok, "reads": reads}


def save_outcome_unknown(rank: int, world: int, root: str, env: dict[str, str]) -> dict[str, Any]:
    """A 2-rank save whose commit record's outcome cannot be learnt (see the proxy's setup)."""
    os.environ.update(env)
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import portable_ckpt.torch as pckt
    from portable_ckpt.errors import CommitOutcomeUnknownError

    mesh = init_device_mesh("cpu", (world,))
    full = torch.arange(8 * 4, dtype=torch.float32).reshape(8, 4)
    try:
        pckt.save({"w": distribute_tensor(full, mesh, [Shard(0)])}, root, step=5)
    except CommitOutcomeUnknownError as e:
        return {"unknown": True, "code": e.code, "message": e.message}
    return {"unknown": False}
