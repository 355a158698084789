from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.cases import EntrySpec, SaveCase, TensorSpec
from conformance.procs import Adapter
from conformance.trace import tracing_status

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
REFERENCE_ADAPTER = [PY, str(REPO / "conformance" / "adapters" / "reference_writer.py")]
MINIMAL_WRITER = [PY, str(REPO / "conformance" / "examples" / "minimal_writer.py")]
BAD_WRITER = [PY, str(REPO / "conformance" / "tests" / "bad_writer.py")]
#: system-call tracing here; CI installs strace, and test_faults.py insists on it under $CI.
TRACING = tracing_status().available
needs_tracing = pytest.mark.skipif(not TRACING, reason=f"no strace: {tracing_status().detail}")


def adapter(cmd: list[str], *, trace: bool = TRACING, timeout: float = 120.0) -> Adapter:
    """The adapter ``cmd``, traced when strace works here."""
    return Adapter(cmd, timeout=timeout, trace=trace)


def explicit_case(step: int = 7) -> SaveCase:
    """Two writers: a row-split matrix, a 0-d tensor, one global entry."""
    return SaveCase(
        step=step, num_writers=2, codec="none",
        tensors=[TensorSpec("w", "float32", [4, 3], 1, [([0, 0], [2, 3], 0), ([2, 0], [2, 3], 1)]),
                 TensorSpec("s", "int64", [], 2, [([], [], 1)])],
        entries=[EntrySpec("meta", {"id": "pck:json/1"}, "global", "json", value={"a": 1})])


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
