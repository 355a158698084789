"""A real GPU training step while an async save is in flight: portable_ckpt against DCP.

    python -m bench.gpu_step --out bench/results/gpu-step      # writes .json and .md

Issue 13's accelerator-like loop (a GIL-free sleep plus a little Python work) stands in for a
GPU step on machines without one. This is the real thing, on one GPU: the realistic benchmark's
GPT-like model (``--preset full``: ~82 M parameters, AdamW, 939 MiB of fp32 weights and moments)
trained under bf16 autocast, ``--batch`` sequences of ``--seq`` tokens per step, the loss read
back every step (as a trainer that logs it does). For each contender, alternated over ``--reps``
repetitions: ``--base`` steps without a save, then the async save is started and steps run until
it has committed.

The training time one save cost is the blocking call plus what the steps in flight took beyond
as many steps at the pace just before it (the first ``SETTLE`` of those steps follow the previous
contender's cleanup and are left out of the pace). The "no save" control runs the same procedure
with as many steps as the saves keep in flight; its excess per step (the procedure's bias, near
zero when the pace is steady) is subtracted from every contender's. Also reported: blocking time,
time until committed, step-time ratios, Python's full GC collections in that time (any thread's).

Contenders: no save, ``portable_ckpt`` thread and process modes, DCP ``async_save`` thread and
process modes twice: with its defaults (``FileSystemWriter`` as the stager: a new CPU copy of
the state per save) and with one ``DefaultStager`` kept across saves (pinned, reused buffers;
shared memory for the process mode; synchronous staging, so the call returns when the state may
change, as ours does). The first call of each contender is left out.

Runs on a one-rank process group (gloo for the CPU, NCCL for the GPU), so DCP's collectives run
as in a job. ``--device cpu --preset smoke`` runs the same code without a GPU (a smoke test).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from typing import Any

from bench.gpu_staging import write_report

__all__ = ["main", "measure", "rows"]

CONTENDERS = ("no save", "portable_ckpt thread", "portable_ckpt process", "dcp thread",
              "dcp process", "dcp thread, reused stager", "dcp process, reused stager")
#: Steps after the previous contender's cleanup left out of the pace before a save.
SETTLE = 2


def _init_group(device: str) -> None:
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")
    backend = "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, rank=0, world_size=1)


def _build(preset: str, device: str, batch: int, seq: int) -> dict[str, Any]:
    import torch

    from bench.realistic_model import PRESETS, _modules

    cfg = PRESETS[preset]
    torch.manual_seed(0)
    model = _modules(cfg)().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    gen = torch.Generator(device=device).manual_seed(1)
    return {"model": model, "opt": opt, "cfg": cfg, "gen": gen, "device": device,
            "tokens": (batch, min(seq, cfg.context))}


def _step(env: dict[str, Any]) -> float:
    """One forward/backward/AdamW step; the loss is read back (a trainer logging it)."""
    import torch

    cfg = env["cfg"]
    b, t = env["tokens"]
    t0 = time.perf_counter()
    idx = torch.randint(0, cfg.vocab, (b, t), generator=env["gen"], device=env["device"])
    with torch.autocast(env["device"], dtype=torch.bfloat16, enabled=env["device"] == "cuda"):
        logits = env["model"](idx)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab).float(),
                                                 idx.reshape(-1))
    loss.backward()
    env["opt"].step()
    env["opt"].zero_grad(set_to_none=True)
    env["loss"] = float(loss.item())
    return time.perf_counter() - t0


def _state(env: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(env["model"], env["opt"])
    return {"model": msd, "optim": osd}


class _Save:
    """One contender's async save: start it, ask whether it committed, wait, clean up."""

    def __init__(self, name: str, scratch: str, device: str) -> None:
        self.name, self.scratch, self.n, self._fut = name, scratch, 0, None
        self.device, self._stager = device, None

    def start(self, state: dict[str, Any]) -> float:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        import portable_ckpt.torch as pckt

        self.n += 1
        t0 = time.perf_counter()
        if self.name.startswith("portable_ckpt"):
            h = pckt.async_save(state, self.path, step=self.n, timeout=600,
                                mode=self.name.split()[1], continuation="statistical")
            self._fut = h.committed
        elif self.name.startswith("dcp"):
            process = self.name.startswith("dcp process")
            kind = AsyncCheckpointerType.PROCESS if process else AsyncCheckpointerType.THREAD
            extra = {"async_stager": self._reused(process)} if "stager" in self.name else {}
            ret = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(self.path),
                                 async_checkpointer_type=kind, **extra)
            self._fut = getattr(ret, "upload_completion", ret)
        return time.perf_counter() - t0

    def _reused(self, process: bool) -> Any:
        """One DCP stager kept across saves (:func:`bench.dcp_staging.reused_stager`)."""
        from bench.dcp_staging import reused_stager

        if self._stager is None:
            self._stager = reused_stager(self.device == "cuda", process)
        return self._stager

    @property
    def path(self) -> str:
        name = self.name.replace(",", "").replace(" ", "-")
        return os.path.join(self.scratch, f"{name}-{self.n}")

    def done(self) -> bool:
        return self._fut is None or self._fut.done()

    def finish(self) -> None:
        if self._fut is not None:
            self._fut.result()
            self._fut = None
        shutil.rmtree(self.path, ignore_errors=True)  # bounded disk use


class _FullCollections:
    """Milliseconds of every full (generation 2) collection of the cyclic GC, in any thread."""

    def __init__(self) -> None:
        self.ms: list[float] = []
        self._t0 = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.ms.append((time.perf_counter() - self._t0) * 1e3)

    def take(self) -> list[float]:
        out, self.ms = self.ms, []
        return out


_GC = _FullCollections()


def _one(env: dict[str, Any], saver: _Save, base: int, max_steps: int, idle: int) -> dict[str, Any]:
    """``base`` steps, then the save and the steps until it committed (``idle`` for no save)."""
    base_s = [_step(env) for _ in range(base)]
    _GC.take()
    block = saver.start(_state(env)) if saver.name != "no save" else 0.0
    t0 = time.perf_counter()
    during: list[float] = []
    while len(during) < max_steps:
        during.append(_step(env))
        if saver.name == "no save" and len(during) >= idle:
            break
        if saver.name != "no save" and saver.done():
            break
    saver.finish()
    return {"base": base_s, "during": during, "block_s": block,
            "total_s": time.perf_counter() - t0 + block, "full_gc_ms": _GC.take()}


def measure(preset: str, device: str, batch: int, seq: int, reps: int, base: int,
            max_steps: int, scratch: str) -> dict[str, Any]:
    """Every contender ``reps`` times, rotated; raw step times and a summary per contender."""
    import torch

    _init_group(device)
    env = _build(preset, device, batch, seq)
    for _ in range(3):  # warm-up: kernels, autotuning, the moments exist
        _step(env)
    names = CONTENDERS
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions  # noqa: F401
    except ImportError:  # torch before DefaultStager: DCP's defaults only
        names = tuple(n for n in CONTENDERS if "stager" not in n)
    savers = {n: _Save(n, scratch, device) for n in names}
    dropped: dict[str, str] = {}
    for n in names[1:]:  # first calls: staging buffers, writer processes
        try:
            _one(env, savers[n], 1, max_steps, 1)
        except Exception as exc:  # a peer's configuration this torch cannot run: say so
            dropped[n] = f"{type(exc).__name__}: {exc}"[:300]
            print(f"gpu_step: {n} dropped: {dropped[n]}", file=sys.stderr)
    names = tuple(n for n in names if n not in dropped)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for rep in range(reps):
        k = rep % len(names)
        for n in names[k:] + names[:k]:
            # The control keeps as many steps as a save of ours keeps in flight (its bias per
            # step is then measured over a like window).
            ours = [len(r["during"]) for c, rs in runs.items() if c.startswith("portable")
                    for r in rs]
            idle = int(statistics.median(ours)) if ours else 30
            runs[n].append(_one(env, savers[n], base, max_steps, idle))
    dev = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    n_t = sum(1 for v in _flat(_state(env)))
    nbytes = sum(t.numel() * t.element_size() for t in _flat(_state(env)))
    return {"device": dev, "torch": torch.__version__, "preset": preset, "tokens": env["tokens"],
            "tensors": n_t, "bytes": nbytes, "reps": reps, "rows": rows(runs), "runs": runs,
            "dropped": dropped}


def _settled(base: list[float]) -> list[float]:
    """The steps before a save less the first ``SETTLE`` (all of them when there are no more)."""
    return base[SETTLE:] if len(base) > SETTLE else base


def _pace(r: dict[str, Any]) -> float:
    """Seconds per step just before the save (the steps right after a cleanup left out)."""
    return statistics.mean(_settled(r["base"]))


def _pace_noise(r: dict[str, Any]) -> float:
    base = _settled(r["base"])
    if len(base) < 2:
        return float("nan")
    return 1e3 * statistics.stdev(base) / len(base) ** 0.5 * len(r["during"])


def _lost(r: dict[str, Any]) -> tuple[float, float]:
    """(blocking ms, in-flight ms beyond the pace) of one repetition."""
    return 1e3 * r["block_s"], 1e3 * (sum(r["during"]) - len(r["during"]) * _pace(r))


def rows(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One summary row per contender.

    ``lost ms per save``: the training time one save cost (blocking call + the steps in flight
    beyond the pace before it), less the control's bias per step times the steps in flight;
    median over repetitions. A ratio of step times favours a save that takes long (its slow
    steps are diluted); this does not.
    """
    control = runs.get("no save", [])
    per_step = [(sum(r["during"]) / len(r["during"]) - _pace(r)) for r in control if r["during"]]
    bias = statistics.median(per_step) if per_step else 0.0
    out = []
    for n, rs in runs.items():
        base_all = [s for r in rs for s in _settled(r["base"])]
        during_all = [s for r in rs for s in r["during"]]
        parts = [_lost(r) for r in rs]
        lost = [b + f - 1e3 * bias * len(r["during"]) for (b, f), r in zip(parts, rs, strict=True)]
        out.append({
            "contender": n,
            "step s (no save)": statistics.median(base_all),
            "mean ratio": statistics.mean(during_all) / statistics.mean(base_all),
            "median ratio": statistics.median(during_all) / statistics.median(base_all),
            "lost ms per save": statistics.median(lost),
            "lost ms range": (min(lost), max(lost)),
            "blocking ms": statistics.median(b for b, _ in parts),
            "in flight ms": statistics.median(f for _, f in parts),
            "control bias ms per step": 1e3 * bias,
            # The pace's standard error times the steps in flight: how far the in-flight term
            # can move by the pace alone (a save that keeps more steps in flight carries more).
            "pace noise ms": statistics.median(_pace_noise(r) for r in rs),
            "steps in flight": statistics.median(len(r["during"]) for r in rs),
            "until committed s": statistics.median(r["total_s"] for r in rs),
            "full collections": sum(len(r.get("full_gc_ms", [])) for r in rs),
            "full collection ms": sum(sum(r.get("full_gc_ms", [])) for r in rs),
        })
    return out


def _flat(x: Any) -> list[Any]:
    import torch

    if isinstance(x, dict):
        return [t for v in x.values() for t in _flat(v)]
    return [x] if isinstance(x, torch.Tensor) else []


def _markdown(res: dict[str, Any]) -> str:
    prov = res.get("provenance")
    head = [f"# A GPU training step while an async save is in flight — {res['device']}", ""]
    if prov:
        head += [f"Command: `{prov['command']}` · {prov['date']} · commit `{prov['git']}` · "
                 f"{prov['machine']['cpu']}, {prov['machine']['cores']} cores", ""]
    r0 = rows(res["runs"])
    bias = r0[0]["control bias ms per step"] if r0 else 0.0
    lines = head + [
        f"torch {res['torch']}; preset {res['preset']}, {res['tokens'][0]}×{res['tokens'][1]}"
        f" tokens per step; {res['tensors']} tensors, {res['bytes'] / 2**20:.0f} MiB per "
        f"save; {res['reps']} repetitions, rotated; medians. Training time lost per save = "
        f"blocking + the steps in flight beyond the pace before the save, less the no-save "
        f"control's excess ({bias:+.2f} ms per step) times the steps in flight.", "",
        "| contender | step s (no save) | training time lost per save, ms: median [min–max] | "
        "± pace noise ms | blocking ms | in flight ms | step while in flight, mean / median "
        "ratio | steps in flight | until committed s | full GC collections (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for n, why in res.get("dropped", {}).items():
        lines.append(f"| {n} | could not run: {why} | | | | | | | | |")
    for r in r0:
        lo, hi = r["lost ms range"]
        lines.append(f"| {r['contender']} | {r['step s (no save)']:.4f} | "
                     f"{r['lost ms per save']:.0f} [{lo:.0f}–{hi:.0f}] | "
                     f"{r['pace noise ms']:.0f} | {r['blocking ms']:.0f} | "
                     f"{r['in flight ms']:.0f} | {r['mean ratio']:.3f} / "
                     f"{r['median ratio']:.3f} | {r['steps in flight']:.0f} | "
                     f"{r['until committed s']:.2f} | "
                     f"{r['full collections']} ({r['full collection ms']:.0f}) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Measure and write ``<out>.json`` and ``<out>.md``."""
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_step", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join("bench", "results", "gpu-step"))
    ap.add_argument("--preset", default="full", choices=("full", "small", "smoke"))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--base", type=int, default=10, help="steps without a save before each save")
    ap.add_argument("--max-steps", type=int, default=400, help="most steps while one save runs")
    ap.add_argument("--scratch", default=None, help="where the saves go (default: a temp dir)")
    ap.add_argument("--from-json", default=None, metavar="JSON",
                    help="re-render the report of an earlier run (its .json) instead of running")
    a = ap.parse_args(argv)
    if a.from_json:
        with open(a.from_json, encoding="utf-8") as f:
            print(_markdown(json.load(f)), end="")
        return 0
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu_step: torch sees no CUDA device (a CPU build, or no GPU); nothing measured",
              file=sys.stderr)
        return 3
    from bench.machine import provenance

    scratch = tempfile.mkdtemp(prefix="pck-gpu-step-", dir=a.scratch)
    try:
        prov = provenance(scratch, ["bench.gpu_step", *(argv if argv is not None else sys.argv[1:])])
        res = measure(a.preset, a.device, a.batch, a.seq, a.reps, a.base, a.max_steps, scratch)
        res["provenance"] = prov
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    write_report(a.out, res, _markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
