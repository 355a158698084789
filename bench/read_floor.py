"""The cold-read floor of a load: N parallel readers of N files, in the read patterns that matter.

    python -m bench.read_floor DIR [--reps 5] [--files 4]    # as root (drops the page cache)

Takes the N largest files under ``DIR`` (e.g. a saved version's ``data/``; the realistic
benchmark keeps none, so save one first, e.g. with ``bench.realistic_profile --dump``). One
process per file allocates and touches a buffer of the file's size (as a load's destination
tensors are), then every repetition, with the page cache dropped between barriers, times in
rotated order:

* ``dd16``: 16 MiB ``preadv`` into one reused buffer (what ``dd bs=16M`` does);
* ``plain8``: 8 MiB ``preadv`` windows straight into the destination (the reader's window);
* ``plain16``: the same with 16 MiB windows;
* ``pipe``: the reader's pattern: one 8 MiB window in flight on an I/O thread while the
  previous window's 64 KiB blocks are checksummed (CRC32C) on the calling thread.

Printed per pattern: the slowest reader's time, median [min–max]. The gap between ``pipe`` and
``dd16`` is what the read pattern and checksums cost; a load's time beyond ``pipe`` is what
resolving, planning and the collectives cost.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import crc32c

from bench.realistic_ranks import drop_caches

__all__ = ["main"]

WINDOW = 8 << 20
BLOCK = 64 << 10
PATTERNS = ("dd16", "plain8", "plain16", "pipe")


def _read(fd: int, mv: memoryview, size: int, pattern: str, small: memoryview,
          pool: ThreadPoolExecutor) -> None:
    if pattern == "dd16":
        for off in range(0, size, 16 << 20):
            os.preadv(fd, [small], off)
    elif pattern in ("plain8", "plain16"):
        w = WINDOW if pattern == "plain8" else 16 << 20
        for off in range(0, size, w):
            os.preadv(fd, [mv[off : off + w]], off)
    else:
        offs = list(range(0, size, WINDOW))
        fut = pool.submit(os.preadv, fd, [mv[0:WINDOW]], 0)
        for j, off in enumerate(offs):
            fut.result()
            if j + 1 < len(offs):
                nxt = offs[j + 1]
                fut = pool.submit(os.preadv, fd, [mv[nxt : nxt + WINDOW]], nxt)
            for i in range(off, min(off + WINDOW, size), BLOCK):
                crc32c.crc32c(mv[i : i + BLOCK])


def _reader(path: str, bar: Any, out: Any, reps: int) -> None:
    size = os.path.getsize(path)
    buf = bytearray(size)
    for i in range(0, size, 4096):  # touched, as a load's destination tensors are
        buf[i] = 1
    mv, small = memoryview(buf), memoryview(bytearray(16 << 20))
    pool = ThreadPoolExecutor(1)
    for rep in range(reps):
        k = rep % len(PATTERNS)
        for pattern in PATTERNS[k:] + PATTERNS[:k]:
            bar.wait()  # the parent drops the page cache between these two
            bar.wait()
            t0 = time.perf_counter()
            fd = os.open(path, os.O_RDONLY)
            try:
                _read(fd, mv, size, pattern, small, pool)
            finally:
                os.close(fd)
            out.put((pattern, time.perf_counter() - t0))
            bar.wait()


def main(argv: list[str] | None = None) -> int:
    """Run the patterns and print the table."""
    p = argparse.ArgumentParser(prog="python -m bench.read_floor", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--files", type=int, default=4)
    args = p.parse_args(argv)
    paths = [os.path.join(d, n) for d, _, ns in os.walk(args.dir) for n in ns]
    files = sorted(paths, key=os.path.getsize, reverse=True)[: args.files]
    ctx = mp.get_context("spawn")
    bar, out = ctx.Barrier(len(files) + 1), ctx.Queue()
    procs = [ctx.Process(target=_reader, args=(f, bar, out, args.reps)) for f in files]
    for proc in procs:
        proc.start()
    times: dict[str, list[float]] = {k: [] for k in PATTERNS}
    cold = True
    for _ in range(args.reps * len(PATTERNS)):
        bar.wait()
        cold = drop_caches() and cold
        bar.wait()
        bar.wait()
        got = [out.get() for _ in files]
        times[got[0][0]].append(max(t for _, t in got))
    for proc in procs:
        proc.join()
    total = sum(os.path.getsize(f) for f in files)
    print(f"{len(files)} parallel readers, {total / 2**20:.0f} MiB, {args.reps} repetitions, "
          + ("page cache dropped before each" if cold else "page cache NOT dropped (not root)"))
    for k, ts in times.items():
        med = statistics.median(ts)
        print(f"{k:8s} {med:.3f} s [{min(ts):.3f}–{max(ts):.3f}]  {total / 2**20 / med:,.0f} MiB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
