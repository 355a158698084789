"""Run as a script: commit step 1, then let the interpreter exit with step 2's async save in flight.

``argv``: ROOT DELAY EXIT_TIMEOUT [MODE]. With MODE ``thread`` (the default) every shard-file
write of step 2 first sleeps DELAY seconds (the fault-injecting storage's ``delay``: a stalled
NFS mount); with MODE ``process`` the save is ``async_save(mode="process")`` to ROOT as given
(the test makes that storage stall, e.g. an S3 endpoint behind a proxy that does not answer).
The save's exit bound is EXIT_TIMEOUT seconds. Nothing waits for the save: the exit hook must.
"""

from __future__ import annotations

import sys

import torch

import portable_ckpt.torch as pckt
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage


def main() -> None:
    root, delay, bound = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    mode = sys.argv[4] if len(sys.argv) > 4 else "thread"
    state = {"w": torch.arange(4096.0)}
    pckt.save(state, root, step=1)
    state["w"].add_(1)
    if mode == "process":
        h = pckt.async_save(state, root, step=2, exit_timeout=bound, mode="process")
    else:
        stall = Fault(op="write", path="*/data/*", error=None, delay=delay)
        slow = FaultyStorage(open_storage(root), [stall])
        h = pckt.async_save(state, slow, step=2, exit_timeout=bound)
    print(f"exiting with step 2 in flight: {not h.done()}", flush=True)


if __name__ == "__main__":
    main()
