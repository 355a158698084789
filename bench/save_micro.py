"""Short, alternated timings of the save paths on the realistic state (for iterating on them).

    python -m bench.save_micro --model full --reps 5            # async blocking, ~2 minutes
    python -m bench.save_micro --model full --reps 3 --sync     # + sync save vs dcp.save
    python -m bench.save_micro --model small --reps 5 --sync --no-async

Each rank of a fresh gloo group builds the realistic state (``bench/realistic_model.py``); every
repetition then times, in rotated order: a memcpy of the rank's local tensors into preallocated
buffers, ``async_save`` in thread and in process mode (the call's wall time: what the caller is
blocked for; the save is then waited for), and with ``--sync`` ``save`` and ``dcp.save`` (between
barriers). Printed per contender: the slowest rank's time, median [min–max] over repetitions,
and the ratio to the memcpy (async) or to dcp.save (sync) per repetition, median (min–max).
The first call of each contender is a warm-up (process start, buffers), not counted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

__all__ = ["main", "micro_rank"]


def _one(name: str, state: Any, work: str, n: int, bufs: dict[str, Any]) -> float:
    """Run contender ``name`` once; return the seconds that count (see the module docstring)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import portable_ckpt.torch as pckt
    from bench.realistic_ranks import _memcpy_s

    path = os.path.join(work, f"{name}-{n}")
    dist.barrier()
    t0 = time.perf_counter()
    if name == "memcpy":
        return _memcpy_s(state, bufs)
    if name.startswith("async-"):
        h = pckt.async_save(state, path, step=n, timeout=900, mode=name.removeprefix("async-"))
        block = time.perf_counter() - t0
        h.result()
        return block
    if name == "save":
        pckt.save(state, path, step=n, timeout=900)
    else:
        dcp.save(state, storage_writer=dcp.FileSystemWriter(path))
    dist.barrier()
    return time.perf_counter() - t0


def micro_rank(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Per rank: the times of every contender, per repetition (warm-up call not counted)."""
    import torch.distributed as dist

    from bench.realistic_model import ModelConfig, build, state_of

    state = state_of(build(ModelConfig(**spec["model"]), rank, world))
    names: list[str] = spec["names"]
    bufs: dict[str, Any] = {}
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(spec["reps"] + 1):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for name in order:
            s = _one(name, state, spec["work"], rep, bufs)
            if rep:
                times[name].append(s)
            dist.barrier()
            if rank == 0:
                shutil.rmtree(os.path.join(spec["work"], f"{name}-{rep}"), ignore_errors=True)
    return times


def _summary(results: list[dict[str, list[float]]], names: list[str]) -> str:
    slow = {n: [max(r[n][i] for r in results) for i in range(len(results[0][n]))] for n in names}
    lines = []
    for n in names:
        v = slow[n]
        line = f"{n:14s} {statistics.median(v):7.3f} s [{min(v):.3f}–{max(v):.3f}]"
        base = "memcpy" if n.startswith("async-") else "dcp" if n == "save" else None
        if base in slow:
            r = [b / a if base == "dcp" else a / b for a, b in zip(v, slow[base], strict=True)]
            what = "× dcp (speed)" if base == "dcp" else "× memcpy"
            line += f"   {statistics.median(r):.3f}{what} ({min(r):.3f}–{max(r):.3f})"
        lines.append(line)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the timings on a fresh group and print the summary."""
    from dataclasses import asdict

    from bench.realistic_model import PRESETS
    from portable_ckpt.torch.launch import run_group

    p = argparse.ArgumentParser(prog="python -m bench.save_micro", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(PRESETS), default="full")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--sync", action="store_true", help="also time save against dcp.save")
    p.add_argument("--no-async", action="store_true", help="skip the async contenders")
    p.add_argument("--scratch", default=None)
    args = p.parse_args(argv)
    names = [] if args.no_async else ["memcpy", "async-thread", "async-process"]
    names += ["save", "dcp"] if args.sync else []
    work = tempfile.mkdtemp(prefix="save-micro-", dir=args.scratch)
    spec = {"model": asdict(PRESETS[args.model]), "work": work, "reps": args.reps, "names": names}
    try:
        res = run_group("bench.save_micro:micro_rank", args.ranks, (spec,), timeout=3600,
                        pg_timeout=1800, sys_path=[REPO, os.path.join(REPO, "src")])
        res.raise_for_errors()
        sys.stdout.write(_summary(list(res.results), names))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
