"""Operations run in a fresh interpreter by :mod:`bench.runner` (``python -m bench.child OP ARGS``).

Each operation prepares its inputs, then times only the measured part and prints one
``BENCH_RESULT {json}`` line with ``seconds`` plus operation-specific numbers
(``setup_maxrss_bytes`` is the process's peak RSS right before the timed part).
"""

from __future__ import annotations

import gc
import json
import math
import os
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

OPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def op(fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    OPS[fn.__name__] = fn
    return fn


def maxrss() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


# --------------------------------------------------------------------------------------------
# State: the same tensors for every contender
# --------------------------------------------------------------------------------------------


def make_state(total: int, count: int, dtype: str = "float32") -> dict[str, np.ndarray[Any, Any]]:
    """``count`` 2-D tensors of unequal sizes summing to ``total`` bytes (pages touched)."""
    import ml_dtypes

    npd = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    cols = 4096
    row_bytes = cols * npd.itemsize
    rows_total = total // row_bytes
    weights = [1 + (i % 4) for i in range(count)]  # sizes 1:2:3:4, like a mix of projections
    rows = [rows_total * w // sum(weights) for w in weights]
    rows[-1] += rows_total - sum(rows)
    state = {}
    for i, r in enumerate(rows):
        a = np.empty((r, cols), dtype=npd)
        a.view(np.uint8).reshape(-1)[:] = i % 251 + 1  # touch every page; content is irrelevant
        state[f"layers.{i}.weight"] = a
    return state


def preimport() -> None:
    """Import everything the core's timed paths import lazily, so imports are not timed."""
    import portable_ckpt
    import portable_ckpt.format.schemas
    import portable_ckpt.io.commit
    import portable_ckpt.io.reader
    import portable_ckpt.io.versions
    import portable_ckpt.io.writer
    import portable_ckpt.storage.local  # noqa: F401


def _result(seconds: float, setup_rss: int, **kw: Any) -> dict[str, Any]:
    return {"seconds": seconds, "setup_maxrss_bytes": setup_rss, **kw}


# --------------------------------------------------------------------------------------------
# Save contenders
# --------------------------------------------------------------------------------------------


@op
def save_pck(a: dict[str, Any]) -> dict[str, Any]:
    from portable_ckpt.io.commit import commit
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id
    from portable_ckpt.storage import open_storage

    state = make_state(a["bytes"], a["tensors"], a.get("dtype", "float32"))
    preimport()
    gc.collect()
    rss = maxrss()
    t0 = time.perf_counter()
    storage = open_storage(a["root"], create=True)
    attempt = new_attempt_id(1)
    w = ShardWriter(storage, attempt, 0, codec=a.get("codec", "none"), write_index=False)
    for k, v in state.items():
        w.add_tensor(k, v)
    idx = w.finish()
    commit(storage, attempt, step=1, indexes=[idx], expected_writers=[0])
    dt = time.perf_counter() - t0
    return _result(dt, rss, bytes=sum(v.nbytes for v in state.values()), written=w.stats.bytes_written,
                   scratch=w.stats.peak_scratch_bytes)


@op
def save_raw(a: dict[str, Any]) -> dict[str, Any]:
    """The same state written with a bare ``os.write`` loop (16 MiB pieces) + fsync: no format."""
    state = make_state(a["bytes"], a["tensors"])
    gc.collect()
    rss = maxrss()
    t0 = time.perf_counter()
    fd = os.open(a["file"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for v in state.values():
            mv = memoryview(v.reshape(-1).view(np.uint8))
            for i in range(0, len(mv), 16 << 20):
                piece = mv[i : i + (16 << 20)]
                while len(piece):
                    piece = piece[os.write(fd, piece):]
        os.fsync(fd)
    finally:
        os.close(fd)
    dt = time.perf_counter() - t0
    return _result(dt, rss, bytes=sum(v.nbytes for v in state.values()))


@op
def save_torch(a: dict[str, Any]) -> dict[str, Any]:
    import torch

    state = {k: torch.from_numpy(v) for k, v in make_state(a["bytes"], a["tensors"]).items()}
    gc.collect()
    rss = maxrss()
    t0 = time.perf_counter()
    torch.save(state, a["file"])
    fsync_path(a["file"])
    dt = time.perf_counter() - t0
    return _result(dt, rss, bytes=sum(v.nbytes for v in state.values()), written=os.path.getsize(a["file"]))


@op
def save_safetensors(a: dict[str, Any]) -> dict[str, Any]:
    import torch
    from safetensors.torch import save_file

    state = {k: torch.from_numpy(v) for k, v in make_state(a["bytes"], a["tensors"]).items()}
    gc.collect()
    rss = maxrss()
    t0 = time.perf_counter()
    save_file(state, a["file"])
    fsync_path(a["file"])
    dt = time.perf_counter() - t0
    return _result(dt, rss, bytes=sum(v.nbytes for v in state.values()), written=os.path.getsize(a["file"]))


@op
def memcpy(a: dict[str, Any]) -> dict[str, Any]:
    """Copy the state into fresh buffers (page faults included), then again into the same ones."""
    state = make_state(a["bytes"], a["tensors"])
    gc.collect()
    rss = maxrss()
    t0 = time.perf_counter()
    copies = {k: v.copy() for k, v in state.items()}
    dt = time.perf_counter() - t0
    t1 = time.perf_counter()
    for k, v in state.items():
        np.copyto(copies[k], v)
    dt2 = time.perf_counter() - t1
    return _result(dt, rss, bytes=sum(v.nbytes for v in state.values()), prefaulted_seconds=dt2)


# --------------------------------------------------------------------------------------------
# Read side
# --------------------------------------------------------------------------------------------


@op
def make_ckpt(a: dict[str, Any]) -> dict[str, Any]:
    """Write the read-side fixture: one float32 tensor of ``rows × cols`` (not a measurement)."""
    import portable_ckpt

    rows, cols = a["rows"], a["cols"]
    arr = np.empty((rows, cols), dtype=np.float32)
    step = 1024
    for i in range(0, rows, step):  # distinct, checkable content
        arr[i : i + step] = np.arange(i, min(i + step, rows), dtype=np.float32)[:, None] * 1e-3
    t0 = time.perf_counter()
    arrays = {"big": arr}
    if a.get("tiles"):
        from portable_ckpt.io.commit import commit
        from portable_ckpt.io.writer import ShardWriter, new_attempt_id
        from portable_ckpt.storage import open_storage

        storage = open_storage(a["root"], create=True)
        attempt = new_attempt_id(1)
        w = ShardWriter(storage, attempt, 0, write_index=False)
        tr, tc = a["tiles"]
        for r0 in range(0, rows, tr):
            for c0 in range(0, cols, tc):
                w.add_tensor("big", arr[r0 : r0 + tr, c0 : c0 + tc], offsets=(r0, c0), global_shape=(rows, cols))
        commit(storage, attempt, step=1, indexes=[w.finish()], expected_writers=[0])
    else:
        portable_ckpt.save_arrays(a["root"], arrays, step=1)
    return _result(time.perf_counter() - t0, 0)


@op
def read_region(a: dict[str, Any]) -> dict[str, Any]:
    preimport()
    import portable_ckpt

    gc.collect()
    rss = maxrss()
    t0 = time.perf_counter()
    ck = portable_ckpt.open(a["root"])
    out = ck.read("big", a["offsets"], a["lengths"])
    dt = time.perf_counter() - t0
    # Correctness of what was read (content is row_index * 1e-3).
    r0 = a["offsets"][0]
    expect = (np.arange(r0, r0 + a["lengths"][0], dtype=np.float32) * np.float32(1e-3))[:, None]
    if not np.array_equal(out, np.broadcast_to(expect, out.shape)):
        raise SystemExit("read_region: wrong data")
    mpath = os.path.join(ck.path, "manifest.json")
    header_bytes = 0
    for p in ck.manifest.files:
        if p.endswith(".safetensors"):  # 8-byte length prefix + JSON header
            with open(os.path.join(ck.path, p), "rb") as fh:
                header_bytes += 8 + int.from_bytes(fh.read(8), "little")
    return _result(dt, rss, bytes=out.nbytes, bytes_read=ck.stats.bytes_read,
                   bytes_delivered=ck.stats.bytes_delivered, blocks_verified=ck.stats.blocks_verified,
                   peak_scratch=ck.stats.peak_scratch_bytes, manifest_bytes=os.path.getsize(mpath),
                   header_bytes=header_bytes)


@op
def verify_deep(a: dict[str, Any]) -> dict[str, Any]:
    preimport()
    import portable_ckpt

    gc.collect()
    rss = maxrss()
    t0 = time.perf_counter()
    ck = portable_ckpt.open(a["root"])
    errors = ck.verify(deep=True)
    dt = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"verify failed: {errors[:3]}")
    return _result(dt, rss, bytes=ck.stats.bytes_read, blocks=ck.stats.blocks_verified)


@op
def read_files(a: dict[str, Any]) -> dict[str, Any]:
    """Plain Python read loop (16 MiB ``readinto``) over the same files: the page-cache baseline."""
    buf = bytearray(a.get("buffer", 16 << 20))
    mv = memoryview(buf)
    gc.collect()
    rss = maxrss()
    total = 0
    t0 = time.perf_counter()
    for p in a["files"]:
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(mv):
                total += n
    return _result(time.perf_counter() - t0, rss, bytes=total)


# --------------------------------------------------------------------------------------------
# CPU: checksum and compression
# --------------------------------------------------------------------------------------------


@op
def crc(a: dict[str, Any]) -> dict[str, Any]:
    """CRC32C over an in-memory buffer: raw library call and the format's BlockHasher."""
    import crc32c

    from portable_ckpt.io.checksum import BlockHasher

    data = np.full(a["bytes"], 7, dtype=np.uint8)
    mv = memoryview(data)
    rss = maxrss()
    t0 = time.perf_counter()
    c = 0
    for i in range(0, len(mv), 16 << 20):
        c = crc32c.crc32c(mv[i : i + (16 << 20)], c)
    raw = time.perf_counter() - t0
    t1 = time.perf_counter()
    h = BlockHasher(a.get("block_size", 256 * 1024))
    for i in range(0, len(mv), 16 << 20):
        h.update(mv[i : i + (16 << 20)])
    h.blocks()
    blk = time.perf_counter() - t1
    t2 = time.perf_counter()
    dst = np.empty_like(data)
    np.copyto(dst, data)
    cp = time.perf_counter() - t2
    return _result(blk, rss, bytes=len(mv), raw_seconds=raw, memcpy_seconds=cp)


def _weights(kind: str, dtype: str, n_elems: int) -> np.ndarray[Any, Any]:
    import ml_dtypes

    rng = np.random.default_rng(0)
    if kind == "normal":  # freshly initialised / trained weights: N(0, 0.02)
        x = rng.standard_normal(n_elems, dtype=np.float32) * np.float32(0.02)
    elif kind == "adam_v":  # Adam second moment: small positive values, squared gradients
        g = rng.standard_normal(n_elems, dtype=np.float32) * np.float32(1e-3)
        x = g * g
    elif kind == "sparse":  # half the rows zero (e.g. unused vocabulary rows, pruned/masked weights)
        x = rng.standard_normal(n_elems, dtype=np.float32) * np.float32(0.02)
        x.reshape(-1, 4096)[::2] = 0
    else:
        raise SystemExit(f"unknown data kind {kind}")
    return x.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else x


@op
def zstd(a: dict[str, Any]) -> dict[str, Any]:
    import zstandard

    itemsize = 2 if a["dtype"] == "bfloat16" else 4
    x = _weights(a["kind"], a["dtype"], a["bytes"] // itemsize)
    raw = x.view(np.uint8).reshape(-1)
    rss = maxrss()
    c = zstandard.ZstdCompressor(level=a["level"], write_content_size=True)
    t0 = time.perf_counter()
    frame = c.compress(raw)
    ct = time.perf_counter() - t0
    d = zstandard.ZstdDecompressor()
    t1 = time.perf_counter()
    back = d.decompress(frame)
    dt = time.perf_counter() - t1
    if back != raw.tobytes():
        raise SystemExit("zstd round trip mismatch")
    return _result(ct, rss, bytes=raw.nbytes, compressed=len(frame), ratio=raw.nbytes / len(frame),
                   decompress_seconds=dt)


# --------------------------------------------------------------------------------------------
# Scale by simulation
# --------------------------------------------------------------------------------------------


@op
def scale_commit(a: dict[str, Any]) -> dict[str, Any]:
    """Commit-side work on synthetic writer indexes: merge, coverage, serialise, round trip, write."""
    from bench.scale_sim import ATTEMPT, Layout, build_indexes, model_tensors
    from portable_ckpt.format import jsonio
    from portable_ckpt.format.manifest import Continuation, Manifest, Mesh, parse_manifest
    from portable_ckpt.io.commit import merge_indexes
    from portable_ckpt.ranges import check_coverage

    lay = Layout.for_world(a["world"])
    specs = model_tensors(a["tensors"])
    t0 = time.perf_counter()
    indexes = list(build_indexes(specs, lay))
    build_s = time.perf_counter() - t0
    gc.collect()
    rss = maxrss()
    if a.get("gc") == "off":  # diagnostic: how much of the time is the cyclic garbage collector
        gc.disable()
    phases: dict[str, float] = {}
    prof = None
    if a.get("profile"):
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    tstart = time.perf_counter()
    t = time.perf_counter()
    files, tensors, entries, nw = merge_indexes(ATTEMPT, indexes, list(range(lay.world)))
    phases["merge"] = time.perf_counter() - t
    t = time.perf_counter()
    nrec = 0
    for key, te in tensors.items():
        check_coverage(te.shape, [r.box for r in te.ranges], key=key)
        nrec += len(te.ranges)
    phases["coverage"] = time.perf_counter() - t
    t = time.perf_counter()
    m = Manifest(ATTEMPT, 1000, "2026-01-01T00:00:00.000000Z", "2026-01-01T00:00:01.000000Z",
                 {"name": "portable_ckpt", "version": "bench"},
                 Continuation("exact", lay.world, Mesh((lay.fsdp, lay.tp), ("fsdp", "tp"))),
                 files, tensors, entries)
    doc = m.to_json()
    phases["to_json"] = time.perf_counter() - t
    t = time.perf_counter()
    parse_manifest(doc, directory_name=ATTEMPT)
    phases["roundtrip_parse"] = time.perf_counter() - t
    t = time.perf_counter()
    data = jsonio.dumps(doc)
    phases["dumps"] = time.perf_counter() - t
    t = time.perf_counter()
    with open(a["out"], "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    phases["write"] = time.perf_counter() - t
    total = time.perf_counter() - tstart
    extra: dict[str, Any] = {}
    if prof is not None:
        prof.disable()
        extra["profile"] = _top(prof)
    return _result(total, rss, records=nrec, writers=nw, tensors=len(tensors), files=len(files),
                   manifest_bytes=len(data), build_seconds=build_s, phases=phases, **extra)


@op
def scale_plan(a: dict[str, Any]) -> dict[str, Any]:
    """One rank's load planning for every tensor under a different layout (real reader path)."""
    from bench.scale_sim import ATTEMPT, Layout, model_tensors, target_box
    from portable_ckpt.format import jsonio
    from portable_ckpt.format.manifest import parse_manifest
    from portable_ckpt.io.reader import Checkpoint
    from portable_ckpt.storage.local import LocalStorage

    specs = model_tensors(a["tensors"])
    lay = Layout(a["tp"], a["fsdp"])
    rank = a["rank"]
    gc.collect()
    rss = maxrss()
    if a.get("gc") == "off":  # diagnostic: how much of the time is the cyclic garbage collector
        gc.disable()
    phases: dict[str, float] = {}
    prof = None
    if a.get("profile"):
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    tstart = time.perf_counter()
    t = time.perf_counter()
    with open(a["manifest"], "rb") as f:
        data = f.read()
    phases["read"] = time.perf_counter() - t
    t = time.perf_counter()
    doc = jsonio.loads(data, what="manifest.json", max_bytes=jsonio.MAX_MANIFEST_BYTES)
    phases["json_loads"] = time.perf_counter() - t
    del data
    t = time.perf_counter()
    manifest = parse_manifest(doc, directory_name=ATTEMPT)
    phases["parse_manifest"] = time.perf_counter() - t
    del doc
    ck = Checkpoint(LocalStorage(os.path.dirname(a["manifest"])), ATTEMPT, manifest)
    t = time.perf_counter()
    pieces = 0
    need = 0
    for s in specs:
        b = target_box(s, lay, rank)
        if b is None:
            continue
        items = ck.plan_read(s.key, b[0], b[1])
        pieces += len(items)
        need += math.prod(b[1])
    phases["plan"] = time.perf_counter() - t
    total = time.perf_counter() - tstart
    extra: dict[str, Any] = {}
    if prof is not None:
        prof.disable()
        extra["profile"] = _top(prof)
    # Raw json.loads (no duplicate-key hook) for comparison: what a cheaper parser would save.
    if a.get("compare_plain_json"):
        with open(a["manifest"], "rb") as f:
            raw = f.read()
        t = time.perf_counter()
        json.loads(raw)
        extra["plain_json_loads_seconds"] = time.perf_counter() - t
    return _result(total, rss, pieces=pieces, elements=need, phases=phases, **extra)


@op
def scale_proto(a: dict[str, Any]) -> dict[str, Any]:
    """Prototype: columnar range table (bench/proto_columnar.py), commit and one rank's plan."""
    from bench import proto_columnar

    return proto_columnar.run(a)


def _top(prof: Any, n: int = 25) -> list[dict[str, Any]]:
    import pstats

    st = pstats.Stats(prof)
    rows = []
    for (fname, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{os.path.basename(fname)}:{line}:{func}", "calls": nc,
                     "tottime": round(tt, 4), "cumtime": round(ct, 4)})
    rows.sort(key=lambda r: r["tottime"], reverse=True)
    return rows[:n]


def main() -> int:
    name = sys.argv[1]
    args = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    if name not in OPS:
        print(f"unknown op {name}; known: {sorted(OPS)}", file=sys.stderr)
        return 2
    res = OPS[name](args)
    print("BENCH_RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
