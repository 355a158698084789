"""Cost of the bool-byte rule (R-DTYPE-4) on a large bool tensor, against the read it guards.

Alternates, in one process, a full ``Checkpoint.read`` of a bool tensor (which includes the
check) with the check alone on the same array, and reports medians and spread. Also times two
other ways of writing the check, to keep the cheapest.

    .venv/bin/python bench/bool_check.py [--mib 256] [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import numpy as np

import portable_ckpt


def _t(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    n = args.mib << 20
    rng = np.random.default_rng(0)
    mask = rng.integers(0, 2, n, dtype=np.uint8).view(np.bool_).reshape(n // 4096, 4096)
    with tempfile.TemporaryDirectory() as d:
        portable_ckpt.save_arrays(d, {"mask": mask}, step=1)
        ck = portable_ckpt.open(d)
        out = np.empty_like(mask)
        ck.read("mask", out=out)  # warm the page cache
        u8 = out.view(np.uint8)
        u64 = u8.reshape(-1).view(np.uint64)
        rows: dict[str, list[float]] = {"read": [], "max": [], "or64": [], "any_gt1": [],
                                        "translate": []}
        for _ in range(args.repeat):
            rows["read"].append(_t(lambda: ck.read("mask", out=out)))
            rows["max"].append(_t(lambda: int(u8.max()) <= 1))
            rows["or64"].append(_t(lambda: not int(np.bitwise_or.reduce(u64)) & ~0x0101010101010101))
            rows["any_gt1"].append(_t(lambda: bool(np.any(u8 > 1))))
            rows["translate"].append(_t(lambda: not u8.tobytes().translate(None, b"\0\1")))
    med = {k: statistics.median(v) for k, v in rows.items()}
    doc = {
        "mib": args.mib,
        "median_s": med,
        "spread_s": {k: [min(v), max(v)] for k, v in rows.items()},
        "check_share_of_read": med["max"] / med["read"],
        "read_gib_s": args.mib / 1024 / med["read"],
        "check_gib_s": args.mib / 1024 / med["max"],
    }
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
