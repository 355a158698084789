"""DCP's own API on two storage layers, in one run: FileSystemWriter/Reader vs the portable one.

State: ``--mib`` MiB of fp32 DTensors (``--tensors`` of them, ``Shard(0)``) on ``--ranks`` gloo
ranks. Save: ``dcp.save`` with ``FileSystemWriter`` vs ``PortableStorageWriter`` vs
``portable_ckpt.torch.save``, in rotating order. Load resharded onto ``--load-ranks``:
``dcp.load`` with ``FileSystemReader`` vs ``PortableStorageReader`` vs ``portable_ckpt.torch.load``,
alternated. A repetition's time is the slowest rank's; the table gives medians and the median
(min-max) of per-repetition time ratios against DCP's own storage layer (below 1: faster).

    python -m bench.bench_dcp_layer --mib 256 --reps 5 --out /tmp/dcp-layer.json
"""

# ruff: noqa: B023 - the lambdas are called at once, inside the loop iteration
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from portable_ckpt.torch.launch import run_group

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAVERS = ("dcp+FileSystemWriter", "dcp+PortableStorageWriter", "portable_ckpt.torch.save")
LOADERS = ("dcp+FileSystemReader", "dcp+PortableStorageReader", "portable_ckpt.torch.load")


def _state(world: int, mib: int, tensors: int, fill: bool) -> dict[str, Any]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    rows = (mib << 20) // 4 // tensors // 1024
    out = {}
    for i in range(tensors):
        full = torch.empty(rows, 1024)
        if fill:
            full.uniform_()
        else:
            full.zero_()
        out[f"layer{i}.weight"] = distribute_tensor(full, mesh, [Shard(0)], src_data_rank=None)
    return {"model": out}


def _timed(fn: Callable[[], Any]) -> float:
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t0


def save_rank(rank: int, world: int, work: str, mib: int, tensors: int, reps: int) -> Any:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import portable_ckpt.torch as pckt
    from portable_ckpt.torch.dcp import PortableStorageWriter

    state = _state(world, mib, tensors, fill=True)
    roots = {name: os.path.join(work, f"save{i}") for i, name in enumerate(SAVERS)}
    ops: dict[str, Callable[[int], Any]] = {
        SAVERS[0]: lambda rep: dcp.save(
            state, storage_writer=dcp.FileSystemWriter(roots[SAVERS[0]])
        ),
        SAVERS[1]: lambda rep: dcp.save(
            state, storage_writer=PortableStorageWriter(roots[SAVERS[1]], step=rep)
        ),
        SAVERS[2]: lambda rep: pckt.save(state, roots[SAVERS[2]], step=rep),
    }
    times: dict[str, list[float]] = {n: [] for n in SAVERS}
    for rep in range(reps):
        for name in SAVERS[rep % 3 :] + SAVERS[: rep % 3]:
            if rank == 0:
                shutil.rmtree(roots[name], ignore_errors=True)
            dist.barrier()
            times[name].append(_timed(lambda: ops[name](rep)))
    return {"times": times}


def load_rank(rank: int, world: int, work: str, mib: int, tensors: int, reps: int) -> Any:
    import torch.distributed.checkpoint as dcp

    import portable_ckpt.torch as pckt
    from portable_ckpt.torch.dcp import PortableStorageReader

    state = _state(world, mib, tensors, fill=False)
    roots = [os.path.join(work, f"save{i}") for i in range(3)]
    ops: dict[str, Callable[[], Any]] = {
        LOADERS[0]: lambda: dcp.load(state, storage_reader=dcp.FileSystemReader(roots[0])),
        LOADERS[1]: lambda: dcp.load(
            state, storage_reader=PortableStorageReader(roots[1], allow_statistical=True)
        ),
        LOADERS[2]: lambda: pckt.load(state, roots[2], allow_statistical=True),
    }
    times: dict[str, list[float]] = {n: [] for n in LOADERS}
    for rep in range(reps):
        for name in LOADERS[rep % 3 :] + LOADERS[: rep % 3]:
            times[name].append(_timed(ops[name]))
    return {"times": times}


def _summary(results: list[Any], names: tuple[str, ...]) -> dict[str, Any]:
    per_rep = {
        n: [max(r["times"][n][i] for r in results) for i in range(len(results[0]["times"][n]))]
        for n in names
    }
    base = per_rep[names[0]]
    out: dict[str, Any] = {}
    for n in names:
        ratios = [t / b for t, b in zip(per_rep[n], base, strict=True)]
        out[n] = {
            "median_s": statistics.median(per_rep[n]),
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "seconds": per_rep[n],
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--load-ranks", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--scratch", default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(dir=a.scratch, prefix="pck-dcp-layer-") as work:
        args = (work, a.mib, a.tensors, a.reps)
        group = {"timeout": 3600, "pg_timeout": 1800, "sys_path": [_REPO]}
        save = run_group("bench.bench_dcp_layer:save_rank", a.ranks, args, **group)
        save.raise_for_errors()
        load = run_group("bench.bench_dcp_layer:load_rank", a.load_ranks, args, **group)
        load.raise_for_errors()
    report = {
        "args": vars(a),
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
        "save": _summary(save.results, SAVERS),
        "load": _summary(load.results, LOADERS),
    }
    for what in ("save", "load"):
        print(
            f"{what} ({a.mib} MiB, {a.ranks} ranks{'' if what == 'save' else f' -> {a.load_ranks}'}):"
        )
        for name, row in report[what].items():
            print(
                f"  {name:28s} median {row['median_s']:7.3f} s   time x{row['ratio_median']:.2f} "
                f"({row['ratio_min']:.2f}-{row['ratio_max']:.2f}) of DCP's own (< 1: faster)"
            )
    print(f"load average {load0[0]:.1f} -> {report['loadavg_end'][0]:.1f}")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
