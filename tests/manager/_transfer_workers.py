"""Rank functions for tests/manager/test_transfer_durable.py (run by portable_ckpt.torch.launch)."""

from __future__ import annotations

import os
from typing import Any


def send_and_trace(
    rank: int, world: int, roots: list[str], partial: bool = False
) -> dict[str, Any]:
    """Rank 0 sends one file to rank 1; rank 1 records its fsyncs until run_transfers returns.

    ``partial``: rank 1 already holds the first 300 bytes, what a receiver killed mid-file left.
    """
    import torch.distributed as dist

    from portable_ckpt.storage import open_storage
    from portable_ckpt.torch._transfer import Transfer, run_transfers

    storage = open_storage(roots[rank])
    attempt = "attempt-x"
    if rank == 0:
        storage.put(f"{attempt}/data/w00000.safetensors", b"\x01" * 1000)
        storage.sync()
    elif partial:
        storage.put(f"{attempt}/data/w00000.safetensors", b"\x01" * 300)
        storage.sync()
    fsynced: list[str] = []
    real = os.fsync

    def traced(fd: int) -> None:
        fsynced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    os.fsync = traced  # type: ignore[assignment]
    try:
        moved = run_transfers(
            [Transfer(0, 1, ("data/w00000.safetensors",))],
            rank=rank,
            group=dist.group.WORLD,
            global_ranks=list(range(world)),
            storage=storage,
            attempt=attempt,
            timeout=60.0,
        )
    finally:
        os.fsync = real
    return {"moved": moved, "fsynced": fsynced}


def sender_cannot_read(rank: int, world: int, roots: list[str]) -> dict[str, Any]:
    """Rank 0's copy fails to read mid-file (EIO): both ranks end promptly, with errors."""
    import time

    import torch.distributed as dist

    from portable_ckpt.errors import CheckpointError
    from portable_ckpt.storage import open_storage
    from portable_ckpt.storage.faults import Fault, FaultyStorage
    from portable_ckpt.torch._transfer import Transfer, run_transfers

    storage = open_storage(roots[rank])
    attempt = "attempt-x"
    if rank == 0:
        storage.put(f"{attempt}/data/w00000.safetensors", b"\x01" * 1000)
        storage.put(f"{attempt}/data/w00001.safetensors", b"\x02" * 500)
        storage.sync()
        storage = FaultyStorage(storage, [Fault(op="read", path="*/w00000*", error="EIO",
                                                after_ops=1)])
    t0 = time.monotonic()
    try:
        run_transfers(
            [Transfer(0, 1, ("data/w00000.safetensors", "data/w00001.safetensors"))],
            rank=rank, group=dist.group.WORLD, global_ranks=list(range(world)),
            storage=storage, attempt=attempt, timeout=60.0, chunk=256,
        )
        code = None
    except CheckpointError as e:
        code = f"{e.code}: {e.message}"
    return {"code": code, "seconds": time.monotonic() - t0}
