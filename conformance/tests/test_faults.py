"""Deliberately broken writers and committers (bad_writer.py): the harness catches every fault.

Each mode is checked where it must be caught — a save case (deep check, byte comparison, the codec,
the system-call trace), an atomic-publish case at a given fault point, or a committer case of the
refusal table — with the message that names the broken rule.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.cases import (
    CONTINUATIONS,
    EXERCISE_BLOCKS,
    STRATUM_RANKS,
    CrashCase,
    EntrySpec,
    SaveCase,
    case_from_json,
    case_to_json,
    save_cases,
)
from conformance.committer import REFUSALS, run_commit_twice, run_refusal, run_wide_commit
from conformance.harness import check_writer, run_crash_case, run_save_case
from conformance.spec import DTYPES
from conformance.trace import tracing_status
from conformance.verify import HarnessFailure

from .conftest import BAD_WRITER, TRACING, adapter, explicit_case, needs_tracing

REFUSAL = {r.name: r for r in REFUSALS}


@pytest.fixture
def bad(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("PCK_BAD_MODE", raising=False)
    return monkeypatch


def test_tracing_is_exercised_in_ci() -> None:
    """CI installs strace (.ci/run): the trace checks below must run there, not skip."""
    if os.environ.get("CI"):
        assert TRACING, tracing_status().detail


def _save(mode: str, bad: pytest.MonkeyPatch, tmp: Path, *, codec: str = "none",
          tables: bool = False, trace: bool = TRACING) -> str:
    bad.setenv("PCK_BAD_MODE", mode)
    case = explicit_case()
    case.codec, case.tensor_table = codec, tables
    with pytest.raises(HarnessFailure) as ei:
        run_save_case(adapter(BAD_WRITER, trace=trace), case, tmp)
    return str(ei.value)


@pytest.mark.parametrize(("mode", "kw", "message"), [
    ("flip", {}, "PCK-CHECKSUM"),  # wrong CRC / flipped bit
    ("swap", {}, "differs"),  # chunk bytes in the wrong order, checksums consistent
    ("table-names", {"tables": True}, "PCK-SHARD-MISMATCH"),  # R-TABLE-7
    ("zstd-as-none", {"codec": "zstd"}, "the codec of a save is binding"),
    ("drop-range", {}, "PCK-COVERAGE-GAP"),  # the committer refuses the gap
    ("write-twice", {}, "PCK-COVERAGE-OVERLAP"),  # writer 1 stores writer 0's rows too
    ("wrong-crc", {}, "PCK-CHECKSUM"),  # CRC-32 where §6 says CRC-32C
])
def test_data_faults(mode: str, kw: dict[str, object], message: str, bad: pytest.MonkeyPatch,
                     fast_tmp: Path) -> None:
    got = _save(mode, bad, fast_tmp, **kw)  # type: ignore[arg-type]
    assert message in got
    if mode == "swap":  # review C13: the bytes stored and expected are shown
        assert re.search(r"stored bytes [0-9a-f]+, expected [0-9a-f]+", got), got
    if message == "PCK-CHECKSUM":  # outside CI review, finding 7: the writer's rule is named
        assert "(R-CKSUM-1: a writer computes each block's CRC-32C" in got, got
    if mode == "write-twice":  # ... and which recorded box is no chunk of the writer's job
        assert "index/w00001.json records 'w' box offsets [0, 0] lengths [2, 3], which is no " \
            "chunk of writer 1's job (its chunks of 'w': offsets [2, 0] lengths [2, 3])" in got, got
        assert "(R-COVER-1:" in got


def test_a_range_recorded_one_element_early_is_named(bad: pytest.MonkeyPatch,
                                                     fast_tmp: Path) -> None:
    """Outside CI review, finding 7: a writer that records a range one element early got only
    the committer's ``PCK-COVERAGE-OVERLAP`` line; the box that differs from the job's chunk,
    and R-COVER-1, are named now."""
    got = _save("range-early", bad, fast_tmp)
    assert "PCK-COVERAGE-OVERLAP" in got
    assert "index/w00001.json records 'w' box offsets [1, 0] lengths [2, 3], which is no chunk " \
        "of writer 1's job (its chunks of 'w': offsets [2, 0] lengths [2, 3])" in got, got
    assert "(R-COVER-1: the writers' ranges cover every element" in got


def test_a_junit_headline_keeps_the_end_of_a_long_message() -> None:
    """Review C6: the JUnit failure attribute was the first 500 characters of the message's
    first line, and the defect, named at its end, was cut away."""
    from conformance.report import _headline

    line = "case " + "x" * 900 + " PCK-CHECKSUM block 3"
    head = _headline(line + "\nmore")
    assert len(head) <= 500 and head.startswith("case xx") and head.endswith("block 3")
    assert _headline("short\nmore") == "short"


@settings(max_examples=20, deadline=None)
@given(codec=st.sampled_from(["none", "zstd"]), data=st.data())
def test_a_codec_stratum_case_exercises_its_codec(codec: str, data: st.DataObject) -> None:
    """Whatever hypothesis draws (its first draw is the empty state), a stratum's case has
    ranges in its codec, an entry in the matching encoding and at least two writers."""
    case: SaveCase = data.draw(save_cases(3, (codec,), exercise=True))
    assert case.codec == codec and any(t.boxes for t in case.tensors) and case.num_writers >= 2
    assert any(e.encoding == ("json+zstd" if codec == "zstd" else "json") for e in case.entries)
    assert {t.dtype for t in case.tensors if t.boxes} == set(DTYPES)  # every dtype, every run
    [blocks] = [t for t in case.tensors if t.key == EXERCISE_BLOCKS]  # > 2 blocks on writer 0
    assert blocks.boxes[0] == ([0], [2000], 0)
    assert len({t.key for t in case.tensors}) == len(case.tensors)
    assert len({e.name for e in case.entries}) == len(case.entries)


@pytest.mark.parametrize(("mode", "message", "seed"), [
    ("zstd-as-none", "the codec of a save is binding", 1),
    ("json-zstd-as-json", "does not match the job", 2),
    ("crc-block-chain", "PCK-CHECKSUM", 3),  # every drawn file fitted one 4 KiB block
    ("one-block", "PCK-SCHEMA", 4),
    ("skip-zero-size", "conformance.empty", 5),  # drawn cases had none at --examples 4 (C10)
])
def test_every_run_saves_each_codec(mode: str, message: str, seed: int, bad: pytest.MonkeyPatch,
                                    fast_tmp: Path) -> None:
    """The smallest run (`--examples 2`, one case per codec) catches a broken zstd path for any
    seed (the property above): the zstd stratum always stores zstd ranges and a json+zstd
    entry. Each stratum also writes a data file of three checksum blocks, so a writer whose
    checksums are right for one block only fails too, and declares a zero-size tensor."""
    bad.setenv("PCK_BAD_MODE", mode)
    with pytest.raises(HarnessFailure) as ei:
        check_writer(BAD_WRITER, examples=2, crash_examples=0, seed=seed, tracing="off",
                     shrink=False, workdir=str(fast_tmp))
    assert message in str(ei.value)


@needs_tracing
@pytest.mark.parametrize(("mode", "message"), [
    ("no-fsync", "its data was not fsync-ed before the writer index was created"),
    ("no-dir-fsync", "name was not made durable by an fsync"),
    ("index-first", "before the writer index was created"),
    ("direct-manifest", "manifest.json was opened for writing"),
    ("rename-publish", "plain rename()"),
    ("no-tmp-fsync", "R-COMMIT-7 step 2"),
    # R-LAYOUT-2 (traceability audit F8): the same bytes written twice, invisible afterwards
    ("overwrite", "opened for writing again (O_WRONLY|O_TRUNC|O_CLOEXEC) after it was made"),
])
def test_trace_faults(mode: str, message: str, bad: pytest.MonkeyPatch, fast_tmp: Path) -> None:
    """Durability and atomic publish, seen in the system calls of the adapter processes."""
    assert message in _save(mode, bad, fast_tmp)


@needs_tracing
def test_a_committer_table_whose_name_is_not_durable(bad: pytest.MonkeyPatch,
                                                     fast_tmp: Path) -> None:
    """R-COMMIT-17: the committer's tensor table is fsynced but its directory is not before
    manifest.json is linked — an error of the trace check (it was a warning before the rule)."""
    message = _save("table-name-unsynced", bad, fast_tmp, tables=True)
    assert "R-COMMIT-17" in message and "tensor-table" in message, message


def test_entry_names_at_the_248_boundary(bad: pytest.MonkeyPatch, fast_tmp: Path) -> None:
    """§12.1's 248 characters fit `.g.json`; a per-rank zstd value needs 16: a writer that
    takes 248 literally fails on a 240-character name (the strategy draws such names)."""
    bad.setenv("PCK_BAD_MODE", "entry-248")
    case = explicit_case()
    case.entries = [EntrySpec("b" * 240, {"id": "pck:json/1"}, "per_rank", "json+zstd",
                              values=[1, 2], policy="modulo")]
    with pytest.raises(HarnessFailure) as ei:
        run_save_case(adapter(BAD_WRITER, trace=False), case, fast_tmp)
    assert "writer 0 failed" in str(ei.value)
    bad.delenv("PCK_BAD_MODE")
    run_save_case(adapter(BAD_WRITER, trace=False), case, fast_tmp / "ok")


@needs_tracing
def test_trace_faults_in_publish_cases(bad: pytest.MonkeyPatch, fast_tmp: Path) -> None:
    """The writers of attempt B that exit 0 are traced too (B always has data to write)."""
    bad.setenv("PCK_BAD_MODE", "index-first")
    a, b = explicit_case(), explicit_case(8)
    a.tensors, a.entries = [], []  # save A has nothing to reorder
    with pytest.raises(HarnessFailure) as ei:
        run_crash_case(adapter(BAD_WRITER), CrashCase(a, b, "commit:before_publish", 0, 0.0),
                       fast_tmp)
    assert "before the writer index was created" in str(ei.value)


def test_trace_faults_pass_untraced(bad: pytest.MonkeyPatch, fast_tmp: Path) -> None:
    """Without tracing the same save passes: what the trace adds is real (and the report says
    "not checked", test_cli.py)."""
    bad.setenv("PCK_BAD_MODE", "no-fsync")
    run_save_case(adapter(BAD_WRITER, trace=False), explicit_case(), fast_tmp)


def _crash(mode: str, fault: str, bad: pytest.MonkeyPatch, tmp: Path, victim: int = 1) -> str:
    bad.setenv("PCK_BAD_MODE", mode)
    a, b = explicit_case(), explicit_case(8)
    with pytest.raises(HarnessFailure) as ei:
        run_crash_case(adapter(BAD_WRITER, trace=False), CrashCase(a, b, fault, victim, 0.0), tmp)
    return str(ei.value)


@pytest.mark.parametrize(("mode", "fault", "message"), [
    ("ignore-fail", "write:mid_data", "exited 0 although asked to fail"),
    ("ignore-fail", "commit:before_publish", "commit exited 0"),
    ("no-writer-check", "write:after_data", "commit exited 0"),
    ("listing-writers", "write:after_data", "expected PCK-WRITER-MISSING"),
    ("wrong-code", "write:after_data", "reported PCK-USAGE"),
    # untraced, the stratified after_data point still catches an index written first
    ("index-first", "write:after_data", "commit exited 0"),
])
def test_publish_faults(mode: str, fault: str, message: str, bad: pytest.MonkeyPatch,
                        fast_tmp: Path) -> None:
    got = _crash(mode, fault, bad, fast_tmp)
    assert message in got
    if fault.startswith("write:") and "although" not in message:  # the rule (CI review, 7)
        assert "(R-COMMIT-4: a committer publishes nothing while" in got, got


def _refuse(mode: str, name: str, bad: pytest.MonkeyPatch, tmp: Path, trace: bool = False) -> str:
    bad.setenv("PCK_BAD_MODE", mode)
    with pytest.raises(HarnessFailure) as ei:
        run_refusal(adapter(BAD_WRITER, trace=trace), REFUSAL[name], tmp)
    return str(ei.value)


@pytest.mark.parametrize("name", ["coverage-gap", "coverage-overlap", "range-out-of-bounds",
                                  "entry-rank-missing", "entry-value-missing",
                                  "data-file-missing", "file-wrong-size"])
def test_committer_that_skips_checks(name: str, bad: pytest.MonkeyPatch, fast_tmp: Path) -> None:
    got = _refuse("skip-checks", name, bad, fast_tmp)
    assert "the committer exited 0" in got
    assert f"(expected {REFUSAL[name].code}, {REFUSAL[name].rule}):" in got, got  # CI review, 7


@pytest.mark.parametrize(("mode", "name", "message"), [
    ("wrong-code", "writer-missing", "reported PCK-USAGE on writer-missing"),
    ("no-error-line", "dtype-conflict", "reported no error code"),
    ("listing-writers", "writer-missing", "expected PCK-WRITER-MISSING"),
    ("rename-publish", "manifest-exists", "the committer exited 0"),
])
def test_committer_faults(mode: str, name: str, message: str, bad: pytest.MonkeyPatch,
                          fast_tmp: Path) -> None:
    assert message in _refuse(mode, name, bad, fast_tmp)


@pytest.mark.parametrize(("name", "code"), [
    ("dtype-conflict", "PCK-METADATA-CONFLICT"),
    ("file-claimed-twice", "PCK-METADATA-CONFLICT"),
    ("duplicate-writer-number", "PCK-SCHEMA"),
])
def test_committer_that_trusts_the_indexes(name: str, code: str, bad: pytest.MonkeyPatch,
                                           fast_tmp: Path) -> None:
    """A committer that merges writer indexes without comparing them (dtype conflict, a file
    claimed twice, two indexes of writer 0) does not report the code of the rule it skipped."""
    message = _refuse("trusting-merge", name, bad, fast_tmp)
    assert f"expected {code}" in message and "no error code" not in message, message


def test_rename_over_own_manifest(bad: pytest.MonkeyPatch, fast_tmp: Path) -> None:
    """A second commit of a committed attempt with rename(): the manifest is replaced."""
    bad.setenv("PCK_BAD_MODE", "rename-publish")
    with pytest.raises(HarnessFailure) as ei:
        run_commit_twice(adapter(BAD_WRITER, trace=False), fast_tmp)
    assert "exited 0 on a second commit" in str(ei.value)


@needs_tracing
def test_conflict_trace_sees_a_touched_manifest(bad: pytest.MonkeyPatch, fast_tmp: Path) -> None:
    """A committer that opens the existing manifest for writing, writes nothing and then
    refuses correctly: bytes and mtime are unchanged, only the trace shows it."""
    bad.setenv("PCK_BAD_MODE", "touch-manifest")
    assert "the existing manifest.json was touched" in _refuse(
        "touch-manifest", "manifest-exists", bad, fast_tmp, trace=True)
    run_refusal(adapter(BAD_WRITER, trace=False), REFUSAL["manifest-exists"], fast_tmp / "u")


@needs_tracing
def test_failed_exclusive_open_is_not_a_touch(bad: pytest.MonkeyPatch, fast_tmp: Path) -> None:
    """direct-manifest's O_EXCL open of an existing manifest fails: not a touch (no false
    alarm), and the committer still reports PCK-COMMIT-CONFLICT."""
    bad.setenv("PCK_BAD_MODE", "direct-manifest")
    run_refusal(adapter(BAD_WRITER), REFUSAL["manifest-exists"], fast_tmp)


# -- errata 4: what an outside CI gate found the harness let through ------------------------------
@pytest.mark.parametrize(("mode", "contract", "mesh"), [
    ("always-statistical", "exact", None),
    ("mesh-invented", "exact", None),
    ("mesh-dropped", "statistical", {"shape": [2], "dim_names": ["dp"]}),
    ("mesh-dropped", "exact", {"shape": [1, 2], "dim_names": ["dp", "tp"]}),
])
def test_the_continuation_is_recorded_as_given(mode: str, contract: str,
                                               mesh: dict[str, object] | None,
                                               bad: pytest.MonkeyPatch, fast_tmp: Path) -> None:
    """FP-1: a committer that records another contract, or drops or invents a mesh, fails the
    save; the same case passes with the committer as it is (R-CONTRACT-1)."""
    case = explicit_case()
    case.contract, case.mesh = contract, mesh
    bad.setenv("PCK_BAD_MODE", mode)
    with pytest.raises(HarnessFailure) as ei:
        run_save_case(adapter(BAD_WRITER, trace=False), case, fast_tmp)
    assert "is not the commit job's" in str(ei.value) and "R-CONTRACT-1" in str(ei.value)
    bad.delenv("PCK_BAD_MODE")
    run_save_case(adapter(BAD_WRITER, trace=False), case, fast_tmp / "ok")


@pytest.mark.parametrize("mode", ["always-statistical", "mesh-dropped", "mesh-invented"])
def test_every_run_asks_for_both_contracts_and_meshes(mode: str, bad: pytest.MonkeyPatch,
                                                      fast_tmp: Path) -> None:
    """The smallest run (`--examples 2`, no committer cases) catches each for any seed: the
    first codec's case asks for statistical with a mesh, the second's for exact without."""
    bad.setenv("PCK_BAD_MODE", mode)
    with pytest.raises(HarnessFailure) as ei:
        check_writer(BAD_WRITER, examples=2, crash_examples=0, seed=11, tracing="off",
                     shrink=False, workdir=str(fast_tmp))
    assert "is not the commit job's" in str(ei.value)


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_drawn_continuations_are_valid_and_varied(data: st.DataObject) -> None:
    """Drawn meshes describe the world size (R-CONTRACT-2); a stratum's continuation is fixed."""
    case: SaveCase = data.draw(save_cases(4))
    assert case.contract in ("exact", "statistical")
    if case.mesh is not None:  # a mesh of the job's world size, not of its writers
        shape, names = case.mesh["shape"], case.mesh["dim_names"]
        assert len(shape) == len(names) and math.prod(shape) == case.ranks()
    for kind in CONTINUATIONS:
        fixed: SaveCase = data.draw(save_cases(3, ("none",), exercise=True,
                                               continuation_kind=kind))
        assert (fixed.contract, fixed.mesh is not None) == kind
    assert {k[0] for k in CONTINUATIONS} == {"exact", "statistical"}
    assert {k[1] for k in CONTINUATIONS} == {True, False}


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_drawn_world_sizes_are_valid_jobs(data: st.DataObject) -> None:
    """Outside review 21b, finding 1: every case had world size = number of writers. Cases now
    draw fewer and more ranks than writers; every per-rank entry has one value per rank of the
    job (R-ENTRY-8); a job of more ranks than writers has none (the protocol gives writer w
    rank w); the first codec stratum always asks for more ranks than writers."""
    case: SaveCase = data.draw(save_cases(4))
    for e in case.entries:
        if e.scope == "per_rank":
            assert len(e.values) == case.ranks() <= case.num_writers
    assert case.continuation()["world_size"] == case.ranks() >= 1
    first: SaveCase = data.draw(save_cases(3, ("none",), exercise=True,
                                           rank_kind=STRATUM_RANKS[0]))
    assert first.ranks() > first.num_writers and first.world_size == first.ranks()
    assert not any(e.scope == "per_rank" for e in first.entries)
    one: SaveCase = data.draw(save_cases(1, rank_kind="fewer"))  # impossible: one per writer
    assert one.ranks() == one.num_writers == 1


def test_world_sizes_of_every_kind_are_drawn() -> None:
    """Random cases draw all three relations of world size and writers (a property above
    holds for each; this checks that each occurs)."""
    from hypothesis import find

    for pred in (lambda c: c.ranks() == c.num_writers, lambda c: c.ranks() < c.num_writers,
                 lambda c: c.ranks() > c.num_writers and c.mesh is not None,
                 lambda c: c.ranks() < c.num_writers
                 and any(e.scope == "per_rank" for e in c.entries)):
        find(save_cases(4), pred, settings=settings(database=None, max_examples=2000))


def test_write_jobs_carry_the_jobs_world_size(fast_tmp: Path) -> None:
    """The write jobs say the job's world size, and rank r of a per-rank entry goes to writer
    r mod num_writers (with as many writers as ranks: rank w to writer w)."""
    import json

    from conformance.cases import rank_writer
    from conformance.jobs import commit_job, write_jobs

    case = explicit_case()
    case.world_size = 1  # two writers, one rank: writer 1 stores no per-rank value
    case.entries.append(EntrySpec("rng", {"id": "pck:json/1"}, "per_rank", "json",
                                  values=[{"r": 0}], policy="modulo"))
    jobs = [json.loads(p.read_text()) for p in write_jobs(case, fast_tmp, fast_tmp, "a")]
    assert [j["world_size"] for j in jobs] == [1, 1] and [j["num_writers"] for j in jobs] == [2, 2]
    assert [[e.get("rank") for e in j["entries"] if e["name"] == "rng"] for j in jobs] == [[0], []]
    commit = json.loads(commit_job(case, fast_tmp, fast_tmp, "a").read_text())
    assert commit["writers"] == [0, 1] and commit["continuation"]["world_size"] == 1
    assert [rank_writer(r, 2) for r in range(5)] == [0, 1, 0, 1, 0]


def test_a_committer_that_takes_the_writers_for_the_world_size(bad: pytest.MonkeyPatch,
                                                              fast_tmp: Path) -> None:
    """Outside review 21b, finding 1 (HIGH): a committer that records
    ``continuation.world_size = len(writers)`` and checks per-rank entries against that count
    passed every case. The smallest run (`--examples 2`) fails it for any seed (the first
    stratum has more ranks than writers), and so do both committer cases of a job of 3 ranks
    and 2 writers; the unmodified committer passes them."""
    bad.setenv("PCK_BAD_MODE", "ws-from-writers")
    with pytest.raises(HarnessFailure) as ei:
        check_writer(BAD_WRITER, examples=2, crash_examples=0, seed=21, tracing="off",
                     shrink=False, workdir=str(fast_tmp / "run"))
    assert "world_size" in str(ei.value), ei.value
    with pytest.raises(HarnessFailure) as ei:
        run_wide_commit(adapter(BAD_WRITER, trace=False), fast_tmp / "wide")
    assert "refused a conforming attempt" in str(ei.value) and "PCK-ENTRY-MISSING" in str(ei.value)
    assert "the committer exited 0" in _refuse("ws-from-writers",
                                               "entry-rank-missing-beyond-writers", bad,
                                               fast_tmp / "missing")
    bad.delenv("PCK_BAD_MODE")
    case, _, _ = run_wide_commit(adapter(BAD_WRITER, trace=False), fast_tmp / "ok")
    assert case.ranks() == 3 and case.num_writers == 2
    run_refusal(adapter(BAD_WRITER, trace=False), REFUSAL["entry-rank-missing-beyond-writers"],
                fast_tmp / "ok-missing")


def test_an_old_case_json_replays_with_the_old_continuation() -> None:
    """case.json written before the continuation was drawn: exact, no mesh."""
    old = case_to_json(explicit_case())
    del old["contract"], old["mesh"]
    case = case_from_json(old)
    assert isinstance(case, SaveCase) and case.continuation() == {
        "contract": "exact", "world_size": 2, "mesh": None}


@pytest.mark.parametrize("trace", [False, True])
def test_symlinked_values_fail_the_save(trace: bool, bad: pytest.MonkeyPatch,
                                        fast_tmp: Path) -> None:
    """FP-5: entry values stored as symbolic links to files in the attempt (R-SEC-2) fail the
    save with tracing off, and with tracing on the message names the link, not an fsync."""
    if trace and not TRACING:
        pytest.skip("no strace")
    message = _save("symlink-values", bad, fast_tmp, trace=trace)
    assert "PCK-PATH-UNSAFE" in message and "R-SEC-2" in message, message


def test_declarations_are_compared_as_json(bad: pytest.MonkeyPatch, fast_tmp: Path) -> None:
    """FP-7: an embedded schema recorded with `1` for `true` is not the job's declaration
    (Python's `==` calls them equal)."""
    assert {"not": {"const": 1}} == {"not": {"const": True}}
    case = explicit_case()
    case.entries = [EntrySpec("cfg", {"json_schema": {"not": {"const": True}}}, "global",
                              "json", value={"a": 1})]
    bad.setenv("PCK_BAD_MODE", "schema-true-as-1")
    with pytest.raises(HarnessFailure) as ei:
        run_save_case(adapter(BAD_WRITER, trace=False), case, fast_tmp)
    assert "does not match the job" in str(ei.value)


def test_the_report_says_how_long_minimising_took(bad: pytest.MonkeyPatch, fast_tmp: Path) -> None:
    """One systematic defect cost an adopter 885 s of shrinking that no case's seconds showed:
    the report has ``shrink_seconds`` per suite, bounded by ``shrink_time``."""
    from conformance.harness import Options, run_suite
    from conformance.report import RunReport

    bad.setenv("PCK_BAD_MODE", "flip")
    report = RunReport("writer", BAD_WRITER)
    run_suite(BAD_WRITER, Options(examples=4, crash_examples=0, committer=False, seed=5,
                                  workdir=str(fast_tmp), tracing="off", shrink_time=2.0), report)
    assert report.failures
    spent = report.info["shrink_seconds"]["writer.save"]
    assert 0 <= spent <= 2.0 + 60  # the bound, plus the one case running when it passed
    assert report.to_json()["shrink_seconds"] == report.info["shrink_seconds"]


def test_the_checkers_warnings_reach_the_writers_report(bad: pytest.MonkeyPatch,
                                                        fast_tmp: Path) -> None:
    """A durable file of the attempt that ``files`` does not list (R-FILES-1) passed with no
    word: ``check`` warned, the writer suite dropped its warnings (adopter review F3)."""
    bad.setenv("PCK_BAD_MODE", "stray-file")
    # In the harness only the writer under test wrote the attempt: a failure, not a warning
    # (traceability audit F1: the writer passed).
    with pytest.raises(HarnessFailure, match=r"writer rule broken: .*<attempt>.* is not listed"):
        run_save_case(adapter(BAD_WRITER, trace=False), explicit_case(), fast_tmp)


def test_an_entry_value_difference_is_pointed_at(bad: pytest.MonkeyPatch, fast_tmp: Path) -> None:
    """Integers stored as floats gave a 900-character dump of both values (adopter review F10):
    the message names the JSON path and both types."""
    case = explicit_case()
    case.entries = [EntrySpec("cfg", {"id": "pck:json/1"}, "global", "json",
                              value={"a": [1, {"b": 7}], "c": "x"})]
    bad.setenv("PCK_BAD_MODE", "int-as-float")
    with pytest.raises(HarnessFailure) as ei:
        run_save_case(adapter(BAD_WRITER, trace=False), case, fast_tmp)
    msg = str(ei.value)
    assert "entry 'cfg': the stored value differs at ['a'][0]: got number 1.0, expected " \
           "integer 1" in msg, msg


@needs_tracing
def test_a_stray_file_after_the_index_is_a_stray_file(bad: pytest.MonkeyPatch,
                                                      fast_tmp: Path) -> None:
    """A durable file left beside the index after it was written failed for "not made durable
    before the writer index was created" (adopter review F9): it is a file the index does not
    list: R-FILES-1, a failure of the writer under test (traceability audit F1; it was a
    warning). A listed file made after the index fails otherwise (``index-first``, above)."""
    bad.setenv("PCK_BAD_MODE", "partial-after-index")
    with pytest.raises(HarnessFailure, match=r"index/w0000[01].json.partial' is not listed"):
        run_save_case(adapter(BAD_WRITER, trace=True), explicit_case(), fast_tmp)


@needs_tracing
@pytest.mark.parametrize("mode", ["", "write-outside"])
def test_writes_outside_root_are_named(mode: str, bad: pytest.MonkeyPatch,
                                       fast_tmp: Path) -> None:
    """A writer that appends to a file beside root passed with no word, though the trace shows
    the write (adopter review F5): the report warns and names the file. The reference
    adapter's own run (mode "") writes nothing outside root, its bytecode caches aside."""
    bad.setenv("PCK_BAD_MODE", mode)
    details: dict[str, object] = {}
    run_save_case(adapter(BAD_WRITER, trace=True), explicit_case(), fast_tmp, details=details)
    warned = [w for w in details.get("warnings", []) if "outside root" in w]  # type: ignore[attr-defined]
    if not mode:
        assert warned == [], warned
        return
    assert warned and all(w.startswith("writer ") for w in warned), warned
    assert all(str(fast_tmp / "mywriter-scratch.log") in w for w in warned), warned


@pytest.mark.parametrize(("mode", "passes"), [("", True), ("ignore-same-step", False)])
def test_a_second_version_of_a_step_commits_after_the_first(
    mode: str, passes: bool, bad: pytest.MonkeyPatch, fast_tmp: Path
) -> None:
    """R-COMMIT-16 was never tested (adopter review F2): a committer that takes committed_at
    from its clock alone passed, though after an NTP step back its new save sorts before the
    step's older one."""
    from conformance.committer import run_commit_same_step

    bad.setenv("PCK_BAD_MODE", mode)
    if passes:
        run_commit_same_step(adapter(BAD_WRITER, trace=False), fast_tmp)
        return
    with pytest.raises(HarnessFailure, match="R-COMMIT-16"):
        run_commit_same_step(adapter(BAD_WRITER, trace=False), fast_tmp)



def test_a_reopen_without_a_write_is_no_overwrite() -> None:
    """R-LAYOUT-2 in the trace (review of the change D6): a writer that reopens its own file
    O_RDWR to fsync it overwrites nothing; a write after such a reopen, or O_TRUNC, does."""
    from conformance.trace import FsEvent, overwrite_problems

    a = "/r/att"
    made = FsEvent("open", f"{a}/data/f", 0, 1, flags="O_WRONLY|O_CREAT|O_EXCL")
    fsync_only = [made, FsEvent("write", f"{a}/data/f", 1, 2),
                  FsEvent("open", f"{a}/data/f", 3, 4, flags="O_RDWR"),
                  FsEvent("sync", f"{a}/data/f", 4, 5)]
    assert overwrite_problems(fsync_only, a) == []
    rewrite = [*fsync_only, FsEvent("write", f"{a}/data/f", 6, 7)]
    assert ["written again" in p for p in overwrite_problems(rewrite, a)] == [True]
    trunc = [made, FsEvent("open", f"{a}/data/f", 3, 4, flags="O_WRONLY|O_TRUNC")]
    assert ["O_TRUNC" in p for p in overwrite_problems(trunc, a)] == [True]


def test_the_kept_failure_is_the_minimal_example(bad: pytest.MonkeyPatch,
                                                 fast_tmp: Path) -> None:
    """Outside review 21b, finding 16: the kept case of a failing stratum was a random state
    (step 5799, 3 writers) after the whole --shrink-time: hypothesis' explain phase ran random
    variations of the minimal example after shrinking, each a whole save, and the last failing
    one was reported. Without that phase the report is the minimal example (a stratum keeps
    the tensors it adds: those do not shrink). The shrink budget is a cap, not a wait: 4 s
    did not reach the minimal example on a loaded machine (a flaky failure, stop 22)."""
    from conformance.harness import Options, run_suite
    from conformance.report import RunReport

    bad.setenv("PCK_BAD_MODE", "wrong-crc")
    report = RunReport("writer", [])
    run_suite(BAD_WRITER, Options(examples=2, crash_examples=0, committer=False, seed=7,
                                  workdir=str(fast_tmp), tracing="off", shrink_time=60), report)
    (failure,) = report.failures
    # the codec stratum's three tensors and one of every other dtype of §7 (float32 is one)
    n = 3 + len(DTYPES) - 1
    assert failure.message.startswith("step 0: 2 writer(s) for 3 rank(s), codec none, "
                                      f"{n} tensor(s), 1 entr(y/ies): "), failure.message


def test_a_name_not_made_durable_names_its_directory() -> None:
    """Outside review 21b, finding 11: an attempt directory whose name the writer never made
    durable in the root was reported as "not made durable by an fsync of ./", which reads as
    the working directory. The root is named by its absolute path; a directory inside it by
    its path below the root."""
    from conformance.trace import FsEvent, writer_problems

    root, aid = "/abs/ckpt-root", "s000000000001-20260101T000000000000Z-0123456789abcdef"
    a = f"{root}/{aid}"
    index = f"{a}/index/w00000.json"
    events = [FsEvent("mkdir", a, 0, 1), FsEvent("mkdir", f"{a}/index", 1, 2),
              FsEvent("sync", a, 2, 3),  # the attempt directory, after index/: not the root
              FsEvent("open", index, 3, 4, flags="O_WRONLY|O_CREAT|O_EXCL"),
              FsEvent("write", index, 4, 5), FsEvent("sync", index, 5, 6)]
    problems = writer_problems(events, root, aid, 0, 10)
    assert any(f"{aid}: the new directory name was not made durable by an fsync of the root "
               f"{root} before the writer exited" in p for p in problems), problems
    assert any(f"index/w00000.json: the new file name was not made durable by an fsync of its "
               f"directory {aid}/index/ " in p for p in problems), problems
    assert not any(" ./ " in p for p in problems), problems


def test_a_killed_committers_temporary_manifest_is_no_writer_breach() -> None:
    """A committer killed while publishing leaves ``manifest.json.<hex>.tmp`` (R-COMMIT-7), which
    readers ignore (R-COMMIT-10): the rerun's version is not failed for it (R-FILES-1)."""
    from conformance.verify import _TEMP_MANIFEST, _WRITER_RULES

    tmp = "<attempt>: 'manifest.json.9e44dcb75e45cf06.tmp' is not listed in files"
    stray = "<attempt>: 'data/.w00000-0000.lock' is not listed in files"
    assert _WRITER_RULES.search(tmp) and _TEMP_MANIFEST.search(tmp)
    assert _WRITER_RULES.search(stray) and not _TEMP_MANIFEST.search(stray)


def test_descriptors_that_are_no_files_are_not_writes_outside_root() -> None:
    """An adapter started through a shell wrapper (a pyenv shim) writes to pipes: 52 warnings
    "wrote outside root: pipe:[864478]" in one passing run (review C7). Files still count."""
    from conformance.trace import FsEvent, outside_writes

    events = [FsEvent("write", p, 0.0, 0.0) for p in (
        "pipe:[864478]", "socket:[12]", "anon_inode:[eventfd]", "/root/x/file", "/tmp/pipe:[1]")]
    assert outside_writes(events, "/root/ck") == ["/root/x/file", "/tmp/pipe:[1]"]
