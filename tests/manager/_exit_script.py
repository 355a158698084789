"""Launched with torchrun: start async saves and let the interpreter exit without waiting.

``ROOT/manager``: through a CheckpointManager that is never closed; ``ROOT/plain``: with
``async_save`` alone (started after the manager's save, which it waits for); ``ROOT/process``:
``async_save(mode="process")``, whose writer process must outlive the interpreter's shutdown
until the save is committed. ``destroy``: through a manager never closed, then
``destroy_process_group()`` in a ``finally`` while its save still writes (data files are
opened 1 s late): the save is lost, and the process must say why and exit 1.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import portable_ckpt.torch as pckt


def _slow_data_files() -> None:
    """Open every data file 1 s late (the save is still writing when the group goes)."""
    import time

    from portable_ckpt.storage.local import LocalStorage

    opener = LocalStorage.open_writer

    def late(self: LocalStorage, path: str, **kw: object) -> object:
        if "/data/" in path:
            time.sleep(1.0)
        return opener(self, path, **kw)  # type: ignore[arg-type]

    LocalStorage.open_writer = late  # type: ignore[method-assign,assignment]


def main() -> None:
    root, modes = sys.argv[1], sys.argv[2:]
    dist.init_process_group("gloo")
    if "destroy" in modes:
        _slow_data_files()
        try:
            mesh = init_device_mesh("cpu", (dist.get_world_size(),))
            state = {"w": distribute_tensor(torch.randn(64, 64), mesh, [Shard(0)])}
            mgr = pckt.CheckpointManager(f"{root}/destroy", save_every=1, timeout=60)
            mgr.maybe_save(1, state)
            print(f"rank {dist.get_rank()}: pending {not mgr._pending.done()}", flush=True)  # type: ignore[union-attr]
        finally:
            dist.destroy_process_group()
        return
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    state = {"w": distribute_tensor(torch.randn(512, 1024), mesh, [Shard(0)])}
    pending = []
    if "manager" in modes:
        mgr = pckt.CheckpointManager(f"{root}/manager", save_every=1, timeout=60)
        mgr.maybe_save(1, state)
        pending.append(mgr._pending is not None and not mgr._pending.done())
    if "plain" in modes:
        h = pckt.async_save(state, f"{root}/plain", step=1, timeout=60)
        pending.append(not h.done())
    if "process" in modes:
        h = pckt.async_save(state, f"{root}/process", step=1, timeout=60, mode="process")
        pending.append(not h.done())
    print(f"rank {dist.get_rank()}: exiting with saves in flight: {pending}", flush=True)


if __name__ == "__main__":
    main()
