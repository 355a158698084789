"""The manager's torch-free policy code: save decisions, retention, telemetry, records."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import portable_ckpt
from portable_ckpt.errors import UsageError
from portable_ckpt.io.annotations import write_verification_record
from portable_ckpt.io.versions import list_versions
from portable_ckpt.manager import (
    Candidate,
    Decision,
    KeepBest,
    RetentionPolicy,
    SavePolicy,
    Telemetry,
    decide,
    plan_retention,
)
from portable_ckpt.manager.decisions import next_rule_step
from portable_ckpt.manager.records import candidates_of, manager_entry_schema, manager_entry_value
from portable_ckpt.storage import open_storage

# -- decisions --------------------------------------------------------------------------------


def _d(policy: SavePolicy, step: int, **kw: object) -> Decision:
    args: dict[str, object] = {
        "now": 0.0,
        "last_save_time": 0.0,
        "last_save_step": None,
        "has_fast": False,
    }
    args.update(kw)
    return decide(policy, step, **args)  # type: ignore[arg-type]


def test_decisions_by_interval_listed_steps_seconds_and_fast() -> None:
    p = SavePolicy.build(save_every=10, save_steps=[3], save_every_seconds=60, fast_every=2)
    assert _d(p, 10) == Decision("durable", "save_every")
    assert _d(p, 3) == Decision("durable", "save_steps")
    assert _d(p, 4) == Decision("none")
    assert _d(p, 4, has_fast=True) == Decision("fast", "fast_every")
    assert _d(p, 5, now=61.0) == Decision("durable", "save_every_seconds")
    assert _d(p, 5, now=59.0) == Decision("none")
    assert _d(p, 10, last_save_step=10) == Decision("none")  # never the same step twice
    assert _d(p, 5, preempted=True) == Decision("durable", "preemption", sync=True)
    assert _d(p, 5, preempted=True, last_save_step=5) == Decision("none")


@given(
    st.sampled_from(["none", "fast", "durable"]),
    st.sampled_from(
        [
            "",
            "fast_every",
            "save_every",
            "save_every_seconds",
            "save_steps",
            "requested",
            "preemption",
        ]
    ),
    st.booleans(),
)
def test_decision_encoding_round_trips(tier: str, reason: str, sync: bool) -> None:
    d = Decision(tier, reason, sync)  # type: ignore[arg-type]
    assert Decision.decode(d.encode()) == d
    assert d.encode() >= 0


def test_decision_max_prefers_durable_over_fast_over_none() -> None:
    codes = [
        Decision("none").encode(),
        Decision("fast", "fast_every").encode(),
        Decision("durable", "save_every").encode(),
    ]
    assert Decision.decode(max(codes)).tier == "durable"


@given(
    save_every=st.none() | st.integers(1, 50),
    fast_every=st.none() | st.integers(1, 50),
    save_steps=st.frozensets(st.integers(0, 400), max_size=8),
    has_fast=st.booleans(),
    step=st.integers(0, 300),
)
def test_next_rule_step_is_the_first_step_a_rule_saves(
    save_every: int | None,
    fast_every: int | None,
    save_steps: frozenset[int],
    has_fast: bool,
    step: int,
) -> None:
    """The manager skips agreements before this step: no step rule may save in between."""
    policy = SavePolicy.build(save_every=save_every, fast_every=fast_every, save_steps=save_steps)
    nxt = next_rule_step(policy, step, has_fast=has_fast)

    def saves(s: int) -> bool:
        return _d(policy, s, has_fast=has_fast).saves

    horizon = 1000 if nxt is None else nxt
    assert nxt is None or nxt > step
    assert not any(saves(s) for s in range(step + 1, horizon))
    if nxt is not None:
        assert saves(nxt)


@pytest.mark.parametrize(
    "kw",
    [
        {"save_every": 0},
        {"save_every": 2.5},
        {"fast_every": -1},
        {"save_every_seconds": 0},
        {"save_steps": [-1]},
    ],
)
def test_bad_policy_arguments_are_usage_errors(kw: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        SavePolicy.build(**kw)  # type: ignore[arg-type]


# -- retention --------------------------------------------------------------------------------


def _cands(steps: list[int], **extra: dict[str, object]) -> list[Candidate]:
    out = []
    for s in steps:
        kw = dict(extra.get(str(s), {}))
        out.append(Candidate(f"v{s:04d}", s, **kw))  # type: ignore[arg-type]
    return out


def _deleted(decisions: list) -> list[int]:  # type: ignore[type-arg]
    return [d.step for d in decisions if d.delete]


def test_keep_last() -> None:
    ds = plan_retention(_cands([1, 2, 3, 4, 5]), RetentionPolicy.build(keep_last=2))
    assert _deleted(ds) == [1, 2, 3]
    assert "outside keep_last=2" in ds[0].reasons[0]


def test_keep_every_keeps_multiples_forever() -> None:
    ds = plan_retention(
        _cands(list(range(1, 11))), RetentionPolicy.build(keep_last=1, keep_every=4)
    )
    assert _deleted(ds) == [1, 2, 3, 5, 6, 7, 9]


def test_keep_every_and_keep_best_do_not_keep_a_version_that_failed_verification() -> None:
    """A version that failed verification is kept by no policy but the protections (newest
    committed, newest drilled): a failed multiple of keep_every, and a failed best loss, are
    deleted as "failed sampled verification", and the next-best good one is kept instead.
    Test audit 21b, RT02: keep_every counted the failed versions too, with the suite green
    (test_retention_invariants asserts only what is kept)."""
    cands = _cands(list(range(1, 9)), **{"4": {"verification_failed": True}})
    ds = {d.step: d for d in plan_retention(cands, RetentionPolicy.build(keep_last=1,
                                                                           keep_every=4))}
    assert ds[4].delete and ds[4].reasons == ["failed sampled verification"], ds[4]
    assert [s for s, d in ds.items() if not d.delete] == [8]
    losses = {1: 3.0, 2: 0.5, 3: 1.0, 4: 2.0}
    cands = [Candidate(f"v{s}", s, metrics={"loss": v}, verification_failed=s == 2)
             for s, v in losses.items()]
    ds = {d.step: d for d in plan_retention(cands, RetentionPolicy.build(keep_best=("loss", 1,
                                                                                      "min")))}
    assert ds[2].delete and ds[2].reasons == ["failed sampled verification"], ds[2]
    assert "keep_best=1 by min loss" in ds[3].reasons
    assert _deleted(list(ds.values())) == [1, 2]


def test_keep_best_min_and_max_and_missing_metric() -> None:
    losses = {1: 5.0, 2: 1.0, 3: 3.0, 4: 2.0, 5: 4.0}
    cands = [Candidate(f"v{s}", s, metrics={"loss": v}) for s, v in losses.items()]
    ds = plan_retention(cands, RetentionPolicy.build(keep_best=("loss", 2, "min")))
    assert _deleted(ds) == [1, 3]  # 5 is the newest committed: never deleted
    ds = plan_retention(cands, RetentionPolicy.build(keep_best=("loss", 2, "max")))
    assert _deleted(ds) == [2, 3, 4]
    cands.insert(0, Candidate("v0", 0, metrics={"acc": 1.0}))
    ds = plan_retention(cands, RetentionPolicy.build(keep_best=("loss", 1, "min")))
    assert 0 not in _deleted(ds)  # no loss stored: unclassified for keep_best, kept


@pytest.mark.parametrize("mode", ["min", "max"])
def test_keep_best_ties_keep_the_newer_version(mode: str) -> None:
    """keep_best: of versions with an equal metric, the newer one is kept (it continues
    furthest), in either mode and whatever order the candidates come in. Test audit 21,
    finding 7: the tie order was never asserted."""
    best, other = (1.0, 3.0) if mode == "min" else (3.0, 1.0)
    metric = {1: best, 2: other, 3: best, 4: best, 5: other, 6: other}
    cands = [Candidate(f"v{s}", s, metrics={"loss": v}) for s, v in reversed(metric.items())]
    ds = plan_retention(cands, RetentionPolicy.build(keep_best=("loss", 1, mode)))
    assert _deleted(ds) == [1, 2, 3, 5]  # 4: the newest of the three best; 6: newest committed
    assert f"keep_best=1 by {mode} loss" in {d.step: d for d in ds}[4].reasons
    ds = plan_retention(cands, RetentionPolicy.build(keep_best=("loss", 2, mode)))
    assert _deleted(ds) == [1, 2, 5]


def test_protections_newest_drilled_in_flight_incomplete_unclassified_failed() -> None:
    cands = [
        Candidate("a", 1, drilled=True),
        Candidate("b", 2, committed=False),
        Candidate("c", 3, classified=False),
        Candidate("d", 4, in_flight=True),
        Candidate("e", 5, verification_failed=True),
        Candidate("f", 6),
        Candidate("g", 7),
    ]
    ds = {d.id: d for d in plan_retention(cands, RetentionPolicy.build(keep_last=1))}
    assert not ds["a"].delete and "newest drilled" in ds["a"].reasons
    assert not ds["b"].delete and not ds["c"].delete and not ds["d"].delete
    assert ds["e"].delete and ds["e"].reasons == ["failed sampled verification"]
    assert ds["f"].delete and not ds["g"].delete


def test_no_policy_keeps_everything() -> None:
    assert _deleted(plan_retention(_cands([1, 2, 3]), RetentionPolicy())) == []


@given(
    st.lists(
        st.tuples(st.integers(0, 60), st.booleans(), st.booleans(), st.booleans()),
        min_size=1,
        max_size=30,
        unique_by=lambda t: t[0],
    ),
    st.one_of(st.none(), st.integers(1, 5)),
    st.one_of(st.none(), st.integers(1, 7)),
    st.one_of(st.none(), st.integers(1, 4)),
)
def test_retention_invariants(
    rows: list[tuple[int, bool, bool, bool]],
    last: int | None,
    every: int | None,
    best: int | None,
) -> None:
    cands = [
        Candidate(
            f"v{s:03d}",
            s,
            committed=c,
            drilled=d,
            metrics={"loss": float(s % 7)},
            verification_failed=f,
        )
        for s, c, d, f in rows
    ]
    policy = RetentionPolicy.build(
        keep_last=last, keep_every=every, keep_best=None if best is None else ("loss", best, "min")
    )
    ds = {d.id: d for d in plan_retention(cands, policy)}
    committed = sorted((c for c in cands if c.committed), key=lambda c: c.step)
    for c in cands:
        if not c.committed:
            assert not ds[c.id].delete
    if committed:
        assert not ds[committed[-1].id].delete  # newest committed
        drilled = [c for c in committed if c.drilled]
        if drilled:
            assert not ds[drilled[-1].id].delete  # newest drilled
    good = [c for c in committed if not c.verification_failed]
    if last:
        assert all(not ds[c.id].delete for c in good[-last:])
    if not policy.active:
        assert not any(d.delete for d in ds.values())
    for d in ds.values():
        assert d.reasons  # every decision says why


def test_keep_best_parse_errors() -> None:
    for bad in ["loss", ("loss", 0, "min"), ("loss", 2, "median"), ("", 2, "min")]:
        with pytest.raises(UsageError):
            KeepBest.parse(bad)


# -- telemetry --------------------------------------------------------------------------------


def test_telemetry_json_lines_and_logger(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "ev" / "events-{rank}.jsonl"
    t = Telemetry(path, rank=3)
    with caplog.at_level(logging.INFO, logger="portable_ckpt"):
        t.emit("save", tier="fast", pause_s=0.5, bytes=10)
    lines = (tmp_path / "ev" / "events-3.jsonl").read_text().splitlines()
    doc = json.loads(lines[0])
    assert doc["event"] == "save" and doc["rank"] == 3 and doc["pause_s"] == 0.5
    assert any(getattr(r, "pck_event", {}).get("event") == "save" for r in caplog.records)
    assert Telemetry(tmp_path / "only0.jsonl", rank=1).path is None  # only rank 0 without {rank}


def test_a_non_finite_field_is_not_written_to_the_events_file_and_emit_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """mutation audit 22 B2-33: an event with a NaN or infinite field (no JSON) raised out of
    emit, i.e. out of the save that emitted it; it is said, not written, and the next event
    is written as a line of strict JSON."""
    path = tmp_path / "events.jsonl"
    t = Telemetry(path, rank=0)
    doc = t.emit("save", tier="durable", step=1, mib_per_s=float("inf"), pause_s=float("nan"))
    assert doc["step"] == 1 and t.history[-1] is doc
    t.emit("save", tier="durable", step=2, mib_per_s=1.5)
    lines = path.read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [2]
    assert "not written" in capsys.readouterr().err


def test_the_textfile_has_no_nan_or_inf_sample(tmp_path: Path) -> None:
    """mutation audit 22 B2-20: a NaN or infinite field became a ``NaN``/``+Inf`` gauge
    (``pck_save_mib_per_s inf``) that alerts compare as if it were a value; such a field
    gives no sample, and the finite ones of the same event are written."""
    path = tmp_path / "metrics.prom"
    t = Telemetry(path, rank=0)
    t.emit("save", tier="durable", step=4, seconds=float("nan"), mib_per_s=float("inf"),
           pause_s=float("-inf"), bytes=10)
    samples = {line.split("{")[0]: line.rsplit(" ", 1)[1]
               for line in path.read_text().splitlines() if not line.startswith("#")}
    assert samples == {"pck_save_step": "4.0", "pck_save_bytes": "10.0"}, samples


def test_telemetry_prometheus_textfile(tmp_path: Path) -> None:
    path = tmp_path / "metrics.prom"
    t = Telemetry(path, rank=0, root="/ckpt/run1")
    t.emit("save", tier="fast", pause_s=0.25, seconds=2.0, bytes=1 << 20, mib_per_s=0.5, step=7)
    t.emit("save", tier="durable", pause_s=0.75, seconds=4.0, bytes=2 << 20, mib_per_s=0.5, step=8)
    t.emit("commit", tier="durable", ok=False, expected_writers=4, reported_writers=3)
    text = path.read_text()
    assert 'pck_save_pause_seconds{tier="fast",rank="0",root="/ckpt/run1"} 0.25' in text
    assert 'pck_save_pause_seconds{tier="durable",rank="0",root="/ckpt/run1"} 0.75' in text
    assert 'pck_commit_ok{tier="durable",rank="0",root="/ckpt/run1"} 0.0' in text
    assert 'pck_commit_reported_writers{tier="durable",rank="0",root="/ckpt/run1"} 3.0' in text
    assert "# TYPE pck_save_bytes gauge" in text
    # a first run's restore and its resume have no tier: one label for both, not "None" and ""
    t.emit("restore", ok=True, tier=None, seconds=0.5)
    t.emit("resume", seconds=1.5)
    text = path.read_text()
    assert 'pck_restore_seconds{tier="none",rank="0",root="/ckpt/run1"} 0.5' in text
    assert 'pck_time_to_resume_seconds{tier="none",rank="0",root="/ckpt/run1"} 1.5' in text


# -- records ----------------------------------------------------------------------------------


def test_verification_record_marks_a_version(tmp_path: Path) -> None:
    """Spec §14.5 (R-DRILL-7, R-DRILL-8): a failed verification record marks the version."""
    root = str(tmp_path / "r")
    m = portable_ckpt.save_arrays(root, {"w": np.arange(6.0)}, step=1)
    storage = open_storage(root)
    write_verification_record(
        storage, m.attempt_id, ok=True, mode="sample", fraction=0.5, chunks=1, seed=3
    )
    [v] = list_versions(root)
    assert len(v.verifications) == 1 and not v.verification_failed
    rel = write_verification_record(
        storage,
        m.attempt_id,
        ok=False,
        mode="deep",
        fraction=None,
        chunks=1,
        errors=[{"code": "PCK-CHECKSUM", "message": "block 0"}],
    )
    assert rel.startswith(f"{m.attempt_id}/verifications/v")
    [v] = list_versions(root)
    assert v.verification_failed
    assert [c.verification_failed for c in candidates_of(storage)] == [True]
    with pytest.raises(portable_ckpt.CheckpointError):  # errors are required when not ok
        write_verification_record(
            storage, m.attempt_id, ok=False, mode="deep", fraction=None, chunks=1
        )
    # A record under another name, or naming another attempt, does not count.
    (tmp_path / "r" / m.attempt_id / "verifications" / "vbogus.json").write_text(
        json.dumps({"format": "portable-ckpt-verification", "ok": False})
    )
    assert len(list_versions(root)[0].verifications) == 2


def test_a_version_whose_record_read_fails_after_listing_is_unclassified_and_kept(
    tmp_path: Path,
) -> None:
    """Mutation audit B M11 (mut-03): a committed version whose commit record cannot be read
    when its ``pck.manager`` entry is fetched (a 503 between the listing and the read) is
    ``classified=False``, which retention always keeps ("unclassified"): taken as classified
    without metrics, keep_last deleted it because of one failed read."""
    from portable_ckpt.errors import StorageError
    from portable_ckpt.manager.retention import RetentionPolicy, plan_retention
    from portable_ckpt.storage.local import LocalStorage

    root = tmp_path / "r"
    for s in (1, 2, 3):
        entry = manager_entry_value(s, "save_every", {"loss": float(s)})
        portable_ckpt.save_arrays(
            str(root), {"w": np.zeros(4, np.float32)}, step=s, entries={"pck.manager": entry}
        )
    ids = [v.id for v in list_versions(root)]
    first = f"{ids[0]}/manifest.json"

    class FlakyAfterListing(LocalStorage):
        reads = 0

        def read_all(self, path: str, *, max_size: int) -> bytes:
            if path == first:
                FlakyAfterListing.reads += 1
                if FlakyAfterListing.reads > 1:  # the listing's read worked, the next fails
                    raise StorageError(f"{path}: a transient read error", path=path)
            return super().read_all(path, max_size=max_size)

    cands = {c.id: c for c in candidates_of(FlakyAfterListing(str(root)))}
    assert FlakyAfterListing.reads == 2
    assert cands[ids[0]].classified is False and cands[ids[0]].committed
    assert cands[ids[1]].classified and cands[ids[1]].metrics == {"loss": 2.0}
    ds = {d.id: d for d in plan_retention(list(cands.values()), RetentionPolicy.build(keep_last=1))}
    assert not ds[ids[0]].delete
    assert any(r.startswith("unclassified") for r in ds[ids[0]].reasons), ds[ids[0]].reasons
    assert ds[ids[1]].delete and not ds[ids[2]].delete


def test_manager_entry_schema_and_value() -> None:
    from portable_ckpt.format.schemas import validate_entry_value

    value = manager_entry_value(5, "save_every", {"loss": 1.5, "nan": float("nan"), "n": 3})
    assert value == {
        "step": 5,
        "reason": "save_every",
        "metrics": {"loss": 1.5, "nan": None, "n": 3},
    }
    validate_entry_value(value, manager_entry_schema(), name="pck.manager")
    with pytest.raises(UsageError):
        manager_entry_value(5, "save_every", {"loss": [1.0]})


def test_metric_names_are_1_to_256_characters() -> None:
    """Mutation audit B M10 (mut-24): metric names of 1-256 characters pass, 0 or 257 are
    refused by maybe_save's own check (PCK-USAGE), not later by the embedded schema."""
    assert manager_entry_value(1, "x", {"a" * 256: 1})["metrics"] == {"a" * 256: 1}
    assert manager_entry_value(1, "x", {"a": 1})["metrics"] == {"a": 1}
    for bad in ("a" * 257, ""):
        with pytest.raises(UsageError, match="1-256 characters"):
            manager_entry_value(1, "x", {bad: 1})


# -- node-local tiers -------------------------------------------------------------------------


def test_node_layout_holders_replicas_and_placement_schema() -> None:
    from portable_ckpt.format.schemas import validate_entry_value
    from portable_ckpt.manager.records import placement_entry_schema
    from portable_ckpt.manager.tiers import NodeLayout, providers

    lay = NodeLayout.contiguous(6, 2, replicas=1)  # nodes {0,1} {2,3} {4,5}
    assert lay.nodes == 3 and lay.node_of_rank == (0, 0, 1, 1, 2, 2)
    assert lay.leader(2) == 4 and lay.ranks_of(1) == [2, 3]
    assert lay.holders(3) == [1, 2] and lay.holders(5) == [2, 0]
    assert lay.holders(0) == [0, 1, 2]  # rank 0's files (global entries) are everywhere
    assert [lay.replica_target(r) for r in range(6)] == [2, 3, 4, 5, 0, 1]
    # Node 1 lost: its writers' files are fetched from node 2, which keeps their replica.
    assert providers(lay, [2, 3, 0], 1) == {2: None, 3: None, 0: None}
    assert providers(NodeLayout.contiguous(4, 2), [2], 0) == {2: 1}
    validate_entry_value(lay.to_json(), placement_entry_schema(), name="pck.placement")
    assert NodeLayout.from_json(lay.to_json()) == lay
    for bad in [(6, 4, 0), (4, 2, 2), (2, 2, 1)]:
        with pytest.raises(UsageError):
            NodeLayout.contiguous(*bad)


def test_absent_by_design_follows_the_placement() -> None:
    """Attack review 5 F4: which missing files a node root lacks by design comes from the
    placement (spec §14.7), not from "no file of that writer is here": files that fit no node
    root spare nothing, and a file of a writer the fitting node holds is damage."""
    from portable_ckpt.io.damage import absent_by_design, holdings

    # 4 ranks on 2 nodes, no replicas; writer 0's files are on every node.
    value = {"nodes": 2, "node_of_rank": [0, 0, 1, 1], "replicas": 0, "everywhere": [0]}
    assert holdings(value) == [{0, 1}, {0, 2, 3}]
    files = {w: {f"data/w{w:05d}-0000.safetensors", f"index/w{w:05d}.json"} for w in range(4)}
    node0 = files[0] | files[1]
    away = files[2] | files[3] | {"entries/dp-1a2b3c4d.r00002.json"}
    assert absent_by_design(value, away, node0) == away  # node 0's root
    lost3 = files[3]  # a durable copy without writer 3: {0, 1, 2} is no node's holdings
    assert absent_by_design(value, lost3, files[0] | files[1] | files[2]) == set()
    lost1 = {"data/w00001-0000.safetensors"}  # node 0's root without a file of its own writer
    assert absent_by_design(value, lost1, node0 - lost1) == set()
    assert absent_by_design(None, away, node0) == set()  # no valid placement: nothing spared
    # A copy that kept writer 0's files only fits both nodes; node 0 leaves fewer held writers
    # without a file, so only what node 0 lacks is spared: writer 1's files are damage (diff
    # review 3 F1: the union over both nodes spared every file).
    only0 = files[0]
    rest = files[1] | files[2] | files[3]
    assert absent_by_design(value, rest, only0) == files[2] | files[3]
    # A writer number in an entry's own name is no writer (diff review 3 F2).
    named = {"entries/w00003-notes-1a2b3c4d.g.json", "entries/w00003.cfg-1a2b3c4d.r00001.json"}
    assert absent_by_design(value, away, node0 | named) == away
    # With one replica per node, node 1 also holds node 0's writers.
    rep = {**value, "replicas": 1}
    assert holdings(rep) == [{0, 1, 2, 3}, {0, 1, 2, 3}]


def test_sync_pins_never_unpins_a_version_it_could_not_read(tmp_path: Path) -> None:
    """Attack review 5 F3: one failed read of a kept version's commit record (an S3 503) made
    its decision "not committed", and the manager removed its pin; a platform gc then
    deleted the keep_every version. A damaged record did the same."""
    import numpy as np

    import portable_ckpt
    from portable_ckpt.errors import StorageError
    from portable_ckpt.io.gc import gc
    from portable_ckpt.io.pins import read_pins
    from portable_ckpt.manager.pinning import sync_pins
    from portable_ckpt.manager.records import candidates_of
    from portable_ckpt.manager.retention import RetentionPolicy, plan_retention
    from portable_ckpt.storage.local import LocalStorage

    root = tmp_path / "r"
    for s in (2, 3, 4, 5):
        portable_ckpt.save_arrays(str(root), {"w": np.zeros(4, np.float32)}, step=s)
    ids = [v.id for v in portable_ckpt.list_versions(root)]
    pol = RetentionPolicy.build(keep_last=1, keep_every=2)
    st = LocalStorage(str(root))
    assert sync_pins(st, plan_retention(candidates_of(st), pol))["pinned"] == [ids[0], ids[2]]

    class Flaky(LocalStorage):
        def read_all(self, path: str, *, max_size: int) -> bytes:
            if path == f"{ids[0]}/manifest.json":
                raise StorageError(f"{path}: a transient read error", path=path)
            return super().read_all(path, max_size=max_size)

    fl = Flaky(str(root))
    assert sync_pins(fl, plan_retention(candidates_of(fl), pol))["unpinned"] == []
    (root / ids[2] / "manifest.json").write_text("{damaged")  # invalid now: kept pinned
    assert sync_pins(st, plan_retention(candidates_of(st), pol))["unpinned"] == []
    assert set(read_pins(root)) == {ids[0], ids[2]}
    assert set(gc(str(root), keep=1, grace_seconds=0).deleted) == {ids[1]}
    # A pinned version removed by hand: the manager's pin names nothing and goes (diff review
    # 3 F10), at the next pass.
    import shutil

    shutil.rmtree(root / ids[0])
    assert sync_pins(st, plan_retention(candidates_of(st), pol))["unpinned"] == [ids[0]]
    assert set(read_pins(root)) == {ids[2]}
    # A version committed and pinned by another manager after this one listed the root is not
    # gone: its pin stays (last review F1).
    from portable_ckpt.io.pins import pin
    from portable_ckpt.manager.pinning import MANAGER_PIN_BY

    planned = plan_retention(candidates_of(st), pol)
    portable_ckpt.save_arrays(str(root), {"w": np.zeros(4, np.float32)}, step=6)
    [v6] = [v.id for v in portable_ckpt.list_versions(root) if v.step == 6]
    pin(str(root), v6, reason="keep_every=2", by=MANAGER_PIN_BY)
    assert sync_pins(st, planned)["unpinned"] == [] and v6 in read_pins(root)




def test_sync_pins_keeps_the_pin_of_an_unlisted_version_when_asking_for_its_record_fails(
    tmp_path: Path,
) -> None:
    """Mutation audit B M07 (mut-09): a manager-pinned version missing from the decisions
    (committed after the listing) is unpinned only when its commit record is known to be
    gone; a storage error asking for it keeps the pin (a platform gc would delete it)."""
    from portable_ckpt.errors import StorageError
    from portable_ckpt.io.pins import pin, read_pins
    from portable_ckpt.manager.pinning import MANAGER_PIN_BY, sync_pins
    from portable_ckpt.storage.local import LocalStorage

    root = tmp_path / "r"
    portable_ckpt.save_arrays(str(root), {"w": np.zeros(4, np.float32)}, step=2)
    [aid] = [v.id for v in list_versions(root)]
    pin(str(root), aid, reason="keep_every=2", by=MANAGER_PIN_BY)

    class ExistsFails(LocalStorage):
        def exists(self, path: str) -> bool:
            if path == f"{aid}/manifest.json":
                raise StorageError(f"{path}: a transient error", path=path)
            return super().exists(path)

    assert sync_pins(ExistsFails(str(root)), []) == {"pinned": [], "unpinned": []}
    assert [r["by"] for r in read_pins(root)[aid]] == [MANAGER_PIN_BY]
    # Asked without the error, the record is there: the pin stays too.
    assert sync_pins(LocalStorage(str(root)), [])["unpinned"] == []


def test_sync_pins_adds_its_own_pin_beside_someone_elses(tmp_path: Path) -> None:
    """Mutation audit B M08 (mut-11): a version keep_every keeps that someone else pinned
    still gets the manager's pin; counted as the manager's, it lost all protection from a
    platform gc once that person unpinned it."""
    from portable_ckpt.io.pins import pin, read_pins, unpin
    from portable_ckpt.manager.pinning import MANAGER_PIN_BY, sync_pins
    from portable_ckpt.manager.retention import RetentionPolicy, plan_retention
    from portable_ckpt.storage.local import LocalStorage

    root = tmp_path / "r"
    for s in (2, 3):
        portable_ckpt.save_arrays(str(root), {"w": np.zeros(4, np.float32)}, step=s)
    ids = [v.id for v in list_versions(root)]
    pin(str(root), ids[0], reason="mine", by="alice")
    st_ = LocalStorage(str(root))
    pol = RetentionPolicy.build(keep_last=1, keep_every=2)
    assert sync_pins(st_, plan_retention(candidates_of(st_), pol)) == {
        "pinned": [ids[0]],
        "unpinned": [],
    }
    assert sorted(r["by"] for r in read_pins(root)[ids[0]]) == sorted([MANAGER_PIN_BY, "alice"])
    unpin(str(root), ids[0], by="alice")
    assert [r["by"] for r in read_pins(root)[ids[0]]] == [MANAGER_PIN_BY]


@given(st.integers(1, 6), st.integers(1, 4), st.integers(0, 1), st.data())
def test_holdings_agree_with_the_managers_node_layout(
    nodes: int, per_node: int, replicas: int, data: st.DataObject
) -> None:
    """io.damage.holdings (the core, no manager import) and NodeLayout.holders say the same."""
    from portable_ckpt.io.damage import holdings
    from portable_ckpt.manager.tiers import NodeLayout

    if replicas and nodes < 2:
        replicas = 0
    world = nodes * per_node
    everywhere = tuple(sorted(data.draw(st.sets(st.integers(0, world - 1), max_size=3))))
    layout = NodeLayout(tuple(r // per_node for r in range(world)), replicas, everywhere)
    held = holdings(layout.to_json())
    for w in range(world):
        assert sorted(n for n in range(nodes) if w in held[n]) == sorted(layout.holders(w))
