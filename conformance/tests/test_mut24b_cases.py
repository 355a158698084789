"""Mutation audit 24b, conformance/cases.py: the random save cases split tensors."""

from __future__ import annotations

from hypothesis import find, settings

from conformance.cases import save_cases


def test_random_cases_split_a_tensor_among_writers() -> None:
    """Not every tensor is drawn replicated (one box, one writer): some are partitioned into
    several boxes held by different writers (the save case's point, R-COMMIT-3 coverage)."""
    case = find(save_cases(3, ("none",), tables="never"),
                lambda c: c.num_writers > 1 and any(
                    len({w for _, _, w in t.boxes}) > 1 for t in c.tensors),
                settings=settings(max_examples=300, database=None))
    t = next(t for t in case.tensors if len({w for _, _, w in t.boxes}) > 1)
    assert len(t.boxes) > 1 and 0 not in t.shape
