"""The errata vectors (spec §20, R-VERSION-12) through the reference reader (checker: test_vectors.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conformance.vectors import VECTOR_DIRS, load_cases, materialize

from .test_vectors import check_reference_read

CASES = [(VECTOR_DIRS[s], c) for s in VECTOR_DIRS if s.startswith("errata-")
         for c in load_cases(VECTOR_DIRS[s])]


@pytest.mark.parametrize(("errata", "case"), CASES, ids=[c["name"] for _, c in CASES])
def test_reference_reader_errata(errata: Path, case: dict[str, Any], tmp_path: Path) -> None:
    """R-VERSION-12: valid cases and writer-only violations ("reader": "accept") read exactly;
    others fail."""
    pytest.importorskip("portable_ckpt")
    readable = case["valid"] or case.get("reader") == "accept"
    check_reference_read(materialize(case, tmp_path, errata), case, errata, readable)
