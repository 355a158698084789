"""The top-level API is typed for a caller's type checker (PEP 561), not ``Any``.

Found by the API review 31: a wrapper under ``mypy --strict`` saw ``portable_ckpt.open()``,
``list_versions`` and ``gc`` (imported lazily by the package's ``__getattr__``) as ``Any``:
returning ``ck.read(...)`` or a listing failed with ``no-any-return`` unless cast.
"""

from __future__ import annotations

from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api")

WRAPPER = '''
from typing import Any

import numpy as np
import portable_ckpt

def head(root: str) -> "np.ndarray[Any, Any]":
    ck = portable_ckpt.open(root, step=3)
    reveal_type(ck)
    return ck.read("w", offsets=[0], lengths=[1])

reveal_type(portable_ckpt.list_versions("r"))
reveal_type(portable_ckpt.gc("r", keep=1))
reveal_type(portable_ckpt.Checkpoint)
'''


def test_a_strict_wrapper_sees_the_types(tmp_path: Path) -> None:
    (tmp_path / "wrapper.py").write_text(WRAPPER)
    out, err, status = api.run([
        "--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache"),
        "--warn-unused-ignores", str(tmp_path / "wrapper.py"),
    ])
    assert 'Revealed type is "portable_ckpt.io.reader.Checkpoint"' in out, out + err
    assert 'Revealed type is "list[portable_ckpt.io.versions.VersionInfo]"' in out
    assert 'Revealed type is "portable_ckpt.io.gc.GcReport"' in out
    assert 'Revealed type is "def (storage:' in out  # the class, not Any
    assert " error: " not in out, out
