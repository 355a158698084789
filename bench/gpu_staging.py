"""Staging throughput on a GPU: our device-to-host staging against cudaMemcpy of the same bytes.

    python -m bench.gpu_staging --out bench/results/gpu-check     # writes .json and .md

The state is the realistic benchmark's GPT-like model on one GPU (fp32 weights and two AdamW
moments per parameter: hundreds of tensors from a few KiB to tens of MiB; ``--scale`` shrinks or
grows it). Contenders, alternated, ``--reps`` repetitions, medians with min–max:

* ``cudaMemcpy (one buffer)``: one ``copy_`` of a single device tensor of the same total size into
  one page-locked host tensor — the link's peak;
* ``cudaMemcpy (per tensor)``: ``copy_(non_blocking=True)`` of every tensor into its own slice
  of one page-locked host buffer, one synchronize — what any stager must at least pay;
* ``stage, private pinned``: :func:`portable_ckpt.torch.staging.stage` of the planned state into
  :data:`~portable_ckpt.torch.staging.POOL` (thread mode, sync saves of device tensors);
* ``stage, shared segment``: the same into the registered shared-memory segment (process mode);
* ``async_save blocking (thread|process)``: the whole call, planning included (to a scratch
  directory; the background write then runs and is waited for, outside the timing).

Needs a CUDA build of torch; exits 3 with a message otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

__all__ = ["main", "measure", "write_report"]

GIB = 1 << 30


def _shapes(scale: float) -> list[tuple[int, ...]]:
    """Parameter shapes of the realistic GPT-like model (vocab, d_model, layers scaled)."""
    vocab, d, layers, ctx = int(16000 * scale), int(768 * max(scale, 0.05)), 8, 1024
    block = [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,), (d,), (d,), (4 * d, d), (4 * d,),
             (d, 4 * d), (d,)]
    return [(vocab, d), (ctx, d)] + block * layers + [(d,), (d,), (vocab, d)]


def _state(scale: float, dev: Any) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    for i, shape in enumerate(_shapes(scale)):
        for part in ("w", "m", "v"):  # weight and the two AdamW moments
            out[f"p{i}.{part}"] = torch.randn(shape, device=dev)
    return out


def _time(fn: Any) -> float:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def _contenders(state: dict[str, Any], scratch: str) -> dict[str, Any]:
    import torch

    import portable_ckpt.torch as pckt
    from portable_ckpt.torch._shm import SHARED
    from portable_ckpt.torch.flatten import flatten_state
    from portable_ckpt.torch.plan import plan_save
    from portable_ckpt.torch.staging import POOL, stage
    from portable_ckpt.torch.state import capture_rng

    total = sum(t.numel() * t.element_size() for t in state.values())
    flat_dev = torch.empty(total, dtype=torch.uint8, device=next(iter(state.values())).device)
    flat_host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    views, off = [], 0
    for t in state.values():
        n = t.numel() * t.element_size()
        views.append((flat_host[off : off + n].view(t.dtype).view(t.shape), t))
        off += n

    def per_tensor() -> None:
        for dst, src in views:
            dst.copy_(src, non_blocking=True)

    def staged(into: Any) -> None:
        plan = plan_save(flatten_state(state), 0, capture_rng())
        stage(plan, True, into)
        plan.release()

    counter = iter(range(1, 1 << 30))

    def blocking(mode: str) -> float:
        # Timed from outside: the whole call, as the training loop feels it (the handle's own
        # counter leaves out the mode check before staging).
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        h = pckt.async_save(state, scratch, step=next(counter), mode=mode,
                            continuation="statistical")  # no RNG in a bare state
        seconds = time.perf_counter() - t0
        shutil.rmtree(os.path.join(scratch, h.result().checkpoint_id))  # bounded disk use
        return seconds

    return {
        "cudaMemcpy (one buffer)": lambda: _time(lambda: flat_host.copy_(flat_dev)),
        "cudaMemcpy (per tensor)": lambda: _time(per_tensor),
        "stage, private pinned": lambda: _time(lambda: staged(POOL)),
        "stage, shared segment": lambda: _time(lambda: staged(SHARED)),
        "async_save blocking (thread)": lambda: blocking("thread"),
        "async_save blocking (process)": lambda: blocking("process"),
        "_bytes": total,
    }


def measure(scale: float, reps: int) -> dict[str, Any]:
    """Run every contender ``reps`` times (rotated); return the raw seconds and a summary."""
    import torch

    dev = torch.device("cuda", torch.cuda.current_device())
    state = _state(scale, dev)
    with tempfile.TemporaryDirectory(prefix="pck-gpu-") as scratch:
        fns = _contenders(state, scratch)
        total = fns.pop("_bytes")
        names = list(fns)
        for name in names:  # first calls: allocation, registration, writer start
            fns[name]()
        times: dict[str, list[float]] = {n: [] for n in names}
        for rep in range(reps):
            k = rep % len(names)
            for name in names[k:] + names[:k]:
                times[name].append(float(fns[name]()))
    base = statistics.median(times["cudaMemcpy (per tensor)"])
    rows = [{"contender": n, "median s": statistics.median(ts), "min s": min(ts), "max s": max(ts),
             "GiB/s": total / GIB / statistics.median(ts),
             "× cudaMemcpy per tensor": statistics.median(ts) / base} for n, ts in times.items()]
    return {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
            "tensors": len(state), "bytes": total, "reps": reps, "rows": rows, "times": times}


def _markdown(res: dict[str, Any]) -> str:
    lines = [f"# GPU staging throughput — {res['device']}", "",
             f"torch {res['torch']}; {res['tensors']} tensors, {res['bytes'] / GIB:.2f} GiB; "
             f"{res['reps']} repetitions, rotated; median [min–max].", "",
             "| contender | median s [min–max] | GiB/s | × cudaMemcpy per tensor |",
             "|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['contender']} | {r['median s']:.4f} [{r['min s']:.4f}–{r['max s']:.4f}]"
                     f" | {r['GiB/s']:.2f} | {r['× cudaMemcpy per tensor']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Measure and write ``<out>.json`` and ``<out>.md``."""
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_staging", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join("bench", "results", "gpu-staging"))
    ap.add_argument("--scale", type=float, default=1.0, help="model size factor (1.0: ~0.9 GiB)")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_staging: torch sees no CUDA device (a CPU build, or no GPU); nothing measured",
              file=sys.stderr)
        return 3
    write_report(a.out, measure(a.scale, a.reps), _markdown)
    return 0


def write_report(out: str, res: dict[str, Any], markdown: Any) -> None:
    """Write ``<out>.json`` and ``<out>.md`` (``markdown(res)``), and print the table."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".json", "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)
    with open(out + ".md", "w", encoding="utf-8") as f:
        f.write(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    sys.exit(main())
