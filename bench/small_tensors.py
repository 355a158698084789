"""CPU cost per tensor of save, load and restore on a state of many small tensors (issue 13).

    python -m bench.small_tensors                          # 1 and 2 ranks, 3,000 tensors, 5 reps
    python -m bench.small_tensors --params 250 --reps 3 --ranks 1
    python -m bench.small_tensors --profile save --ranks 1   # cProfile of one operation

The state is what an AdamW job over many small parameters holds (biases, norms, LoRA
adapters): ``--params`` parameters of 256 to 64 K elements (log-uniform, fp32 and bf16
alternately), each with ``exp_avg``, ``exp_avg_sq`` (fp32) and a ``step`` scalar — four tensors
per parameter (3,000 tensors at the default 750). On 2 ranks parameters and moments are
DTensors sharded on dim 0 (FSDP2-like), steps are plain tensors.

Each rank of a fresh gloo group (1 rank: a group of one) measures, alternating the operations
in rotating order within each repetition, the CPU time (``time.process_time`` of the rank's
process: every thread, so the background writer's too) and wall time of:
``save`` (portable_ckpt.torch.save), ``async`` (the blocking part of ``async_save``, thread
mode; then waited for), ``load`` (same layout), ``restore`` (``CheckpointManager.restore``),
``dcp_save`` and ``dcp_load`` (torch.distributed.checkpoint, same state, same run); on 2 ranks
also ``load_2to1``: a single process loads the 2-rank version into plain tensors. Printed: per
operation the median CPU ms per 1,000 tensors over repetitions (slowest rank), the spread
(min–max), the ratio against DCP's same-kind operation in the same repetition, and the wall
time. ``--json PATH`` keeps every measurement.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

__all__ = ["build_state", "load_single", "main", "measure", "rank_main", "section"]

OPS_SAVE = ("save", "async", "dcp_save")
OPS_LOAD = ("load", "restore", "dcp_load")


def build_state(params: int, rank: int, world: int, seed: int = 0) -> dict[str, Any]:
    """The AdamW-like state of ``params`` small parameters (sharded on dim 0 when ``world`` > 1)."""
    import random

    import torch

    rng = random.Random(seed)
    mesh = None
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (world,))
    model: dict[str, Any] = {}
    optim: dict[str, Any] = {}
    for i in range(params):
        n = int(math.exp(rng.uniform(math.log(256), math.log(65536))))
        n -= n % 64  # rows of 8, an even row count: equal shards on 1 or 2 ranks
        shape = (n // 8, 8)
        dtype = torch.float32 if i % 2 == 0 else torch.bfloat16
        name = f"layers.{i // 8}.block.p{i % 8}.weight"
        full = [torch.full(shape, float(i % 97), dtype=dtype),
                torch.full(shape, 0.5, dtype=torch.float32),
                torch.full(shape, 0.25, dtype=torch.float32)]
        if mesh is not None:
            from torch.distributed.tensor import Shard, distribute_tensor

            full = [distribute_tensor(t, mesh, [Shard(0)]) for t in full]
        model[name] = full[0]
        optim[name] = {"exp_avg": full[1], "exp_avg_sq": full[2],
                       "step": torch.tensor(float(i), dtype=torch.float32)}
    return {"model": model, "optim": {"state": optim, "param_groups": [
        {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01,
         "params": sorted(model)}]}}


def _zeroed(state: Any) -> Any:
    """A target of the same layout (loads overwrite it)."""
    import torch

    if isinstance(state, dict):
        return {k: _zeroed(v) for k, v in state.items()}
    if isinstance(state, torch.Tensor):
        return torch.zeros_like(state)
    return state


def _timed(fn: Callable[[], Any], profile: cProfile.Profile | None) -> tuple[float, float]:
    import torch.distributed as dist

    dist.barrier()
    c0, w0 = time.process_time(), time.perf_counter()
    if profile is not None:
        profile.enable()
    fn()
    if profile is not None:
        profile.disable()
    c1, w1 = time.process_time(), time.perf_counter()
    dist.barrier()
    return c1 - c0, w1 - w0


def rank_main(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    """One rank: build the state, then time every operation ``reps`` times, rotating."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import portable_ckpt.torch as pckt

    work = spec["work"]
    state = build_state(spec["params"], rank, world)
    target = _zeroed(state)
    ours, dcp_dir = os.path.join(work, "ours"), os.path.join(work, "dcp")
    mgr_root = os.path.join(work, "mgr")
    step = [0]

    def save() -> None:
        step[0] += 1
        pckt.save(state, ours, step=step[0], continuation="statistical")

    handle: list[Any] = []

    def async_blocking() -> None:
        step[0] += 1
        handle.append(pckt.async_save(state, ours, step=step[0], continuation="statistical"))

    dcp_n = [0]

    def dcp_save() -> None:
        dcp_n[0] += 1
        dcp.save(state, checkpoint_id=os.path.join(dcp_dir, f"s{dcp_n[0]}"))

    def load() -> None:
        pckt.load(target, ours)

    def dcp_load() -> None:
        dcp.load(target, checkpoint_id=os.path.join(dcp_dir, f"s{dcp_n[0]}"))

    mgr = pckt.CheckpointManager(mgr_root, async_save=False, handle_sigterm=False,
                                 handle_sigint=False, keep_last=2,
                                 continuation="statistical")

    def restore() -> None:
        mgr.restore(target)

    ops: dict[str, Callable[[], None]] = {
        "save": save, "async": async_blocking, "dcp_save": dcp_save,
        "load": load, "restore": restore, "dcp_load": dcp_load}
    only = spec["only"]
    # Warm-up (imports, first calls) and the versions the loads read.
    save()
    dcp_save()
    mgr.save(1, state)
    mgr.wait()
    dist.barrier()
    out: dict[str, list[list[float]]] = {op: [] for op in ops if op in only}
    profile = cProfile.Profile() if spec["profile"] else None
    for rep in range(spec["reps"]):
        for group in (OPS_SAVE, OPS_LOAD):
            names = [op for op in group if op in only]
            if not names:
                continue
            k = rep % len(names)
            for op in names[k:] + names[:k]:
                prof = profile if op == spec["profile"] else None
                cpu, wall = _timed(ops[op], prof)
                out[op].append([cpu, wall])
                if op == "async":
                    handle.pop().committed.result()
                    dist.barrier()
    mgr.close()
    res: dict[str, Any] = {"times": out, "tensors": 4 * spec["params"]}
    if profile is not None:
        path = os.path.join(work, f"prof-r{rank}.pstats")
        profile.dump_stats(path)
        res["pstats"] = path
    del torch
    return res


def load_single(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    """One process loads the 2-rank version into plain tensors (resharded 2→1)."""
    import portable_ckpt.torch as pckt

    target = _zeroed(build_state(spec["params"], 0, 1))
    ours = os.path.join(spec["work"], "ours")
    pckt.load(target, ours, allow_statistical=True)
    out = []
    profile = cProfile.Profile() if spec["profile"] == "load_2to1" else None
    for _ in range(spec["reps"]):
        out.append(list(_timed(lambda: pckt.load(target, ours, allow_statistical=True),
                               profile)))
    res: dict[str, Any] = {"times": {"load_2to1": out}, "tensors": 4 * spec["params"]}
    if profile is not None:
        path = os.path.join(spec["work"], "prof-2to1.pstats")
        profile.dump_stats(path)
        res["pstats"] = path
    return res


def _rows(results: list[dict[str, Any]], world: int) -> list[dict[str, Any]]:
    times = [r["times"] for r in results]
    tensors = results[0]["tensors"]
    per_k = 1000.0 / tensors
    rows = []
    for op in times[0]:
        reps = len(times[0][op])
        cpu = [max(t[op][i][0] for t in times) * 1000 * per_k for i in range(reps)]
        wall = [max(t[op][i][1] for t in times) * 1000 * per_k for i in range(reps)]
        peer = "dcp_save" if op in ("save", "async") else "dcp_load"
        ratio: list[float] = []
        if op not in ("dcp_save", "dcp_load") and peer in times[0] and op != "load_2to1":
            pcpu = [max(t[peer][i][0] for t in times) * 1000 * per_k for i in range(reps)]
            ratio = [a / b for a, b in zip(cpu, pcpu, strict=True)]
        rows.append({"world": world, "op": op, "cpu_ms_per_1k": statistics.median(cpu),
                     "cpu_min": min(cpu), "cpu_max": max(cpu),
                     "wall_ms_per_1k": statistics.median(wall),
                     "vs_dcp_cpu": statistics.median(ratio) if ratio else None})
    return rows


def _show(rows: list[dict[str, Any]]) -> str:
    out = ["| ranks | operation | CPU ms / 1k tensors (median) | min–max | ours/dcp CPU | "
           "wall ms / 1k |", "|---|---|---|---|---|---|"]
    for r in rows:
        ratio = "" if r["vs_dcp_cpu"] is None else f"{r['vs_dcp_cpu']:.2f}"
        out.append(f"| {r['world']} | {r['op']} | {r['cpu_ms_per_1k']:.1f} | "
                   f"{r['cpu_min']:.1f}–{r['cpu_max']:.1f} | {ratio} | "
                   f"{r['wall_ms_per_1k']:.1f} |")
    return "\n".join(out)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.small_tensors", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", type=int, default=750, help="parameters (4 tensors each)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--ranks", default="1,2", help="world sizes, comma-separated (1 and/or 2)")
    p.add_argument("--only", default=",".join(OPS_SAVE + OPS_LOAD + ("load_2to1",)))
    p.add_argument("--profile", default="", help="cProfile this operation; print the top")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--scratch", default=None)
    p.add_argument("--json", default=None, help="write every row here")
    p.add_argument("--dump", default=None, help="copy the profiled rank's pstats file here")
    return p.parse_args(argv)


def measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str]]:
    """Run the groups; return the table's rows and the profiles' text."""
    from portable_ckpt.torch.launch import run_group

    rows: list[dict[str, Any]] = []
    stats_out: list[str] = []
    for world in (int(w) for w in args.ranks.split(",")):
        work = tempfile.mkdtemp(prefix="small-tensors-", dir=args.scratch)
        spec = {"params": args.params, "reps": args.reps, "work": work,
                "only": args.only.split(","), "profile": args.profile}
        try:
            res = run_group("bench.small_tensors:rank_main", world, (spec,), timeout=3600,
                            pg_timeout=1800, sys_path=[REPO, os.path.join(REPO, "src")])
            res.raise_for_errors()
            results = list(res.results)
            rows += _rows(results, world)
            if world > 1 and "load_2to1" in spec["only"]:
                single = run_group("bench.small_tensors:load_single", 1, (spec,),
                                   timeout=3600, pg_timeout=1800,
                                   sys_path=[REPO, os.path.join(REPO, "src")])
                single.raise_for_errors()
                rows += _rows(list(single.results), world)
                results += list(single.results)
            for r in results:
                if "pstats" in r:
                    s = io.StringIO()
                    ps = pstats.Stats(r["pstats"], stream=s)
                    if args.dump:
                        shutil.copy(r["pstats"], args.dump)
                    ps.sort_stats("cumulative").print_stats(args.top)
                    s.write("\n--- by own time ---\n")
                    ps.sort_stats("tottime").print_stats(args.top)
                    stats_out.append(s.getvalue())
                    break
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return rows, stats_out


def section(ctx: Any) -> dict[str, Any]:
    """The ``small`` section of ``python -m bench``."""
    params = ctx.size(10, 250, 750)
    args = _parse(["--params", str(params), "--reps", str(ctx.reps), "--scratch", ctx.scratch])
    rows, _ = measure(args)
    for r in rows:
        for k, v in r.items():
            if isinstance(v, float):
                r[k] = round(v, 2)
    notes = [f"{params} parameters of 256 to 64 K elements with AdamW moments and a step each: "
             f"{4 * params} tensors per state; CPU time (process_time) per 1,000 tensors, "
             f"median of {ctx.reps} repetitions (the slowest rank), operations rotated; "
             "`ours/dcp CPU` is the median of per-repetition ratios against DCP's save or load "
             "in the same group. `python -m bench.small_tensors --profile OP` profiles one."]
    return {"title": "Many small tensors: CPU per 1,000 tensors vs DCP", "rows": rows,
            "notes": notes}


def main(argv: list[str] | None = None) -> int:
    """Run the groups and print the table."""
    args = _parse(argv)
    rows, stats_out = measure(args)
    sys.stdout.write("\n".join(stats_out) + "\n")
    sys.stdout.write(_show(rows) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
