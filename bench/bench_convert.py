"""Benchmark `portable-ckpt convert` against `cp` of the same bytes; report throughput and peak RSS.

Generates (once, cached in --workdir):
  * an HF sharded safetensors set of ~--hf-gib GiB (tensors of --tensor-mib MiB, 4 shards + index)
  * a DCP checkpoint of ~--dcp-gib GiB written by torch.distributed.checkpoint.save (1 process)

Then, --repeat times in a rotating order, runs per case:
  * `cp -r SRC X`, then `sync -f X` (timed separately: `cp` and `cp`+`sync`; convert fsyncs);
  * `portable-ckpt convert SRC Y --json` under /usr/bin/time -v, once per --variant (a source
    tree on PYTHONPATH: the working tree, or e.g. a copy of an earlier version for before/after);
  * with --breakdown, the same conversion in-process with os.fsync and LocalStorage.sync timed:
    how much of the wall time is the final durability wait (commit's storage.sync(): waiting for
    the deferred data-file fsyncs and the directory fsyncs, plus the manifest's fsyncs) that
    plain `cp` does not do; and the same conversion once more with os.fsync made a no-op, which
    also removes the background fsyncs that overlap the writing (the whole durability cost).

The source is read from the page cache, as is cp's: before every timed command the source is read
once and `sync` flushes unrelated dirty data (neither is timed; other jobs on a shared machine may
drop the page cache at any time). Prints one
JSON document (median seconds, MiB/s, ratio convert/cp per repetition, peak RSS next to the
largest stored chunk); --out writes it with a Markdown report.

    .venv/bin/python bench/bench_convert.py --hf-gib 1 --dcp-gib 1 --repeat 5 --breakdown \
        --variant before=/tmp/pck-before/src --out bench/results
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _gen_hf(d: str, gib: float, tensor_mib: int) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    if os.path.exists(os.path.join(d, "model.safetensors.index.json")):
        return
    os.makedirs(d, exist_ok=True)
    n = max(1, int(gib * 1024 / tensor_mib))
    per_shard = max(1, n // 4)
    rng = np.random.default_rng(0)
    rows = tensor_mib * (1 << 20) // (4 * 1024)
    wm: dict[str, str] = {}
    shards = [list(range(i, min(i + per_shard, n))) for i in range(0, n, per_shard)]
    total = 0
    for s, ids in enumerate(shards):
        name = f"model-{s + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {f"layers.{i}.weight": rng.standard_normal((rows, 1024), dtype=np.float32) for i in ids}
        save_file(tensors, os.path.join(d, name), metadata={"format": "pt"})
        for k, v in tensors.items():
            wm[k] = name
            total += v.nbytes
        del tensors
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f)


_DCP_GEN = r"""
import sys, torch, torch.distributed.checkpoint as dcp
d, gib, mib = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
n = max(1, int(gib * 1024 / mib))
rows = mib * (1 << 20) // (4 * 1024)
g = torch.Generator().manual_seed(0)
sd = {f"model.layers.{i}.weight": torch.randn(rows, 1024, generator=g) for i in range(n)}
sd["step"] = 100
dcp.save(sd, checkpoint_id=d, no_dist=True)
"""

# In-process conversion with the durability waits timed (run with the variant's PYTHONPATH).
_BREAKDOWN = r"""
import json, os, sys, threading, time
t0 = time.perf_counter()
from portable_ckpt.convert import convert
from portable_ckpt.storage import local
main = threading.main_thread()
rec = {"sync_s": 0.0, "fsync_main_s": 0.0, "fsync_bg_s": 0.0, "sync_start": None, "depth": 0}
_fsync, _sync = os.fsync, local.LocalStorage.sync
def fsync(fd):
    t = time.perf_counter()
    try:
        return _fsync(fd)
    finally:
        dt = time.perf_counter() - t
        if threading.current_thread() is not main:
            rec["fsync_bg_s"] += dt
        elif rec["depth"] == 0:
            rec["fsync_main_s"] += dt
def sync(self):
    t = time.perf_counter()
    if rec["sync_start"] is None:
        rec["sync_start"] = t
    rec["depth"] += 1
    try:
        return _sync(self)
    finally:
        rec["depth"] -= 1
        rec["sync_s"] += time.perf_counter() - t
if sys.argv[4] == "nofsync":  # what the conversion costs without any durability
    _fsync = lambda fd: None
os.fsync = fsync
local.LocalStorage.sync = sync
src, dst, trust = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
t1 = time.perf_counter()
convert(src, dst, trust_pickle=trust)
t2 = time.perf_counter()
print(json.dumps({
    "import_s": t1 - t0, "convert_s": t2 - t1,
    "until_final_sync_s": (rec["sync_start"] or t2) - t0,
    "final_sync_s": rec["sync_s"], "main_fsync_outside_sync_s": rec["fsync_main_s"],
    "background_fsync_s": rec["fsync_bg_s"],
}))
"""


def _gen_dcp(d: str, gib: float, tensor_mib: int) -> None:
    if os.path.exists(os.path.join(d, ".metadata")):
        return
    subprocess.run([sys.executable, "-c", _DCP_GEN, d, str(gib), str(tensor_mib)], check=True)


def _warm(path: str) -> None:
    """Read every file under ``path`` (untimed), so each contender starts from a cached source."""
    buf = bytearray(16 << 20)
    for base, _dirs, files in os.walk(path):
        for f in files:
            with open(os.path.join(base, f), "rb", buffering=0) as fh:
                while fh.readinto(buf):
                    pass


def _du(path: str) -> int:
    total = 0
    for base, _dirs, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(base, f))
    return total


def _timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"command failed: {cmd}\n{proc.stdout}\n{proc.stderr}")
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    return dt, int(m.group(1)) * 1024 if m else -1, proc.stdout


def _env(src_tree: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = src_tree + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _ratios(ref: list[float], other: list[float]) -> dict[str, float]:
    rs = [a / b for a, b in zip(ref, other, strict=True)]
    return {"median": round(statistics.median(rs), 3), "min": round(min(rs), 3), "max": round(max(rs), 3)}


def _bench(
    name: str,
    src: str,
    args: list[str],
    work: str,
    repeat: int,
    src_bytes: int,
    variants: dict[str, str],
    breakdown: bool,
) -> dict[str, Any]:
    trust = "--trust-pickle" in args
    cp_s: list[float] = []
    cp_sync_s: list[float] = []
    cv_s: dict[str, list[float]] = {v: [] for v in variants}
    rss: dict[str, list[int]] = {v: [] for v in variants}
    bd: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    nofsync: dict[str, list[float]] = {v: [] for v in variants}
    report: dict[str, Any] = {}

    def run_cp(i: int) -> None:
        dst = os.path.join(work, f"cp-{name}-{i}")
        shutil.rmtree(dst, ignore_errors=True)
        os.sync()
        _warm(src)
        t0 = time.perf_counter()
        subprocess.run(["cp", "-r", src, dst], check=True)
        t1 = time.perf_counter()
        subprocess.run(["sync", "-f", dst], check=True)
        t2 = time.perf_counter()
        cp_s.append(t1 - t0)
        cp_sync_s.append(t2 - t0)
        shutil.rmtree(dst, ignore_errors=True)

    def run_convert(i: int, v: str) -> None:
        nonlocal report
        out = os.path.join(work, f"cv-{name}-{v}-{i}")
        shutil.rmtree(out, ignore_errors=True)
        os.sync()
        _warm(src)
        dt, peak, stdout = _timed(
            [sys.executable, "-m", "portable_ckpt.cli.main", "convert", src, out, "--json", *args],
            _env(variants[v]),
        )
        cv_s[v].append(dt)
        rss[v].append(peak)
        report = json.loads(stdout)
        shutil.rmtree(out, ignore_errors=True)

    def run_breakdown(i: int, v: str, mode: str) -> None:
        out = os.path.join(work, f"bd-{name}-{v}-{i}")
        shutil.rmtree(out, ignore_errors=True)
        os.sync()
        _warm(src)
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", _BREAKDOWN, src, out, "1" if trust else "0", mode],
            capture_output=True, text=True, env=_env(variants[v]),
        )
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"breakdown run failed:\n{proc.stderr}")
        shutil.rmtree(out, ignore_errors=True)
        if mode == "nofsync":
            nofsync[v].append(wall)
            return
        doc = json.loads(proc.stdout.strip().splitlines()[-1])
        doc["process_s"] = wall
        # Everything the process did except waiting for durability at the end.
        doc["durability_wait_s"] = doc["final_sync_s"] + doc["main_fsync_outside_sync_s"]
        doc["without_wait_s"] = wall - doc["durability_wait_s"]
        bd[v].append(doc)

    steps: list[Any] = [run_cp] + [lambda i, v=v: run_convert(i, v) for v in variants]
    if breakdown:
        steps += [lambda i, v=v: run_breakdown(i, v, "fsync") for v in variants]
        steps += [lambda i, v=v: run_breakdown(i, v, "nofsync") for v in variants]
    for i in range(repeat):
        k = i % len(steps)
        for step in steps[k:] + steps[:k]:  # rotate the order every repetition
            step(i)
    mib = src_bytes / (1 << 20)
    cp_med, cps_med = statistics.median(cp_s), statistics.median(cp_sync_s)
    largest = int(report.get("largest_chunk", 0))
    out: dict[str, Any] = {
        "case": name,
        "source_bytes": src_bytes,
        "tensor_bytes": report.get("bytes"),
        "largest_chunk_mib": round(largest / (1 << 20), 1),
        "rss_budget_mib": round(largest / (1 << 20) + 256, 1),
        "cp_s": [round(x, 3) for x in cp_s],
        "cp_sync_s": [round(x, 3) for x in cp_sync_s],
        "cp_mib_s": round(mib / cp_med, 1),
        "cp_sync_mib_s": round(mib / cps_med, 1),
        "variants": {},
    }
    for v in variants:
        med = statistics.median(cv_s[v])
        entry: dict[str, Any] = {
            "src_tree": variants[v],
            "convert_s": [round(x, 3) for x in cv_s[v]],
            "convert_mib_s": round(mib / med, 1),
            "ratio_vs_cp": _ratios(cp_s, cv_s[v]),
            "ratio_vs_cp_sync": _ratios(cp_sync_s, cv_s[v]),
            "peak_rss_mib": [round(r / (1 << 20), 1) for r in rss[v]],
            "rss_within_budget": max(rss[v]) <= largest + (256 << 20),
        }
        if bd[v]:
            keys = ("process_s", "import_s", "until_final_sync_s", "durability_wait_s", "without_wait_s",
                    "background_fsync_s")
            entry["breakdown"] = {k: round(statistics.median(d[k] for d in bd[v]), 3) for k in keys}
            entry["breakdown"]["runs"] = [{k: round(d[k], 3) for k in keys} for d in bd[v]]
            without = [d["without_wait_s"] for d in bd[v]]
            entry["breakdown"]["without_wait_mib_s"] = round(mib / statistics.median(without), 1)
            entry["breakdown"]["without_wait_ratio_vs_cp"] = _ratios(cp_s, without)
            walls = [d["process_s"] for d in bd[v]]
            entry["breakdown"]["ratio_vs_cp"] = _ratios(cp_s, walls)
            entry["breakdown"]["no_fsync_s"] = [round(x, 3) for x in nofsync[v]]
            entry["breakdown"]["no_fsync_median_s"] = round(statistics.median(nofsync[v]), 3)
            entry["breakdown"]["no_fsync_mib_s"] = round(mib / statistics.median(nofsync[v]), 1)
            entry["breakdown"]["no_fsync_ratio_vs_cp"] = _ratios(cp_s, nofsync[v])
            entry["breakdown"]["fsync_cost_s"] = round(statistics.median(walls) - statistics.median(nofsync[v]), 3)
        out["variants"][v] = entry
    return out


def _markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    lines = [
        f"# Conversion benchmark — {doc['started']}",
        "",
        f"Command: `{doc['command']}` · wall time {doc['wall_s']:.0f} s",
        "",
        "## Machine",
        "",
        "| item | value |",
        "|---|---|",
        f"| CPU | {m['cpu']}, {m['cores']} logical cores |",
        f"| memory | {m['memory_gib']} GiB |",
        f"| disk (scratch) | {m['disk']}, {m['disk_free_gib']} GiB free |",
        f"| kernel / OS | {m['kernel']} / {m['os']} |",
        f"| Python | {m['python']} |",
        f"| libraries | {', '.join(f'{k} {v}' for k, v in m['versions'].items())} |",
        f"| load average (1 min) | {doc['load_start']:.2f} at the start, {doc['load_end']:.2f} at the end |",
        "",
        "Variants (source trees on PYTHONPATH): "
        + ", ".join(f"`{k}` = `{v}`" for k, v in doc["variants"].items()),
        "",
    ]
    for r in doc["results"]:
        gib = r["source_bytes"] / (1 << 30)
        lines += [
            f"## {r['case']} ({gib:.2f} GiB, largest chunk {r['largest_chunk_mib']} MiB)",
            "",
            "| contender | median s | MiB/s | vs `cp` (median [min–max]) | vs `cp`+`sync` | peak RSS MiB (max) | RSS ≤ largest chunk + 256 MiB |",
            "|---|---|---|---|---|---|---|",
            f"| `cp -r` | {statistics.median(r['cp_s']):.3f} | {r['cp_mib_s']} | – | – | – | – |",
            f"| `cp -r` + `sync -f` | {statistics.median(r['cp_sync_s']):.3f} | {r['cp_sync_mib_s']} | – | – | – | – |",
        ]
        for v, e in r["variants"].items():
            rc, rs = e["ratio_vs_cp"], e["ratio_vs_cp_sync"]
            lines.append(
                f"| convert ({v}) | {statistics.median(e['convert_s']):.3f} | {e['convert_mib_s']} | "
                f"{rc['median']} [{rc['min']}–{rc['max']}] | {rs['median']} [{rs['min']}–{rs['max']}] | "
                f"{max(e['peak_rss_mib'])} | {'yes' if e['rss_within_budget'] else 'NO'} |"
            )
        if any("breakdown" in e for e in r["variants"].values()):
            sync_only = statistics.median(b - a for a, b in zip(r["cp_s"], r["cp_sync_s"], strict=True))
            lines += [
                "",
                "Where the time goes (in-process conversion, same bytes; medians): `until final sync` is "
                "process start to the commit's `storage.sync()`; `durability wait` is that sync (waiting for "
                "the deferred data-file fsyncs and the directory fsyncs) plus the manifest's fsyncs; "
                "`background fsync` is fsync time on the writer's fsync threads, overlapped with writing; "
                "`no fsync at all` is the same in-process conversion with `os.fsync` a no-op (data left "
                "in the page cache, as after `cp`). "
                f"For comparison `sync -f` after `cp` took {sync_only:.3f} s (median).",
                "",
                "| variant | process s | of which imports | until final sync s | durability wait s | without the wait s | MiB/s without the wait | without the wait vs `cp` | background fsync s | no fsync at all: s | MiB/s | vs `cp` |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|",
            ]
            for v, e in r["variants"].items():
                b = e.get("breakdown")
                if not b:
                    continue
                rw, rn = b["without_wait_ratio_vs_cp"], b["no_fsync_ratio_vs_cp"]
                lines.append(
                    f"| {v} | {b['process_s']:.3f} | {b['import_s']:.3f} | {b['until_final_sync_s']:.3f} | "
                    f"{b['durability_wait_s']:.3f} | {b['without_wait_s']:.3f} | {b['without_wait_mib_s']} | "
                    f"{rw['median']} [{rw['min']}–{rw['max']}] | {b['background_fsync_s']:.3f} | "
                    f"{b['no_fsync_median_s']:.3f} | {b['no_fsync_mib_s']} | {rn['median']} [{rn['min']}–{rn['max']}] |"
                )
        lines.append("")
    lines += [
        "Notes: every repetition runs all contenders in a rotated order; ratio columns are medians of "
        "per-repetition ratios (time of `cp` / time of the contender). Peak RSS is `/usr/bin/time -v`'s "
        "maximum resident set size of the convert process and its waited-for children. The source is "
        "read from the page cache by every contender: before each timed command the source is read once "
        "and `sync` runs (both untimed).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="/tmp/pck-bench-convert")
    ap.add_argument("--hf-gib", type=float, default=1.0)
    ap.add_argument("--dcp-gib", type=float, default=1.0)
    ap.add_argument("--tensor-mib", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cases", default="hf,dcp,portable-hf,portable-dcp")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=SRC_TREE",
                    help="a source tree to benchmark (repeatable; default: current=<repo>/src)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time the final durability wait in-process (HF and DCP cases)")
    ap.add_argument("--out", default="", help="directory for <name>.json and <name>.md")
    ap.add_argument("--name", default=f"{_dt.date.today().isoformat()}-convert")
    a = ap.parse_args()
    variants = {"current": os.path.join(ROOT, "src")}
    for spec in a.variant:
        k, _, v = spec.partition("=")
        variants[k] = os.path.abspath(v)
    os.makedirs(a.workdir, exist_ok=True)
    hf = os.path.join(a.workdir, f"src-hf-{a.hf_gib:g}g-{a.tensor_mib}m")
    dc = os.path.join(a.workdir, f"src-dcp-{a.dcp_gib:g}g-{a.tensor_mib}m")
    cases = a.cases.split(",")
    t_start = time.time()
    load_start = os.getloadavg()[0]
    results = []
    if "hf" in cases or "portable-hf" in cases or "portable-dcp" in cases:
        _gen_hf(hf, a.hf_gib, a.tensor_mib)
    if "hf" in cases:
        results.append(_bench("hf->portable", hf, [], a.workdir, a.repeat, _du(hf), variants, a.breakdown))
    if "dcp" in cases:
        _gen_dcp(dc, a.dcp_gib, a.tensor_mib)
        results.append(
            _bench("dcp->portable", dc, ["--trust-pickle"], a.workdir, a.repeat, _du(dc), variants, a.breakdown)
        )
    if "portable-hf" in cases or "portable-dcp" in cases:
        pt = os.path.join(a.workdir, f"src-portable-{a.hf_gib:g}g-{a.tensor_mib}m")
        if not os.path.isdir(pt):
            sys.path.insert(0, os.path.join(ROOT, "src"))
            from portable_ckpt.convert import convert

            convert(hf, pt)
        if "portable-hf" in cases:
            results.append(_bench("portable->hf", pt, ["--to", "hf"], a.workdir, a.repeat, _du(pt), variants, False))
        if "portable-dcp" in cases:
            results.append(_bench("portable->dcp", pt, ["--to", "dcp"], a.workdir, a.repeat, _du(pt), variants, False))
    sys.path.insert(0, ROOT)
    from bench.machine import describe

    doc = {
        "started": _dt.datetime.fromtimestamp(t_start).isoformat(timespec="seconds"),
        "command": " ".join(["python", "bench/bench_convert.py", *sys.argv[1:]]),
        "wall_s": time.time() - t_start,
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
        "machine": describe(a.workdir),
        "variants": variants,
        "results": results,
    }
    print(json.dumps(doc, indent=2))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"{a.name}.json"), "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        with open(os.path.join(a.out, f"{a.name}.md"), "w") as f:
            f.write(_markdown(doc))


if __name__ == "__main__":
    main()
