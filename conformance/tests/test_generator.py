"""The vector generator is frozen: it refuses to overwrite and reproduces the committed cases."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from conformance.vectors import VECTOR_DIR


def _generator() -> ModuleType:
    path = VECTOR_DIR.parent / "generate_1_0.py"
    spec = importlib.util.spec_from_file_location("pck_generate_1_0", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    gen = _generator()
    out = tmp_path / "1.0"
    assert gen.main(["--out", str(out)]) == 0
    before = (out / "cases.json").read_bytes()
    assert gen.main(["--out", str(out)]) == 1
    assert (out / "cases.json").read_bytes() == before


def test_reproduces_committed_vectors(tmp_path: Path) -> None:
    gen = _generator()
    out = tmp_path / "1.0"
    assert gen.main(["--out", str(out)]) == 0
    assert json.loads((out / "cases.json").read_text()) == \
        json.loads((VECTOR_DIR / "cases.json").read_text())
    for case in json.loads((out / "cases.json").read_text())["cases"]:
        if case["valid"]:
            assert (out / case["expected"]).read_text() == \
                (VECTOR_DIR / case["expected"]).read_text()
        # Manifests are deterministic text; compare them too.
        for m in (out / case["name"]).rglob("manifest.json"):
            rel = m.relative_to(out)
            assert m.read_bytes() == (VECTOR_DIR / rel).read_bytes(), rel
