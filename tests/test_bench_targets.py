"""The torch bench section's targets reach the report's Targets table (outside review 21b).

It imports only ``bench.torch_glue``, which needs neither torch nor a run.
"""

from __future__ import annotations

import pytest

torch_glue = pytest.importorskip("bench.torch_glue")


def test_a_missed_torch_target_is_in_the_targets_table() -> None:
    """`bench_torch.py` printed "ours 0.75x faster (target >= 1.3)" only inside a collapsed
    block; its targets are now the section's, MET or MISSED, and a run with no result misses
    them all rather than leaving the table without them."""
    data = {"save_ratio_vs_dcp": 0.75, "save_ratio_vs_dd": 0.65, "load_ratio_vs_dcp": 1.4,
            "async_block_ratio_vs_sync": 0.3, "rss_budget_ok": True}
    got = {t["name"]: t for t in torch_glue.targets({"json": data, "rc": 0})}
    assert not got["torch save vs dcp.save (speed ratio)"]["met"]
    assert got["torch save vs dcp.save (speed ratio)"]["value"] == "0.75×"
    assert not got["torch save vs dd conv=fsync per rank (speed ratio)"]["met"]
    assert got["torch load 4→2 vs dcp.load (speed ratio)"]["met"]
    assert got["async_save blocking time / sync save time"]["met"]
    assert sum(t["met"] for t in got.values()) == 3
    failed = torch_glue.targets({"json": None, "rc": 1})
    assert failed and not any(t["met"] for t in failed) and "exit 1" in failed[0]["value"]
