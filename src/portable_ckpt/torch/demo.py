"""``portable-ckpt demo``: train with FSDP2 on W ranks, save, stop everything, resume on M ranks.

Phases, each in a fresh gloo process group on loopback (all processes exit in between):

1. ``reference`` (W ranks): ``steps`` steps under a
   :class:`~portable_ckpt.torch.CheckpointManager` with a fast tier (every step) and the
   durable root (``save_step``), all async: training keeps going while the saves run (the
   checkpoint must still hold the values of ``save_step``). After ``save_step`` a SIGTERM reaches
   one rank: every rank saves the next step synchronously and stops checkpointing (a real job
   would exit; the demo trains on to record the uninterrupted reference). It records the loss
   of every step, SHA-256 digests of every full tensor at ``save_step`` and at the end, and the
   manager's telemetry (pause, throughput, commits, verification, retention).
2. ``resume-same`` (W ranks): fresh model with other initial values, ``mgr.restore`` of
   ``save_step``, continue to ``steps``. Contract ``exact``: every later loss and every final
   parameter must be bit-identical to the reference.
3. ``resume-resized`` (M ranks): a restore without ``allow_statistical`` must be refused
   (PCK-CONTRACT); with it, every restored tensor must equal the saved one exactly and step,
   scheduler, scaler and data position must continue; the losses are compared statistically.

The model is an MLP with dropout (so RNG state matters) sharded with ``fully_shard``; the
optimizer is AdamW, with a warm-up + cosine LR schedule, a gradient scaler
(``torch.amp.GradScaler("cpu")``) and a global data cursor over a synthetic regression set.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import signal
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from portable_ckpt.torch._proc import reset_peak_rss, rss

if TYPE_CHECKING:
    from portable_ckpt.torch.info import LoadInfo

__all__ = ["DemoConfig", "run_demo"]


@dataclass
class DemoConfig:
    """Options of the demo.

    Attributes:
        ranks: World size of the reference run and the same-size resume.
        resume_ranks: World size of the resized resume.
        steps: Total optimizer steps.
        save_step: Step after which the checkpoint is taken.
        hidden: Hidden width (odd widths give uneven shards).
        layers: Hidden layers.
        batch: Global batch size (samples per step over all ranks).
        in_dim: Input features.
        out_dim: Outputs.
        samples: Size of the synthetic dataset.
        lr: Peak learning rate.
        seed: Seed of everything.
        out: Output directory (report, plot, checkpoint root).
        root: Checkpoint root (default ``<out>/checkpoints``).
        same_size: Run the same-size resume.
        codec: Chunk codec.

    """

    ranks: int = 4
    resume_ranks: int = 3
    steps: int = 12
    save_step: int = 6
    hidden: int = 50
    layers: int = 2
    batch: int = 24
    in_dim: int = 16
    out_dim: int = 4
    samples: int = 240
    lr: float = 3e-3
    seed: int = 1234
    out: str = "demo-output"
    root: str | None = None
    same_size: bool = True
    codec: str = "none"


# -- the per-rank training program -----------------------------------------------------------------


def _build(cfg: dict[str, Any], rank: int, world: int, init_seed: int) -> dict[str, Any]:
    import numpy as np
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import portable_ckpt.torch as pckt

    torch.manual_seed(init_seed)  # identical initial values on every rank
    layers: list[torch.nn.Module] = [
        torch.nn.Linear(cfg["in_dim"], cfg["hidden"]),
        torch.nn.GELU(),
        torch.nn.Dropout(0.1),
    ]
    for _ in range(cfg["layers"] - 1):
        layers += [torch.nn.Linear(cfg["hidden"], cfg["hidden"]), torch.nn.GELU()]
    layers.append(torch.nn.Linear(cfg["hidden"], cfg["out_dim"]))
    model = torch.nn.Sequential(*layers)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.01)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=3)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, cfg["steps"]))
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[3])
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    # Per-rank generators (dropout uses torch's; the others are captured to show they round-trip).
    torch.manual_seed(cfg["seed"] * 1000 + rank)
    random.seed(cfg["seed"] * 1000 + rank)
    np.random.seed(cfg["seed"] * 1000 + rank)
    # Synthetic regression data: a fixed random teacher, the same on every rank.
    g = torch.Generator().manual_seed(cfg["seed"])
    x = torch.randn(cfg["samples"], cfg["in_dim"], generator=g)
    teacher = torch.randn(cfg["in_dim"], cfg["out_dim"], generator=g)
    y = torch.tanh(x @ teacher) + 0.05 * torch.randn(cfg["samples"], cfg["out_dim"], generator=g)
    return {
        "model": model,
        "opt": opt,
        "sched": sched,
        "scaler": scaler,
        "x": x,
        "y": y,
        "data": pckt.DataPosition(0, 0, {"sampler_seed": cfg["seed"]}),
        "rng": pckt.RNGState(),
    }


def _batch(env: dict[str, Any], cfg: dict[str, Any], rank: int, world: int) -> tuple[Any, Any]:
    import torch

    pos = env["data"]
    n = cfg["samples"]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(cfg["seed"] + pos.epoch))
    idx = [perm[(pos.global_sample_index + i) % n].item() for i in range(cfg["batch"])]
    mine = torch.tensor(idx).chunk(world)
    local = mine[rank] if rank < len(mine) else torch.tensor([], dtype=torch.long)
    return env["x"][local], env["y"][local]


def _step(env: dict[str, Any], cfg: dict[str, Any], rank: int, world: int) -> float:
    import torch.distributed as dist

    model, opt, sched, scaler = env["model"], env["opt"], env["sched"], env["scaler"]
    xb, yb = _batch(env, cfg, rank, world)
    opt.zero_grad(set_to_none=True)
    per_sample = ((model(xb) - yb) ** 2).mean(dim=1)
    # FSDP averages gradients over ranks: scale so the gradient is the global batch mean.
    loss = per_sample.sum() * world / cfg["batch"]
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    sched.step()
    pos = env["data"]
    pos.global_sample_index += cfg["batch"]
    if pos.global_sample_index >= cfg["samples"]:
        pos.epoch += 1
        pos.global_sample_index -= cfg["samples"]
    total = per_sample.detach().sum().reshape(1)
    dist.all_reduce(total)
    return float(total.item()) / float(cfg["batch"])


def _state(env: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(env["model"], env["opt"])
    return {
        "model": msd,
        "optim": osd,
        "sched": env["sched"],
        "scaler": env["scaler"],
        "data": env["data"],
        "rng": env["rng"],
    }


def _digests(state: dict[str, Any]) -> dict[str, str]:
    """SHA-256 of every full tensor of the state (collective: gathers DTensors)."""
    from portable_ckpt.torch._tensors import numpy_view
    from portable_ckpt.torch.flatten import flatten_state

    out = {}
    for key, t in flatten_state(state).tensors.items():
        full = t.full_tensor() if hasattr(t, "full_tensor") else t
        out[key] = hashlib.sha256(
            numpy_view(full.detach().contiguous(), key=key).tobytes()
        ).hexdigest()[:16]
    return out


def _sample_values(state: dict[str, Any]) -> dict[str, Any]:
    t = state["model"]
    key = sorted(t)[0]
    full = t[key].full_tensor()
    return {"key": f"model/{key}", "first_values": [float(v) for v in full.reshape(-1)[:4]]}


def _rank_main(rank: int, world: int, cfg: dict[str, Any], phase: str) -> dict[str, Any]:
    res: dict[str, Any] = {"rank": rank, "world": world, "phase": phase, "losses": {}}
    if phase == "reference":
        _reference(res, cfg, rank, world)
    else:
        _resume(res, cfg, rank, world, phase)
    return res


def _manager(cfg: dict[str, Any]) -> Any:
    """The demo's CheckpointManager: durable root + fast tier, async saves, telemetry."""
    import portable_ckpt.torch as pckt

    return pckt.CheckpointManager(
        cfg["root"],
        save_steps=[cfg["save_step"]],
        keep_last=3,
        fast_root=cfg.get("fast_root") or cfg["root"] + "-fast",
        fast_every=1,
        fast_keep=2,
        verify_sample=0.5,
        events=cfg.get("events"),
        timeout=120,
        codec=cfg["codec"],
    )


def _managed(env: dict[str, Any]) -> dict[str, Any]:
    """The live state the manager asks at each save (no stale get_state_dict snapshot)."""
    import portable_ckpt.torch as pckt

    return {
        "train": pckt.ModelOptimizerState(env["model"], env["opt"]),
        "sched": env["sched"],
        "scaler": env["scaler"],
        "data": env["data"],
        "rng": env["rng"],
    }


def _reference(res: dict[str, Any], cfg: dict[str, Any], rank: int, world: int) -> None:
    """Train ``steps`` steps under the manager; a SIGTERM reaches one rank after ``save_step``.

    The manager saves every step to the fast tier and ``save_step`` durably, all async
    (training continues and mutates the state while the saves run); the SIGTERM makes the next
    step's save synchronous and ``preempted`` true on every rank. A real job would exit there;
    the demo stops checkpointing and trains on to record the uninterrupted reference.
    """
    env = _build(cfg, rank, world, cfg["seed"])
    state, mgr = _managed(env), _manager(cfg)
    for step in range(1, cfg["steps"] + 1):
        res["losses"][step] = _step(env, cfg, rank, world)
        if step == cfg["save_step"]:
            _record_at_save(res, env)
        if step == cfg["save_step"] + 1 and rank == world - 1:
            os.kill(os.getpid(), signal.SIGTERM)  # a preemption notice reaches one rank only
        if "preempted_at" not in res:
            mgr.maybe_save(step, state, metrics={"loss": res["losses"][step]})
            if step == cfg["save_step"]:
                res["staging_bytes"] = _staging_bytes()  # reused host buffers of the async save
            if mgr.preempted:
                res["preempted_at"] = step
    mgr.close()
    saves = [e for e in mgr.telemetry.history if e["event"] == "save"]
    at = next(e for e in saves if e["step"] == cfg["save_step"])
    res["save_blocking_seconds"] = at["pause_s"]
    res["save"] = {
        "checkpoint_id": at["checkpoint_id"],
        "seconds": at["seconds"],
        "bytes_written": at["bytes"],
        "total_bytes": at["total_bytes"],
    }
    res["telemetry"] = mgr.telemetry.history
    res["final_digests"] = _digests(_state(env))


def _staging_bytes() -> int:
    import portable_ckpt.torch as pckt

    return int(pckt.staging_bytes())


def _record_at_save(res: dict[str, Any], env: dict[str, Any]) -> None:
    state = _state(env)
    res["digests_at_save"] = _digests(state)
    res["sample_at_save"] = _sample_values(state)
    res["sched_at_save"] = env["sched"].state_dict()["last_epoch"]
    res["scale_at_save"] = float(env["scaler"].get_scale())
    res["data_at_save"] = env["data"].capture()


def _resume(res: dict[str, Any], cfg: dict[str, Any], rank: int, world: int, phase: str) -> None:
    """Fresh model with other initial values (so the restore is visible), load, continue."""
    env = _build(cfg, rank, world, cfg["seed"] + 99)
    res["sample_before_load"] = _sample_values(_state(env))
    state, mgr = _managed(env), _manager(cfg)
    if phase == "resume-resized":
        res["contract_refused"] = _refused_load(mgr, state, cfg["save_step"])
    linfo = _measured_load(res, mgr, state, cfg["save_step"], phase == "resume-resized")
    res["telemetry"] = mgr.telemetry.history
    mgr.close()
    _record_restored(res, env)
    t1 = time.perf_counter()
    for step in range(linfo.step + 1, cfg["steps"] + 1):
        res["losses"][step] = _step(env, cfg, rank, world)
        if step == linfo.step + 1:
            res["first_step_seconds"] = time.perf_counter() - t1
    res["final_digests"] = _digests(_state(env))


def _refused_load(mgr: Any, state: dict[str, Any], step: int) -> dict[str, str] | None:
    """A restore onto another world size without ``allow_statistical``: must raise PCK-CONTRACT."""
    from portable_ckpt.errors import ContractError

    try:
        mgr.restore(state, step=step)
    except ContractError as e:
        return {"code": e.code, "message": e.message}
    return None


def _measured_load(
    res: dict[str, Any], mgr: Any, state: dict[str, Any], step: int, statistical: bool
) -> LoadInfo:
    """Restore the save step through the manager (recording ranges, time and RSS growth)."""
    import torch

    torch.distributed.barrier()
    cur0, _ = rss()
    reset_peak_rss()
    t0 = time.perf_counter()
    linfo: LoadInfo | None = mgr.restore(
        state, step=step, allow_statistical=statistical, record_ranges=True
    )
    if linfo is None:
        raise RuntimeError(f"no committed version of step {step} in either tier")
    res["load_seconds"] = time.perf_counter() - t0
    _, peak = rss()
    res["rss_growth_bytes"] = max(0, peak - cur0)
    res["load"] = {
        "checkpoint_id": linfo.checkpoint_id,
        "step": linfo.step,
        "contract": linfo.contract,
        "saved_world_size": linfo.saved_world_size,
        **linfo.counters(),
    }
    res["range_map"] = [
        r for r in (linfo.range_map or []) if r["key"].startswith("train/model/0.weight")
    ]
    return linfo


def _record_restored(res: dict[str, Any], env: dict[str, Any]) -> None:
    state = _state(env)
    res["digests_after_load"] = _digests(state)
    res["sample_after_load"] = _sample_values(state)
    res["sched_after_load"] = env["sched"].state_dict()["last_epoch"]
    res["lr_after_load"] = [float(g["lr"]) for g in env["opt"].param_groups]
    res["scale_after_load"] = float(env["scaler"].get_scale())
    res["data_after_load"] = env["data"].capture()
    res["rng_restored"] = env["rng"].restored


# -- orchestration ---------------------------------------------------------------------------------


def _check(checks: list[dict[str, Any]], name: str, ok: bool, detail: str) -> None:
    checks.append({"check": name, "ok": bool(ok), "detail": detail})
    print(f"  [{'PASS' if ok else 'FAIL'}] {name}: {detail}")


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def _run_phase(cfg: dict[str, Any], world: int, phase: str) -> list[dict[str, Any]]:
    from portable_ckpt.torch.launch import run_group

    t0 = time.perf_counter()
    res = run_group(_rank_main, world, (cfg, phase), timeout=600, pg_timeout=120)
    res.raise_for_errors()
    print(f"  {phase}: {world} ranks, {time.perf_counter() - t0:.1f} s (all processes exited)")
    return [dict(r) for r in res.results]


def _losses(r: dict[str, Any]) -> dict[int, float]:
    return {int(k): float(v) for k, v in r["losses"].items()}


@dataclass
class _Runs:
    """Every rank's result of each phase (``same`` is None when the same-size resume is off)."""

    ref: list[dict[str, Any]]
    same: list[dict[str, Any]] | None
    resized: list[dict[str, Any]]


@dataclass
class _Stored:
    """What the demo reads back from the stored version."""

    tensor_schema: list[dict[str, Any]]
    entry_schema: list[dict[str, Any]]
    problems: list[Any]
    total_bytes: int


def run_demo(config: DemoConfig | None = None, *, verbose: bool = True) -> dict[str, Any]:
    """Run the demo and return its report (also written to ``<out>/demo-report.json``).

    The report's ``ok`` is true when every check passed.
    """
    import portable_ckpt

    cfg = config or DemoConfig()
    if not 1 <= cfg.save_step < cfg.steps:
        raise ValueError("need 1 <= save_step < steps")
    out = os.path.abspath(cfg.out)
    os.makedirs(out, exist_ok=True)
    root = os.path.abspath(cfg.root or os.path.join(out, "checkpoints"))
    _fresh_roots(out, [root, root + "-fast"])
    events = os.path.join(out, "checkpoint-events.jsonl")
    if os.path.exists(events):
        os.remove(events)
    c = {**asdict(cfg), "root": root, "fast_root": root + "-fast", "events": events}
    t_start = time.perf_counter()
    print(
        f"portable-ckpt demo: FSDP2 MLP on CPU/gloo, {cfg.ranks} ranks -> save at step "
        f"{cfg.save_step} (and a preemption save at step {cfg.save_step + 1}) -> resume step "
        f"{cfg.save_step} on {cfg.resume_ranks} ranks (and on {cfg.ranks}); root {root}"
    )
    ref = _run_phase(c, cfg.ranks, "reference")
    print(
        f"  (each resume restores step {cfg.save_step} on purpose, below the preemption save of "
        f"step {cfg.save_step + 1}: the manager's rollback warning on stderr is expected)"
    )
    runs = _Runs(
        ref=ref,
        same=_run_phase(c, cfg.ranks, "resume-same") if cfg.same_size else None,
        resized=_run_phase(c, cfg.resume_ranks, "resume-resized"),
    )
    ck = portable_ckpt.open(root, step=cfg.save_step)
    stored = _describe_version(ck)
    _print_load_evidence(runs.resized)
    print("\n== Checks")
    checks: list[dict[str, Any]] = []
    n_problems = len(stored.problems)
    _check(
        checks,
        "checkpoint verifies",
        not n_problems,
        f"{n_problems} problems after deep verification",
    )
    _check_async_snapshot(checks, runs)
    _check_manager(checks, cfg, runs, root)
    if runs.same is not None:
        _check_same_size(checks, cfg, runs.ref[0], runs.same[0])
    _check_resized(checks, cfg, runs)
    _print_losses(cfg, runs)
    report = _report(cfg, c, time.perf_counter() - t_start, checks, ck, stored, runs)
    _write_report(report, out, cfg)
    return report


_OWNED = ".demo-roots.json"


def _fresh_roots(out: str, roots: list[str]) -> None:
    """Start every run from empty checkpoint roots.

    The job keeps its newest versions by step, so versions an earlier run left (steps past the
    save step) would displace this run's save before it is restored. A root an earlier demo run
    created (listed in ``<out>/.demo-roots.json``, or named by the ``demo-report.json`` an
    earlier run wrote there) is emptied; any other root that holds files is refused, since
    nothing the demo did not write is deleted.
    """
    from portable_ckpt.errors import UsageError
    from portable_ckpt.format.naming import ATTEMPT_ID_RE

    marker = os.path.join(out, _OWNED)
    owned: set[str] = set()
    for path, pick in (
        (marker, lambda doc: doc),
        (os.path.join(out, "demo-report.json"), lambda doc: [
            doc["config"].get("root"), doc["config"].get("fast_root")
        ]),
    ):
        try:
            with open(path, encoding="utf-8") as f:
                owned |= {r for r in pick(json.load(f)) if isinstance(r, str)}
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            pass  # unreadable: owns nothing
    for r in roots:
        children = os.listdir(r) if os.path.isdir(r) else []
        # emptied only when the demo made it and it holds nothing but attempt directories
        mine = r in owned and all(
            ATTEMPT_ID_RE.match(c) and not os.path.islink(os.path.join(r, c)) for c in children
        )
        if children and not mine:
            raise UsageError(
                f"{r} holds files that no earlier demo run in {out} wrote; the demo "
                f"needs an empty root (the job keeps its newest steps, so an earlier job's "
                f"versions would displace this run's): pass --root or --out naming a new "
                f"directory, or remove {r}"
            )
    for r in roots:
        for c in os.listdir(r) if os.path.isdir(r) else []:
            shutil.rmtree(os.path.join(r, c))
    tmp = marker + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(sorted(owned | set(roots)), f)
    os.replace(tmp, marker)


def _describe_version(ck: Any) -> _Stored:
    """Print the manifest, the tensor and entry schemas and a deep verification of ``ck``."""
    man = ck.manifest
    print("\n== Manifest")
    print(
        f"  version {ck.id}  step {ck.step}  contract {ck.continuation.contract} "
        f"world_size {ck.continuation.world_size} mesh "
        f"{ck.continuation.mesh.to_json() if ck.continuation.mesh else None}"
    )
    total = sum(f.size for f in man.files.values())
    print(
        f"  {len(man.files)} files, {total} bytes, checksum crc32c; committed_at {man.committed_at}"
    )
    tensor_schema, entry_schema = _tensor_schema(ck), _entry_schema(ck)
    problems = ck.verify(deep=True)
    print(
        f"\n== Deep verification of the stored version: {len(problems)} problem(s) "
        f"(every block's crc32c, exactly-once coverage of every tensor, entry schemas)"
    )
    return _Stored(tensor_schema, entry_schema, problems, total)


def _tensor_schema(ck: Any) -> list[dict[str, Any]]:
    print("\n== Tensor schema (key, dtype, global shape, stored ranges -> writer files)")
    schema = []
    for key, t in ck.tensors.items():
        files = sorted({r.file.split("/")[-1] for r in t.ranges})
        schema.append(
            {
                "key": key,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "ranges": len(t.ranges),
                "files": files,
            }
        )
        print(
            f"  {key:<34} {t.dtype:<8} {list(t.shape)!s:<10} {len(t.ranges)} range(s) in {', '.join(files)}"
        )
    return schema


def _entry_schema(ck: Any) -> list[dict[str, Any]]:
    print("\n== Non-tensor schema (entry, schema, scope, world_size_policy, values)")
    schema = []
    width = max((len(n) for n in ck.entries), default=0)
    for name, e in ck.entries.items():
        sid = e.schema.get("id", "json_schema")
        schema.append(
            {
                "name": name,
                "schema": sid,
                "scope": e.scope,
                "policy": e.world_size_policy,
                "values": len(e.values),
            }
        )
        print(
            f"  {name:<{width}} {sid:<22} {e.scope:<9} {e.world_size_policy or '-':<8} {len(e.values)} value(s)"
        )
    return schema


def _print_load_evidence(resized: list[dict[str, Any]]) -> None:
    print("\n== Stored-to-target range map (model/0.weight, resized resume)")
    for r in resized:
        for m in r["range_map"]:
            print(
                f"  rank {r['rank']}: stored box {m['stored']} in {m['file']} -> target box "
                f"{m['target']} of local shard {m['local_target']['offsets']}+{m['local_target']['lengths']}"
            )
    print("\n== Load evidence per rank (resized resume)")
    for r in resized:
        ld = r["load"]
        print(
            f"  rank {r['rank']}: {ld['tensors_loaded']} tensors, target {ld['target_bytes']} B, read "
            f"{ld['bytes_read']} B, {ld['blocks_verified']} checksum blocks verified, "
            f"{ld['elements_covered']} elements proven covered exactly once, peak temp "
            f"{ld['peak_temp_bytes']} B, RSS growth {_mib(r['rss_growth_bytes'])}, load {r['load_seconds'] * 1e3:.0f} ms"
        )


def _check_async_snapshot(checks: list[dict[str, Any]], runs: _Runs) -> None:
    ref0 = runs.ref[0]
    _check(
        checks,
        "async save snapshot",
        all(r["digests_at_save"] == runs.resized[0]["digests_after_load"] for r in runs.ref[:1]),
        "tensors restored from the checkpoint equal the state at the save step although training "
        f"mutated it while the save ran (blocking {ref0['save_blocking_seconds'] * 1e3:.1f} ms, staging "
        f"{_mib(ref0['staging_bytes'])} per rank)",
    )


def _check_manager(checks: list[dict[str, Any]], cfg: DemoConfig, runs: _Runs, root: str) -> None:
    """Preemption, tiers and the telemetry the manager recorded."""
    import portable_ckpt

    pre = [r.get("preempted_at") for r in runs.ref]
    saves = [e for e in runs.ref[0]["telemetry"] if e["event"] == "save"]
    last = saves[-1] if saves else {}
    _check(
        checks,
        "preemption save",
        pre == [cfg.save_step + 1] * len(pre) and last.get("reason") == "preemption"
        and last.get("mode") == "sync" and portable_ckpt.open(root).step == cfg.save_step + 1,
        f"SIGTERM to rank {cfg.ranks - 1} only; every rank saved step {pre[0]} synchronously "
        "and stopped checkpointing",
    )
    fast = [v for v in portable_ckpt.list_versions(root + "-fast") if v.status == "committed"]
    _check(
        checks,
        "fast and durable tiers",
        bool(fast) and {e["tier"] for e in saves} == {"fast", "durable"},
        f"fast tier keeps steps {[v.step for v in fast]}; durable "
        f"{[v.step for v in portable_ckpt.list_versions(root) if v.status == 'committed']}",
    )
    print("\n== Telemetry (rank 0; every rank also logs to the 'portable_ckpt' logger)")
    print(f"  {'step':>4}  {'tier':7}  {'reason':10}  {'mode':5}  {'pause s':>8}  {'save s':>7}"
          f"  {'MiB':>6}  {'MiB/s':>7}")
    for e in saves:
        print(f"  {e['step']:>4}  {e['tier']:7}  {e['reason']:10}  {e['mode']:5}  "
              f"{e['pause_s']:8.3f}  {e['seconds']:7.3f}  {e['bytes'] / 2**20:6.2f}  "
              f"{e['mib_per_s']:7.1f}")
    restores = [e for r in (runs.same or [])[:1] + runs.resized[:1] for e in r["telemetry"]
                if e["event"] == "restore" and e.get("ok") and e.get("tier")]
    for e in restores:
        print(f"  restore step {e['step']} from {e['tier']}: {e['bytes'] / 2**20:.2f} MiB in "
              f"{e['seconds']:.3f} s, slowest rank {e['slowest_rank']} "
              f"({e['slowest_rank_seconds']:.3f} s), contract {e['contract']}")


def _later(cfg: DemoConfig, ref0: dict[str, Any]) -> list[int]:
    return [k for k in sorted(_losses(ref0)) if k > cfg.save_step]


def _check_same_size(
    checks: list[dict[str, Any]], cfg: DemoConfig, ref0: dict[str, Any], s0: dict[str, Any]
) -> None:
    rl, sl, later = _losses(ref0), _losses(s0), _later(cfg, ref0)
    contract = s0["load"]["contract"]
    _check(checks, "same-size contract", contract == "exact", f"contract {contract}")
    _check(
        checks,
        "same-size restored values",
        s0["digests_after_load"] == ref0["digests_at_save"],
        f"{len(s0['digests_after_load'])} tensors bit-identical to the saved step",
    )
    _check(
        checks,
        "same-size next loss bit-identical",
        all(rl[k] == sl[k] for k in later),
        f"step {later[0]}: reference {rl[later[0]]!r} vs resumed {sl[later[0]]!r}; all {len(later)} later steps equal",
    )
    _check(
        checks,
        "same-size final parameters bit-identical",
        s0["final_digests"] == ref0["final_digests"],
        f"{len(s0['final_digests'])} tensors (params and AdamW moments)",
    )


def _check_resized(checks: list[dict[str, Any]], cfg: DemoConfig, runs: _Runs) -> None:
    ref0, z = runs.ref[0], runs.resized[0]
    refused: dict[str, Any] = z.get("contract_refused") or {}
    _check(
        checks,
        "contract enforced",
        refused.get("code") == "PCK-CONTRACT",
        f"{cfg.ranks}->{cfg.resume_ranks} without allow_statistical: {refused['code'] if refused else 'not refused'}",
    )
    contract = z["load"]["contract"]
    _check(checks, "resized contract", contract == "statistical", f"contract {contract}")
    _check(
        checks,
        "resized restored values exactly equal",
        z["digests_after_load"] == ref0["digests_at_save"],
        f"{len(z['digests_after_load'])} full tensors equal the saved ones (SHA-256)",
    )
    _check_continuation(checks, cfg, ref0, z)
    _check(
        checks,
        "per-rank RNG restored (policy modulo)",
        all(r["rng_restored"] for r in runs.resized),
        f"new rank r continues stored rank r mod {cfg.ranks}",
    )
    rl, zl, later = _losses(ref0), _losses(z), _later(cfg, ref0)
    rel = max(abs(zl[k] - rl[k]) / max(abs(rl[k]), 1e-12) for k in later)
    _check(
        checks,
        "resized losses statistically consistent",
        rel < 0.25 and all(math.isfinite(zl[k]) for k in later),
        f"max relative difference to the reference over {len(later)} steps: {rel:.2e}",
    )


def _check_continuation(
    checks: list[dict[str, Any]], cfg: DemoConfig, ref0: dict[str, Any], z: dict[str, Any]
) -> None:
    first = min(_losses(z))
    _check(
        checks,
        "step continues",
        z["load"]["step"] == cfg.save_step and first == cfg.save_step + 1,
        f"restored step {z['load']['step']}, first post-restore step {first}",
    )
    _check(
        checks,
        "scheduler continues",
        z["sched_after_load"] == ref0["sched_at_save"],
        f"last_epoch {z['sched_after_load']} (saved {ref0['sched_at_save']}), lr {z['lr_after_load']}",
    )
    _check(
        checks,
        "grad scaler continues",
        z["scale_after_load"] == ref0["scale_at_save"],
        f"scale {z['scale_after_load']} (saved {ref0['scale_at_save']})",
    )
    _check(
        checks,
        "data position continues",
        z["data_after_load"] == ref0["data_at_save"],
        f"{z['data_after_load']}",
    )


def _print_losses(cfg: DemoConfig, runs: _Runs) -> None:
    z = runs.resized[0]
    rl, zl = _losses(runs.ref[0]), _losses(z)
    sl = _losses(runs.same[0]) if runs.same else None
    print("\n== Restored values and the post-restore step")
    for when in ("before", "after"):
        sample = z[f"sample_{when}_load"]
        pad = " " if when == "after" else ""
        print(f"  {sample['key']}[:4] {when} load {pad}{sample['first_values']}")
    print(
        f"  {'step':>5} {'reference':>14} "
        + (f"{'resume-same':>14} " if sl is not None else "")
        + f"{'resume-resized':>14}"
    )

    def cell(v: float | None) -> str:
        return f"{v:>14.8f}" if v is not None else f"{'-':>14}"

    for k in sorted(rl):
        sval = cell(sl.get(k)) + " " if sl is not None else ""
        print(f"  {k:>5} {rl[k]:>14.8f} " + sval + cell(zl.get(k)))


def _report(
    cfg: DemoConfig,
    c: dict[str, Any],
    seconds: float,
    checks: list[dict[str, Any]],
    ck: Any,
    stored: _Stored,
    runs: _Runs,
) -> dict[str, Any]:
    ref0 = runs.ref[0]

    def loads(rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r["load"] | {"rss_growth_bytes": r["rss_growth_bytes"]} for r in rs]

    return {
        "ok": all(ch["ok"] for ch in checks),
        "config": c,
        "seconds": seconds,
        "checks": checks,
        "manifest": {
            "attempt_id": ck.id,
            "step": ck.step,
            "continuation": ck.continuation.to_json(),
            "files": len(ck.manifest.files),
            "bytes": stored.total_bytes,
        },
        "tensor_schema": stored.tensor_schema,
        "entry_schema": stored.entry_schema,
        "verify_problems": [str(p) for p in stored.problems],
        "save": {
            "blocking_seconds": [r["save_blocking_seconds"] for r in runs.ref],
            "staging_bytes": [r["staging_bytes"] for r in runs.ref],
            **ref0["save"],
        },
        "loads": {
            "resume-same": loads(runs.same) if runs.same else None,
            "resume-resized": loads(runs.resized),
        },
        "range_map": {str(r["rank"]): r["range_map"] for r in runs.resized},
        "losses": {
            "reference": _losses(ref0),
            "resume-same": _losses(runs.same[0]) if runs.same else None,
            "resume-resized": _losses(runs.resized[0]),
        },
        "first_step_seconds": [r.get("first_step_seconds") for r in runs.resized],
        "preempted_at": ref0.get("preempted_at"),
        "telemetry": {
            "reference": ref0["telemetry"],
            "resume-resized": runs.resized[0]["telemetry"],
        },
    }


def _write_report(report: dict[str, Any], out: str, cfg: DemoConfig) -> None:
    with open(os.path.join(out, "demo-report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    _plot(report, os.path.join(out, "loss.png"), cfg)
    print(
        f"\n{'ALL CHECKS PASSED' if report['ok'] else 'SOME CHECKS FAILED'} in {report['seconds']:.1f} s; "
        f"report {os.path.join(out, 'demo-report.json')}, plot {os.path.join(out, 'loss.png')}"
    )


def _plot(report: dict[str, Any], path: str, cfg: DemoConfig) -> None:
    try:
        import matplotlib
    except ImportError:
        print("  (matplotlib is not installed: no loss plot; pip install matplotlib)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, style in (("reference", "-o"), ("resume-same", "--s"), ("resume-resized", ":^")):
        curve = report["losses"].get(name)
        if curve:
            ks = sorted(curve)
            label = {
                "reference": f"reference ({cfg.ranks} ranks, uninterrupted)",
                "resume-same": f"resumed on {cfg.ranks} ranks (exact)",
                "resume-resized": f"resumed on {cfg.resume_ranks} ranks (statistical)",
            }[name]
            ax.plot(ks, [curve[k] for k in ks], style, label=label, markersize=4)
    ax.axvline(cfg.save_step, color="grey", linewidth=1)
    ax.text(cfg.save_step, ax.get_ylim()[1], " checkpoint", va="top", color="grey")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (global batch mean)")
    ax.set_title("portable-ckpt demo: FSDP2 save, stop, resume")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
