"""The benchmark sections. Each returns a dict the report renders (see :mod:`bench.report`).

A section result has ``title``, ``rows`` (list of dicts: one table), optional ``tables``
(``{caption: rows}``), ``notes`` (list of str), ``targets`` (list of dicts: name, value, target,
met), ``raw`` (every measurement) and ``plots`` (data the plotting code uses).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.runner import REPO, Measurement, can_drop_caches, child_env, run_child, run_command
from bench.stats import MIB, fit_exponent, pair_ratios, summary

__all__ = ["SECTIONS", "Ctx"]


@dataclass
class Ctx:
    """Run-wide settings and shared fixtures."""

    quick: bool
    scratch: str
    out: str
    smoke: bool = False  # tiny sizes, one repetition (the test suite's smoke test)
    cold: bool = field(default_factory=can_drop_caches)
    fixtures: dict[str, Any] = field(default_factory=dict)
    log: Callable[[str], None] = print

    @property
    def reps(self) -> int:
        return 1 if self.smoke else 3 if self.quick else 5

    def size(self, smoke: int, quick: int, full: int) -> int:
        """Pick a size for the mode."""
        return smoke if self.smoke else quick if self.quick else full

    def clean(self, *paths: str) -> None:
        for p in paths:
            if os.path.isdir(p):
                shutil.rmtree(p, ignore_errors=True)
            elif os.path.exists(p):
                os.unlink(p)

    @property
    def write_cache(self) -> str | None:
        # Before each write: flush and drop the page cache when we can, so every contender starts
        # from the same (empty) cache and no earlier contender's dirty pages are still in flight.
        if self.smoke:
            return None  # the smoke test checks plumbing, not numbers: no system-wide sync
        return "cold" if self.cold else "sync"


def _rows_from(named: dict[str, list[Measurement]], nbytes: int, baseline: str | None) -> list[dict[str, Any]]:
    rows = []
    for name, ms in named.items():
        s = summary(ms, nbytes)
        row: dict[str, Any] = {
            "contender": name,
            "median s": s.get("median_s"),
            "MiB/s": s.get("mib_s"),
            "best MiB/s": s.get("mib_s_best"),
            "peak RSS MiB": s.get("maxrss_mib"),
            "RSS before op MiB": s.get("setup_rss_mib"),
        }
        if baseline is not None and name != baseline:
            r = pair_ratios(ms, named[baseline])
            row[f"speed vs {baseline} (median [min–max])"] = (
                f"{r['median']:.3f} [{r['min']:.3f}–{r['max']:.3f}]" if r["n"] else "n/a"
            )
        rows.append(row)
    return rows


def _alternate(ctx: Ctx, contenders: list[tuple[str, Callable[[], Measurement]]], reps: int) -> dict[str, list[Measurement]]:
    """Run every contender ``reps`` times, rotating the order each repetition (A B C, B C A, ...)."""
    out: dict[str, list[Measurement]] = {n: [] for n, _ in contenders}
    for i in range(reps):
        k = i % len(contenders)
        for name, fn in contenders[k:] + contenders[:k]:
            m = fn()
            out[name].append(m)
            ctx.log(f"    {name:<22} rep {i + 1}/{reps}: {m.seconds:8.3f} s  rss {m.maxrss_bytes / MIB:7.0f} MiB"
                    + ("" if m.ok else f"  FAILED {m.error[-300:]}"))
    return out


# ---------------------------------------------------------------------------------------------
# save: portable_ckpt vs dd vs torch.save vs safetensors; memcpy baseline
# ---------------------------------------------------------------------------------------------


def section_save(ctx: Ctx) -> dict[str, Any]:
    total = ctx.size(8, 128, 1024) * MIB
    ntensors = ctx.size(2, 8, 16)
    d = os.path.join(ctx.scratch, "save")
    os.makedirs(d, exist_ok=True)
    root, tfile, sfile, dfile = (os.path.join(d, x) for x in ("pck", "state.pt", "state.safetensors", "dd.bin"))
    st = {"bytes": total, "tensors": ntensors}

    def pck() -> Measurement:
        ctx.clean(root)
        m = run_child("portable_ckpt", "save_pck", {**st, "root": root}, cache=ctx.write_cache)
        ctx.clean(root)
        return m

    def dd() -> Measurement:
        ctx.clean(dfile)
        m = run_command("dd conv=fsync", ["dd", "if=/dev/zero", f"of={dfile}", "bs=16M",
                                           f"count={total // (16 * MIB)}", "conv=fsync"], cache=ctx.write_cache)
        ctx.clean(dfile)
        return m

    def tsave() -> Measurement:
        ctx.clean(tfile)
        m = run_child("torch.save", "save_torch", {**st, "file": tfile}, cache=ctx.write_cache)
        ctx.clean(tfile)
        return m

    def ssave() -> Measurement:
        ctx.clean(sfile)
        m = run_child("safetensors", "save_safetensors", {**st, "file": sfile}, cache=ctx.write_cache)
        ctx.clean(sfile)
        return m

    rfile = os.path.join(d, "raw.bin")

    def raw() -> Measurement:
        ctx.clean(rfile)
        m = run_child("os.write loop", "save_raw", {**st, "file": rfile}, cache=ctx.write_cache)
        ctx.clean(rfile)
        return m

    res = _alternate(ctx, [("portable_ckpt", pck), ("dd conv=fsync", dd), ("torch.save", tsave),
                           ("safetensors", ssave), ("os.write loop", raw)], ctx.reps)
    cp = [run_child("memcpy", "memcpy", st) for _ in range(ctx.reps)]
    rows = _rows_from(res, total, "dd conv=fsync")
    r = pair_ratios(res["portable_ckpt"], res["dd conv=fsync"])
    cps = summary(cp, total)
    pref = sorted(m.extra["prefaulted_seconds"] for m in cp if m.ok)
    notes = [
        f"State: {ntensors} float32 tensors, {total / MIB:.0f} MiB in total, held in memory by the "
        "writing process (its RSS before the operation includes it). Every contender ends with "
        "fsync of its file(s) (torch.save and safetensors: fsync added after the call; "
        "portable_ckpt: fsync of the shard, the manifest and the directory — the full commit).",
        "Before each repetition: " + ("`sync` + `echo 3 > /proc/sys/vm/drop_caches` (root)."
                                      if ctx.cold else "`sync` (page cache cannot be dropped here)."),
        "`os.write loop` writes the same in-memory state with a bare Python loop of 16 MiB "
        "`os.write` calls + fsync (no format, no checksum): the limit for writing *from memory* "
        "here, as opposed to dd's reuse of one 16 MiB buffer filled from /dev/zero.",
        "Order rotates every repetition; the ratio column is the median of per-repetition ratios "
        "(time of dd / time of contender), with the min–max range.",
        f"Plain memory copy of the same state: {cps.get('mib_s', 0):.0f} MiB/s into fresh buffers "
        f"(page faults included, median {cps.get('median_s', 0):.3f} s), "
        f"{total / MIB / pref[len(pref) // 2]:.0f} MiB/s into already-touched buffers." if pref else "",
    ]
    targets = [{"name": "save 1 process ≥ 0.9× dd conv=fsync" + (" (quick: smaller state)" if ctx.quick else ""),
                "value": f"{r['median']:.3f}×" if r["n"] else "n/a", "target": "≥ 0.9×",
                "met": bool(r["n"] and r["median"] >= 0.9)}]
    return {"title": "Save: one process, from memory", "rows": rows, "notes": [n for n in notes if n],
            "targets": targets, "raw": {k: [m.to_json() for m in v] for k, v in {**res, "memcpy": cp}.items()},
            "plots": {"kind": "throughput", "bytes": total, "summary": {k: summary(v, total) for k, v in res.items()},
                      "memcpy_mib_s": cps.get("mib_s")}}


# ---------------------------------------------------------------------------------------------
# read: partial reads of a big tensor; verify --deep; checksum; zstd
# ---------------------------------------------------------------------------------------------


def _fixture(ctx: Ctx, name: str, tiles: list[int] | None = None) -> dict[str, Any]:
    if name in ctx.fixtures:
        return dict(ctx.fixtures[name])
    n = ctx.size(1024, 4096, 16384)
    root = os.path.join(ctx.scratch, "fixture-" + name)
    ctx.clean(root)
    ctx.log(f"  writing fixture {name}: float32 [{n}, {n}] ({n * n * 4 / MIB:.0f} MiB)"
            + (f", stored as {tiles[0]}×{tiles[1]} tiles" if tiles else ", one chunk"))
    m = run_child("fixture", "make_ckpt", {"root": root, "rows": n, "cols": n, "tiles": tiles})
    if not m.ok:
        raise RuntimeError(f"fixture {name} failed: {m.error}")
    version = next(p for p in glob.glob(os.path.join(root, "s*")) if os.path.isdir(p))
    files = sorted(p for p in glob.glob(os.path.join(version, "**", "*"), recursive=True)
                   if os.path.isfile(p) and not p.endswith("manifest.json"))
    fx = {"root": root, "n": n, "version": version, "files": files,
          "bytes": sum(os.path.getsize(p) for p in files)}
    ctx.fixtures[name] = fx
    return dict(fx)


def section_read(ctx: Ctx) -> dict[str, Any]:
    plain = _fixture(ctx, "rowmajor")
    tiled = _fixture(ctx, "tiled", [512, 512])
    n = plain["n"]
    slab_rows = MIB // (n * 4)
    r0 = n // 3 + 3
    regions = [
        ("row slab", plain, [r0, 0], [slab_rows, n]),
        ("square 512×512", plain, [r0, n // 3 + 5], [512, 512]),
        ("square 512×512, tiled 512×512 storage", tiled, [r0, n // 3 + 5], [512, 512]),
    ]
    rows = []
    raw: dict[str, Any] = {}
    targets = []
    modes = (["cold"] if ctx.cold else []) + ["warm"]
    for label, fx, offs, lens in regions:
        for mode in modes:
            ms = [run_child(label, "read_region", {"root": fx["root"], "offsets": offs, "lengths": lens},
                            cache=mode, cache_files=fx["files"]) for _ in range(ctx.reps)]
            raw[f"{label} [{mode}]"] = [m.to_json() for m in ms]
            ok = [m for m in ms if m.ok]
            if not ok:
                rows.append({"region": label, "cache": mode, "error": ms[0].error[-200:]})
                continue
            e = ok[0].extra
            s = summary(ms)
            rows.append({
                "region": f"{label} {lens[0]}×{lens[1]} at {offs}",
                "cache": "cold (dropped)" if mode == "cold" else "page cache",
                "requested MiB": e["bytes"] / MIB,
                "data bytes read MiB": e["bytes_read"] / MIB,
                "manifest KiB": e["manifest_bytes"] / 1024,
                "shard headers KiB": e["header_bytes"] / 1024,
                "blocks verified": e["blocks_verified"],
                "peak scratch MiB": e["peak_scratch"] / MIB,
                "median ms (open+read)": s["median_s"] * 1e3,
                "peak RSS MiB": s["maxrss_mib"],
            })
            if mode == modes[0]:
                targets.append({"name": f"1 MiB region of a {fx['bytes'] / MIB:.0f} MiB tensor, {label}: bytes touched",
                                "value": f"{e['bytes_read'] / MIB:.2f} MiB data + {(e['manifest_bytes'] + e['header_bytes']) / 1024:.0f} KiB metadata",
                                "target": "≤ 2 MiB + metadata", "met": e["bytes_read"] <= 2 * MIB})
    notes = [
        "`data bytes read` is `Checkpoint.stats.bytes_read`: every byte fetched from the shard, "
        "rounded out to the 256 KiB checksum blocks it touches (all of which are verified). The "
        "manifest and the shard header are read once per open and listed separately.",
        "A 1 MiB square of a row-major tensor is 512 rows of 2 KiB each, 64 KiB apart: every row "
        "touches its own 256 KiB checksum block, so the bytes touched are bounded by the block "
        "size × rows, not by the region. Storing the tensor as tiles (any writer may: range records "
        "are N-d boxes) makes square reads cheap; an unaligned 512×512 square touches up to 4 tiles.",
        "Cold rows drop the page cache before each repetition (`echo 3 > /proc/sys/vm/drop_caches`)."
        if ctx.cold else "The page cache cannot be dropped on this machine: all reads may be cached.",
    ]
    return {"title": "Partial read: a 1 MiB region of a big stored tensor", "rows": rows, "notes": notes,
            "targets": targets, "raw": raw}


def section_verify(ctx: Ctx) -> dict[str, Any]:
    fx = _fixture(ctx, "rowmajor")
    nbytes = fx["bytes"]
    modes = ["warm"] + (["cold"] if ctx.cold else [])
    rows = []
    raw: dict[str, Any] = {}
    targets = []
    plots: dict[str, Any] = {}
    for mode in modes:
        res = _alternate(ctx, [
            ("verify --deep", lambda mode=mode: run_child("verify --deep", "verify_deep", {"root": fx["root"]},
                                                          cache=mode, cache_files=fx["files"])),
            ("python read loop", lambda mode=mode: run_child("python read loop", "read_files", {"files": fx["files"]},
                                                             cache=mode, cache_files=fx["files"])),
            ("cat > /dev/null", lambda mode=mode: run_command("cat > /dev/null", ["sh", "-c", 'cat "$@" > /dev/null', "cat", *fx["files"]],
                                                              cache=mode, cache_files=fx["files"])),
        ], ctx.reps)
        for row in _rows_from(res, nbytes, "python read loop"):
            row["cache"] = "page cache" if mode == "warm" else "cold (dropped)"
            rows.append(row)
        raw[mode] = {k: [m.to_json() for m in v] for k, v in res.items()}
        r = pair_ratios(res["verify --deep"], res["python read loop"])
        rc = pair_ratios(res["verify --deep"], res["cat > /dev/null"])
        plots[mode] = {k: summary(v, nbytes) for k, v in res.items()}
        if mode == "warm":
            ctx.fixtures["pagecache_read_mib_s"] = summary(res["python read loop"], nbytes).get("mib_s")
            targets.append({"name": "verify --deep vs page-cache read (python read loop)",
                            "value": f"{r['median']:.3f}× (vs cat: {rc['median']:.3f}×)" if r["n"] else "n/a",
                            "target": "≥ 0.8×", "met": bool(r["n"] and r["median"] >= 0.8)})
    notes = [f"Files: the {len(fx['files'])} data/entry files of the fixture version, {nbytes / MIB:.0f} MiB. "
             "`verify --deep` time includes opening the version (manifest parse) and the metadata "
             "checks (sizes, headers, coverage), then reads and CRC32C-checks every block. The "
             "`cat` time includes process start-up."]
    return {"title": "verify --deep vs reading the same files", "rows": rows, "notes": notes,
            "targets": targets, "raw": raw, "plots": {"kind": "verify", **plots}}


def section_checksum(ctx: Ctx) -> dict[str, Any]:
    nbytes = ctx.size(16, 256, 1024) * MIB
    ms = [run_child("crc32c", "crc", {"bytes": nbytes}) for _ in range(ctx.reps)]
    ok = [m for m in ms if m.ok]
    med = sorted(ok, key=lambda m: m.seconds)[len(ok) // 2]
    raw_s = sorted(m.extra["raw_seconds"] for m in ok)[len(ok) // 2]
    cp_s = sorted(m.extra["memcpy_seconds"] for m in ok)[len(ok) // 2]
    page = ctx.fixtures.get("pagecache_read_mib_s")
    if page is None:
        fx = _fixture(ctx, "rowmajor")
        rd = [run_child("read", "read_files", {"files": fx["files"]}, cache="warm", cache_files=fx["files"]) for _ in range(ctx.reps)]
        page = summary(rd, fx["bytes"]).get("mib_s")
    thr = nbytes / MIB / med.seconds
    rows = [
        {"operation": "BlockHasher (256 KiB blocks, format path)", "MiB/s": thr},
        {"operation": "crc32c library, 16 MiB calls", "MiB/s": nbytes / MIB / raw_s},
        {"operation": "memcpy into fresh buffer (numpy)", "MiB/s": nbytes / MIB / cp_s},
        {"operation": "page-cache read (python read loop, verify section)", "MiB/s": page},
    ]
    targets = [{"name": "checksum throughput vs page-cache read", "value": f"{thr / page:.2f}×" if page else "n/a",
                "target": "≥ 1× (informative)", "met": bool(page and thr >= page)}]
    return {"title": "Checksum (CRC32C) throughput", "rows": rows, "targets": targets,
            "notes": [f"{nbytes / MIB:.0f} MiB in memory, one core, median of {len(ok)} runs."],
            "raw": [m.to_json() for m in ms]}


def section_zstd(ctx: Ctx) -> dict[str, Any]:
    nbytes = ctx.size(1, 16, 64) * MIB
    rows = []
    raw = []
    for kind in ("normal",) if ctx.smoke else ("normal", "adam_v", "sparse"):
        for dtype in ("bfloat16", "float32"):
            for level in (1, 3) if ctx.smoke else (1, 3, 9):
                ms = [run_child("zstd", "zstd", {"bytes": nbytes, "dtype": dtype, "kind": kind, "level": level})
                      for _ in range(1 if ctx.quick else 2)]
                ok = [m for m in ms if m.ok]
                raw += [m.to_json() for m in ms]
                if not ok:
                    continue
                c = min(m.seconds for m in ok)
                dc = min(m.extra["decompress_seconds"] for m in ok)
                rows.append({"data": kind, "dtype": dtype, "level": level, "ratio": ok[0].extra["ratio"],
                             "compress MiB/s": nbytes / MIB / c, "decompress MiB/s": nbytes / MIB / dc})
    notes = [
        f"{nbytes / MIB:.0f} MiB per case, one thread (zstandard {_ver('zstandard')}), best of the runs. "
        "`normal`: N(0, 0.02) weights; `adam_v`: Adam second moments (squared N(0, 1e-3) "
        "gradients); `sparse`: normal weights with every other 4096-wide row zero.",
        "Random-mantissa floats barely compress (the sign/exponent bits are the only redundancy); "
        "zstd pays off for bf16 (more of each value is exponent) and for data with zeros.",
    ]
    return {"title": "zstd levels on weights", "rows": rows, "notes": notes, "raw": raw,
            "plots": {"kind": "zstd", "rows": rows}}


def _ver(mod: str) -> str:
    try:
        return str(__import__(mod).__version__)
    except Exception:
        return "?"


# ---------------------------------------------------------------------------------------------
# scale by simulation
# ---------------------------------------------------------------------------------------------


def section_scale(ctx: Ctx) -> dict[str, Any]:
    # (writers, tensors). W=4096 × 2000 tensors (5.9 M records) takes far longer than a run's
    # budget with the current core (see the report), so full mode measures it at 250 tensors
    # (0.74 M records, like W=512 × 2000) and extrapolates; BENCH_SCALE_POINTS="4096x2000" forces it.
    points = ([(16, 50), (64, 50)] if ctx.smoke else [(64, 200), (512, 200)] if ctx.quick
              else [(64, 2000), (512, 2000), (4096, 250)])
    env = os.environ.get("BENCH_SCALE_POINTS")
    if env:
        points = [(int(x.split("x")[0]), int(x.split("x")[1])) for x in env.split(",")]
    d = os.path.join(ctx.scratch, "scale")
    os.makedirs(d, exist_ok=True)
    rows = []
    raw: dict[str, Any] = {}
    pts: list[dict[str, Any]] = []
    gcdiag: list[dict[str, Any]] = []
    diag = [] if ctx.quick else [(512, 200, "on"), (512, 200, "off")]
    for w, tensors, gcmode in [(w, t, "on") for w, t in points] + diag:
        mpath = os.path.join(d, f"manifest-w{w}.json")
        ctx.log(f"    commit W={w} ({tensors} tensors)")
        c = run_child(f"commit W={w}", "scale_commit", {"world": w, "tensors": tensors, "out": mpath, "gc": gcmode},
                      timeout=3600)
        if not c.ok:
            rows.append({"writers": w, "error": c.error[-300:]})
            continue
        tp = 4
        ctx.log(f"    plan W={w}: {c.seconds:.2f} s commit, {c.extra['records']} records")
        p = run_child(f"plan W={w}", "scale_plan", {"manifest": mpath, "tensors": tensors, "tp": tp,
                                                     "fsdp": w // tp, "rank": w // 2 + 3,
                                                     "compare_plain_json": True, "gc": gcmode}, timeout=3600)
        ctx.clean(mpath)
        raw[f"{w}x{tensors}-gc-{gcmode}"] = {"commit": c.to_json(), "plan": p.to_json()}
        ph = c.extra["phases"]
        pp = p.extra.get("phases", {}) if p.ok else {}
        pt = {"writers": w, "records": c.extra["records"], "manifest_mib": c.extra["manifest_bytes"] / MIB,
              "commit_s": c.seconds, **{f"commit.{k}": v for k, v in ph.items()},
              "commit_rss_mib": c.maxrss_bytes / MIB, "commit_setup_rss_mib": c.extra["setup_maxrss_bytes"] / MIB,
              "plan_s": p.seconds if p.ok else None, **{f"plan.{k}": v for k, v in pp.items()},
              "plan_rss_mib": p.maxrss_bytes / MIB if p.ok else None,
              "plain_json_loads_s": p.extra.get("plain_json_loads_seconds") if p.ok else None,
              "plan_pieces": p.extra.get("pieces") if p.ok else None}
        if gcmode == "on" and (w, tensors) in points:
            pts.append(pt)
        else:
            pt["gc"] = gcmode
            gcdiag.append(pt)
        rows.append({
            "writers (TP×FSDP)": f"{w} (8×{w // 8})" + ("" if (w, tensors) in points else f", gc {gcmode}"),
            "tensors": c.extra["tensors"], "range records": c.extra["records"],
            "manifest MiB": pt["manifest_mib"],
            "commit s": c.seconds, "merge": ph["merge"], "coverage": ph["coverage"], "to_json": ph["to_json"],
            "round-trip parse": ph["roundtrip_parse"], "dumps": ph["dumps"], "write+fsync": ph["write"],
            "commit peak RSS MiB (indexes alone)": f"{pt['commit_rss_mib']:.0f} ({pt['commit_setup_rss_mib']:.0f})",
            "rank plan s": pt["plan_s"],
            "plan: json / parse / plan": "/".join(f"{pp.get(k, float('nan')):.2f}" for k in ("json_loads", "parse_manifest", "plan")),
            "plan peak RSS MiB": pt["plan_rss_mib"],
        })
    # Growth exponents against the number of records.
    fits: dict[str, float | None] = {}
    if len(pts) >= 2:
        xs = [p["records"] for p in pts]
        for k in ["commit_s", "commit.merge", "commit.coverage", "commit.to_json", "commit.roundtrip_parse",
                  "commit.dumps", "plan_s", "plan.json_loads", "plan.parse_manifest", "plan.plan",
                  "manifest_mib", "commit_rss_mib", "plan_rss_mib"]:
            ys = [p.get(k) or 0.0 for p in pts]
            fits[k] = fit_exponent(xs, ys)
    targets = []
    if pts:
        from bench.scale_sim import Layout, model_tensors, record_count

        n_target = 5944040  # records of 4096 writers × 2000 tensors (record_count of the layout)
        if ctx.quick and not ctx.smoke:
            n_target = record_count(model_tensors(2000), Layout.for_world(4096))
        big = max(pts, key=lambda p: p["records"])
        measured = any(p["writers"] >= 4096 and p["records"] >= n_target for p in pts)
        for key, label, limit in (("commit_s", "commit", 10.0), ("plan_s", "one rank's load plan", 1.0)):
            if measured:
                v = next(p[key] for p in pts if p["writers"] >= 4096 and p["records"] >= n_target)
                txt = f"{v:.1f} s (measured)"
            else:
                e = fits.get(key) or 1.0
                v = big[key] * (n_target / big["records"]) ** max(e, 1.0)
                txt = (f"≈ {v:.0f} s (extrapolated from {big['records']:,} records at exponent "
                       f"{max(e, 1.0):.2f}; measured {big[key]:.1f} s)")
            targets.append({"name": f"{label} at 4096 writers × 2000 tensors ({n_target:,} records)",
                            "value": txt, "target": f"< {limit:g} s", "met": bool(v < limit)})
        for k in ("commit_s", "plan_s"):
            e = fits.get(k)
            if e is not None:
                targets.append({"name": f"growth exponent of {k} in records", "value": f"{e:.2f}",
                                "target": "≤ ~1.1 (n log n)", "met": e <= 1.15})
    notes = [
        "Synthetic Llama-70B-like model (bench/scale_sim.py): bf16 params + fp32 Adam moments, "
        "TP=8 × FSDP=W/8 (FSDP2 chunk semantics, uneven QKV splits), norms replicated over TP and "
        "written once. WriterIndex objects are built directly (no data written); the timed commit "
        "runs `merge_indexes`, `check_coverage` for every tensor, `Manifest.to_json`, the "
        "round-trip `parse_manifest` that `commit()` does, `jsonio.dumps` and a fsync'd write. "
        "Not simulated: `commit()`'s per-file `size()` calls and its reading of every shard "
        "header (`check_headers`), which add W stat calls and W header parses.",
        "The load plan is one rank (TP=4 × FSDP=W/4 target layout) opening the manifest "
        "(`jsonio.loads` + `parse_manifest`) and calling the real `Checkpoint.plan_read` for every "
        "tensor (which proves coverage of each tensor and builds its RangeIndex on first use).",
        "GC diagnostic (W=512 × 200 tensors, same code with `gc.disable()` around the timed part): "
        + "; ".join(f"gc {p['gc']}: commit {p['commit_s']:.2f} s, plan {p['plan_s'] or float('nan'):.2f} s"
                    for p in gcdiag),
        "Growth exponents (least-squares slope of log time vs log records): "
        + ", ".join(f"{k} {v:.2f}" for k, v in fits.items() if v is not None),
    ]
    return {"title": "Scale by simulation: metadata cost at thousands of writers", "rows": rows,
            "notes": notes, "targets": targets, "raw": raw, "plots": {"kind": "scale", "points": pts},
            "fits": fits}


def section_scale_proto(ctx: Ctx) -> dict[str, Any]:
    """The columnar range-table prototype (bench/proto_columnar.py) on the same layouts."""
    from bench.proto_columnar import __doc__ as proto_doc

    worlds = [16, 64] if ctx.smoke else [64, 512] if ctx.quick else [64, 512, 4096]
    tensors = ctx.size(50, 200, 2000)
    d = os.path.join(ctx.scratch, "scale-proto")
    os.makedirs(d, exist_ok=True)
    rows = []
    raw = {}
    pts = []
    for w in worlds:
        m = run_child(f"proto W={w}", "scale_proto", {"world": w, "tensors": tensors, "dir": d}, timeout=3600)
        raw[str(w)] = m.to_json()
        if not m.ok:
            rows.append({"writers": w, "error": m.error[-300:]})
            continue
        e = m.extra
        ctx.log(f"    proto W={w}: commit {e['commit_s']:.2f} s, plan {e['plan_s']:.3f} s")
        pts.append({"writers": w, "records": e["records"], "commit_s": e["commit_s"], "plan_s": e["plan_s"],
                    "rss_mib": m.maxrss_bytes / MIB})
        rows.append({"writers": w, "range records": e["records"], "commit s": e["commit_s"],
                     **{f"commit.{k}": v for k, v in e["commit_phases"].items()},
                     "table MiB (zstd)": e["table_bytes"] / MIB, "manifest KiB": e["manifest_bytes"] / 1024,
                     "rank plan s": e["plan_s"], **{f"plan.{k}": v for k, v in e["plan_phases"].items()},
                     "peak RSS MiB": m.maxrss_bytes / MIB})
    fits = {}
    if len(pts) >= 2:
        xs = [p["records"] for p in pts]
        fits = {k: fit_exponent(xs, [p[k] for p in pts]) for k in ("commit_s", "plan_s")}
    targets = []
    if pts and pts[-1]["writers"] >= 4096 and tensors >= 2000:
        targets = [{"name": "PROTOTYPE commit at 4096 writers", "value": f"{pts[-1]['commit_s']:.2f} s", "target": "< 10 s",
                    "met": pts[-1]["commit_s"] < 10},
                   {"name": "PROTOTYPE one rank's plan at 4096 writers", "value": f"{pts[-1]['plan_s']:.3f} s",
                    "target": "< 1 s", "met": pts[-1]["plan_s"] < 1}]
    return {"title": "Prototype (not the format yet): columnar range table", "rows": rows, "targets": targets,
            "notes": [(proto_doc or "").strip(),
                      "Growth exponents: " + ", ".join(f"{k} {v:.2f}" for k, v in fits.items() if v is not None)],
            "raw": raw, "plots": {"kind": "scale_proto", "points": pts}}


# ---------------------------------------------------------------------------------------------
# peers owned by other helpers: called, never edited
# ---------------------------------------------------------------------------------------------


def _external(ctx: Ctx, title: str, script: str, args: list[str], timeout: float) -> dict[str, Any]:
    path = REPO / "bench" / script
    if not path.exists():
        return {"title": title, "rows": [], "notes": [f"bench/{script} does not exist yet; section skipped."],
                "skipped": True}
    jpath = os.path.join(ctx.out, f"_{script}.json")
    argv = [sys.executable, str(path), *[a.replace("{json}", jpath) for a in args]]
    ctx.log("    " + " ".join(argv[1:]))
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=child_env(), cwd=str(REPO))
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = 124, str(exc.stdout or ""), f"timed out after {timeout} s"
    data: Any = None
    if os.path.exists(jpath):
        import json

        with open(jpath) as f:
            data = json.load(f)
        os.unlink(jpath)
    notes = [f"Ran `{' '.join(['python', f'bench/{script}', *args])}` (exit {rc})."]
    return {"title": title, "rows": [], "notes": notes, "external": {"stdout": out[-20000:], "stderr": err[-4000:],
            "rc": rc, "json": data}}


def section_torch(ctx: Ctx) -> dict[str, Any]:
    from bench import torch_glue

    return torch_glue.run(ctx, _external)


def section_s3(ctx: Ctx) -> dict[str, Any]:
    size = "32" if ctx.quick else "256"
    rounds = "2" if ctx.quick else "3"
    return _external(ctx, "S3 (loopback moto server) vs boto3", "bench_s3.py",
                     ["--size-mib", size, "--rounds", rounds, "--json", "{json}"], 1800)


SECTIONS: dict[str, Callable[[Ctx], dict[str, Any]]] = {
    "save": section_save,
    "read": section_read,
    "verify": section_verify,
    "checksum": section_checksum,
    "zstd": section_zstd,
    "scale": section_scale,
    "scale-proto": section_scale_proto,
    "torch": section_torch,
    "s3": section_s3,
}
#: What ``--only core`` means.
GROUPS = {
    "core": ["save", "read", "verify", "checksum", "zstd"],
    "scaling": ["scale", "scale-proto"],
    "peers": ["torch", "s3"],
}
