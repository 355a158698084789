"""Medians, per-pair ratios and power-law fits for the report."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from bench.runner import Measurement

__all__ = ["fit_exponent", "pair_ratios", "summary"]

MIB = 1 << 20


def summary(ms: Sequence[Measurement], nbytes: int | None = None) -> dict[str, Any]:
    """Median/min/max seconds, MiB/s at the median, and peak RSS of a set of repetitions."""
    ok = [m for m in ms if m.ok]
    if not ok:
        return {"n": 0, "errors": [m.error for m in ms][:2]}
    secs = [m.seconds for m in ok]
    med = statistics.median(secs)
    out: dict[str, Any] = {
        "n": len(ok),
        "median_s": med,
        "min_s": min(secs),
        "max_s": max(secs),
        "maxrss_mib": max(m.maxrss_bytes for m in ok) / MIB,
    }
    setup = [m.extra.get("setup_maxrss_bytes") for m in ok if m.extra.get("setup_maxrss_bytes")]
    if setup:
        out["setup_rss_mib"] = max(setup) / MIB
        out["op_rss_increment_mib"] = max(m.maxrss_bytes - m.extra.get("setup_maxrss_bytes", 0) for m in ok) / MIB
    if nbytes:
        out["mib_s"] = nbytes / MIB / med
        out["mib_s_best"] = nbytes / MIB / min(secs)
    return out


def pair_ratios(a: Sequence[Measurement], b: Sequence[Measurement]) -> dict[str, Any]:
    """Speed ratio A/B (= time_B / time_A) for each repetition pair; median, min, max."""
    rs = [y.seconds / x.seconds for x, y in zip(a, b, strict=False) if x.ok and y.ok and x.seconds > 0]
    if not rs:
        return {"n": 0}
    return {"n": len(rs), "median": statistics.median(rs), "min": min(rs), "max": max(rs),
            "pairs": [round(r, 4) for r in rs]}


def fit_exponent(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of log(y) against log(x) (the growth exponent)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=False) if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else None
