#!/usr/bin/env python3
"""Generate the golden vectors of errata 12 (run once; the output is frozen and committed).

Errata 12 defines the two layouts every reader must decide at any size (spec §9, R-COVER-4): a
**grid** and boxes that **differ in at most two dimensions**. The older sets held at most 300
boxes per tensor, which a pairwise comparison of every two boxes decides; an outside team's
reader did so, and refused a 69,000-box grid the reference writes with ``PCK-LIMIT``. These
cases hold more than 12,000 one-row boxes each (format 1.1, tensor tables), more than 2^26
pairs of boxes, the reference's own bound on comparisons: a grid of 120 × 120 cells, a brick
wall whose rows are cut at alternating offsets (not a grid: two varying dimensions), and the
same wall with one box moved one element to the right (an overlap beside a gap, so the volumes
add up and only a comparison finds it: ``PCK-COVERAGE-OVERLAP``).

Uses the builders of ``generate_1_1.py`` and ``generate_errata_1.py`` (standard library, numpy,
crc32c, zstandard). Refuses to touch an existing vector directory unless ``--force`` is given.

Usage: python conformance/vectors/generate_errata_12.py [--out DIR] [--force]
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _load(stem: str) -> Any:
    """A generator of the same directory (its builders are reused)."""
    path = Path(__file__).resolve().with_name(f"{stem}.py")
    spec = importlib.util.spec_from_file_location(f"pck_{stem}_for_errata_12", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


T = _load("generate_1_1")
E1 = _load("generate_errata_1")

Generator = Callable[[Path], Any]
CASES: list[dict[str, Any]] = []
case: Callable[..., Callable[[Generator], Generator]] = E1.registry(CASES)

Box = tuple[list[int], list[int], int]


def _tensor(root: Path, shape: list[int], boxes: list[Box]) -> Any:
    """One uint8 tensor ``t`` of ``shape`` (values ``i mod 251`` in C order) in ``boxes``."""
    v = T.V(table="zstd")
    n = shape[0] * shape[1]
    v.tensor("t", "uint8", shape, [i % 251 for i in range(n)], boxes=boxes)
    T.write_version(root, v)
    return v


def grid(side: int) -> list[Box]:
    """``side`` × ``side`` one-element cells."""
    return [([i, j], [1, 1], 0) for i in range(side) for j in range(side)]


def bricks(rows: int, cols: int, moved: int | None = None) -> list[Box]:
    """Rows cut into 2-wide bricks, odd rows shifted by one (a 1-wide brick at each end).

    ``moved``: the row whose brick at the middle column moves one element right (it then
    overlaps its neighbour and leaves its first element uncovered).
    """
    out: list[Box] = []
    for r in range(rows):
        cuts = list(range(0, cols + 1, 2)) if r % 2 == 0 else [0, *range(1, cols, 2), cols]
        for a, b in itertools.pairwise(cuts):
            shift = 1 if r == moved and a == cols // 2 else 0
            out.append(([r, a + shift], [1, b - a], 0))
    return out


@case("valid-grid-14400", "§9, R-COVER-4 (errata 12): a tensor table of 14,400 one-element "
      "boxes that form a 120 x 120 grid; every reader decides it (a grid is decided from its "
      "per-dimension cuts, without comparing boxes)")
def _(root: Path) -> Any:
    return _tensor(root, [120, 120], grid(120))


@case("valid-bricks-12352", "§9, R-COVER-4 (errata 12): 12,352 boxes of a 128 x 192 tensor "
      "laid as a brick wall (odd rows cut one element later): not a grid, two dimensions "
      "vary; every reader decides it")
def _(root: Path) -> Any:
    return _tensor(root, [128, 192], bricks(128, 192))


@case("invalid-bricks-overlap", "§9, R-COVER-3, R-COVER-4 (errata 12): the brick wall with "
      "the middle brick of row 64 moved one element right: it overlaps its neighbour and "
      "leaves one element uncovered, so the volumes add up; PCK-COVERAGE-OVERLAP (overlap "
      "before gap, R-COVER-3)", code="PCK-COVERAGE-OVERLAP")
def _(root: Path) -> None:
    _tensor(root, [128, 192], bricks(128, 192, moved=64))


DESCRIPTION = ("Golden vectors of errata 12 (spec §20): the layouts every reader must decide "
               "at any size (R-COVER-4): a 14,400-box grid, a 12,352-box brick wall that is "
               "not a grid, and the wall with one overlap beside one gap, each more than 2^26 "
               "pairs of boxes. None is deep.")


def main(argv: list[str] | None = None) -> int:
    """Write every case below ``--out`` (default: ``errata-12`` next to this script)."""
    return int(E1.write_set(argv, CASES, "errata-12", DESCRIPTION, __doc__))


if __name__ == "__main__":
    sys.exit(main())
