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
import types
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
    tiles = {"big": a["tiles"]} if a.get("tiles") else None
    portable_ckpt.save_arrays(a["root"], arrays, step=1, tiles=tiles, block_size=a.get("block_size"))
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
# Scale by simulation (the attempt is written by bench/scale_sim.py; see section_scale)
# --------------------------------------------------------------------------------------------


class _Phases:
    """Accumulated inclusive wall time of wrapped functions (cheap: one perf_counter pair a call)."""

    def __init__(self) -> None:
        self.t: dict[str, float] = {}
        self.n: dict[str, int] = {}

        self.active: dict[str, int] = {}

    def wrap(self, owner: Any, attr: str, name: str, inside: tuple[str, str] | None = None) -> None:
        """Time ``owner.attr`` as ``name``; with ``inside=(outer, alt)``, calls made while the
        phase ``outer`` runs are counted as ``alt`` instead (so phases do not overlap). A name
        the core no longer has is skipped (its phase reads 0; the total stays right)."""
        fn = getattr(owner, attr, None)
        if fn is None:
            return

        def timed(*args: Any, **kw: Any) -> Any:
            label = inside[1] if inside and self.active.get(inside[0]) else name
            self.active[label] = self.active.get(label, 0) + 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.t[label] = self.t.get(label, 0.0) + time.perf_counter() - t0
                self.n[label] = self.n.get(label, 0) + 1
                self.active[label] -= 1

        setattr(owner, attr, timed)

    def get(self, name: str) -> float:
        return self.t.get(name, 0.0)


@op
def scale_setup(a: dict[str, Any]) -> dict[str, Any]:
    """Write the simulated attempt (untimed setup of the scale section; ``seconds`` = its time)."""
    from bench.scale_sim import write_attempt

    t0 = time.perf_counter()
    info = write_attempt(a["root"], a["writers"], a["tensors"], a.get("form", "table"))
    os.sync()  # nothing dirty left for the timed operations to wait on
    return _result(time.perf_counter() - t0, maxrss(), **info)


def _cpu() -> float:
    """User + system CPU seconds of this process (all threads): less sensitive than wall time to
    other work on a shared machine."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _profile_start(a: dict[str, Any]) -> Any:
    if not a.get("profile"):
        return None
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    return prof


def _profile_end(prof: Any) -> dict[str, Any]:
    if prof is None:
        return {}
    prof.disable()
    return {"profile": _top(prof), "profile_cumulative": _top(prof, key="cumtime")}


@op
def scale_commit(a: dict[str, Any]) -> dict[str, Any]:
    """The real ``commit()`` of the simulated attempt: reads every writer index (and table) from
    disk, merges, proves coverage, checks file sizes, writes the table and ``manifest.json``."""
    import glob

    from bench.scale_sim import ATTEMPT, STEP, Layout
    from portable_ckpt.format import jsonio
    from portable_ckpt.format.manifest import Continuation, Manifest, Mesh
    from portable_ckpt.io import commit as cm
    from portable_ckpt.storage.local import LocalStorage

    preimport()
    root, w = a["root"], a["writers"]
    lay = Layout.for_world(w)
    vdir = os.path.join(root, ATTEMPT)
    for p in [os.path.join(vdir, "manifest.json"), *glob.glob(os.path.join(vdir, "tensor-table-*"))]:
        if os.path.exists(p):
            os.unlink(p)  # an earlier repetition's commit
    ph = _Phases()
    # Reading: all writer indexes and tables (newer cores read them on a thread pool, so only the
    # stage's wall time and the decoding done on the calling thread are attributed).
    ph.wrap(cm, "read_writer_indexes" if hasattr(cm, "read_writer_indexes") else "read_writer_index", "read")
    ph.wrap(cm, "decode_table", "decode_tables")
    ph.wrap(cm, "merge_indexes", "merge_indexes")
    ph.wrap(cm, "merge_tables", "merge_tables")
    ph.wrap(cm.LayoutCache, "check", "coverage")
    ph.wrap(cm, "check_coverage", "coverage")
    ph.wrap(cm, "encode_table", "encode_table")
    ph.wrap(Manifest, "to_json", "to_json")
    ph.wrap(jsonio, "dumps", "dumps")
    storage = LocalStorage(root)
    ph.wrap(storage, "size", "size_checks", inside=("read", "size_of_tables"))
    ph.wrap(storage, "put", "write_table")
    ph.wrap(storage, "create_if_absent", "write_manifest")
    cont = Continuation("exact", w, Mesh((lay.fsdp, lay.tp), ("fsdp", "tp")))
    table = a.get("tensor_table")
    gc.collect()
    rss = maxrss()
    prof = _profile_start(a)
    cpu0 = _cpu()
    t0 = time.perf_counter()
    m = cm.commit(storage, ATTEMPT, step=STEP, expected_writers=list(range(w)), continuation=cont,
                  check_headers=False, tensor_table=table)
    total = time.perf_counter() - t0
    cpu_s = _cpu() - cpu0
    extra = _profile_end(prof)
    rep: Any = getattr(m, "report")  # noqa: B009 (set by commit(), not a declared field)
    phases = {
        "read_indexes_tables": ph.get("read") - ph.get("decode_tables"),
        "decode_tables": ph.get("decode_tables"),
        "merge": ph.get("merge_indexes") + ph.get("merge_tables"),
        "coverage": ph.get("coverage"),
        # storage.size of every file: the sizes checked in commit() and of each writer table
        "size_checks": ph.get("size_checks"),
        "encode_table": ph.get("encode_table"),
        "to_json": ph.get("to_json"),
        "dumps": ph.get("dumps"),
        "write": ph.get("write_table") + ph.get("write_manifest"),
    }
    phases["other"] = total - sum(phases.values())
    tref = m.tensor_table
    table_bytes = m.files[tref.file].size if tref is not None else 0
    return _result(total, rss, cpu_s=cpu_s, records=rep.ranges, writers=rep.writers, tensors=rep.tensors, files=rep.files,
                   checks=rep.checks, phases=phases, calls=ph.n, table_bytes=table_bytes,
                   manifest_bytes=os.path.getsize(os.path.join(vdir, "manifest.json")),
                   format_version=m.format_version, **extra)


@op
def scale_open_plan(a: dict[str, Any]) -> dict[str, Any]:
    """``portable_ckpt.open`` of the committed version, then ``plan_read`` of every tensor for one
    rank of another layout (``seconds`` = open + plan; both reported separately)."""
    import portable_ckpt as pc
    from bench.scale_sim import ATTEMPT, Layout, model_tensors, target_box
    from portable_ckpt.format import jsonio
    from portable_ckpt.io import reader, versions

    preimport()
    specs = model_tensors(a["tensors"])
    lay = Layout(a["tp"], a["writers"] // a["tp"])
    rank = a["rank"]
    boxes = [(s.key, target_box(s, lay, rank)) for s in specs]
    ph = _Phases()
    ph.wrap(versions, "load_manifest", "manifest")
    # Time jsonio.loads as load_manifest calls it (not the table's header parse): a timed copy
    # of the module, seen only by versions.
    jproxy = types.ModuleType(jsonio.__name__)
    jproxy.__dict__.update(jsonio.__dict__)
    versions.jsonio = jproxy  # type: ignore[attr-defined]
    ph.wrap(jproxy, "loads", "json_loads")
    ph.wrap(versions, "parse_manifest", "parse_manifest")
    ph.wrap(reader.Checkpoint, "_load_table", "table")
    ph.wrap(reader, "decode_table", "decode_table")
    ph.wrap(reader, "check_coverage", "coverage")
    vdir = os.path.join(a["root"], ATTEMPT)
    gc.collect()
    rss = maxrss()
    prof = _profile_start(a)
    cpu0 = _cpu()
    t0 = time.perf_counter()
    ck = pc.open(vdir)
    t1 = time.perf_counter()
    cpu1 = _cpu()
    rss_open = maxrss()
    ph.wrap(ck._layouts, "check", "coverage")  # the reader's per-instance proof cache (tables)
    pieces = need = 0
    for key, b in boxes:
        if b is None:
            continue
        items = ck.plan_read(key, b[0], b[1])
        pieces += len(items)
        need += math.prod(b[1])
    t2 = time.perf_counter()
    cpu2 = _cpu()
    extra = _profile_end(prof)
    open_s, plan_s = t1 - t0, t2 - t1
    phases = {
        "open.manifest_json": ph.get("json_loads"),
        "open.parse_manifest": ph.get("parse_manifest"),
        "open.manifest_other": ph.get("manifest") - ph.get("json_loads") - ph.get("parse_manifest"),
        "open.table_read_verify": ph.get("table") - ph.get("decode_table"),
        "open.table_decode": ph.get("decode_table"),
        "plan.coverage": ph.get("coverage"),
        "plan.intersect_items": plan_s - ph.get("coverage"),
    }
    phases["open.other"] = open_s - ph.get("manifest") - ph.get("table")
    return _result(open_s + plan_s, rss, open_s=open_s, plan_s=plan_s, open_cpu_s=cpu1 - cpu0,
                   plan_cpu_s=cpu2 - cpu1, open_maxrss_bytes=rss_open,
                   pieces=pieces, elements=need, phases=phases, calls=ph.n,
                   planned_tensors=sum(b is not None for _, b in boxes), **extra)


def _top(prof: Any, n: int = 25, key: str = "tottime") -> list[dict[str, Any]]:
    import pstats

    st = pstats.Stats(prof)
    rows = []
    for (fname, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{os.path.basename(fname)}:{line}:{func}", "calls": nc,
                     "tottime": round(tt, 4), "cumtime": round(ct, 4)})
    rows.sort(key=lambda r: r[key], reverse=True)
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
