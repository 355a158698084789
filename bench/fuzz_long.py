"""Long fuzzing run of every parser of untrusted bytes (documented in tests/hardening/README.md).

    .venv/bin/python bench/fuzz_long.py --inputs 100000 --seed 1 [--open-share 0.05] [--json out.json]

Targets (round-robin, seeded, reproducible per input from ``(seed, index)``): strict JSON loading,
``parse_manifest``, ``parse_writer_index``, safetensors header loading from a real file, and
``open`` + read + entries + ``verify(deep)`` on a damaged copy of a real checkpoint (a share
``--open-share`` of the inputs, they are ~100x slower). Invariant per input: only CheckpointError
escapes, it finishes within ``--seconds``, its traced heap peak stays under ``--peak-mib``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
import tracemalloc

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from portable_ckpt.errors import CheckpointError
from portable_ckpt.format import jsonio
from portable_ckpt.format.manifest import parse_manifest, parse_writer_index
from tests.hardening import _mutate
from tests.hardening._util import Hang, exercise_version, load_header_file, make_version, time_bound


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--inputs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--open-share", type=float, default=0.03)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--peak-mib", type=float, default=64.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="pck-fuzz-")
    root = os.path.join(work, "pristine")
    atts = [make_version(root, 1), make_version(root, 2, codec="zstd")]
    docs = {a: {"manifest": json.load(open(os.path.join(root, a, "manifest.json"))),
                "index": json.load(open(os.path.join(root, a, "index", "w00000.json"))),
                "shard": open(os.path.join(root, a, "data", "w00000-0000.safetensors"), "rb").read()}
            for a in atts}
    stf = os.path.join(work, "x.safetensors")

    def t_json(rng: random.Random) -> None:
        a = rng.choice(atts)
        data = _mutate.mutate_text_doc(docs[a][rng.choice(["manifest", "index"])], rng)
        jsonio.loads(data, what="fuzz")

    def t_manifest(rng: random.Random) -> None:
        a = rng.choice(atts)
        doc = docs[a]["manifest"]
        if rng.random() < 0.5:
            parse_manifest(jsonio.loads(_mutate.mutate_text_doc(doc, rng), what="m", max_bytes=1 << 30),
                           directory_name=a)
        else:
            parse_manifest(_mutate.mutate_json(doc, rng, n=rng.randint(1, 8)), directory_name=a)

    def t_index(rng: random.Random) -> None:
        a = rng.choice(atts)
        doc = docs[a]["index"]
        if rng.random() < 0.5:
            parse_writer_index(jsonio.loads(_mutate.mutate_text_doc(doc, rng), what="i"))
        else:
            parse_writer_index(_mutate.mutate_json(doc, rng, n=rng.randint(1, 8)))

    def t_header(rng: random.Random) -> None:
        with open(stf, "wb") as f:
            f.write(_mutate.mutate_safetensors(docs[rng.choice(atts)]["shard"], rng))
        load_header_file(stf)

    known = collections.Counter()

    def t_open(rng: random.Random) -> None:
        base = tempfile.mkdtemp(dir=work)
        try:
            r = os.path.join(base, "root")
            outside = os.path.join(base, "outside")
            os.makedirs(outside)
            open(os.path.join(outside, "secret.bin"), "wb").write(b"SECRET" * 100)
            a = rng.choice(atts)
            shutil.copytree(os.path.join(root, a), os.path.join(r, a), symlinks=True)
            what = _mutate.mutate_version(os.path.join(r, a), rng, outside)
            try:
                exercise_version(r, a)
            except (MemoryError, ValueError) as exc:
                if what.startswith("shape-scale"):
                    known[f"known bug (read allocates before validating): {type(exc).__name__}"] += 1
                    return
                raise
        finally:
            shutil.rmtree(base, ignore_errors=True)

    targets = [("jsonio.loads", t_json), ("parse_manifest", t_manifest),
               ("parse_writer_index", t_index), ("safetensors header", t_header)]
    counts: collections.Counter[str] = collections.Counter()
    codes: collections.Counter[str] = collections.Counter()
    violations: list[dict[str, str]] = []
    slowest: dict[str, float] = collections.defaultdict(float)
    peak_max = 0
    tracemalloc.start()
    t_start = time.perf_counter()
    for i in range(args.inputs):
        rng = random.Random(args.seed * 1_000_003 + i)
        if rng.random() < args.open_share:
            name, fn = "open+read+verify", t_open
        else:
            name, fn = targets[i % len(targets)]
        counts[name] += 1
        tracemalloc.reset_peak()
        base_mem = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        try:
            with time_bound(args.seconds):
                fn(rng)
            codes["accepted"] += 1
        except CheckpointError as exc:
            codes[exc.code] += 1
        except Hang:
            violations.append({"target": name, "input": str(i), "error": f"hang > {args.seconds} s"})
        except Exception as exc:
            violations.append({"target": name, "input": str(i), "error": f"{type(exc).__name__}: {exc}"[:300],
                               "trace": traceback.format_exc()[-800:]})
        if violations and violations[-1]["input"] == str(i):
            print("VIOLATION", json.dumps(violations[-1])[:1200], flush=True)
        dt = time.perf_counter() - t0
        slowest[name] = max(slowest[name], dt)
        peak = tracemalloc.get_traced_memory()[1] - base_mem
        peak_max = max(peak_max, peak)
        if peak > args.peak_mib * (1 << 20):
            violations.append({"target": name, "input": str(i), "error": f"heap peak {peak} bytes"})
        if (i + 1) % 5000 == 0:
            print(f"{i + 1} inputs, {time.perf_counter() - t_start:.0f} s, {len(violations)} violations", flush=True)
    total = time.perf_counter() - t_start
    report = {
        "inputs": args.inputs, "seed": args.seed, "seconds": round(total, 1),
        "per_target": dict(counts), "outcomes": dict(codes.most_common()),
        "slowest_input_seconds": {k: round(v, 3) for k, v in slowest.items()},
        "max_heap_peak_bytes": peak_max, "violations": violations[:50], "violation_count": len(violations),
        "known_bug_hits": dict(known),
    }
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
