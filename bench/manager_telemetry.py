"""What the CheckpointManager's telemetry reports on the realistic state (issue 14's figures).

Two gloo ranks build the GPT-like FSDP2 model of :mod:`bench.realistic_model` (``full``: 939 MiB
per version) and run a manager with a fast tier (``/dev/shm`` when present) and a durable root
on disk: async saves alternate fast / durable (``fast_every=1``, ``save_every=2``), each
followed by training steps. Then a second manager restores (the fast tier's newest version), a
training step runs, and ``mark_resumed`` reports the time to resume; the same again with the
fast tier removed (the durable tier). Every figure printed is the telemetry's own event.

    ./dev python -m bench.manager_telemetry --preset full --saves 7
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _manager(spec: dict[str, Any], **kw: Any) -> Any:
    import portable_ckpt.torch as pckt

    return pckt.CheckpointManager(
        spec["durable"],
        fast_root=spec["fast"],
        fast_every=1,
        save_every=2,
        fast_keep=2,
        keep_last=2,
        timeout=1800,
        handle_sigterm=False,
        **kw,
    )


def rank_main(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    """One rank: saves through the manager, then two restores; returns its telemetry events."""
    import portable_ckpt.torch as pckt
    from bench.realistic_model import ModelConfig, build, train_step

    env = build(ModelConfig(**spec["model"]), rank, world)
    state = {"train": pckt.ModelOptimizerState(env["model"], env["opt"])}
    events: list[dict[str, Any]] = []
    with _manager(spec) as mgr:
        for step in range(1, spec["saves"] + 1):
            mgr.maybe_save(step, state)
            for _ in range(spec["steps_between"]):
                train_step(env)
        mgr.wait()
        events += mgr.telemetry.history
    for phase in ("fast", "durable"):
        if phase == "durable" and rank == 0:
            shutil.rmtree(spec["fast"], ignore_errors=True)
        _barrier()
        with _manager(spec) as mgr:
            mgr.restore(state)
            train_step(env)
            mgr.mark_resumed()
            events += [{**e, "phase": phase} for e in mgr.telemetry.history]
    return {"rank": rank, "events": events}


def _barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def _median(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians and spread of the telemetry's figures, per tier."""
    out: dict[str, Any] = {}
    for tier in ("fast", "durable"):
        saves = [
            e for r in results for e in r["events"] if e["event"] == "save" and e["tier"] == tier
        ]
        if saves:
            out[f"save_{tier}"] = {
                "pause_s": _median([e["pause_s"] for e in saves]),
                "seconds": _median([e["seconds"] for e in saves]),
                "mib_per_s_per_rank": _median([e["mib_per_s"] for e in saves]),
                "bytes_per_rank": saves[0]["bytes"],
                "total_bytes": saves[0]["total_bytes"],
            }
    for r in results[:1]:
        for e in r["events"]:
            if e["event"] in ("restore", "resume") and "phase" in e:
                keep = ("tier", "seconds", "bytes", "mib_per_s", "slowest_rank", "step")
                out[f"{e['event']}_{e['phase']}"] = {k: e.get(k) for k in keep if k in e}
    return out


def main(argv: list[str] | None = None) -> int:
    from bench.realistic_model import PRESETS
    from portable_ckpt.torch.launch import run_group

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="full", choices=sorted(PRESETS))
    ap.add_argument("--saves", type=int, default=7, help="odd: the newest version is a fast one")
    ap.add_argument("--steps-between", type=int, default=1)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--scratch", default=tempfile.gettempdir())
    args = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="mgr-telemetry-", dir=args.scratch)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else work
    fast = tempfile.mkdtemp(prefix="mgr-telemetry-fast-", dir=shm)
    spec = {
        "model": PRESETS[args.preset].__dict__,
        "durable": os.path.join(work, "durable"),
        "fast": fast,
        "saves": args.saves,
        "steps_between": args.steps_between,
    }
    try:
        res = run_group(
            "bench.manager_telemetry:rank_main",
            args.world,
            (spec,),
            timeout=7200,
            pg_timeout=1800,
            sys_path=[REPO, os.path.join(REPO, "src")],
        )
        res.raise_for_errors()
        report = {"preset": args.preset, "world": args.world, "fast_root": shm}
        report.update(summarize(list(res.results)))
        json.dump(report, sys.stdout, indent=2)
        print()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(fast, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
