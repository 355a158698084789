"""Committer test mode: crafted writer output for every refusal of spec §4.2, and commit conflicts.

The harness writes the files and writer indexes of an attempt itself (:mod:`conformance.craft`),
breaks exactly one rule, and runs the committer under test on it with a commit job. The committer
has to exit non-zero, report the exact code (the last ``{"error": {"code": ...}}`` line of its
standard output) and publish nothing; with a ``manifest.json`` already there it has to report
``PCK-COMMIT-CONFLICT`` and leave that file as it was (bytes, inode, modification time; under
tracing, no call that writes, renames or removes it). Positive cases make sure the committer
commits what a conforming writer may write (a tensor declared without ranges by a writer that
stores none of it, spec §14.1; a zero-size tensor declared by two writers; a job of more ranks
than writers, one writer holding the per-rank values of two ranks).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.cases import EntrySpec, SaveCase, TensorSpec, new_attempt_id
from conformance.craft import Crafted, craft_attempt
from conformance.jobs import commit_job
from conformance.procs import Adapter, Outcome
from conformance.reader import timestamp_key
from conformance.trace import (
    FsEvent,
    committer_problems,
    conflict_problems,
    fs_events,
    parse_trace,
)
from conformance.verify import HarnessFailure, verify_saved

__all__ = ["REFUSALS", "WIDE_WORLD_SIZE", "Refusal", "base_case", "run_commit_twice",
           "run_refusal", "run_valid_commit", "run_wide_commit", "widen"]


def base_case(tables: bool = False) -> SaveCase:
    """Two writers: a row-split matrix, a vector, a 0-d and a zero-size tensor, two entries.

    The commit job asks for ``exact`` without a mesh; with ``tables``, for ``statistical`` with
    a 1-d mesh (the committer records either as given, R-CONTRACT-1).
    """
    return SaveCase(
        step=1000, num_writers=2, codec="none",
        tensors=[
            TensorSpec("layer.w", "float32", [4, 6], 11,
                       [([0, 0], [2, 6], 0), ([2, 0], [1, 6], 1), ([3, 0], [1, 6], 1)]),
            TensorSpec("layer.b", "int64", [6], 12, [([0], [6], 1)]),
            TensorSpec("scalar", "float64", [], 13, [([], [], 0)]),
            TensorSpec("empty", "bfloat16", [0, 3], 14, [], declared_by=0),
        ],
        entries=[EntrySpec("meta", {"id": "pck:json/1"}, "global", "json", value={"epoch": 3},
                           writer=0),
                 EntrySpec("rng", {"json_schema": {"type": "object"}}, "per_rank", "json+zstd",
                           values=[{"seed": 1}, {"seed": 2}], policy="modulo")],
        tensor_table=tables, table_codec="none",
        contract="statistical" if tables else "exact",
        mesh={"shape": [2], "dim_names": ["dp"]} if tables else None)


#: the world size of the committer cases whose job has more ranks than its two writers
WIDE_WORLD_SIZE = 3


def widen(case: SaveCase) -> None:
    """Make ``case`` a job of :data:`WIDE_WORLD_SIZE` ranks saved by its two writers.

    The per-rank entry ``rng`` gets a value per rank; writer 0 stores ranks 0 and 2, writer 1
    rank 1 (:func:`~conformance.cases.rank_writer`: one writer per node holds several ranks'
    state). The commit job gives the world size (and a mesh of it) apart from the list of
    writers, as R-COMMIT-5 has it: a committer that takes ``len(writers)`` for the world size
    records the wrong ``continuation`` and checks R-ENTRY-8 against the wrong count.
    """
    case.world_size = WIDE_WORLD_SIZE
    rng = next(e for e in case.entries if e.name == "rng")
    rng.values = [{"seed": r + 1} for r in range(WIDE_WORLD_SIZE)]
    case.mesh = {"shape": [WIDE_WORLD_SIZE], "dim_names": ["dp"]}


def _drop_rank2(c: Crafted) -> None:
    """Writer 0 leaves out rank 2 of ``rng``: complete for two ranks, not for three."""
    w0 = c.writers[0]
    values = w0.index["entries"]["rng"]["values"]
    gone = next(v for v in values if v["rank"] == 2)
    values.remove(gone)
    w0.files.pop(gone["file"])
    w0.index["files"].pop(gone["file"])


def _tensor(case: SaveCase, key: str) -> TensorSpec:
    return next(t for t in case.tensors if t.key == key)


def _boxes(key: str, boxes: list[tuple[list[int], list[int], int]]) -> Callable[[SaveCase], None]:
    def mutate(case: SaveCase) -> None:
        _tensor(case, key).boxes = boxes
    return mutate


def _index(w: int, fn: Callable[[dict[str, Any]], None]) -> Callable[[Crafted], None]:
    def edit(c: Crafted) -> None:
        fn(c.writers[w].index)
    return edit


def _extra_value(name: str, rank: int | None) -> Callable[[Crafted], None]:
    """Writer 1 stores a second value of ``name`` (rank ``rank``) in a file of its own."""
    def edit(c: Crafted) -> None:
        w0, w1 = c.writers
        tag = "g" if rank is None else f"r{rank:05d}"
        rel = f"entries/{name}.{tag}.w1.json" + (".zst" if name == "rng" else "")
        src = next(v["file"] for v in w0.index["entries"][name]["values"]
                   if v.get("rank") == rank)
        w1.add_file(rel, w0.files[src])
        decl = copy.deepcopy(w0.index["entries"][name])
        d = w1.index["entries"].setdefault(name, {**decl, "values": []})
        d["values"].append({"file": rel} if rank is None else {"rank": rank, "file": rel})
    return edit


def _drop_rank1(c: Crafted) -> None:
    w1 = c.writers[1]
    for v in w1.index["entries"].pop("rng")["values"]:
        w1.files.pop(v["file"])
        w1.index["files"].pop(v["file"])


def _claim_w0_file(c: Crafted) -> None:
    rel = "data/w00000-0000.safetensors"
    c.writers[1].index["files"][rel] = copy.deepcopy(c.writers[0].index["files"][rel])


def _declare_ghost(c: Crafted) -> None:
    c.writers[0].index["tensors"]["ghost"] = {"dtype": "float32", "shape": [2, 2], "ranges": []}


def _remove(rel: str) -> Callable[[Path], None]:
    return lambda adir: (adir / rel).unlink()


def _grow(rel: str) -> Callable[[Path], None]:
    def after(adir: Path) -> None:
        with open(adir / rel, "ab") as f:
            f.write(b"\0")
    return after


def _existing_manifest(adir: Path) -> None:
    (adir / "manifest.json").write_bytes(b'{"conformance": "a manifest.json that was here '
                                         b'first; the committer must leave it untouched"}\n')


@dataclass(frozen=True)
class Refusal:
    """One committer case: a single broken rule of §4.2 and the code it must produce."""

    name: str
    code: str
    rule: str
    what: str
    mutate: Callable[[SaveCase], None] | None = None  # change the state before crafting
    edit: Callable[[Crafted], None] | None = None  # change writer indexes / files
    after: Callable[[Path], None] | None = None  # change the attempt on disk
    skip_index: tuple[int, ...] = ()


_W1 = "data/w00001-0000.safetensors"
#: every refusal of spec §4.2 (and R-INDEX-3/4, R-COMMIT-9) the committer mode runs.
REFUSALS: tuple[Refusal, ...] = (
    Refusal("writer-missing", "PCK-WRITER-MISSING", "R-COMMIT-4", "writer 1 wrote its files but "
            "no index", skip_index=(1,)),
    Refusal("dtype-conflict", "PCK-METADATA-CONFLICT", "R-INDEX-4", "writers give layer.w "
            "different dtypes", edit=_index(1, lambda i: i["tensors"]["layer.w"].update(
                dtype="float16"))),
    Refusal("shape-conflict", "PCK-METADATA-CONFLICT", "R-INDEX-4", "writers give layer.w "
            "different shapes", edit=_index(1, lambda i: i["tensors"]["layer.w"].update(
                shape=[5, 6]))),
    Refusal("entry-declaration-conflict", "PCK-METADATA-CONFLICT", "R-INDEX-4", "writers declare "
            "rng with different world_size_policy", edit=_index(1, lambda i: i["entries"]["rng"]
                                                                .update(world_size_policy="rank0"))),
    Refusal("file-claimed-twice", "PCK-METADATA-CONFLICT", "R-INDEX-4", "writer 1's index also "
            "lists writer 0's data file", edit=_claim_w0_file),
    Refusal("global-value-twice", "PCK-METADATA-CONFLICT", "R-INDEX-4", "two writers store a "
            "value of the global entry meta", edit=_extra_value("meta", None)),
    Refusal("rank-value-twice", "PCK-METADATA-CONFLICT", "R-INDEX-4", "two writers store rank 0 "
            "of the per-rank entry rng", edit=_extra_value("rng", 0)),
    Refusal("duplicate-writer-number", "PCK-SCHEMA", "R-INDEX-3", "index/w00001.json says "
            "writer 0", edit=_index(1, lambda i: i.update(writer=0))),
    Refusal("attempt-id-mismatch", "PCK-ATTEMPT-ID", "R-INDEX-3", "writer 1's index names "
            "another attempt", edit=_index(1, lambda i: i.update(
                attempt_id="s000000001000-20260101T000000000000Z-00000000000000ff"))),
    Refusal("coverage-gap", "PCK-COVERAGE-GAP", "R-COMMIT-4", "row 3 of layer.w is stored by "
            "nobody", mutate=_boxes("layer.w", [([0, 0], [2, 6], 0), ([2, 0], [1, 6], 1)])),
    Refusal("declared-tensor-gap", "PCK-COVERAGE-GAP", "R-INDEX-2", "a tensor declared without "
            "ranges that no writer stores", edit=_declare_ghost),
    Refusal("coverage-overlap", "PCK-COVERAGE-OVERLAP", "R-COMMIT-4", "row 1 of layer.w is "
            "stored twice", mutate=_boxes("layer.w", [([0, 0], [2, 6], 0), ([1, 0], [2, 6], 1),
                                                      ([3, 0], [1, 6], 1)])),
    Refusal("range-out-of-bounds", "PCK-RANGE-BOUNDS", "R-COMMIT-4", "a box of layer.w reaches "
            "row 4 of 4 rows", mutate=_boxes("layer.w", [([0, 0], [2, 6], 0),
                                                         ([2, 0], [1, 6], 1),
                                                         ([3, 0], [2, 6], 1)])),
    Refusal("entry-rank-missing", "PCK-ENTRY-MISSING", "R-COMMIT-4", "rank 1 of the per-rank "
            "entry rng has no value", edit=_drop_rank1),
    Refusal("entry-rank-missing-beyond-writers", "PCK-ENTRY-MISSING", "R-ENTRY-8",
            f"the job has {WIDE_WORLD_SIZE} ranks and 2 writers; rank 2 of rng has no value",
            mutate=widen, edit=_drop_rank2),
    Refusal("entry-value-missing", "PCK-ENTRY-MISSING", "R-COMMIT-4", "the global entry meta is "
            "declared with no value", edit=_index(0, lambda i: i["entries"]["meta"].update(
                values=[]))),
    Refusal("data-file-missing", "PCK-FILE-MISSING", "R-COMMIT-4", "writer 1's data file is gone",
            after=_remove(_W1)),
    Refusal("entry-file-missing", "PCK-FILE-MISSING", "R-COMMIT-4", "writer 1's value file of "
            "rng is gone", after=_remove("entries/rng.r00001.json.zst")),
    Refusal("file-wrong-size", "PCK-FILE-SIZE", "R-COMMIT-4", "writer 1's data file is one byte "
            "longer than its record", after=_grow(_W1)),
    Refusal("manifest-exists", "PCK-COMMIT-CONFLICT", "R-COMMIT-9", "a manifest.json is already "
            "in the attempt", after=_existing_manifest),
)


def _stat(p: Path) -> tuple[bytes, int, int] | None:
    try:
        st = p.stat()
        return p.read_bytes(), st.st_ino, st.st_mtime_ns
    except OSError:
        return None


def _events(o: Outcome, cwd: Path) -> list[FsEvent] | None:
    if o.trace is None:
        return None
    calls, _ = parse_trace(o.trace)
    return fs_events(calls, str(cwd))


def _expect_refusal(o: Outcome, code: str, what: str, rule: str) -> None:
    """The committer refused with ``code``, as ``rule`` asks (named in every failure)."""
    if o.rc == 0:
        raise HarnessFailure(f"the committer exited 0 on {what} (expected {code}, {rule}): "
                             f"{o.tail()}")
    if o.code is None:
        raise HarnessFailure(f"the committer exited {o.rc} on {what} but reported no error code "
                             f"(expected {code} as the last stdout line "
                             f'{{"error": {{"code": "{code}", ...}}}}, {rule}, R-ERR-1): '
                             f"{o.tail()}")
    if o.code != code:
        raise HarnessFailure(f"the committer reported {o.code} on {what}, expected {code} "
                             f"({rule}, R-ERR-1: "
                             f"{o.error.get('message', '') if o.error else ''})")


def run_refusal(adapter: Adapter, r: Refusal, workdir: Path, tables: bool = False) -> None:
    """Hand the committer the crafted attempt of ``r``; check its refusal."""
    # Resolved, as the traces name it (mutation audit 24: a work directory behind a symbolic
    # link failed a conforming committer and passed one that touched the existing manifest).
    root = workdir / "root"
    root.mkdir(parents=True, exist_ok=True)
    root = root.resolve()
    case = base_case(tables)
    if r.mutate is not None:
        r.mutate(case)
    aid = new_attempt_id(case.step)
    crafted = craft_attempt(case, aid)
    if r.edit is not None:
        r.edit(crafted)
    adir = crafted.write(root, skip_index=r.skip_index)
    if r.after is not None:
        r.after(adir)
    manifest = adir / "manifest.json"
    before = _stat(manifest)
    o = adapter.run(commit_job(case, workdir / "jobs", root, aid))
    _expect_refusal(o, r.code, f"{r.name} ({r.what})", r.rule)
    _check_untouched(o, adapter, manifest, before)


def _check_untouched(o: Outcome, adapter: Adapter, manifest: Path,
                     before: tuple[bytes, int, int] | None) -> None:
    after = _stat(manifest)
    if before is None and after is not None:
        raise HarnessFailure("the committer refused but left a manifest.json (R-COMMIT-4: no "
                             "commit record on any failure)")
    if before is not None and after != before:
        raise HarnessFailure("the existing manifest.json was modified or replaced (R-COMMIT-9)")
    events = _events(o, adapter.cwd)
    if events is not None:
        what = conflict_problems(events, os.path.realpath(manifest))
        if what:
            raise HarnessFailure("; ".join(what))


def run_wide_commit(adapter: Adapter, workdir: Path, tables: bool = False,
                    details: dict[str, Any] | None = None) -> tuple[SaveCase, Path, str]:
    """The committer commits a job of more ranks than writers (:func:`widen`).

    It records the job's world size, not the number of writers (R-COMMIT-5, R-CONTRACT-1,
    R-ENTRY-8).
    """
    return run_valid_commit(adapter, workdir, tables, details, wide=True)


def run_valid_commit(adapter: Adapter, workdir: Path, tables: bool = False,
                     details: dict[str, Any] | None = None,
                     wide: bool = False) -> tuple[SaveCase, Path, str]:
    """The committer commits a conforming attempt (with a §14.1 declaration without ranges).

    ``wide``: the job has more ranks than writers (:func:`widen`).
    """
    # Resolved, as the traces name it (mutation audit 24: a work directory behind a symbolic
    # link failed a conforming committer and passed one that touched the existing manifest).
    root = workdir / "root"
    root.mkdir(parents=True, exist_ok=True)
    root = root.resolve()
    case = base_case(tables)
    if wide:
        widen(case)
    aid = new_attempt_id(case.step)
    crafted = craft_attempt(case, aid)
    # §14.1: writer 0 declares layer.b, which only writer 1 stores; both declare `empty`.
    crafted.writers[0].index["tensors"]["layer.b"] = {"dtype": "int64", "shape": [6],
                                                     "ranges": []}
    crafted.writers[1].index["tensors"]["empty"] = {"dtype": "bfloat16", "shape": [0, 3],
                                                   "ranges": []}
    crafted.write(root)
    o = adapter.run(commit_job(case, workdir / "jobs", root, aid))
    if o.rc != 0:
        raise HarnessFailure(f"the committer refused a conforming attempt (exit {o.rc}, "
                             f"{o.code}): {o.tail()}")
    verify_saved(root, aid, case)
    events = _events(o, adapter.cwd)
    if events is not None:
        _, exit_time = parse_trace(o.trace) if o.trace else ([], 0.0)
        what, advice = committer_problems(events, os.path.realpath(root), aid, exit_time)
        if what:
            raise HarnessFailure("; ".join(what))
        if details is not None and advice:
            details.setdefault("warnings", []).extend(f"committer: {a}" for a in advice)
    return case, root, aid


#: ``committed_at`` planted in the first version of a step for :func:`run_commit_same_step`:
#: later than any clock, as after an NTP step back.
FUTURE_COMMIT = "2099-01-01T00:00:00.000000Z"


def run_commit_same_step(adapter: Adapter, workdir: Path, tables: bool = False,
                         details: dict[str, Any] | None = None) -> None:
    """R-COMMIT-16: a second version of a step commits after the first, whatever the clock.

    The first version (committed by the adapter) is made to claim a ``committed_at`` in 2099;
    the second attempt of the same step must claim a later one, or the older save would stay
    the step's newest (§3) and ``gc --keep 1`` would delete the new one.
    """
    case, root, first = run_valid_commit(adapter, workdir, tables, details)
    manifest = root / first / "manifest.json"
    doc = json.loads(manifest.read_bytes())
    doc["committed_at"] = FUTURE_COMMIT
    manifest.write_text(json.dumps(doc, separators=(",", ":")))
    aid = new_attempt_id(case.step)
    craft_attempt(case, aid).write(root)
    o = adapter.run(commit_job(case, workdir / "jobs", root, aid, name="commit-same-step.json"))
    if o.rc != 0:
        raise HarnessFailure(f"the committer refused a second attempt of step {case.step} "
                             f"(exit {o.rc}, {o.code}): {o.tail()}")
    verify_saved(root, aid, case)
    got = json.loads((root / aid / "manifest.json").read_bytes()).get("committed_at")
    if not isinstance(got, str) or timestamp_key(got) <= timestamp_key(FUTURE_COMMIT):
        raise HarnessFailure(
            f"the second version of step {case.step} has committed_at {got!r}, not after the "
            f"{FUTURE_COMMIT!r} of the step's first version {first} (R-COMMIT-16: one "
            "microsecond after every version of the step that the committer can read, "
            "whatever its clock says)")


def run_commit_twice(adapter: Adapter, workdir: Path, tables: bool = False,
                     details: dict[str, Any] | None = None) -> None:
    """Commit a conforming attempt, then run the same commit job again: PCK-COMMIT-CONFLICT."""
    case, root, aid = run_valid_commit(adapter, workdir, tables, details)
    manifest = root / aid / "manifest.json"
    before = _stat(manifest)
    o = adapter.run(commit_job(case, workdir / "jobs", root, aid, name="commit-again.json"))
    _expect_refusal(o, "PCK-COMMIT-CONFLICT", "a second commit of a committed attempt",
                    "R-COMMIT-9")
    _check_untouched(o, adapter, manifest, before)
