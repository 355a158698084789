"""Superseded drill, copy and verification records (spec §14.5, R-DRILL-9; ops review F12).

Every scheduled ``verify`` and every ``copy`` run again added a record to the version for as long
as it was kept, and every listing read them all (2,000 records: ``ls`` 0.5 → 3.7 s). Writers
now prune their kind after writing, and gc prunes the versions it keeps, removing only records
whose removal changes nothing a tool reads from them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from portable_ckpt.cli.main import main as cli_main
from portable_ckpt.io import annotations
from portable_ckpt.io.annotations import (
    RECORDS_KEPT,
    read_annotations,
    superseded,
    write_drill_record,
    write_verification_record,
)
from portable_ckpt.io.copy import copy_version
from portable_ckpt.io.gc import gc
from portable_ckpt.io.versions import list_versions
from portable_ckpt.storage import open_storage

from ._util import build_version

_MODES = ("sample", "deep")
_DESTS = ("s3://a/x", "/mnt/b", "file:///c")


def _status(kind: str, records: list[dict[str, Any]]) -> Any:
    """What tools read from a kind's records (§14.3–14.5)."""
    ok = [r for r in records if r.get("ok") is True]
    if kind == "verifications":
        # A failed record counts unless a passed deep 1.2 record lists it in clears (§14.5).
        cleared = {c for r in ok if r.get("format_version") == "1.2" and r["mode"] == "deep"
                   for c in r.get("clears", ())}
        return (  # which failed records still count, not only whether one does
            sorted(r["n"] for r in records
                   if r.get("ok") is False and r["verification_id"] not in cleared),
            sorted({r["mode"] for r in ok}),
            sorted(r["n"] for r in records if r.get("ok") is False),
        )
    if kind == "copies":
        return sorted({r["destination"] for r in records}), sorted({r["destination"] for r in ok})
    return bool(ok)


@st.composite
def _records(draw: st.DrawFn) -> tuple[str, list[dict[str, Any]]]:
    kind = draw(st.sampled_from(sorted(annotations.ANNOTATION_KINDS)))
    n = draw(st.integers(0, 30))
    out = []
    for i in range(n):  # oldest first, as read_annotations returns them
        rec: dict[str, Any] = {"n": i, "ok": draw(st.booleans())}
        if kind == "verifications":
            rec["mode"] = draw(st.sampled_from(_MODES))
            rec["verification_id"] = f"v{i}"
            rec["format_version"] = "1.0"
            failed = [r["verification_id"] for r in out if r["ok"] is False]
            if rec["ok"] and rec["mode"] == "deep" and failed and draw(st.booleans()):
                # R-DRILL-10: a passed deep record that clears earlier failed ones (1.2)
                rec["format_version"] = "1.2"
                rec["clears"] = draw(st.lists(st.sampled_from(failed), min_size=1, unique=True))
        elif kind == "copies":
            rec["destination"] = draw(st.sampled_from(_DESTS))
        out.append(rec)
    return kind, out


@settings(max_examples=400, deadline=None)
@given(_records())
def test_removing_superseded_records_changes_nothing_tools_read(
    case: tuple[str, list[dict[str, Any]]],
) -> None:
    """R-DRILL-9: drilled, failed, the modes verified and the destinations copied stay; each
    removed record is older than a kept one that serves it; what stays is bounded. A record
    that clears a failed one (R-DRILL-10) stays: without it the version fails again."""
    kind, records = case
    gone = superseded(kind, records)
    kept = [r for r in records if r not in gone]
    assert _status(kind, kept) == _status(kind, records)
    assert kept[-RECORDS_KEPT:] == records[-RECORDS_KEPT:]  # the newest always stay
    for r in gone:
        servers = [k for k in kept if k["n"] > r["n"]]
        if kind == "verifications":
            assert r["ok"] is True  # a failed verification is never removed
            servers = [k for k in servers if k["ok"] is True and k["mode"] == r["mode"]]
        elif kind == "copies":
            servers = [k for k in servers if k["destination"] == r["destination"]
                       and (k["ok"] is True or r["ok"] is not True)]
        elif r["ok"] is True:
            servers = [k for k in servers if k["ok"] is True]
        assert servers, (kind, r, kept)
    failed = sum(r["ok"] is False for r in records)
    clearing = sum(bool(r.get("clears")) for r in records)
    bound = {"verifications": RECORDS_KEPT + len(_MODES) + failed + clearing,
             "copies": RECORDS_KEPT + 2 * len(_DESTS), "drills": RECORDS_KEPT + 1}[kind]
    assert len(kept) <= bound


def _drill(ok: bool, day: int) -> dict[str, Any]:
    return {"ok": ok, "started_at": f"2030-01-0{day}T00:00:00Z",
            "finished_at": f"2030-01-0{day}T00:00:01Z", "world_size": 1, "saved_world_size": 1,
            "contract": "exact", "measurements": {},
            "error": None if ok else {"code": "PCK-STORAGE", "message": "x"}}


def _files(vdir: Path, kind: str) -> list[str]:
    return sorted(p.name for p in (vdir / kind).iterdir()) if (vdir / kind).exists() else []


def test_repeated_verify_copy_and_drill_keep_a_bounded_number_of_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-DRILL-9: a writer prunes its kind after writing; a failed verification stays."""
    vdir, m = build_version(tmp_path / "src")
    storage = open_storage(tmp_path / "src")
    failed = write_verification_record(
        storage, m.attempt_id, ok=False, mode="sample", fraction=0.5, chunks=1,
        errors=[{"code": "PCK-CHECKSUM", "message": "block 0"}],
    )
    for _ in range(9):  # each pass is recorded; the failure still bars it (exit 1)
        assert cli_main(["verify", "--deep", str(vdir)]) == 1
    assert cli_main(["verify", "--sample", "0.5", str(vdir)]) == 1
    capsys.readouterr()
    names = _files(vdir, "verifications")
    assert len(names) <= RECORDS_KEPT + 2 and Path(failed).name in names, names
    recs = read_annotations(storage, m.attempt_id, "verifications")
    assert {r["mode"] for r in recs if r["ok"]} == {"deep", "sample"}
    for _ in range(6):
        copy_version(vdir, tmp_path / "dst")
    copy_version(vdir, tmp_path / "dst2")
    copies = read_annotations(storage, m.attempt_id, "copies")
    assert len(copies) <= RECORDS_KEPT and len(_files(vdir, "copies")) == len(copies)
    assert {Path(c["destination"]).name for c in copies} == {"dst", "dst2"}
    ok_drill = write_drill_record(storage, m.attempt_id, _drill(True, 1))
    for day in range(2, 8):
        write_drill_record(storage, m.attempt_id, _drill(False, day))
    drills = _files(vdir, "drills")
    assert len(drills) == RECORDS_KEPT + 1 and Path(ok_drill).name in drills
    (v,) = list_versions(tmp_path / "src")
    assert v.drilled and v.verification_failed and v.copied


def test_gc_prunes_the_piles_of_kept_versions_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-DRILL-9: records written before writers pruned (or by another tool) are pruned by gc;
    a dry run counts them; files that do not count are never touched."""
    vdir, m = build_version(tmp_path / "r")
    storage = open_storage(tmp_path / "r")
    with monkeypatch.context() as mp:  # a pile as an older release left it
        mp.setattr(annotations, "prune_quietly", lambda *a, **k: None)
        for _ in range(20):
            write_verification_record(storage, m.attempt_id, ok=True, mode="deep",
                                      fraction=None, chunks=3)
        for _ in range(5):
            copy_version(vdir, tmp_path / "dst")
    assert len(_files(vdir, "verifications")) == 20 and len(_files(vdir, "copies")) == 5
    (vdir / "verifications" / "notes.txt").write_text("an operator's file")
    misfiled = json.loads(next((vdir / "verifications").glob("v*.json")).read_text())
    (vdir / "verifications" / "v20000101T000000000000Z-00000000.json").write_text(
        json.dumps(misfiled))  # valid, but not under its own id: does not count
    before = sorted(p.name for p in vdir.rglob("*"))
    assert cli_main(["gc", str(tmp_path / "r"), "--keep", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would remove 17 superseded" in out, out  # 16 verifications + 1 copy
    assert sorted(p.name for p in vdir.rglob("*")) == before
    rep = gc(tmp_path / "r", keep=1)
    assert rep.pruned_records == 17 and rep.to_json()["pruned_records"] == 17
    assert len(_files(vdir, "verifications")) == RECORDS_KEPT + 2  # + the two that do not count
    assert (vdir / "verifications" / "notes.txt").exists()
    assert (vdir / "verifications" / "v20000101T000000000000Z-00000000.json").exists()
    assert len(_files(vdir, "copies")) == RECORDS_KEPT
    (v,) = list_versions(tmp_path / "r")
    assert v.verified and v.copied
    assert gc(tmp_path / "r", keep=1).pruned_records == 0


# -- Repeated failures (SRE review 2, W1): the writer of a failed record prunes the failures it
# read before storing it, all but the oldest. A model of tools running at once on one version's
# records, each step of each tool interleaved at random: failure writers (read, store, read,
# prune), clearings (read the failures, store the clearing record, move what it clears) and
# pruners (read, prune). Clocks disagree: each record's verified_at is drawn.


@st.composite
def _interleaving(draw: st.DrawFn) -> list[tuple[int, str]]:
    tools = draw(st.lists(st.sampled_from(["fail", "fail", "clear", "prune"]), min_size=1,
                          max_size=7))
    steps = {"fail": 4, "clear": 3, "prune": 2}
    left = {i: steps[t] for i, t in enumerate(tools)}
    order: list[tuple[int, str]] = []
    while left:
        i = draw(st.sampled_from(sorted(left)))
        order.append((i, tools[i]))
        left[i] -= 1
        if not left[i]:
            del left[i]
    return order


def _failure_record(n: int, day: int) -> dict[str, Any]:
    return {"verification_id": f"v{n:03d}", "verified_at": f"2026-01-{day:02d}T00:00:00Z",
            "ok": False, "mode": "sample", "format_version": "1.0", "n": n}


@settings(max_examples=600, deadline=None)
@given(_interleaving(), st.data())
def test_a_version_stays_failed_until_a_clearing_that_began_after_its_last_failure(
    order: list[tuple[int, str]], data: st.DataObject,
) -> None:
    """R-DRILL-9, R-DRILL-10: whatever the interleaving and the clocks, the version has failed
    verification exactly when a failure was stored after the last read of every clearing that
    stored its record; and the failed records a writer leaves are bounded."""
    from portable_ckpt.io.annotations import failed_verifications, repeated_failures

    store: dict[str, dict[str, Any]] = {}
    state: dict[int, dict[str, Any]] = {}
    clock = 0  # real time: one tick a step
    failures_at: list[int] = []
    cleared_after: list[int] = []  # when each clearing that stored its record read

    def view() -> list[dict[str, Any]]:
        return sorted(store.values(), key=lambda r: (r["verified_at"], r["verification_id"]))

    for i, tool in order:
        clock += 1
        st_ = state.setdefault(i, {"step": 0})
        step = st_["step"]
        st_["step"] += 1
        if tool == "fail":
            if step == 0:
                st_["before"] = view()
            elif step == 1:
                rec = _failure_record(clock, data.draw(st.integers(1, 28)))
                store[rec["verification_id"]] = rec
                st_["rec"] = rec
                failures_at.append(clock)
            elif step == 2:
                st_["view"] = view()
            else:
                rep = repeated_failures(st_["before"], st_["rec"])
                for r in superseded("verifications", st_["view"], repeated=rep):
                    store.pop(r["verification_id"], None)
        elif tool == "clear":
            if step == 0:
                st_["read"] = [r["verification_id"] for r in failed_verifications(view())]
                st_["at"] = clock
            elif step == 1:
                if st_["read"]:
                    vid = f"v{clock:03d}"
                    store[vid] = {"verification_id": vid, "ok": True, "mode": "deep",
                                  "format_version": "1.2", "clears": st_["read"],
                                  "verified_at": f"2026-01-{data.draw(st.integers(1, 28)):02d}"
                                                 "T00:00:00Z", "n": clock}
                    cleared_after.append(st_["at"])
            else:
                for vid in st_["read"]:  # the move out of verifications/ (read: it stored)
                    store.pop(vid, None)
        else:
            if step == 0:
                st_["view"] = view()
            else:
                for r in superseded("verifications", st_["view"]):
                    store.pop(r["verification_id"], None)
    expected = any(t > max(cleared_after, default=0) for t in failures_at)
    assert bool(failed_verifications(view())) == expected, (order, view())
    writers = sum(t == "fail" for _, t in order) // 4
    assert len(failed_verifications(view())) <= writers  # never more than were written


def test_a_cron_that_finds_the_same_damage_every_hour_leaves_a_bounded_number_of_records(
    tmp_path: Path,
) -> None:
    """SRE review 2, W1: 20 failed verifications of one version left 20 records, read by every
    listing; the writer of each now prunes the failures before it, all but the oldest."""
    vdir, _ = build_version(tmp_path / "r")
    root = vdir.parent
    storage = open_storage(root)
    ids = []
    for _ in range(20):
        path = write_verification_record(
            storage, vdir.name, ok=False, mode="sample", fraction=0.5, chunks=1,
            errors=[{"code": "PCK-CHECKSUM", "message": "block 3"}])
        ids.append(path.rsplit("/", 1)[1].removesuffix(".json"))
    left = [r["verification_id"] for r in read_annotations(storage, vdir.name, "verifications")]
    assert left == [ids[0], *ids[-RECORDS_KEPT:]]  # the first finding and the newest records
    [v] = [v for v in list_versions(root) if v.id == vdir.name]
    assert v.verification_failed


def test_a_record_the_version_lists_is_never_pruned(tmp_path: Path) -> None:
    """Attack review 12b, B1: a version may list a file below verifications/ (R-FILES-1); the
    pruning deleted it like any superseded record, and the intact version lost a file."""
    from ._util import edit_manifest, rechecksum

    vdir, m = build_version(tmp_path / "r")
    storage = open_storage(vdir.parent)
    first = write_verification_record(storage, m.attempt_id, ok=True, mode="deep",
                                      fraction=1.0, chunks=1)
    rel = first.split("/", 1)[1]
    edit_manifest(vdir, lambda d: d["files"].__setitem__(rel, json.loads(json.dumps(
        next(iter(d["files"].values()))))))
    rechecksum(vdir, rel)
    for _ in range(RECORDS_KEPT + 2):
        write_verification_record(storage, m.attempt_id, ok=True, mode="deep", fraction=1.0,
                                  chunks=1)
    assert (vdir / rel).is_file()
    assert len(_files(vdir, "verifications")) == RECORDS_KEPT + 1


def _plant_passes_dated_ahead(vdir: Path, attempt_id: str, minutes: float = 24 * 60) -> list[str]:
    """RECORDS_KEPT sampled passes dated a day (or ``minutes``) ahead, as a fast clock writes
    them; their names."""
    import datetime as dt

    ahead = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=minutes)
    (vdir / "verifications").mkdir(exist_ok=True)
    planted = []
    for i in range(RECORDS_KEPT):
        vid = f"v20991231T00000000000{i}Z-0000000{i}"
        planted.append(f"{vid}.json")
        (vdir / "verifications" / f"{vid}.json").write_text(json.dumps({
            "format": "portable-ckpt-verification", "format_version": "1.0",
            "attempt_id": attempt_id, "verification_id": vid,
            "verified_at": (ahead + dt.timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "ok": True, "mode": "sample", "fraction": 0.5, "chunks": 1, "seed": 1,
            "errors": []}))
    return planted


def test_passes_dated_ahead_do_not_push_out_the_passes_dated_by_now(tmp_path: Path) -> None:
    """Attack review 12b, B5: four passes dated a day ahead (a fast clock, or planted) made
    every real pass pruned right after it was written; ``ls`` then showed only the one dated
    ahead."""
    vdir, m = build_version(tmp_path / "r")
    storage = open_storage(vdir.parent)
    _plant_passes_dated_ahead(vdir, m.attempt_id)
    path = write_verification_record(storage, m.attempt_id, ok=True, mode="sample",
                                      fraction=0.5, chunks=1, seed=2)
    assert Path(path).name in _files(vdir, "verifications")
    (v,) = list_versions(vdir.parent)
    assert v.last_pass is not None and "clock_ahead" not in v.last_pass


def test_the_newest_records_dated_by_now_stay_as_history_beside_those_dated_ahead(
    tmp_path: Path,
) -> None:
    """R-DRILL-9: a version keeps its RECORDS_KEPT newest records of a kind as history, counted
    by the records' times and again among those dated by now. With as many passes dated ahead
    as that, each real pass written pruned the real ones before it but the newest: three
    sampled passes left one. Test audit 21b, A05: the count among those dated by now was
    masked by the newest pass of each mode, which keeps one."""
    vdir, m = build_version(tmp_path / "r")
    storage = open_storage(vdir.parent)
    planted = _plant_passes_dated_ahead(vdir, m.attempt_id)
    written = [Path(write_verification_record(storage, m.attempt_id, ok=True, mode="sample",
                                              fraction=0.5, chunks=1, seed=s)).name
               for s in (2, 3, 4)]
    assert _files(vdir, "verifications") == sorted([*planted, *written])


def test_dated_ahead_begins_five_minutes_after_now(tmp_path: Path) -> None:
    """mutation audit 22 A-86: a record is dated ahead beyond FUTURE_SLACK_US (5 minutes):
    4 minutes ahead is not, 6 minutes ahead is, and passes dated 6 minutes ahead take none of
    the RECORDS_KEPT places of the passes dated by now."""
    import datetime as dt

    from portable_ckpt.io.annotations import FUTURE_SLACK_US, dated_ahead

    assert FUTURE_SLACK_US == 300_000_000
    now = dt.datetime.now(dt.UTC)
    at = [(now + dt.timedelta(minutes=m)).strftime("%Y-%m-%dT%H:%M:%S.%fZ") for m in (4, 6)]
    assert not dated_ahead(at[0]) and dated_ahead(at[1])
    vdir, m = build_version(tmp_path / "r")
    storage = open_storage(vdir.parent)
    planted = _plant_passes_dated_ahead(vdir, m.attempt_id, minutes=6)
    written = [Path(write_verification_record(storage, m.attempt_id, ok=True, mode="sample",
                                              fraction=0.5, chunks=1, seed=s)).name
               for s in (2, 3, 4)]
    assert _files(vdir, "verifications") == sorted([*planted, *written])


def test_a_deep_failure_is_not_pruned_by_later_sampled_ones(tmp_path: Path) -> None:
    """Maintainer review 5, 3: a deep failure naming three files was pruned by the sampled
    failures after it, each naming one: no record named the other two any more. The newest
    failure of each mode stays."""
    vdir, _ = build_version(tmp_path / "r")
    storage = open_storage(vdir.parent)
    ids = []
    for mode in ("sample", "deep", *["sample"] * 8):
        path = write_verification_record(
            storage, vdir.name, ok=False, mode=mode, fraction=0.5 if mode == "sample" else None,
            chunks=1, errors=[{"code": "PCK-CHECKSUM", "message": f"{mode} finding"}])
        ids.append(path.rsplit("/", 1)[1].removesuffix(".json"))
    left = [r["verification_id"] for r in read_annotations(storage, vdir.name, "verifications")]
    assert ids[1] in left and ids[0] in left and ids[-1] in left, (ids, left)
