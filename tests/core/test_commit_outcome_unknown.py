"""A commit that fails after its record may be visible removes nothing (R-COMMIT-19).

Found by the third outside review: the record was linked (or stored by S3), then an error
followed (the directory fsync, a lost answer), the commit raised a plain storage error, and the
save deleted the files of a version that every reader now took for the latest.

* Locally the error is a real ``EIO`` from the kernel's point of view: ``strace`` injects it
  into the ``fsync`` of the attempt directory that follows ``link()``.
* On S3 (``tests/s3/test_commit_unknown_s3.py``) the fault proxy forwards the conditional
  ``PUT`` to the server and answers ``500``, so the client never learns that it was stored.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import CommitOutcomeUnknownError, StorageError
from portable_ckpt.io.versions import list_versions
from tests._strace import strace_or_skip

SRC = str(Path(__file__).resolve().parents[2] / "src")

_SAVE = r"""
import sys
import numpy as np
import portable_ckpt
from portable_ckpt.errors import CommitOutcomeUnknownError
try:
    portable_ckpt.save_arrays(sys.argv[1], {"w": np.arange(1000, dtype=np.float32)}, step=3)
except CommitOutcomeUnknownError as e:
    print("UNKNOWN", e.code, e.message)
    sys.exit(3)
print("SAVED")
"""



def _traced(strace: str, root: Path, trace: Path, inject: str | None) -> subprocess.CompletedProcess[str]:
    cmd = [strace, "-f", "-qq", "-e", "trace=fsync,link", "-o", str(trace)]
    if inject is not None:
        cmd += ["-e", inject]
    proc = subprocess.run(
        [*cmd, sys.executable, "-c", _SAVE, str(root)],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0 and "ptrace" in proc.stderr:
        pytest.skip(f"ptrace is not permitted here: {proc.stderr.strip()}")
    return proc


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="strace fault injection")
def test_local_dir_fsync_failing_after_link_keeps_the_version(tmp_path: Path) -> None:
    strace = strace_or_skip()
    # A dry run counts the fsync calls: the last one is the attempt directory's, after link().
    dry = _traced(strace, tmp_path / "dry", tmp_path / "dry.trace", None)
    assert dry.returncode == 0 and "SAVED" in dry.stdout, dry.stderr
    calls = (tmp_path / "dry.trace").read_text().splitlines()
    link = max(i for i, line in enumerate(calls) if "link(" in line and "manifest.json" in line)
    # strace counts `when=` per thread: the committing thread's own fsync calls.
    tid = calls[link].split()[0]
    fsyncs = [
        i for i, line in enumerate(calls) if line.split()[0] == tid and re.search(r"\bfsync\(", line)
    ]
    assert fsyncs[-1] > link, "the directory fsync follows the link of manifest.json"

    root = tmp_path / "root"
    inject = f"inject=fsync:error=EIO:when={len(fsyncs)}"
    proc = _traced(strace, root, tmp_path / "fault.trace", inject)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "UNKNOWN PCK-STORAGE" in proc.stdout and "Nothing was removed" in proc.stdout
    assert "(INJECTED)" in (tmp_path / "fault.trace").read_text()

    # The version is there, whole: it reads back and verifies (nothing was undone).
    [v] = list_versions(str(root))
    assert v.status == "committed"
    ck = portable_ckpt.open(str(root))
    assert ck.step == 3 and ck.verify(deep=True) == []
    np.testing.assert_array_equal(ck.read("w"), np.arange(1000, dtype=np.float32))


def test_unknown_outcome_is_a_storage_error_of_its_own_class() -> None:
    """Callers that catch PCK-STORAGE keep working; the refinement maps to its parent's code."""
    assert issubclass(CommitOutcomeUnknownError, StorageError)
    assert CommitOutcomeUnknownError("x").code == "PCK-STORAGE"
    assert portable_ckpt.errors.ERROR_CODES["PCK-STORAGE"] is StorageError
