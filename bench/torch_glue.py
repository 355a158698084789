"""Glue for the torch section: calls bench/bench_torch.py (owned by the torch adapter's author).

bench_torch.py compares ``portable_ckpt.torch.save/load/async_save`` with
``torch.distributed.checkpoint`` and dd on gloo ranks and prints its own table; this section runs
it as one subprocess, keeps its JSON in the report's JSON and its table in the markdown.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["run"]


def run(ctx: Any, external: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """Run bench/bench_torch.py (if present) and return its section."""
    if ctx.smoke:
        args = ["--gib", "0.03", "--reps", "1"]
    elif ctx.quick:
        args = ["--gib", "0.125", "--reps", "2"]
    else:
        args = ["--gib", "1", "--reps", "3"]
    args += ["--out", "{json}"]
    section = external(ctx, "torch adapter vs torch.distributed.checkpoint (bench/bench_torch.py)",
                       "bench_torch.py", args, 3000)
    if not section.get("skipped"):
        section["targets"] = targets(section.get("external", {}))
    return section


#: bench_torch.py's targets: (name, its JSON key, the bound, at least (True) or at most)
TARGETS: list[tuple[str, str, float, bool]] = [
    ("torch save vs dcp.save (speed ratio)", "save_ratio_vs_dcp", 1.3, True),
    ("torch save vs dd conv=fsync per rank (speed ratio)", "save_ratio_vs_dd", 0.9, True),
    ("torch load 4→2 vs dcp.load (speed ratio)", "load_ratio_vs_dcp", 1.2, True),
    ("async_save blocking time / sync save time", "async_block_ratio_vs_sync", 0.5, False),
]


def targets(external: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets bench_torch.py prints, for the report's Targets table (MET/MISSED).

    They were only in its printed output, inside a collapsed block of the report, so a missed
    one did not show (outside review 21b). A run that left no JSON misses every target.
    """
    data = external.get("json")
    if not isinstance(data, dict):
        value = f"n/a (bench_torch.py exit {external.get('rc')}, no result)"
        return [{"name": name, "value": value, "target": f"{'≥' if least else '≤'} {bound:g}×",
                 "met": False} for name, _, bound, least in TARGETS]
    out = []
    for name, key, bound, least in TARGETS:
        v = data.get(key)
        ok = isinstance(v, (int, float)) and (v >= bound if least else v <= bound)
        out.append({"name": name, "value": f"{v:.2f}×" if isinstance(v, (int, float)) else "n/a",
                    "target": f"{'≥' if least else '≤'} {bound:g}×", "met": bool(ok)})
    budget = data.get("rss_budget_ok")
    out.append({"name": "torch load: peak RSS growth per rank ≤ 1.1 × its target bytes + 64 MiB",
                "value": "within" if budget else "over" if budget is False else "n/a",
                "target": "within", "met": budget is True})
    return out
