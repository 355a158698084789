"""Benchmark of the torch adapter against torch.distributed.checkpoint and dd, in the same run.

State: ``--gib`` GiB of fp32 DTensors (8 tensors, Shard(0)) on ``--ranks`` gloo ranks (CPU).

* save: ``portable_ckpt.torch.save`` vs ``dcp.save`` (FileSystemWriter defaults) vs each rank
  running ``dd if=/dev/zero bs=16M conv=fsync`` of its own bytes, repetitions alternated;
* load resharded to ``--load-ranks``: ``portable_ckpt.torch.load`` vs ``dcp.load``, alternated,
  plus the peak RSS growth of each rank during our load against its target bytes;
* async: ``async_save`` blocking time (call until ``staged``) vs a synchronous save vs a plain
  memory copy of the same bytes.

Medians of the repetitions and ratios are printed as a table and written as JSON.

    python bench/bench_torch.py --gib 1 --reps 3 --out bench/results-torch.json
"""

# ruff: noqa: B023 - the lambdas are called at once, inside the loop iteration
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from typing import Any

from portable_ckpt.torch._proc import rss as proc_rss
from portable_ckpt.torch.launch import run_group

N_TENSORS = 8


def _mesh_state(world: int, total_bytes: int, fill: bool) -> dict[str, Any]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from portable_ckpt.torch.layout import chunk_extent

    mesh = init_device_mesh("cpu", (world,))
    rank = mesh.get_coordinate()[0]
    rows = total_bytes // 4 // N_TENSORS // 1024
    state = {}
    for i in range(N_TENSORS):
        _, n = chunk_extent(rows, world, rank)
        local = torch.empty(n, 1024, dtype=torch.float32)
        if fill:
            local.uniform_()
        else:
            local.zero_()
        state[f"layer{i}.weight"] = DTensor.from_local(
            local,
            mesh,
            [Shard(0)],
            run_check=False,
            shape=torch.Size((rows, 1024)),
            stride=(1024, 1),
        )
    return state


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")


def _timed(fn: Any) -> float:
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t0


def save_rank(rank: int, world: int, work: str, total: int, reps: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import portable_ckpt.torch as pckt

    torch.manual_seed(rank)
    state = _mesh_state(world, total, fill=True)
    local_bytes = sum(t.to_local().numel() * 4 for t in state.values())
    ours_root = os.path.join(work, "ours")
    times: dict[str, list[float]] = {
        "ours": [],
        "dcp": [],
        "dd": [],
        "async_block": [],
        "async_total": [],
        "memcpy": [],
    }
    order = ["ours", "dcp", "dd"]
    for rep in range(reps):
        for name in order[rep % 3 :] + order[: rep % 3]:
            if name == "ours":
                if rank == 0 and os.path.isdir(ours_root):
                    shutil.rmtree(ours_root)
                dist.barrier()
                times["ours"].append(
                    _timed(lambda: pckt.save(state, ours_root, step=rep, timeout=600))
                )
            elif name == "dcp":
                path = os.path.join(work, "dcp")
                if rank == 0 and os.path.isdir(path):
                    shutil.rmtree(path)
                dist.barrier()
                times["dcp"].append(
                    _timed(lambda: dcp.save(state, storage_writer=dcp.FileSystemWriter(path)))
                )
            else:
                target = os.path.join(work, f"dd-{rank}")
                count = max(1, local_bytes // (16 << 20))

                def dd() -> None:
                    subprocess.run(
                        [
                            "dd",
                            "if=/dev/zero",
                            f"of={target}",
                            "bs=16M",
                            f"count={count}",
                            "conv=fsync",
                        ],
                        check=True,
                        capture_output=True,
                    )

                times["dd"].append(_timed(dd))
                os.unlink(target)
    # async: blocking time until staged vs the total; and a plain memory copy of the same bytes.
    locals_ = [t.to_local() for t in state.values()]
    bufs = [torch.empty_like(t) for t in locals_]
    for rep in range(reps):
        if rank == 0 and os.path.isdir(ours_root):
            shutil.rmtree(ours_root)
        dist.barrier()
        t0 = time.perf_counter()
        h = pckt.async_save(state, ours_root, step=100 + rep, timeout=600)
        times["async_block"].append(time.perf_counter() - t0)
        h.committed.result()
        dist.barrier()
        times["async_total"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for b, t in zip(bufs, locals_, strict=True):
            b.copy_(t)
        times["memcpy"].append(time.perf_counter() - t0)
    # Keep one version of each format for the load benchmark.
    if rank == 0 and os.path.isdir(ours_root):
        shutil.rmtree(ours_root)
    dist.barrier()
    pckt.save(state, ours_root, step=1, timeout=600)
    return {"local_bytes": local_bytes, "times": times, "staging_bytes": pckt.staging_bytes()}


def load_rank(rank: int, world: int, work: str, total: int, reps: int) -> dict[str, Any]:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import portable_ckpt.torch as pckt

    state = _mesh_state(world, total, fill=False)
    target_bytes = sum(t.to_local().numel() * 4 for t in state.values())
    times: dict[str, list[float]] = {"ours": [], "dcp": []}
    rss: list[int] = []
    peak_temp: list[int] = []
    for rep in range(reps):
        for name in ["ours", "dcp"] if rep % 2 == 0 else ["dcp", "ours"]:
            if name == "ours":
                dist.barrier()
                cur, _ = proc_rss()
                _reset_peak()
                info: list[Any] = []
                times["ours"].append(
                    _timed(
                        lambda: info.append(
                            pckt.load(
                                state,
                                os.path.join(work, "ours"),
                                allow_statistical=True,
                                timeout=600,
                            )
                        )
                    )
                )
                _, peak = proc_rss()
                rss.append(max(0, peak - cur))
                peak_temp.append(info[0].peak_temp_bytes)
            else:
                times["dcp"].append(
                    _timed(
                        lambda: dcp.load(
                            state, storage_reader=dcp.FileSystemReader(os.path.join(work, "dcp"))
                        )
                    )
                )
    return {"target_bytes": target_bytes, "times": times, "rss_growth": rss, "peak_temp": peak_temp}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--load-ranks", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    ap.add_argument("--out", default="bench/results-torch.json")
    args = ap.parse_args()
    total = int(args.gib * (1 << 30))
    work = args.dir or tempfile.mkdtemp(prefix="pck-bench-")
    os.makedirs(work, exist_ok=True)
    try:
        t0 = time.perf_counter()
        s = run_group(save_rank, args.ranks, (work, total, args.reps), timeout=3600, pg_timeout=900)
        s.raise_for_errors()
        ld = run_group(
            load_rank, args.load_ranks, (work, total, args.reps), timeout=3600, pg_timeout=900
        )
        ld.raise_for_errors()
        wall = time.perf_counter() - t0
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    med = lambda xs: statistics.median(xs)  # noqa: E731
    st = s.results[0]["times"]
    lt = ld.results[0]["times"]
    mib = total / 2**20
    res: dict[str, Any] = {
        "config": {
            "gib": args.gib,
            "ranks": args.ranks,
            "load_ranks": args.load_ranks,
            "reps": args.reps,
            "tensors": N_TENSORS,
            "dtype": "float32",
            "cpus": os.cpu_count(),
        },
        "save_seconds": {k: med(st[k]) for k in ("ours", "dcp", "dd")},
        "save_mib_per_s": {k: mib / med(st[k]) for k in ("ours", "dcp", "dd")},
        "save_ratio_vs_dcp": med(st["dcp"]) / med(st["ours"]),
        "save_ratio_vs_dd": med(st["dd"]) / med(st["ours"]),
        "load_seconds": {k: med(lt[k]) for k in ("ours", "dcp")},
        "load_mib_per_s": {k: mib / med(lt[k]) for k in ("ours", "dcp")},
        "load_ratio_vs_dcp": med(lt["dcp"]) / med(lt["ours"]),
        "load_rss_growth_per_rank": [max(r["rss_growth"]) for r in ld.results],
        "load_peak_temp_per_rank": [max(r["peak_temp"]) for r in ld.results],
        "load_target_bytes_per_rank": [r["target_bytes"] for r in ld.results],
        "async_block_seconds": med(st["async_block"]),
        "async_total_seconds": med(st["async_total"]),
        "sync_save_seconds": med(st["ours"]),
        "memcpy_seconds": med(st["memcpy"]),
        "async_block_ratio_vs_sync": med(st["async_block"]) / med(st["ours"]),
        "async_block_ratio_vs_memcpy": med(st["async_block"]) / med(st["memcpy"]),
        "staging_bytes_per_rank": [r["staging_bytes"] for r in s.results],
        "raw": {"save": [r["times"] for r in s.results], "load": [r["times"] for r in ld.results]},
        "wall_seconds": wall,
    }
    res["rss_budget_ok"] = all(
        g <= 1.1 * t + (64 << 20)
        for g, t in zip(
            res["load_rss_growth_per_rank"], res["load_target_bytes_per_rank"], strict=True
        )
    )
    print(
        f"\nportable-ckpt torch benchmark: {args.gib} GiB fp32 DTensor state, {args.ranks} ranks -> "
        f"{args.load_ranks}, {args.reps} alternating repetitions, medians"
    )
    print(f"{'operation':<44}{'seconds':>10}{'MiB/s':>10}  ratio")
    print(
        f"{'save: portable_ckpt.torch.save':<44}{res['save_seconds']['ours']:>10.3f}{res['save_mib_per_s']['ours']:>10.0f}"
    )
    print(
        f"{'save: dcp.save (FileSystemWriter)':<44}{res['save_seconds']['dcp']:>10.3f}{res['save_mib_per_s']['dcp']:>10.0f}  "
        f"ours at {res['save_ratio_vs_dcp']:.2f}x dcp's speed (target >= 1.3)"
    )
    print(
        f"{'save: dd bs=16M conv=fsync (per rank)':<44}{res['save_seconds']['dd']:>10.3f}{res['save_mib_per_s']['dd']:>10.0f}  "
        f"ours {res['save_ratio_vs_dd']:.2f}x of dd (target >= 0.9)"
    )
    print(
        f"{'load 4->2: portable_ckpt.torch.load':<44}{res['load_seconds']['ours']:>10.3f}{res['load_mib_per_s']['ours']:>10.0f}"
    )
    print(
        f"{'load 4->2: dcp.load':<44}{res['load_seconds']['dcp']:>10.3f}{res['load_mib_per_s']['dcp']:>10.0f}  "
        f"ours at {res['load_ratio_vs_dcp']:.2f}x dcp's speed (target >= 1.2)"
    )
    for r, (g, t, p) in enumerate(
        zip(
            res["load_rss_growth_per_rank"],
            res["load_target_bytes_per_rank"],
            res["load_peak_temp_per_rank"],
            strict=True,
        )
    ):
        print(
            f"  load rank {r}: peak RSS growth {g / 2**20:.1f} MiB vs target {t / 2**20:.1f} MiB "
            f"(budget {1.1 * t / 2**20 + 64:.1f} MiB); reader peak temp {p / 2**20:.2f} MiB"
        )
    print(
        f"{'async_save blocking (until staged)':<44}{res['async_block_seconds']:>10.3f}{'':>10}  "
        f"{res['async_block_ratio_vs_sync']:.2f}x of sync save (target <= 0.5), "
        f"{res['async_block_ratio_vs_memcpy']:.2f}x of a plain memcpy ({res['memcpy_seconds']:.3f} s)"
    )
    print(f"{'async_save total (until committed)':<44}{res['async_total_seconds']:>10.3f}")
    print(
        f"staging buffers per rank: {[b / 2**20 for b in res['staging_bytes_per_rank']]} MiB; wall {wall:.0f} s"
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(res, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
