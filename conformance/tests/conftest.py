from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
REFERENCE_ADAPTER = [PY, str(REPO / "conformance" / "adapters" / "reference_writer.py")]
MINIMAL_WRITER = [PY, str(REPO / "conformance" / "examples" / "minimal_writer.py")]


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def fast_tmp(tmp_path: Path) -> Iterator[Path]:
    """A scratch directory on tmpfs when available: fsync there is free, so the many fsyncs of
    real writers do not dominate the suite's runtime (crash semantics are unaffected: crashes are
    process deaths, not power losses)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        d = Path(tempfile.mkdtemp(prefix="pck-conf-", dir=shm))
        try:
            yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)
    else:
        yield tmp_path
