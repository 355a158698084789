"""Mutation audit 32 of ``io/copy.py``: copying a version to another root, verified, with its
copy record (spec §14.4, R-DRILL-5, R-COMMIT-17), on real roots written by the library.

Each test names the mutant it kills (the audit's table is in its report).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt


def _save(root: Path, step: int) -> str:
    return portable_ckpt.save_arrays(root, {"w": np.arange(64.0) + step}, step=step).attempt_id


def _bind_mounts() -> bool:
    """Whether this machine lets an unprivileged user namespace bind-mount (``unshare -rm``)."""
    if shutil.which("unshare") is None:
        return False
    p = subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30)
    return p.returncode == 0


@pytest.mark.skipif(not _bind_mounts(), reason="needs unshare -rm (a user namespace) to bind-mount")
def test_a_destination_below_a_bind_mount_of_the_source_root_is_refused(tmp_path: Path) -> None:
    """A bind mount of the source root is the same directory under another path, which no
    real path resolves: only its device and inode tell. A copy to a root below it is a copy
    into the source root (no second copy; gc of the source deletes it), refused with exit 2
    before anything is written. Mutant C10 (``_check_not_inside`` trusts real paths only): the
    copy went into the source root."""
    src = tmp_path / "src"
    aid = _save(src, 1)
    alias = tmp_path / "alias"
    alias.mkdir()
    script = 'mount --bind "$1" "$2" && exec "$3" -m portable_ckpt.cli.main copy "$4" "$5"'
    p = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", str(src), str(alias), sys.executable,
         str(src / aid), str(alias / "backup")],
        capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 2, p
    assert "lies inside the source root" in p.stderr and "another mount" in p.stderr, p.stderr
    assert sorted(q.name for q in src.iterdir()) == [aid]  # nothing written into the source
