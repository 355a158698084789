"""Benchmark `portable-ckpt convert` against `cp` of the same bytes; report throughput and peak RSS.

Generates (once, cached in --workdir):
  * an HF sharded safetensors set of ~--hf-gib GiB (tensors of --tensor-mib MiB, 4 shards + index)
  * a DCP checkpoint of ~--dcp-gib GiB written by torch.distributed.checkpoint.save (1 process)

Then, alternately and --repeat times, runs `cp -r SRC X` (+ `sync -f`, since convert fsyncs) and
`portable-ckpt convert SRC Y --json` under /usr/bin/time -v, and prints one JSON document with the
median seconds, MiB/s, ratio convert/cp and peak RSS (max over the process and its waited-for
children, i.e. it includes DCP's torch metadata child) next to the largest stored chunk.

    .venv/bin/python bench/bench_convert.py --hf-gib 2 --dcp-gib 1 --repeat 3
"""

from __future__ import annotations

import argparse
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


def _gen_dcp(d: str, gib: float, tensor_mib: int) -> None:
    if os.path.exists(os.path.join(d, ".metadata")):
        return
    subprocess.run([sys.executable, "-c", _DCP_GEN, d, str(gib), str(tensor_mib)], check=True)


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


def _bench(name: str, src: str, args: list[str], work: str, repeat: int, src_bytes: int) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
    cp_s, cp_sync_s, cv_s, rss = [], [], [], []
    report: dict[str, Any] = {}
    for i in range(repeat):
        dst = os.path.join(work, f"cp-{name}-{i}")
        shutil.rmtree(dst, ignore_errors=True)
        t0 = time.perf_counter()
        subprocess.run(["cp", "-r", src, dst], check=True)
        t1 = time.perf_counter()
        subprocess.run(["sync", "-f", dst], check=True)
        t2 = time.perf_counter()
        cp_s.append(t1 - t0)
        cp_sync_s.append(t2 - t0)
        shutil.rmtree(dst, ignore_errors=True)
        out = os.path.join(work, f"cv-{name}-{i}")
        shutil.rmtree(out, ignore_errors=True)
        dt, peak, stdout = _timed(
            [sys.executable, "-m", "portable_ckpt.cli.main", "convert", src, out, "--json", *args], env
        )
        cv_s.append(dt)
        rss.append(peak)
        report = json.loads(stdout)
        shutil.rmtree(out, ignore_errors=True)
    mib = src_bytes / (1 << 20)
    cp_med, cps_med, cv_med = statistics.median(cp_s), statistics.median(cp_sync_s), statistics.median(cv_s)
    largest = int(report.get("largest_chunk", 0))
    return {
        "case": name,
        "source_bytes": src_bytes,
        "tensor_bytes": report.get("bytes"),
        "largest_chunk_mib": round(largest / (1 << 20), 1),
        "cp_s": [round(x, 3) for x in cp_s],
        "cp_sync_s": [round(x, 3) for x in cp_sync_s],
        "convert_s": [round(x, 3) for x in cv_s],
        "cp_mib_s": round(mib / cp_med, 1),
        "cp_sync_mib_s": round(mib / cps_med, 1),
        "convert_mib_s": round(mib / cv_med, 1),
        "ratio_vs_cp": round(cp_med / cv_med, 3),
        "ratio_vs_cp_sync": round(cps_med / cv_med, 3),
        "peak_rss_mib": [round(r / (1 << 20), 1) for r in rss],
        "rss_budget_mib": round(largest / (1 << 20) + 256, 1),
        "rss_within_budget": max(rss) <= largest + (256 << 20),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="/tmp/pck-bench-convert")
    ap.add_argument("--hf-gib", type=float, default=2.0)
    ap.add_argument("--dcp-gib", type=float, default=1.0)
    ap.add_argument("--tensor-mib", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cases", default="hf,dcp,portable-hf,portable-dcp")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    hf = os.path.join(a.workdir, "src-hf")
    dc = os.path.join(a.workdir, "src-dcp")
    cases = a.cases.split(",")
    results = []
    if "hf" in cases or "portable-hf" in cases or "portable-dcp" in cases:
        _gen_hf(hf, a.hf_gib, a.tensor_mib)
    if "hf" in cases:
        results.append(_bench("hf->portable", hf, [], a.workdir, a.repeat, _du(hf)))
    if "dcp" in cases:
        _gen_dcp(dc, a.dcp_gib, a.tensor_mib)
        results.append(_bench("dcp->portable", dc, ["--trust-pickle"], a.workdir, a.repeat, _du(dc)))
    if "portable-hf" in cases or "portable-dcp" in cases:
        pt = os.path.join(a.workdir, "src-portable")
        if not os.path.isdir(pt):
            sys.path.insert(0, os.path.join(ROOT, "src"))
            from portable_ckpt.convert import convert

            convert(hf, pt)
        if "portable-hf" in cases:
            results.append(_bench("portable->hf", pt, ["--to", "hf"], a.workdir, a.repeat, _du(pt)))
        if "portable-dcp" in cases:
            results.append(_bench("portable->dcp", pt, ["--to", "dcp"], a.workdir, a.repeat, _du(pt)))
    print(json.dumps({"results": results}, indent=2))


if __name__ == "__main__":
    main()
