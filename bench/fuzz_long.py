"""Long fuzzing run of every parser of untrusted bytes (documented in tests/hardening/README.md).

    nice -n 10 .venv/bin/python bench/fuzz_long.py --inputs 100000 --seed 1 [--json out.json]
    nice -n 10 .venv/bin/python bench/fuzz_long.py --inputs 100000 --seed 1 --part 0/2  # a half

Targets (round-robin, seeded, each input reproducible from ``(seed, index)``): strict JSON
loading, ``parse_manifest``, ``parse_writer_index``, safetensors headers from a real file,
``open`` + read + entries + ``verify(deep)`` of a damaged real checkpoint (a share
``--open-share`` of the inputs: ~100x slower), and the targets of issue 12 in
``tests/hardening/_fuzz_targets.py`` (commit of fuzzed writer indexes with the table merge, tensor
tables, zstd entry values, zstd tensor ranges read against a reference decoder, embedded schemas,
torch.save zips, DCP ``.metadata``, Hugging Face safetensors + index).

Invariant per input: only ``CheckpointError`` escapes (and a target's own oracle holds: a reader
never returns bytes other than the reference's); at most ``--cpu-seconds`` of CPU time (SIGPROF:
a shared machine stretches wall time, not CPU time), and a watchdog ends the run if one input
takes ``--wall-seconds`` of wall time (a hang inside one C call); a peak RSS growth (``VmHWM``
after resetting it through ``/proc/self/clear_refs``, minus the RSS before the input) and, with
``--trace-heap``, a tracemalloc peak within the target's bound (:data:`_fuzz_targets.PEAK_BYTES_OF`,
default 64 MiB). Recorded per target: inputs, outcomes, and the largest CPU time, wall time and
memory of one input.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time
import traceback
import tracemalloc
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from portable_ckpt.errors import CheckpointError
from portable_ckpt.format import jsonio
from portable_ckpt.format.manifest import parse_manifest, parse_writer_index
from tests.hardening import _mutate
from tests.hardening._fuzz_targets import PEAK_BYTES_OF, TARGETS, Corpus
from tests.hardening._util import (
    PEAK_BYTES,
    Hang,
    cpu_bound,
    exercise_version,
    load_header_file,
    make_version,
)


class _Status:
    """Peak RSS of one input: ``VmHWM`` reset before it (Linux ``clear_refs`` 5)."""

    def __init__(self) -> None:
        self.ok = self._reset()

    def _reset(self) -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    @staticmethod
    def _kib(field: str) -> int:
        with open("/proc/self/status") as f:
            m = re.search(rf"{field}:\s+(\d+) kB", f.read())
        return int(m.group(1)) if m else 0

    def start(self) -> int:
        if self.ok:
            self._reset()
        return self._kib("VmRSS")

    def growth(self, before_kib: int) -> int:
        return max(0, self._kib("VmHWM") - before_kib) << 10 if self.ok else 0


class Watchdog(threading.Thread):
    """Ends the process (exit 3) when one input runs ``seconds`` of wall time: a hang in C code."""

    def __init__(self, seconds: float) -> None:
        super().__init__(daemon=True)
        self.seconds = seconds
        self.current: tuple[str, int, float] | None = None

    def run(self) -> None:
        while True:
            time.sleep(1.0)
            cur = self.current
            if cur is not None and time.monotonic() - cur[2] > self.seconds:
                print(f"VIOLATION {json.dumps({'target': cur[0], 'input': str(cur[1]), 'error': f'wall time > {self.seconds} s (hang)'})}", flush=True)
                os._exit(3)


def classic_targets(work: str) -> tuple[dict[str, Callable[[random.Random], None]], Callable[[random.Random], None]]:
    """The targets of issue 8: strict JSON, the manifest and index parsers, headers, open+verify."""
    root = os.path.join(work, "classic")
    atts = [make_version(root, 1), make_version(root, 2, codec="zstd")]
    docs: dict[str, dict[str, Any]] = {}
    for a in atts:
        with open(os.path.join(root, a, "manifest.json"), "rb") as f:
            man = json.loads(f.read())
        with open(os.path.join(root, a, "index", "w00000.json"), "rb") as f:
            idx = json.loads(f.read())
        with open(os.path.join(root, a, "data", "w00000-0000.safetensors"), "rb") as f:
            docs[a] = {"manifest": man, "index": idx, "shard": f.read()}
    stf = os.path.join(work, "x.safetensors")

    def t_json(rng: random.Random) -> None:
        a = rng.choice(atts)
        jsonio.loads(_mutate.mutate_text_doc(docs[a][rng.choice(["manifest", "index"])], rng), what="fuzz")

    def t_manifest(rng: random.Random) -> None:
        a = rng.choice(atts)
        doc = docs[a]["manifest"]
        if rng.random() < 0.5:
            parse_manifest(jsonio.loads(_mutate.mutate_text_doc(doc, rng), what="m", max_bytes=1 << 30),
                           directory_name=a)
        else:
            parse_manifest(_mutate.mutate_json(doc, rng, n=rng.randint(1, 8)), directory_name=a)

    def t_index(rng: random.Random) -> None:
        doc = docs[rng.choice(atts)]["index"]
        if rng.random() < 0.5:
            parse_writer_index(jsonio.loads(_mutate.mutate_text_doc(doc, rng), what="i"))
        else:
            parse_writer_index(_mutate.mutate_json(doc, rng, n=rng.randint(1, 8)))

    def t_header(rng: random.Random) -> None:
        with open(stf, "wb") as f:
            f.write(_mutate.mutate_safetensors(docs[rng.choice(atts)]["shard"], rng))
        load_header_file(stf)

    def t_open(rng: random.Random) -> None:
        base = tempfile.mkdtemp(dir=work)
        try:
            r = os.path.join(base, "root")
            outside = os.path.join(base, "outside")
            os.makedirs(outside)
            with open(os.path.join(outside, "secret.bin"), "wb") as f:
                f.write(b"SECRET" * 100)
            a = rng.choice(atts)
            shutil.copytree(os.path.join(root, a), os.path.join(r, a), symlinks=True)
            _mutate.mutate_version(os.path.join(r, a), rng, outside)
            exercise_version(r, a)
        finally:
            shutil.rmtree(base, ignore_errors=True)

    return ({"jsonio.loads": t_json, "parse_manifest": t_manifest, "parse_writer_index": t_index,
             "safetensors header": t_header}, t_open)


class Run:
    """Counters of one run."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.codes: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.violations: list[dict[str, str]] = []
        self.cpu: dict[str, float] = collections.defaultdict(float)
        self.cpu_total: dict[str, float] = collections.defaultdict(float)
        self.wall: dict[str, float] = collections.defaultdict(float)
        self.heap: dict[str, int] = collections.defaultdict(int)
        self.rss: dict[str, int] = collections.defaultdict(int)

    def violation(self, name: str, i: int, error: str, trace: str = "") -> None:
        v = {"target": name, "input": str(i), "error": error[:300]}
        if trace:
            v["trace"] = trace[-1500:]
        self.violations.append(v)
        print("VIOLATION", json.dumps(v)[:2000], flush=True)


def run_one(run: Run, name: str, fn: Callable[[random.Random], None], i: int, seed: int,
            args: argparse.Namespace, status: _Status) -> None:
    """Run input ``i`` of target ``name`` and record its outcome and costs."""
    rng = random.Random(seed * 1_000_003 + i)
    run.counts[name] += 1
    rss0 = status.start()
    if args.trace_heap:
        tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        with cpu_bound(args.cpu_seconds):
            fn(rng)
        run.codes[name]["accepted"] += 1
    except CheckpointError as exc:
        run.codes[name][exc.code] += 1
    except Hang as exc:
        run.violation(name, i, str(exc))
    except Exception as exc:
        run.violation(name, i, f"{type(exc).__name__}: {exc}", traceback.format_exc())
    cpu = time.process_time() - c0
    run.cpu[name] = max(run.cpu[name], cpu)
    run.cpu_total[name] += cpu
    run.wall[name] = max(run.wall[name], time.perf_counter() - t0)
    heap = tracemalloc.get_traced_memory()[1] - base if args.trace_heap else 0
    rss = status.growth(rss0)
    run.heap[name] = max(run.heap[name], heap)
    run.rss[name] = max(run.rss[name], rss)
    limit = PEAK_BYTES_OF.get(name, PEAK_BYTES)
    if max(heap, rss) > limit:
        run.violation(name, i, f"memory peak (traced {heap}, RSS growth {rss} bytes) > bound {limit}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--inputs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--part", default="0/1",
                    help="K/N: run the K-th of N interleaved shares (every target in each)")
    ap.add_argument("--open-share", type=float, default=0.02)
    ap.add_argument("--cpu-seconds", type=float, default=5.0)
    ap.add_argument("--wall-seconds", type=float, default=300.0)
    ap.add_argument("--trace-heap", action="store_true",
                    help="also bound the tracemalloc peak (2-5x slower on allocation-heavy inputs)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    k, n = (int(x) for x in args.part.split("/"))

    work = tempfile.mkdtemp(prefix="pck-fuzz-")
    classic, t_open = classic_targets(work)
    corpus = Corpus(os.path.join(work, "c"))
    targets: list[tuple[str, Callable[[random.Random], None]]] = list(classic.items())
    for name, fn in TARGETS.items():
        targets.append((name, lambda rng, fn=fn: fn(rng, corpus)))
    run = Run()
    status = _Status()
    dog = Watchdog(args.wall_seconds)
    dog.start()
    if args.trace_heap:
        tracemalloc.start()
    t_start = time.perf_counter()
    width = len(targets)  # a share takes whole rounds of the round-robin: all targets in each
    for i in (j for j in range(args.inputs) if (j // width) % n == k):
        pick = random.Random(args.seed * 1_000_003 + i)
        name, fn = (("open+read+verify", t_open) if pick.random() < args.open_share
                    else targets[i % len(targets)])
        dog.current = (name, i, time.monotonic())
        run_one(run, name, fn, i, args.seed, args, status)
        dog.current = None
        done = sum(run.counts.values())
        if done % 1000 == 0:
            print(f"{done} inputs, {time.perf_counter() - t_start:.0f} s, {len(run.violations)} violations", flush=True)
            if args.json:  # a partial report, so that an interrupted run still has figures
                _write(args.json, _report(run, args, t_start, status, finished=False))
    report = _report(run, args, t_start, status, finished=True)
    print(json.dumps(report, indent=1))
    if args.json:
        _write(args.json, report)
    shutil.rmtree(work, ignore_errors=True)
    return 1 if run.violations else 0


def _write(path: str, report: dict[str, Any]) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(report, f, indent=1)
    os.replace(path + ".tmp", path)


def _report(run: Run, args: argparse.Namespace, t_start: float, status: _Status, *,
            finished: bool) -> dict[str, Any]:
    return {
        "finished": finished,
        "inputs": sum(run.counts.values()), "seed": args.seed, "part": args.part,
        "wall_seconds": round(time.perf_counter() - t_start, 1),
        "cpu_seconds": round(time.process_time(), 1),
        "bounds": {"cpu_seconds_per_input": args.cpu_seconds, "wall_watchdog_seconds": args.wall_seconds,
                   "heap_bytes_per_input": {name: PEAK_BYTES_OF.get(name, PEAK_BYTES) for name in run.counts}},
        "per_target": dict(run.counts),
        "outcomes": {name: dict(c.most_common()) for name, c in run.codes.items()},
        "mean_cpu_ms": {name: round(1000 * v / run.counts[name], 2) for name, v in run.cpu_total.items()},
        "max_cpu_seconds": {name: round(v, 3) for name, v in run.cpu.items()},
        "max_wall_seconds": {name: round(v, 3) for name, v in run.wall.items()},
        "max_traced_heap_peak_bytes": dict(run.heap) if args.trace_heap else "not traced",
        "max_rss_growth_bytes": dict(run.rss) if status.ok else "unavailable (no /proc/self/clear_refs)",
        "violation_count": len(run.violations), "violations": run.violations[:50],
    }


if __name__ == "__main__":
    sys.exit(main())
