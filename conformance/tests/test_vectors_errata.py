"""The errata vectors (spec §20, R-VERSION-12) through the reference reader (checker: test_vectors.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conformance.vectors import VECTOR_DIRS, load_cases, materialize

from .test_vectors import _read_everything

CASES = [(VECTOR_DIRS[s], c) for s in VECTOR_DIRS if s.startswith("errata-")
         for c in load_cases(VECTOR_DIRS[s])]


@pytest.mark.parametrize(("errata", "case"), CASES, ids=[c["name"] for _, c in CASES])
def test_reference_reader_errata(errata: Path, case: dict[str, Any], tmp_path: Path) -> None:
    """Valid cases and writer-only violations ("reader": "accept") read exactly; others fail."""
    pytest.importorskip("portable_ckpt")
    from portable_ckpt.errors import CheckpointError

    target = materialize(case, tmp_path, errata)
    if case["valid"] or case.get("reader") == "accept":
        got = _read_everything(target)
        want = json.loads((errata / case["expected"]).read_text())
        assert (got["attempt_id"], got["step"]) == (want["attempt_id"], want["step"])
        assert got["tensors"] == {k: {"dtype": v["dtype"], "shape": v["shape"], "hex": v["hex"]}
                                  for k, v in want["tensors"].items()}
        assert json.dumps(got["entries"], sort_keys=True) == json.dumps(want["entries"],
                                                                        sort_keys=True)
    else:
        with pytest.raises(CheckpointError) as ei:
            _read_everything(target)
        assert ei.value.code == case["code"], str(ei.value)
