"""The wheel of the library: what an installed copy needs beyond the modules."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_is_typed_and_runs_as_a_module(tmp_path: Path) -> None:
    """``py.typed`` (PEP 561: type checkers read the annotations of the installed package),
    ``__main__`` (``python -m portable_ckpt``) and the normative schemas are in the wheel."""
    hatchling = shutil.which("hatchling", path=str(Path(sys.executable).parent))
    if hatchling is None:
        pytest.skip("hatchling is not installed (pip install -e '.[dev]')")
    subprocess.run([hatchling, "build", "-t", "wheel", "-d", str(tmp_path)], cwd=ROOT,
                   check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("portable_ckpt-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"portable_ckpt/py.typed", "portable_ckpt/__main__.py"} <= names
    assert any(n.startswith("portable_ckpt/") and n.endswith("manifest.schema.json") for n in names)
