"""One rank of a 2-rank job that exits while its checkpoint cannot finish (env:// rendezvous).

Rank 1's async-save thread is kept busy, so its part of the save never runs; rank 0's save then
waits in a collective for rank 1. Rank 0 (``exit_timeout`` 2 s) must say ABANDONED and exit with
status 1 at the bound; rank 1 (a long bound) waits at exit until the test's SIGTERM stops it.
"""

from __future__ import annotations

import sys
import threading

import torch
import torch.distributed as dist

import portable_ckpt.torch as pckt
from portable_ckpt.torch import async_saving


def main() -> None:
    root = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 1:
        async_saving._background(threading.Event().wait)  # the save thread never frees
    mgr = pckt.CheckpointManager(
        root, save_every=1, timeout=60, exit_timeout=2.0 if rank == 0 else 300.0
    )
    mgr.maybe_save(1, {"w": torch.ones(1024)})
    print(f"rank {rank}: exiting with a save in flight", flush=True)


if __name__ == "__main__":
    main()
