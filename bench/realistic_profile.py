"""Profile one save and one load of the realistic state, per rank (cProfile), to find the cost.

    python -m bench.realistic_profile --model small --loads 4,1        # minutes
    python -m bench.realistic_profile --model full --loads 4,3 --top 30 --cold

Each rank of a fresh gloo group builds the state (``bench/realistic_model.py``), saves it once
untimed (warm-up: imports and first calls), then saves it again under cProfile; each load world
size then loads it once untimed and once under cProfile (page cache warm, or dropped before the
profiled load with ``--cold``, as root). Printed: per phase the wall time of the slowest rank
between two barriers, and the functions with the most own time (``tottime``) summed over ranks,
with their cumulative time. ``--dump DIR`` keeps each rank's ``pstats`` file.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

__all__ = ["load_profile_rank", "main", "save_profile_rank"]


def _profiled(fn: Any, dump: str | None, tag: str) -> tuple[float, str]:
    """Run ``fn`` under cProfile between barriers; return its wall time and marshalled stats."""
    import torch.distributed as dist

    prof = cProfile.Profile()
    dist.barrier()
    t0 = time.perf_counter()
    prof.enable()
    fn()
    prof.disable()
    dist.barrier()
    wall = time.perf_counter() - t0
    path = os.path.join(dump or tempfile.gettempdir(), f"{tag}.pstats")
    prof.dump_stats(path)
    return wall, path


def save_profile_rank(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Save twice (untimed, then profiled) into ``spec['work']/ours``."""
    import portable_ckpt.torch as pckt
    from bench.realistic_model import ModelConfig, build, state_of
    from bench.realistic_ranks import drop_caches

    state = state_of(build(ModelConfig(**spec["model"]), rank, world))
    ours = os.path.join(spec["work"], "ours")
    pckt.save(state, ours, step=0, timeout=900)
    if rank == 0:
        drop_caches()
    wall, path = _profiled(lambda: pckt.save(state, ours, step=1, timeout=900), spec["dump"],
                           f"save-{world}-r{rank}")
    return {"wall": wall, "pstats": path}


def load_profile_rank(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Load once untimed, then once profiled (cache dropped first with ``cold``)."""
    import torch.distributed as dist

    import portable_ckpt.torch as pckt
    from bench.realistic_model import ModelConfig, build, state_of
    from bench.realistic_ranks import drop_caches

    state = state_of(build(ModelConfig(**spec["model"]), rank, world))
    ours = os.path.join(spec["work"], "ours")
    pckt.load(state, ours, allow_statistical=True, timeout=900)
    dist.barrier()
    if spec["cold"] and rank == 0:
        drop_caches()
    wall, path = _profiled(lambda: pckt.load(state, ours, allow_statistical=True, timeout=900),
                           spec["dump"], f"load-{world}-r{rank}")
    return {"wall": wall, "pstats": path}


def _report(title: str, results: list[dict[str, Any]], top: int) -> str:
    wall = max(r["wall"] for r in results)
    out = io.StringIO()
    stats = pstats.Stats(results[0]["pstats"], stream=out)
    for r in results[1:]:
        stats.add(r["pstats"])
    out.write(f"\n=== {title}: {wall:.3f} s (slowest rank); own time summed over "
              f"{len(results)} ranks ===\n")
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.realistic_profile",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("full", "small", "smoke"), default="small")
    p.add_argument("--save-ranks", type=int, default=4)
    p.add_argument("--loads", default="4", help="world sizes to load onto, comma-separated")
    p.add_argument("--cold", action="store_true", help="drop the page cache before each load")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--scratch", default=None)
    p.add_argument("--dump", default=None, help="directory that keeps each rank's pstats")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the profiled phases and print the reports."""
    from dataclasses import asdict

    from bench.realistic_model import PRESETS
    from portable_ckpt.torch.launch import run_group

    args = _parse(argv)
    work = tempfile.mkdtemp(prefix="realistic-profile-", dir=args.scratch)
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
    spec = {"model": asdict(PRESETS[args.model]), "work": work, "cold": args.cold,
            "dump": args.dump or work}
    try:
        phases = [("save_profile_rank", args.save_ranks, f"save on {args.save_ranks} ranks")]
        phases += [("load_profile_rank", int(m), f"load {args.save_ranks}→{m}")
                   for m in args.loads.split(",")]
        for fn, world, title in phases:
            res = run_group(f"bench.realistic_profile:{fn}", world, (spec,), timeout=3600,
                            pg_timeout=1800, sys_path=[REPO, os.path.join(REPO, "src")])
            res.raise_for_errors()
            sys.stdout.write(_report(title, list(res.results), args.top))
            sys.stdout.flush()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
