from __future__ import annotations

import multiprocessing as mp
import os
import socket
import sys
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(fn: Any, world: int, *args: Any, timeout: float = 120.0) -> None:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned gloo ranks; fail with their traceback."""
    import _dist_workers

    ctx = mp.get_context("spawn")
    errq = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_dist_workers._run, args=(fn, r, world, port, args, errq)) for r in range(world)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    errors = []
    while not errq.empty():
        errors.append(errq.get())
    if errors:
        pytest.fail("\n".join(f"rank {r}:\n{tb}" for r, tb in sorted(errors)))
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        pytest.fail(f"ranks exited with {bad}")


@pytest.fixture
def ranks() -> Any:
    return run_ranks
