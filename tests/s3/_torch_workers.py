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
