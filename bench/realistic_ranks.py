"""Per-rank programs of the realistic benchmark (run by ``portable_ckpt.torch.launch.run_group``).

Every function takes ``(rank, world, spec)`` and returns JSON. Timed regions are between two
barriers, so a time is the collective operation's wall time (the slowest rank). Contenders run
in rotating order within one process group; the page cache is dropped (``sync; echo 1 >
/proc/sys/vm/drop_caches``) by rank 0 between barriers where a row says "cold".
"""

# ruff: noqa: B023 - the lambdas are called at once, inside the loop iteration
from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.realistic_model import (
    ModelConfig,
    build,
    local_tensors,
    state_digest,
    state_of,
    train_step,
    zero_,
)

__all__ = ["async_rank", "load_rank", "save_rank"]


# -- helpers ---------------------------------------------------------------------------------------


def _io() -> dict[str, int]:
    """This process's I/O counters (``rchar`` counts every byte read() returned, cached or not)."""
    out: dict[str, int] = {}
    with open("/proc/self/io", encoding="ascii") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k.strip()] = int(v)
    return out


def _rss() -> tuple[int, int]:
    from portable_ckpt.torch._proc import rss

    return rss()


def _reset_peak() -> None:
    from portable_ckpt.torch._proc import reset_peak_rss

    reset_peak_rss()


def drop_caches() -> bool:
    """Flush dirty pages and drop the page cache (root only); return whether it was dropped."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def _barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    _barrier()
    t0 = time.perf_counter()
    value = fn()
    _barrier()
    return time.perf_counter() - t0, value


def _prepare_cache(rank: int, cache: str, files: list[str]) -> None:
    """Rank 0 drops the cache ('cold') or reads ``files`` once ('warm': the cache is shared)."""
    _barrier()
    if cache == "cold":
        if rank == 0:
            drop_caches()
    elif cache == "warm" and rank == 0:
        buf = bytearray(16 << 20)
        for p in files:
            with open(p, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass
    elif cache == "sync" and rank == 0:
        os.sync()
    _barrier()


def _rotate(names: list[str], rep: int) -> list[str]:
    k = rep % len(names)
    return names[k:] + names[:k]


def _owned_bytes(state: Any, rank: int) -> int:
    """Bytes this rank writes: its DTensor shards, plus plain tensors on rank 0."""
    import torch

    total = 0

    def walk(v: Any) -> None:
        nonlocal total
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list | tuple):
            for x in v:
                walk(x)
        elif isinstance(v, torch.Tensor):
            if hasattr(v, "to_local"):
                loc = v.to_local()
                total += loc.numel() * loc.element_size()
            elif rank == 0:
                total += v.numel() * v.element_size()

    walk(state)
    return total


def _dd_write(path: str, nbytes: int) -> None:
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={path}", "bs=16M", f"count={max(nbytes, 1)}",
         "iflag=count_bytes", "conv=fsync"],
        check=True, capture_output=True,
    )


def _dd_read(parts: list[tuple[str, int, int]]) -> None:
    for path, skip, count in parts:
        subprocess.run(
            ["dd", f"if={path}", "of=/dev/null", "bs=16M", f"skip={skip}", f"count={count}",
             "iflag=skip_bytes,count_bytes"],
            check=True, capture_output=True,
        )


#: Streams the whole node reads with in the "streams" contender: on this VM's disk 4 to 8
#: concurrent 8 MiB ``preadv`` streams reach its highest cold throughput (1, 2, 4, 8, 16 streams
#: over the same 940 MiB: 982, 1399, 1616, 1600, 1496 MiB/s), where one ``dd`` per rank may not.
NODE_STREAMS = 8


def _streams_read(parts: list[tuple[str, int, int]], threads: int) -> None:
    """Read ``parts`` with ``threads`` threads, each an 8 MiB ``preadv`` loop over a 1/threads
    contiguous share: the disk's multi-stream ceiling for these bytes (nothing else done; the
    pool's module is imported with this one, so that a first call's rchar is not its .pyc)."""
    base = {p: skip for p, skip, _ in parts}
    shares = [_share([(p, c) for p, _, c in parts], k, threads) for k in range(threads)]

    def read(share: list[tuple[str, int, int]]) -> None:
        buf = memoryview(bytearray(8 << 20))
        for path, skip, count in share:
            fd = os.open(path, os.O_RDONLY)
            try:
                pos, end = base[path] + skip, base[path] + skip + count
                while pos < end:
                    n = os.preadv(fd, [buf[: min(len(buf), end - pos)]], pos)
                    if n <= 0:
                        raise OSError(f"{path}: short read at {pos}")
                    pos += n
            finally:
                os.close(fd)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(read, shares))  # a failed read raises here, in the rank


def _streams_of(rank: int, world: int) -> int:
    """This rank's streams of the node's ``NODE_STREAMS``, spread as evenly as possible."""
    return max(1, NODE_STREAMS // world + (1 if rank < NODE_STREAMS % world else 0))


def _share(files: list[tuple[str, int]], rank: int, world: int) -> list[tuple[str, int, int]]:
    """This rank's contiguous 1/world share of the concatenation of ``files`` (path, size)."""
    total = sum(s for _, s in files)
    lo, hi = total * rank // world, total * (rank + 1) // world
    out: list[tuple[str, int, int]] = []
    pos = 0
    for path, size in files:
        a, b = max(lo, pos), min(hi, pos + size)
        if a < b:
            out.append((path, a - pos, b - a))
        pos += size
    return out


def _rmtree(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)


def _setup(spec: dict[str, Any], rank: int, world: int) -> tuple[dict[str, Any], Any, float]:
    t0 = time.perf_counter()
    cfg = ModelConfig(**spec["model"])
    env = build(cfg, rank, world, seed=spec.get("seed", 0))
    return env, state_of(env), time.perf_counter() - t0


# -- save ------------------------------------------------------------------------------------------


def save_rank(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Sync save: portable_ckpt vs dcp.save vs parallel dd conv=fsync, alternated, cache dropped."""
    import torch.distributed.checkpoint as dcp

    import portable_ckpt.torch as pckt

    _env, state, setup_s = _setup(spec, rank, world)
    work = spec["work"]
    ours, theirs = os.path.join(work, "ours"), os.path.join(work, "dcp")
    owned = _owned_bytes(state, rank)
    n_local = len(local_tensors(state))
    times: dict[str, list[float]] = {"portable_ckpt": [], "dcp": [], "dd": []}
    io: dict[str, list[int]] = {k: [] for k in times}
    written: list[int] = []
    reps = spec["reps"]
    for rep in range(reps):
        for name in _rotate(list(times), rep):
            if rank == 0 and name != "dd":
                _rmtree(ours if name == "portable_ckpt" else theirs)
            _prepare_cache(rank, spec["write_cache"], [])
            io0 = _io()["wchar"]
            if name == "portable_ckpt":
                s, info = _timed(lambda: pckt.save(state, ours, step=rep, timeout=900))
                written.append(info.bytes_written)
            elif name == "dcp":
                s, _ = _timed(lambda: dcp.save(state, storage_writer=dcp.FileSystemWriter(theirs)))
            else:
                target = os.path.join(work, f"dd-{rank}")
                s, _ = _timed(lambda: _dd_write(target, owned))
                os.unlink(target)
            times[name].append(s)
            io[name].append(_io()["wchar"] - io0)
    # The last repetition of ours and of DCP stays on disk for the load phases.
    return {"rank": rank, "setup_s": setup_s, "owned_bytes": owned, "local_tensors": n_local,
            "times": times, "wchar": io, "written": written}


# -- load ------------------------------------------------------------------------------------------


def _data_files(root: str) -> list[tuple[str, int]]:
    out = []
    for dirpath, _, names in os.walk(root):
        for n in sorted(names):
            p = os.path.join(dirpath, n)
            out.append((p, os.path.getsize(p)))
    return sorted(out)


def load_rank(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Load onto ``world`` ranks: portable_ckpt vs dcp.load (vs cold parallel dd), warm and cold."""
    import torch.distributed.checkpoint as dcp

    import portable_ckpt.torch as pckt

    _env, state, setup_s = _setup(spec, rank, world)
    work = spec["work"]
    ours, theirs = os.path.join(work, "ours"), os.path.join(work, "dcp")
    files_ours = _data_files(ours)
    files_all = [p for p, _ in files_ours + _data_files(theirs)]
    data_files = [(p, s) for p, s in files_ours if "/data/" in p]
    target = sum(t.numel() * t.element_size() for t in local_tensors(state).values())
    rows: list[dict[str, Any]] = []
    # One untimed load each first: imports and first-call costs out of the medians. The two
    # versions were written from one state by two writers and are read by two readers: where
    # they agree, both are that state. Every timed load (into zeroed tensors) must give it again.
    _barrier()
    zero_(state)
    pckt.load(state, ours, allow_statistical=True, timeout=900)
    reference = state_digest(state)
    zero_(state)
    dcp.load(state, storage_reader=dcp.FileSystemReader(theirs))
    digests: dict[str, Any] = {"reference": reference, "dcp": state_digest(state),
                               "mismatches": []}
    for cache in spec["caches"]:
        names = ["portable_ckpt", "dcp"] + (["dd", "streams"] if cache == "cold" else [])
        for rep in range(spec["reps"]):
            for name in _rotate(names, rep):
                zero_(state)
                _prepare_cache(rank, cache, files_all)
                io0 = _io()
                cur, _ = _rss()
                _reset_peak()
                lib_bytes = None
                if name == "portable_ckpt":
                    s, info = _timed(lambda: pckt.load(state, ours, allow_statistical=True,
                                                       timeout=900))
                    lib_bytes = info.bytes_read
                elif name == "dcp":
                    s, _ = _timed(lambda: dcp.load(state,
                                                   storage_reader=dcp.FileSystemReader(theirs)))
                elif name == "dd":
                    s, _ = _timed(lambda: _dd_read(_share(data_files, rank, world)))
                else:
                    s, _ = _timed(lambda: _streams_read(_share(data_files, rank, world),
                                                        _streams_of(rank, world)))
                io1 = _io()
                _, peak = _rss()
                row = {"contender": name, "cache": cache, "rep": rep, "seconds": s,
                       "rchar": io1["rchar"] - io0["rchar"],
                       "read_bytes": io1["read_bytes"] - io0["read_bytes"],
                       "lib_bytes_read": lib_bytes, "rss_growth": max(0, peak - cur)}
                if name in ("portable_ckpt", "dcp") and state_digest(state) != reference:
                    digests["mismatches"].append([name, cache, rep])
                rows.append(row)
    return {"rank": rank, "setup_s": setup_s, "target_bytes": target, "rows": rows,
            "digests": digests, "dd_bytes": sum(c for _, _, c in _share(data_files, rank, world))}


# -- async -----------------------------------------------------------------------------------------


def _accel_step(env: dict[str, Any], wait_s: float, py_iters: int) -> float:
    """An accelerator-like step: a GIL-free wait (the device) plus a little Python work."""
    t0 = time.perf_counter()
    time.sleep(wait_s)
    acc = 0
    for i in range(py_iters):
        acc += i * i
    env["_acc"] = acc
    return time.perf_counter() - t0


def _any_busy(flag: bool) -> bool:
    import torch
    import torch.distributed as dist

    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


class _Saver:
    """Start an async save of one contender; ``done()`` tells whether it finished."""

    def __init__(self, name: str, work: str, group: Any) -> None:
        self.name = name
        self.work = work
        self.group = group
        self.n = 0
        self._fut: Any = None
        self._stager_obj: Any = None

    def start(self, state: Any, rank: int) -> float:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        import portable_ckpt.torch as pckt

        self.n += 1
        t0 = time.perf_counter()
        if self.name.startswith("portable_ckpt"):
            mode = "process" if self.name == "portable_ckpt-process" else "thread"
            h = pckt.async_save(state, self.path, step=self.n, timeout=900, mode=mode)
            self._fut = h.committed
        else:
            process = self.name.startswith("dcp-process")
            kind = AsyncCheckpointerType.PROCESS if process else AsyncCheckpointerType.THREAD
            extra = {}
            if self.name.endswith("-cached"):
                extra["async_stager"] = self._stager(process)
            self._fut = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(self.path),
                                       process_group=self.group, async_checkpointer_type=kind,
                                       **extra)
        return time.perf_counter() - t0

    def _stager(self, process: bool) -> Any:
        """One DCP stager kept across saves (:func:`bench.dcp_staging.reused_stager`)."""
        from bench.dcp_staging import reused_stager

        if self._stager_obj is None:
            self._stager_obj = reused_stager(False, process)
        return self._stager_obj

    @property
    def path(self) -> str:
        return os.path.join(self.work, f"async-{self.name}-{self.n}")

    def cleanup(self, rank: int) -> None:
        """After every rank waited: rank 0 removes the version (keeps the disk use bounded)."""
        _barrier()
        if rank == 0:
            _rmtree(self.path)
        _barrier()

    def done(self) -> bool:
        return self._fut is None or self._fut.done()

    def wait(self) -> None:
        if self._fut is not None:
            self._fut.result()
            self._fut = None


def _memcpy_s(state: Any, bufs: dict[str, Any]) -> float:
    import torch

    ts = local_tensors(state)
    t0 = time.perf_counter()
    with torch.no_grad():
        for k, t in ts.items():
            bufs.setdefault(k, torch.empty_like(t)).copy_(t)
    return time.perf_counter() - t0


def _loop(env: dict[str, Any], spec: dict[str, Any], kind: str) -> Callable[[], float]:
    if kind == "cpu":
        return lambda: train_step(env)
    return lambda: _accel_step(env, spec["accel_wait_s"], spec["accel_py_iters"])


def _steps_during(step: Callable[[], float], saver: _Saver | None, state: Any, rank: int,
                  base: int, max_steps: int) -> dict[str, Any]:
    """``base`` steps without a save, then a save started and steps until every rank finished."""
    base_s = [step() for _ in range(base)]
    _barrier()
    block = saver.start(state, rank) if saver is not None else 0.0
    t0 = time.perf_counter()
    during: list[float] = []
    while len(during) < max_steps:
        during.append(step())
        if not _any_busy(saver is not None and not saver.done()):
            break
    if saver is not None:
        saver.wait()
    total = time.perf_counter() - t0 + block
    if saver is not None:
        saver.cleanup(rank)
    return {"base": base_s, "during": during, "block_s": block, "total_s": total}


def async_rank(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Async save: blocking time vs a memcpy of the state; step time while a save is in flight."""
    import torch.distributed as dist

    env, state, setup_s = _setup(spec, rank, world)
    work = spec["work"]
    group = dist.new_group(backend="gloo")  # DCP's async collectives stay off the training group
    savers = {n: _Saver(n, work, group) for n in spec["async_contenders"]}
    bufs: dict[str, Any] = {}
    out: dict[str, Any] = {"rank": rank, "setup_s": setup_s, "memcpy_s": [], "first_block_s": {},
                           "block_s": {n: [] for n in savers}, "total_s": {n: [] for n in savers},
                           "loops": {}}
    _memcpy_s(state, bufs)  # allocate the buffers once; then time copies into them
    # First call of each contender (process start, buffer allocation): measured apart.
    for name, sv in savers.items():
        _barrier()
        out["first_block_s"][name] = sv.start(state, rank)
        sv.wait()
        sv.cleanup(rank)
    for rep in range(spec["async_reps"]):
        out["memcpy_s"].append(_memcpy_s(state, bufs))
        for name in _rotate(list(savers), rep):
            _prepare_cache(rank, "sync", [])
            sv = savers[name]
            t0 = time.perf_counter()
            out["block_s"][name].append(sv.start(state, rank))
            sv.wait()
            _barrier()
            out["total_s"][name].append(time.perf_counter() - t0)
            sv.cleanup(rank)
    for kind in spec["loops"]:
        step = _loop(env, spec, kind)
        base, mx = spec["loop_base_steps"][kind], spec["loop_max_steps"][kind]
        res: dict[str, list[Any]] = {n: [] for n in ["none", *savers]}
        step()  # warm
        for rep in range(spec["loop_reps"]):
            for name in _rotate(list(res), rep):
                _prepare_cache(rank, "sync", [])
                res[name].append(_steps_during(step, savers.get(name), state, rank, base, mx))
        out["loops"][kind] = res
    return out
