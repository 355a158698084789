"""Mutation audit 23: the verdicts of ``check`` and ``vectors`` as a CI gate reads them.

``check``: exit status, JSON ``ok``/``verdict`` and the JUnit failure counts of a version that
breaks a rule (a real subprocess). ``vectors``: the self-test of an installed suite must fail
when the checker it proves is wrong, shallow or deep, by one code too many (the real checker,
with one fault added around it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import conformance.checker
from conformance.checker import Report
from conformance.cli import main

from .conftest import REPO


def test_check_of_a_broken_version_fails_in_every_report(tmp_path: Path) -> None:
    """L01, L06, L07: exit 1, ``"ok": false``, one failed JUnit case counted as failed."""
    pc = pytest.importorskip("portable_ckpt")
    root = tmp_path / "root"
    pc.save_arrays(str(root), {"w": np.arange(12, dtype=np.float32)}, step=3)
    (vdir,) = [p for p in root.iterdir() if p.is_dir()]
    data = vdir / "data" / "w00000-0000.safetensors"
    data.write_bytes(data.read_bytes() + b"\x00")  # one byte more than recorded
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out, xml = tmp_path / "r.json", tmp_path / "r.xml"
    r = subprocess.run([sys.executable, "-m", "conformance", "check", str(root), "--json",
                        str(out), "--junit-xml", str(xml)], cwd=REPO, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert doc["ok"] is False and doc["verdict"] == "fail" and doc["exit_code"] == 1
    assert [c["status"] for c in doc["cases"]] == ["failed"]
    suites = ET.parse(xml).getroot()
    assert suites.get("failures") == "1"
    (suite,) = suites.findall("testsuite")
    assert suite.get("failures") == "1" and len(suite.findall("testcase/failure")) == 1


def _vectors(monkeypatch: pytest.MonkeyPatch, fault: Callable[[Report, bool], Report]) -> int:
    real = conformance.checker.check

    def check(path: Any, *, deep: bool = False, schema_dir: Any = None) -> Report:
        return fault(real(path, deep=deep, schema_dir=schema_dir), deep)

    monkeypatch.setattr(conformance.checker, "check", check)
    return main(["vectors", "--set", "errata-10"])


def test_vectors_passes_with_the_real_checker(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _vectors(monkeypatch, lambda rep, deep: rep) == 0


def test_vectors_fails_a_checker_with_one_code_too_many(monkeypatch: pytest.MonkeyPatch) -> None:
    """L02: an invalid vector must get exactly its code (R-VERSION-13), not its code and more."""
    def extra(rep: Report, deep: bool) -> Report:
        if not rep.ok:
            rep.error("PCK-SCHEMA", "a second code for one defect")
        return rep
    assert _vectors(monkeypatch, extra) == 1


def test_vectors_fails_a_checker_whose_shallow_check_finds_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """L05: the shallow check is proved too (a reader without --deep makes those checks)."""
    assert _vectors(monkeypatch, lambda rep, deep: rep if deep else Report()) == 1
