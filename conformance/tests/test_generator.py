"""The vector generators are frozen: they refuse to overwrite and reproduce the committed cases."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from conformance.vectors import RETENTION_DIRS, VECTOR_DIRS

DIRS = {**VECTOR_DIRS, **RETENTION_DIRS}
VERSIONS = list(DIRS)


def _generator(version: str) -> ModuleType:
    stem = f"generate_{version.replace('.', '_').replace('-', '_')}"
    path = DIRS[version].parent / f"{stem}.py"
    spec = importlib.util.spec_from_file_location(f"pck_{stem}", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("version", VERSIONS)
def test_refuses_to_overwrite(version: str, tmp_path: Path) -> None:
    gen = _generator(version)
    out = tmp_path / version
    assert gen.main(["--out", str(out)]) == 0
    before = (out / "cases.json").read_bytes()
    assert gen.main(["--out", str(out)]) == 1
    assert (out / "cases.json").read_bytes() == before


@pytest.mark.parametrize("version", VERSIONS)
def test_reproduces_committed_vectors(version: str, tmp_path: Path) -> None:
    gen = _generator(version)
    committed = DIRS[version]
    out = tmp_path / version
    assert gen.main(["--out", str(out)]) == 0
    assert json.loads((out / "cases.json").read_text()) == \
        json.loads((committed / "cases.json").read_text())
    for case in json.loads((out / "cases.json").read_text())["cases"]:
        if case.get("valid"):
            assert (out / case["expected"]).read_text() == \
                (committed / case["expected"]).read_text()
        # Manifests are deterministic text; compare them too.
        for m in (out / case["name"]).rglob("manifest.json"):
            rel = m.relative_to(out)
            assert m.read_bytes() == (committed / rel).read_bytes(), rel
    if version != "1.0":  # newer vectors are compared file by file (tables, shards, indexes)
        made = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
        have = sorted(p.relative_to(committed).as_posix() for p in committed.rglob("*")
                      if p.is_file())
        assert made == have
        for rel in made:
            assert (out / rel).read_bytes() == (committed / rel).read_bytes(), rel


def test_the_simplest_kill_case_kills_mid_way() -> None:
    """With the default 7 crash examples, each kill point runs once, as hypothesis' simplest
    example: it killed after the victim's first call, never mid-file (adopter review F8)."""
    from hypothesis import find

    from conformance.cases import crash_cases

    for fault in ("kill-writer", "kill-commit"):
        simplest = find(crash_cases(fault=fault), lambda c: True)
        assert simplest.at == 0.5, (fault, simplest.at)
