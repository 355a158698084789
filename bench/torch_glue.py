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
    return external(ctx, "torch adapter vs torch.distributed.checkpoint (bench/bench_torch.py)",
                    "bench_torch.py", args, 3000)
