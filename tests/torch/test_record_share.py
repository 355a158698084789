"""A load reads its commit record once, in slices, on every rank (real gloo groups and files).

Rank 0 names the attempt it will most likely pick; each rank reads a slice of its
``manifest.json`` (at least 64 KiB) and the slices are exchanged, so no rank reads the whole
record and every rank parses it at the same time. These tests pin the protocol: the collectives
each case costs, which bytes each rank reads, a second broadcast when rank 0 picks another
attempt or a slice could not be read, and every rank raising (never hanging) when rank 0 fails
before it names an attempt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from portable_ckpt.torch._load_resolve import MIN_SLICE
from portable_ckpt.torch.launch import run_group

pytestmark = pytest.mark.torch

ROOT = str(Path(__file__).resolve().parents[2])
W = "tests.torch._workers"


def _run(fn: str, world: int, *args: Any) -> list[Any]:
    res = run_group(f"{W}:{fn}", world, args, timeout=120, pg_timeout=45, sys_path=[ROOT])
    res.raise_for_errors()
    return list(res.results)


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root, scratch = tmp_path_factory.mktemp("root"), tmp_path_factory.mktemp("scratch")
    return _run("record_share", 3, str(root), str(scratch))


def _collectives(got: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return [(r["broadcast"], r["allgather"]) for r in got]


def _ids(cases: list[dict[str, Any]]) -> tuple[str, str]:
    return cases[0]["first"]["id"], cases[0]["newest_of_the_step"]["id"]


@pytest.mark.parametrize(("case", "epoch"), [("first", 1), ("newest_of_the_step", 2)])
def test_the_likely_record_is_read_once_and_used_everywhere(
    cases: list[dict[str, Any]], case: str, epoch: int
) -> None:
    got = [r[case] for r in cases]
    assert len({r["id"] for r in got}) == 1
    w = [float(i + epoch - 1) for i in range(6)]
    assert [(r["step"], r["epoch"], r["w"]) for r in got] == [(1, epoch, w)] * 3
    assert _collectives(got) == [(1, 1)] * 3  # named, read together; no second broadcast
    # A small record is one slice: rank 0 reads it, whole; the others read nothing. Rank 0
    # reads the older attempt of the step alone, to classify it (it is not sent).
    old, new = _ids(cases)
    size = got[0]["reads"][0][2]
    expected = [[old, 0, size]] if case == "first" else [[new, 0, size], [old, 0, size]]
    assert got[0]["reads"] == expected
    assert [r["reads"] for r in got[1:]] == [[], []]
    assert [r["listings"] for r in got] == [1, 0, 0]  # rank 0 lists the root once


def test_a_record_picked_after_the_likely_one_is_sent_in_a_second_broadcast(
    cases: list[dict[str, Any]],
) -> None:
    got = [r["torn_newer_step"] for r in cases]
    assert [(r["step"], r["epoch"]) for r in got] == [(1, 2)] * 3
    assert got[0]["id"] == cases[0]["newest_of_the_step"]["id"]
    assert _collectives(got) == [(2, 1)] * 3
    # Rank 0 read the torn record (with the others), then the attempts of step 1; none twice.
    assert [r["reads"] for r in got[1:]] == [[], []]
    reads = [name for name, _, _ in got[0]["reads"]]
    assert reads[0].startswith("s000000000005-") and sorted(reads[1:]) == sorted(_ids(cases))
    assert [r["listings"] for r in got] == [1, 0, 0]


def test_a_slice_that_cannot_be_read_leaves_the_record_to_rank0(
    cases: list[dict[str, Any]],
) -> None:
    got = [r["slice_unreadable"] for r in cases]
    assert [(r["step"], r["epoch"]) for r in got] == [(3, 3)] * 3
    assert _collectives(got) == [(2, 1)] * 3
    reads = [[(lo, n) for _, lo, n in r["reads"]] for r in got]
    size = reads[0][-1][1]
    part = max(MIN_SLICE, -(-size // 3))
    assert reads[0] == [(0, part), (0, size)]  # rank 0: its slice, then the whole record
    assert reads[1:] == [[(part, part)], [(2 * part, size - 2 * part)]]  # rank 2's failed


def test_an_id_without_a_record_fails_on_every_rank(cases: list[dict[str, Any]]) -> None:
    got = [r["missing_id"] for r in cases]
    assert got[0]["code"] == "PCK-MANIFEST-MISSING"
    assert [(r["code"], r["failed"]) for r in got[1:]] == [("PCK-DISTRIBUTED", [0])] * 2
    assert _collectives(got) == [(1, 0)] * 3  # nothing named: no slices


def test_rank0_failing_before_it_names_an_attempt_fails_every_rank(
    cases: list[dict[str, Any]],
) -> None:
    got = [r["rank0_cannot_open"] for r in cases]
    assert got[0]["code"] not in (None, "PCK-DISTRIBUTED")
    assert [(r["code"], r["failed"]) for r in got[1:]] == [("PCK-DISTRIBUTED", [0])] * 2
    assert _collectives(got) == [(1, 0)] * 3


def test_a_rank_that_cannot_open_the_root_fails_every_rank(
    cases: list[dict[str, Any]],
) -> None:
    got = [r["rank1_cannot_open"] for r in cases]
    assert got[1]["code"] not in (None, "PCK-DISTRIBUTED")
    assert [(got[i]["code"], got[i]["failed"]) for i in (0, 2)] == [("PCK-DISTRIBUTED", [1])] * 2
    # Its slice counted as unread: rank 0 read the whole record alone and sent it.
    assert _collectives(got) == [(2, 1)] * 3


@pytest.mark.parametrize(
    "case", ["copy_differs_only_version", "copy_differs_newer_attempt", "copy_differs_given_id"]
)
def test_rank0s_own_copy_decides_when_the_slices_do_not_validate(
    cases: list[dict[str, Any]], case: str
) -> None:
    """Each node root of a node-local tier holds its own copy of the record: when the slices
    of another rank's copy make the record invalid, rank 0 resolves from its own copy, as
    when it read the record alone, and sends it."""
    got = [r[case] for r in cases]
    assert [(r.get("code"), r["step"], r["epoch"]) for r in got] == [(None, 3, 3)] * 3
    if case != "copy_differs_only_version":
        assert [r["id"] for r in got] == [cases[0]["big2_newest"]] * 3  # the newest, not older
    assert _collectives(got) == [(2, 1)] * 3
    # Each rank read its slice; then rank 0 read whole records alone (its own copy).
    reads = got[0]["reads"]
    size = reads[-1][2]
    part = max(MIN_SLICE, -(-size // 3))
    assert reads[0][1:] == [0, part] and all(r[1:] == [0, size] for r in reads[1:])
    assert [len(r["reads"]) for r in got[1:]] == [1, 1]


def test_a_large_record_is_read_in_disjoint_slices(tmp_path: Path) -> None:
    _run("save_many_tensors", 3, str(tmp_path))
    ck = next(p for p in tmp_path.iterdir() if p.is_dir())
    size = (ck / "manifest.json").stat().st_size
    assert size > 2 * MIN_SLICE  # three slices
    got = _run("load_sliced", 3, str(tmp_path))
    assert all(r["ok"] and r["step"] == 3 for r in got)
    assert _collectives(got) == [(1, 1)] * 3
    reads = [r["reads"] for r in got]
    part = max(MIN_SLICE, -(-size // 3))
    assert reads == [[[ck.name, 0, part]], [[ck.name, part, part]], [[ck.name, 2 * part, size - 2 * part]]]
