"""Every golden vector, through ``check`` and through the reference reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conformance.checker import check
from conformance.vectors import VECTOR_DIR, load_cases, materialize

CASES = load_cases()
IDS = [c["name"] for c in CASES]

#: Cases the reference reader currently gets wrong (reported to the lead; remove when fixed).
#: strict xfail: a fix makes the test XPASS and fail, so this list cannot go stale.
REFERENCE_KNOWN_BUGS: dict[str, str] = {
    # "case-name": "what the reference reader gets wrong",
}


def test_cases_index_is_well_formed() -> None:
    names = [c["name"] for c in CASES]
    assert len(names) == len(set(names))
    for c in CASES:
        assert (VECTOR_DIR / c["name"]).is_dir()
        if c["valid"]:
            assert (VECTOR_DIR / c["expected"]).is_file()
        else:
            assert c["code"].startswith("PCK-")
    assert sum(c["valid"] for c in CASES) >= 20
    assert sum(not c["valid"] for c in CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_check(case: dict[str, Any], tmp_path: Path) -> None:
    target = materialize(case, tmp_path)
    for deep in (False, True):
        rep = check(target, deep=deep)
        if case["valid"]:
            assert rep.ok, [e.to_json() for e in rep.errors]
        elif deep or not case.get("deep"):
            assert rep.codes == {case["code"]}, [e.to_json() for e in rep.errors]


def _read_everything(target: Path) -> dict[str, Any]:
    import portable_ckpt

    ck = portable_ckpt.open(str(target))
    out: dict[str, Any] = {"step": ck.step, "attempt_id": ck.id, "tensors": {}, "entries": {}}
    for key, info in ck.tensors.items():
        arr = np.ascontiguousarray(ck.read(key))
        out["tensors"][key] = {"dtype": info.dtype, "shape": list(info.shape),
                               "hex": arr.tobytes().hex()}
    ws = ck.continuation.world_size
    for name, e in ck.entries.items():
        if e.scope == "global":
            out["entries"][name] = ck.entry(name)
        else:
            out["entries"][name] = {"per_rank": {str(r): ck.entry(name, rank=r, world_size=ws)
                                                 for r in range(ws)}}
    return out


@pytest.mark.parametrize("case", [
    pytest.param(c, marks=pytest.mark.xfail(reason=REFERENCE_KNOWN_BUGS[c["name"]], strict=True))
    if c["name"] in REFERENCE_KNOWN_BUGS else c for c in CASES], ids=IDS)
def test_reference_reader(case: dict[str, Any], tmp_path: Path) -> None:
    pytest.importorskip("portable_ckpt")
    from portable_ckpt.errors import CheckpointError

    target = materialize(case, tmp_path)
    if case["valid"]:
        got = _read_everything(target)
        want = json.loads((VECTOR_DIR / case["expected"]).read_text())
        assert got["attempt_id"] == want["attempt_id"]
        assert got["step"] == want["step"]
        assert got["tensors"] == {k: {"dtype": v["dtype"], "shape": v["shape"], "hex": v["hex"]}
                                  for k, v in want["tensors"].items()}
        assert got["entries"] == want["entries"]
        # exact JSON types too (1 vs 1.0, True vs 1)
        assert json.dumps(got["entries"], sort_keys=True) == json.dumps(want["entries"],
                                                                        sort_keys=True)
    else:
        with pytest.raises(CheckpointError) as ei:
            _read_everything(target)
        assert ei.value.code == case["code"], str(ei.value)


def test_expected_values_match_hex() -> None:
    """expected.json's readable values and its exact bytes agree (for numpy-native dtypes)."""
    native = {"float64": "<f8", "float32": "<f4", "float16": "<f2", "int64": "<i8",
              "int32": "<i4", "int16": "<i2", "int8": "i1", "uint8": "u1", "uint16": "<u2",
              "uint32": "<u4", "uint64": "<u8", "bool": "?"}
    for c in CASES:
        if not c["valid"]:
            continue
        exp = json.loads((VECTOR_DIR / c["expected"]).read_text())
        for key, t in exp["tensors"].items():
            if t["dtype"] in native and t["values"] != []:
                arr = np.frombuffer(bytes.fromhex(t["hex"]), native[t["dtype"]])
                assert arr.reshape(t["shape"]).tolist() == t["values"], (c["name"], key)
