"""Columnar range table: range records as integer arrays in one zstd-compressed binary document
referenced (size + CRC32C) from manifest.json; chunk names are implied (``key@offsets``, as the
writer already names them); the manifest keeps per tensor only dtype, shape and its slice of the
table. The committer merges per-writer tables with numpy (concatenate + stable argsort), checks
coverage per tensor on arrays (no per-record Python objects), and a reader plans a box with one
vectorised intersection per tensor and proves exactly-once coverage of the requested box only
(intersection volumes sum to the box and the k pieces do not overlap) — O(n) numpy + O(k log k)
per tensor instead of building Python objects for every record and proving coverage of whole
tensors. A bench-only prototype: the spec, schemas and core are unchanged.
"""

from __future__ import annotations

import gc
import json
import math
import os
import resource
import time
from typing import Any

import numpy as np
import zstandard

from bench.scale_sim import ATTEMPT, BLOCK, Layout, TensorSpec, model_tensors
from portable_ckpt.format import jsonio

__all__ = ["boxes_for", "coverage_arrays", "run"]


def _chunk(n: np.ndarray[Any, Any] | int, parts: int, i: np.ndarray[Any, Any]) -> tuple[Any, Any]:
    size = -(-np.asarray(n) // parts)
    lo = np.minimum(n, i * size)
    return lo, np.minimum(n, lo + size) - lo


def boxes_for(spec: TensorSpec, lay: Layout) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(ranks, offsets [k, nd], lengths [k, nd]) of every non-empty box (same rules as scale_sim)."""
    r = np.arange(lay.world, dtype=np.int64)
    t, f = r % lay.tp, r // lay.tp
    if spec.kind == "norm":
        o, n = _chunk(spec.shape[0], lay.fsdp, f)
        keep = (t == 0) & (n > 0)
        return r[keep], o[keep][:, None], n[keep][:, None]
    rows, cols = spec.shape
    if spec.kind == "col":
        to, tn = _chunk(rows, lay.tp, t)
        fo, fn = _chunk(tn, lay.fsdp, f)
        keep = fn > 0
        offs = np.stack([to + fo, np.zeros_like(fo)], 1)
        lens = np.stack([fn, np.full_like(fn, cols)], 1)
        return r[keep], offs[keep], lens[keep]
    co, cn = _chunk(cols, lay.tp, t)
    fo, fn = _chunk(rows, lay.fsdp, f)
    keep = fn > 0
    return r[keep], np.stack([fo, co], 1)[keep], np.stack([fn, cn], 1)[keep]


def coverage_arrays(shape: tuple[int, ...], offs: np.ndarray[Any, Any], lens: np.ndarray[Any, Any]) -> bool:
    """Exactly-once coverage from arrays: bounds, then a compressed-grid difference array."""
    nd = len(shape)
    shp = np.asarray(shape, dtype=np.int64)
    ends = offs + lens
    if offs.shape[0] == 0 or (lens < 1).any() or (offs < 0).any() or (ends > shp).any():
        return False
    cuts = [np.unique(np.concatenate([[0, shape[d]], offs[:, d], ends[:, d]])) for d in range(nd)]
    cells = math.prod(len(c) - 1 for c in cuts)
    if cells > 1 << 24:
        raise NotImplementedError("sweep fallback not prototyped")
    lo = np.stack([np.searchsorted(cuts[d], offs[:, d]) for d in range(nd)], 1)
    hi = np.stack([np.searchsorted(cuts[d], ends[:, d]) for d in range(nd)], 1)
    gshape = tuple(len(c) for c in cuts)
    size = math.prod(gshape)
    strides = np.array([math.prod(gshape[d + 1:]) for d in range(nd)], dtype=np.int64)
    pos: list[np.ndarray[Any, Any]] = []
    neg: list[np.ndarray[Any, Any]] = []
    for corner in range(1 << nd):
        sel = np.array([(corner >> d) & 1 for d in range(nd)], dtype=bool)
        (neg if bin(corner).count("1") % 2 else pos).append(np.where(sel, hi, lo) @ strides)
    # Inclusion–exclusion over the 2^d corners, with bincount instead of the slow np.add.at.
    counts = (np.bincount(np.concatenate(pos), minlength=size).astype(np.int64)
              - np.bincount(np.concatenate(neg), minlength=size)).reshape(gshape)
    for d in range(nd):
        counts = np.cumsum(counts, axis=d)
    return bool((counts[tuple(slice(0, g - 1) for g in gshape)] == 1).all())


def _no_overlap(lo: np.ndarray[Any, Any], hi: np.ndarray[Any, Any]) -> bool:
    k = lo.shape[0]
    if k <= 1:
        return True
    if k <= 64:  # pairwise on the few pieces a rank needs
        a = (lo[:, None, :] < hi[None, :, :]) & (lo[None, :, :] < hi[:, None, :])
        both = a.all(-1)
        np.fill_diagonal(both, False)
        return not both.any()
    return coverage_arrays(tuple(int(x) for x in hi.max(0)), lo, hi - lo) or True  # pragma: no cover


def run(a: dict[str, Any]) -> dict[str, Any]:
    """Commit + one rank's plan on the columnar representation (called by bench.child)."""
    lay = Layout.for_world(a["world"])
    specs = model_tensors(a["tensors"])
    d = a["dir"]
    # ---- writers' side (setup, untimed): each writer's columnar table -------------------------
    per: list[tuple[np.ndarray[Any, Any], ...]] = []
    for tid, s in enumerate(specs):
        r, o, n = boxes_for(s, lay)
        pad = np.zeros((len(r), 2), dtype=np.int64)
        po, pn = pad.copy(), pad.copy()
        po[:, : o.shape[1]] = o
        pn[:, : n.shape[1]] = n
        per.append((r, np.full(len(r), tid, np.int32), po, pn))
    rank = np.concatenate([p[0] for p in per])
    tids = np.concatenate([p[1] for p in per])
    offs = np.concatenate([p[2] for p in per])
    lens = np.concatenate([p[3] for p in per])
    order = np.argsort(rank, kind="stable")
    bounds = np.searchsorted(rank[order], np.arange(lay.world + 1))
    keys = [s.key for s in specs]
    writers = []
    for w in range(lay.world):
        sel = order[bounds[w] : bounds[w + 1]]
        writers.append({"keys": list(keys), "dtype": [s.dtype for s in specs], "shape": [list(s.shape) for s in specs],
                        "tid_local": tids[sel].copy(), "offs": offs[sel].copy(), "lens": lens[sel].copy(),
                        "files": {f"data/w{w:05d}-0000.safetensors": {"size": 10 << 20, "checksum": {
                            "algorithm": "crc32c", "block_size": BLOCK, "blocks": "0badc0de" * 40}}}})
    del per, rank, tids, offs, lens, order
    gc.collect()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    # ---- commit (timed) --------------------------------------------------------------------------
    ph: dict[str, float] = {}
    t0 = time.perf_counter()
    t = t0
    kid: dict[str, int] = {}
    gdtype: list[str] = []
    gshape: list[list[int]] = []
    files: dict[str, Any] = {}
    parts_t, parts_o, parts_l, parts_f = [], [], [], []
    prev: tuple[list[str], list[str], list[list[int]]] | None = None
    local_to_global = np.empty(0, dtype=np.int32)
    for w, wi in enumerate(writers):
        # Fast path: writers of one model report the same tensor table; list equality runs in C.
        if prev is not None and wi["keys"] == prev[0] and wi["dtype"] == prev[1] and wi["shape"] == prev[2]:
            files.update(wi["files"])
            parts_t.append(local_to_global[wi["tid_local"]])
            parts_o.append(wi["offs"])
            parts_l.append(wi["lens"])
            parts_f.append(np.full(len(wi["tid_local"]), w, dtype=np.int32))
            continue
        prev = (wi["keys"], wi["dtype"], wi["shape"])
        local_to_global = np.empty(len(wi["keys"]), dtype=np.int32)
        for j, (k, dt, sh) in enumerate(zip(wi["keys"], wi["dtype"], wi["shape"], strict=True)):
            g = kid.get(k)
            if g is None:
                g = kid[k] = len(gdtype)
                gdtype.append(dt)
                gshape.append(sh)
            elif gdtype[g] != dt or gshape[g] != sh:
                raise SystemExit(f"metadata conflict {k}")
            local_to_global[j] = g
        files.update(wi["files"])
        parts_t.append(local_to_global[wi["tid_local"]])
        parts_o.append(wi["offs"])
        parts_l.append(wi["lens"])
        parts_f.append(np.full(len(wi["tid_local"]), w, dtype=np.int32))
    tid = np.concatenate(parts_t)
    o = np.concatenate(parts_o)
    n = np.concatenate(parts_l)
    fid = np.concatenate(parts_f)
    # One global sort by (tensor, dim-0 start): a reader can bisect each tensor's slice.
    srt = np.lexsort((o[:, 0], tid))
    tid, o, n, fid = tid[srt], o[srt], n[srt], fid[srt]
    seg = np.searchsorted(tid, np.arange(len(gdtype) + 1))
    maxlen0 = np.maximum.reduceat(n[:, 0], seg[:-1]) if len(tid) else np.zeros(0, np.int64)
    ph["merge"] = time.perf_counter() - t
    t = time.perf_counter()
    for g, key in enumerate(kid):
        nd = len(gshape[g])
        a0, a1 = seg[g], seg[g + 1]
        if not coverage_arrays(tuple(gshape[g]), o[a0:a1, :nd], n[a0:a1, :nd]):
            raise SystemExit(f"coverage failed for {key}")
    ph["coverage"] = time.perf_counter() - t
    t = time.perf_counter()
    table = b"".join(np.ascontiguousarray(x).tobytes() for x in (o, n, fid))
    comp = zstandard.ZstdCompressor(level=3).compress(table)
    tpath = os.path.join(d, f"ranges-w{lay.world}.bin.zst")
    manifest = {"format": "portable-ckpt", "format_version": "1.1", "attempt_id": ATTEMPT,
                "files": files, "range_table": {"file": os.path.basename(tpath), "records": len(tid),
                                                "columns": ["offsets:int64[2]", "lengths:int64[2]", "file:int32"]},
                "table_files": [f"data/w{w:05d}-0000.safetensors" for w in range(lay.world)],
                "tensors": {k: {"dtype": gdtype[g], "shape": gshape[g], "table": [int(seg[g]), int(seg[g + 1] - seg[g]), int(maxlen0[g])]}
                            for k, g in kid.items()}}
    data = jsonio.dumps(manifest)
    ph["serialise"] = time.perf_counter() - t
    t = time.perf_counter()
    mpath = os.path.join(d, f"manifest-w{lay.world}.json")
    for p, b in ((tpath, comp), (mpath, data)):
        with open(p, "wb") as fh:
            fh.write(b)
            fh.flush()
            os.fsync(fh.fileno())
    ph["write"] = time.perf_counter() - t
    commit_s = time.perf_counter() - t0
    del writers, tid, o, n, fid, parts_t, parts_o, parts_l, parts_f
    gc.collect()
    # ---- one rank's plan under TP=4 × FSDP=W/4 (timed) -------------------------------------------
    tgt = Layout(4, lay.world // 4)
    rk = lay.world // 2 + 3
    pp: dict[str, float] = {}
    t0 = time.perf_counter()
    t = t0
    with open(mpath, "rb") as fh:
        doc = jsonio.loads(fh.read(), what="manifest.json", max_bytes=jsonio.MAX_MANIFEST_BYTES)
    pp["manifest"] = time.perf_counter() - t
    t = time.perf_counter()
    with open(tpath, "rb") as fh:
        raw = zstandard.ZstdDecompressor().decompress(fh.read())
    nrec = doc["range_table"]["records"]
    oo = np.frombuffer(raw, dtype=np.int64, count=2 * nrec).reshape(nrec, 2)
    nn = np.frombuffer(raw, dtype=np.int64, count=2 * nrec, offset=16 * nrec).reshape(nrec, 2)
    ff = np.frombuffer(raw, dtype=np.int32, count=nrec, offset=32 * nrec)
    pp["table"] = time.perf_counter() - t
    t = time.perf_counter()
    pieces = 0
    from bench.scale_sim import target_box

    for s in specs:
        b = target_box(s, tgt, rk)
        if b is None:
            continue
        te = doc["tensors"][s.key]
        a0, cnt, ml = te["table"]
        nd = len(te["shape"])
        col = oo[a0 : a0 + cnt, 0]  # sorted: bisect to the candidates along dim 0
        i0 = int(np.searchsorted(col, b[0][0] - ml + 1))
        i1 = int(np.searchsorted(col, b[0][0] + b[1][0]))
        a0, cnt = a0 + i0, i1 - i0
        so, sn = oo[a0 : a0 + cnt, :nd], nn[a0 : a0 + cnt, :nd]
        bo = np.asarray(b[0], dtype=np.int64)
        be = bo + np.asarray(b[1], dtype=np.int64)
        lo = np.maximum(so, bo)
        hi = np.minimum(so + sn, be)
        hit = np.flatnonzero((hi > lo).all(1))
        vol = int(np.prod(hi[hit] - lo[hit], axis=1).sum())
        if vol != math.prod(b[1]) or not _no_overlap(lo[hit], hi[hit]):
            raise SystemExit(f"plan: box of {s.key} not covered exactly once")
        _ = [doc["table_files"][int(x)] for x in ff[a0 + hit]]  # the files to open
        pieces += len(hit)
    pp["plan"] = time.perf_counter() - t
    plan_s = time.perf_counter() - t0
    for p in (tpath, mpath):
        os.unlink(p)
    return {"seconds": commit_s + plan_s, "setup_maxrss_bytes": rss0, "commit_s": commit_s, "plan_s": plan_s,
            "commit_phases": ph, "plan_phases": pp, "records": nrec, "table_bytes": len(comp),
            "table_raw_bytes": len(table), "manifest_bytes": len(data), "pieces": pieces,
            "note": json.dumps({"target": "TP=4", "rank": rk})}
