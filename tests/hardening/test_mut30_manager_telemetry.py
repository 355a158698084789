"""Mutation audit 30, the manager's Prometheus textfile (docs/torch.md "Telemetry"): which
events date the last commit, which tiers have which counters, and what ``restore()`` seeds.

A real ``Telemetry`` writing a real textfile, read back as a collector would.
"""

from __future__ import annotations

from pathlib import Path

from portable_ckpt.manager.telemetry import Telemetry


def _samples(path: Path) -> dict[str, float]:
    """``name{tier="..."}`` -> value of every sample of the textfile (other labels dropped)."""
    out: dict[str, float] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            name, labels = series.split("{", 1)
            out[f"{name}{{{labels.split(',', 1)[0]}}}"] = float(value)
    return out


def test_a_copy_to_the_durable_root_dates_its_last_commit_and_a_failed_one_does_not(
    tmp_path: Path,
) -> None:
    """``pck_last_commit_timestamp_seconds``: "a copy to the durable root with
    ``replicate=True`` counts for the durable tier" (its durable saves commit nowhere else).
    Mutant: only commit events dated it, and a replicating job's freshness alert fired."""
    path = tmp_path / "m.prom"
    t = Telemetry(path, rank=0, root="/ckpt/run1")
    t.emit("replicate", tier="durable", checkpoint_id="a", ok=False, code="PCK-STORAGE")
    assert 'pck_last_commit_timestamp_seconds{tier="durable"}' not in _samples(path)
    doc = t.emit("replicate", tier="durable", checkpoint_id="b", ok=True, bytes=10)
    assert _samples(path)['pck_last_commit_timestamp_seconds{tier="durable"}'] == doc["ts"]
    t.emit("replicate", tier="durable", checkpoint_id="c", ok=False, code="PCK-STORAGE")
    assert _samples(path)['pck_last_commit_timestamp_seconds{tier="durable"}'] == doc["ts"]


def test_counters_start_at_zero_per_tier_and_copies_count_on_the_durable_tier_only(
    tmp_path: Path,
) -> None:
    """Counters start at 0 for every tier, ``pck_replicate_failed_total`` for the durable tier
    only (copies go there), and it counts failed copies, not failed commits. Mutants: the
    copy counter on the fast tier too (a series that never moves); failed commits counted
    as failed copies."""
    path = tmp_path / "m.prom"
    t = Telemetry(path, rank=0, root="/ckpt/run1")
    t.start_counters(["durable", "fast"])
    t.emit("commit", tier="durable", ok=False, code="PCK-STORAGE")
    s = _samples(path)
    assert s['pck_save_failed_total{tier="durable"}'] == 1.0
    assert s['pck_save_failed_total{tier="fast"}'] == 0.0
    assert s['pck_replicate_failed_total{tier="durable"}'] == 0.0
    assert 'pck_replicate_failed_total{tier="fast"}' not in s
    t.emit("replicate", tier="durable", checkpoint_id="a", ok=False, code="PCK-STORAGE")
    s = _samples(path)
    assert s['pck_replicate_failed_total{tier="durable"}'] == 1.0
    assert s['pck_save_failed_total{tier="durable"}'] == 1.0


def test_a_seeded_step_gives_way_to_a_later_seed_and_never_to_an_earlier_save(
    tmp_path: Path,
) -> None:
    """``seed(step=)`` sets ``pck_save_step`` "unless a save of this process set it already";
    a seeded value is no save, and a later restore seeds again. Mutant: only a tier without
    any value was seeded, and a second restore left the first one's step."""
    path = tmp_path / "m.prom"
    t = Telemetry(path, rank=0, root="/ckpt/run1")
    t.seed("durable", step=3)
    t.seed("durable", step=5)  # a second restore (an older step=, or a retry)
    t.emit("verify", tier="durable", ok=True)  # written with the next event
    assert _samples(path)['pck_save_step{tier="durable"}'] == 5.0
    t.emit("save", tier="durable", step=7, pause_s=0.1, seconds=1.0, bytes=1, mib_per_s=1.0)
    t.seed("durable", step=5)
    t.emit("verify", tier="durable", ok=True)
    assert _samples(path)['pck_save_step{tier="durable"}'] == 7.0
