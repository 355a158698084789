"""Errata 8 (spec §23): what an outside reader team had to guess, decided as the reference does.

Each test pins one clarification: which defects make a commit record invalid (§4.1, R-READ-1,
R-VERSION-10), the order of R-READ-3, the code of R-SEC-16 for a foreign commit record and the
layouts R-COVER-4 obliges every reader to
decide.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import portable_ckpt
from conformance.checker import check
from portable_ckpt.io.versions import classify_attempt
from portable_ckpt.ranges import Box, check_coverage
from portable_ckpt.storage import open_storage

from ._util import build_version, edit_manifest, expect_code


def _first_file(d: dict[str, Any]) -> dict[str, Any]:
    rec: dict[str, Any] = d["files"][next(iter(d["files"]))]
    return rec


#: Defects of the record alone (§4.1): the newer version is invalid, and skipped.
RECORD_DEFECTS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "step-not-the-id's (R-ID-3)": lambda d: d.update(step=d["step"] + 1),
    "blocks-count (R-CKSUM-2)": lambda d: _first_file(d)["checksum"].update(
        blocks=_first_file(d)["checksum"]["blocks"] + "00000000"),
    "range-file-not-listed (R-FILES-2)": lambda d: d["tensors"]["b"]["ranges"][0].update(
        file="data/elsewhere.safetensors"),
    "range-outside-shape (§8.2)": lambda d: d["tensors"]["b"].update(shape=[4]),
}

#: Defects that need coverage or another file: the newer version exists, and fails.
DATA_DEFECTS: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "coverage-gap (§9)": (lambda d: d["tensors"]["b"].update(shape=[6]), "PCK-COVERAGE-GAP"),
    "listed-file-missing": (lambda d: None, "PCK-FILE-MISSING"),
}


def _two_versions(tmp_path: Path) -> tuple[Path, Path]:
    old, _ = build_version(tmp_path, step=1)
    new, _ = build_version(tmp_path, step=2)
    return old, new


@pytest.mark.parametrize("defect", sorted(RECORD_DEFECTS))
def test_a_record_defect_makes_the_newest_record_invalid(tmp_path: Path, defect: str) -> None:
    """§4.1, R-READ-1 (errata 8): a record failing a check on its own members is skipped."""
    old, new = _two_versions(tmp_path)
    edit_manifest(new, RECORD_DEFECTS[defect])
    ck = portable_ckpt.open(tmp_path)
    assert ck.path.endswith(old.name), defect
    assert classify_attempt(open_storage(tmp_path), new.name).status == "invalid"
    # Of a newer version, the same record is foreign (R-VERSION-10), and kept by gc.
    edit_manifest(new, lambda d: d.update(format_version="1.9"))
    c = classify_attempt(open_storage(tmp_path), new.name)
    assert c.status == "foreign", (defect, c.error)
    expect_code("PCK-VERSION-UNSUPPORTED", portable_ckpt.open, new)
    # The conformance checker agrees: one code, naming the failed check.
    errors = check(new).errors
    assert [e.code for e in errors] == ["PCK-VERSION-UNSUPPORTED"], (defect, errors)
    assert "fails their checks" in errors[0].message, errors


@pytest.mark.parametrize("defect", sorted(DATA_DEFECTS))
def test_a_data_defect_never_steps_back_to_an_older_version(tmp_path: Path, defect: str) -> None:
    """§4.1 (errata 8): coverage and other files are not checks of the record; the newest
    version exists, and reading it fails with the check's code; no older step is returned.
    Of a newer minor version it is a version too, not a foreign record (R-VERSION-10)."""
    _, new = _two_versions(tmp_path)
    edit, code = DATA_DEFECTS[defect]
    edit_manifest(new, edit)
    if defect == "listed-file-missing":
        os.remove(new / "data" / sorted(os.listdir(new / "data"))[0])
    for fv in ("1.0", "1.9"):
        edit_manifest(new, lambda d, fv=fv: d.update(format_version=fv))  # type: ignore[misc]
        assert classify_attempt(open_storage(tmp_path), new.name).status == "committed", fv

        def open_and_read() -> None:
            ck = portable_ckpt.open(tmp_path)
            assert ck.path.endswith(new.name)
            for key in ck.tensors:
                ck.read(key)

        expect_code(code, open_and_read)
        # The checker agrees: the version's own defect, never a foreign record.
        assert code in check(new).codes, (defect, fv, check(new).errors)
        assert "PCK-VERSION-UNSUPPORTED" not in check(new).codes, (defect, fv)


def test_an_explicit_open_of_a_foreign_commit_record_is_path_unsafe(tmp_path: Path) -> None:
    """R-SEC-16 (errata 8): ``manifest.json`` a directory or a FIFO, found by listing."""
    _, new = _two_versions(tmp_path)
    record = new / "manifest.json"
    shutil.move(record, tmp_path / "saved.json")
    record.mkdir()
    expect_code("PCK-PATH-UNSAFE", portable_ckpt.open, new)
    record.rmdir()
    os.mkfifo(record)
    expect_code("PCK-PATH-UNSAFE", portable_ckpt.open, new)


def _grid(n0: int, n1: int) -> tuple[tuple[int, int], list[Box]]:
    cuts0 = sorted(random.Random(n0).sample(range(1, 4 * n0), n0 - 1))
    cuts1 = sorted(random.Random(n1).sample(range(1, 4 * n1), n1 - 1))
    e0, e1 = [0, *cuts0, 4 * n0], [0, *cuts1, 4 * n1]
    boxes = [Box((a, b), (a2 - a, b2 - b))
             for a, a2 in itertools.pairwise(e0) for b, b2 in itertools.pairwise(e1)]
    return (4 * n0, 4 * n1), boxes


def _staircase(n: int) -> tuple[tuple[int, int], list[Box]]:
    """Two-dimensional boxes in no grid: row i is cut at a different column in every row."""
    boxes = []
    for i in range(n):
        c = 1 + (i * 7919) % (n - 1)
        boxes += [Box((i, 0), (1, c)), Box((i, c), (1, n - c))]
    return (n, n), boxes


@pytest.mark.parametrize("layout", ["1-d", "grid", "two-dims", "three-d-two-vary"])
def test_every_layout_writers_are_asked_for_is_decided_at_any_size(layout: str) -> None:
    """R-COVER-4 (errata 8): one dimension, grids and boxes that differ in at most two
    dimensions are decided at any size (an outside reader refused 5,000 1-d ranges): no
    PCK-LIMIT, and a gap or an overlap among them is still found."""
    if layout == "1-d":
        cuts = sorted(random.Random(1).sample(range(1, 10**9), 200_000 - 1))
        edges = [0, *cuts, 10**9]
        shape: tuple[int, ...] = (10**9,)
        boxes = [Box((a,), (b - a,)) for a, b in itertools.pairwise(edges)]
    elif layout == "grid":
        shape, boxes = _grid(400, 400)
    elif layout == "two-dims":
        shape, boxes = _staircase(20_000)
    else:  # a third dimension every box spans fully
        shape2, boxes2 = _staircase(5_000)
        shape = (*shape2, 3)
        boxes = [Box((*b.offsets, 0), (*b.lengths, 3)) for b in boxes2]
    check_coverage(shape, boxes, key=layout)
    gap = boxes[:-1]
    expect_code("PCK-COVERAGE-GAP", check_coverage, shape, gap, key=layout)
    overlap = [*boxes, boxes[len(boxes) // 2]]
    expect_code("PCK-COVERAGE-OVERLAP", check_coverage, shape, overlap, key=layout)

