"""What ``CheckpointManager.maybe_save`` costs a step when nothing is saved (soak review F1).

Gloo ranks on loopback run the same loop three ways, alternated: without the manager, with
``maybe_save`` agreeing at every step (``decision_interval=0``) and with the default interval.
A step is a fixed amount of Python and native work (``--step-ms`` of matrix products, which
release the GIL) and nothing is ever saved (``save_every`` beyond the run), so the difference is
the decision's own cost. Each rank reports its mean step time; rank 0 also counts the agreements.

    ./dev python -m bench.decision_cost --ranks 2 --steps 400 --step-ms 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _work(ms: float) -> None:
    """About ``ms`` milliseconds of matrix products (calibrated by the caller's measurements)."""
    import torch

    deadline = time.perf_counter() + ms / 1000.0
    a = torch.ones(64, 64)
    while time.perf_counter() < deadline:
        a = (a @ a).clamp_(max=1.0)


def _loop(mgr: Any, steps: int, ms: float, first: int) -> float:
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    for step in range(first, first + steps):
        _work(ms)
        if mgr is not None:
            mgr.maybe_save(step, {})
    dist.barrier()
    return (time.perf_counter() - t0) / steps


def _has_interval(cls: Any) -> bool:
    import inspect

    return "decision_interval" in inspect.signature(cls).parameters


def _worker(rank: int, world: int, port: int, args: Any, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import torch

    torch.set_num_threads(1)  # the ranks share the cores: one thread each, as a real job's
    import portable_ckpt.torch as pckt

    results: dict[str, list[float]] = {"none": [], "every step": [], "default": []}
    agreements: dict[str, list[int]] = {"every step": [], "default": []}
    with tempfile.TemporaryDirectory() as root:
        first = 1
        for _ in range(args.repeats):
            for name in results:
                mgr = None
                if name != "none":
                    kw: dict[str, Any] = {}
                    if name == "every step" and _has_interval(pckt.CheckpointManager):
                        kw["decision_interval"] = 0.0
                    mgr = pckt.CheckpointManager(
                        root, save_every=10**9, handle_sigterm=False, timeout=120, **kw
                    )
                results[name].append(_loop(mgr, args.steps, args.step_ms, first))
                if mgr is not None:
                    agreements[name].append(getattr(mgr, "_agreements", -1))
                    mgr.close()
                first += args.steps
    if rank == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"step_s": results, "agreements": agreements}, f)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        mp.spawn(_worker, args=(args.ranks, port, args, out), nprocs=args.ranks)
        with open(out, encoding="utf-8") as f:
            res = json.load(f)
    base = statistics.median(res["step_s"]["none"])
    print(f"{args.ranks} ranks, {args.steps} steps of ~{args.step_ms} ms, {args.repeats} repeats")
    for name, times in res["step_s"].items():
        med = statistics.median(times)
        extra = (med - base) * 1000
        agreed = res["agreements"].get(name)
        print(
            f"  {name:>10}: step {med * 1000:7.3f} ms (runs {min(times) * 1000:.3f}–"
            f"{max(times) * 1000:.3f}), +{extra:.3f} ms per step"
            + (f", agreements per run {agreed}" if agreed else "")
        )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, REPO)
    sys.exit(main())
