"""The benchmark sections. Each returns a dict the report renders (see :mod:`bench.report`).

A section result has ``title``, ``rows`` (list of dicts: one table), optional ``tables``
(``{caption: rows}``), ``notes`` (list of str), ``targets`` (list of dicts: name, value, target,
met), ``raw`` (every measurement) and ``plots`` (data the plotting code uses).
"""

from __future__ import annotations

import glob
import math
import os
import shutil
import statistics
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


def _fixture(ctx: Ctx, name: str, tiles: list[int] | None = None,
             block_size: int | None = None) -> dict[str, Any]:
    if name in ctx.fixtures:
        return dict(ctx.fixtures[name])
    n = ctx.size(1024, 4096, 16384)
    root = os.path.join(ctx.scratch, "fixture-" + name)
    ctx.clean(root)
    ctx.log(f"  writing fixture {name}: float32 [{n}, {n}] ({n * n * 4 / MIB:.0f} MiB)"
            + (f", stored as {tiles[0]}×{tiles[1]} tiles" if tiles else ", one chunk")
            + (f", {block_size // 1024} KiB checksum blocks" if block_size else ""))
    m = run_child("fixture", "make_ckpt", {"root": root, "rows": n, "cols": n, "tiles": tiles,
                                           "block_size": block_size})
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
    # Tiles 64 columns wide (256-byte tile rows) and 32 KiB blocks: an unaligned square reads at
    # most 63 extra columns on each side and one partial block at each end of a tile's run.
    tiled = _fixture(ctx, "tiled", [1024, 64], block_size=32 << 10)
    n = plain["n"]
    slab_rows = MIB // (n * 4)
    r0 = n // 3 + 3
    regions = [
        ("row slab", plain, [r0, 0], [slab_rows, n]),
        ("square 512×512", plain, [r0, n // 3 + 5], [512, 512]),
        ("square 512×512, 1024×64-tile storage", tiled, [r0, n // 3 + 5], [512, 512]),
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
        "rounded out to the checksum blocks it touches (all of which are verified): 256 KiB blocks "
        "in the row-major file, 32 KiB in the tiled one. The manifest and the shard header are read "
        "once per open and listed separately.",
        "A 1 MiB square of a row-major tensor is 512 rows of 2 KiB each, 64 KiB apart: every row "
        "touches its own 256 KiB checksum block, so the bytes touched are bounded by the block "
        "size × rows, not by the region (row slabs, what resharding along dimension 0 reads, stay "
        "cheap). A writer that expects region reads stores the tensor as tiles (range records are "
        "N-d boxes; `save_arrays(..., tiles={key: (rows, cols)})`, `ShardWriter.add_tiled`) and picks "
        "the block size (`block_size=`): with 1024×64 tiles and 32 KiB blocks an unaligned 512×512 square reads "
        "9 tile columns of 512 rows × 256 B plus one partial block at each end of each run. Its "
        "metadata is larger (4,096 range records and 32,768 checksums in the manifest, 4,096 "
        "entries in the shard header: ~1.1 MiB, read once per open): the price of random "
        "access, paid only by tensors stored that way.",
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


def _med(ms: list[Measurement], get: Callable[[Measurement], float | None]) -> float | None:
    vals = [v for v in (get(m) for m in ms if m.ok) if v is not None]
    return statistics.median(vals) if vals else None


def _span(ms: list[Measurement], get: Callable[[Measurement], float]) -> str:
    vals = [get(m) for m in ms if m.ok]
    if not vals:
        return "failed"
    if len(vals) == 1:
        return f"{vals[0]:.3f}"
    return f"{statistics.median(vals):.3f} [{min(vals):.3f}–{max(vals):.3f}]"


def _scale_point(ctx: Ctx, form: str, w: int, tensors: int, reps: int, *, profile: bool, cold: bool) -> dict[str, Any]:
    """Write one simulated attempt, commit it ``reps`` times, open + plan one rank ``reps`` times."""
    root = os.path.join(ctx.scratch, "scale", f"{form}-w{w}-t{tensors}")
    ctx.clean(root)
    os.makedirs(root)
    tag = f"{form} W={w}×{tensors}"
    pt: dict[str, Any] = {"form": form, "writers": w, "tensors": tensors, "loadavg_start": os.getloadavg()[0]}
    try:
        s = run_child(f"setup {tag}", "scale_setup", {"root": root, "writers": w, "tensors": tensors, "form": form},
                      timeout=3600)
        if not s.ok:
            return {**pt, "error": "setup: " + s.error[-600:]}
        pt["setup"] = s.to_json()
        ctx.log(f"    {tag}: setup {s.seconds:.1f} s, {s.extra['records']:,} records, "
                f"{s.extra['table_bytes'] / MIB:.1f} MiB writer tables, {s.extra['index_bytes'] / MIB:.1f} MiB indexes")
        args = {"root": root, "writers": w, "tensors": tensors, "tensor_table": form == "table"}
        commits = []
        for i in range(reps):
            m = run_child(f"commit {tag}", "scale_commit", args, cache="sync", timeout=3600)
            commits.append(m)
            ctx.log(f"    {tag}: commit rep {i + 1}/{reps}: {m.seconds:7.3f} s  rss {m.maxrss_bytes / MIB:6.0f} MiB"
                    + ("" if m.ok else f"  FAILED {m.error[-400:]}"))
            if not m.ok:
                return {**pt, "error": "commit: " + m.error[-600:], "commit": [c.to_json() for c in commits]}
        pargs = {"root": root, "writers": w, "tensors": tensors, "tp": 4, "rank": w // 2 + 3}
        plans = []
        for i in range(reps):
            m = run_child(f"open+plan {tag}", "scale_open_plan", pargs, cache="sync", timeout=3600)
            plans.append(m)
            ctx.log(f"    {tag}: open+plan rep {i + 1}/{reps}: open {m.extra.get('open_s', float('nan')):.3f} s "
                    f"plan {m.extra.get('plan_s', float('nan')):.3f} s  rss {m.maxrss_bytes / MIB:6.0f} MiB"
                    + ("" if m.ok else f"  FAILED {m.error[-400:]}"))
        pt["commit"] = [c.to_json() for c in commits]
        pt["open_plan"] = [p.to_json() for p in plans]
        if cold:  # one repetition of each from a dropped page cache (diagnostic)
            c = run_child(f"commit {tag} cold", "scale_commit", args, cache="cold", timeout=3600)
            p = run_child(f"open+plan {tag} cold", "scale_open_plan", pargs, cache="cold", timeout=3600)
            pt["cold"] = {"commit": c.to_json(), "open_plan": p.to_json()}
            ctx.log(f"    {tag}: cold cache: commit {c.seconds:.3f} s, open {p.extra.get('open_s', float('nan')):.3f} s, "
                    f"plan {p.extra.get('plan_s', float('nan')):.3f} s")
        if profile:  # cProfile slows the run: separate repetitions, never in the medians
            c = run_child(f"commit {tag} profiled", "scale_commit", {**args, "profile": True}, cache="sync", timeout=3600)
            p = run_child(f"open+plan {tag} profiled", "scale_open_plan", {**pargs, "profile": True}, cache="sync",
                          timeout=3600)
            pt["profile"] = {"commit_s": c.seconds, "commit": c.extra.get("profile"),
                             "commit_cumulative": c.extra.get("profile_cumulative"),
                             "open_plan_s": p.seconds, "open_plan": p.extra.get("profile"),
                             "open_plan_cumulative": p.extra.get("profile_cumulative"),
                             "error": (c.error + p.error)[-600:]}
    finally:
        ctx.clean(root)
    pt["loadavg_end"] = os.getloadavg()[0]
    ok_c = [m for m in commits if m.ok]
    ok_p = [m for m in plans if m.ok]
    if not ok_p:
        return {**pt, "error": "open+plan: " + plans[-1].error[-600:]}
    c0, p0 = ok_c[-1].extra, ok_p[-1].extra
    summ: dict[str, Any] = {
        "records": c0["records"], "setup_s": s.seconds,
        "writer_tables_mib": s.extra["table_bytes"] / MIB, "writer_indexes_mib": s.extra["index_bytes"] / MIB,
        "commit_s": _med(ok_c, lambda m: m.seconds),
        "commit_cpu_s": _med(ok_c, lambda m: m.extra.get("cpu_s")),
        "open_cpu_s": _med(ok_p, lambda m: m.extra.get("open_cpu_s")),
        "plan_cpu_s": _med(ok_p, lambda m: m.extra.get("plan_cpu_s")),
        "commit_rss_mib": max(m.maxrss_bytes for m in ok_c) / MIB,
        "commit_pre_rss_mib": max(m.extra["setup_maxrss_bytes"] for m in ok_c) / MIB,
        "open_s": _med(ok_p, lambda m: m.extra["open_s"]),
        "plan_s": _med(ok_p, lambda m: m.extra["plan_s"]),
        "open_plan_s": _med(ok_p, lambda m: m.seconds),
        "open_rss_mib": max(m.extra["open_maxrss_bytes"] for m in ok_p) / MIB,
        "plan_rss_mib": max(m.maxrss_bytes for m in ok_p) / MIB,
        "plan_pre_rss_mib": max(m.extra["setup_maxrss_bytes"] for m in ok_p) / MIB,
        "table_mib": c0["table_bytes"] / MIB, "manifest_mib": c0["manifest_bytes"] / MIB,
        "pieces": p0["pieces"], "planned_tensors": p0["planned_tensors"], "files": c0["files"],
        "format_version": c0["format_version"],
        "commit_span": _span(ok_c, lambda m: m.seconds),
        "open_span": _span(ok_p, lambda m: m.extra["open_s"]),
        "plan_span": _span(ok_p, lambda m: m.extra["plan_s"]),
    }
    summ["commit_rss_inc_mib"] = summ["commit_rss_mib"] - summ["commit_pre_rss_mib"]
    summ["plan_rss_inc_mib"] = summ["plan_rss_mib"] - summ["plan_pre_rss_mib"]
    for k in c0["phases"]:
        summ[f"commit.{k}"] = statistics.median(m.extra["phases"][k] for m in ok_c)
    for k in p0["phases"]:
        summ[k] = statistics.median(m.extra["phases"][k] for m in ok_p)
    if "cold" in pt:
        cc, cp = pt["cold"]["commit"], pt["cold"]["open_plan"]
        summ["cold_commit_s"] = cc["seconds"] if cc["ok"] else None
        summ["cold_open_s"] = cp["extra"].get("open_s") if cp["ok"] else None
        summ["cold_plan_s"] = cp["extra"].get("plan_s") if cp["ok"] else None
    pt.update(summ)
    return pt


def _nlogn_slope(pts: list[dict[str, Any]]) -> float:
    xs = [p["records"] for p in pts]
    if len(xs) < 2 or min(xs) < 2 or max(xs) == min(xs):
        return float("nan")
    return fit_exponent(xs, [x * math.log(x) for x in xs]) or float("nan")


def section_scale(ctx: Ctx) -> dict[str, Any]:
    """Commit and one rank's open + plan of simulated attempts of W writers (real files, real core)."""
    # (form, writers, tensors, fitted): the fitted table points give the growth exponents; the
    # others are the before/after comparison of the 1.0 JSON path with the 1.1 table path.
    if ctx.smoke:
        plan = [("table", 16, 50, True), ("table", 64, 50, True), ("json", 16, 50, False)]
    elif ctx.quick:
        plan = [("table", 64, 200, True), ("table", 512, 200, True), ("table", 4096, 200, True),
                ("json", 512, 200, False)]
    else:
        plan = [("table", 64, 2000, True), ("table", 512, 2000, True), ("table", 4096, 2000, True),
                ("table", 512, 200, False), ("json", 64, 2000, False), ("json", 512, 200, False)]
    env = os.environ.get("BENCH_SCALE_POINTS")  # e.g. "64x2000,4096x2000" (table points)
    if env:
        plan = [("table", int(x.split("x")[0]), int(x.split("x")[1]), True) for x in env.split(",")]
    big = max((p for p in plan if p[3]), key=lambda p: p[1] * p[2])
    pts: list[dict[str, Any]] = []
    for form, w, tensors, fitted in plan:
        reps = ctx.reps if form == "table" else min(ctx.reps, 3)
        is_big = (form, w, tensors, fitted) == big
        pt = _scale_point(ctx, form, w, tensors, reps, profile=is_big and not ctx.smoke,
                          cold=is_big and ctx.cold and not ctx.quick)
        pt["fitted"] = fitted
        pts.append(pt)
    good = [p for p in pts if "error" not in p]
    rows = []
    for p in pts:
        label = {"table": "1.1 table", "json": "1.0 JSON"}[p["form"]]
        if "error" in p:
            rows.append({"format": label, "writers": p["writers"], "tensors": p["tensors"], "error": p["error"]})
            continue
        lay = f"{p['writers']} (8×{p['writers'] // 8})" if p["writers"] >= 8 else str(p["writers"])
        rows.append({
            "format": label, "writers (TP×FSDP)": lay, "tensors": p["tensors"], "range records": p["records"],
            "commit s (median [min–max])": p["commit_span"],
            "commit CPU s": p["commit_cpu_s"],
            "open s": p["open_span"], "plan s": p["plan_span"], "open+plan s": p["open_plan_s"],
            "open / plan CPU s": f"{p['open_cpu_s']:.3f} / {p['plan_cpu_s']:.3f}",
            "commit peak RSS MiB": p["commit_rss_mib"], "open+plan peak RSS MiB": p["plan_rss_mib"],
            "table MiB": p["table_mib"] if p["form"] == "table" else None, "manifest MiB": p["manifest_mib"],
            "pieces planned": p["pieces"], "load avg": f"{p['loadavg_start']:.1f}–{p['loadavg_end']:.1f}",
        })
    tables: dict[str, list[dict[str, Any]]] = {}
    tables["Commit phases (medians, s; wrapped functions of the real commit())"] = [
        {"point": f"{p['form']} {p['writers']}×{p['tensors']}", "commit s": p["commit_s"],
         **{k.split(".", 1)[1]: v for k, v in p.items() if k.startswith("commit.")},
         "RSS before / peak MiB": f"{p['commit_pre_rss_mib']:.0f} / {p['commit_rss_mib']:.0f}"}
        for p in good]
    tables["Open and plan phases (medians, s)"] = [
        {"point": f"{p['form']} {p['writers']}×{p['tensors']}", "open s": p["open_s"],
         **{k: v for k, v in p.items() if k.startswith("open.")}, "plan s": p["plan_s"],
         **{k: v for k, v in p.items() if k.startswith("plan.")},
         "RSS before / after open / peak MiB": f"{p['plan_pre_rss_mib']:.0f} / {p['open_rss_mib']:.0f} / "
                                               f"{p['plan_rss_mib']:.0f}"}
        for p in good]
    tables["Setup (untimed): what the simulated writers left on disk"] = [
        {"point": f"{p['form']} {p['writers']}×{p['tensors']}", "setup s": p["setup_s"], "files": p["files"],
         "writer tables MiB": p["writer_tables_mib"], "writer indexes MiB": p["writer_indexes_mib"]}
        for p in good]
    cmp_rows = []
    for j in (p for p in good if p["form"] == "json"):
        t = next((p for p in good if p["form"] == "table" and (p["writers"], p["tensors"]) == (j["writers"], j["tensors"])),
                 None)
        if t is None:
            continue
        cmp_rows.append({
            "point": f"{j['writers']}×{j['tensors']} ({j['records']:,} records)",
            "commit s 1.0 → 1.1": f"{j['commit_s']:.3f} → {t['commit_s']:.3f} ({j['commit_s'] / t['commit_s']:.1f}×)",
            "open s": f"{j['open_s']:.3f} → {t['open_s']:.3f} ({j['open_s'] / t['open_s']:.1f}×)",
            "plan s": f"{j['plan_s']:.3f} → {t['plan_s']:.3f} ({j['plan_s'] / t['plan_s']:.1f}×)",
            "commit peak RSS MiB": f"{j['commit_rss_mib']:.0f} → {t['commit_rss_mib']:.0f}",
            "open+plan peak RSS MiB": f"{j['plan_rss_mib']:.0f} → {t['plan_rss_mib']:.0f}",
            "manifest MiB": f"{j['manifest_mib']:.2f} → {t['manifest_mib']:.2f} (+ table {t['table_mib']:.2f})",
        })
    if cmp_rows:
        tables["Before / after: format 1.0 JSON indexes and manifest vs 1.1 tensor tables, same attempt"] = cmp_rows
    # Growth exponents against the number of records (fitted table points only).
    fit_pts = [p for p in good if p["fitted"]]
    fits: dict[str, float | None] = {}
    fit_keys = ["commit_s", "open_s", "plan_s", "open_plan_s", "commit_rss_mib", "commit_rss_inc_mib",
                "plan_rss_mib", "plan_rss_inc_mib", "table_mib", "manifest_mib",
                *[k for k in (fit_pts[0] if fit_pts else {}) if k.startswith(("commit.", "open.", "plan."))]]
    if len(fit_pts) >= 2:
        xs = [p["records"] for p in fit_pts]
        for k in fit_keys:
            fits[k] = fit_exponent(xs, [p.get(k) or 0.0 for p in fit_pts])
    targets = []
    n_target = 5944040  # records of 4096 writers × 2000 tensors
    hit = next((p for p in fit_pts if p["writers"] == 4096 and p["records"] == n_target), None)
    if hit is not None:
        for key, label, limit in (
            ("commit_s", "commit: read 4096 writer indexes + tables, merge, coverage, size checks, "
                         "write table + manifest", 10.0),
            ("plan_s", "one rank's load plan: plan_read of all 2000 tensors (coverage proofs + "
                       "intersections), manifest already open", 1.0),
            ("open_plan_s", "one rank's open (manifest + table) + load plan", 1.0),
        ):
            targets.append({"name": f"{label}, 4096 writers × 2000 tensors ({n_target:,} records)",
                            "value": f"{hit[key]:.2f} s (median, measured)", "target": f"< {limit:g} s",
                            "met": bool(hit[key] < limit)})
    for k, label in (("commit_s", "commit time"), ("open_s", "open time"), ("plan_s", "plan time"),
                     ("commit_rss_mib", "commit peak RSS"), ("plan_rss_mib", "open+plan peak RSS")):
        e = fits.get(k)
        if e is not None:
            targets.append({"name": f"growth exponent of {label} in records", "value": f"{e:.2f}",
                            "target": "≤ ~1.1 (n log n)", "met": e <= 1.15})
    xs_txt = ", ".join(f"{p['records']:,}" for p in fit_pts)
    notes = [
        "Synthetic Llama-70B-like model (bench/scale_sim.py): bf16 params + fp32 Adam moments, "
        "TP=8 × FSDP=W/8 (FSDP2 chunk semantics, uneven QKV splits), norms replicated over TP and "
        "written once. Setup (untimed, its own process `scale_setup`) writes what W ShardWriters "
        "would leave in the attempt directory, built with numpy: per writer `index/wNNNNN.json`, "
        "its tensor table `index/wNNNNN.tensors.safetensors` (codec none, real CRC32C; 1.1 rows) "
        "or every range record in the JSON index (1.0 rows), a sparse data file of the size its "
        "shard would have (placeholder CRCs, one per 256 KiB block, so `files` and the manifest "
        "have their real size) and a small per-rank entry file. No tensor bytes are written.",
        "Timed `commit` (fresh process, page cache warm from the setup, `sync` before): the real "
        "`portable_ckpt.io.commit.commit(storage, attempt, step=, expected_writers=range(W), "
        "continuation=, check_headers=False, tensor_table=True|False)`: reads and parses every "
        "writer index and (1.1) reads, CRC-verifies and decodes every writer table, merges "
        "(`merge_tables` / `merge_indexes`), proves exactly-once coverage of every tensor, checks "
        "the size of every listed file (`storage.size`), encodes the zstd table and writes it, "
        "serialises and atomically creates `manifest.json`. Not timed: interpreter start and imports. "
        "`check_headers=False` (the default above 65,536 records) because the data files are sparse; "
        "it is the same for both formats. Phases come from timing wrappers around the functions "
        "commit() calls (a few µs per call): `read_indexes_tables` is the wall time of reading "
        "and parsing every writer index and reading + CRC-checking every writer table (the core "
        "overlaps these reads on a thread pool), less `decode_tables` (decoding and validating "
        "the tables on the calling thread); `size_checks` is the commit's own file-size loop; "
        "'other' is the rest (entry checks, the commit's loops).",
        "Timed `open` (fresh process): `portable_ckpt.open(version_dir)` — read + `jsonio.loads` + "
        "`parse_manifest` of manifest.json, then (1.1) read + CRC-verify + decode the tensor table. "
        "Timed `plan` (same process, right after open): `Checkpoint.plan_read(key, offsets, "
        "lengths)` for every tensor that rank W/2+3 of a TP=4 × FSDP=W/4 target layout needs "
        "(all 2,000 at full size): the per-tensor exactly-once coverage proof of the stored layout "
        "(`plan.coverage`, shared between tensors of identical layout), the vectorised "
        "intersection and the ReadItems of the hits (`plan.intersect_items`). No tensor bytes are "
        "read. 'open+plan' is their sum in one process.",
        "CPU s: median user + system CPU time of the same timed part (all threads of the "
        "process; the zstd encode of the table may use both cores). On this shared 2-core machine "
        "wall time stretches with the load average (last column) while CPU time mostly does not.",
        "Peak RSS is `ru_maxrss` of each child (interpreter, numpy and the library included; "
        "'RSS before' is the same process right before the timed part). Medians of "
        f"{ctx.reps} repetitions (1.0 JSON rows: {min(ctx.reps, 3)}), min–max in brackets.",
        "Growth exponents (least-squares slope of log value vs log records over the fitted 1.1 "
        f"points, {xs_txt} records): " + ", ".join(f"{k} {v:.2f}" for k, v in fits.items()
                                                  if v is not None and "." not in k)
        + f". n log n over this range has slope ≈ {_nlogn_slope(fit_pts):.2f}; a constant part "
        "(interpreter, per-tensor and per-writer work) pulls slopes below 1. Per phase: "
        + ", ".join(f"{k} {v:.2f}" for k, v in fits.items() if v is not None and "." in k) + ".",
    ]
    if ctx.quick and hit is None:
        notes.append("Quick mode does not measure 4096 writers × 2000 tensors: the < 10 s / < 1 s "
                     "targets are only reported by a full run (no extrapolation).")
    for p in good:
        if "cold_commit_s" in p:
            notes.append(f"Cold page cache ({p['writers']}×{p['tensors']}, one repetition each, "
                         "`echo 3 > drop_caches` first): commit "
                         f"{p['cold_commit_s'] or float('nan'):.2f} s, open "
                         f"{p['cold_open_s'] or float('nan'):.3f} s, plan {p['cold_plan_s'] or float('nan'):.3f} s.")
    profile = next((p["profile"] for p in good if "profile" in p), None)
    if profile:
        prof_pt = next(p for p in good if "profile" in p)
        for what in ("commit", "open_plan"):
            top = profile.get(what) or []
            tables[f"cProfile of {what.replace('_', '+')} at {prof_pt['writers']}×{prof_pt['tensors']} "
                   f"(separate run, {profile.get(what + '_s', float('nan')):.2f} s under the profiler; "
                   "top 12 by own time)"] = [
                {"function": r["function"], "calls": r["calls"], "own s": r["tottime"], "cumulative s": r["cumtime"]}
                for r in top[:12]]
    return {"title": "Scale by simulation: commit and load planning at thousands of writers", "rows": rows,
            "tables": tables, "notes": notes, "targets": targets, "raw": {"points": pts},
            "plots": {"kind": "scale", "points": good}, "fits": fits, "profile": profile}


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


def section_realistic(ctx: Ctx) -> dict[str, Any]:
    from bench import realistic

    return realistic.section(ctx)


def section_small(ctx: Ctx) -> dict[str, Any]:
    from bench import small_tensors

    return small_tensors.section(ctx)


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
    "torch": section_torch,
    "s3": section_s3,
    "realistic": section_realistic,
    "small": section_small,
}
#: What ``--only core`` means.
GROUPS = {
    "core": ["save", "read", "verify", "checksum", "zstd"],
    "scaling": ["scale"],
    "peers": ["torch", "s3"],
}
